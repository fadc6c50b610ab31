"""crisp's layout as a FlexAttention BlockMask (torch.nn.attention.flex_attention).

    p = crisp.plan(q, k)
    mask = crisp.flex.block_mask(p.sequences[0], device=q.device)
    out = torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)

computes exactly the blocks crisp computes (per query head), so FlexAttention and crisp can be
compared on one layout (bench/compare.py). Only the compiled flex_attention honours the block
structure; the eager one evaluates the mask_mod alone (dense causal).
"""
from __future__ import annotations

import numpy as np
import torch

from ._plan import SequencePlan

__all__ = ["block_mask"]


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def block_mask(seq: SequencePlan, block_size: int = 128, device="cuda"):
    """Every off-diagonal block of the plan is a "full" block (no mask_mod call), the diagonal
    block the one "partial" block (causal mask_mod). Batch 1, one mask per query head."""
    from torch.nn.attention.flex_attention import BlockMask

    counts, indices = seq.kv_blocks()  # [H, N], [H, N, N]; the diagonal is each row's last entry
    H, N = counts.shape
    partial_indices = np.zeros((H, N, N), dtype=np.int32)
    partial_indices[:, :, 0] = np.arange(N, dtype=np.int32)[None, :]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device).unsqueeze(0)

    return BlockMask.from_kv_blocks(t(np.ones((H, N), np.int32)), t(partial_indices), t(counts - 1), t(indices),
                                    BLOCK_SIZE=block_size, mask_mod=_causal, seq_lengths=(seq.n, seq.n))
