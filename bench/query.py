#!/usr/bin/env python3
"""The query API's overhead (docs/query.md): range queries through promnorm against the
upstream asked directly, in the same run, on one real Prometheus.

The Prometheus holds six hours of a cut-over, backfilled with promtool: the first three
hours under the old names and units (DCGM's MiB gauge with `Hostname`, SGLang's
millisecond histogram), the last three normalised (bytes, `hostname`, seconds). Each
case is one dashboard panel, asked in rounds that alternate the two paths:

  direct    Prometheus asked the query a migrated dashboard would send (the keep-values
            rewrite, `promnorm migrate query --keep-values`): new names only, so the
            second half of the range.
  both      that plus the original query asked directly: the upstream's work for the
            answer promnorm gives (both halves).
  promnorm  promnorm asked the old panel's query: it asks the rewritten and the
            original query, restores the old terms and merges both periods.

A pass-through case (a query in the new names) measures the relay alone. Reported per
case: the medians, their ratio and the difference in ms, and promnorm's peak RSS while
CONCURRENCY queries run at once (memory per concurrent query). One JSON line per case in
bench/results/query-<UTC time>.jsonl.

Usage: bench/query.py  (env: PROMNORM, PROMETHEUS, PROMTOOL, ROUNDS=30, CONCURRENCY=16,
GPUS=64, RANGE_H=6, STEP_S=15)
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.client import HTTPConnection

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMNORM = os.environ.get("PROMNORM", os.path.join(ROOT, "target/release/promnorm"))
E2E = os.path.join(ROOT, ".e2e-bin/usr/bin")
PROMETHEUS = os.environ.get("PROMETHEUS", os.path.join(E2E, "prometheus"))
PROMTOOL = os.environ.get("PROMTOOL", os.path.join(E2E, "promtool"))
ROUNDS = int(os.environ.get("ROUNDS", "30"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "16"))
GPUS = int(os.environ.get("GPUS", "64"))
RANGE_H = float(os.environ.get("RANGE_H", "6"))
STEP_S = int(os.environ.get("STEP_S", "15"))
BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
MIB = 1048576


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def le_text(ms, seconds):
    return f"{ms / 1000:g}" if seconds else f"{ms}"


def backfill(path, start, end):
    """OpenMetrics text of the cut-over: old names before `cut`, new names after."""
    cut = (start + end) // 2
    with open(path, "w") as f:
        for old in (True, False):
            t0, t1 = (start, cut) if old else (cut, end)
            fb = "DCGM_FI_DEV_FB_USED" if old else "DCGM_FI_DEV_FB_USED_bytes"
            host = "Hostname" if old else "hostname"
            f.write(f"# TYPE {fb} gauge\n")
            for g in range(GPUS):
                for t in range(t0, t1, STEP_S):
                    mib = 1000 + (g * 37 + t // STEP_S) % 4000
                    v = mib if old else mib * MIB
                    f.write(f'{fb}{{{host}="node-{g // 8}",gpu="{g % 8}"}} {v} {t}\n')
            lat = "sglang:kv_transfer_latency_ms" if old else "sglang:kv_transfer_latency_seconds"
            f.write(f"# TYPE {lat} histogram\n")
            for g in range(GPUS // 8):
                for t in range(t0, t1, STEP_S):
                    n = (t - start) // STEP_S + 1
                    cum = 0
                    for i, b in enumerate(BUCKETS_MS):
                        cum = n * (i + 1) * 10
                        f.write(f'{lat}_bucket{{instance="w{g}",le="{le_text(b, not old)}"}} {cum} {t}\n')
                    f.write(f'{lat}_bucket{{instance="w{g}",le="+Inf"}} {cum + n} {t}\n')
                    total_ms = n * 900.0
                    s = total_ms if old else total_ms / 1000
                    f.write(f'{lat}_sum{{instance="w{g}"}} {s} {t}\n')
                    f.write(f'{lat}_count{{instance="w{g}"}} {cum + n} {t}\n')
        f.write("# EOF\n")
    return cut


def wait_http(url, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def keep_values(query):
    out = subprocess.run(
        [PROMNORM, "migrate", "query", "--keep-values", query],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def ask(conn, query, start, end):
    body = urllib.parse.urlencode(
        {"query": query, "start": start, "end": end, "step": STEP_S}
    )
    t = time.perf_counter()
    conn.request("POST", "/api/v1/query_range", body,
                 {"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    data = r.read()
    took = time.perf_counter() - t
    if r.status != 200:
        raise RuntimeError(f"{r.status} for {query}: {data[:300]!r}")
    doc = json.loads(data)
    points = sum(len(s["values"]) for s in doc["data"]["result"])
    return took, points, len(data)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def peak_rss_under_load(pid, port, query, start, end):
    """promnorm's peak RSS while CONCURRENCY copies of `query` run at once, 3 times."""
    stop = threading.Event()
    peak = [rss_kib(pid)]

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            time.sleep(0.005)

    def worker():
        c = HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(3):
            ask(c, query, start, end)
        c.close()

    w = threading.Thread(target=watch)
    w.start()
    threads = [threading.Thread(target=worker) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    w.join()
    return peak[0]


def main():
    for b in (PROMNORM, PROMETHEUS, PROMTOOL):
        if not os.access(b, os.X_OK):
            sys.exit(f"missing {b} (cargo build --release; scripts/test.sh fetches Prometheus)")
    work = tempfile.mkdtemp(prefix="promnorm-query-bench-")
    procs = []
    try:
        end = int(time.time()) // 60 * 60 - 120
        start = end - int(RANGE_H * 3600)
        text = os.path.join(work, "backfill.om")
        cut = backfill(text, start, end)
        tsdb = os.path.join(work, "tsdb")
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", text, tsdb],
                       check=True, capture_output=True)
        prom_port, pn_port = free_port(), free_port()
        cfg = os.path.join(work, "prometheus.yml")
        open(cfg, "w").write("global: {}\n")
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{prom_port}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        pn_cfg = os.path.join(work, "promnorm.yaml")
        open(pn_cfg, "w").write(
            f"listen: 127.0.0.1:{pn_port}\n"
            "backends:\n  - url: http://127.0.0.1:9/api/v1/write\n"
            f"query:\n  upstream: http://127.0.0.1:{prom_port}\n")
        procs.append(subprocess.Popen([PROMNORM, "serve", "--config", pn_cfg],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{pn_port}/-/ready")
        pn_pid = procs[-1].pid
        if os.environ.get("HOLD"):
            print(f"prometheus 127.0.0.1:{prom_port} promnorm 127.0.0.1:{pn_port} "
                  f"pid {pn_pid} start {start} end {end}", flush=True)
            time.sleep(float(os.environ["HOLD"]))

        panels = [
            ("raw-gauge", "DCGM_FI_DEV_FB_USED"),
            ("sum-by-renamed-label", "sum by (Hostname) (DCGM_FI_DEV_FB_USED)"),
            ("histogram-quantile",
             "histogram_quantile(0.99, sum by (le) (rate(sglang:kv_transfer_latency_ms_bucket[5m])))"),
            ("mean-latency",
             "rate(sglang:kv_transfer_latency_ms_sum[5m]) / rate(sglang:kv_transfer_latency_ms_count[5m])"),
            ("pass-through",
             "sum by (instance) (rate(sglang:kv_transfer_latency_seconds_count[5m]))"),
        ]
        results = os.path.join(ROOT, "bench/results", time.strftime("query-%Y-%m-%dT%H%M.jsonl", time.gmtime()))
        os.makedirs(os.path.dirname(results), exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or "unknown"
        direct = HTTPConnection("127.0.0.1", prom_port, timeout=60)
        proxied = HTTPConnection("127.0.0.1", pn_port, timeout=60)
        print(f"{'case':<22} {'direct ms':>10} {'both ms':>8} {'promnorm ms':>12} {'ratio':>6} "
              f"{'/both':>6} {'+ms':>7} {'points':>7} {'peak RSS MiB':>13}")
        for case, query in panels:
            rewritten = keep_values(query)
            # Warm both paths (Prometheus' caches, promnorm's connections).
            for _ in range(3):
                ask(direct, rewritten, start, end)
                ask(proxied, query, start, end)
            d, both, p = [], [], []
            for _ in range(ROUNDS):
                td, pts_d, bytes_d = ask(direct, rewritten, start, end)
                # The upstream's work for the same answer: the history under the old
                # names too (promnorm asks both questions at once).
                to = ask(direct, query, start, end)[0] if rewritten != query else 0.0
                tp, pts_p, bytes_p = ask(proxied, query, start, end)
                d.append(td)
                both.append(td + to)
                p.append(tp)
            md, mp = statistics.median(d) * 1e3, statistics.median(p) * 1e3
            mb = statistics.median(both) * 1e3
            idle = rss_kib(pn_pid)
            peak = peak_rss_under_load(pn_pid, pn_port, query, start, end)
            row = {
                "case": case, "query": query, "asked_directly": rewritten,
                "range_s": end - start, "step_s": STEP_S, "cut_over_at": cut,
                "rounds": ROUNDS, "direct_median_ms": round(md, 2),
                "direct_both_median_ms": round(mb, 2),
                "promnorm_median_ms": round(mp, 2), "ratio": round(mp / md, 2),
                "overhead_ms": round(mp - md, 2), "ratio_to_both": round(mp / mb, 2), "points_direct": pts_d,
                "points_promnorm": pts_p, "answer_bytes_direct": bytes_d,
                "answer_bytes_promnorm": bytes_p, "concurrency": CONCURRENCY,
                "rss_idle_kib": idle, "rss_peak_kib": peak,
                "rss_per_concurrent_query_kib": max(0, peak - idle) // CONCURRENCY,
                "commit": commit,
            }
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{case:<22} {md:>10.2f} {mb:>8.2f} {mp:>12.2f} {mp / md:>6.2f} {mp / mb:>6.2f} "
                  f"{mp - md:>7.2f} {pts_p:>7} {peak / 1024:>13.1f}")
        print(f"results: {os.path.relpath(results, ROOT)}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
