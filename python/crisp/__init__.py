"""crisp: cliff-aware input-adaptive sparse prefill attention, for PyTorch (CUDA and CPU) and numpy.

    import crisp
    out, lse = crisp.prefill(q, k, v, policy="crisp")      # q/k/v: [batch, heads, seq, dim]
    plan = crisp.plan(q, k, policy="crisp")                 # routes, densities, block CSR
    attention = crisp.Attention("crisp"); attention.plan(q, k); out, lse = attention.run(q, k, v)

``crisp.hf.register()`` adds ``attn_implementation="crisp"`` to transformers.
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

from . import _C  # noqa: E402
from ._C import Error  # noqa: E402
from ._plan import Plan, SequencePlan  # noqa: E402
from .attention import Attention  # noqa: E402
from .ops import attend, gqa_union, plan, prefill  # noqa: E402

__version__ = "0.1.0"
built_with_cuda = _C.built_with_cuda
cuda_available = _C.cuda_available
presets = _C.Config.preset_names
parameter_names = _C.Config.parameter_names


def make_workload(num_q_heads=8, num_kv_heads=2, head_dim=128, seq_lens=(8192,), seed=0, diffuse_head_share=0.25):
    """The library's seeded structured workload (crisp::make_workload): a dict with numpy float32
    ``q`` [Hq, T, d], ``k`` / ``v`` [Hkv, T, d], ``cu_seqlens``, ``needle_positions`` and
    ``head_is_diffuse``. docs/workload.md describes it."""
    return _C.make_workload(num_q_heads, num_kv_heads, head_dim, list(seq_lens), seed, diffuse_head_share)


__all__ = ["Attention", "Error", "Plan", "SequencePlan", "attend", "gqa_union", "plan", "prefill", "make_workload",
           "built_with_cuda", "cuda_available", "presets", "parameter_names"]
