#!/usr/bin/env bash
# Side-by-side throughput of promnorm and vmagent 1.79 under the same wrk load into the
# same nginx null sink (shared/tools/bench/bench_rw.py), each pinned to one core.
# Needs Debian's vmagent, wrk and nginx on PATH and /usr/bin/python3 (for bench_rw.py).
# Payloads come from this repository's promnorm-payloads (into $PAYLOADS).
# Usage: bench/vs-vmagent.sh [RUNS] [DURATION_S]; results in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DURATION=${2:-20}
SHARED=${SHARED_DIR:-$(cd .. && pwd)/shared}
TOOLS=$SHARED/tools/bench
PAYLOADS=${PAYLOADS:-/tmp/prw-payloads/default}
cargo build --release --quiet --bin promnorm --bin promnorm-payloads
RELEASE=${CARGO_TARGET_DIR:-$PWD/target}/release
BIN=$RELEASE/promnorm
# Folders written by another generator (the former gen_payloads.py) are rebuilt.
grep -qs '"generator": "promnorm-payloads"' "$PAYLOADS/meta.json" ||
  "$RELEASE/promnorm-payloads" --out "$PAYLOADS" --count 100
mkdir -p bench/results
RESULTS=bench/results/$(date -u +%Y-%m-%dT%H%M).jsonl
common=(--payloads "$PAYLOADS" --runs "$RUNS" --duration "$DURATION" --results "$RESULTS")
promnorm_case() { # case config
  /usr/bin/python3 "$TOOLS/bench_rw.py" run --case "$1" --sut cmd --sut-port 9201 \
    --sut-cmd "$BIN serve --config $PWD/$2 --listen 127.0.0.1:{port} --backend {sink_url}" \
    --sut-ready-url 'http://127.0.0.1:{port}/-/ready' \
    --sut-metrics-url 'http://127.0.0.1:{port}/metrics' \
    --ingest-metric promnorm_samples_received_total \
    --sent-metric promnorm_samples_forwarded_total "${common[@]}"
}
# The same with a queue in front of the sink: the config's SINK_URL and QUEUE_DIR are
# filled in per run.
promnorm_queue_case() { # case config
  /usr/bin/python3 "$TOOLS/bench_rw.py" run --case "$1" --sut cmd --sut-port 9201 \
    --sut-cmd "sh -c 'sed -e s#SINK_URL#{sink_url}# -e s#QUEUE_DIR#{tmp}/queue# $PWD/$2 >{tmp}/promnorm.yaml && exec $BIN serve --config {tmp}/promnorm.yaml --listen 127.0.0.1:{port}'" \
    --sut-ready-url 'http://127.0.0.1:{port}/-/ready' \
    --sut-metrics-url 'http://127.0.0.1:{port}/metrics' \
    --ingest-metric promnorm_samples_received_total \
    --sent-metric promnorm_samples_forwarded_total "${common[@]}"
}
# CASES (space-separated) runs a subset, e.g. CASES="promnorm-all-packs promnorm-all-packs-memory-queue".
want() { [[ -z ${CASES:-} || " $CASES " == *" $1 "* ]]; }
# Interleaved so that drift of the machine hits both sides alike.
! want vmagent-relabel ||
  /usr/bin/python3 "$TOOLS/bench_rw.py" run --case vmagent-relabel --relabel "$TOOLS/relabel.yml" "${common[@]}"
! want promnorm-all-packs || promnorm_case promnorm-all-packs bench/all-packs.yaml
! want promnorm-all-packs-memory-queue ||
  promnorm_queue_case promnorm-all-packs-memory-queue bench/all-packs-memory-queue.yaml
! want promnorm-all-packs-disk-queue ||
  promnorm_queue_case promnorm-all-packs-disk-queue bench/all-packs-disk-queue.yaml
! want vmagent-passthrough ||
  /usr/bin/python3 "$TOOLS/bench_rw.py" run --case vmagent-passthrough "${common[@]}"
! want promnorm-passthrough || promnorm_case promnorm-passthrough bench/passthrough.yaml
/usr/bin/python3 "$TOOLS/bench_rw.py" report "$RESULTS"
