"""crisp.prefill / crisp.plan / crisp.attend for torch tensors (CUDA or CPU) and numpy arrays (CPU).

Layouts (one for q, k and v), named by the ``layout`` argument:
  * ``"bhsd"``: ``[batch, heads, seq, dim]`` (SDPA's); every batch row is one causal sequence;
  * ``"bshd"``: ``[batch, seq, heads, dim]`` (flash-attn's ``flash_attn_func``);
  * ``"thd"``: varlen ``[total, heads, dim]`` with ``cu_seqlens`` = ``[0, n_0, n_0 + n_1, ..., total]``
    (flash-attn's varlen convention); without ``cu_seqlens`` one sequence of ``total`` tokens.
``layout=None`` states nothing, so it is accepted only where the shapes leave no choice: rank 3 is
``"thd"``; rank 4 is the one of ``"bhsd"`` / ``"bshd"`` that q, k and v fit (with GQA, k's head
count differs from q's and picks it). Where both fit (every rank-4 MHA input, e.g.
``torch.randn(1, 2048, 4, 64)``), ``layout`` is required: a ValueError names it.
GQA: k and v may have fewer heads than q (``Hq % Hkv == 0``; query head h reads kv head
``h // (Hq // Hkv)``).

Queries over a KV prefix (chunked prefill): a sequence's ``n_q`` queries are the last ``n_q`` of
its ``n_k`` key positions (bottom-right causal, flash-attn's convention), ``1 <= n_q <= n_k``:
batched q ``[.., n_q, ..]`` with k/v ``[.., n_k, ..]``, or varlen ``cu_seqlens_q`` /
``cu_seqlens_k``. Paged K/V: ``block_table`` with k/v the caches ``[num_pages, page_size, Hkv,
dim]`` (vLLM's, flash_attn_with_kvcache's) and ``cache_seqlens`` or ``cu_seqlens_k``; prefill's
docstring has the details. ``causal=True`` is the only attention crisp computes; ``causal=False`` is
refused.

Outputs, contiguous like SDPA's: ``out`` in q's layout and dtype; ``lse`` (natural log, float32;
float64 for float64 inputs on the CPU) is ``[batch, Hq, seq]`` or, varlen, ``[Hq, total]``.

The library sees ``[heads, tokens, dim]`` strided views: tensors are passed as raw pointers with
their strides, so nothing is copied unless a batched input cannot be expressed as one such view
(then it is copied once into a ``[batch, seq, heads, dim]`` buffer). A ``"bhsd"`` output of a
batch of more than one row is written token-major and copied once into ``[batch, heads, seq, dim]``.

crisp has no backward: gradients through it raise an error that says so.
"""
from __future__ import annotations

import atexit
import itertools
from collections import OrderedDict
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

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
    """``{"alpha": 1.5, "routing": "jsd"}`` -> ``["alpha=1.5", "routing=jsd"]`` (Config::set).
    A value of None keeps the preset's value (as flash-attn's ``softmax_scale=None``)."""
    settings = []
    for key, value in params.items():
        # A name is one setting: "alpha=1;x" would be read as two ("alpha=1", "x=...").
        if not isinstance(key, str) or not key.isascii() or not key.isidentifier():
            raise ValueError(f"{key!r}: not a parameter name; expected a plain identifier (letters, digits, '_'), "
                             "one of crisp.parameter_names()")
        if key in ("out", "lse"):
            if value is None:  # flash-attn's default: a new output, which is what crisp returns
                continue
            raise TypeError(f"{key}: output buffers are not taken; crisp returns (out, lse) as new tensors")
        if value is None:
            # None keeps the preset's value, of a name the library has (a misspelt one is not ignored).
            if key not in _C.Config.parameter_names():
                raise ValueError(f"{key}: not a parameter name; expected one of crisp.parameter_names()")
            continue
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


LAYOUTS = {"bhsd": "[batch, heads, seq, dim]", "bshd": "[batch, seq, heads, dim]",
           "thd": "[total, heads, dim] (varlen, with cu_seqlens)"}
_LAYOUT_CHOICES = ", ".join(f"{name!r} {shape}" for name, shape in LAYOUTS.items())


def _as_bhsd(x, layout: str):
    """A [batch, heads, seq, dim] view of a "bshd" input (free: a transpose); others as they are."""
    if layout != "bshd":
        return x
    return x.transpose(1, 2) if _is_torch(x) else x.transpose(0, 2, 1, 3)


def _fits_batched(q, k, v, layout: str, paged: bool = False) -> bool:
    """Whether rank-4 q, k, v are consistent shapes in `layout`: k and v of one shape whose head
    count divides q's, the same dim; contiguous K/V of q's batch with at least q's positions (the
    queries are the last of them), or a paged cache [num_pages, page_size, Hkv, dim]."""
    qb = _as_bhsd(q, layout)
    B, Hq, S, D = qb.shape
    if tuple(k.shape) != tuple(v.shape):
        return False
    if paged:
        Hkv, Dk = k.shape[2], k.shape[3]
    else:
        kb = _as_bhsd(k, layout)
        if kb.shape[0] != B or kb.shape[2] < S:
            return False
        Hkv, Dk = kb.shape[1], kb.shape[3]
    return Dk == D and Hkv > 0 and Hq % Hkv == 0


def _resolve_layout(q, k, v, layout, paged: bool = False) -> str:
    """The layout named (checked against q's rank) or, for layout=None, the only one that fits."""
    if layout is not None:
        if not isinstance(layout, str) or layout not in LAYOUTS:
            raise ValueError(f"layout: got {layout!r}; expected one of {_LAYOUT_CHOICES}")
        rank = 3 if layout == "thd" else 4
        if q.ndim != rank:
            raise ValueError(f"q: rank {q.ndim} (shape {tuple(q.shape)}) with layout={layout!r}; "
                             f"expected rank {rank}, {LAYOUTS[layout]}")
        return layout
    if q.ndim == 3:
        return "thd"
    if q.ndim != 4:
        return "bhsd"  # the rank check names the layouts
    fits = [name for name in ("bhsd", "bshd") if _fits_batched(q, k, v, name, paged)]
    if len(fits) == 1:
        return fits[0]
    if len(fits) == 2:
        raise ValueError(f"layout: q {tuple(q.shape)}, k {tuple(k.shape)} fit both 'bhsd' {LAYOUTS['bhsd']} "
                         f"and 'bshd' {LAYOUTS['bshd']}; pass layout='bhsd' or layout='bshd'")
    return "bhsd"  # fits neither: the shape checks below say what does not match


def _check_causal(causal) -> None:
    if causal is True:
        return
    if causal is False:
        raise ValueError("causal: False is not supported; crisp computes causal attention only "
                         "(expected causal=True)")
    raise TypeError(f"causal: got {type(causal).__name__} {causal!r}; expected True")


# flash-attn's and SDPA's keyword arguments, so that a call ported from flash_attn_func /
# flash_attn_varlen_func / scaled_dot_product_attention gets an answer instead of an "unknown
# parameter" (or a type error on a tensor): each is either accepted (with the value it must have)
# or refused with the reason. The value each keyword must have to be accepted (0: any number equal
# to it, numpy scalars and 0-dim tensors among them; None / False: that value):
_INERT_KEYWORDS = {
    "dropout_p": 0, "softcap": 0, "alibi_slopes": None,
    "return_attn_probs": False, "return_softmax": False, "attn_mask": None,
    # flash_attn_with_kvcache's, at their defaults: no rotary embedding applied in the kernel, the
    # cache rows in batch order, no left padding, the kernel's own split count.
    "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None, "cache_leftpad": None, "num_splits": 0,
}
_REFUSED_BECAUSE = {
    "dropout_p": "dropout is not supported (crisp is an inference kernel)",
    "softcap": "logit soft-capping is not supported",
    "alibi_slopes": "ALiBi position bias is not supported",
    "return_attn_probs": "attention probabilities are not returned (crisp.prefill returns (out, lse))",
    "return_softmax": "attention probabilities are not returned (crisp.prefill returns (out, lse))",
    "attn_mask": "an explicit mask is not supported (causal only; use cu_seqlens for a padded batch)",
    "rotary_cos": "rotary embedding inside the kernel is not supported (pass q and k after RoPE)",
    "rotary_sin": "rotary embedding inside the kernel is not supported (pass q and k after RoPE)",
    "cache_batch_idx": "a cache row index is not supported (pass the rows as a block_table of one page each)",
    "cache_leftpad": "left-padded caches are not supported (pass each row's length in cache_seqlens)",
    "num_splits": "a split count is not taken (crisp schedules its own work)",
}


def _window_of(window_size) -> int:
    """flash-attn's ``window_size=(left, right)`` as crisp's ``window`` (spec §12): a causal query at
    p sees the keys p - left .. p, i.e. ``window = left + 1``; left -1 is no window (0). right must
    be -1 or 0 (causal attention sees no key after the query)."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or
            any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in window_size)):
        raise TypeError(f"window_size: got {window_size!r}; expected (left, right) ints, as flash-attn's")
    left, right = (int(x) for x in window_size)
    if right not in (-1, 0) or left < -1:
        raise ValueError(f"window_size: {window_size!r}: crisp's sliding window is causal; expected (left, 0) or "
                         "(left, -1) with left >= 0, or (-1, -1) for none")
    return 0 if left == -1 else left + 1


def _is_neutral(value, neutral) -> bool:
    """Whether a foreign keyword's value is its neutral one (_INERT_KEYWORDS): None / False as
    themselves (False also as numpy's bool), 0 as any real number equal to it (not a bool)."""
    if value is neutral:
        return True
    if neutral is None:
        return False
    if isinstance(neutral, bool):
        return isinstance(value, np.bool_) and bool(value) is neutral
    if _is_torch(value):  # a 0-dim real tensor (read on the host)
        if value.ndim != 0 or value.dtype == torch.bool or value.is_complex() or value.device.type == "meta":
            return False
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return value == neutral


def _take_foreign_keywords(params: Dict[str, Any], causal):
    """Removes flash-attn / SDPA keywords from ``params``; returns causal."""
    if "window_size" in params:  # flash-attn's spelling of a sliding window
        window = _window_of(params.pop("window_size"))
        if params.get("window") is not None:
            raise ValueError("window, window_size: both given; expected one of them")
        if window > 0:
            params["window"] = window
    for name in list(params):
        if name not in _INERT_KEYWORDS:
            continue
        value = params.pop(name)
        if not _is_neutral(value, _INERT_KEYWORDS[name]):
            raise ValueError(f"{name}: {value!r}: {_REFUSED_BECAUSE[name]}; expected {_INERT_KEYWORDS[name]!r}")
    if "is_causal" in params:  # SDPA's spelling
        is_causal = params.pop("is_causal")
        if causal is not True:  # causal given (True is its default): two answers to one question
            raise ValueError(f"causal, is_causal: both given (causal={causal!r}, is_causal={is_causal!r}); "
                             "expected one of them")
        if is_causal is not True:  # named as the caller spelt it
            if is_causal is False:
                raise ValueError("is_causal: False is not supported; crisp computes causal attention only "
                                 "(expected is_causal=True)")
            raise TypeError(f"is_causal: got {type(is_causal).__name__} {is_causal!r}; expected True")
        causal = is_causal
    if "scale" in params:  # SDPA's spelling of softmax_scale
        if params.get("softmax_scale") is not None:
            raise ValueError("scale, softmax_scale: both given; expected one of them")
        scale = params.pop("scale")
        # SDPA's scale=0.0 is a zero scale (uniform weights); crisp's softmax_scale=0 means 1/sqrt(d).
        if scale is not None and not isinstance(scale, bool) and isinstance(scale, (int, float, np.integer, np.floating)) \
                and scale == 0:
            raise ValueError("scale: 0 (SDPA's zero scale, uniform weights) is not supported; expected a scale > 0, "
                             "or None for 1/sqrt(d)")
        params["softmax_scale"] = scale
    enable_gqa = params.pop("enable_gqa", True)
    if enable_gqa is not True:
        raise ValueError(f"enable_gqa: {enable_gqa!r}; expected True (crisp always reads k/v with fewer heads as GQA)")
    deterministic = params.pop("deterministic", None)  # crisp's results do not depend on scheduling
    if deterministic is not None and not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: got {type(deterministic).__name__} {deterministic!r}; expected a bool")
    for name in ("max_seqlen_q", "max_seqlen_k"):  # flash-attn needs them; crisp reads cu_seqlens
        value = params.pop(name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
            raise TypeError(f"{name}: got {value!r}; expected a non-negative int")
    return causal


_NO_BACKWARD = ("crisp's attention has no backward; use it for inference (under torch.no_grad() or "
                "torch.inference_mode())")


def _check_no_grad(function: str, *tensors) -> None:
    """For calls outside the custom op (attend): an output that silently carries no gradient would
    train nothing, so inputs that require one are refused while grad mode is on."""
    if torch is not None and torch.is_grad_enabled():
        for name, x in zip(("q", "k", "v"), tensors):
            if _is_torch(x) and x.requires_grad:
                raise RuntimeError(f"crisp.{function}: {name} requires grad: {_NO_BACKWARD}")


_PAGED_CACHE = "the paged cache [num_pages, page_size, Hkv, dim] (flash_attn_with_kvcache's layout)"

def _tokens(x, layout: str, paged_cache: bool = False) -> int:
    """The tokens the library sees in q / k: [total, ...], [batch, seq] rows, or pages x page size
    (sizes as given: under torch.compile a symbolic size stays one, guarded by the check, not
    specialised)."""
    if paged_cache:
        return x.shape[0] * x.shape[1]
    if x.ndim == 3:
        return x.shape[0]
    xb = _as_bhsd(x, layout)
    return xb.shape[0] * xb.shape[2]


def _check_strided(name: str, x) -> None:
    """A torch tensor the library can read through a pointer and strides (not sparse, not nested)."""
    nested = getattr(x, "is_nested", False)
    if x.layout != torch.strided or nested:
        raise TypeError(f"{name}: a {'nested ' if nested else ''}tensor of layout {x.layout}; expected a dense "
                        "tensor (torch.strided; call .to_dense())")


def _check_inputs(q, k, v, varlen_argument: Optional[str], layout=None, paged: bool = False) -> str:
    """Type/rank/layout checks shared by the real and the fake (meta) implementation.
    ``varlen_argument``: the name of a cu_seqlens argument given, if any (refused with a batched
    layout); ``paged``: k and v are paged caches (a block table is given).
    Returns the layout of q: "bhsd", "bshd" or "thd"."""
    kinds = {_kind("q", q), _kind("k", k), _kind("v", v)}
    if len(kinds) != 1:
        raise TypeError("q, k, v: mixed torch tensors and numpy arrays; expected all three of one kind")
    if _is_torch(q):
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_strided(name, x)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"k, v: dtypes {k.dtype} / {v.dtype} differ from q's {q.dtype}; expected one dtype for q, k, v")
    _dtype_name("q", q)
    if _is_torch(q):
        if k.device != q.device or v.device != q.device:
            raise ValueError(f"k, v: on {k.device} / {v.device} but q is on {q.device}; expected one device")
        if q.device.type not in ("cpu", "cuda"):
            raise ValueError(f"q: on {q.device}; expected a cpu or cuda tensor")
    if paged:
        for name, x in (("k", k), ("v", v)):
            if x.ndim != 4:
                raise ValueError(f"{name}: rank {x.ndim} (shape {tuple(x.shape)}) with block_table; expected {_PAGED_CACHE}")
        if tuple(v.shape) != tuple(k.shape):
            raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; expected one cache shape")
    elif q.ndim != k.ndim or q.ndim != v.ndim:
        raise ValueError(f"k, v: ranks {k.ndim} / {v.ndim} differ from q's {q.ndim}; expected one layout for q, k, v")
    layout = _resolve_layout(q, k, v, layout, paged)
    if layout != "thd" and varlen_argument is not None:
        raise ValueError(f"{varlen_argument}: given with the batched layout {layout!r} {LAYOUTS[layout]}; "
                         f"expected {varlen_argument} only with layout='thd' {LAYOUTS['thd']}")
    if layout == "thd":
        T, Hq, D = q.shape
    elif q.ndim == 4:
        B, Hq, S, D = _as_bhsd(q, layout).shape
        if B < 1 or S < 1:
            raise ValueError(f"q: shape {tuple(q.shape)} is empty; expected batch >= 1 and seq >= 1")
    else:
        raise ValueError(f"q: rank {q.ndim} (shape {tuple(q.shape)}); expected one of the layouts {_LAYOUT_CHOICES}")
    # The library's token bound (crisp/limits.h), checked before any buffer is allocated (a
    # stride-0 input can claim more tokens than memory holds).
    for name, x in (("q", q), ("k", k)):
        tokens = _tokens(x, layout, paged and name == "k")
        if tokens > _C.MAX_TOKENS:
            raise _C.Error(f"{name}: has {tokens} tokens; expected at most {_C.MAX_TOKENS} per call "
                           "(plans index tokens with int32)")
    if paged:
        if k.shape[3] != D:
            raise ValueError(f"k: shape {tuple(k.shape)} has dim {k.shape[3]} but q {tuple(q.shape)} has {D}; "
                             f"expected {_PAGED_CACHE} with dim={D}")
        if k.shape[1] % 16 != 0 or k.shape[1] == 0:
            raise ValueError(f"k: page size {k.shape[1]} (shape {tuple(k.shape)}); expected a multiple of 16 "
                             f"positions per page in {_PAGED_CACHE}")
        return layout
    if layout == "thd":
        for name, x in (("k", k), ("v", v)):
            if x.shape[2] != D:
                raise ValueError(f"{name}: shape {tuple(x.shape)} does not match q's {tuple(q.shape)}; "
                                 f"expected [total_k, Hkv, dim={D}]")
        if tuple(k.shape) != tuple(v.shape):
            raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; expected the same shape")
        return layout
    qb, kb, vb = (_as_bhsd(x, layout) for x in (q, k, v))
    where = {"bhsd": f"[batch={B}, Hkv, seq>={S}, dim={D}]", "bshd": f"[batch={B}, seq>={S}, Hkv, dim={D}]"}[layout]
    for name, x in (("k", kb), ("v", vb)):
        if x.shape[0] != B or x.shape[2] < S or x.shape[3] != D:
            raise ValueError(f"{name}: shape {tuple(_as_bhsd(x, layout).shape)} does not match q's "
                             f"{tuple(q.shape)} in layout {layout!r}; expected {where} (the queries are the "
                             "last of the key positions)")
    if tuple(kb.shape) != tuple(vb.shape):
        raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}; expected the same shape")
    return layout


_INT64_MAX = 2 ** 63 - 1  # the library takes offsets as int64 (and a list as std::vector<int64_t>)


def _check_int64(name: str, values: List[int]) -> List[int]:
    for x in values:
        if not -_INT64_MAX - 1 <= x <= _INT64_MAX:
            raise ValueError(f"{name}: value {x} is beyond int64; expected offsets / lengths below 2^63 "
                             f"(and at most {_C.MAX_TOKENS} tokens in all)")
    return values


def _values_readable(t) -> bool:
    """Whether a tensor's values may be read on the host here: not while torch.compile traces the
    call (the custom op reads them instead, so the graph has no host read), not for a fake tensor."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
        return False
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover (older torch)
        return True
    return not isinstance(t, FakeTensor)


def _offsets(cu_seqlens, name: str = "cu_seqlens", device=None):
    """Offsets or lengths as given, checked for type and rank: a torch tensor stays one (its values
    are read inside the custom op, so torch.compile traces no host read), anything else becomes a
    list of ints. None stays None. ``device``: q's torch device, where a tensor may be besides the
    CPU (None: numpy inputs, CPU tensors only)."""
    if cu_seqlens is None:
        return None
    if _is_torch(cu_seqlens):
        _check_strided(name, cu_seqlens)
        if cu_seqlens.ndim != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: a {cu_seqlens.dtype} tensor of rank {cu_seqlens.ndim}; "
                            "expected a rank-1 int32/int64 tensor")
        if cu_seqlens.device.type != "cpu" and cu_seqlens.device != device:
            where = "the CPU" if device is None or device.type == "cpu" else f"the CPU or q's device ({device})"
            raise ValueError(f"{name}: a tensor on {cu_seqlens.device}, whose values cannot be read; expected "
                             f"a tensor on {where}, or a list of ints")
        return cu_seqlens
    if isinstance(cu_seqlens, np.ndarray):
        if cu_seqlens.ndim != 1 or not np.issubdtype(cu_seqlens.dtype, np.integer):
            raise TypeError(f"{name}: expected a rank-1 integer array")
        return _check_int64(name, [int(x) for x in cu_seqlens])
    if isinstance(cu_seqlens, (list, tuple)) and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                   for x in cu_seqlens):
        return _check_int64(name, [int(x) for x in cu_seqlens])
    raise TypeError(f"{name}: got {type(cu_seqlens).__name__}; expected a list of ints or a rank-1 integer tensor")


def _seqlens_list(cu) -> Optional[List[int]]:
    """Checked offsets (_offsets) as a list of ints (a tensor's values read; None stays None)."""
    return [int(x) for x in cu.tolist()] if _is_torch(cu) else cu


def _key_offsets(cache_seqlens, num_sequences: int, device=None):
    """(cu_seqlens_k, lengths) from flash_attn_with_kvcache's cache_seqlens (an int, or one key
    count per sequence): a tensor stays a tensor. ``lengths``: the key counts as a list of ints,
    checked; None for a tensor whose values are not read here (_values_readable: the library
    checks them, as batch.cu_seqlens_k)."""
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        cache_seqlens = [int(cache_seqlens)] * num_sequences
    lengths = _offsets(cache_seqlens, "cache_seqlens", device)
    if len(lengths) != num_sequences:
        raise ValueError(f"cache_seqlens: {len(lengths)} lengths for {num_sequences} sequences; "
                         "expected one key count per sequence")
    tensor = lengths if _is_torch(lengths) else None
    if tensor is not None:
        if not _values_readable(tensor):
            return torch.cat([tensor.new_zeros(1), tensor.cumsum(0)]).to(torch.int64), None
        lengths = [int(x) for x in tensor.tolist()]
    if any(n < 1 for n in lengths):
        shown = lengths if len(lengths) <= 16 else f"{lengths[:16]} ..."
        raise ValueError(f"cache_seqlens: {shown}; expected every sequence to have at least one key")
    cu_k = _check_int64("cache_seqlens", [0] + list(itertools.accumulate(lengths)))  # no int64 wrap below
    if tensor is not None:
        return torch.cat([tensor.new_zeros(1), tensor.cumsum(0)]).to(torch.int64), lengths
    return cu_k, lengths


def _table_of_list(rows) -> np.ndarray:
    """A block table given as a list of rows of page ids, as an int32 array (its values checked:
    integers, not bools, in int32's range; a float is not truncated to a page id)."""
    # The values as given (dtype=object): np.array(rows) reads the True of [[0, True]] as page 1.
    try:
        array = np.array(rows, dtype=object)
        values = array.ravel().tolist()
    except (ValueError, TypeError):  # rows numpy cannot lay out: _refuse_table says why
        _refuse_table(rows, None)
    for x in values:  # one scan; any doubt and _refuse_table names what is wrong
        if not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_)) or not -2 ** 31 <= int(x) < 2 ** 31:
            _refuse_table(rows, values)
    return np.array(values, dtype=np.int32).reshape(array.shape)  # empty: the shape check says what is missing


def _refuse_table(rows, values: Optional[List[Any]]) -> NoReturn:
    """Raises the error for a list block table that _table_of_list found a bad value in (``values``:
    its values as given, None where numpy could not lay them out): ragged rows, a dtype other than
    integers (floats, bools, strings), a value that is not an int (a bool among ints, an object),
    or a page id beyond int32."""
    expected = "a rectangular list [num_sequences][max_pages] of int page ids"
    try:
        array = np.array(rows)
    except (ValueError, TypeError) as e:  # ragged rows
        raise ValueError(f"block_table: not a rectangular list ({e}); expected {expected}") from None
    if array.dtype == np.bool_ or not (array.dtype == object or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"block_table: holds {array.dtype} values; expected {expected} (a float is not a page id)")
    if values is None:
        values = array.ravel().tolist()
    for x in values:  # ints beyond int64, mixed types, or a bool among ints (np.array reads it as 0 / 1)
        if not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_)):
            raise TypeError(f"block_table: holds {type(x).__name__} {x!r}; expected {expected}")
    for x in values:
        if not -2 ** 31 <= int(x) < 2 ** 31:
            raise ValueError(f"block_table: page id {x} does not fit int32; expected page ids in [0, 2^31)")
    raise TypeError(f"block_table: not int page ids; expected {expected}")  # pragma: no cover (found above)


def _check_block_table(block_table, q, num_sequences: int):
    """flash-attn's block_table: int32 [num_sequences, max_pages] page ids, on q's device. Returns
    it row-major (a copy only when it is not)."""
    if _is_torch(q):
        if not _is_torch(block_table):
            raise TypeError(f"block_table: got {type(block_table).__name__}; expected an int32 torch.Tensor "
                            "[num_sequences, max_pages] on q's device")
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table: dtype {block_table.dtype}; expected torch.int32 page ids")
        if block_table.device != q.device:
            raise ValueError(f"block_table: on {block_table.device} but q is on {q.device}; expected q's device")
        _check_strided("block_table", block_table)
    else:
        if isinstance(block_table, (list, tuple)):
            block_table = _table_of_list(block_table)
        if not isinstance(block_table, np.ndarray):
            raise TypeError(f"block_table: got {type(block_table).__name__}; expected an int32 numpy array "
                            "[num_sequences, max_pages]")
        if block_table.dtype != np.int32:
            raise TypeError(f"block_table: dtype {block_table.dtype}; expected int32 page ids")
    if block_table.ndim != 2 or block_table.shape[0] != num_sequences or block_table.shape[1] < 1:
        raise ValueError(f"block_table: shape {tuple(block_table.shape)}; expected [num_sequences={num_sequences}, "
                         "max_pages >= 1] page ids")
    return _contiguous(block_table)


class _Call:
    """One call's arguments resolved: q's layout and the sequences as crisp::Batch takes them.
    ``cu_q`` / ``cu_k``: None for "from the shapes" (a batched layout, or one thd sequence);
    ``table``: a row-major int32 block table, or None for contiguous K/V; ``rows_as_pages``: k, v
    are contiguous batched caches read through a table of one page per batch row (cache_seqlens),
    else (with a table) paged caches [num_pages, page_size, Hkv, dim]."""

    def __init__(self, layout: str, cu_q: Optional[List[int]], cu_k: Optional[List[int]], table=None,
                 rows_as_pages: bool = False):
        self.layout, self.cu_q, self.cu_k, self.table, self.rows_as_pages = layout, cu_q, cu_k, table, rows_as_pages

    @property
    def paged(self) -> bool:
        return self.table is not None

    @property
    def paged_cache(self) -> bool:
        """Whether the caller's k, v are paged caches (the shape checks' view of them)."""
        return self.paged and not self.rows_as_pages


def _rows_as_pages(x, layout: str):
    """A contiguous batched cache as the page pool [batch, seq_cache, Hkv, dim] (one page per row)."""
    x = _as_bhsd(x, layout)
    return x.transpose(1, 2) if _is_torch(x) else x.transpose(0, 2, 1, 3)


def _resolve_call(q, k, v, layout, cu_seqlens=None, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None,
                  cache_seqlens=None, keys_resolved: Optional[str] = None):
    """Checks the arguments; returns the _Call. The checks of crisp.prefill / plan / attend /
    Attention and of torch.ops.crisp.prefill. ``keys_resolved`` (the name errors give them):
    ``cu_seqlens_k`` are key offsets already resolved (the custom op's, which takes crisp.prefill's
    _Call, and a plan's in attend): the keys of the sequences however the caller gave them
    (cu_seqlens_k, or cache_seqlens: then also for one thd sequence without cu_seqlens, or with a
    batched layout for a paged cache)."""
    if cu_seqlens is not None and cu_seqlens_q is not None:
        raise ValueError("cu_seqlens, cu_seqlens_q: both given; expected one of them")
    if cu_seqlens_k is not None and cache_seqlens is not None:
        raise ValueError("cu_seqlens_k, cache_seqlens: both given; expected one of them (the key count of each sequence)")
    device = q.device if _is_torch(q) else None
    q_name = "cu_seqlens_q" if cu_seqlens_q is not None else "cu_seqlens"
    cu_q = _offsets(cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens, q_name, device)
    cu_k = _offsets(cu_seqlens_k, "cu_seqlens_k", device)
    key_offsets = None  # keys_resolved: the key offsets
    if keys_resolved is not None:
        key_offsets, cu_k = cu_k, None
    paged = block_table is not None
    varlen = [(q_name, cu_q), ("cu_seqlens_k", cu_k), (keys_resolved, None if paged else key_offsets)]
    varlen_argument = ", ".join(n for n, x in varlen if x is not None) or None
    layout = _check_inputs(q, k, v, varlen_argument, layout, paged)
    if layout == "thd":
        if cu_k is not None and cu_q is None:
            raise ValueError("cu_seqlens_q, cu_seqlens_k: only cu_seqlens_k given; expected both (or cu_seqlens)")
        if cu_q is not None and cu_seqlens_q is not None and cu_k is None and cache_seqlens is None and not paged:
            raise ValueError("cu_seqlens_q, cu_seqlens_k: only cu_seqlens_q given; expected both (or cu_seqlens)")
        num_sequences = len(cu_q) - 1 if cu_q is not None and len(cu_q) > 1 else 1
    else:
        num_sequences = q.shape[0]
    lengths = None  # cache_seqlens's key counts, where read
    if cache_seqlens is not None:
        cu_k, lengths = _key_offsets(cache_seqlens, num_sequences, device)
    elif key_offsets is not None:
        if len(key_offsets) != num_sequences + 1:
            source = "the query offsets give" if layout == "thd" and cu_q is not None else "q has"
            raise ValueError(f"{keys_resolved}: {len(key_offsets)} key offsets, but {source} {num_sequences} "
                             f"sequence(s); expected {num_sequences + 1} offsets, one sequence's keys each")
        cu_k = key_offsets
    if paged:
        if cu_k is None:
            raise ValueError("block_table: given without the key counts; expected " +
                             (f"{keys_resolved} (the key offsets of the sequences)" if keys_resolved else
                              "cache_seqlens (or cu_seqlens_k with layout='thd')"))
        return _Call(layout, cu_q, cu_k, _check_block_table(block_table, q, num_sequences))
    if cache_seqlens is not None and layout != "thd":
        # Contiguous [batch, seq_cache, ...] caches whose rows hold cache_seqlens[b] keys each: the
        # pool of one page per row (the library reads a page's first keys only).
        seq_cache = _as_bhsd(k, layout).shape[2]
        if seq_cache % 16 != 0:
            raise ValueError(f"cache_seqlens: with a contiguous k of {seq_cache} positions per batch row; expected "
                             "a multiple of 16 positions per row, or a block_table")
        if lengths is not None and max(lengths) > seq_cache:  # None: a tensor under torch.compile
            shown = lengths if len(lengths) <= 16 else f"{lengths[:16]} ..."
            raise ValueError(f"cache_seqlens: {shown} exceed the {seq_cache} positions of k; "
                             "expected at most the cache's length")
        rows = np.arange(num_sequences, dtype=np.int32)[:, None]
        table = torch.from_numpy(rows).to(q.device) if _is_torch(q) else rows
        return _Call(layout, None, cu_k, table, rows_as_pages=True)
    return _Call(layout, cu_q, cu_k)


def _sequences(q, k, call: _Call) -> Tuple[List[int], List[int]]:
    """(cu_seqlens_q, cu_seqlens_k) for crisp::Batch; empty lists mean one whole prompt."""
    if call.layout == "thd":
        cu_q = call.cu_q if call.cu_q is not None else []
        if call.cu_k is not None:
            return (cu_q or [0, q.shape[0]]), call.cu_k
        if not cu_q and k.shape[0] != q.shape[0]:  # one sequence: queries over a longer K/V
            return [0, q.shape[0]], [0, k.shape[0]]
        return cu_q, []
    B, _, S, _ = _as_bhsd(q, call.layout).shape
    cu_q = [b * S for b in range(B + 1)]
    if call.paged:
        return cu_q, call.cu_k
    S_k = _as_bhsd(k, call.layout).shape[2]
    if S_k == S:
        return (cu_q if B > 1 else []), []
    return cu_q, [b * S_k for b in range(B + 1)]


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
    """The library's [heads, tokens, dim] view of a [B, H, S, D] (token-major) or [T, H, D] input."""
    st = _strides(x)
    if layout == "thd":
        T, H, D = x.shape
        return _view(name, x, (H, T, D), (st[1], st[0], st[2]))
    B, H, S, D = x.shape
    return _view(name, x, (H, B * S, D), (st[1], st[2], st[3]))


def _empty(like, shape, dtype_torch=None, dtype_numpy=None):
    if _is_torch(like):
        return torch.empty(shape, dtype=dtype_torch, device=like.device)
    return np.empty(shape, dtype=dtype_numpy)


def _lse_dtypes(q):
    if _is_torch(q):
        return (torch.float64 if q.dtype == torch.float64 else torch.float32), None
    return None, (np.float64 if np.dtype(q.dtype) == np.float64 else np.float32)


def _contiguous(x):
    return x.contiguous() if _is_torch(x) else np.ascontiguousarray(x)


def _output_buffers(q, layout: str):
    """(out, lse) buffers the library writes through one [H, tokens, dim] / [H, tokens] view each:
    out is [T, H, D] (thd), [1, H, S, D] (bhsd, one row) or token-major [B, S, H, D]; lse [H, tokens].
    Depends only on q's shape/dtype/device, so the fake implementation makes the same tensors."""
    lse_t, lse_n = _lse_dtypes(q)
    if layout == "thd":
        T, H, D = q.shape
        return _empty(q, (T, H, D), q.dtype, q.dtype), _empty(q, (H, T), lse_t, lse_n)
    B, H, S, D = _as_bhsd(q, layout).shape
    shape = (1, H, S, D) if layout == "bhsd" and B == 1 else (B, S, H, D)
    return _empty(q, shape, q.dtype, q.dtype), _empty(q, (H, B * S), lse_t, lse_n)


def _output_views(out, lse, layout: str):
    so = _strides(out)
    if layout == "thd":
        T, H, D = out.shape
        return _view("out", out, (H, T, D), (so[1], so[0], so[2])), _view("lse", lse, (H, T), _strides(lse))
    H, tokens = lse.shape
    if layout == "bhsd" and out.shape[0] == 1:  # [1, H, S, D]
        out_view = _view("out", out, (H, tokens, out.shape[3]), (so[1], so[2], so[3]))
    else:  # [B, S, H, D]
        out_view = _view("out", out, (H, tokens, out.shape[3]), (so[2], so[1], so[3]))
    return out_view, _view("lse", lse, (H, tokens), _strides(lse))


def _caller_outputs(out, lse, layout: str):
    """The buffers as returned, contiguous like SDPA's: out in the caller's layout, lse [B, H, S]
    (batched) or [H, T] (thd)."""
    if layout == "thd":
        return out, lse
    H = lse.shape[0]
    B = out.shape[0]
    lse = lse.reshape(H, B, -1)
    lse = _contiguous(lse.permute(1, 0, 2) if _is_torch(lse) else lse.transpose(1, 0, 2))
    if layout == "bhsd" and B > 1:  # token-major buffer -> [B, H, S, D]
        out = _contiguous(out.transpose(1, 2) if _is_torch(out) else out.transpose(0, 2, 1, 3))
    return out, lse


def _page_pool_view(name: str, x):
    """The library's [Hkv, num_pages * page_size, dim] view of a paged cache [num_pages,
    page_size, Hkv, dim] (copied once if its pages are not evenly spaced)."""
    num_pages, page_size, H, D = x.shape
    if num_pages > 1 and _strides(x)[0] != page_size * _strides(x)[1]:
        x = _contiguous(x)
    st = _strides(x)
    return x, _view(name, x, (H, num_pages * page_size, D), (st[2], st[1], st[3]))


class _Prepared:
    """What the library is called with: the views of q, k, v (and the token-major copies or
    caches they point into, which must outlive the call), the batch and its block table."""

    def __init__(self, q, k, v, call: _Call):
        cu_q, cu_k = _sequences(q, k, _Call(call.layout, _seqlens_list(call.cu_q), _seqlens_list(call.cu_k),
                                            call.table, call.rows_as_pages))
        if call.rows_as_pages:
            k, v = _rows_as_pages(k, call.layout), _rows_as_pages(v, call.layout)
        if call.layout != "thd":
            q = _token_major(_as_bhsd(q, call.layout))
            if not call.paged:
                k, v = (_token_major(_as_bhsd(x, call.layout)) for x in (k, v))
        self.q_view = _heads_tokens_view("q", q, call.layout)
        if call.paged:
            (k, self.k_view), (v, self.v_view) = _page_pool_view("k", k), _page_pool_view("v", v)
            self.table = _C.BlockTable(_data_ptr(call.table), _device_name(call.table), call.table.shape[1], k.shape[1])
        else:
            self.k_view, self.v_view = _heads_tokens_view("k", k, call.layout), _heads_tokens_view("v", v, call.layout)
            self.table = _C.BlockTable()
        self.keep_alive = (q, k, v, call.table)
        self.cu_q, self.cu_k = cu_q, cu_k
        self.whole_prompts = not call.paged and (not cu_k or cu_k == cu_q)


def _split(prep: _Prepared) -> Tuple[List[int], List[int]]:
    """A prepared call's sequences spelled out: (cu_seqlens_q, cu_seqlens_k), as a Plan's."""
    cu_q = list(prep.cu_q) or [0, prep.q_view.shape[1]]
    return cu_q, list(prep.cu_k) or cu_q


def _describe_split(cu_q: Sequence[int], cu_k: Sequence[int]) -> str:
    pairs = [(b - a, d - c) for a, b, c, d in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]
    shown = ", ".join(f"({n_q}, {n_k})" for n_q, n_k in pairs[:8]) + (", ..." if len(pairs) > 8 else "")
    return f"{len(cu_q) - 1} sequence{'s' if len(cu_q) != 2 else ''} of (queries, keys) [{shown}]"


def _check_planned_sequences(planned: Tuple[Sequence[int], Sequence[int]], split: Tuple[List[int], List[int]],
                             given: str) -> None:
    """A plan runs only on inputs of its sequences: the same queries and keys of each (a plan of
    one 200-token sequence is not the plan of a batch of two 100-token rows, though the totals
    agree)."""
    plan_q, plan_k = (list(x) for x in planned)
    if (plan_q, plan_k) != (list(split[0]), list(split[1])):
        raise _C.Error(f"plan: made for {_describe_split(plan_q, plan_k)}, but {given} give "
                       f"{_describe_split(*split)}; expected inputs of the planned sequences (or a plan of these)")


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
    # The block size the DevicePlan resolves to (Config.for_keys: short prompts plan at 64).
    block_size = config.for_keys(max(b - a for a, b in zip(cu, cu[1:]))).block_size
    key = (q.device.index, stream, hq, hkv, d, tuple(cu), block_size)
    entry = _device_plans.get(key)
    if entry is not None:
        _device_plans.move_to_end(key)
        return entry[0]
    nbytes = _C.DevicePlan.bytes_required(hq, cu, block_size)
    alignment = 256  # DevicePlan's workspace alignment (crisp/cuda.h)
    workspace = torch.empty(nbytes + alignment, dtype=torch.uint8, device=q.device)
    offset = (-workspace.data_ptr()) % alignment
    dplan = _C.DevicePlan(hq, hkv, d, cu, config, workspace.data_ptr() + offset, nbytes)
    _device_plans[key] = (dplan, workspace)
    while len(_device_plans) > _DEVICE_PLAN_CACHE_SIZE:
        _device_plans.popitem(last=False)
    return dplan


def _run_prefill(q, k, v, call: _Call, policy: str, settings: List[str]):
    """The real implementation: returns (out, lse) in the caller's layout."""
    config = _C.Config(_policy_name(policy), list(settings))
    prep = _Prepared(q, k, v, call)
    out, lse = _output_buffers(q, call.layout)
    ov, lv = _output_views(out, lse, call.layout)
    qv, kv, vv = prep.q_view, prep.k_view, prep.v_view
    if _is_torch(q) and q.device.type == "cuda":
        stream = _stream(q)
        with torch.cuda.device(q.device):
            if prep.whole_prompts:
                full_cu = prep.cu_q if prep.cu_q else [0, qv.shape[1]]
                dplan = _device_plan(q, qv.shape[0], kv.shape[0], qv.shape[2], full_cu, config, stream)
                dplan.plan_async(qv, kv, config, stream)
                dplan.attend_async(qv, kv, vv, ov, lv, stream)
            else:  # chunks and pages: the synchronous library call on this stream
                _C.prefill(qv, kv, vv, config, ov, lv, prep.cu_q, prep.cu_k, prep.table, 0, "f32", stream)
    else:
        _C.prefill(qv, kv, vv, config, ov, lv, prep.cu_q, prep.cu_k, prep.table, _num_threads(q), _precision(q), 0)
    return _caller_outputs(out, lse, call.layout)


# ---------------------------------------------------------------- torch custom op
if torch is not None:

    @torch.library.custom_op("crisp::prefill", mutates_args=())
    def _prefill_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                    policy: str, settings: str, layout: str, cu_seqlens_k: Optional[torch.Tensor] = None,
                    block_table: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        # settings: "key=value" pairs joined by ';' (a custom op takes no list of str).
        # cu_seqlens: the query offsets (cu_seqlens_q); cu_seqlens_k: the key offsets (None: the
        # queries' positions, or a batched layout's shapes; with a batched layout only for paged
        # caches); block_table: k, v are paged caches.
        # The checks of crisp.prefill (a direct call of the op gets the same answers).
        call = _resolve_call(q, k, v, layout, cu_seqlens, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                             keys_resolved="cu_seqlens_k")
        return _run_prefill(q, k, v, call, policy, settings.split(";") if settings else [])

    @_prefill_op.register_fake
    def _prefill_fake(q, k, v, cu_seqlens, policy, settings, layout, cu_seqlens_k=None, block_table=None):
        # The real implementation's checks (they read no tensor's values): also what a call with a
        # meta tensor among real ones dispatches to, which must not return unwritten outputs.
        call = _resolve_call(q, k, v, layout, cu_seqlens, cu_seqlens_k=cu_seqlens_k, block_table=block_table,
                             keys_resolved="cu_seqlens_k")
        return _caller_outputs(*_output_buffers(q, call.layout), call.layout)

    def _prefill_backward(ctx, grad_out, grad_lse):
        raise RuntimeError(f"crisp.prefill: {_NO_BACKWARD}")

    # Without it autograd would say only "no autograd formula"; with it a forward pass under grad
    # still runs (evaluation without no_grad) and backward says what is missing.
    _prefill_op.register_autograd(_prefill_backward)


def _as_offsets_tensor(cu):
    return cu if cu is None or _is_torch(cu) else torch.tensor(cu, dtype=torch.int64)


# ---------------------------------------------------------------- public API
def prefill(q, k, v, policy: str = "crisp", cu_seqlens=None, *, layout: Optional[str] = None, causal=True,
            cu_seqlens_q=None, cu_seqlens_k=None, block_table=None, cache_seqlens=None, **params):
    """Causal block-sparse prefill attention. Returns ``(out, lse)``.

    ``layout``: ``"bhsd"``, ``"bshd"`` or ``"thd"`` (varlen, with ``cu_seqlens``); required for
    rank-4 inputs whose shapes fit both batched layouts (the module docstring has the rule).
    ``causal``: True (False is refused: crisp computes causal attention only).
    ``policy``: a preset (``"crisp"``, ``"flexprefill"``, ``"minference"``, ``"dense"``);
    ``params``: any Config parameter by its spec name (``alpha=1.5``, ``tau_proxy=0.3``,
    ``block_size=64``, ``softmax_scale=0.125``, ``window=512`` for a sliding window — the query at
    position p sees the keys (p - 512, p] only, spec §12 —, ...; None keeps the preset's value).

    Queries over a KV prefix (a chunk of a chunked prefill, flash-attn's bottom-right causal
    alignment): the ``n_q`` queries of a sequence are the LAST ``n_q`` of its ``n_k`` key positions.
    Batched: q ``[batch, n_q, ...]`` with k, v ``[batch, n_k, ...]`` (``n_q <= n_k``). Varlen
    (``"thd"``): ``cu_seqlens_q`` for the queries and ``cu_seqlens_k`` for the keys
    (``cu_seqlens`` alone: both the same); without them q ``[n_q, ...]`` over k ``[n_k, ...]`` is one
    sequence. Paged K/V (flash_attn_with_kvcache / vLLM): ``block_table`` int32
    ``[num_sequences, max_pages]`` with k, v the caches ``[num_pages, page_size, Hkv, dim]``
    (page_size a multiple of 16, pages in any order) and the key counts in ``cache_seqlens``
    (``[num_sequences]``, or an int) or ``cu_seqlens_k``. ``cache_seqlens`` with a contiguous
    batched cache ``[batch, seq_cache, Hkv, dim]`` (``seq_cache`` a multiple of 16) reads the first
    ``cache_seqlens[b]`` keys of row b.

    flash-attn's and SDPA's keywords are understood: ``max_seqlen_q`` / ``max_seqlen_k``
    (ignored), ``is_causal``, ``scale``, ``window_size=(left, 0)`` (crisp's ``window = left + 1``;
    ``(-1, -1)``: none), and the features crisp lacks (``dropout_p``, ``softcap``,
    ``alibi_slopes``, ``attn_mask``, ``return_attn_probs``) at their neutral values, refused with
    the reason otherwise.
    Torch tensors run through the custom op ``torch.ops.crisp.prefill`` (CUDA tensors on
    ``torch.cuda.current_stream()``; works under ``torch.compile(fullgraph=True)``); numpy arrays
    run on the CPU backend. The offsets and ``cache_seqlens`` are read on the host: CUDA tensors
    are copied back, which synchronises; pass CPU tensors or lists to avoid that. There is no
    backward: gradients through the outputs raise a RuntimeError saying so.
    Bad input raises TypeError / ValueError (``crisp.Error``, a ValueError, for what the library
    rejects) naming the argument and what was expected.
    """
    policy = _policy_name(policy)
    causal = _take_foreign_keywords(params, causal)
    _check_causal(causal)
    settings = settings_from_params(params)
    call = _resolve_call(q, k, v, layout, cu_seqlens, cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens)
    if call.rows_as_pages:  # the custom op takes paged caches
        k, v = _rows_as_pages(k, call.layout), _rows_as_pages(v, call.layout)
        call.rows_as_pages = False
    if _is_torch(q):  # Python errors come before the dispatcher's own
        return torch.ops.crisp.prefill(q, k, v, _as_offsets_tensor(call.cu_q), policy, ";".join(settings), call.layout,
                                       _as_offsets_tensor(call.cu_k), call.table)
    return _run_prefill(q, k, v, call, policy, settings)


def plan(q, k, policy: str = "crisp", cu_seqlens=None, *, layout: Optional[str] = None, causal=True,
         cu_seqlens_q=None, cu_seqlens_k=None, block_table=None, cache_seqlens=None, **params) -> Plan:
    """The plan crisp would run for these inputs (route, statistics, block CSR per sequence and
    query head), as a crisp.Plan of numpy arrays. CUDA tensors are planned on the GPU (on the
    current stream, which is synchronised), CPU tensors / numpy arrays on the CPU. ``layout``,
    ``causal``, the sequences (chunks, varlen, paged) and the keywords as for prefill; the plan
    records its block size and device."""
    causal = _take_foreign_keywords(params, causal)
    _check_causal(causal)
    config = _C.Config(_policy_name(policy), settings_from_params(params))
    call = _resolve_call(q, k, k, layout, cu_seqlens, cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens)
    prep = _Prepared(q, k, k, call)
    cuda = _is_torch(q) and q.device.type == "cuda"
    with (torch.cuda.device(q.device) if cuda else _NoScope()):
        native = _C.plan(prep.q_view, prep.k_view, config, prep.cu_q, prep.cu_k, prep.table,
                         0 if cuda else _num_threads(q), "f32" if cuda else _precision(q), _stream(q))
    return Plan.from_native(native, device=str(q.device) if _is_torch(q) else "cpu")


def gqa_union(plan: Plan) -> Plan:
    """Spec §10: the plan a kernel runs when it packs each GQA group into one tile (the Hopper
    kernel with gqa_packing="pack", crisp.Attention): every query head's layout replaced by the union of its
    group's layouts. Its ``density`` is what such a kernel computes."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: got {type(plan).__name__}; expected a crisp.Plan (from crisp.plan)")
    return Plan.from_native(_C.gqa_union(plan.native), device=plan.device)


def attend(q, k, v, plan: Plan, *, layout: Optional[str] = None, causal=True, block_table=None,
           cache_seqlens=None):
    """Block-sparse attention following a given plan (e.g. one made on the other backend).
    Same layouts and outputs as prefill; the plan must match the shapes and their sequences (a
    batched input's rows are its sequences: a crisp.Error naming ``plan`` otherwise). Varlen inputs
    take the plan's ``cu_seqlens`` / ``cu_seqlens_k``; paged K/V takes its ``block_table`` again
    (the plan's key counts; ``cache_seqlens``, if given, must equal them). No backward: inputs that
    require grad are refused while grad mode is on."""
    if isinstance(plan, _C.Plan):
        raise TypeError("plan: got the native crisp._C.Plan; expected the crisp.Plan that holds it (crisp.plan's "
                        "result, not its .native)")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: got {type(plan).__name__}; expected a crisp.Plan (from crisp.plan)")
    if not isinstance(plan.native, _C.Plan):
        raise TypeError("plan: a crisp.Plan without its native plan (plan.native is "
                        f"{type(plan.native).__name__}); expected one made by crisp.plan or Attention.host_plan")
    _check_causal(causal)
    _check_no_grad("attend", q, k, v)
    if plan.page_size and block_table is None and cache_seqlens is None:
        raise ValueError(f"block_table: not given, but the plan was made over paged K/V (pages of {plan.page_size}); "
                         "expected the block table (or the cache_seqlens) it was planned with")
    varlen = getattr(q, "ndim", 0) == 3
    cu_k = plan.cu_seqlens_k if (varlen or block_table is not None) and cache_seqlens is None else None
    call = _resolve_call(q, k, v, layout, cu_seqlens=plan.cu_seqlens if varlen else None, cu_seqlens_k=cu_k,
                         block_table=block_table, cache_seqlens=cache_seqlens,
                         keys_resolved=None if cu_k is None else "plan (its cu_seqlens_k)")
    prep = _Prepared(q, k, v, call)
    # The library checks the plan's shapes against the views (heads, dim, tokens in all); the
    # sequences are the plan's, which must be those the inputs split into.
    given = "q, k" + (", cache_seqlens" if cache_seqlens is not None else "")
    _check_planned_sequences((plan.cu_seqlens, plan.cu_seqlens_k), _split(prep), given)
    out, lse = _output_buffers(q, call.layout)
    ov, lv = _output_views(out, lse, call.layout)
    cuda = _is_torch(q) and q.device.type == "cuda"
    with (torch.cuda.device(q.device) if cuda else _NoScope()):  # CUDA: uploads the plan, runs, syncs the stream
        _C.attend(prep.q_view, prep.k_view, prep.v_view, plan.native, ov, lv, prep.table,
                  0 if cuda else _num_threads(q), "f32" if cuda else _precision(q), _stream(q))
    return _caller_outputs(out, lse, call.layout)


class _NoScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
