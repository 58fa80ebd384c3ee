#!/usr/bin/env python3
"""Seed means of the resolution experiment (configs/vit_resolution.yaml, scripts/resolution_experiment.sh).

Reads every run's summary.json under a `posenc compare` folder (runs named <encoder>_s<seed>), groups the runs by
encoder and prints a Markdown table: accuracy at each evaluation scale (1x = 28 px, the training resolution; 1.5x;
2x), the mean over the seeds and each seed's value; and writes a line chart of the means (accuracy against scale,
one line per encoder, each seed as a dot) as SVG. Nothing is recomputed: the numbers are the summaries' own.

    ~/.cache/posenc/venv/bin/python tools/resolution_table.py runs/vit_resolution [--svg docs/resolution.svg]
"""

import argparse
import json
import os
import re
import sys

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def load(folder):
    """{encoder: {seed: {scale: accuracy}}} in the order the runs were trained, and the scale labels."""
    runs = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, "summary.json")
        match = re.fullmatch(r"(.+)_s(\d+)", name)
        if not match or not os.path.exists(path):
            continue
        with open(path) as f:
            summary = json.load(f)
        if "generalization" not in summary:
            raise ValueError(
                f"{path}: no generalization rows (was the run evaluated at its eval_scales?)"
            )
        accuracy = {row["x"]: row["metrics"]["accuracy"] for row in summary["generalization"]}
        runs.setdefault(match.group(1), {})[int(match.group(2))] = accuracy
    if not runs:
        raise ValueError(f"{folder}: no finished runs named <encoder>_s<seed>")
    return runs


def order_of(folder, runs):
    """Encoders in the comparison's order (results.csv), those missing from it last."""
    order = []
    csv = os.path.join(folder, "results.csv")
    if os.path.exists(csv):
        with open(csv) as f:
            for line in f.readlines()[1:]:
                match = re.fullmatch(r"(.+)_s\d+", line.split(",")[0])
                if match and match.group(1) in runs and match.group(1) not in order:
                    order.append(match.group(1))
    return order + [e for e in runs if e not in order]


def table(runs, order):
    scales = sorted({s for seeds in runs.values() for acc in seeds.values() for s in acc})
    head = (
        "| encoder | seeds | " + " | ".join(f"{s:g}× ({round(28 * s)} px)" for s in scales) + " |"
    )
    lines = [head, "|---|---|" + "---:|" * len(scales)]
    for encoder in order:
        seeds = runs[encoder]
        cells = []
        for s in scales:
            values = [seeds[k][s] for k in sorted(seeds) if s in seeds[k]]
            mean = sum(values) / len(values)
            each = " / ".join(f"{100 * v:.2f}" for v in values)
            cells.append(f"**{100 * mean:.2f}** ({each})")
        lines.append(
            f"| {encoder} | {', '.join(map(str, sorted(seeds)))} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def svg(runs, order, title):
    width, height, left, right, top, bottom = 640, 420, 60, 170, 40, 50
    scales = sorted({s for seeds in runs.values() for acc in seeds.values() for s in acc})
    x0, x1 = scales[0], scales[-1]
    y0, y1 = 0.0, 1.0
    px = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    py = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{title}</text>',
    ]
    for k in range(11):  # y grid every 10 points
        y = k / 10
        out.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{px(x1):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{100 * y:.0f}%</text>'
        )
    for s in scales:
        out.append(
            f'<text x="{px(s):.1f}" y="{height - bottom + 18}" text-anchor="middle">{s:g}× '
            f"({round(28 * s)} px)</text>"
        )
    out.append(
        f'<text x="{(left + px(x1)) / 2:.1f}" y="{height - 12}" text-anchor="middle">'
        "test resolution (trained at 28 px)</text>"
    )
    for i, encoder in enumerate(order):
        colour = COLOURS[i % len(COLOURS)]
        seeds = runs[encoder]
        means = [(s, sum(seeds[k][s] for k in seeds) / len(seeds)) for s in scales]
        points = " ".join(f"{px(s):.1f},{py(m):.1f}" for s, m in means)
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for k in seeds:
            for s in scales:
                out.append(
                    f'<circle cx="{px(s):.1f}" cy="{py(seeds[k][s]):.1f}" r="2.5" fill="{colour}"/>'
                )
        y = top + 10 + 20 * i
        out.append(
            f'<line x1="{width - right + 12}" y1="{y}" x2="{width - right + 36}" y2="{y}" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        out.append(f'<text x="{width - right + 42}" y="{y + 4}">{encoder}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the posenc compare output folder (runs/vit_resolution)")
    parser.add_argument("--svg", help="write the chart of the seed means here")
    args = parser.parse_args()
    try:
        runs = load(args.folder)
    except (OSError, ValueError) as error:
        sys.exit(f"resolution_table: {error}")
    order = order_of(args.folder, runs)
    print(table(runs, order))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(
                svg(
                    runs,
                    order,
                    "Fashion-MNIST ViT: test accuracy by resolution (mean of seeds; dots: seeds)",
                )
            )
        print(f"wrote {args.svg}", file=sys.stderr)


if __name__ == "__main__":
    main()
