#!/usr/bin/env python3
"""Short-prompt pass-key probe through llama-cli: does a sparse-prefill policy keep the answer that
dense attention gives on prompts of 1k-4k tokens? Reported per point: the prompts it answers with
the key, how many of dense's right answers it keeps, and how often its answer equals dense's (a
135M model often answers a truncated key, e.g. 736 for 7364, with dense attention too).

The prompt is the classic pass-key haystack ("The grass is green. ..." lines) with one needle line,
"The pass key is K. Remember it. K is the pass key.", and ends with "The pass key is": the model
completes it by copying the key (raw completion, -no-cnv; small instruct models answer this where
they fail the chat-style NIAH question at these lengths). Only the last few queries need the needle,
so a rule that pools the proxy rows can dilute it below its floor at small block counts
(docs/evaluation.md, "Short prompts").

Splits are fixed here, before any tuning: `tuning` and `test` differ in lengths, needle positions
and keys. A point is a policy with optional crisp Config settings, e.g.
"crisp:uniform_floor_blocks=32". For each prompt: dense's answer, each point's answer, and whether
the point kept dense's correct answer.

Usage: scripts/passkey_copy_probe.py --bin DIR --model GGUF --split tuning|test
         --points dense,crisp,flexprefill,"crisp:key=value;key=value" [--threads N] [--ngl N] --json OUT
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "The pass key is"
# NOTE: fixed before any run (2026-12-02). Lengths in filler lines (~22 tokens each with SmolLM2's
# tokenizer: 40 lines ~ 0.9k tokens, 160 ~ 3.6k), needle position as a share of the lines.
SPLITS = {
    "tuning": {"lines": [40, 60, 80, 120, 160], "positions": [0.25, 0.5, 0.75], "keys": [7364]},
    "test": {"lines": [50, 100, 140], "positions": [0.15, 0.4, 0.65, 0.9], "keys": [4821, 9053]},
}


def prompt_of(lines: int, position: float, key: int) -> str:
    text = "There is a pass key hidden in this text. Remember it.\n"
    needle_line = max(1, int(lines * position))
    for i in range(1, lines + 1):
        text += FILLER + "\n"
        if i == needle_line:
            text += f"The pass key is {key}. Remember it. {key} is the pass key.\n"
    return text + QUESTION


def answer_of(output: str) -> str:
    tail = output.rsplit("back again.\n" + QUESTION, 1)[-1]
    match = re.search(r"[0-9]+", tail)
    return match.group(0) if match else ""


def run_point(args, point: str, prompt: str) -> str:
    policy, _, settings = point.partition(":")
    cmd = [str(Path(args.bin) / "llama-cli"), "-m", args.model, "-no-cnv", "-p", prompt, "-n", "6", "--temp", "0",
           "--seed", "1", "-c", "8192", "-b", "8192", "-ub", "8192", "--no-warmup", "-fa", "-ngl", str(args.ngl)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    if policy != "llama_fa":
        cmd += ["--sparse-prefill", policy]
        for kv in filter(None, settings.split(";")):
            cmd += ["--sparse-prefill-set", kv]
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"passkey_copy_probe: {' '.join(cmd[:3])} ... {point} exited {done.returncode}: {done.stderr[-400:]}")
    return answer_of(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="llama.cpp's binaries (scripts/llama_cpp.sh)")
    p.add_argument("--model", required=True, help="the GGUF")
    p.add_argument("--split", required=True, choices=sorted(SPLITS))
    p.add_argument("--points", required=True, help="comma-separated: dense, crisp, flexprefill, minference, llama_fa, POLICY:k=v;k=v")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--ngl", type=int, default=0)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    if not (Path(args.bin) / "llama-cli").is_file():
        sys.exit(f"passkey_copy_probe: --bin {args.bin}: no llama-cli there (scripts/llama_cpp.sh builds it)")
    points = [x for x in args.points.split(",") if x]
    if "dense" not in points:
        points = ["dense"] + points
    split = SPLITS[args.split]
    rows = []
    for lines in split["lines"]:
        for position in split["positions"]:
            for key in split["keys"]:
                prompt = prompt_of(lines, position, key)
                answers = {point: run_point(args, point, prompt) for point in points}
                rows.append({"lines": lines, "position": position, "key": key, "answers": answers})
                print(f"lines {lines:4d} position {position:.2f} key {key}: " +
                      " ".join(f"{pt}={a or '-'}" for pt, a in answers.items()), file=sys.stderr, flush=True)
    summary = {}
    for point in points:
        correct = sum(r["answers"][point] == str(r["key"]) for r in rows)
        kept = sum(r["answers"][point] == str(r["key"]) for r in rows if r["answers"]["dense"] == str(r["key"]))
        agrees = sum(r["answers"][point] == r["answers"]["dense"] for r in rows)
        summary[point] = {"correct": correct, "kept_of_dense": kept, "agrees_with_dense": agrees}
    dense_correct = summary["dense"]["correct"]
    Path(args.json).write_text(json.dumps({"split": args.split, "model": args.model, "points": points,
                                           "rows": rows, "summary": summary}, indent=1))
    print(f"{'point':50s} correct  kept of dense's {dense_correct}  same answer as dense (of {len(rows)})")
    for point in points:
        s = summary[point]
        print(f"{point:50s} {s['correct']:7d}  {s['kept_of_dense']:7d}  {s['agrees_with_dense']:7d}")


if __name__ == "__main__":
    main()
