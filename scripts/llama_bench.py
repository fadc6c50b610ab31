#!/usr/bin/env python3
"""llama.cpp's prompt processing with its own flash attention against each crisp policy.

    python3 scripts/llama_bench.py --bin "$(scripts/llama_cpp.sh)" --model smollm2=model.gguf \\
        --lengths 8192,16384,32768 --json out/llama_bench.json --md out/llama_bench.md

For each model, prompt length and policy (`fa`: llama.cpp's flash attention, no sparse prefill;
`dense`, `crisp`, `flexprefill`, `minference`: `--sparse-prefill POLICY`), one llama-bench
process measures prompt processing of random tokens (`-p N -n 0 -fa 1`, `-b N`, `-ub
min(N, --max-ubatch)`, halved while llama.cpp's F32 KQ mask of the last ubatch would pass INT_MAX
bytes, which aborts its CUDA build: 8192 at N = 32768), `-ngl` as given, `-r` reps after llama-bench's warm-up pass of the same
prompt; above --full-warmup-max tokens a 512-token test in the same process warms it instead and
its row is dropped). Then, unless --no-attn-time, llama-attn-time (built with llama.cpp by
scripts/llama_cpp.sh) runs the same configuration --attn-reps more times with every graph node
timed on its own (device synchronised after each): the flash-attention nodes' time, the other
nodes' and the host time outside the nodes; with crisp's statistics in the build, the density of
the plans (kept / causal blocks) and how many attention ops crisp computed or declined. The row
takes these from the last pass (the shape seen before, as in llama-bench after its warm-up) and
keeps the first pass's attention time beside them (`attention_ms_first_pass`): a shape's first
pass pays its one-time costs, crisp's DevicePlan and planner workspace among them.

--rounds R (default 1) runs the policies of a model and length R times in turn (fa, crisp, fa,
crisp, ...): one machine's runs drift and spread (bench/RESULTS.md, session 15: up to 30% between
single runs at 128k), so a comparison is made between neighbours. Each round is a row of its own
(llama-attn-time only in the first); the JSON's "summary" and a second markdown table give per
policy the median, lowest and highest tokens/s over the rounds and the median, lowest and highest
of its speedup over fa in the same round.

Writes one JSON (every row, rewritten after each run, so a run cut short keeps what it measured)
and a markdown table per model. The attention share is the attention nodes' time over the timed
pass's wall time; the timed pass runs slower than llama-bench by the per-node synchronisation (its
"timing overhead" column: the timed pass's wall time over llama-bench's mean, minus 1).
Exit status: 0 when every run succeeded, 1 when one failed or the deadline cut the grid, 2 on a
bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

POLICIES = ("fa", "dense", "crisp", "flexprefill", "minference")
# NOTE: the prompt of the short warm-up test that replaces llama-bench's full-prompt warm-up above
# --full-warmup-max: long enough to load every kernel of prompt processing, short to be free.
SHORT_WARMUP_TOKENS = 512
# The pinned llama.cpp casts its F32 KQ mask (KV cells x the ubatch's rows) to F16 with a CUDA copy
# that aborts on a tensor of more than INT_MAX bytes (GGML_ASSERT in ggml-cuda/cpy.cu), and its
# flash-attention kernels form mask offsets in int: a ubatch is cut down to keep the mask under it.
INT_MAX = 2**31 - 1
# NOTE: llama.cpp's paddings in that version: KV cells to 256 with flash attention
# (llama_kv_cache_unified::get_padding), the mask's rows to GGML_KQ_MASK_PAD = 64 (ggml.h).
KV_CELL_PAD = 256
KQ_MASK_ROW_PAD = 64


def die(message: str) -> None:
    print(f"llama_bench: error: {message}", file=sys.stderr)
    sys.exit(2)


def positive_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        die(f"{flag} '{text}': expected positive integers separated by commas")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="folder with llama-bench (and llama-attn-time)")
    p.add_argument("--model", action="append", required=True,
                   help="NAME=PATH or PATH of a GGUF (repeatable); NAME labels its rows [the file's stem]")
    p.add_argument("--lengths", default="8192,16384,32768", help="prompt lengths [8192,16384,32768]")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {','.join(POLICIES)} [all]")
    p.add_argument("--sparse-prefill-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a crisp Config field for every crisp policy run (repeatable)")
    p.add_argument("--reps", type=int, default=3, help="llama-bench repetitions [3]")
    p.add_argument("--rounds", type=int, default=1,
                   help="the policies run this many times in turn per model and length [1]")
    p.add_argument("--max-ubatch", type=int, default=32768,
                   help="-ub is the prompt length up to this [32768]; -b is the prompt length")
    p.add_argument("--full-warmup-max", type=int, default=65536,
                   help=f"longest prompt warmed by a full pass; longer ones by a {SHORT_WARMUP_TOKENS}-token test [65536]")
    p.add_argument("--ngl", type=int, default=99, help="-ngl, layers on the GPU [99]")
    p.add_argument("--threads", type=int, help="-t, CPU threads [llama.cpp's default]")
    p.add_argument("--no-attn-time", action="store_true", help="skip llama-attn-time (no attention share)")
    p.add_argument("--attn-reps", type=int, default=2,
                   help="llama-attn-time passes; the row's figures are the last one's [2]")
    p.add_argument("--deadline-s", type=float, default=0, help="stop the grid after this many seconds [0: none]")
    p.add_argument("--json", required=True, help="the JSON written")
    p.add_argument("--md", help="the markdown tables written [none: printed only]")
    args = p.parse_args(argv)
    args.lengths = positive_list("--lengths", args.lengths)
    args.policies = args.policies.split(",")
    for policy in args.policies:
        if policy not in POLICIES:
            die(f"--policies: '{policy}' is not one of {', '.join(POLICIES)}")
    for flag in ("reps", "rounds", "attn_reps", "max_ubatch", "full_warmup_max", "ngl"):
        if getattr(args, flag) <= 0:
            die(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected a positive integer")
    if args.threads is not None and args.threads <= 0:
        die(f"--threads {args.threads}: expected a positive integer")
    for setting in args.sparse_prefill_set:
        if "=" not in setting:
            die(f"--sparse-prefill-set '{setting}': expected KEY=VALUE")
    bench = Path(args.bin) / "llama-bench"
    if not os.access(bench, os.X_OK):
        die(f"--bin {args.bin}: no llama-bench there (scripts/llama_cpp.sh builds it)")
    args.attn_tool = Path(args.bin) / "llama-attn-time"
    if not args.no_attn_time and not os.access(args.attn_tool, os.X_OK):
        die(f"--bin {args.bin}: no llama-attn-time there (scripts/llama_cpp.sh builds it; --no-attn-time skips it)")
    models = []
    for spec in args.model:
        name, _, path = spec.partition("=") if "=" in spec else ("", "", spec)
        if not Path(path).is_file():
            die(f"--model {spec}: no file {path}")
        models.append((name or Path(path).stem, path))
    args.models = models
    return args


def padded(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def ubatch_for(n: int, max_ubatch: int) -> int:
    """-ub for an n-token prompt: n up to max_ubatch, halved while the last ubatch's F32 KQ mask
    (n cells, padded, by the ubatch's rows, padded) would pass INT_MAX bytes."""
    ubatch = min(n, max_ubatch)
    while ubatch > 1 and 4 * padded(n, KV_CELL_PAD) * padded(ubatch, KQ_MASK_ROW_PAD) > INT_MAX:
        ubatch //= 2
    return ubatch


def failure_lines(stderr: str) -> str:
    """What a failed run said: its lines naming an error or a failed assertion, else its last three."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    named = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return " | ".join(named[-3:] or lines[-3:])


def policy_flags(policy: str, settings: list[str]) -> list[str]:
    if policy == "fa":
        return []
    flags = ["--sparse-prefill", policy]
    for s in settings:
        flags += ["--sparse-prefill-set", s]
    return flags


def run(cmd: list[str], timeout: float | None) -> tuple[int | None, str, str]:
    """(exit status or None on timeout, stdout, stderr), the output so far when cut; timeout None: none."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as cut:
        out = cut.stdout.decode(errors="replace") if isinstance(cut.stdout, bytes) else (cut.stdout or "")
        err = cut.stderr.decode(errors="replace") if isinstance(cut.stderr, bytes) else (cut.stderr or "")
        return None, out, err


def crisp_log(stderr: str) -> dict:
    """What the hook logged: whether it computed prompt ops, and each distinct fallback reason."""
    lines = [line.strip() for line in stderr.splitlines() if line.startswith("crisp:")]
    return {"crisp_computed": any("computes" in line for line in lines),
            "crisp_fallbacks": sorted({line for line in lines if "falls back" in line})}


def bench_row(args, model, path, policy, n, timeout):
    ubatch = ubatch_for(n, args.max_ubatch)
    short_warmup = n > args.full_warmup_max
    prompts = f"{SHORT_WARMUP_TOKENS},{n}" if short_warmup else str(n)
    cmd = [str(Path(args.bin) / "llama-bench"), "-m", path, "-p", prompts, "-n", "0", "-fa", "1",
           "-ngl", str(args.ngl), "-b", str(n), "-ub", str(ubatch), "-r", str(args.reps), "-o", "jsonl"]
    if short_warmup:
        cmd.append("--no-warmup")
    if args.threads:
        cmd += ["-t", str(args.threads)]
    cmd += policy_flags(policy, args.sparse_prefill_set)
    row = {"model": model, "model_path": path, "policy": policy, "n_prompt": n, "n_batch": n, "n_ubatch": ubatch,
           "n_gpu_layers": args.ngl, "reps": args.reps, "warmup": "short" if short_warmup else "full",
           "bench_command": " ".join(cmd)}
    rc, out, err = run(cmd, timeout)
    tests = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                tests.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    test = next((t for t in tests if t.get("n_prompt") == n), None)
    if rc != 0 or test is None:
        row["error"] = ("timed out (deadline)" if rc is None else f"llama-bench exited {rc}") + \
            f": {failure_lines(err)}"
        return row
    samples_ms = [ns / 1e6 for ns in test["samples_ns"]]
    row.update({
        "backends": test.get("backends"), "gpu_info": test.get("gpu_info"), "cpu_info": test.get("cpu_info"),
        "model_type": test.get("model_type"), "model_n_params": test.get("model_n_params"),
        "n_threads": test.get("n_threads"), "build_commit": test.get("build_commit"),
        "samples_ms": samples_ms, "mean_ms": test["avg_ns"] / 1e6, "stddev_ms": test["stddev_ns"] / 1e6,
        "min_ms": min(samples_ms), "tokens_per_s": test["avg_ts"], "tokens_per_s_stddev": test["stddev_ts"],
    })
    return row


def attn_time(args, path, policy, n, timeout):
    ubatch = ubatch_for(n, args.max_ubatch)
    cmd = [str(args.attn_tool), "-m", path, "--tokens", str(n), "--reps", str(args.attn_reps), "-fa", "-ngl", str(args.ngl),
           "-b", str(n), "-ub", str(ubatch), "--warmup-tokens", str(min(n, SHORT_WARMUP_TOKENS))]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    cmd += policy_flags(policy, args.sparse_prefill_set)
    rc, out, err = run(cmd, timeout)
    try:
        result = json.loads(out)
        first, timed = result["runs"][0], result["runs"][-1]
    except (json.JSONDecodeError, KeyError, IndexError):
        return {"attn_error": ("timed out (deadline)" if rc is None else f"llama-attn-time exited {rc}") +
                f": {failure_lines(err)}"}
    # llama-bench keeps llama.cpp's log quiet; llama-attn-time prints it, the hook's lines included.
    fields = {"attn_command": " ".join(cmd), "stats_available": result.get("stats_available"), **crisp_log(err),
              "attn_passes": len(result["runs"]), "attention_ms_first_pass": first.get("attention_ms")}
    for key in ("wall_ms", "attention_ms", "other_nodes_ms", "outside_nodes_ms", "attention_share", "attention_nodes",
                "logits_finite", "max_abs_logit", "logit_correlation_to_previous", "density", "sparse_ops_handled", "sparse_ops_declined", "ms_by_op"):
        fields[("attn_" if key in ("wall_ms", "attention_nodes") else "") + key] = timed.get(key)
    if rc != 0:
        fields["attn_error"] = f"llama-attn-time exited {rc}" + ("" if timed.get("logits_finite") else " (logits not finite)")
    return fields


def add_relative(rows):
    """Speedups against the fa row of the same model, length and round, and the timing overhead."""
    fa = {(r["model"], r["n_prompt"], r.get("round", 1)): r for r in rows if r["policy"] == "fa" and "mean_ms" in r}
    for r in rows:
        base = fa.get((r["model"], r["n_prompt"], r.get("round", 1)))
        if "mean_ms" in r and base is not None:
            r["speedup_vs_fa"] = base["mean_ms"] / r["mean_ms"]
        if r.get("attention_ms") and base is not None and base.get("attention_ms"):
            r["attention_speedup_vs_fa"] = base["attention_ms"] / r["attention_ms"]
        if r.get("attn_wall_ms") and r.get("mean_ms"):
            r["timing_overhead"] = r["attn_wall_ms"] / r["mean_ms"] - 1.0
            r["attention_share_of_bench"] = r["attention_ms"] / r["mean_ms"]


def summarize(rows):
    """Per model, length and policy over its rounds: tokens/s and the speedup over fa of the same
    round (median, lowest, highest), from the rows that measured."""
    out = []
    for key in dict.fromkeys((r["model"], r["n_prompt"], r["policy"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["n_prompt"], r["policy"]) == key and "tokens_per_s" in r]
        if not mine:
            continue
        rate = [r["tokens_per_s"] for r in mine]
        speedup = [r["speedup_vs_fa"] for r in mine if "speedup_vs_fa" in r]
        entry = {"model": key[0], "n_prompt": key[1], "policy": key[2], "rounds": len(mine),
                 "tokens_per_s_median": statistics.median(rate), "tokens_per_s_min": min(rate), "tokens_per_s_max": max(rate)}
        if speedup:
            entry.update({"speedup_vs_fa_median": statistics.median(speedup), "speedup_vs_fa_min": min(speedup),
                          "speedup_vs_fa_max": max(speedup)})
        out.append(entry)
    return out


def fmt(value, pattern, missing="-"):
    return missing if value is None else pattern % value


def percent(fraction):
    return None if fraction is None else 100.0 * fraction


def markdown(doc) -> str:
    out = []
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["model"] == model]
        first = next((r for r in rows if "model_type" in r), rows[0])
        out.append(f"### {model} ({first.get('model_type', '?')}, {first.get('backends', '?')} "
                   f"{first.get('gpu_info') or first.get('cpu_info') or ''})\n")
        out.append("| n | policy | -ub | round | tok/s | ms (mean ± sd) | speedup vs fa | attention ms | attention share "
                   "| attention speedup vs fa | density | 1/density | timing overhead | notes |")
        out.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            density = r.get("density")
            notes = "; ".join(filter(None, [r.get("error"), r.get("attn_error"),
                                            "crisp took no op" if r["policy"] != "fa" and "crisp_computed" in r
                                            and not r["crisp_computed"] else None,
                                            *(f.split(": ", 2)[-1] for f in r.get("crisp_fallbacks", []))]))
            out.append("| %d | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["n_prompt"], r["policy"], r["n_ubatch"], r.get("round", 1), fmt(r.get("tokens_per_s"), "%.0f"),
                "-" if "mean_ms" not in r else "%.1f ± %.1f" % (r["mean_ms"], r["stddev_ms"]),
                fmt(r.get("speedup_vs_fa"), "%.2fx"), fmt(r.get("attention_ms"), "%.1f"),
                fmt(percent(r.get("attention_share")), "%.0f%%"),
                fmt(r.get("attention_speedup_vs_fa"), "%.2fx"), fmt(density, "%.3f"),
                fmt(None if not density else 1.0 / density, "%.2f"), fmt(percent(r.get("timing_overhead")), "%+.0f%%"),
                notes.replace("|", "/")))
        out.append("")
        summary = [e for e in doc.get("summary", []) if e["model"] == model]
        if doc.get("rounds", 1) > 1 and summary:
            out.append(f"Over {doc['rounds']} rounds (the policies in turn): tokens/s and speedup over fa of the same round, "
                       "median [lowest, highest]\n")
            out.append("| n | policy | rounds | tok/s | speedup vs fa |")
            out.append("|---:|---|---:|---|---|")
            for e in summary:
                out.append("| %d | %s | %d | %.0f [%.0f, %.0f] | %s |" % (
                    e["n_prompt"], e["policy"], e["rounds"], e["tokens_per_s_median"], e["tokens_per_s_min"],
                    e["tokens_per_s_max"], "-" if "speedup_vs_fa_median" not in e else "%.2fx [%.2f, %.2f]" % (
                        e["speedup_vs_fa_median"], e["speedup_vs_fa_min"], e["speedup_vs_fa_max"])))
            out.append("")
    out.append(f"llama-bench `-p N -n 0 -fa 1 -b N -ub min(N, {doc['max_ubatch']}) -ngl {doc['n_gpu_layers']} "
               f"-r {doc['reps']}` (-ub halved while llama.cpp's F32 KQ mask would pass INT_MAX bytes); attention share: attention nodes / wall time of one llama-attn-time pass "
               "(nodes timed one by one); timing overhead: that pass's wall time / llama-bench's mean - 1.")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.time()
    doc = {"tool": "scripts/llama_bench.py", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
           "lengths": args.lengths, "policies": args.policies, "reps": args.reps, "rounds": args.rounds,
           "max_ubatch": args.max_ubatch,
           "n_gpu_layers": args.ngl, "sparse_prefill_set": args.sparse_prefill_set, "complete": False, "rows": []}

    def save():
        add_relative(doc["rows"])
        doc["summary"] = summarize(doc["rows"])
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        if args.md:
            Path(args.md).write_text(markdown(doc))

    def left() -> float:
        return args.deadline_s - (time.time() - start) if args.deadline_s else None

    failed = False
    for model, path in args.models:
        for n in args.lengths:
            for round_ in range(1, args.rounds + 1):
                for policy in args.policies:
                    if left() is not None and left() < 1:
                        print("llama_bench: deadline reached; the rows so far are kept", file=sys.stderr)
                        save()
                        return 1
                    t0 = time.time()
                    row = bench_row(args, model, path, policy, n, left())
                    row["round"] = round_
                    if ("error" not in row and not args.no_attn_time and round_ == 1 and
                            (left() is None or left() >= 1)):
                        row.update(attn_time(args, path, policy, n, left()))
                    failed = failed or "error" in row or "attn_error" in row
                    doc["rows"].append(row)
                    save()
                    print(f"llama_bench: {model} n={n} {policy} (round {round_}): " +
                          (row.get("error") or "%.1f ms, %.0f tok/s, attention %s ms (share %s), density %s" % (
                              row["mean_ms"], row["tokens_per_s"], fmt(row.get("attention_ms"), "%.1f"),
                              fmt(row.get("attention_share"), "%.2f"), fmt(row.get("density"), "%.3f"))) +
                          (f"; {row['attn_error']}" if "attn_error" in row else "") + f" ({time.time() - t0:.0f} s)",
                          file=sys.stderr)
    doc["complete"] = True
    save()
    print(markdown(doc))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
