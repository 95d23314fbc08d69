#!/usr/bin/env bash
# Two-core scaling of the pipeline (BENCHMARKS.md): `promnorm-bench pipeline` (decode,
# map, derive, encode, compress: everything but HTTP) in interleaved rounds of
#   one:         one worker pinned to core SCALE_CPU_B;
#   independent: two separate processes at once, one per core (nothing shared: what
#                the machine itself allows two cores, the ceiling of the ratio);
#   two:         one process, two workers on the one pipeline (shared rules, derived
#                series state, counters), pinned to both cores.
# Each round runs the three back to back, so that drift of a shared machine hits all
# alike; the ratios are taken per round and their medians reported.
#
# Usage: bench/scaling.sh [ROUNDS] [PASSES]   (7, 30 passes over 100 requests per run)
# Environment: CONFIG (bench/all-packs.yaml), SCALE_CPU_A (0), SCALE_CPU_B (1),
# PROMNORM_BIN, BENCH_BIN. One JSON line per round in bench/results/scaling-<UTC>.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
PASSES=${2:-30}
CONFIG=${CONFIG:-bench/all-packs.yaml}
A=${SCALE_CPU_A:-0}
B=${SCALE_CPU_B:-1}
. bench/lib.sh
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/scaling-$(date -u +%Y-%m-%dT%H%M).jsonl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Steal time of both cores (hypervisor), in ticks of 10 ms, from /proc/stat.
steal() { awk -v a="cpu$A" -v b="cpu$B" '$1 == a || $1 == b { s += $9 } END { print s }' /proc/stat; }
run() { # cpus threads out
  local s0
  s0=$(steal)
  taskset -c "$1" "$BENCH" pipeline --config "$CONFIG" --rounds "$PASSES" --threads "$2" >"$3"
  echo $(( $(steal) - s0 )) >"$3.steal"
}
rate() { python3 -c 'import json,sys; print(sum(json.load(open(f))["samples_per_s"] for f in sys.argv[1:]))' "$@"; }
for r in $(seq "$ROUNDS"); do
  run "$B" 1 "$tmp/one.json"
  run "$A" 1 "$tmp/ind-a.json" &
  pid=$!
  run "$B" 1 "$tmp/ind-b.json"
  wait "$pid"
  run "$A,$B" 2 "$tmp/two.json"
  cpu_ns=$(python3 -c 'import json,sys; print(",".join(str(json.load(open(f))["cpu_ns_per_sample_median"]) for f in sys.argv[1:]))' "$tmp/one.json" "$tmp/two.json")
  steals=$(cat "$tmp/one.json.steal" "$tmp/ind-b.json.steal" "$tmp/two.json.steal" | paste -sd,)
  one=$(rate "$tmp/one.json")
  ind=$(rate "$tmp/ind-a.json" "$tmp/ind-b.json")
  two=$(rate "$tmp/two.json")
  python3 - "$r" "$one" "$ind" "$two" "$CONFIG" "$BENCH_COMMIT" "$cpu_ns" "$steals" >>"$RESULTS" <<'EOF'
import json, sys, datetime
r, one, ind, two, config, commit, cpu_ns, steals = sys.argv[1:]
one, ind, two = float(one), float(ind), float(two)
cpu_one, cpu_two = (float(x) for x in cpu_ns.split(","))
steal = [int(x) * 10 for x in steals.split(",")]
print(json.dumps({"round": int(r), "config": config, "one": one, "independent": ind,
                  "two": two, "two_over_one": two / one, "independent_over_one": ind / one,
                  "two_over_independent": two / ind,
                  "cpu_ns_per_sample_one": cpu_one, "cpu_ns_per_sample_two": cpu_two,
                  "steal_ms": {"one": steal[0], "independent": steal[1], "two": steal[2]},
                  "commit": commit,
                  "ts": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}))
EOF
  tail -n 1 "$RESULTS" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("[scaling] round %d: one %.2f M, independent %.2f M (%.2fx), two workers %.2f M (%.2fx); CPU ns/sample one %.0f, two %.0f; steal ms %s" % (d["round"], d["one"]/1e6, d["independent"]/1e6, d["independent_over_one"], d["two"]/1e6, d["two_over_one"], d["cpu_ns_per_sample_one"], d["cpu_ns_per_sample_two"], d["steal_ms"]))'
done
python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda k: statistics.median(r[k] for r in rows)
print("| rounds | one worker, samples/s | two processes | two workers | two workers / one | two processes / one | two workers / two processes | CPU ns per sample, one / two workers |")
print("|---|---|---|---|---|---|---|---|")
print("| %d | %.0f | %.0f | %.0f | %.2f× (%.2f–%.2f) | %.2f× | %.2f× | %.0f / %.0f |" % (
    len(rows), med("one"), med("independent"), med("two"), med("two_over_one"),
    min(r["two_over_one"] for r in rows), max(r["two_over_one"] for r in rows),
    med("independent_over_one"), med("two_over_independent"),
    med("cpu_ns_per_sample_one"), med("cpu_ns_per_sample_two")))
EOF
echo "results: $RESULTS"
