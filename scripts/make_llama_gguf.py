#!/usr/bin/env python3
"""Writes a GGUF of a llama-architecture model with random weights at a named real model's shape.

    python3 scripts/make_llama_gguf.py --shape llama3.1-8b --out /tmp/llama31-8b-q4_0.gguf
    python3 scripts/make_llama_gguf.py --shape llama3.1-8b --layers 2 --vocab 512 --out tiny.gguf

For benchmarks of llama.cpp at a real model's shape without downloading the model: the weights
are seeded random numbers (the same bytes for the same arguments), written straight into valid
quantised blocks (no quantisation pass), so the 4.5 GB Q4_0 file of Llama-3.1-8B takes seconds
to a minute, bounded by the disk. The text the model produces is meaningless; the tensors, their
types and the hyperparameters (hence llama.cpp's graph, its kernels and their cost) are the real
model's. Llama-3.1's llama3 RoPE scaling is written as llama.cpp's converter writes it (the
rope_freqs tensor).

The vocabulary is a minimal SentencePiece-style ("llama") one that llama.cpp's loader accepts:
<unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF> (so any text tokenises) and filler tokens
up to the vocabulary size. llama-bench feeds random token ids, so the tokeniser only matters to
tools that tokenise a prompt.

The GGUF writer is llama.cpp's own gguf-py, the copy vendored in the pinned llama.cpp source that
scripts/llama_cpp.sh extracts (.deps/llama.cpp-src/gguf-py, gguf 0.17.1): the key and tensor
names are the ones the loader of that llama.cpp reads. It needs numpy and PyYAML.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF_PY = REPO_ROOT / ".deps" / "llama.cpp-src" / "gguf-py"


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context: int
    # llama3 RoPE scaling (factor, low_freq_factor, high_freq_factor, original context); None: none
    rope_llama3: tuple[float, float, float, int] | None
    tied_output: bool


SHAPES = {
    # meta-llama/Llama-3.1-8B(-Instruct) config.json
    "llama3.1-8b": Shape(hidden=4096, layers=32, q_heads=32, kv_heads=8, head_dim=128, ffn=14336,
                         vocab=128256, rope_theta=500000.0, rms_eps=1e-5, context=131072,
                         rope_llama3=(8.0, 1.0, 4.0, 8192), tied_output=False),
}

# NOTE: the standard deviation of every weight matrix's entries (the usual 0.02 initialisation).
# With RMS norms of weight 1 before each block, each block adds O(1) to the residual stream
# (a matrix of n inputs maps unit-RMS activations to 0.02·sqrt(n) ≈ 1.3 for n = 4096), so after
# 32 layers the activations are O(10) and the logits finite, at any prompt length.
WEIGHT_STD = 0.02
# NOTE: the token embeddings' standard deviation; any scale works (block 0 normalises them), this
# one keeps them well above the RMS norm's epsilon.
EMBEDDING_STD = 0.02
# NOTE: each quantised block's scale is the one giving WEIGHT_STD, times a random factor in
# ±[1 - SCALE_JITTER, 1 + SCALE_JITTER], so blocks differ as in a real quantised model.
SCALE_JITTER = 0.25

WEIGHT_TYPES = ("q4_0", "q8_0", "f16")


def die(message: str) -> None:
    print(f"make_llama_gguf: error: {message}", file=sys.stderr)
    sys.exit(2)


def import_gguf(gguf_py: Path):
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        die(f"--gguf-py {gguf_py}: no gguf package there (scripts/llama_cpp.sh extracts the pinned "
            "llama.cpp, whose gguf-py this script uses, into .deps/llama.cpp-src)")
    sys.path.insert(0, str(gguf_py))
    try:
        import gguf  # noqa: PLC0415
    except ImportError as error:
        die(f"cannot import gguf from {gguf_py}: {error} (it needs numpy and PyYAML)")
    return gguf


def llama3_rope_factors(shape: Shape) -> list[float]:
    """Llama-3.1's per-frequency RoPE factors, as llama.cpp's convert_hf_to_gguf.py computes them."""
    factor, low_freq_factor, high_freq_factor, old_context = shape.rope_llama3
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    factors = []
    for i in range(0, shape.head_dim, 2):
        freq = 1.0 / (shape.rope_theta ** (i / shape.head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return factors


def tensor_plan(gguf, shape: Shape):
    """(name, numpy shape (rows, cols) or (n,), 'matrix' | 'embedding' | 'norm' | 'rope') in file order."""
    T = gguf.MODEL_TENSOR
    name = lambda tensor, bid=None: gguf.TENSOR_NAMES[tensor].format(bid=bid) + ".weight"  # noqa: E731
    q_dim, kv_dim = shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim
    plan = [(name(T.TOKEN_EMBD), (shape.vocab, shape.hidden), "embedding")]
    if shape.rope_llama3 is not None:
        plan.append((name(T.ROPE_FREQS), (shape.head_dim // 2,), "rope"))
    for b in range(shape.layers):
        plan += [
            (name(T.ATTN_NORM, b), (shape.hidden,), "norm"),
            (name(T.ATTN_Q, b), (q_dim, shape.hidden), "matrix"),
            (name(T.ATTN_K, b), (kv_dim, shape.hidden), "matrix"),
            (name(T.ATTN_V, b), (kv_dim, shape.hidden), "matrix"),
            (name(T.ATTN_OUT, b), (shape.hidden, q_dim), "matrix"),
            (name(T.FFN_NORM, b), (shape.hidden,), "norm"),
            (name(T.FFN_GATE, b), (shape.ffn, shape.hidden), "matrix"),
            (name(T.FFN_UP, b), (shape.ffn, shape.hidden), "matrix"),
            (name(T.FFN_DOWN, b), (shape.hidden, shape.ffn), "matrix"),
        ]
    plan.append((name(T.OUTPUT_NORM), (shape.hidden,), "norm"))
    if not shape.tied_output:
        plan.append((name(T.OUTPUT), (shape.vocab, shape.hidden), "matrix"))
    return plan


class RandomWeights:
    """Random weights of one type, seeded per tensor (its index in the file)."""

    # bytes per block of 32 values and the standard deviation of a block's integer values
    BLOCKS = {"q4_0": (18, math.sqrt((16 * 16 - 1) / 12.0)),   # nibbles 0..15, value (q - 8)·d
              "q8_0": (34, math.sqrt((256 * 256 - 1) / 12.0))}  # int8 -128..127, value q·d
    INT16_STD = math.sqrt((65536 * 65536 - 1) / 12.0)

    def __init__(self, np, weight_type: str, seed: int):
        self.np = np
        self.weight_type = weight_type
        self.seed = seed

    def nbytes(self, numpy_shape) -> int:
        n = math.prod(numpy_shape)
        if self.weight_type == "f16":
            return 2 * n
        return (n // 32) * self.BLOCKS[self.weight_type][0]

    def make(self, index: int, numpy_shape, std: float):
        np = self.np
        rng = np.random.default_rng([self.seed, index])
        n = math.prod(numpy_shape)
        if self.weight_type == "f16":
            # Uniform like the quantised types' integers (random int16s scaled), for speed.
            out = np.empty(n, dtype=np.float16)
            scale = np.float32(std / self.INT16_STD)
            chunk = 1 << 24  # bounded float32 temporaries for the largest tensors
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                out[start:stop] = np.frombuffer(rng.bytes(2 * (stop - start)), dtype=np.int16) * scale
            return out.reshape(numpy_shape)
        block_bytes, value_std = self.BLOCKS[self.weight_type]
        n_blocks = n // 32
        # Every byte after the scale is uniformly random: random nibbles (q4_0) or int8s (q8_0).
        blocks = np.frombuffer(bytearray(rng.bytes(n_blocks * block_bytes)), dtype=np.uint8)
        blocks = blocks.reshape(n_blocks, block_bytes)
        jitter = rng.uniform(1.0 - SCALE_JITTER, 1.0 + SCALE_JITTER, size=n_blocks).astype(np.float32)
        # Random signs: the integers' mean is -1/2 (0..15 less 8, or -128..127), which with
        # positive scales alone would give every matrix a shared rank-one part, and the network
        # would map every prompt to the same direction; quantisers write negative scales too.
        jitter *= rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=n_blocks)
        scales = (np.float32(std / value_std) * jitter).astype(np.float16)
        blocks[:, 0:2] = scales.view(np.uint8).reshape(n_blocks, 2)
        return blocks.reshape(-1)


def synthetic_vocab(gguf, n_vocab: int):
    """tokens, scores, types of a minimal SentencePiece-style vocabulary of n_vocab tokens."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
            [gguf.TokenType.BYTE] * 256
    if n_vocab < len(tokens):
        die(f"--vocab {n_vocab}: expected at least {len(tokens)} (3 special and 256 byte tokens)")
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, [int(t) for t in types]


def write(args) -> None:
    gguf = import_gguf(Path(args.gguf_py))
    import numpy as np  # noqa: PLC0415  (after gguf, which reports a missing numpy clearly)

    shape = SHAPES[args.shape]
    if args.layers is not None:
        shape = replace(shape, layers=args.layers)
    if args.vocab is not None:
        shape = replace(shape, vocab=args.vocab)
    if args.context is not None:
        shape = replace(shape, context=args.context)
    weights = RandomWeights(np, args.type, args.seed)
    file_type, ggml_type = {
        "q4_0": (gguf.LlamaFileType.MOSTLY_Q4_0, gguf.GGMLQuantizationType.Q4_0),
        "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
        "f16": (gguf.LlamaFileType.MOSTLY_F16, gguf.GGMLQuantizationType.F16)}[args.type]

    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(f"random {args.shape}{'' if args.layers is None else f' {shape.layers} layers'} "
                    f"{args.type} seed {args.seed}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.q_heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(file_type)
    tokens, scores, types = synthetic_vocab(gguf, shape.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    plan = tensor_plan(gguf, shape)
    for tensor_name, numpy_shape, kind in plan:
        if kind in ("norm", "rope"):
            writer.add_tensor_info(tensor_name, numpy_shape, np.dtype(np.float32), 4 * math.prod(numpy_shape))
        else:
            writer.add_tensor_info(tensor_name, numpy_shape, np.dtype(np.float32),
                                   weights.nbytes(numpy_shape), raw_dtype=ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    t0 = time.time()
    total = 0
    for index, (tensor_name, numpy_shape, kind) in enumerate(plan):
        if kind == "norm":
            data = np.ones(numpy_shape, dtype=np.float32)
        elif kind == "rope":
            data = np.array(llama3_rope_factors(shape), dtype=np.float32)
        else:
            data = weights.make(index, numpy_shape, EMBEDDING_STD if kind == "embedding" else WEIGHT_STD)
        writer.write_tensor_data(data)
        total += data.nbytes
    writer.close()
    os.replace(tmp, out)
    print(f"make_llama_gguf: wrote {out} ({args.shape}, {shape.layers} layers, vocab {shape.vocab}, "
          f"{args.type}, {len(plan)} tensors, {total / 2**30:.2f} GiB of weights in {time.time() - t0:.1f} s)",
          file=sys.stderr)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES), help="the real model whose shape is written")
    parser.add_argument("--out", required=True, help="the GGUF file to write (replaced atomically)")
    parser.add_argument("--type", default="q4_0", choices=WEIGHT_TYPES, help="type of the weight matrices [q4_0]")
    parser.add_argument("--layers", type=int, help="fewer layers than the shape's (tests)")
    parser.add_argument("--vocab", type=int, help="a smaller vocabulary than the shape's (tests; at least 259)")
    parser.add_argument("--context", type=int, help="the trained context length written [the shape's]")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed [0]")
    parser.add_argument("--gguf-py", default=os.environ.get("LLAMA_CPP_GGUF_PY", str(DEFAULT_GGUF_PY)),
                        help="llama.cpp's gguf-py folder [$LLAMA_CPP_GGUF_PY, else .deps/llama.cpp-src/gguf-py]")
    args = parser.parse_args(argv)
    for flag, value in (("--layers", args.layers), ("--vocab", args.vocab), ("--context", args.context)):
        if value is not None and value < 1:
            die(f"{flag} {value}: expected a positive integer")
    if args.seed < 0:
        die(f"--seed {args.seed}: expected a non-negative integer")
    if not Path(args.out).parent.is_dir():
        die(f"--out {args.out}: its folder does not exist")
    write(args)


if __name__ == "__main__":
    main()
