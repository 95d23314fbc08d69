#!/usr/bin/env bash
# The read floor of pass-through (issue 58): instructions per sample, counted by
# cachegrind (deterministic, unlike time on a shared VM), of
#   floor                 snappy decompression and one walk over every field of the
#                         fleet's requests, nothing validated or kept
#                         (`promnorm-bench pipeline --floor`): what any proxy that reads
#                         its input pays;
#   promnorm-passthrough  the pipeline on bench/passthrough.yaml (decode, validation,
#                         the cardinality view, the unchanged body kept);
#   promnorm-all-packs    the pipeline on bench/all-packs.yaml.
# Each is `promnorm-bench pipeline --rounds 3` minus `--rounds 1` (two passes over the
# 100 requests, 400,000 samples), so that start-up and the warm pass cancel out.
#
# Usage: bench/floor.sh; JSON lines in bench/results/floor-<UTC>.jsonl. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
command -v valgrind >/dev/null || { echo "floor.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/floor-$(date -u +%Y-%m-%dT%H%M).jsonl}
SAMPLES=400000
irefs() { # rounds args...: the instructions of one run
  local rounds=$1
  shift
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
    "$BENCH" pipeline --rounds "$rounds" "$@" 2>&1 >/dev/null |
    awk '/I *refs:/ {gsub(",", "", $NF); print $NF}'
}
measure() { # case args...
  local name=$1
  shift
  local one three
  one=$(irefs 1 "$@")
  three=$(irefs 3 "$@")
  python3 - "$name" "$one" "$three" "$SAMPLES" "$BENCH_COMMIT" >>"$RESULTS" <<'PY'
import json, sys, time
name, one, three, samples, commit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
print(json.dumps({"case": name, "instructions_per_sample": (three - one) / samples,
                  "instructions_rounds_1": one, "instructions_rounds_3": three, "samples": samples,
                  "commit": commit, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
PY
  tail -n1 "$RESULTS"
}
measure floor --floor --config bench/passthrough.yaml
measure promnorm-passthrough --config bench/passthrough.yaml
measure promnorm-all-packs --config bench/all-packs.yaml
echo "results: $RESULTS"
