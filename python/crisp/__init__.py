"""crisp: cliff-aware input-adaptive sparse prefill attention, for PyTorch (CUDA and CPU) and numpy.

    import crisp
    out, lse = crisp.prefill(q, k, v, policy="crisp")      # q/k/v: [batch, heads, seq, dim]
    plan = crisp.plan(q, k, policy="crisp")                 # routes, densities, block CSR

``crisp.hf.register()`` adds ``attn_implementation="crisp"`` to transformers.
The native module ``crisp._C`` takes raw pointers and links no libtorch.
"""
from . import _C
from ._C import Error
from ._plan import Plan, SequencePlan
from .ops import attend, plan, prefill

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


__all__ = ["Error", "Plan", "SequencePlan", "attend", "plan", "prefill", "make_workload", "built_with_cuda",
           "cuda_available", "presets", "parameter_names"]
