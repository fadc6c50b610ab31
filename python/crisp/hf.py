"""Hugging Face transformers integration: ``attn_implementation="crisp"``.

    import crisp.hf
    crisp.hf.register()                                   # "crisp" with the crisp preset
    crisp.hf.register("crisp_dense", policy="dense")      # more names, other policies / params
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="crisp")

What runs where. crisp is a *prefill* kernel: it runs a layer's attention when

  * the query length equals the key length and is > 1 (a prefill with an empty cache),
  * no attention mask is needed (transformers' sdpa mask creation, registered under the same name,
    returns None for a plain causal batch without padding),
  * the module is causal, with no sliding window, soft-capping or position bias, no dropout,
  * and q/k/v are on a device and dtype crisp supports (CUDA: float16/bfloat16, head dim 64 or
    128; CPU: float32/float16/bfloat16/float64).

Everything else falls back to transformers' ``sdpa`` attention: decode steps (one query token),
chunked prefill against a filled cache, padded batches (a padding mask), sliding-window or
soft-capped models, training with dropout, unsupported dtypes/head dims. ``stats`` counts both.
"""
from __future__ import annotations

from typing import Any, Dict

from ._extras import require
from .ops import prefill

torch = require("torch", "hf", "crisp.hf")
require("transformers", "hf", "crisp.hf")

__all__ = ["register", "stats", "reset_stats"]

# Calls that ran crisp and calls that fell back to sdpa (with the reason), since register().
stats: Dict[str, Any] = {"crisp": 0, "sdpa": 0, "fallback_reasons": {}}


def reset_stats() -> None:
    stats["crisp"] = 0
    stats["sdpa"] = 0
    stats["fallback_reasons"] = {}


def _fallback_reason(module, query, key, value, attention_mask, dropout, kwargs) -> str:
    q_len, k_len = query.shape[2], key.shape[2]
    if q_len <= 1:
        return "decode (one query token)"
    if q_len != k_len:
        return "query length != key length (filled cache)"
    if attention_mask is not None:
        return "attention mask (padding or custom mask)"
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        return "not causal"
    for name in ("sliding_window", "softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            return name
    if dropout and module.training:
        return "dropout"
    if kwargs.get("output_attentions", False):
        return "output_attentions"
    if query.device.type == "cuda":
        if query.dtype not in (torch.float16, torch.bfloat16):
            return f"dtype {query.dtype} on CUDA"
        if query.shape[-1] not in (64, 128):
            return f"head dim {query.shape[-1]} on CUDA"
    elif query.device.type != "cpu":
        return f"device {query.device.type}"
    if value.shape[-1] != query.shape[-1]:
        return "value head dim != query head dim"
    return ""


def _make_forward(policy: str, params: Dict[str, Any]):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def crisp_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling=None, **kwargs):
        reason = _fallback_reason(module, query, key, value, attention_mask, dropout, kwargs)
        if reason:
            stats["sdpa"] += 1
            stats["fallback_reasons"][reason] = stats["fallback_reasons"].get(reason, 0) + 1
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        stats["crisp"] += 1
        call_params = dict(params)
        if scaling is not None:
            call_params["softmax_scale"] = float(scaling)
        # query [B, Hq, S, D], key/value [B, Hkv, S, D] (GQA handled by crisp, no repeat), passed as
        # their free [B, S, H, D] transposes: the output is then the contiguous [B, S, Hq, D]
        # transformers wants from an attention function.
        out, _ = prefill(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), policy=policy,
                         layout="bshd", **call_params)
        return out, None

    crisp_attention_forward.__name__ = f"crisp_attention_forward_{policy}"
    return crisp_attention_forward


def register(name: str = "crisp", policy: str = "crisp", **params) -> str:
    """Registers ``name`` as a transformers attention implementation (AttentionInterface) running
    crisp with ``policy`` and Config ``params`` for prefill, sdpa otherwise (see the module
    docstring), and the sdpa mask builder under the same name (AttentionMaskInterface), so a
    padded batch still gets its mask (and falls back). Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    # Checked now rather than at the first forward.
    from . import _C
    from .ops import settings_from_params
    _C.Config(policy, settings_from_params(params))

    AttentionInterface.register(name, _make_forward(policy, params))
    AttentionMaskInterface.register(name, sdpa_mask)
    assert name in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    return name
