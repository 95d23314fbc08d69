#!/usr/bin/env python3
"""Bar chart of the side-by-side run (bench/vs-vmagent.sh) as an SVG, standard library only.

    python3 bench/plot.py [RESULTS.jsonl ...] [-o bench/throughput.svg]

Without files it reads the newest side-by-side results file, bench/results/<UTC>.jsonl
(the name bench/vs-vmagent.sh gives them; the other scripts' files carry a prefix). Each
case's bar is the median of its runs' accepted samples/s (`sut_samples_per_s`, the SUT's
own ingest counter, as `promnorm-bench report` prints it), the thin line its min-max;
promnorm's cases beside vmagent's. On the pairs that compare like with like the ratio is
written too: the median over the rounds of the promnorm run over the vmagent run of the
same round (the runs of a case in time order; the script runs the cases interleaved, one
run of each per round), as BENCHMARKS.md gives it.
"""

import argparse
import json
import os
import re
import statistics
import sys
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
SIDE_BY_SIDE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{4}\.jsonl$")

# (case, label, system); the chart's order. Cases a file has and this list lacks follow.
CASES = [
    ("promnorm-all-packs", "promnorm, every pack + derived", "promnorm"),
    ("vmagent-relabel", "vmagent, 53 relabel rules", "vmagent"),
    ("promnorm-passthrough", "promnorm, pass-through", "promnorm"),
    ("vmagent-passthrough", "vmagent, pass-through", "vmagent"),
    ("promnorm-all-packs-rw2", "every pack, 2.0 in", "promnorm"),
    ("promnorm-all-packs-rw2-out", "every pack, 2.0 out", "promnorm"),
    ("promnorm-all-packs-memory-queue", "every pack, memory queue", "promnorm"),
    ("promnorm-all-packs-disk-queue", "every pack, disk queue", "promnorm"),
    ("promnorm-all-packs-tenancy", "every pack, tenancy", "promnorm"),
    ("promnorm-all-packs-limits", "every pack, series limits on", "promnorm"),
    ("promnorm-all-packs-wide", "every pack, ~481k-series fleet", "promnorm"),
]
# promnorm case over vmagent case, written beside the promnorm bar.
PAIRS = {
    "promnorm-all-packs": "vmagent-relabel",
    "promnorm-passthrough": "vmagent-passthrough",
}
COLOURS = {"promnorm": "#4a6fa5", "vmagent": "#d08b2c"}


def newest_side_by_side():
    names = sorted(n for n in os.listdir(RESULTS) if SIDE_BY_SIDE.match(n))
    if not names:
        sys.exit(f"no side-by-side results file (YYYY-MM-DDTHHMM.jsonl) in {RESULTS}")
    return [os.path.join(RESULTS, names[-1])]


def load(paths):
    runs = {}
    meta = {"commits": set(), "ts": []}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                row = json.loads(line)
                rate = row.get("sut_samples_per_s")
                if rate is None or "case" not in row:
                    continue
                runs.setdefault(row["case"], []).append((row.get("ts", ""), float(rate)))
                if row.get("commit"):
                    meta["commits"].add(row["commit"])
                if row.get("ts"):
                    meta["ts"].append(row["ts"])
    if not runs:
        sys.exit("no runs with sut_samples_per_s in " + ", ".join(paths))
    # Time order (ISO timestamps sort as text; a stable sort keeps the file's order
    # where there are none); the rates alone from here on.
    return {c: [r for _, r in sorted(v, key=lambda t: t[0])] for c, v in runs.items()}, meta


def round_ratio(a, b):
    """Median of a[i] / b[i] over the rounds both cases ran."""
    n = min(len(a), len(b))
    return statistics.median(a[i] / b[i] for i in range(n) if b[i] > 0)


def millions(x):
    return f"{x / 1e6:.2f} M"


def chart(runs, meta, sources):
    known = [c for c in CASES if c[0] in runs]
    extra = [(c, c, "vmagent" if c.startswith("vmagent") else "promnorm")
             for c in sorted(runs) if c not in {k[0] for k in CASES}]
    rows = known + extra
    med = {c: statistics.median(v) for c, v in runs.items()}
    top = max(max(v) for v in runs.values())
    # Axis to the next whole million above the largest run.
    axis = max(1, int(top / 1e6) + 1) * 1e6

    left, bar_w, right = 250, 560, 150
    row_h, bar_h, head, foot = 34, 20, 78, 58
    width = left + bar_w + right
    height = head + row_h * len(rows) + foot

    def x(v):
        return left + bar_w * v / axis

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        "  <title>Accepted samples/s per case, promnorm beside vmagent, one core each</title>",
        f'  <rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'  <text x="{left}" y="24" font-size="15" font-weight="bold">'
        "Accepted samples/s, one core each (median of the runs)</text>",
    ]
    commits = ", ".join(sorted(meta["commits"])) or "unknown"
    when = ""
    if meta["ts"]:
        first, last = min(meta["ts"]), max(meta["ts"])
        when = f", {first[:10]} {first[11:16]}–{last[11:16]} UTC"
    src = ", ".join(os.path.relpath(p, ROOT) for p in sources)
    out.append(f'  <text x="{left}" y="42" fill="#555">{escape(src)}: commit {escape(commits)}'
               f"{escape(when)}</text>")
    # Grid: one line per million.
    step = 1e6
    v = 0.0
    while v <= axis + 1:
        gx = x(v)
        out.append(f'  <line x1="{gx:.1f}" y1="{head - 10}" x2="{gx:.1f}" '
                   f'y2="{head + row_h * len(rows)}" stroke="#e3e3e3"/>')
        out.append(f'  <text x="{gx:.1f}" y="{head - 14}" text-anchor="middle" '
                   f'font-size="10" fill="#777">{int(v / 1e6)} M</text>')
        v += step
    for i, (case, label, system) in enumerate(rows):
        y = head + row_h * i + (row_h - bar_h) / 2
        values = runs[case]
        m = med[case]
        colour = COLOURS[system]
        out.append(f'  <text x="{left - 10}" y="{y + bar_h / 2 + 4:.1f}" text-anchor="end">'
                   f"{escape(label)}</text>")
        out.append(f'  <rect x="{left}" y="{y:.1f}" width="{x(m) - left:.1f}" height="{bar_h}" '
                   f'fill="{colour}"/>')
        lo, hi = min(values), max(values)
        cy = y + bar_h / 2
        out.append(f'  <line x1="{x(lo):.1f}" y1="{cy:.1f}" x2="{x(hi):.1f}" y2="{cy:.1f}" '
                   'stroke="#222" stroke-width="1.2"/>')
        for end in (lo, hi):
            out.append(f'  <line x1="{x(end):.1f}" y1="{cy - 5:.1f}" x2="{x(end):.1f}" '
                       f'y2="{cy + 5:.1f}" stroke="#222" stroke-width="1.2"/>')
        text = millions(m)
        other = PAIRS.get(case)
        if other in runs:
            text += f"  ({round_ratio(values, runs[other]):.2f}× vmagent)"
        out.append(f'  <text x="{max(x(hi), x(m)) + 8:.1f}" y="{cy + 4:.1f}">'
                   f"{escape(text)}</text>")
    ly = head + row_h * len(rows) + 26
    out.append(f'  <rect x="{left}" y="{ly - 10}" width="12" height="12" fill="{COLOURS["promnorm"]}"/>')
    out.append(f'  <text x="{left + 18}" y="{ly}">promnorm</text>')
    out.append(f'  <rect x="{left + 100}" y="{ly - 10}" width="12" height="12" fill="{COLOURS["vmagent"]}"/>')
    out.append(f'  <text x="{left + 118}" y="{ly}">vmagent 1.79</text>')
    rounds = sorted({len(v) for v in runs.values()})
    out.append(f'  <text x="{left + 230}" y="{ly}" fill="#555">bar: median of '
               f'{"/".join(str(r) for r in rounds)} runs; line: min–max; ×: median '
               "of the rounds' ratios</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="results files (default: the newest side-by-side one)")
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "bench", "throughput.svg"))
    args = ap.parse_args()
    sources = args.files or newest_side_by_side()
    runs, meta = load(sources)
    svg = chart(runs, meta, sources)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"{args.output}: {len(runs)} cases from {', '.join(sources)}")


if __name__ == "__main__":
    main()
