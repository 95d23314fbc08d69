#!/usr/bin/env bash
# Side-by-side throughput of promnorm and vmagent 1.79 under the same load into the same
# null sink, each system pinned to one core (BENCHMARKS.md). Everything comes from this
# repository: promnorm-bench (tools/src/bin/promnorm-bench.rs) is the load generator (core 0),
# the null sink (in the same process) and the runner; only vmagent comes from Debian
# (bench/lib.sh fetches it when missing). Cases run interleaved, RUNS times each (each
# round starting one case further on), every
# run with a fresh SUT, 5 s warm-up, then DURATION_S measured.
#
# Usage: bench/vs-vmagent.sh [RUNS] [DURATION_S]; one JSON line per run in
# bench/results/<UTC time>.jsonl, then the table of medians.
# Environment: CASES="a b" (subset, names below), CONNECTIONS (8), MODE (default|large),
# SUT_CPU (1), LOAD_CPU (0), PROMNORM_BIN, BENCH_BIN, VMAGENT, SINK_COUNT (samples: the
# null sink decodes every body to count what arrived; `requests` skips that decoding,
# which runs on the load core, for cases the load core would otherwise limit).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DURATION=${2:-20}
. bench/lib.sh
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/$(date -u +%Y-%m-%dT%H%M).jsonl}
common=(--duration "$DURATION" --warmup "${WARMUP:-5}" --runs 1 --results "$RESULTS"
  --connections "${CONNECTIONS:-8}" --mode "${MODE:-default}"
  --sut-cpu "${SUT_CPU:-1}" --load-cpu "${LOAD_CPU:-0}" --sink-count "${SINK_COUNT:-samples}")
promnorm_in=(--ingest-metric promnorm_samples_received_total
  --sent-metric promnorm_samples_forwarded_total)
vmagent_in=(--ready-path /health
  --ingest-metric 'vmagent_rows_inserted_total{type="promremotewrite"}'
  --sent-metric vmagent_remotewrite_block_size_rows_sum)
vmagent_cmd="-httpListenAddr=127.0.0.1:{port} -remoteWrite.url={sink_url} -remoteWrite.tmpDataPath={tmp}/vmagent-data -loggerLevel=WARN"

want() { [[ -z ${CASES:-} || " $CASES " == *" $1 "* ]]; }
VMAGENT=${VMAGENT:-}
if want vmagent-relabel || want vmagent-passthrough; then need_vmagent; fi

case_run() { # name extra-args...
  local name=$1
  shift
  want "$name" || return 0
  "$BENCH" run --case "$name" "${common[@]}" "$@" >/dev/null
}
promnorm_case() { # name config [extra args]
  local name=$1 config=$2
  shift 2
  case_run "$name" "${promnorm_in[@]}" "$@" \
    --sut-cmd "$PROMNORM serve --config $PWD/$config --listen 127.0.0.1:{port} --backend {sink_url}"
}
# A queue in front of the sink: the config's SINK_URL and QUEUE_DIR are filled in per run.
promnorm_queue_case() { # name config
  case_run "$1" "${promnorm_in[@]}" --sut-cmd \
    "sh -c 'sed -e s#SINK_URL#{sink_url}# -e s#QUEUE_DIR#{tmp}/queue# $PWD/$2 >{tmp}/promnorm.yaml && exec $PROMNORM serve --config {tmp}/promnorm.yaml --listen 127.0.0.1:{port}'"
}

NAMES=(vmagent-relabel promnorm-all-packs promnorm-all-packs-rw2
  promnorm-all-packs-memory-queue promnorm-all-packs-disk-queue promnorm-all-packs-rw2-out
  promnorm-all-packs-tenancy promnorm-all-packs-limits promnorm-all-packs-wide
  vmagent-passthrough promnorm-passthrough)
run_case() { # name
  case $1 in
  vmagent-relabel)
    case_run vmagent-relabel "${vmagent_in[@]}" \
      --sut-cmd "$VMAGENT $vmagent_cmd -remoteWrite.urlRelabelConfig=$PWD/bench/vmagent-relabel.yml"
    ;;
  promnorm-all-packs) promnorm_case "$1" bench/all-packs.yaml ;;
  promnorm-all-packs-rw2) promnorm_case "$1" bench/all-packs.yaml --proto 2 ;;
  promnorm-all-packs-memory-queue) promnorm_queue_case "$1" bench/all-packs-memory-queue.yaml ;;
  promnorm-all-packs-disk-queue) promnorm_queue_case "$1" bench/all-packs-disk-queue.yaml ;;
  promnorm-all-packs-rw2-out) promnorm_queue_case "$1" bench/all-packs-rw2-out.yaml ;;
  promnorm-all-packs-tenancy) promnorm_queue_case "$1" bench/all-packs-tenancy.yaml ;;
  promnorm-all-packs-limits) promnorm_case "$1" bench/all-packs-limits.yaml ;;
  # The wide fleet: 16x the nodes, ~481k distinct series, each sent about once a round
  # (256 requests of 2,000), against the usual ~30k replayed ~6.6 times a round.
  promnorm-all-packs-wide) promnorm_case "$1" bench/all-packs.yaml --nodes 256 --count 256 ;;
  vmagent-passthrough) case_run vmagent-passthrough "${vmagent_in[@]}" --sut-cmd "$VMAGENT $vmagent_cmd" ;;
  promnorm-passthrough) promnorm_case "$1" bench/passthrough.yaml ;;
  esac
}
selected=()
for name in "${NAMES[@]}"; do
  if want "$name"; then selected+=("$name"); fi
done
# Interleaved, one run of every case per round, so that drift of the machine hits all
# alike; each round starts one case further on, so that no case always runs in the same
# place (on a machine slowing down within rounds, the last case would always lose).
for ((round = 0; round < RUNS; round++)); do
  for ((k = 0; k < ${#selected[@]}; k++)); do
    run_case "${selected[(round + k) % ${#selected[@]}]}"
  done
done
"$BENCH" report "$RESULTS"
echo "results: $RESULTS"
