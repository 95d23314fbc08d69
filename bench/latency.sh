#!/usr/bin/env bash
# Latency under partial load: wrk (pinned to core 0, with a pause per request) ->
# SUT (pinned to core 1) -> nginx null sink (core 0). Prints wrk's RESULT line and the
# offered rate. Usage:
#   bench/latency.sh promnorm CONNECTIONS DELAY_MS [CONFIG]    (default bench/all-packs.yaml)
#   bench/latency.sh vmagent  CONNECTIONS DELAY_MS [RELABEL]   (default shared relabel.yml)
# Payloads come from this repository's promnorm-payloads (into $PAYLOADS).
set -euo pipefail
cd "$(dirname "$0")/.."
SUT=$1 CONNS=$2 DELAY=$3
TOOLS=${SHARED_DIR:-$(cd .. && pwd)/shared}/tools/bench
PAYLOADS=${PAYLOADS:-/tmp/prw-payloads/default}
RELEASE=${CARGO_TARGET_DIR:-$PWD/target}/release
# Folders written by another generator (the former gen_payloads.py) are rebuilt.
if ! grep -qs '"generator": "promnorm-payloads"' "$PAYLOADS/meta.json"; then
  cargo build --release --quiet --bin promnorm-payloads
  "$RELEASE/promnorm-payloads" --out "$PAYLOADS" --count 100
fi
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; sleep 0.5; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/sink"
taskset -c 0 nginx -e stderr -p "$WORK/sink/" -c "$TOOLS/nginx-sink.conf" &
sleep 0.5
case $SUT in
  promnorm)
    PORT=9201
    taskset -c 1 "$RELEASE/promnorm" serve --config "${4:-bench/all-packs.yaml}" \
      --listen 127.0.0.1:$PORT --backend http://127.0.0.1:19201/api/v1/write 2>"$WORK/sut.log" & ;;
  vmagent)
    PORT=8429
    taskset -c 1 vmagent -httpListenAddr=127.0.0.1:$PORT -remoteWrite.url=http://127.0.0.1:19201/api/v1/write \
      -remoteWrite.tmpDataPath="$WORK/vmagent-data" -loggerLevel=WARN \
      -remoteWrite.urlRelabelConfig="${4:-$TOOLS/relabel.yml}" 2>"$WORK/sut.log" & ;;
  *) echo "unknown SUT $SUT" >&2; exit 2 ;;
esac
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null && break; sleep 0.2; done
export RW_LUA=$TOOLS/rw.lua RW_DELAY_MS=$DELAY
run() { taskset -c 0 wrk -t1 -c"$CONNS" -d"$1"s --timeout 10s -s bench/latency.lua \
  "http://127.0.0.1:$PORT/api/v1/write" -- "$PAYLOADS/manifest.txt"; }
run 5 >/dev/null   # warm-up
out=$(run 20)
line=$(grep '^RESULT' <<<"$out")
reqs=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$line")
per=$(/usr/bin/python3 -c "import json;print(json.load(open('$PAYLOADS/meta.json'))['samples_per_request'])")
echo "$SUT c=$CONNS delay=${DELAY}ms: $((reqs * per / 20)) samples/s offered; $line"
