#!/usr/bin/env python3
"""Frontiers of `crisp eval pareto` (docs/evaluation.md, "Frontier harness and the splits").

Reads the frontier JSON and writes ONE PNG with a panel per length: the measure against density,
one line per policy family (the preset a point was swept from). The line joins the family's
Pareto-optimal points (no other point of the family is both sparser and better); every point is
drawn, the dominated ones faded. Dense is one point at density 1.

  NIAH mode (a real model):  --metric kept      share of dense's correct answers kept (default)
                             --metric accuracy  accuracy
  captures mode:             --metric top_mass_recall_mean (default), recall_mean, recall_min,
                             top_mass_recall_min, rel_error_mean

Usage: scripts/plot_frontier.py FRONTIER.json --out frontier.png [--metric M] [--title T]
"""
import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"dense": "black", "crisp": "tab:red", "flexprefill": "tab:blue", "minference": "tab:green"}
MARKERS = {"dense": "s", "crisp": "o", "flexprefill": "^", "minference": "v"}
LOWER_IS_BETTER = {"rel_error_mean"}


def metric_of(row, metric):
    key = {"kept": "kept_of_dense"}.get(metric, metric)
    value = row.get(key)
    return None if value is None else float(value)


def pareto(points, lower_better):
    """The points no other point beats on both density (lower) and the measure."""
    better = (lambda a, b: a <= b) if lower_better else (lambda a, b: a >= b)
    front = []
    for d, m, name in points:
        dominated = any(d2 <= d and better(m2, m) and (d2, m2) != (d, m) for d2, m2, _ in points)
        if not dominated:
            front.append((d, m, name))
    return sorted(front)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("frontier", help="JSON of crisp eval pareto")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--metric", help="what to plot against density (see above)")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    with open(args.frontier) as f:
        doc = json.load(f)
    captures = doc["settings"].get("mode") == "captures"
    metric = args.metric or ("top_mass_recall_mean" if captures else "kept")
    density_key = "density_mean" if captures else "mean_density"
    rows = doc.get("rows", [])
    if not rows:
        raise SystemExit(f"plot_frontier.py: error: {args.frontier} has no rows; expected a run of crisp eval pareto")
    if metric_of(rows[0], metric) is None and metric != "kept":
        raise SystemExit(f"plot_frontier.py: error: --metric {metric} is not in the rows; expected one of "
                         + ", ".join(k for k, v in rows[0].items() if isinstance(v, float)))
    lengths = sorted({r["length"] for r in rows})
    cols = min(3, len(lengths))
    nrows = math.ceil(len(lengths) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 4.2 * nrows), squeeze=False)
    for ax, length in zip(axes.flat, lengths):
        families = {}
        for r in rows:
            if r["length"] != length:
                continue
            m = metric_of(r, metric)
            if m is None and metric == "kept" and r["policy"] == "dense":
                m = 1.0  # dense keeps all of its own answers
            if m is None:
                continue
            families.setdefault(r["policy"], []).append((float(r[density_key]), m, r["point"]))
        for family, points in sorted(families.items()):
            color = COLORS.get(family, None)
            marker = MARKERS.get(family, "o")
            front = pareto(points, metric in LOWER_IS_BETTER)
            ax.scatter([p[0] for p in points], [p[1] for p in points], color=color, marker=marker, alpha=0.25, s=18)
            ax.plot([p[0] for p in front], [p[1] for p in front], color=color, marker=marker, label=family, lw=1.6)
        ax.set_title(f"{length} tokens" if not captures else f"{length}-token captures")
        ax.set_xlabel("density (kept causal blocks)")
        ax.set_ylabel({"kept": "share of dense's correct answers kept"}.get(metric, metric))
        ax.set_xlim(0, 1.02)
        if metric not in LOWER_IS_BETTER:
            ax.set_ylim(0, 1.02)  # shares
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(lengths):]:
        ax.axis("off")
    settings = doc["settings"]
    subtitle = settings.get("split") or ""
    fig.suptitle(args.title or f"frontier: {metric} against density" + (f" ({subtitle} split)" if subtitle else ""))
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
