#!/usr/bin/env python3
"""eval/hf_niah.py — the NIAH samples of `crisp-llama-eval niah`, run through Hugging Face transformers
with attn_implementation="crisp" (one per policy) and "sdpa", greedy; writes the outputs as JSONL for
`crisp eval niah --score`, so the transformers path is scored by the same official rules as
`crisp-llama-eval niah`.

One command (GPU machine or CPU; the model is SmolLM2-135M-Instruct through transformers' GGUF
loader, which needs the `gguf` package):

    $BIN/crisp-llama-eval niah --model M.gguf --dry-run --dump-samples samples.jsonl --lengths 2048,4096,8192
    python3 eval/hf_niah.py --samples samples.jsonl --out outputs.jsonl              # this script
    crisp eval niah --score outputs.jsonl --json eval/results/niah_hf.json          # the table

On the GPU machine, through the model suite of scripts/gpu.sh (dump the samples here first:
--dry-run needs only the tokenizer; carry the samples file, the gguf wheel in .whl/ and the model;
bf16 on CUDA; docs/gpu.md; the `model` suite of scripts/gpu.sh that ran this went with crisp's
retired runner, so run this script directly there):

    $BIN/crisp-llama-eval niah --model M.gguf --dry-run --dump-samples out/niah_samples.jsonl --lengths 2048,4096,8192
    python3 eval/hf_niah.py --samples out/niah_samples.jsonl --model <the .gguf there> --out $OUT/hf_niah_outputs.jsonl
    build/crisp eval niah --score <fetched>/hf_niah_outputs.jsonl   # here

Cost: every sample runs once per policy plus once for sdpa, with Python-level greedy decoding
(about 30 layers x max_new_tokens small launches); use --limit or fewer lengths when time is short.

Each output line: id, policy ("sdpa" or the crisp preset), output (decoded text), task, expected,
scoring, length, depth, ttft_s (prefill wall time), new_tokens, stop ("end" or "max_new_tokens"),
and for crisp policies prefill_calls: the layers that really ran crisp (crisp.hf.stats; the script
stops if a crisp policy never ran crisp). Generation runs to --max-new-tokens of the dump or the
end token (it does not stop early once the score is decided, unlike `crisp-llama-eval niah`).

The prompt token ids come from the dump (llama.cpp's tokenizer + the GGUF's chat template), so both
paths read the very same tokens. Samples beyond the model's trained context (the dump's
beyond_training) are skipped with a note: transformers would need a RoPE scaling configured.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_samples(path: str):
    samples = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            item = json.loads(line)
            for key in ("id", "task", "prompt_ids", "expected"):
                if key not in item:
                    raise SystemExit(f"{path}:{number}: no '{key}' (expected a dump of `crisp-llama-eval niah --dump-samples`)")
            samples.append(item)
    return samples


def beyond_training(sample) -> bool:
    """Past the model's trained context: `beyond_training` of a crisp-llama-eval dump, or a RoPE
    scaling other than none in a dump of crisp's retired runner."""
    return bool(sample.get("beyond_training")) or sample.get("rope_scaling", "none") != "none"


def greedy(model, prompt_ids, max_new_tokens: int, eos_ids, device):
    """Greedy decoding with a KV cache; returns (new token ids, prefill seconds, stop reason)."""
    ids = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ttft = time.perf_counter() - t0
        past = out.past_key_values
        token = int(out.logits[0, -1].argmax())
        new = []
        stop = "max_new_tokens"
        for _ in range(max_new_tokens):
            if token in eos_ids:
                stop = "end"
                break
            new.append(token)
            if len(new) == max_new_tokens:
                break
            out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
    return new, ttft, stop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", required=True, help="JSONL from `crisp-llama-eval niah --dump-samples`")
    ap.add_argument("--out", required=True, help="JSONL of outputs for `crisp eval niah --score`")
    ap.add_argument("--model", default=".cache/model/SmolLM2-135M-Instruct.Q4_1.gguf", help="the .gguf file")
    ap.add_argument("--policies", default="crisp,flexprefill,minference,dense",
                    help="crisp presets to run (comma-separated); sdpa always runs first as the baseline")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32 (CPU default)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N samples")
    args = ap.parse_args()

    import crisp
    import crisp.hf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples = load_samples(args.samples)
    if args.limit:
        samples = samples[: args.limit]
    skipped = [s for s in samples if beyond_training(s)]
    samples = [s for s in samples if not beyond_training(s)]
    if skipped:
        log(f"skipping {len(skipped)} samples beyond the trained context: "
            + ", ".join(s["id"] for s in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    if not samples:
        raise SystemExit("no samples to run")

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    model_dir, model_file = os.path.split(os.path.abspath(args.model))
    log(f"loading {args.model} through transformers' GGUF loader ({dtype}, {device})")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=dtype).to(device).eval()
    eos_ids = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if source is not None:
            eos_ids.update(source if isinstance(source, (list, tuple)) else [source])
    log(f"eos ids {sorted(eos_ids)}; {len(samples)} samples")

    impls = [("sdpa", "sdpa")]
    for policy in [p for p in args.policies.split(",") if p]:
        impls.append((policy, crisp.hf.register(f"crisp_{policy}", policy=policy)))

    with open(args.out, "w") as out:
        for policy, impl in impls:
            model.set_attn_implementation(impl)
            t0 = time.time()
            for s in samples:
                crisp.hf.reset_stats()
                new, ttft, stop = greedy(model, s["prompt_ids"], int(s.get("max_new_tokens", 32)), eos_ids, device)
                text = tokenizer.decode(new, skip_special_tokens=True)
                record = {"id": s["id"], "policy": policy, "output": text, "task": s["task"],
                          "expected": s["expected"], "length": s.get("length"), "depth": s.get("depth"),
                          "ttft_s": ttft, "new_tokens": len(new), "stop": stop,
                          "prompt_tokens": len(s["prompt_ids"])}
                if "scoring" in s:
                    record["scoring"] = s["scoring"]
                if impl != "sdpa":
                    record["prefill_calls"] = crisp.hf.stats["crisp"]
                    if crisp.hf.stats["crisp"] == 0:
                        raise SystemExit(f"{s['id']}: crisp never ran for policy {policy} "
                                         f"(fallbacks: {crisp.hf.stats['fallback_reasons']})")
                out.write(json.dumps(record) + "\n")
                out.flush()
            log(f"{policy}: {len(samples)} samples in {time.time() - t0:.1f} s")
    log(f"wrote {args.out}; score with: crisp eval niah --score {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
