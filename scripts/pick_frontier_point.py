#!/usr/bin/env python3
"""Picks one point of a policy's knob sweep from TUNING-split frontier JSONs, by a rule fixed
before the data is seen (issue 14's acceptance, applied to the tuning split):

  a candidate qualifies on a (model, length) run when it keeps at least --min-kept of dense's
  correct answers (rounded up) AND at least as many correct answers as the baseline point, at
  a density of at most --max-ratio x the baseline's;

  the pick is the candidate that qualifies on the most runs; ties go to the lowest worst-case
  density ratio (its largest density / baseline density over the runs), then to the name.

Every run must hold the baseline point and dense; a candidate missing a run, or cut short there
(fewer samples than dense), counts as not qualifying there. Prints a table on stderr and the pick in sweep syntax (`crisp:knob=v;knob=v`,
or the bare preset name) on stdout, so a pipeline can pass it to `--policies`.

--probe PROBE.json (repeatable): a pass-key copy probe's JSON (scripts/passkey_copy_probe.py) is
one more run, without a density: a candidate qualifies there when it keeps at least --min-kept of
dense's right answers and at least as many as the baseline (`kept_of_dense` of its summary).
--all: print the pick only when it qualifies on every run, else `none` (exit status 0 either way),
so a pipeline reads the test split only for a point that met the bar on the tuning split.

Usage: scripts/pick_frontier_point.py RUN.json [RUN.json ...] [--policy crisp]
           [--baseline flexprefill] [--min-kept 0.97] [--max-ratio 0.75] [--probe PROBE.json ...] [--all]
"""
import argparse
import json
import math
import sys


def load_json(path, argument):
    """The JSON at `path`, or an error naming the command-line `argument` it came from."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"pick_frontier_point: error: {argument} '{path}': {e}")


def load_rows(path):
    data = load_json(path, "RUN.json")
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise SystemExit(f"pick_frontier_point: error: RUN.json '{path}': no 'rows' list (a crisp frontier JSON?)")
    return data.get("settings", {}), rows


def point_spec(row):
    """The point in the syntax --policies accepts: the preset, or PRESET:knob=v;knob=v."""
    knobs = row.get("knobs") or {}
    if not knobs:
        return row["policy"]
    return row["policy"] + ":" + ";".join(f"{k}={knobs[k]}" for k in sorted(knobs))


def runs_of(paths):
    """(run name, length) -> {point name: row}, one run per file and length."""
    runs = {}
    for path in paths:
        settings, rows = load_rows(path)
        model = settings.get("model", path)
        for row in rows:
            key = (f"{model}", int(row["length"]))
            runs.setdefault(key, {})[row["point"]] = row
    return runs


def load_probe(path):
    """A probe JSON as (run key, {point: {"kept_of_dense": ..., "correct": ...}}): dense's and each point's counts."""
    data = load_json(path, "--probe")
    summary = data.get("summary")
    if not isinstance(summary, dict) or "dense" not in summary:
        raise SystemExit(f"pick_frontier_point: error: --probe '{path}': no 'summary' with a 'dense' entry "
                         "(a scripts/passkey_copy_probe.py JSON?)")
    return (f"probe {data.get('model', path)}", 0), summary


def normalized(spec):
    """A point's spec as (policy, sorted knobs): `crisp:a=1;b=2`, `crisp:b=2:a=1` and the frontier
    JSON's point name of the same knobs compare equal."""
    policy, _, knobs = spec.partition(":")
    return policy, tuple(sorted(k for k in knobs.replace(";", ":").split(":") if k))


def probe_cell(summary, name, baseline, min_kept):
    """(qualifies, cell text) of point `name` on one probe."""
    if baseline not in summary:
        raise SystemExit(f"pick_frontier_point: error: a --probe run lacks the baseline '{baseline}' (--baseline)")
    row = next((r for key, r in summary.items() if normalized(key) == normalized(name)), None)
    if row is None:
        return False, "missing"
    need = max(math.ceil(min_kept * summary["dense"]["correct"] - 1e-9), summary[baseline]["kept_of_dense"])
    ok = row["kept_of_dense"] >= need
    return ok, f"kept {row['kept_of_dense']}/{need}{' ok' if ok else ''}"


def pick(runs, policy, baseline, min_kept, max_ratio, probes=()):
    candidates = sorted({name for points in runs.values() for name, row in points.items()
                         if row["policy"] == policy and name != baseline})
    if not candidates:
        raise SystemExit(f"pick_frontier_point: error: --policy '{policy}': no point of that policy in the runs")
    table = []
    for name in candidates:
        qualified = 0
        worst_ratio = 0.0
        spec = None
        cells = []
        for key, points in sorted(runs.items()):
            if baseline not in points or "dense" not in points:
                raise SystemExit(f"pick_frontier_point: error: run {key}: expected points 'dense' and "
                                 f"'{baseline}' (--baseline)")
            base, dense, row = points[baseline], points["dense"], points.get(name)
            # a point cut short (fewer samples than dense) is not comparable: missing
            if (row is None or row.get("mean_density") is None or not base.get("mean_density")
                    or row.get("samples") != dense.get("samples")):
                cells.append("missing")
                worst_ratio = math.inf
                continue
            spec = point_spec(row)
            need = max(math.ceil(min_kept * dense["correct"] - 1e-9), base["correct"])
            ratio = row["mean_density"] / base["mean_density"]
            ok = row["correct"] >= need and ratio <= max_ratio + 1e-12
            qualified += ok
            worst_ratio = max(worst_ratio, ratio)
            cells.append(f"{row['correct']}/{need} {ratio:.2f}x{' ok' if ok else ''}")
        for _, summary in probes:
            ok, cell = probe_cell(summary, name, baseline, min_kept)
            qualified += ok
            cells.append(cell)
        table.append((-qualified, worst_ratio, name, spec, cells))
    table.sort()
    keys = sorted(runs) + [key for key, _ in probes]
    print("point | " + " | ".join(f"{m.split('/')[-1]} {n}" for m, n in keys) + " | qualified | worst ratio",
          file=sys.stderr)
    for neg_q, worst, name, _, cells in table:
        print(f"{name} | " + " | ".join(cells) + f" | {-neg_q}/{len(keys)} | {worst:.3f}", file=sys.stderr)
    best = table[0]
    if best[3] is None:
        raise SystemExit("pick_frontier_point: error: no candidate has a complete run")
    return best[3], -best[0], len(keys)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="RUN.json")
    ap.add_argument("--policy", default="crisp")
    ap.add_argument("--baseline", default="flexprefill", help="point name of the baseline (default flexprefill)")
    ap.add_argument("--min-kept", type=float, default=0.97, help="share of dense's correct answers to keep")
    ap.add_argument("--max-ratio", type=float, default=0.75, help="largest density / baseline density")
    ap.add_argument("--probe", action="append", default=[], metavar="PROBE.json",
                    help="a pass-key copy probe JSON: one more run, answers only (repeatable)")
    ap.add_argument("--all", action="store_true", help="print 'none' unless the pick qualifies on every run")
    args = ap.parse_args(argv)
    if not 0.0 < args.min_kept <= 1.0:
        ap.error(f"--min-kept {args.min_kept}: expected a share in (0, 1]")
    if not args.max_ratio > 0.0:
        ap.error(f"--max-ratio {args.max_ratio}: expected a positive ratio")
    probes = [load_probe(path) for path in args.probe]
    spec, qualified, total = pick(runs_of(args.runs), args.policy, args.baseline, args.min_kept, args.max_ratio,
                                  probes)
    print(f"pick: {spec} (qualifies on {qualified} of {total} runs)", file=sys.stderr)
    if args.all and qualified < total:
        print(f"pick: none qualifies on all {total} runs (--all)", file=sys.stderr)
        print("none")
        return
    print(spec)


if __name__ == "__main__":
    main()
