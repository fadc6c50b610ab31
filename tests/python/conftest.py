"""Shared helpers of the Python tests. Tests that need torch, CUDA or transformers skip cleanly
when those are missing; the numpy tests need only the installed package (pip install .)."""
import importlib.util

import numpy as np
import pytest

crisp = pytest.importorskip("crisp")

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def cuda_ready() -> bool:
    if not HAVE_TORCH or not crisp.built_with_cuda:
        return False
    import torch
    return torch.cuda.is_available() and crisp.cuda_available()


def reference_attention(q, k, v, cu_seqlens=None, scale=None, cu_seqlens_k=None, window=0):
    """float64 causal attention in numpy. q [Tq, Hq, d], k/v [Tk, Hkv, d] (varlen layout);
    returns out [Tq, Hq, d], lse [Hq, Tq]. Sequence s has the queries cu_seqlens[s] ..
    cu_seqlens[s+1] and the keys cu_seqlens_k[s] .. cu_seqlens_k[s+1] (default: the same rows);
    its n_q queries are the last n_q of its n_k positions (bottom-right causal, flash-attn's).
    window > 0: the query at position p sees the keys p - window < j <= p only."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    Tq, Hq, d = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    cu = [0, Tq] if cu_seqlens is None else list(cu_seqlens)
    cu_k = ([0, k.shape[0]] if cu_seqlens is None else cu) if cu_seqlens_k is None else list(cu_seqlens_k)
    out = np.zeros_like(q)
    lse = np.zeros((Hq, Tq))
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        ka, kb = cu_k[s], cu_k[s + 1]
        n_q, n_k = b - a, kb - ka
        position = (n_k - n_q) + np.arange(n_q)[:, None]
        visible = np.arange(n_k)[None, :] <= position
        if window > 0:
            visible &= position - np.arange(n_k)[None, :] < window
        for h in range(Hq):
            logits = scale * q[a:b, h] @ k[ka:kb, h // group].T
            logits = np.where(visible, logits, -np.inf)
            m = logits.max(axis=1, keepdims=True)
            p = np.exp(logits - m)
            z = p.sum(axis=1, keepdims=True)
            out[a:b, h] = (p / z) @ v[ka:kb, h // group]
            lse[h, a:b] = (m + np.log(z))[:, 0]
    return out, lse


def batched_to_varlen(x):
    """[B, H, S, d] -> [B*S, H, d]."""
    B, H, S, d = x.shape
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 1, 3).reshape(B * S, H, d))


def workload_varlen(num_q_heads, num_kv_heads, head_dim, seq_lens, seed=0):
    """The library's structured workload in the varlen layout [T, H, d] (float32 numpy)."""
    w = crisp.make_workload(num_q_heads, num_kv_heads, head_dim, list(seq_lens), seed=seed)
    q, k, v = (np.ascontiguousarray(w[n].transpose(1, 0, 2)) for n in ("q", "k", "v"))
    return q, k, v, list(w["cu_seqlens"])
