#!/usr/bin/env python3
"""Reference logits of SmolLM2-135M-Instruct for crisp's model test (tests/test_llama.cpp).

The independent implementation is Hugging Face transformers: its GGUF loader dequantises the
file's Q4_1/Q8_0 weights to float32 (and undoes the converter's Q/K row permutation, so its RoPE
is the rotate_half form), and its LlamaForCausalLM runs the forward pass in float32 on the CPU.
crisp's runner dequantises the same bytes to the same float32 values, so the two differ only by
float32 rounding in a different summation order.

Written to tests/data/ref_logits_smollm2.json:
  prompt          the chat-formatted prompt text (no digits, so that every byte-level BPE
                  pre-tokenizer variant splits it alike)
  token_ids       its ids, from transformers' tokenizer built from the GGUF file
  argmax          per position, the id of the largest logit
  top2_gap        per position, largest minus second largest logit (near-ties explain argmax flips)
  last_logits     all n_vocab logits of the last position, rounded to 1e-4
  last_std        their standard deviation
  answer_prompt / answer_text   a greedy generation for the short chat question, 24 tokens

Usage:
    python3 -m venv .cache/refvenv && .cache/refvenv/bin/pip install torch transformers gguf numpy accelerate
    .cache/refvenv/bin/python scripts/ref_logits.py [MODEL.gguf]
MODEL defaults to $CRISP_MODEL_PATH or .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf
(scripts/fetch_model.sh fetches it).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests/data/ref_logits_smollm2.json"

# About 300 tokens of plain prose (no digits: see the docstring), asked about in a chat turn.
DOCUMENT = (
    "The lighthouse keeper of the northern island kept a careful journal. Every evening he wrote "
    "down the colour of the sky, the direction of the wind and the ships that passed the rocks. "
    "In early spring the fishing boats came back from the southern waters, loaded with cod and "
    "herring, and the harbour filled with the noise of gulls and traders. The keeper's daughter, "
    "Maren, mended nets on the pier and learned the names of every captain. One stormy night a "
    "small cargo ship lost its rudder near the reef. Maren saw its lantern swinging wildly and ran "
    "up the spiral stairs to warn her father. Together they turned the great lamp towards the "
    "safe channel and signalled with a hand mirror until the crew understood. At dawn the ship lay "
    "anchored in the calm bay, and the sailors rowed ashore carrying bread, salt and a crate of "
    "oranges as thanks. The captain, a quiet woman named Ilse, promised to return every summer. "
    "She kept her word: for many years her ship arrived with the first warm winds, and the island "
    "children waited on the cliffs to be the first to see her sails. Maren later became the "
    "keeper herself, and she added a new line to the journal each time Ilse's ship appeared."
)
QUESTION = "Who warned the lighthouse keeper about the ship, and what did the sailors bring?"
SHORT_QUESTION = "What is the capital of France?"
ANSWER_TOKENS = 24


def model_path():
    if len(sys.argv) > 1:
        return sys.argv[1]
    return os.environ.get("CRISP_MODEL_PATH",
                          str(REPO / ".cache/model/SmolLM2-135M-Instruct.Q4_1.gguf"))


def main():
    path = Path(model_path())
    torch.set_grad_enabled(False)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    model.eval()

    messages = [{"role": "user", "content": DOCUMENT + "\n\n" + QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([ids])).logits[0].to(torch.float64).numpy()  # [n, vocab]
    top2 = np.sort(logits, axis=1)[:, -2:]
    last = logits[-1]

    short_messages = [{"role": "user", "content": SHORT_QUESTION}]
    short_prompt = tokenizer.apply_chat_template(short_messages, tokenize=False,
                                                 add_generation_prompt=True)
    short_ids = tokenizer(short_prompt, add_special_tokens=False)["input_ids"]
    generated = model.generate(torch.tensor([short_ids]), max_new_tokens=ANSWER_TOKENS,
                               do_sample=False)[0][len(short_ids):]

    out = {
        "model_file": path.name,
        "reference": f"transformers {transformers.__version__} GGUF loader, torch "
                     f"{torch.__version__}, float32 on the CPU",
        "prompt": prompt,
        "token_ids": ids,
        "argmax": [int(a) for a in logits.argmax(axis=1)],
        "top2_gap": [round(float(t[1] - t[0]), 5) for t in top2],
        "last_logits": [round(float(v), 4) for v in last],
        "last_std": float(last.std()),
        "answer_prompt": short_prompt,
        "answer_prompt_ids": short_ids,
        "answer_ids": [int(t) for t in generated],
        "answer_text": tokenizer.decode(generated, skip_special_tokens=False),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(ids)} tokens, last-logit std {out['last_std']:.4f}, "
          f"answer {out['answer_text']!r}")


if __name__ == "__main__":
    main()
