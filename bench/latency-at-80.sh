#!/usr/bin/env bash
# The latency goal measured in one window (BENCHMARKS.md): each round first finds the
# open-loop maximum (bench/latency.sh at OVERLOAD requests/s, more than the SUT takes:
# what it accepts is the maximum), then runs bench/latency.sh at 80 % of that maximum.
# Both halves of a round run back to back, so that a machine whose speed drifts (a
# shared VM) is measured against its own maximum of the moment.
#
# Usage: bench/latency-at-80.sh [ROUNDS] [CONNECTIONS] [OVERLOAD_RPS]   (3, 8, 1800)
# Environment: DURATION_S (15), CONFIG (bench/all-packs.yaml), PERCENT (80).
# Results: bench/results/latency80-<UTC time>.jsonl (every run's JSON line, with
# "phase": "max" or "at80"), then a table per round and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
CONNS=${2:-8}
OVERLOAD=${3:-1800}
PERCENT=${PERCENT:-80}
CONFIG=${CONFIG:-bench/all-packs.yaml}
export DURATION_S=${DURATION_S:-15}
mkdir -p bench/results
OUT=${RESULTS:-bench/results/latency80-$(date -u +%Y-%m-%dT%H%M).jsonl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }
for r in $(seq "$ROUNDS"); do
  RUNS=1 RESULTS=$tmp/max.jsonl bench/latency.sh promnorm "$OVERLOAD" "$CONNS" "$CONFIG" >/dev/null
  max=$(field "$tmp/max.jsonl" samples_per_s)
  per=$(field "$tmp/max.jsonl" samples_per_request)
  rate=$(python3 -c "print(max(1, round($max * $PERCENT / 100 / $per)))")
  RUNS=1 RESULTS=$tmp/at.jsonl bench/latency.sh promnorm "$rate" "$CONNS" "$CONFIG" >/dev/null
  python3 - "$r" "$tmp/max.jsonl" "$tmp/at.jsonl" "$PERCENT" >>"$OUT" <<'EOF'
import json, sys
r, mx, at, percent = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
for phase, path in (("max", mx), ("at80", at)):
    d = json.loads(open(path).read().splitlines()[-1])
    d.update({"round": int(r), "phase": phase, "percent": percent})
    print(json.dumps(d))
EOF
  rm -f "$tmp/max.jsonl" "$tmp/at.jsonl"
  tail -n 1 "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("[latency80] round %d: %.0f requests/s (%.2f M samples/s), p50 %.1f ms, p99 %.1f ms, SUT %.2f cores, non-2xx %d" % (d["round"], d["rate_rps"], d["samples_per_s"]/1e6, d["lat_p50_ms"], d["lat_p99_ms"], d["sut_cpu_cores"], d["non2xx"] + d["errors"]))'
done
python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| round | open-loop maximum, samples/s | offered at %d %%, requests/s | accepted samples/s | p50 ms | p99 ms | max ms | SUT cores | non-2xx + errors |" % rows[0]["percent"])
print("|---|---|---|---|---|---|---|---|---|")
rounds = sorted({r["round"] for r in rows})
p99 = []
for n in rounds:
    mx = next(r for r in rows if r["round"] == n and r["phase"] == "max")
    at = next(r for r in rows if r["round"] == n and r["phase"] == "at80")
    p99.append(at["lat_p99_ms"])
    print("| %d | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.2f | %d |" % (n, mx["samples_per_s"], at["rate_rps"], at["samples_per_s"], at["lat_p50_ms"], at["lat_p99_ms"], at["lat_max_ms"], at["sut_cpu_cores"], at["non2xx"] + at["errors"]))
print("median p99 at %d %% of the maximum: %.1f ms" % (rows[0]["percent"], statistics.median(p99)))
EOF
echo "results: $OUT"
