"""crisp.prefill / crisp.plan / crisp.attend for torch tensors (CUDA or CPU) and numpy arrays (CPU).

Layouts (the same for q, k and v):
  * batched ``[batch, heads, seq, dim]``: every batch row is one causal sequence of ``seq`` tokens;
  * varlen ``[total, heads, dim]`` with ``cu_seqlens`` = ``[0, n_0, n_0 + n_1, ..., total]``
    (FlashAttention's varlen convention); without ``cu_seqlens`` one sequence of ``total`` tokens.
GQA: k and v may have fewer heads than q (``Hq % Hkv == 0``; query head h reads kv head
``h // (Hq // Hkv)``).

Outputs: ``out`` in q's layout and dtype; ``lse`` (natural log, float32; float64 for float64 inputs
on the CPU) is ``[batch, Hq, seq]`` or, varlen, ``[Hq, total]``.

The library sees ``[heads, tokens, dim]`` strided views: tensors are passed as raw pointers with
their strides, so nothing is copied unless a batched input cannot be expressed as one such view
(then it is copied once into a ``[batch, seq, heads, dim]`` buffer).
"""
from __future__ import annotations

import atexit
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _C
from ._plan import Plan

try:
    import torch
except ImportError:  # numpy-only use (the native module needs no torch)
    torch = None

__all__ = ["prefill", "plan", "attend", "settings_from_params"]


# ---------------------------------------------------------------- arguments
def settings_from_params(params: Dict[str, Any]) -> List[str]:
    """``{"alpha": 1.5, "routing": "jsd"}`` -> ``["alpha=1.5", "routing=jsd"]`` (Config::set)."""
    settings = []
    for key, value in params.items():
        if isinstance(value, bool):
            raise TypeError(f"{key}: got a bool ({value!r}); expected a number or a name")
        if isinstance(value, (float, np.floating)):
            text = repr(float(value))  # shortest round-trip form (np.float64's repr is not a number)
        elif isinstance(value, (int, np.integer)):
            text = str(int(value))
        elif isinstance(value, str):
            text = value
        else:
            raise TypeError(f"{key}: got {type(value).__name__}; expected an int, a float or a str")
        if ";" in text or "=" in text:
            raise ValueError(f"{key}: value {text!r} contains ';' or '='; expected a number or a name")
        settings.append(f"{key}={text}")
    return settings


def _is_torch(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _kind(name: str, x) -> str:
    if _is_torch(x):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    raise TypeError(f"{name}: got {type(x).__name__}; expected a torch.Tensor or a numpy.ndarray")


_TORCH_DTYPES = {}
if torch is not None:
    _TORCH_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}
_NUMPY_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.float64): "float64"}


def _dtype_name(name: str, x) -> str:
    table = _TORCH_DTYPES if _is_torch(x) else _NUMPY_DTYPES
    dt = x.dtype if _is_torch(x) else np.dtype(x.dtype)
    if dt not in table:
        raise TypeError(f"{name}: dtype {dt} is not supported; expected one of {', '.join(sorted(set(table.values())))}")
    return table[dt]


def _device_name(x) -> str:
    return x.device.type if _is_torch(x) else "cpu"


def _strides(x) -> Tuple[int, ...]:
    if _is_torch(x):
        return tuple(x.stride())
    itemsize = x.dtype.itemsize
    if any(s % itemsize for s in x.strides):
        raise ValueError("array: a stride is not a multiple of the item size; expected an element-aligned array")
    return tuple(s // itemsize for s in x.strides)


def _data_ptr(x) -> int:
    return x.data_ptr() if _is_torch(x) else x.ctypes.data


def _view(name: str, x, shape: Sequence[int], stride: Sequence[int]) -> "_C.View":
    return _C.View(name, _data_ptr(x), _dtype_name(name, x), _device_name(x), list(shape), list(stride))


def _check_inputs(q, k, v, cu_seqlens) -> str:
    """Type/rank/layout checks shared by the real and the fake (meta) implementation.
    Returns the layout: "batched" or "varlen"."""
    kinds = {_kind("q", q), _kind("k", k), _kind("v", v)}
    if len(kinds) != 1:
        raise TypeError("q, k, v: mixed torch tensors and numpy arrays; expected all three of one kind")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"k, v: dtypes {k.dtype} / {v.dtype} differ from q's {q.dtype}; expected one dtype for q, k, v")
    _dtype_name("q", q)
    if _is_torch(q):
        if k.device != q.device or v.device != q.device:
            raise ValueError(f"k, v: on {k.device} / {v.device} but q is on {q.device}; expected one device")
        if q.device.type not in ("cpu", "cuda"):
            raise ValueError(f"q: on {q.device}; expected a cpu or cuda tensor")
    if q.ndim != k.ndim or q.ndim != v.ndim:
        raise ValueError(f"k, v: ranks {k.ndim} / {v.ndim} differ from q's {q.ndim}; expected one layout for q, k, v")
    if q.ndim == 4:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: given with the batched layout [batch, heads, seq, dim]; "
                             "expected cu_seqlens only with the varlen layout [total, heads, dim]")
        B, Hq, S, D = q.shape
        for name, x in (("k", k), ("v", v)):
            if x.shape[0] != B or x.shape[2] != S or x.shape[3] != D:
                raise ValueError(f"{name}: shape {tuple(x.shape)} does not match q's {tuple(q.shape)}; "
                                 f"expected [batch={B}, Hkv, seq={S}, dim={D}]")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"v: {v.shape[1]} heads but k has {k.shape[1]}; expected the same head count")
        if B < 1 or S < 1:
            raise ValueError(f"q: shape {tuple(q.shape)} is empty; expected batch >= 1 and seq >= 1")
        return "batched"
    if q.ndim == 3:
        T, Hq, D = q.shape
        for name, x in (("k", k), ("v", v)):
            if x.shape[0] != T or x.shape[2] != D:
                raise ValueError(f"{name}: shape {tuple(x.shape)} does not match q's {tuple(q.shape)}; "
                                 f"expected [total={T}, Hkv, dim={D}]")
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"v: {v.shape[1]} heads but k has {k.shape[1]}; expected the same head count")
        return "varlen"
    raise ValueError(f"q: rank {q.ndim} (shape {tuple(q.shape)}); expected [batch, heads, seq, dim] or "
                     "[total, heads, dim] with cu_seqlens")


def _seqlens_list(cu_seqlens, total: int) -> List[int]:
    if cu_seqlens is None:
        return []
    if _is_torch(cu_seqlens):
        if cu_seqlens.ndim != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"cu_seqlens: a {cu_seqlens.dtype} tensor of rank {cu_seqlens.ndim}; "
                            "expected a rank-1 int32/int64 tensor")
        return [int(x) for x in cu_seqlens.tolist()]
    if isinstance(cu_seqlens, np.ndarray):
        if cu_seqlens.ndim != 1 or not np.issubdtype(cu_seqlens.dtype, np.integer):
            raise TypeError("cu_seqlens: expected a rank-1 integer array")
        return [int(x) for x in cu_seqlens]
    if isinstance(cu_seqlens, (list, tuple)) and all(isinstance(x, (int, np.integer)) for x in cu_seqlens):
        return [int(x) for x in cu_seqlens]
    raise TypeError(f"cu_seqlens: got {type(cu_seqlens).__name__}; expected a list of ints or a rank-1 integer tensor")


def _token_major(x):
    """A [B, H, S, D] array whose batch stride is S * seq-stride (so [H, B*S, D] is one view)."""
    B, H, S, D = x.shape
    st = _strides(x)
    if B == 1 or st[0] == S * st[2]:
        return x
    if _is_torch(x):
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def _heads_tokens_view(name: str, x, layout: str):
    """The library's [heads, tokens, dim] view of a batched or varlen input."""
    st = _strides(x)
    if layout == "batched":
        B, H, S, D = x.shape
        return _view(name, x, (H, B * S, D), (st[1], st[2], st[3]))
    T, H, D = x.shape
    return _view(name, x, (H, T, D), (st[1], st[0], st[2]))


def _empty(like, shape, dtype_torch=None, dtype_numpy=None):
    if _is_torch(like):
        return torch.empty(shape, dtype=dtype_torch, device=like.device)
    return np.empty(shape, dtype=dtype_numpy)


def _lse_dtypes(q):
    if _is_torch(q):
        return (torch.float64 if q.dtype == torch.float64 else torch.float32), None
    return None, (np.float64 if np.dtype(q.dtype) == np.float64 else np.float32)


def _allocate_outputs(q, layout: str):
    """(out, lse) as returned to the caller, plus their [H, tokens, dim] / [H, tokens] storage.
    Depends only on q's shape/dtype/device, so the fake implementation makes the same tensors."""
    lse_t, lse_n = _lse_dtypes(q)
    if layout == "batched":
        B, H, S, D = q.shape
        out_storage = _empty(q, (B, S, H, D), q.dtype, q.dtype)  # token-major, like FlashAttention
        lse_storage = _empty(q, (H, B * S), lse_t, lse_n)
        out = out_storage.transpose(1, 2) if _is_torch(q) else out_storage.transpose(0, 2, 1, 3)
        lse = lse_storage.reshape(H, B, S)
        lse = lse.permute(1, 0, 2) if _is_torch(q) else lse.transpose(1, 0, 2)
        return out, lse
    T, H, D = q.shape
    return _empty(q, (T, H, D), q.dtype, q.dtype), _empty(q, (H, T), lse_t, lse_n)


def _output_views(out, lse, layout: str):
    if layout == "batched":
        B, H, S, D = out.shape
        so = _strides(out)
        out_view = _view("out", out, (H, B * S, D), (so[1], so[2], so[3]))
        sl = _strides(lse)  # [B, H, S] permuted view of [H, B*S]
        lse_view = _view("lse", lse, (H, B * S), (sl[1], sl[2]))
        return out_view, lse_view
    T, H, D = out.shape
    so = _strides(out)
    return _view("out", out, (H, T, D), (so[1], so[0], so[2])), _view("lse", lse, (H, T), _strides(lse))


def _prepare(q, k, v, cu_seqlens):
    layout = _check_inputs(q, k, v, cu_seqlens)
    if layout == "batched":
        q, k, v = _token_major(q), _token_major(k), _token_major(v)
        B, _, S, _ = q.shape
        cu = [b * S for b in range(B + 1)] if B > 1 else []
    else:
        cu = _seqlens_list(cu_seqlens, q.shape[0])
    qv, kv, vv = (_heads_tokens_view(n, x, layout) for n, x in (("q", q), ("k", k), ("v", v)))
    return layout, (q, k, v), (qv, kv, vv), cu


def _precision(q) -> str:
    return "f64" if _dtype_name("q", q) == "float64" else "f32"


def _num_threads(q) -> int:
    return torch.get_num_threads() if _is_torch(q) else 0


def _stream(q) -> int:
    if _is_torch(q) and q.device.type == "cuda":
        return torch.cuda.current_stream(q.device).cuda_stream
    return 0


def _policy_name(policy) -> str:
    if not isinstance(policy, str):
        raise TypeError(f"policy: got {type(policy).__name__}; expected one of {', '.join(_C.Config.preset_names())}")
    return policy


# ---------------------------------------------------------------- CUDA: cached device plans
# NOTE: a DevicePlan is built once per (device, stream, shape, block size) and kept: building one
# copies the sequence offsets to the device synchronously, and reusing it keeps a prefill free of
# host synchronisation (and capturable in a CUDA graph after the first call). Its buffers live in
# a torch uint8 tensor (the caching allocator, stream-ordered). Up to this many shapes are kept.
_DEVICE_PLAN_CACHE_SIZE = 4
_device_plans: "OrderedDict[tuple, tuple]" = OrderedDict()
# Released before the interpreter tears the native module down: a DevicePlan still alive then is
# reported by nanobind as a leaked instance, and its device memory would outlive the CUDA runtime.
atexit.register(_device_plans.clear)


def _device_plan(q, hq: int, hkv: int, d: int, cu: List[int], config: "_C.Config", stream: int) -> "_C.DevicePlan":
    key = (q.device.index, stream, hq, hkv, d, tuple(cu), config.block_size)
    entry = _device_plans.get(key)
    if entry is not None:
        _device_plans.move_to_end(key)
        return entry[0]
    nbytes = _C.DevicePlan.bytes_required(hq, cu, config.block_size)
    alignment = 256  # DevicePlan's workspace alignment (crisp/cuda.h)
    workspace = torch.empty(nbytes + alignment, dtype=torch.uint8, device=q.device)
    offset = (-workspace.data_ptr()) % alignment
    dplan = _C.DevicePlan(hq, hkv, d, cu, config, workspace.data_ptr() + offset, nbytes)
    _device_plans[key] = (dplan, workspace)
    while len(_device_plans) > _DEVICE_PLAN_CACHE_SIZE:
        _device_plans.popitem(last=False)
    return dplan


def _run_prefill(q, k, v, cu_seqlens, policy: str, settings: List[str]):
    """The real implementation: returns (out, lse) in the caller's layout."""
    config = _C.Config(_policy_name(policy), list(settings))
    layout, (q, k, v), (qv, kv, vv), cu = _prepare(q, k, v, cu_seqlens)
    out, lse = _allocate_outputs(q, layout)
    ov, lv = _output_views(out, lse, layout)
    if _is_torch(q) and q.device.type == "cuda":
        stream = _stream(q)
        full_cu = cu if cu else [0, qv.shape[1]]
        with torch.cuda.device(q.device):
            dplan = _device_plan(q, qv.shape[0], kv.shape[0], qv.shape[2], full_cu, config, stream)
            dplan.plan_async(qv, kv, config, stream)
            dplan.attend_async(qv, kv, vv, ov, lv, stream)
    else:
        _C.prefill(qv, kv, vv, config, ov, lv, cu, _num_threads(q), _precision(q), 0)
    return out, lse


# ---------------------------------------------------------------- torch custom op
if torch is not None:

    @torch.library.custom_op("crisp::prefill", mutates_args=())
    def _prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                    policy: str, settings: str) -> Tuple[torch.Tensor, torch.Tensor]:
        # settings: "key=value" pairs joined by ';' (a custom op takes no list of str).
        return _run_prefill(q, k, v, cu_seqlens, policy, settings.split(";") if settings else [])

    @_prefill_op.register_fake
    def _prefill_fake(q, k, v, cu_seqlens, policy, settings):
        layout = _check_inputs(q, k, v, cu_seqlens)
        return _allocate_outputs(q, layout)


# ---------------------------------------------------------------- public API
def prefill(q, k, v, policy: str = "crisp", cu_seqlens=None, **params):
    """Causal block-sparse prefill attention. Returns ``(out, lse)``.

    ``policy``: a preset (``"crisp"``, ``"flexprefill"``, ``"minference"``, ``"dense"``);
    ``params``: any Config parameter by its spec name (``alpha=1.5``, ``tau_proxy=0.3``,
    ``block_size=64``, ``softmax_scale=0.125``, ...). Torch tensors run through the custom op
    ``torch.ops.crisp.prefill`` (CUDA tensors on ``torch.cuda.current_stream()``; works under
    ``torch.compile(fullgraph=True)``); numpy arrays run on the CPU backend.
    ``cu_seqlens`` (varlen only) is read on the host: a CUDA tensor is copied back, which
    synchronises; pass a CPU tensor or a list to avoid that.
    Bad input raises TypeError / ValueError (``crisp.Error``, a ValueError, for what the library
    rejects) naming the argument and what was expected.
    """
    policy = _policy_name(policy)
    settings = settings_from_params(params)
    if _is_torch(q):
        _check_inputs(q, k, v, cu_seqlens)  # Python errors before the dispatcher's own
        if cu_seqlens is not None and not _is_torch(cu_seqlens):
            cu_seqlens = torch.tensor(_seqlens_list(cu_seqlens, q.shape[0]), dtype=torch.int64)
        return torch.ops.crisp.prefill(q, k, v, cu_seqlens, policy, ";".join(settings))
    return _run_prefill(q, k, v, cu_seqlens, policy, settings)


def plan(q, k, policy: str = "crisp", cu_seqlens=None, **params) -> Plan:
    """The plan crisp would run for these inputs (route, statistics, block CSR per sequence and
    query head), as a crisp.Plan of numpy arrays. CUDA tensors are planned on the GPU (on the
    current stream, which is synchronised), CPU tensors / numpy arrays on the CPU."""
    config = _C.Config(_policy_name(policy), settings_from_params(params))
    layout, (q, k, _), (qv, kv, _), cu = _prepare(q, k, k, cu_seqlens)
    if _is_torch(q) and q.device.type == "cuda":
        with torch.cuda.device(q.device):
            native = _C.plan(qv, kv, config, cu, 0, "f32", _stream(q))
    else:
        native = _C.plan(qv, kv, config, cu, _num_threads(q), _precision(q), 0)
    return Plan.from_native(native)


def gqa_union(plan: Plan) -> Plan:
    """Spec §10: the plan a kernel runs when it packs each GQA group into one tile (the Hopper
    kernel with gqa_packing="pack", crisp.Attention): every query head's layout replaced by the union of its
    group's layouts. Its ``density`` is what such a kernel computes."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: got {type(plan).__name__}; expected a crisp.Plan (from crisp.plan)")
    return Plan.from_native(_C.gqa_union(plan.native))


def attend(q, k, v, plan: Plan):
    """Block-sparse attention following a given plan (e.g. one made on the other backend).
    Same layouts and outputs as prefill; the plan must match the shapes."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: got {type(plan).__name__}; expected a crisp.Plan (from crisp.plan)")
    # Batched inputs carry their sequence offsets in the shape; varlen ones take the plan's.
    cu_seqlens = None if getattr(q, "ndim", 0) == 4 else plan.cu_seqlens
    layout, (q, k, v), (qv, kv, vv), cu = _prepare(q, k, v, cu_seqlens)
    out, lse = _allocate_outputs(q, layout)
    ov, lv = _output_views(out, lse, layout)
    if _is_torch(q) and q.device.type == "cuda":
        with torch.cuda.device(q.device):  # synchronous: uploads the plan, runs, syncs the stream
            _C.attend(qv, kv, vv, plan.native, ov, lv, 0, "f32", _stream(q))
    else:
        _C.attend(qv, kv, vv, plan.native, ov, lv, _num_threads(q), _precision(q), 0)
    return out, lse
