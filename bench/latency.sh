#!/usr/bin/env bash
# Latency under partial load, open loop: promnorm-bench sends RATE requests/s in total over
# CONNECTIONS connections at fixed times (core 0) -> SUT (core 1) -> null sink (in
# promnorm-bench). Latency counts from each request's scheduled send time, so queueing
# in the SUT shows up (no coordinated omission). 5 s warm-up, then DURATION_S (20).
# Usage:
#   bench/latency.sh promnorm RATE_RPS [CONNECTIONS] [CONFIG]   (default 4, bench/all-packs.yaml)
#   bench/latency.sh vmagent  RATE_RPS [CONNECTIONS] [RELABEL]  (default bench/vmagent-relabel.yml)
# e.g. 80 % of a measured maximum of 1.6 M samples/s with 2,000-sample requests:
#   bench/latency.sh promnorm 640
# Results: one JSON line per run in bench/results/latency-<UTC time>.jsonl (RUNS, 3).
# SINK_COUNT (requests): the null sink counts requests only. `samples` makes it decode
# every body as the throughput runs do; that decoding runs on the load core and delays
# the load's own sends, which this script would count as the SUT's latency.
set -euo pipefail
cd "$(dirname "$0")/.."
SUT=$1 RATE=$2 CONNS=${3:-4}
. bench/lib.sh
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/latency-$(date -u +%Y-%m-%dT%H%M).jsonl}
args=(--rate "$RATE" --connections "$CONNS" --duration "${DURATION_S:-20}" --warmup 5
  --runs "${RUNS:-3}" --results "$RESULTS" --sut-cpu "${SUT_CPU:-1}" --load-cpu "${LOAD_CPU:-0}"
  --sink-count "${SINK_COUNT:-requests}")
case $SUT in
  promnorm)
    "$BENCH" run --case "promnorm-latency-${RATE}rps" "${args[@]}" \
      --ingest-metric promnorm_samples_received_total \
      --sut-cmd "$PROMNORM serve --config $PWD/${4:-bench/all-packs.yaml} --listen 127.0.0.1:{port} --backend {sink_url}" >/dev/null ;;
  vmagent)
    need_vmagent
    "$BENCH" run --case "vmagent-latency-${RATE}rps" "${args[@]}" --ready-path /health \
      --ingest-metric 'vmagent_rows_inserted_total{type="promremotewrite"}' \
      --sut-cmd "$VMAGENT -httpListenAddr=127.0.0.1:{port} -remoteWrite.url={sink_url} -remoteWrite.tmpDataPath={tmp}/vmagent-data -loggerLevel=WARN -remoteWrite.urlRelabelConfig=$PWD/${4:-bench/vmagent-relabel.yml}" >/dev/null ;;
  *) echo "unknown SUT $SUT (promnorm or vmagent)" >&2; exit 2 ;;
esac
"$BENCH" report "$RESULTS"
echo "results: $RESULTS"
