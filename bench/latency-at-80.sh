#!/usr/bin/env bash
# The latency goal measured in one window (BENCHMARKS.md). Each round finds the open-loop
# maximum (bench/latency.sh at OVERLOAD requests/s, more than the SUT takes: what it
# accepts is the maximum), runs bench/latency.sh at 80 % of that maximum, then measures
# the maximum again. The three run back to back, so that a machine whose speed drifts (a
# shared VM) is measured against its own maximum of the moment; a round whose two maxima
# differ by more than STEADY_PCT % ran on a machine that changed speed under it, so 80 %
# of the first maximum was not 80 % of the capacity the middle run had. Such a round is
# kept and printed, marked "drifted", and left out of the "steady rounds" median (the
# median of every round is printed too).
#
# Usage: bench/latency-at-80.sh [ROUNDS] [CONNECTIONS] [OVERLOAD_RPS]   (3, 8, 1800)
# Environment: DURATION_S (15), CONFIG (bench/all-packs.yaml), PERCENT (80), STEADY_PCT
# (5), SINK_COUNT (requests; see bench/latency.sh). IDLE_SPINNER=1: a diagnosis, not the
# goal's measurement: an idle-priority busy loop (`chrt --idle 0`) runs on the SUT's core
# (SUT_CPU, 1) all through, so that its vCPU never halts between requests (on a VM guest
# without halt polling, a halted vCPU's next request runs slower, BENCHMARKS.md,
# "Latency at a fixed offered load"); it runs only when the SUT does not want the core. Recorded as
# "idle_spinner" in every line. HALT_POLL_NS=N (root, a KVM guest whose cpuidle driver is
# `haltpoll`): sets /sys/module/haltpoll/parameters/guest_halt_poll_ns to N for the run
# (Linux's default is 200000; some hosts boot their guests with 0) and puts the old value
# back on exit; refused on any other machine, where the value would do nothing. Every line
# records the value the run had ("guest_halt_poll_ns": null unless the cpuidle driver is
# `haltpoll`), set or not.
# Results: bench/results/latency80-<UTC time>.jsonl (every run's JSON line, with
# "phase": "max", "at80" or "max_after"), then a table per round and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
CONNS=${2:-8}
OVERLOAD=${3:-1800}
PERCENT=${PERCENT:-80}
STEADY_PCT=${STEADY_PCT:-5}
CONFIG=${CONFIG:-bench/all-packs.yaml}
export DURATION_S=${DURATION_S:-15}
mkdir -p bench/results
OUT=${RESULTS:-bench/results/latency80-$(date -u +%Y-%m-%dT%H%M).jsonl}
tmp=$(mktemp -d)
spinner=
halt_poll=/sys/module/haltpoll/parameters/guest_halt_poll_ns
halt_poll_before=
restore() {
  rm -rf "$tmp"
  [ -z "$spinner" ] || kill "$spinner" 2>/dev/null || true
  [ -z "$halt_poll_before" ] || echo "$halt_poll_before" >"$halt_poll" || true
}
trap restore EXIT
# The module's parameter exists wherever the governor is built in, bare metal included;
# it polls only where the cpuidle driver is haltpoll's.
cpuidle_driver=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || true)
if [ -n "${HALT_POLL_NS:-}" ]; then
  [ "$cpuidle_driver" = haltpoll ] || {
    echo "HALT_POLL_NS: the cpuidle driver is '${cpuidle_driver:-none}', not haltpoll: no halt polling to set" >&2
    exit 2
  }
  [ -w "$halt_poll" ] || { echo "HALT_POLL_NS: $halt_poll is not writable here" >&2; exit 2; }
  halt_poll_before=$(cat "$halt_poll")
  echo "$HALT_POLL_NS" >"$halt_poll"
fi
halt_poll_now=null
if [ "$cpuidle_driver" = haltpoll ]; then
  halt_poll_now=$(cat "$halt_poll" 2>/dev/null || echo null)
fi
if [ "${IDLE_SPINNER:-0}" = 1 ]; then
  chrt --idle 0 taskset -c "${SUT_CPU:-1}" sh -c 'while :; do :; done' &
  spinner=$!
fi
field() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }
for r in $(seq "$ROUNDS"); do
  RUNS=1 RESULTS=$tmp/max.jsonl bench/latency.sh promnorm "$OVERLOAD" "$CONNS" "$CONFIG" >/dev/null
  max=$(field "$tmp/max.jsonl" samples_per_s)
  per=$(field "$tmp/max.jsonl" samples_per_request)
  rate=$(python3 -c "print(max(1, round($max * $PERCENT / 100 / $per)))")
  RUNS=1 RESULTS=$tmp/at.jsonl bench/latency.sh promnorm "$rate" "$CONNS" "$CONFIG" >/dev/null
  RUNS=1 RESULTS=$tmp/after.jsonl bench/latency.sh promnorm "$OVERLOAD" "$CONNS" "$CONFIG" >/dev/null
  python3 - "$r" "$tmp/max.jsonl" "$tmp/at.jsonl" "$tmp/after.jsonl" "$PERCENT" "$STEADY_PCT" "${IDLE_SPINNER:-0}" "$halt_poll_now" >>"$OUT" <<'PY'
import json, sys
r, mx, at, after, percent, steady, spin, halt_poll = sys.argv[1:9]
runs = {}
for phase, path in (("max", mx), ("at80", at), ("max_after", after)):
    runs[phase] = json.loads(open(path).read().splitlines()[-1])
before = runs["max"]["samples_per_s"]
# A first maximum of nothing (the SUT accepted no request) has no drift: not steady.
drift = runs["max_after"]["samples_per_s"] / before - 1 if before > 0 else None
for phase, d in runs.items():
    d.update({"round": int(r), "phase": phase, "percent": float(percent),
              "max_drift": drift, "idle_spinner": spin == "1",
              "guest_halt_poll_ns": None if halt_poll == "null" else int(halt_poll),
              "steady": drift is not None and abs(drift) * 100 <= float(steady)})
    print(json.dumps(d))
PY
  rm -f "$tmp/max.jsonl" "$tmp/at.jsonl" "$tmp/after.jsonl"
  tail -n 2 "$OUT" | head -n 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print("[latency80] round %d: %.0f requests/s (%.2f M samples/s), p50 %.1f ms, p99 %.1f ms, SUT %.2f cores, maxima drift %s (%s), non-2xx %d" % (d["round"], d["rate_rps"], d["samples_per_s"]/1e6, d["lat_p50_ms"], d["lat_p99_ms"], d["sut_cpu_cores"], "n/a" if d["max_drift"] is None else "%+.1f %%" % (100 * d["max_drift"]), "steady" if d["steady"] else "drifted", d["non2xx"] + d["errors"]))'
done
python3 - "$OUT" "$STEADY_PCT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| round | open-loop maximum before / after, samples/s | drift | offered at %d %%, requests/s | accepted samples/s | p50 ms | p99 ms | max ms | SUT cores | non-2xx + errors |" % rows[0]["percent"])
print("|---|---|---|---|---|---|---|---|---|---|")
every, steady = [], []
for n in sorted({r["round"] for r in rows}):
    phase = {r["phase"]: r for r in rows if r["round"] == n}
    mx, at = phase["max"], phase["at80"]
    after = phase.get("max_after")
    every.append(at["lat_p99_ms"])
    if after is None or at.get("max_drift") is None:
        drift = "not measured"
    else:
        drift = "%+.1f %%%s" % (100 * at["max_drift"], "" if at["steady"] else " (drifted)")
        if at["steady"]:
            steady.append(at["lat_p99_ms"])
    print("| %d | %.0f / %s | %s | %.0f | %.0f | %.1f | %.1f | %.1f | %.2f | %d |" % (
        n, mx["samples_per_s"], "%.0f" % after["samples_per_s"] if after else "-", drift,
        at["rate_rps"], at["samples_per_s"], at["lat_p50_ms"], at["lat_p99_ms"],
        at["lat_max_ms"], at["sut_cpu_cores"], at["non2xx"] + at["errors"]))
pct = rows[0]["percent"]
print("median p99 at %d %% of the maximum, every round (%d): %.1f ms" % (pct, len(every), statistics.median(every)))
if steady:
    print("median p99 at %d %% of the maximum, steady rounds (%d, maxima within %s %%): %.1f ms" % (pct, len(steady), sys.argv[2], statistics.median(steady)))
else:
    print("no steady round (maxima within %s %%)" % sys.argv[2])
PY
echo "results: $OUT"
