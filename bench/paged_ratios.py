#!/usr/bin/env python3
"""Paged against contiguous K/V across rounds of `crisp bench --chunks ... --page-sizes ...`.

Input: the JSON files of several rounds of the same bench (each with `--json`), or files that
gather rounds as {"device": ..., "rounds": [{"call": ..., "round": ..., "bench": <one --json>}, ...]}
(bench/h200_2026-12-05_paged_rounds_s33.json); a `--build NAME` keeps only the rounds of that build
where the rounds name one (A/B files such as bench/h100_2026-12-05_ab_page_shift_s31.json). For every preset,
chunk size and K/V layout, prints each round's ratio to the head-major contiguous run of the same
round (the bench's `vs_contiguous`, timed in the same interleaved rounds), then min / median / max
and how many rounds are within the goal (issue 16: paged within 5% of contiguous). A second table
gives the contiguous total times, the chunked runs against one shot (`vs_one_shot`), and the
density and recall of every layout (they must agree: the layouts hold the same keys).

Usage: bench/paged_ratios.py [--goal 1.05] ROUND1.json [ROUND2.json ...]
"""
import argparse
import json
import statistics


def layout_of(run):
    if run.get("page_size", 0) > 0:
        return f"pages of {run['page_size']}" + ("" if run.get("page_order", "shuffled") == "shuffled" else
                                                   f" ({run['page_order']})")
    return "token-major" if run.get("kv_layout") == "token_major" else "head-major"


def chunk_label(chunks, chunk):
    return "one shot" if chunks == 1 else f"{chunk // 1024}k"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goal", type=float, default=1.05, help="the ratio a run must not exceed [1.05]")
    parser.add_argument("--build", help="only the rounds of this build (files of rounds that name theirs)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    rounds = []
    for path in args.files:
        data = json.load(open(path))
        if "rounds" not in data:
            rounds.append(data)
            continue
        for entry in data["rounds"]:
            if args.build is None or entry.get("build", args.build) == args.build:
                rounds.append(dict(entry["bench"], device=entry["bench"].get("device", data.get("device", "?"))))
    devices = sorted({r.get("device", "?") for r in rounds})
    print(f"{len(rounds)} rounds on {', '.join(devices)}")
    # (preset, chunks, chunk, layout) -> one run per round
    table = {}
    for index, data in enumerate(rounds):
        for run in data["runs"]:
            key = (run["preset"], run["chunks"], run["chunk"], layout_of(run))
            table.setdefault(key, [None] * len(rounds))[index] = run
    layouts = sorted({k[3] for k in table if k[3] != "head-major"},
                     key=lambda s: (not s.startswith("token"), int(s.split()[2]) if s.startswith("pages") else 0, s))
    rows = sorted({k[:3] for k in table}, key=lambda k: (k[0] != "dense", k[0], -k[2]))

    print("\nPaged (and token-major) K/V against head-major contiguous, per round; then min / median / max,"
          f" rounds within {args.goal:.2f}x")
    print("| preset | chunks | " + " | ".join(layouts) + " |")
    print("|---|---|" + "---|" * len(layouts))
    ratios_of_layout = {}  # every run's ratio, per layout
    for preset, chunks, chunk in rows:
        cells = []
        for layout in layouts:
            runs = [r for r in table.get((preset, chunks, chunk, layout), []) if r is not None]
            ratios = [r["vs_contiguous"] for r in runs if "vs_contiguous" in r]
            if not ratios:
                cells.append("—")
                continue
            ok = sum(x <= args.goal for x in ratios)
            ratios_of_layout.setdefault(layout, []).extend(ratios)
            each = " / ".join(f"{x:.3f}" for x in ratios)
            cells.append(f"{each} → {min(ratios):.3f} / **{statistics.median(ratios):.3f}** / {max(ratios):.3f}"
                         f" ({ok}/{len(ratios)})")
        print(f"| {preset} | {chunk_label(chunks, chunk)} | " + " | ".join(cells) + " |")
    counts = [f"{layout} {sum(x <= args.goal for x in v)}/{len(v)} within {args.goal:.2f}x"
              for layout, v in ratios_of_layout.items()]
    print("\nAll rows: " + "; ".join(counts))
    print("Median of every run: " + "; ".join(f"{layout} {statistics.median(v):.3f}x"
                                             for layout, v in sorted(ratios_of_layout.items())))

    print("\nHead-major contiguous: total ms per round, against one shot (median), density and recall per layout")
    print("| preset | chunks | total ms | vs one shot | density (every layout) | recall mean (every layout) |")
    print("|---|---|---|---|---|---|")
    for preset, chunks, chunk in rows:
        base = [r for r in table.get((preset, chunks, chunk, "head-major"), []) if r is not None]
        if not base:
            continue
        every = [r for layout in ["head-major"] + layouts for r in table.get((preset, chunks, chunk, layout), []) if r]
        densities = sorted({round(r["density"], 4) for r in every})
        recalls = sorted({round(r["recall_mean"], 4) for r in every})
        ms = " / ".join(f"{r['total_ms']:.1f}" for r in base)
        one_shot = statistics.median(r["vs_one_shot"] for r in base)
        print(f"| {preset} | {chunk_label(chunks, chunk)} | {ms} | {one_shot:.3f}x | {', '.join(map(str, densities))} |"
              f" {', '.join(map(str, recalls))} |")


if __name__ == "__main__":
    main()
