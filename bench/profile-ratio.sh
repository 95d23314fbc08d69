#!/usr/bin/env bash
# The paths' cost against every pack, from profiles, immune to the machine's drift.
#
#   bench/profile-ratio.sh ROUNDS [CASE...]
#
# On a machine whose speed drifts by more than the few per cent a ratio goal leaves
# (a shared VM), samples/s measured one run after another compare the moments as much
# as the paths. This runs each case of bench/vs-vmagent.sh (default: the paths whose
# input side is the same as every pack's: memory queue, disk queue, 2.0 out, tenancy)
# and `promnorm-all-packs` in rounds, samples the SUT with `perf record` (Debian's
# `linux-perf`) while it runs, and takes the share of its CPU that four stages doing
# the same work per sample in every such case take (decode, map, apply, snappy
# decompress). Those stages cost the same per sample in both, so
#
#   ratio = share in the case / share in every pack = CPU per sample of every pack /
#           CPU per sample of the case
#
# which is the case's samples/s per core over every pack's, whatever the machine's
# speed was in either run. Every pack is profiled before and after each case, and the
# case is compared with the mean of the two: in a round whose one every-pack run came
# out high or low, every case's ratio moved with it (the runs of one round are minutes
# apart, each a new process). `ratio` counts all the SUT's samples (kernel included: a
# disk queue's writes are its cost); `ratio_user` leaves the kernel's out (a run in
# which the hypervisor's interrupts took a share shows in the gap). Not for 2.0 in or
# pass-through: their input side differs. One JSON line per run (a run whose SUT could
# not be profiled is left out, and said so), then the medians; RESULTS must be new.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
shift || true
CASES_WANTED=("$@")
if [ ${#CASES_WANTED[@]} -eq 0 ]; then
  CASES_WANTED=(promnorm-all-packs-memory-queue promnorm-all-packs-disk-queue
    promnorm-all-packs-rw2-out promnorm-all-packs-tenancy)
fi
DURATION=${DURATION:-14}
WARMUP=${WARMUP:-5}
# Samples per second of the SUT's CPU. A share measured from n samples is off by about
# sqrt(p(1-p)/n): at 999 per second over 10 s, 1.4 % of a 34 % share, and the ratio of
# two such shares by 2 %, as much as the goals' margins; at 4999, 0.9 % for the ratio.
PERF_HZ=${PERF_HZ:-4999}
if ! [[ $ROUNDS =~ ^[0-9]+$ && $DURATION =~ ^[0-9]+$ && $WARMUP =~ ^[0-9]+$ &&
  $PERF_HZ =~ ^[0-9]+$ ]] || [ "$DURATION" -lt 8 ] || [ "$ROUNDS" -lt 1 ] ||
  [ "$PERF_HZ" -lt 1 ]; then
  echo "usage: ROUNDS (at least 1) [CASE...]; DURATION (at least 8), WARMUP and PERF_HZ whole numbers" >&2
  exit 2
fi
command -v perf >/dev/null || {
  echo "perf not found (Debian: apt-get install linux-perf)" >&2
  exit 1
}
. bench/lib.sh
export PROMNORM_BIN=$PROMNORM BENCH_BIN=$BENCH
# The SUT's process name (the kernel keeps 15 characters of it).
sut_comm=$(basename "$PROMNORM" | cut -c1-15)
mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/profile-ratio-$(date -u +%Y-%m-%dT%H%M).jsonl}
if [ -s "$RESULTS" ]; then
  echo "$RESULTS exists: the medians would mix its runs in; name another" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The share (per cent of all samples) of the four stages, the kernel's, all, and the
# number of samples.
shares() { # perf.data
  perf report -i "$1" --no-children --sort sym -g none -n 2>/dev/null | awk '
    /^ +[0-9.]+% +[0-9]+ +\[/ {
      p = $1; sub("%", "", p); all += p; n += $2
      if ($3 == "[k]") kernel += p
      sym = $0; sub(/^ +[0-9.]+% +[0-9]+ +\[.\] +/, "", sym); sub(/ +$/, "", sym)
      if (sym == "promnorm::wire::decode::DecodedRequest::decode_series" ||
          sym == "promnorm::mapping::apply::Mapper::apply" ||
          sym == "promnorm::mapping::apply::Mapper::map_request" ||
          sym == "snap::decompress::Decoder::decompress") base += p
    }
    END { printf "%.4f %.4f %.4f %d\n", base, kernel, all, n }'
}

descendants() { # pid
  local c
  for c in $(pgrep -P "$1" || true); do
    echo "$c"
    descendants "$c"
  done
}

profile() { # case round -> "base kernel all samples", or "0 0 0 0" when nothing was sampled
  local name=$1 round=$2 data=$work/$1.$2.data
  CASES=$name RESULTS=$work/runs.jsonl WARMUP=$WARMUP \
    bench/vs-vmagent.sh 1 "$DURATION" >"$work/$name.$round.log" 2>&1 &
  local runner=$! pid="" waited=0 p
  # The SUT is the promnorm binary among this run's descendants (not any other promnorm
  # on the machine); found before it is ready, sampled in the middle of the measured
  # window.
  while [ -z "$pid" ] && [ $waited -lt 120 ]; do
    sleep 0.5
    waited=$((waited + 1))
    for p in $(descendants "$runner"); do
      if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$sut_comm" ]; then
        pid=$p
        break
      fi
    done
  done
  sleep $((WARMUP + 2))
  if [ -n "$pid" ]; then
    perf record -F "$PERF_HZ" -o "$data" -p "$pid" -- sleep $((DURATION - 4)) >/dev/null 2>&1 || true
  fi
  wait $runner || true
  if [ -s "$data" ]; then shares "$data"; else echo "0 0 0 0"; fi
}

for ((round = 0; round < ROUNDS; round++)); do
  read -r b0 k0 a0 n0 < <(profile promnorm-all-packs "$round")
  for name in "${CASES_WANTED[@]}"; do
    read -r b k a n < <(profile "$name" "$round")
    # Every pack again, after the case: the next case's "before".
    read -r b1 k1 a1 n1 < <(profile promnorm-all-packs "$round")
    if awk -v x="$b" -v y="$b0" 'BEGIN { exit !(x == 0 || y == 0) }'; then
      echo "round $round, $name: no profile of the SUT (see the harness's output); left out" >&2
    else
      awk -v c="$name" -v r="$round" -v b="$b" -v k="$k" -v a="$a" -v n="$n" \
        -v b0="$b0" -v k0="$k0" -v a0="$a0" -v n0="$n0" \
        -v b1="$b1" -v k1="$k1" -v a1="$a1" -v n1="$n1" -v hz="$PERF_HZ" \
        -v commit="$BENCH_COMMIT" 'BEGIN {
          # The mean of every pack before and after the case (before alone when the run
          # after could not be profiled).
          if (b1 > 0) { bm = (b0 + b1) / 2; km = (k0 + k1) / 2; am = (a0 + a1) / 2; nm = n0 + n1 }
          else { bm = b0; km = k0; am = a0; nm = n0 }
          ratio = b / bm
          u = a - k; um = am - km
          ratio_user = (u > 0) ? (b / u) / (bm / um) : 0
          printf "{\"case\":\"%s\",\"round\":%d,\"base_share\":%.4f,\"kernel_share\":%.4f,\"base_share_all_packs\":%.4f,\"kernel_share_all_packs\":%.4f,\"base_share_all_packs_before\":%.4f,\"base_share_all_packs_after\":%.4f,\"ratio\":%.4f,\"ratio_user\":%.4f,\"samples\":%d,\"samples_all_packs\":%d,\"perf_hz\":%d,\"commit\":\"%s\"}\n",
            c, r, b, k, bm, km, b0, b1, ratio, ratio_user, n, nm, hz, commit
        }' | tee -a "$RESULTS"
    fi
    if awk -v x="$b1" 'BEGIN { exit !(x > 0) }'; then
      b0=$b1 k0=$k1 a0=$a1 n0=$n1
    fi
  done
done

if [ ! -s "$RESULTS" ]; then
  echo "no run was profiled (see the harness's output above)" >&2
  exit 1
fi

# Medians per case.
awk -F'[:,]' '
  { for (i = 1; i < NF; i++) {
      if ($i ~ /"case"$/) c = $(i + 1)
      if ($i == "\"ratio\"") r = $(i + 1)
      if ($i == "\"ratio_user\"") u = $(i + 1)
    }
    gsub(/"/, "", c)
    n[c]++; R[c, n[c]] = r; U[c, n[c]] = u }
  function median(A, c, k,   i, j, t, v) {
    for (i = 1; i <= k; i++) v[i] = A[c, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  END {
    printf "| case | runs | ratio to every pack (median) | user only (median) |\n|---|---|---|---|\n"
    for (c in n) printf "| %s | %d | %.3f | %.3f |\n", c, n[c], median(R, c, n[c]), median(U, c, n[c])
  }' "$RESULTS"
echo "results: $RESULTS"
