#!/usr/bin/env bash
# Throughput of 1 and 2 promnorm replicas behind a round-robin nginx (BENCHMARKS.md,
# "Replicas behind a load balancer"): promnorm-bench load -> nginx round robin -> N
# promnorm -> promnorm-bench sink (a null sink). Needs only this repository and Debian's
# nginx. Each replica is a separate `promnorm serve`; the balancer keeps
# keep-alive connections to each (as a Kubernetes Service in IPVS/ proxy mode or an
# ingress would). Per replica count it prints (and appends as JSON to bench/results/)
# the load's samples/s and latency, each replica's share of the samples and its CPU.
#
# Usage: bench/replicas.sh [DURATION_S] [CONNECTIONS] [CONFIG]
#   DURATION_S   measured seconds per replica count (default 20; a 5 s warm-up precedes)
#   CONNECTIONS  load connections (default 16)
#   CONFIG       promnorm configuration (default bench/stateless.yaml: all packs, derived
#                series off, as replicas behind a balancer run; see README "Scale-out")
# Environment:
#   REPLICAS="1 2"       replica counts to measure, in order
#   REPLICA_CPUS=""      taskset list per replica, e.g. "1 0" (replica 1 on core 1,
#                        replica 2 on core 0); empty: no pinning (the default: on a
#                        2-core machine, replicas, balancer, sink and the load share the cores)
#   LOAD_CPUS=""         taskset list for the load, the balancer and the sink (empty: none)
#   PROMNORM_BIN         a promnorm binary (default: cargo build --release)
#   BENCH_BIN            a promnorm-bench binary (default: beside PROMNORM_BIN)
#   NGINX                nginx binary (default: the one on PATH, else Debian's package
#                        unpacked with apt-get download + dpkg -x into .tmp/nginx)
# Needs /usr/bin/python3. Only processes this script started are stopped, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-20}
CONNS=${2:-16}
CONFIG=${3:-bench/stateless.yaml}
REPLICAS=${REPLICAS:-1 2}
read -r -a REPLICA_CPUS <<<"${REPLICA_CPUS:-}"
LOAD_CPUS=${LOAD_CPUS:-}
RELEASE=${CARGO_TARGET_DIR:-$PWD/target}/release
WARMUP=${WARMUP:-5}
LB_PORT=${LB_PORT:-19300}
SINK_PORT=${SINK_PORT:-19201}
FIRST_REPLICA_PORT=${FIRST_REPLICA_PORT:-19301}

# nginx: on PATH, else Debian's package unpacked locally (no root needed).
NGINX=${NGINX:-$(command -v nginx || true)}
if [ -z "$NGINX" ]; then
  LOCAL=$PWD/.tmp/nginx
  if [ ! -x "$LOCAL/usr/sbin/nginx" ]; then
    mkdir -p "$LOCAL/debs"
    (cd "$LOCAL/debs" && apt-get download nginx nginx-common >/dev/null)
    for deb in "$LOCAL"/debs/*.deb; do dpkg -x "$deb" "$LOCAL"; done
  fi
  NGINX=$LOCAL/usr/sbin/nginx
fi

if [ -z "${PROMNORM_BIN:-}" ]; then
  cargo build --release --quiet -p promnorm -p promnorm-tools --bin promnorm --bin promnorm-bench
  PROMNORM_BIN=$RELEASE/promnorm
fi
BENCH_BIN=${BENCH_BIN:-$(dirname "$PROMNORM_BIN")/promnorm-bench}
[ -x "$BENCH_BIN" ] || { echo "no promnorm-bench at $BENCH_BIN (set BENCH_BIN)" >&2; exit 2; }

# pin CPUS: sets PIN to the taskset prefix for CPUS (empty: none). A command started as
# `"${PIN[@]}" cmd &` is itself the background job, so $! is its PID.
pin() {
  PIN=()
  if [ -n "$1" ]; then PIN=(taskset -c "$1"); fi
}
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

WORK=$(mktemp -d)
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
SINK_PID=
trap 'stop_all; [ -z "$SINK_PID" ] || { kill "$SINK_PID"; wait "$SINK_PID"; } 2>/dev/null; rm -rf "$WORK"' EXIT

wait_ok() { # wait_ok URL
  for _ in $(seq 100); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  return 1
}

# The null sink, for the whole script.
for port in "$SINK_PORT" "$LB_PORT"; do
  ! port_busy "$port" || { echo "port $port is busy (not ours?)" >&2; exit 1; }
done
pin "$LOAD_CPUS"
"${PIN[@]}" "$BENCH_BIN" sink --listen "127.0.0.1:$SINK_PORT" >"$WORK/sink.log" 2>&1 &
SINK_PID=$!
for _ in $(seq 50); do port_busy "$SINK_PORT" && break; sleep 0.1; done

# counter NAME PORT: the sum of a counter over its labels in a replica's /metrics.
counter() {
  curl -sf "http://127.0.0.1:$2/metrics" |
    awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

mkdir -p bench/results
RESULTS=${RESULTS:-bench/results/replicas-$(date -u +%Y-%m-%dT%H%M).jsonl}
TICKS=$(getconf CLK_TCK)

for n in $REPLICAS; do
  ports=() rpids=()
  upstream=""
  for i in $(seq 1 "$n"); do
    port=$((FIRST_REPLICA_PORT + i - 1))
    ports+=("$port")
    ! port_busy "$port" || { echo "port $port is busy (not ours?)" >&2; exit 1; }
    pin "${REPLICA_CPUS[$((i - 1))]:-}"
    "${PIN[@]}" "$PROMNORM_BIN" serve --config "$CONFIG" \
      --listen "127.0.0.1:$port" --backend "http://127.0.0.1:$SINK_PORT/api/v1/write" \
      2>"$WORK/replica-$i.log" &
    rpids+=($!)
    PIDS+=($!)
    upstream+="        server 127.0.0.1:$port;"$'\n'
  done
  mkdir -p "$WORK/lb-$n"
  cat >"$WORK/lb-$n/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid nginx.pid;
error_log error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path client_body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;
    upstream promnorm {
$upstream        keepalive 64;
    }
    server {
        listen 127.0.0.1:$LB_PORT backlog=4096;
        keepalive_requests 10000000;
        keepalive_timeout 300s;
        client_max_body_size 0;
        client_body_buffer_size 32m;
        location / {
            proxy_pass http://promnorm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
EOF
  pin "$LOAD_CPUS"
  "${PIN[@]}" "$NGINX" -e stderr -p "$WORK/lb-$n/" -c "$WORK/lb-$n/nginx.conf" &
  LB_PID=$!
  PIDS+=($LB_PID)
  for port in "${ports[@]}"; do wait_ok "http://127.0.0.1:$port/-/ready"; done
  wait_ok "http://127.0.0.1:$LB_PORT/-/ready"
  for p in "${rpids[@]}" "$LB_PID"; do
    kill -0 "$p" 2>/dev/null || { echo "a replica or the balancer exited; logs in $WORK" >&2; exit 1; }
  done

  load_run() { # load_run SECONDS WARMUP_SECONDS: one JSON line
    pin "$LOAD_CPUS"
    "${PIN[@]}" "$BENCH_BIN" load --url "http://127.0.0.1:$LB_PORT/api/v1/write" \
      -c "$CONNS" -d "$1" --warmup "$2"
  }
  [ "$WARMUP" -gt 0 ] && load_run "$WARMUP" 0 >/dev/null
  before_in=() before_cpu=()
  for i in $(seq 0 $((n - 1))); do
    before_in+=("$(counter promnorm_samples_received_total "${ports[$i]}")")
    before_cpu+=("$(cpu_ticks "${rpids[$i]}")")
  done
  line=$(load_run "$DURATION" 0) || { echo "the load failed: $line" >&2; exit 1; }
  shares="" cpus=""
  for i in $(seq 0 $((n - 1))); do
    shares+="$(( $(counter promnorm_samples_received_total "${ports[$i]}") - before_in[i] )) "
    cpus+="$(( $(cpu_ticks "${rpids[$i]}") - before_cpu[i] )) "
  done
  non2xx=$(for p in "${ports[@]}"; do
    curl -sf "http://127.0.0.1:$p/metrics" |
      awk '/^promnorm_requests_total\{/ && !/code="2/ { s += $NF } END { printf "%.0f\n", s }'
  done | awk '{ s += $1 } END { print s }')
  /usr/bin/python3 - "$n" "$DURATION" "$CONNS" 0 "$TICKS" "$CONFIG" "$line" \
    "$shares" "$cpus" "$non2xx" "$RESULTS" <<'PY'
import json, sys, time
n, duration, conns, per, ticks = (int(x) for x in sys.argv[1:6])
config, line, shares, cpus, non2xx, results = sys.argv[6:12]
w = json.loads(line)
secs = w["window_s"]
per = w["samples_per_request"]
shares = [int(x) for x in shares.split()]
cpus = [int(x) / ticks / secs for x in cpus.split()]
errors = int(w["errors"]) + int(w["non2xx"])
r = {
    "case": f"promnorm-x{n}", "replicas": n, "config": config, "connections": conns,
    "samples_per_request": per, "window_s": round(secs, 2),
    "load_samples_per_s": round(w["samples_per_s"]),
    "replica_samples_per_s": [round(s / secs) for s in shares],
    "replica_cpu_cores": [round(c, 3) for c in cpus],
    "load_errors": errors, "promnorm_non2xx_total": int(non2xx),
    "lat_p50_ms": w["lat_p50_ms"], "lat_p99_ms": w["lat_p99_ms"],
    "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}
with open(results, "a") as f:
    f.write(json.dumps(r) + "\n")
print(f"{n} replica(s): {r['load_samples_per_s']:,} samples/s through the balancer "
      f"(per replica {r['replica_samples_per_s']}, CPU cores {r['replica_cpu_cores']}); "
      f"p50 {r['lat_p50_ms']:.1f} ms, p99 {r['lat_p99_ms']:.1f} ms; "
      f"load errors {errors}, non-2xx answers {non2xx}")
PY
  stop_all
  # The balancer's port again free before the next count starts.
  for _ in $(seq 50); do port_busy "$LB_PORT" || break; sleep 0.1; done
done
echo "results: $RESULTS"
