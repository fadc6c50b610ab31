#!/usr/bin/env python3
"""What the PE heads' global coverage walk keeps whole and in chunks, under three chunk rules (issue 16).

docs/algorithm.md §11: a chunk's PE walk covers gamma_pe of its own rows' estimated mass, where a
whole prompt's walk reaches its target mostly on the short early rows; so a chunked prefill keeps
more PE blocks than the prompt. This script recomputes, in numpy from the same inputs the CPU
planner reads (block means of q and k, the block-causal softmax P of §4), for every head the plan
routes PE:

  whole    the prompt's walk: all entries of rows 0..N-1 by P descending, kept while the running
           sum before an entry is below gamma_pe * N;
  chunk    each chunk's walk over its own rows, target gamma_pe * rows (crisp's rule today);
  prefix   each chunk keeps its rows' entries of the walk a whole prompt ending at that chunk would
           make (target gamma_pe * rows so far, over every earlier row too): what a chunk could do
           if the earlier chunks' P rows were carried along (state across calls).

and two rules that no chunking changes (each row decided from rows up to it only), candidates for a
whole-prompt rule a chunked prefill reproduces exactly:

  rowprefix  row r keeps its entries of the walk over rows 0..r (target gamma_pe * (r + 1));
  perrow     row r's own walk to gamma_pe of its mass.

and prints each rule's density (kept entries of the PE map) and the share of P's mass it covers
(mean over rows); --json writes the same. --check-plan also checks the `whole` walk against the
planner's own: each PE head's blocks in plan.json must be the walk's entries plus what §4 adds to
them (the anchors and the min_budget verticals and slashes, a slash reaching distance c and, with
slash_cover exact, c + 1), else exit 1. Estimates
only (P is the block-mean proxy, not the attention); the accuracy a rule gives is measured on the
bench's recall and the real models, not here.

    crisp gen --seq 32768 --heads-q 8 --heads-kv 2 --seed 3 --out-dir w
    crisp plan --q w/q.npy --k w/k.npy --json w/plan.json
    scripts/chunk_pe_rules.py --dir w --chunk 16384

Exit status 0; 1 when --check-plan finds a difference; 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def walk(values: np.ndarray, target: float) -> np.ndarray:
    """Keep flags of the coverage walk: descending value, ties by smaller index, kept while the sum
    before an entry is below target (the entry that crosses it included)."""
    order = np.lexsort((np.arange(len(values)), -values))
    before = np.cumsum(values[order]) - values[order]
    keep = np.zeros(len(values), dtype=bool)
    keep[order[before < target]] = True
    return keep


def block_causal_softmax(q_means: np.ndarray, k_means: np.ndarray, scale: float) -> list[np.ndarray]:
    logits = scale * (q_means @ k_means.T)
    rows = []
    for r in range(len(q_means)):
        x = logits[r, : r + 1].astype(np.float64)
        e = np.exp(x - x.max())
        rows.append(e / e.sum())
    return rows


def plan_differences(head: dict, whole: np.ndarray, N: int, slash_cover: str) -> list[str]:
    """How the planner's blocks of PE head `head` (plan.json) differ from the `whole` walk's entries
    (flags over rows 0..N-1, row r's entries c = 0..r) plus §4's additions; empty when they agree."""
    rows, cols = np.tril_indices(N)  # row-major, the order of the flags
    walk_set = set(zip(rows[whole].tolist(), cols[whole].tolist()))
    row_ptr, col = head["row_ptr"], head["col"]
    planner = {(r, c) for r in range(N) for c in col[row_ptr[r]:row_ptr[r + 1]]}
    verticals = set(head["vertical"]) | {0}
    slashes = set(head["slash"]) | {0}
    reach = (0, 1) if slash_cover == "exact" else (0,)

    def added(r: int, c: int) -> bool:
        return c in verticals or any(r - c - x in slashes for x in reach)

    missing = sorted(walk_set - planner)
    unexplained = sorted(e for e in planner - walk_set if not added(*e))
    out = []
    if missing:
        out.append(f"{len(missing)} walk entries the planner lacks, first {missing[:5]}")
    if unexplained:
        out.append(f"{len(unexplained)} planner blocks neither walked nor added by section 4, first {unexplained[:5]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="folder with q.npy, k.npy (crisp gen) and plan.json (crisp plan)")
    ap.add_argument("--chunk", type=int, required=True, help="queries per chunk (a multiple of the block size)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--check-plan", action="store_true",
                    help="check the whole-prompt walk against plan.json's PE heads (exit 1 on a difference)")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    plan = json.loads((folder / "plan.json").read_text())
    q = np.load(folder / "q.npy", mmap_mode="r")
    k = np.load(folder / "k.npy", mmap_mode="r")
    B = int(plan["block_size"])
    gamma = float(plan["config"]["pe_gamma"])
    if plan["config"].get("pe_rule", "coverage") != "coverage":
        ap.error("the plan's pe_rule is not coverage: nothing to compare")
    heads_q, n, d = q.shape
    if n % B or args.chunk % B or args.chunk <= 0:
        ap.error(f"--chunk {args.chunk} and n {n}: expected multiples of the block size {B}")
    N = n // B
    rows_per_chunk = args.chunk // B
    group = heads_q // k.shape[0]
    print(f"n {n}, B {B}, N {N}, chunks of {rows_per_chunk} rows, gamma_pe {gamma}")
    print("head  rule       density  mass covered (mean over rows)")
    figures = {"n": n, "block_size": B, "chunk_rows": rows_per_chunk, "pe_gamma": gamma, "heads": []}
    checked = mismatched = 0
    for h, head in enumerate(plan["heads"]):
        if head["route"] != "pe":
            continue
        q_means = np.asarray(q[h], dtype=np.float32).reshape(N, B, d).mean(axis=1)
        k_means = np.asarray(k[h // group], dtype=np.float32).reshape(N, B, d).mean(axis=1)
        rows = block_causal_softmax(q_means, k_means, float(plan["softmax_scale"]))
        flat = np.concatenate(rows)
        start = np.concatenate([[0], np.cumsum([r + 1 for r in range(N)])])
        kept = {name: np.zeros(len(flat), bool) for name in ("chunk", "prefix", "rowprefix", "perrow")}
        kept = {"whole": walk(flat, gamma * N), **kept}
        for first in range(0, N, rows_per_chunk):
            last = min(N, first + rows_per_chunk)
            seg = slice(start[first], start[last])
            kept["chunk"][seg] = walk(flat[seg], gamma * (last - first))
            kept["prefix"][seg] = walk(flat[: start[last]], gamma * last)[seg]
        for r in range(N):
            row = slice(start[r], start[r + 1])
            kept["rowprefix"][row] = walk(flat[: start[r + 1]], gamma * (r + 1))[row]
            kept["perrow"][row] = walk(flat[row], gamma)
        entry = {"head": h}
        if args.check_plan:
            problems = plan_differences(head, kept["whole"], N, plan["config"].get("slash_cover", "exact"))
            for problem in problems:
                print(f"head {h}: the planner's PE blocks differ from the whole walk: {problem}", file=sys.stderr)
            mismatched += bool(problems)
            checked += 1
        for name, keep in kept.items():
            entry[name] = {"density": float(keep.mean()), "mass_covered": float(flat[keep].sum() / N)}
            print(f"{h:4d}  {name:9s}  {keep.mean():7.4f}  {flat[keep].sum() / N:7.4f}")
        figures["heads"].append(entry)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.check_plan:
        print(f"check against the planner: {checked - mismatched} of {checked} PE heads agree")
        return 1 if mismatched else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
