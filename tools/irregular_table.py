#!/usr/bin/env python3
"""Seed table of the irregular-sampling experiment (configs/forecast_irregular.yaml, scripts/irregular_experiment.sh).

Reads every run's summary.json under a `posenc compare` folder (runs named <variant>_s<seed>; task forecast_packed),
groups the runs by variant and prints two Markdown tables: held-out MAE and MASE, each as the mean over the seeds,
half the spread (max - min) / 2 and each seed's value, beside persistence (the last reading repeated); and MAE by the
largest gap between the readings of a (sample, variate) (the runs' generalization rows, lower bin edges in hours; a
bin with fewer than 20 pairs in a run is left out).
Writes a line chart of the seed means of MAE against the gap (one line per variant, each seed as a dot) as SVG.
Nothing is recomputed: the numbers are the summaries' own. Variants with different seed sets, or runs
that trained different numbers of steps (a stopped run beside finished ones), are refused in one line.

    ~/.cache/posenc/venv/bin/python tools/irregular_table.py runs/forecast_irregular [--svg docs/irregular.svg]
"""

import argparse
import json
import math
import os
import re
import sys

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def load(folder):
    """{variant: {seed: summary}} in name order."""
    runs = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "summary.json")
        match = re.fullmatch(r"(.+)_s(\d+)", name)
        if not match or not os.path.exists(path):
            continue
        with open(path) as f:
            summary = json.load(f)
        if "final" not in summary or "mase" not in summary["final"]:
            raise ValueError(f"{path}: no final mae/mase (is it a forecast_packed run?)")
        runs.setdefault(match.group(1), {})[int(match.group(2))] = summary
    if not runs:
        raise ValueError(f"{folder}: no finished runs named <variant>_s<seed>")
    # like with like: every variant over the same seeds, every run the same number of steps
    seed_sets = {variant: sorted(seeds) for variant, seeds in runs.items()}
    if len({tuple(s) for s in seed_sets.values()}) > 1:
        each = "; ".join(f"{v}: {', '.join(map(str, s))}" for v, s in seed_sets.items())
        raise ValueError(f"{folder}: the seeds differ between variants ({each}); finish the runs")
    steps = {f"{v}_s{k}": s["steps"] for v, seeds in runs.items() for k, s in seeds.items()}
    if len(set(steps.values())) > 1:
        each = ", ".join(f"{name}: {n}" for name, n in steps.items())
        raise ValueError(f"{folder}: the runs trained different numbers of steps ({each})")
    return runs


def order_of(folder, runs):
    """Variants in the comparison's order (results.csv), those missing from it last."""
    order = []
    csv = os.path.join(folder, "results.csv")
    if os.path.exists(csv):
        with open(csv) as f:
            for line in f.readlines()[1:]:
                match = re.fullmatch(r"(.+)_s\d+", line.split(",")[0])
                if match and match.group(1) in runs and match.group(1) not in order:
                    order.append(match.group(1))
    return order + [v for v in runs if v not in order]


def cell(values, digits=3):
    mean = sum(values) / len(values)
    spread = (max(values) - min(values)) / 2
    each = " / ".join(f"{v:.{digits}f}" for v in values)
    return f"**{mean:.{digits}f}** ± {spread:.{digits}f} ({each})"


def gaps_of(runs):
    """Lower bin edges that some run holds with enough pairs."""
    return sorted({g for seeds in runs.values() for s in seeds.values() for g in by_gap(s)})


MIN_PAIRS = (
    20  # a gap bin with fewer (series, forecast) pairs in a run is left out: too few to average
)


def by_gap(summary):
    """{lower bin edge: metrics} of the bins that hold at least MIN_PAIRS pairs."""
    rows = summary.get("generalization", [])
    return {row["x"]: row["metrics"] for row in rows if row["metrics"].get("pairs", 0) >= MIN_PAIRS}


def tables(runs, order):
    lines = [
        "| variant | seeds | MAE (°F) | MASE | persistence MAE | persistence MASE |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for variant in order:
        seeds = runs[variant]
        keys = sorted(seeds)
        final = [seeds[k]["final"] for k in keys]
        lines.append(
            f"| {variant} | {', '.join(map(str, keys))} | {cell([f['mae'] for f in final])} | "
            f"{cell([f['mase'] for f in final])} | {cell([f['mae_last'] for f in final], 2)} | "
            f"{cell([f['mase_last'] for f in final], 2)} |"
        )
    gaps = gaps_of(runs)
    edges = [
        f"{g:g}–{gaps[i + 1]:g} h" if i + 1 < len(gaps) else f"≥ {g:g} h"
        for i, g in enumerate(gaps)
    ]
    lines += [
        "",
        "| variant | " + " | ".join(f"MAE, largest gap {e}" for e in edges) + " |",
        "|---|" + "---:|" * len(gaps),
    ]
    for variant in order:
        seeds = runs[variant]
        cells = []
        for g in gaps:
            values = [by_gap(seeds[k])[g]["mae"] for k in sorted(seeds) if g in by_gap(seeds[k])]
            cells.append(cell(values) if values else "—")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    first = runs[order[0]][min(runs[order[0]])]
    counts = ", ".join(f"{int(by_gap(first).get(g, {}).get('pairs', 0))}" for g in gaps)
    lines += [
        "",
        f"(series x forecasts per gap bin in {order[0]}, seed {min(runs[order[0]])}: {counts})",
    ]
    return "\n".join(lines)


def svg(runs, order, title):
    width, height, left, right, top, bottom = 640, 420, 60, 170, 40, 50
    gaps = gaps_of(runs)
    xs = {g: i for i, g in enumerate(gaps)}  # bins evenly spaced (their edges double)
    values = [
        by_gap(s)[g]["mae"] for seeds in runs.values() for s in seeds.values() for g in by_gap(s)
    ]
    y0, y1 = 0.0, math.ceil(max(values) * 2) / 2
    px = lambda g: left + xs[g] / max(1, len(gaps) - 1) * (width - left - right)  # noqa: E731
    py = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{title}</text>',
    ]
    steps = int(round((y1 - y0) / 0.5))
    for k in range(steps + 1):
        y = y0 + 0.5 * k
        out.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{px(gaps[-1]):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for i, g in enumerate(gaps):
        label = f"{g:g}–{gaps[i + 1]:g} h" if i + 1 < len(gaps) else f"≥ {g:g} h"
        out.append(
            f'<text x="{px(g):.1f}" y="{height - bottom + 18}" text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="{(left + px(gaps[-1])) / 2:.1f}" y="{height - 12}" text-anchor="middle">'
        "largest gap between a series' readings in the sample</text>"
    )
    out.append(
        f'<text x="14" y="{(top + height - bottom) / 2:.1f}" transform="rotate(-90 14 '
        f'{(top + height - bottom) / 2:.1f})" text-anchor="middle">held-out MAE (°F)</text>'
    )
    for i, variant in enumerate(order):
        colour = COLOURS[i % len(COLOURS)]
        seeds = runs[variant]
        means = []
        for g in gaps:
            vals = [by_gap(s)[g]["mae"] for s in seeds.values() if g in by_gap(s)]
            if vals:
                means.append((g, sum(vals) / len(vals)))
            for v in vals:
                out.append(f'<circle cx="{px(g):.1f}" cy="{py(v):.1f}" r="2.5" fill="{colour}"/>')
        points = " ".join(f"{px(g):.1f},{py(m):.1f}" for g, m in means)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        y = top + 10 + 20 * i
        out.append(
            f'<line x1="{width - right + 12}" y1="{y}" x2="{width - right + 36}" y2="{y}" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        out.append(f'<text x="{width - right + 42}" y="{y + 4}">{variant}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the posenc compare output folder (runs/forecast_irregular)")
    parser.add_argument("--svg", help="write the chart of MAE by gap (seed means) here")
    args = parser.parse_args()
    try:
        runs = load(args.folder)
    except (OSError, ValueError) as error:
        sys.exit(f"irregular_table: {error}")
    order = order_of(args.folder, runs)
    print(tables(runs, order))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(
                svg(
                    runs,
                    order,
                    "Two irregular sensors: held-out MAE by gap (mean of seeds; dots: seeds)",
                )
            )
        print(f"wrote {args.svg}", file=sys.stderr)


if __name__ == "__main__":
    main()
