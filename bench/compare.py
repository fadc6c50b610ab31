#!/usr/bin/env python3
"""bench/compare.py — crisp against the attention kernels PyTorch users pick today, in one table.

For each sequence length n (one sequence, causal prefill, bf16, Hq=32 / Hkv=8 / d=128 by default):
  * sdpa_flash    torch SDPA, FLASH_ATTENTION backend (dense causal)
  * sdpa_cudnn    torch SDPA, CUDNN_ATTENTION backend (dense causal)
  * flex_crisp    FlexAttention (torch.compile'd) on the SAME block layout crisp chose: crisp's plan
                  (per query head) as a BlockMask.from_kv_blocks, off-diagonal blocks "full", the
                  diagonal block "partial" with a causal mask_mod, BLOCK_SIZE = crisp's block size
  * crisp_dense   crisp's attention kernel on the dense causal layout
  * crisp_total   crisp plan (on the GPU) + attention
  * crisp_attend  crisp attention alone, on its filled plan
GQA: SDPA gets enable_gqa=True when the backend accepts it, else repeat_interleave'd k/v (the
table's "gqa" column says which); FlexAttention gets enable_gqa=True; crisp reads kv heads directly.
Inputs: the library's structured workload (crisp.make_workload, the same as `crisp bench`), so the
plan has real structure; --inputs random for i.i.d. normal inputs.
Timing: CUDA events around each call, median of --reps runs after --warmup runs.
TFLOP/s: effective, on the (query, key) pairs each method computes: all causal pairs for the dense
methods, the pairs inside the plan's blocks (causal within the diagonal block) for crisp and flex.
The table is printed last; --json writes every row.

    python3 bench/compare.py --seq 8192,32768,131072 --json out/compare.json
    python3 bench/compare.py --long      # adds n = 512k with 8 / 2 heads
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import crisp
import crisp.flex
from crisp import _C


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def time_ms(fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def view(name: str, x: torch.Tensor) -> "_C.View":
    """[1, H, T, d] (or [H, T]) contiguous CUDA tensor -> the library's [H, T, d] view."""
    if x.ndim == 4:
        x = x[0]
    return _C.View(name, x.data_ptr(), str(x.dtype).replace("torch.", ""), "cuda", list(x.shape), list(x.stride()))


def causal_pairs(n: int) -> float:
    return n * (n + 1) / 2


def plan_pairs(seq: "crisp.SequencePlan", n: int, B: int) -> float:
    """(query, key) pairs inside the plan's blocks, summed over heads (causal in the diagonal)."""
    N = seq.num_blocks
    qlen = np.minimum(B, n - np.arange(N) * B).astype(np.float64)  # queries of each row block
    counts = np.diff(seq.row_ptr, axis=1).astype(np.float64)  # [H, N] blocks per row, diagonal included
    return float(((counts - 1) * qlen * B + qlen * (qlen + 1) / 2).sum())


def make_inputs(kind: str, Hq: int, Hkv: int, d: int, n: int, seed: int):
    if kind == "workload":
        w = crisp.make_workload(Hq, Hkv, d, [n], seed=seed)
        return tuple(torch.from_numpy(w[x]).unsqueeze(0).to("cuda", torch.bfloat16) for x in ("q", "k", "v"))
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(1, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for H in (Hq, Hkv, Hkv))


def sdpa_runner(backend, q, k, v):
    """An SDPA closure for one backend: enable_gqa if the backend takes it, else repeated kv."""
    group = q.shape[1] // k.shape[1]

    def with_gqa():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    try:
        ref = with_gqa()
        return with_gqa, "enable_gqa", ref
    except RuntimeError:
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

        def repeated():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)

        return repeated, "repeat_interleave", repeated()


def bench_length(args, n: int, Hq: int, Hkv: int, flex_compiled, rows: list) -> None:
    d, B = args.dim, args.block_size
    log(f"n={n}: inputs ({args.inputs})")
    q, k, v = make_inputs(args.inputs, Hq, Hkv, d, n, args.seed)
    dense_flops = 4.0 * d * Hq * causal_pairs(n)
    stream = torch.cuda.current_stream().cuda_stream
    reps, warm = args.reps, args.warmup

    def add(method, ms, flops, density, gqa="", note="", err=None):
        rows.append({"n": n, "Hq": Hq, "Hkv": Hkv, "d": d, "method": method, "ms": ms,
                     "tflops": flops / (ms * 1e-3) / 1e12 if ms else None, "density": density, "gqa": gqa,
                     "note": note, "max_abs_diff_vs_crisp": err})
        log(f"  {method:13s} {ms:9.3f} ms  {note}")

    # ---- dense references
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            fn, gqa, _ = sdpa_runner(backend, q, k, v)
            add(name, time_ms(fn, reps, warm), dense_flops, 1.0, gqa)
        except RuntimeError as e:
            rows.append({"n": n, "Hq": Hq, "Hkv": Hkv, "d": d, "method": name, "ms": None, "tflops": None,
                         "density": 1.0, "gqa": "", "note": f"unavailable: {str(e).splitlines()[0][:80]}"})
            log(f"  {name}: unavailable ({str(e).splitlines()[0][:80]})")
        torch.cuda.empty_cache()

    qv, kv, vv = view("q", q), view("k", k), view("v", v)
    out = torch.empty_like(q)
    lse = torch.empty(Hq, n, device="cuda", dtype=torch.float32)
    ov, lv = view("out", out), view("lse", lse)

    # ---- crisp dense layout
    dense_cfg = _C.Config("dense", [f"block_size={B}"])
    dense_plan = _C.DevicePlan(Hq, Hkv, d, [0, n], dense_cfg)
    dense_plan.plan_async(qv, kv, dense_cfg, stream)
    add("crisp_dense", time_ms(lambda: dense_plan.attend_async(qv, kv, vv, ov, lv, stream), reps, warm),
        dense_flops, 1.0, "native")
    del dense_plan

    # ---- crisp plan + attention, attention alone
    cfg = _C.Config(args.policy, [f"block_size={B}"] + list(args.set))
    dplan = _C.DevicePlan(Hq, Hkv, d, [0, n], cfg)

    def plan_and_attend():
        dplan.plan_async(qv, kv, cfg, stream)
        dplan.attend_async(qv, kv, vv, ov, lv, stream)

    total_ms = time_ms(plan_and_attend, reps, warm)
    attend_ms = time_ms(lambda: dplan.attend_async(qv, kv, vv, ov, lv, stream), reps, warm)
    host = crisp.Plan.from_native(dplan.to_host(stream))
    seq = host.sequences[0]
    density = float(host.density)
    sparse_flops = 4.0 * d * plan_pairs(seq, n, B)
    routes = {r: seq.routes.count(r) for r in sorted(set(seq.routes))}
    add("crisp_total", total_ms, sparse_flops, density, "native", f"{args.policy} plan+attend, routes {routes}")
    add("crisp_attend", attend_ms, sparse_flops, density, "native", f"{args.policy} attention only")
    crisp_out = out.clone()
    torch.cuda.synchronize()
    del dplan

    # ---- FlexAttention on crisp's layout
    if flex_compiled is not None:
        try:
            t0 = time.time()
            bm = crisp.flex.block_mask(seq, B, q.device)
            fn = lambda: flex_compiled(q, k, v, block_mask=bm, enable_gqa=True)
            flex_out = fn()  # compiles for this shape
            torch.cuda.synchronize()
            log(f"  flex: block mask + compile {time.time() - t0:.1f} s")
            err = float((flex_out.float() - crisp_out.float()).abs().max())
            add("flex_crisp", time_ms(fn, reps, warm), sparse_flops, density, "enable_gqa",
                "same layout as crisp", err)
            del bm, flex_out
        except Exception as e:  # noqa: BLE001 - the table says why it is missing
            rows.append({"n": n, "Hq": Hq, "Hkv": Hkv, "d": d, "method": "flex_crisp", "ms": None, "tflops": None,
                         "density": density, "gqa": "", "note": f"failed: {type(e).__name__}: {str(e)[:100]}"})
            log(f"  flex failed: {type(e).__name__}: {e}")
    del q, k, v, out, lse, crisp_out
    torch.cuda.empty_cache()


def print_table(rows: list, device_name: str) -> None:
    print()
    print(f"crisp compare: {device_name}, bf16, median of runs (CUDA events); speedup = sdpa_flash ms / ms")
    hdr = f"{'n':>7} {'Hq/Hkv':>6} {'method':<13} {'ms':>9} {'TFLOP/s':>8} {'density':>8} {'speedup':>8} {'gqa':<17} note"
    print(hdr)
    print("-" * len(hdr))
    flash = {r["n"]: r["ms"] for r in rows if r["method"] == "sdpa_flash" and r["ms"]}
    for r in rows:
        ms = f"{r['ms']:9.3f}" if r["ms"] else f"{'-':>9}"
        tf = f"{r['tflops']:8.1f}" if r.get("tflops") else f"{'-':>8}"
        sp = f"{flash[r['n']] / r['ms']:7.2f}x" if r["ms"] and r["n"] in flash else f"{'-':>8}"
        note = r.get("note", "")
        if r.get("max_abs_diff_vs_crisp") is not None:
            note += f" (max|out-crisp| {r['max_abs_diff_vs_crisp']:.3g})"
        print(f"{r['n']:>7} {str(r['Hq']) + '/' + str(r['Hkv']):>6} {r['method']:<13} {ms} {tf} "
              f"{r['density']:8.4f} {sp} {r['gqa']:<17} {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", default="8192,32768,131072", help="sequence lengths (comma-separated)")
    ap.add_argument("--long", action="store_true", help="also n = 524288 with --long-heads")
    ap.add_argument("--long-heads", default="8,2", help="Hq,Hkv of the --long case")
    ap.add_argument("--heads", default="32,8", help="Hq,Hkv")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--policy", default="crisp")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Config parameter (repeatable)")
    ap.add_argument("--inputs", choices=("workload", "random"), default="workload")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes time)")
    ap.add_argument("--json", default="", help="write every row here")
    args = ap.parse_args()

    if not torch.cuda.is_available() or not crisp.cuda_available():
        print("compare.py: needs a GPU and a CUDA build of crisp (pip install . with nvcc present)", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name()
    Hq, Hkv = (int(x) for x in args.heads.split(","))
    cases = [(int(s), Hq, Hkv) for s in args.seq.split(",") if s]
    if args.long:
        lq, lk = (int(x) for x in args.long_heads.split(","))
        cases.append((524288, lq, lk))

    flex_compiled = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        flex_compiled = torch.compile(flex_attention, dynamic=False)

    t0 = time.time()
    rows: list = []
    meta = {"date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "device": device_name,
            "torch": torch.__version__, "command": " ".join(sys.argv), "policy": args.policy,
            "inputs": args.inputs, "reps": args.reps, "warmup": args.warmup, "block_size": args.block_size}
    for n, hq, hkv in cases:
        try:
            bench_length(args, n, hq, hkv, flex_compiled, rows)
        except Exception as e:  # noqa: BLE001 - a failed length is a row, the table still prints
            rows.append({"n": n, "Hq": hq, "Hkv": hkv, "d": args.dim, "method": "(length failed)", "ms": None,
                         "tflops": None, "density": float("nan"), "gqa": "",
                         "note": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"})
            log(f"n={n} failed: {type(e).__name__}: {e}")
            torch.cuda.empty_cache()
        log(f"n={n} done ({time.time() - t0:.0f} s so far)")
        if args.json:  # rewritten after every length, so a run stopped early keeps its rows
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, device_name)
    print(f"({meta['date']}, torch {torch.__version__}, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
