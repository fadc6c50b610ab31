#!/usr/bin/env python3
"""Reference token ids for crisp's tokenizer test (tests/test_tokenizer.cpp, RealModel cases).

Builds SmolLM2's tokenizer with Hugging Face `tokenizers` — the independent implementation — from
the GGUF file's own vocabulary and merges, with the pre-tokenizer of SmolLM2's tokenizer.json:
    Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]
and the file's control tokens (<|im_start|>, ...) as special added tokens. The chat prompts are
rendered from the file's tokenizer.chat_template with jinja2 (as transformers renders it).

As a second opinion it also builds the tokenizer through transformers' own GGUF converter
(transformers.integrations.gguf.gguf_tokenizer_mapping.convert_gguf_tokenizer, fed with the
file's metadata read by gguf-py because transformers' GGUF reader needs torch). For tokenizer.ggml.pre
"smollm" that converter uses GPT-2's plain ByteLevel split and does not isolate digits, so it may
differ where whitespace precedes a digit; each prompt records whether it agrees.

Usage:
    pip install tokenizers gguf transformers jinja2
    python3 scripts/ref_tokenize.py [MODEL.gguf] > tests/data/tokenizer_expected.json
MODEL defaults to $CRISP_MODEL_PATH or .cache/model/SmolLM2-135M-Instruct.Q4_1.gguf
(scripts/fetch_model.sh fetches it).
"""
import json
import os
import sys
from pathlib import Path

import gguf
import jinja2
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

REPO = Path(__file__).resolve().parent.parent


def model_path():
    if len(sys.argv) > 1:
        return sys.argv[1]
    return os.environ.get("CRISP_MODEL_PATH",
                          str(REPO / ".cache/model/SmolLM2-135M-Instruct.Q4_1.gguf"))


def read_metadata(path):
    reader = gguf.GGUFReader(path)

    def field(key):
        f = reader.fields[key]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [f.parts[i].tolist()[0] for i in f.data]
        if f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]].tolist()[0]

    keys = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.chat_template",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"]
    return {k: field(k) for k in keys if k in reader.fields}


def smollm2_tokenizer(meta):
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"])
               if ty == 3]
    tok.add_special_tokens(control)
    return tok


def transformers_gguf_tokenizer(meta):
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except Exception as e:  # transformers missing or a version without this module
        print(f"ref_tokenize: transformers' GGUF converter unavailable ({e})", file=sys.stderr)
        return None
    d = {
        "tokenizer_type": meta["tokenizer.ggml.model"],
        "pre_tokenizer_type": meta["tokenizer.ggml.pre"],
        "tokens": meta["tokenizer.ggml.tokens"],
        "merges": meta["tokenizer.ggml.merges"],
        "token_type": meta["tokenizer.ggml.token_type"],
    }
    backend, _ = convert_gguf_tokenizer("llama", d)
    return backend


def render_chat(template, messages, add_generation_prompt):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt)


def prompts():
    # The shared data directory sits beside the repository (../shared/data, see issue 4).
    qa_file = Path(os.environ.get("CRISP_DATA_DIR", REPO.parent / "shared/data")) / "long_qa_prompts.json"
    qa = json.load(open(qa_file))[0]["prompt"]
    return [
        ("ascii", "Hello world! The quick brown fox jumps over the lazy dog."),
        ("contractions", "I'm sure they'll say it's fine, don't you think? We've seen it'S done."),
        ("digits", "In 2024, 3.14159 and 1,000,000 (or 42nd, x2y3) cost $19.99 at  7  pm;  12  34"),
        ("punctuation", "Wait... what?! (parens) [brackets] {braces} <tags> --- ***bold*** #hash @at"),
        ("whitespace", "  leading and trailing  \t tabs\t\tand   multiple    spaces   "),
        ("newlines", "line one\nline two\n\nparagraph\r\n\r\nwindows\n\n\n  indented\n"),
        ("accents", "Café naïve résumé façade Ångström Añatuya São Paulo Zürich"),
        ("cjk", "你好，世界！这是一个测试。日本語のテキスト 한국어 텍스트"),
        ("emoji", "Emoji: 😀👍🏽🇺🇸 and ❤️ plus symbols ½ ² ∑ → ©"),
        ("code", "def foo(x):\n    return x ** 2  # square\n\nprint(foo(12))\n"),
        ("specials_inline", "a<|im_end|>b <|endoftext|> c<|im_start|>user\nhi<|im_end|>\n"),
        ("long_qa_slice", qa[:6000]),
    ]


def main():
    path = model_path()
    meta = read_metadata(path)
    ref = smollm2_tokenizer(meta)
    alt = transformers_gguf_tokenizer(meta)
    template = meta["tokenizer.chat_template"]

    cases = [{"name": name, "text": text} for name, text in prompts()]
    chats = [
        ("chat_default_system", [{"role": "user", "content": "What is the capital of France?"}], True),
        ("chat_with_system", [{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "Name 3 primes."},
                              {"role": "assistant", "content": "2, 3, 5."},
                              {"role": "user", "content": "And the next one?"}], True),
        ("chat_no_generation_prompt", [{"role": "user", "content": "Hi"}], False),
    ]
    for name, messages, gen in chats:
        cases.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                      "text": render_chat(template, messages, gen)})

    for case in cases:
        enc = ref.encode(case["text"], add_special_tokens=False)
        case["ids"] = enc.ids
        if alt is not None:
            case["transformers_gguf_agrees"] = alt.encode(case["text"], add_special_tokens=False).ids == enc.ids
        # The reference decoder must give the text back, else the expectation is unusable.
        assert ref.decode(enc.ids, skip_special_tokens=False) == case["text"], case["name"]

    out = {
        "generated_by": "scripts/ref_tokenize.py",
        "reference": f"huggingface tokenizers {tokenizers.__version__}: BPE from the GGUF vocab/merges, "
                     "pre_tokenizer Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space="
                     "False, use_regex=True)], control tokens as special added tokens; chat text "
                     f"rendered with jinja2 {jinja2.__version__} from tokenizer.chat_template",
        "model": os.path.basename(path),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
