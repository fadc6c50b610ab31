"""crisp: cliff-aware input-adaptive sparse prefill attention, for PyTorch (CUDA and CPU) and numpy.

    import crisp
    out, lse = crisp.prefill(q, k, v, layout="bhsd", policy="crisp")   # or "bshd", "thd" (varlen)
    plan = crisp.plan(q, k, layout="bhsd", policy="crisp")              # routes, densities, block CSR
    attention = crisp.Attention("crisp"); attention.plan(q, k); out, lse = attention.run(q, k, v)
    out, lse = crisp.prefill(q_chunk, k_so_far, v_so_far)               # a chunk: n_q <= n_k, bottom-right
    out, lse = crisp.prefill(q, k_cache, v_cache, block_table=table, cache_seqlens=lens)  # paged K/V

``crisp.hf.register()`` adds ``attn_implementation="crisp"`` to transformers (extra ``hf``);
``crisp.flex.block_mask(plan)`` gives a plan as a FlexAttention BlockMask (extra ``torch``). Both
are imported on first use, with an ImportError naming the extra if its packages are missing.
The native module ``crisp._C`` takes raw pointers and links no libtorch.
"""
# torch, when installed, is imported before the native module: torch's wheels carry their own
# libgomp.so.1, and crisp._C links the system's (OpenMP, for the CPU backend). Whichever loads
# first serves both, by soname; seen on an H200 machine (torch 2.11): `import crisp` first, then
# torch, crashed inside torch's import, while torch first works (crisp's OpenMP code runs on
# torch's libgomp). crisp.ops imports torch anyway, so this costs no extra import time.
try:
    import torch  # noqa: F401
except ImportError:
    pass

import numpy as _np  # noqa: E402

from . import _C  # noqa: E402
from ._C import Error  # noqa: E402
from ._plan import Plan, SequencePlan  # noqa: E402
from .attention import Attention  # noqa: E402
from .ops import attend, gqa_union, plan, prefill  # noqa: E402

__version__ = "0.1.0"
built_with_cuda = _C.built_with_cuda
cuda_available = _C.cuda_available
# The bounds of one call (the library's crisp/limits.h), for callers that route before they allocate.
MAX_TOKENS = _C.MAX_TOKENS
MAX_HEAD_DIM = _C.MAX_HEAD_DIM
cuda_head_dim_supported = _C.cuda_head_dim_supported
presets = _C.Config.preset_names
parameter_names = _C.Config.parameter_names


def make_workload(num_q_heads=8, num_kv_heads=2, head_dim=128, seq_lens=(8192,), seed=0, diffuse_head_share=0.25):
    """The library's seeded structured workload (crisp::make_workload): a dict with numpy float32
    ``q`` [Hq, T, d], ``k`` / ``v`` [Hkv, T, d], ``cu_seqlens``, ``needle_positions`` and
    ``head_is_diffuse``. docs/workload.md describes it."""
    # The types the native function takes, checked here so that an error names the argument (the
    # library checks the values: head counts, head dim, lengths, share).
    counts = [_integer(name, value) for name, value in
              (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim))]
    if isinstance(seq_lens, (str, bytes)) or not hasattr(seq_lens, "__iter__"):
        raise TypeError(f"seq_lens: got {type(seq_lens).__name__}; expected a sequence of ints")
    lengths = [_integer("seq_lens", n, expected="a sequence of ints") for n in seq_lens]
    seed = _integer("seed", seed, 0, 2 ** 64 - 1, "an int in [0, 2^64) (the generator's unsigned 64-bit seed)")
    share = diffuse_head_share
    if isinstance(share, (bool, _np.bool_)) or not isinstance(share, (int, float, _np.integer, _np.floating)):
        raise TypeError(f"diffuse_head_share: got {type(share).__name__}; expected a number in [0, 1]")
    return _C.make_workload(*counts, lengths, seed, float(share))


def _integer(name, value, low=-2 ** 63, high=2 ** 63 - 1, expected="an int"):
    """value as an int, if it is one in [low, high] (a bool is not); else an error naming `name`."""
    if isinstance(value, (bool, _np.bool_)) or not isinstance(value, (int, _np.integer)):
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}; expected {expected}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name}: {int(value)}; expected {expected}")
    return int(value)


# Submodules that need optional packages, imported on first access (crisp.hf, crisp.flex).
_LAZY_SUBMODULES = ("hf", "flex")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)  # binds crisp.<name> for next time
    raise AttributeError(f"module 'crisp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


__all__ = ["Attention", "Error", "Plan", "SequencePlan", "attend", "gqa_union", "plan", "prefill", "make_workload",
           "built_with_cuda", "cuda_available", "presets", "parameter_names", "MAX_TOKENS", "MAX_HEAD_DIM",
           "cuda_head_dim_supported"]
