"""Hugging Face transformers integration: ``attn_implementation="crisp"``.

    import crisp.hf
    crisp.hf.register()                                   # "crisp" with the crisp preset
    crisp.hf.register("crisp_dense", policy="dense")      # more names, other policies / params
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="crisp")

What runs where. crisp is a *prefill* kernel: it runs a layer's attention when

  * more than one query token is attended: a prompt with an empty cache, a chunk of a chunked
    prefill over a filled cache (``model(input_ids=chunk, cache=cache)``, ``generate``
    with a prefilled cache: the queries are the last of the key positions, bottom-right causal),
  * the attention mask is None or causal with padding (left-padded batches, a static cache's
    unused tail): each row's keys and queries are passed as a varlen batch (cu_seqlens);
    any other mask (custom, bidirectional, packed sequences) falls back,
  * the module is causal, with no soft-capping or position bias, no dropout; a sliding-window
    layer (transformers' ``sliding_window`` W: query p sees keys (p - W, p]; Gemma 3, Mistral,
    Qwen2's local layers) runs crisp's dense preset with ``window=W``, as the llama.cpp integration
    does (crisp's selection is not window-aware), its mask read as causal-with-padding inside the
    window; counted in ``windowed``,
  * and q/k/v are on a device and dtype crisp supports (CUDA: float16/bfloat16, head dim 64,
    128 or 256; CPU: float32/float16/bfloat16/float64, head dim up to 256).

Decode steps (one query token) run on transformers' ``sdpa`` attention by design: crisp's
sparsity is a prefill saving, and one query over the cache is a memory-bound dot product sdpa
does well. Everything else listed above falls back to sdpa. ``stats`` counts the calls:
``crisp`` (of which ``chunks``: queries over a KV prefix, ``varlen``: padded batches or keys the
window left behind, ``windowed``: sliding-window layers), ``decode``,
and the fallbacks ``sdpa`` with ``fallback_reasons``. A CUDA backend that does not take chunks and
varlen key offsets yet (it refuses them, naming the batch) leaves those calls to sdpa, counted as
fallbacks with that reason.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict

from . import _C
from ._extras import require
from .ops import prefill

torch = require("torch", "hf", "crisp.hf")
require("transformers", "hf", "crisp.hf")

__all__ = ["register", "stats", "reset_stats"]

# Calls since the last reset_stats(): crisp (chunks and varlen among them), decode steps on sdpa,
# fallbacks to sdpa with their reasons.
stats: Dict[str, Any] = {}


def reset_stats() -> None:
    stats.update(crisp=0, chunks=0, varlen=0, windowed=0, decode=0, sdpa=0, fallback_reasons={})


reset_stats()


def _fallback_reason(module, query, key, value, attention_mask, dropout, kwargs) -> str:
    q_len, k_len = query.shape[2], key.shape[2]
    if q_len > k_len:
        return "query length > key length"
    if attention_mask is None and q_len != k_len:
        # sdpa would read is_causal top-left aligned here: keep its answer.
        return "query length != key length without a mask"
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        return "not causal"
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            return name
    window = kwargs.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        return "sliding_window (not a positive int)"
    if dropout and module.training:
        return "dropout"
    if kwargs.get("output_attentions", False):
        return "output_attentions"
    if query.device.type == "cuda":
        if query.dtype not in (torch.float16, torch.bfloat16):
            return f"dtype {query.dtype} on CUDA"
        if not _C.cuda_head_dim_supported(query.shape[-1]):
            return f"head dim {query.shape[-1]} on CUDA"
    elif query.device.type == "cpu":
        if query.shape[-1] > _C.MAX_HEAD_DIM:
            return f"head dim {query.shape[-1]} on CPU"
    else:
        return f"device {query.device.type}"
    if value.shape[-1] != query.shape[-1]:
        return "value head dim != query head dim"
    return ""


_MASK_REASON = "attention mask (not causal with padding)"
# The last mask read and what it said: every layer of a forward pass gets the same mask object.
_last_mask: Dict[str, Any] = {"ref": None, "key": None, "rows": None}


def _key_ranges(mask, q_len: int, k_len: int, window: int = 0):
    """The keys [start_b, end_b) of every batch row when ``mask`` (bool, or additive float with 0
    for "attend") is bottom-right causal over them: query i of row b sits at key position
    end_b - q_len + i and sees keys start_b .. that position, and with ``window`` W > 0 only the
    last W of those (keys (position - W, position]). Rows of queries before start_b (padding) must
    see no key (or every key: the mask fix of older torch for fully masked rows); with a window,
    start_b is the first key any query of the row sees (the keys before it are in no query's
    window). None when the mask is anything else (packed sequences among them: their earlier
    segments' queries see keys)."""
    if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[2] != q_len or mask.shape[3] < k_len:
        return None
    key = (tuple(mask.shape), q_len, k_len, window)
    ref = _last_mask["ref"]
    if ref is not None and ref() is mask and _last_mask["key"] == key:
        return _last_mask["rows"]
    allowed = (mask if mask.dtype == torch.bool else mask == 0)[:, 0, :, :k_len]
    last = allowed[:, -1, :]  # the last query sees every key of its row (the last W with a window)
    j = torch.arange(k_len, device=mask.device)
    seen = last.any(dim=1)
    any_row = allowed.any(dim=1) if window > 0 else last  # the first key a query of the row sees
    start = torch.where(seen, torch.where(any_row, j, k_len).amin(dim=1), 0)
    end = torch.where(seen, torch.where(last, j + 1, 0).amax(dim=1), 0)
    n_q = torch.minimum(end - start, torch.full_like(end, q_len))
    i = torch.arange(q_len, device=mask.device)
    position = (end - q_len)[:, None, None] + i[None, :, None]
    expected = (j >= start[:, None, None]) & (j < end[:, None, None]) & (j <= position)
    if window > 0:
        expected &= j > position - window
    checked = i[None, :, None] >= (q_len - n_q)[:, None, None]
    # The rows before (padding): no key, or all of them (sdpa_mask's allow_torch_fix on older torch).
    padding_row = ~allowed.any(dim=2, keepdim=True) | allowed.all(dim=2, keepdim=True)
    rows = None
    if bool(((allowed == expected) | ~checked).all()) and bool((padding_row | checked).all()):
        rows = [(int(a), int(b)) for a, b in zip(start.tolist(), end.tolist())]
    _last_mask.update(ref=weakref.ref(mask), key=key, rows=rows)
    return rows


def _varlen_call(query, key, value, rows, policy, params):
    """Rows with padding as one varlen batch: each row's queries (the last n_q of its keys) and
    keys [start, end) gathered into [tokens, heads, dim]; padded query rows of the output are 0."""
    B, Hq, q_len, D = query.shape
    qs, ks, vs, cu_q, cu_k, kept = [], [], [], [0], [0], []
    for b, (start, end) in enumerate(rows):
        n_q = min(end - start, q_len)
        if n_q == 0:
            continue
        kept.append((b, q_len - n_q))
        qs.append(query[b, :, q_len - n_q:].transpose(0, 1))
        ks.append(key[b, :, start:end].transpose(0, 1))
        vs.append(value[b, :, start:end].transpose(0, 1))
        cu_q.append(cu_q[-1] + n_q)
        cu_k.append(cu_k[-1] + end - start)
    out = query.new_zeros(B, q_len, Hq, D)
    if not kept:
        return out
    packed, _ = prefill(torch.cat(qs), torch.cat(ks), torch.cat(vs), policy=policy, layout="thd",
                        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **params)
    for (b, first), a, z in zip(kept, cu_q[:-1], cu_q[1:]):
        out[b, first:] = packed[a:z]
    return out


def _make_forward(policy: str, params: Dict[str, Any]):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def fall_back(counter, reason, module, query, key, value, attention_mask, dropout, scaling, kwargs):
        stats[counter] += 1
        if reason:
            stats["fallback_reasons"][reason] = stats["fallback_reasons"].get(reason, 0) + 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)

    def crisp_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling=None, **kwargs):
        args = (module, query, key, value, attention_mask, dropout, scaling, kwargs)
        if query.shape[2] <= 1:
            return fall_back("decode", "", *args)
        reason = _fallback_reason(module, query, key, value, attention_mask, dropout, kwargs)
        window = kwargs.get("sliding_window") or 0
        rows = None
        if not reason and attention_mask is not None:
            rows = _key_ranges(attention_mask, query.shape[2], key.shape[2], window)
            if rows is None:
                reason = _MASK_REASON
        if reason:
            return fall_back("sdpa", reason, *args)
        call_policy, call_params = policy, dict(params)
        if window:
            # The layer's whole window, as the llama.cpp integration computes it: the dense preset
            # with the window (and the setting's block size).
            call_policy = "dense"
            call_params = {"window": window, "block_size": params.get("block_size")}
        if scaling is not None:
            call_params["softmax_scale"] = float(scaling)
        q_len, k_len = query.shape[2], key.shape[2]
        varlen = rows is not None and any(r != (0, k_len) for r in rows)
        if varlen:
            out = _varlen_call(query, key, value, rows, call_policy, call_params)
        else:
            # query [B, Hq, q_len, D], key/value [B, Hkv, k_len, D] (GQA handled by crisp, no
            # repeat), passed as their free [B, S, H, D] transposes: the output is then the
            # contiguous [B, q_len, Hq, D] transformers wants from an attention function.
            # q_len < k_len: a chunk over the cache, its queries the last q_len positions.
            out, _ = prefill(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), policy=call_policy,
                             layout="bshd", **call_params)
        stats["crisp"] += 1
        stats["varlen"] += varlen
        stats["windowed"] += bool(window)
        stats["chunks"] += any(end - start > q_len for start, end in rows) if varlen else q_len < k_len
        return out, None

    crisp_attention_forward.__name__ = f"crisp_attention_forward_{policy}"
    return crisp_attention_forward


def register(name: str = "crisp", policy: str = "crisp", **params) -> str:
    """Registers ``name`` as a transformers attention implementation (AttentionInterface) running
    crisp with ``policy`` and Config ``params`` for prefill and chunks, sdpa for decode steps and
    what crisp does not compute (see the module docstring), and the sdpa mask builder under the
    same name (AttentionMaskInterface), so a padded batch or a chunk gets its mask, which crisp
    reads as sequence offsets. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    # Checked now rather than at the first forward.
    from .ops import settings_from_params
    _C.Config(policy, settings_from_params(params))

    AttentionInterface.register(name, _make_forward(policy, params))
    AttentionMaskInterface.register(name, sdpa_mask)
    assert name in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    return name
