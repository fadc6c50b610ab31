"""crisp.Plan: the sparse layout chosen for every (sequence, query head), as numpy arrays.

A thin copy of the library's crisp::Plan (include/crisp/plan.h) made for inspection: routes,
the routing statistics, and each head's block CSR. It also keeps the native plan, so
``crisp.attend(q, k, v, plan)`` can run exactly this layout again (on either backend).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from . import _C

ROUTE_NAMES = ("vs", "pe", "dense")  # crisp::Route order


@dataclass
class SequencePlan:
    """The plan of one sequence: ``H`` query heads over ``N = ceil(n / B)`` blocks.

    Arrays (numpy): ``c_struct``, ``jsd``, ``density`` [H] float64 (NaN where not computed);
    ``row_ptr`` [H, N + 1] int32 and ``col`` (all heads' columns, concatenated) int32, with
    ``col_offsets`` [H + 1]: key blocks of head h and query block r are
    ``col[col_offsets[h] + row_ptr[h, r] : col_offsets[h] + row_ptr[h, r + 1]]``;
    ``vertical`` / ``slash``: per head, the kept vertical blocks / slash distance-blocks of VS heads.
    """

    q_offset: int  # first query row of the sequence in q
    n_q: int  # queries: the last n_q of the n_k positions
    kv_offset: int  # first key of the sequence (cu_seqlens_k[s])
    n_k: int  # keys
    first_row: int  # (n_k - n_q) // B: rows before it hold no query and are empty
    num_blocks: int
    routes: List[str]
    c_struct: np.ndarray
    jsd: np.ndarray
    density: np.ndarray
    row_ptr: np.ndarray
    col: np.ndarray
    col_offsets: np.ndarray
    vertical: List[np.ndarray]
    slash: List[np.ndarray]
    block_size: int = 128  # B of the plan it belongs to
    device: str = "cpu"    # where it was planned ("cpu", "cuda:0", ...)

    @property
    def num_heads(self) -> int:
        return len(self.routes)

    def columns(self, head: int) -> np.ndarray:
        """All key-block columns of one head, row after row (indexed by ``row_ptr[head]``)."""
        return self.col[self.col_offsets[head] : self.col_offsets[head + 1]]

    def nnz(self) -> np.ndarray:
        """Computed blocks per head [H]."""
        return np.diff(self.col_offsets)

    def kv_blocks(self) -> Tuple[np.ndarray, np.ndarray]:
        """The layout as FlexAttention's ``BlockMask.from_kv_blocks`` wants it:
        ``kv_num_blocks`` [H, N] int32 and ``kv_indices`` [H, N, N] int32 (row r's key blocks first,
        ascending, then padding with zeros)."""
        H, N = self.num_heads, self.num_blocks
        counts = np.diff(self.row_ptr, axis=1).astype(np.int32)  # [H, N]
        indices = np.zeros((H, N, N), dtype=np.int32)
        # Position of each column inside its row: its CSR index minus the row start.
        rows = np.repeat(np.tile(np.arange(N), H), counts.reshape(-1))
        heads = np.repeat(np.arange(H), counts.sum(axis=1))
        starts = np.repeat(self.row_ptr[:, :-1].reshape(-1), counts.reshape(-1))
        within_head = np.concatenate([np.arange(c) for c in counts.sum(axis=1)]) if H else np.zeros(0, np.int64)
        indices[heads, rows, within_head - starts] = self.col
        return counts, indices

    def block_mask(self) -> np.ndarray:
        """Dense boolean [H, N, N] mask of computed blocks (for small N)."""
        H, N = self.num_heads, self.num_blocks
        mask = np.zeros((H, N, N), dtype=bool)
        counts = np.diff(self.row_ptr, axis=1).reshape(-1)
        rows = np.repeat(np.tile(np.arange(N), H), counts)
        heads = np.repeat(np.arange(H), np.diff(self.col_offsets))
        mask[heads, rows, self.col] = True
        return mask


@dataclass
class Plan:
    """The plan of a batch (see crisp.plan). ``sequences[s]`` is a SequencePlan."""

    config: Dict[str, str]
    block_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    softmax_scale: float
    density: float
    vs_share: float
    sequences: List[SequencePlan]
    native: "_C.Plan" = field(repr=False, default=None)
    device: str = "cpu"  # where it was planned ("cpu", "cuda:0", ...)
    page_size: int = 0  # the page size of the paged K/V it was planned over (0: contiguous K/V)

    @classmethod
    def from_native(cls, native: "_C.Plan", device: str = "cpu") -> "Plan":
        sequences = []
        for s in range(native.num_sequences):
            d = native.sequence(s)
            sequences.append(
                SequencePlan(
                    q_offset=int(d["q_offset"]),
                    n_q=int(d["n_q"]),
                    kv_offset=int(d["kv_offset"]),
                    n_k=int(d["n_k"]),
                    first_row=int(d["first_row"]),
                    num_blocks=int(d["num_blocks"]),
                    routes=[ROUTE_NAMES[int(r)] for r in d["route"]],
                    c_struct=d["c_struct"],
                    jsd=d["jsd"],
                    density=d["density"],
                    row_ptr=d["row_ptr"],
                    col=d["col"],
                    col_offsets=d["col_offsets"],
                    vertical=list(d["vertical"]),
                    slash=list(d["slash"]),
                    block_size=int(native.block_size),
                    device=str(device),
                )
            )
        return cls(
            config=dict(native.config.items()),
            block_size=int(native.block_size),
            num_q_heads=int(native.num_q_heads),
            num_kv_heads=int(native.num_kv_heads),
            head_dim=int(native.head_dim),
            softmax_scale=float(native.softmax_scale),
            density=float(native.density()),
            vs_share=float(native.vs_share()),
            sequences=sequences,
            native=native,
            device=str(device),
            page_size=int(native.page_size),
        )

    @property
    def cu_seqlens(self) -> List[int]:
        """cu_seqlens_q: the query rows of every sequence."""
        return [s.q_offset for s in self.sequences] + [self.sequences[-1].q_offset + self.sequences[-1].n_q]

    @property
    def cu_seqlens_k(self) -> List[int]:
        """The key offsets of every sequence."""
        return [s.kv_offset for s in self.sequences] + [self.sequences[-1].kv_offset + self.sequences[-1].n_k]

    def __repr__(self) -> str:
        routes = {}
        for s in self.sequences:
            for r in s.routes:
                routes[r] = routes.get(r, 0) + 1
        return (
            f"crisp.Plan(preset={self.config.get('preset')!r}, sequences={len(self.sequences)}, "
            f"Hq={self.num_q_heads}, Hkv={self.num_kv_heads}, d={self.head_dim}, B={self.block_size}, "
            f"density={self.density:.4f}, routes={routes})"
        )
