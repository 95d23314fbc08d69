#!/usr/bin/env bash
# The pull side, promnorm against vmagent 1.79 in one run: promnorm-bench serves TARGETS
# scrape targets of SERIES series each (text 0.0.4 of the synthetic fleet, values moving
# every second) on the load core, and a null sink; each SUT, pinned to one core, scrapes
# them every INTERVAL seconds (both read the same file_sd file) and forwards to the sink.
# Cases run interleaved, RUNS times each, each run with a fresh SUT: WARMUP seconds, then
# DURATION_S measured. The figure is the SUT's CPU-s per million scraped samples; the
# goal (issue 55) is at most half of vmagent's.
#
# Usage: bench/scrape.sh [RUNS] [DURATION_S]; JSON lines in
# bench/results/scrape-<UTC time>.jsonl, then the table of medians.
# Environment: CASES (subset of the names below), TARGETS (20), SERIES (10000),
# INTERVAL (5), WARMUP (15), SUT_CPU (1), LOAD_CPU (0), PROMNORM_BIN, BENCH_BIN, VMAGENT.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DURATION=${2:-60}
. bench/lib.sh
need_vmagent
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/scrape-$(date -u +%Y-%m-%dT%H%M).jsonl}
INTERVAL=${INTERVAL:-5}
common=(--targets "${TARGETS:-20}" --series-per-target "${SERIES:-10000}"
  --interval "$INTERVAL" --warmup "${WARMUP:-15}" --duration "$DURATION" --runs 1
  --sut-cpu "${SUT_CPU:-1}" --load-cpu "${LOAD_CPU:-0}" --results "$RESULTS")
# The configuration with the run's targets file and the interval filled in, then the SUT.
fill="sed -e s#TARGETS_FILE#{tmp}/targets.json# -e s#INTERVAL#${INTERVAL}s#"

want() { [[ -z ${CASES:-} || " $CASES " == *" $1 "* ]]; }
run_case() { # name
  want "$1" || return 0
  case $1 in
  vmagent-scrape)
    "$BENCH" scrape --case "$1" "${common[@]}" --ready-path /health --sut-cmd \
      "sh -c '$fill $PWD/bench/scrape-vmagent.yml >{tmp}/vmagent.yml && exec $VMAGENT -httpListenAddr=127.0.0.1:{port} -promscrape.config={tmp}/vmagent.yml -remoteWrite.url={sink_url} -remoteWrite.tmpDataPath={tmp}/vmagent-data -loggerLevel=WARN'" >/dev/null
    ;;
  promnorm-scrape-all-packs | promnorm-scrape-passthrough)
    local config=bench/scrape-${1#promnorm-scrape-}.yaml
    "$BENCH" scrape --case "$1" "${common[@]}" --sut-cmd \
      "sh -c '$fill $PWD/$config >{tmp}/promnorm.yaml && exec $PROMNORM serve --config {tmp}/promnorm.yaml --listen 127.0.0.1:{port} --backend {sink_url}'" >/dev/null
    ;;
  esac
}
NAMES=(vmagent-scrape promnorm-scrape-all-packs promnorm-scrape-passthrough)
for ((round = 0; round < RUNS; round++)); do
  for ((k = 0; k < ${#NAMES[@]}; k++)); do
    run_case "${NAMES[(round + k) % ${#NAMES[@]}]}"
  done
done
"$BENCH" scrape-report --baseline vmagent-scrape "$RESULTS"
echo "results: $RESULTS"
