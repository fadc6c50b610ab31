#!/usr/bin/env python3
"""Where a chunked prefill's plans spend more blocks than the whole prompt's plan (issue 16).

Plans one prompt (.npy q [Hq, n, d], k [Hkv, n, d], e.g. from `crisp gen`) once whole and once in
chunks of --chunk queries over the growing keys (`crisp plan`, CPU), and compares, chunk by chunk,
the blocks each chunk's plan computes with the blocks the whole prompt's plan computes on the same
rows; then, for the last chunk, head by head with each head's route. The last chunk (at least B
queries) reads the same proxy rows and keys as the whole prompt, so its VS heads keep exactly the
prompt's rows (docs/algorithm.md §11); its PE heads may not: their global coverage walk covers the
chunk's rows alone.

    crisp gen --seq 32768 --heads-q 8 --heads-kv 2 --seed 3 --out-dir w
    scripts/chunk_plan_density.py --crisp build-cpu/crisp --q w/q.npy --k w/k.npy --chunk 16384

Prints a table and writes --json. Exit status: 0; 1 when a VS or dense head of the last chunk does
not keep the prompt's rows (a broken §11 promise); 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def plan(crisp: str, q: Path, k: Path, out: Path, settings: list[str]) -> dict:
    cmd = [crisp, "plan", "--q", str(q), "--k", str(k), "--json", str(out)]
    for s in settings:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"chunk_plan_density: {' '.join(cmd)} failed: {done.stderr.strip()}")
    return json.loads(out.read_text())


def blocks_per_row(p: dict) -> np.ndarray:
    """heads x rows: the blocks each row of each head computes (rows from 0; a chunk's rows before
    its first_row are empty)."""
    return np.array([np.diff(np.asarray(h["row_ptr"])) for h in p["heads"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crisp", required=True, help="the crisp command (a CPU build is enough)")
    ap.add_argument("--q", required=True, help="queries .npy [Hq, n, d]")
    ap.add_argument("--k", required=True, help="keys .npy [Hkv, n, d]")
    ap.add_argument("--chunk", type=int, required=True, help="queries per chunk (a multiple of the block size)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="crisp plan --set (repeatable)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    q = np.load(args.q, mmap_mode="r")
    k = np.load(args.k, mmap_mode="r")
    if q.ndim != 3 or k.ndim != 3 or q.shape[1] != k.shape[1]:
        ap.error(f"--q {q.shape} and --k {k.shape}: expected [Hq, n, d] and [Hkv, n, d] of one prompt")
    n = q.shape[1]
    if args.chunk <= 0 or n % args.chunk != 0:
        ap.error(f"--chunk {args.chunk}: expected a positive divisor of the prompt's {n} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        whole = plan(args.crisp, Path(args.q), Path(args.k), tmp / "whole.json", args.set)
        if args.chunk % whole["block_size"] != 0:
            ap.error(f"--chunk {args.chunk}: expected a multiple of the block size {whole['block_size']}")
        whole_rows = blocks_per_row(whole)
        chunks, total_chunked, total_whole, total_causal = [], 0, 0, 0
        for i in range(n // args.chunk):
            np.save(tmp / "q.npy", np.ascontiguousarray(q[:, i * args.chunk:(i + 1) * args.chunk]))
            np.save(tmp / "k.npy", np.ascontiguousarray(k[:, :(i + 1) * args.chunk]))
            p = plan(args.crisp, tmp / "q.npy", tmp / "k.npy", tmp / "chunk.json", args.set)
            first = p["first_row"]
            rows = blocks_per_row(p)[:, first:]
            causal = sum(first + j + 1 for j in range(rows.shape[1])) * rows.shape[0]
            mine, theirs = int(rows.sum()), int(whole_rows[:, first:first + rows.shape[1]].sum())
            total_chunked, total_whole, total_causal = total_chunked + mine, total_whole + theirs, total_causal + causal
            heads = [{"head": h, "route": p["heads"][h]["route"], "prompt_route": whole["heads"][h]["route"],
                      "blocks": int(rows[h].sum()), "prompt_blocks": int(whole_rows[h, first:].sum())}
                     for h in range(rows.shape[0])]
            chunks.append({"chunk": i, "first_row": first, "rows": int(rows.shape[1]), "density": mine / causal,
                           "prompt_density_same_rows": theirs / causal, "heads": heads})
    last = chunks[-1]["heads"]
    broken = [h for h in last if h["route"] != "pe" and h["blocks"] != h["prompt_blocks"]]
    doc = {"prompt_tokens": n, "chunk": args.chunk, "settings": args.set, "chunks": chunks,
           "density_chunked": total_chunked / total_causal, "density_prompt": total_whole / total_causal}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    print("| chunk | rows | chunk density | prompt's density, same rows |")
    print("|---:|---|---:|---:|")
    for c in chunks:
        print(f"| {c['chunk']} | {c['first_row']}-{c['first_row'] + c['rows'] - 1} | {c['density']:.3f} |"
              f" {c['prompt_density_same_rows']:.3f} |")
    print(f"all rows: chunked {doc['density_chunked']:.4f}, whole prompt {doc['density_prompt']:.4f}")
    print("last chunk by head (route: blocks / the prompt's blocks on those rows): " +
          ", ".join(f"{h['head']} {h['route']} {h['blocks']}/{h['prompt_blocks']}" for h in last))
    if broken:
        print(f"chunk_plan_density: VS or dense heads of the last chunk differ from the prompt's: "
              f"{[h['head'] for h in broken]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
