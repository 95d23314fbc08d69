#!/usr/bin/env bash
# GET /federate over about a million series (issue 55): promnorm (bench/federate.yaml,
# pinned to SUT_CPU) is filled by promnorm-bench's load with one round of a fleet of
# NODES vLLM and NODES SGLang nodes (about 940 series a node) and forwards to the null
# sink; then each of the answers below is fetched ROUNDS times with curl: whole time,
# bytes, the CPU promnorm spent on it, and its RSS before and at the peak.
#
# Usage: bench/federate.sh [ROUNDS]; JSON lines in bench/results/federate-<UTC>.jsonl
# and a table of medians. Environment: NODES (532: ~1.0M series), SUT_CPU (1),
# LOAD_CPU (0), PROMNORM_BIN, BENCH_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
NODES=${NODES:-532}
. bench/lib.sh
mkdir -p bench/results .tmp
RESULTS=${RESULTS:-bench/results/federate-$(date -u +%Y-%m-%dT%H%M).jsonl}
pin() { if command -v taskset >/dev/null && [ -n "$1" ]; then echo "taskset -c $1"; fi; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SINK_PORT=$(port)
PORT=$(port)
log=.tmp/federate-bench.log
$(pin "${LOAD_CPU:-0}") "$BENCH" sink --listen 127.0.0.1:$SINK_PORT >/dev/null &
sink=$!
$(pin "${SUT_CPU:-1}") "$PROMNORM" serve --config bench/federate.yaml --listen 127.0.0.1:$PORT \
  --backend http://127.0.0.1:$SINK_PORT/api/v1/write >"$log" 2>&1 &
sut=$!
trap 'kill $sut $sink 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/-/ready >/dev/null && break; sleep 0.1; done
kb() { awk -v k="$2:" '$1 == k {print $2}' /proc/$1/status; }
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
hz=$(getconf CLK_TCK)
# One request per 2,000 series: every series of the fleet once or more.
series_est=$((NODES * 2 * 940))
count=$(((series_est + 1999) / 2000))
$(pin "${LOAD_CPU:-0}") "$BENCH" load --url http://127.0.0.1:$PORT/api/v1/write \
  --nodes "$NODES" --count "$count" --connections 2 --warmup 0 --duration 30 >/dev/null
held=$(curl -s http://127.0.0.1:$PORT/metrics | awk '$1 == "promnorm_exposition_series" {print $2}')
echo "[bench] promnorm holds $held series for /federate (RSS $(kb $sut VmRSS) kB)" >&2
fetch() { # case accept query
  local case=$1 accept=$2 query=$3 i
  for ((i = 0; i < ROUNDS; i++)); do
    local rss0 t0 out t1
    rss0=$(kb $sut VmRSS)
    t0=$(ticks $sut)
    out=$(curl -s -o /dev/null -H "Accept: $accept" -w '%{http_code} %{time_total} %{size_download}' \
      "http://127.0.0.1:$PORT/federate$query")
    t1=$(ticks $sut)
    read -r code secs bytes <<<"$out"
    printf '{"case":"%s","round":%d,"series_held":%s,"status":%s,"seconds":%s,"bytes":%s,"sut_cpu_s":%s,"rss_before_mb":%s,"vmhwm_mb":%s,"commit":"%s","ts":"%s"}\n' \
      "$case" "$i" "$held" "$code" "$secs" "$bytes" "$(awk -v a="$t0" -v b="$t1" -v h="$hz" 'BEGIN {printf "%.2f", (b - a) / h}')" \
      "$((rss0 / 1024))" "$(($(kb $sut VmHWM) / 1024))" "$BENCH_COMMIT" "$(date -u +%FT%TZ)" >>"$RESULTS"
  done
}
fetch text-all 'text/plain' ''
fetch openmetrics-all 'application/openmetrics-text; version=1.0.0' ''
fetch text-match-vllm 'text/plain' '?match%5B%5D=%7Bjob%3D%22vllm%22%7D'
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| answer | series held | rounds | status | seconds (median) | MB | promnorm CPU-s | RSS before MB | peak RSS MB |")
print("|---|---|---|---|---|---|---|---|---|")
for case in dict.fromkeys(r["case"] for r in rows):
    rs = [r for r in rows if r["case"] == case]
    m = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {case} | {rs[0]['series_held']:.0f} | {len(rs)} | {','.join(sorted({str(r['status']) for r in rs}))} | "
          f"{m('seconds'):.2f} | {m('bytes') / 1e6:.0f} | {m('sut_cpu_s'):.2f} | {m('rss_before_mb'):.0f} | {max(r['vmhwm_mb'] for r in rs)} |")
PY
echo "results: $RESULTS"
