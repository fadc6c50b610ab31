"""crisp's layout as a FlexAttention BlockMask (torch.nn.attention.flex_attention).

    p = crisp.plan(q, k, layout="bhsd")
    mask = crisp.flex.block_mask(p)        # p's block size, on the device p was planned on
    out = torch.compile(flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)

computes exactly the blocks crisp computes (per query head), so FlexAttention and crisp can be
compared on one layout (bench/compare.py). Only the compiled flex_attention honours the block
structure; the eager one evaluates the mask_mod alone (dense causal). Needs PyTorch >= 2.5
(``pip install 'crisp-attention[torch]'``).
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

from ._extras import require
from ._plan import Plan, SequencePlan

torch = require("torch", "torch", "crisp.flex")

__all__ = ["block_mask"]


def _bottom_right_causal(offset: int):
    """Query i of a chunk sits at key position offset + i (offset = n_k - n_q)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx
    return mask_mod


def block_mask(plan: Union[Plan, SequencePlan], block_size: Optional[int] = None, device=None):
    """The BlockMask of one sequence's plan (a crisp.Plan of one sequence, or one of its
    ``sequences``): every off-diagonal block is a "full" block (no mask_mod call), the diagonal
    block the one "partial" block (causal mask_mod). Batch 1, one mask per query head.
    The block size and the device are the plan's; ``device`` moves the mask elsewhere;
    ``block_size``, if given, must be the plan's. A chunk's plan (queries over a KV prefix) gives
    the mask of its n_q queries over n_k keys when its first query starts a block
    ((n_k - n_q) % B == 0): FlexAttention's query blocks start at query 0, so other chunks have no
    BlockMask of crisp's layout and are refused."""
    flex_attention = require("torch.nn.attention.flex_attention", "torch", "crisp.flex.block_mask (PyTorch >= 2.5)")
    if isinstance(plan, Plan):
        if len(plan.sequences) != 1:
            raise ValueError(f"plan: {len(plan.sequences)} sequences; expected one (pass plan.sequences[i])")
        seq = plan.sequences[0]
    elif isinstance(plan, SequencePlan):
        seq = plan
    else:
        raise TypeError(f"plan: got {type(plan).__name__}; expected a crisp.Plan or one of its sequences")
    if block_size is not None and block_size != seq.block_size:
        raise ValueError(f"block_size: {block_size} differs from the plan's {seq.block_size}; "
                         "expected the plan's (or leave it out)")
    device = seq.device if device is None else device

    offset = seq.n_k - seq.n_q
    if offset % seq.block_size != 0:
        raise ValueError(f"plan: a chunk whose first query is key position {offset}, inside a block of "
                         f"{seq.block_size}; expected (n_k - n_q) % block_size == 0 for a BlockMask")
    counts, indices = seq.kv_blocks()  # [H, N], [H, N, N]; the diagonal is each row's last entry
    # The rows of the chunk's queries: rows first_row .. N-1 of the whole prompt's grid.
    counts, indices = counts[:, seq.first_row:], indices[:, seq.first_row:, :]
    H, rows = counts.shape
    N = seq.num_blocks
    partial_indices = np.zeros((H, rows, N), dtype=np.int32)
    partial_indices[:, :, 0] = np.arange(seq.first_row, N, dtype=np.int32)[None, :]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device).unsqueeze(0)

    return flex_attention.BlockMask.from_kv_blocks(
        t(np.ones((H, rows), np.int32)), t(partial_indices), t(counts - 1), t(indices),
        BLOCK_SIZE=seq.block_size, mask_mod=_bottom_right_causal(offset), seq_lengths=(seq.n_q, seq.n_k))
