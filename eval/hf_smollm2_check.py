#!/usr/bin/env python3
"""eval/hf_smollm2_check.py — SmolLM2-135M-Instruct through transformers' GGUF loader with
attn_implementation="crisp" (and the dense policy) beside "sdpa": greedy answers to short chat
questions, token for token, and the last-position logits of a longer real prompt (issue 6: "same
greedy answers as sdpa on short prompts").

    python3 eval/hf_smollm2_check.py --model path/to/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--prose data/long_qa_prompts.json] [--json out.json]

Needs torch, transformers and the `gguf` package (carried as a wheel to the GPU machine; see
docs/gpu.md). Runs on CUDA in bfloat16 when a GPU is there, else on the CPU in float32.
Exit status 1 when a crisp policy's greedy answer differs from sdpa's on any short prompt (the
long prompt's logits are reported, not judged: past the short-sequence rule the crisp policy is
sparse on purpose).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import crisp
import crisp.hf

# Short questions with one well-known answer: a 135M model should answer them coherently.
QUESTIONS = [
    "What is the capital of France?",
    "What is 2 + 3?",
    "Name the largest planet in the solar system.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
]


def chat_ids(tokenizer, text: str, device):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt")
    if not torch.is_tensor(ids):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return ids.to(device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the SmolLM2-135M-Instruct .gguf file")
    ap.add_argument("--prose", default=None, help="long_qa_prompts.json for the long-prompt logits")
    ap.add_argument("--long-tokens", type=int, default=4096, help="tokens of the long prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    if not os.path.isfile(args.model):
        print(f"--model: no file at {args.model}", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model_dir, model_file = os.path.split(os.path.abspath(args.model))
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=dtype).to(device).eval()
    print(f"loaded in {time.time() - t0:.1f} s on {device} ({dtype})", flush=True)
    impls = ["sdpa", crisp.hf.register("crisp", policy="crisp"), crisp.hf.register("crisp_dense", policy="dense")]

    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype),
               "short": [], "long": None}
    mismatches = 0
    for q in QUESTIONS:
        ids = chat_ids(tokenizer, q, device)
        row = {"question": q, "prompt_tokens": int(ids.shape[1]), "answers": {}}
        tokens = {}
        for impl in impls:
            model.set_attn_implementation(impl)
            crisp.hf.reset_stats()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
            new = out[0, ids.shape[1]:].tolist()
            tokens[impl] = new
            row["answers"][impl] = tokenizer.decode(new, skip_special_tokens=True)
            if impl != "sdpa":
                row.setdefault("crisp_prefill_calls", {})[impl] = crisp.hf.stats.get("crisp", 0)
        row["same_as_sdpa"] = {impl: tokens[impl] == tokens["sdpa"] for impl in impls if impl != "sdpa"}
        mismatches += sum(not same for same in row["same_as_sdpa"].values())
        results["short"].append(row)
        print(f"Q: {q}\n  sdpa : {row['answers']['sdpa']!r}\n  crisp: {row['answers']['crisp']!r}"
              f"  same={row['same_as_sdpa']}", flush=True)

    if args.prose and os.path.isfile(args.prose):
        with open(args.prose) as f:
            prompts = json.load(f)
        text = prompts[0]["prompt"]  # a list of {"prompt", "answer"} (data/README.md)
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, : args.long_tokens].to(device)
        logits = {}
        for impl in impls:
            model.set_attn_implementation(impl)
            with torch.no_grad():
                logits[impl] = model(ids).logits[0, -1].float()
        ref = logits["sdpa"]
        std = ref.std().item()
        results["long"] = {
            "tokens": int(ids.shape[1]),
            "max_abs_diff_over_std": {impl: (logits[impl] - ref).abs().max().item() / std for impl in impls[1:]},
            "argmax_equal": {impl: bool(logits[impl].argmax() == ref.argmax()) for impl in impls[1:]},
        }
        print(f"long prompt ({ids.shape[1]} tokens), last-position logits vs sdpa: {results['long']}", flush=True)

    results["short_prompt_mismatches"] = mismatches
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"short prompts: {len(QUESTIONS)} questions x {len(impls) - 1} crisp policies, "
          f"{mismatches} greedy answers differ from sdpa")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
