"""crisp.Attention: plan once, run many times (crisp::Attention), for torch tensors and numpy arrays.

    attention = crisp.Attention("crisp", kernel="portable", alpha=1.5)
    attention.plan(q, k)                 # route, layout, density of every (sequence, query head)
    out, lse = attention.run(q, k, v)    # block-sparse attention following that plan
    out2, lse2 = attention.run(q, k, v2) # again, same plan

Layouts, outputs and errors are those of crisp.prefill (crisp.ops). Options (all "auto" by default;
crisp/options.h): ``backend`` "cpu" / "cuda"; ``kernel`` "portable" / "hopper"; the Hopper kernel's
``schedule`` "persistent" / "grid", ``ping_pong`` "on" / "off", ``gqa_packing`` "separate" / "pack".
CUDA tensors are planned and run on the torch stream current at ``plan()`` (the device plan lives
in memory the library allocates once per batch shape); ``run`` must be called on that stream.
An object runs one call at a time (a lock serialises plan / run / host_plan from several threads);
``run`` refuses caches of another page size (or row length) than the plan's.
"""
from __future__ import annotations

import threading
from typing import Optional

from . import _C
from ._plan import Plan
from .ops import (_NoScope, _caller_outputs, _check_causal, _check_inputs, _check_no_grad, _check_planned_sequences,
                  _is_torch, _num_threads, _output_buffers, _output_views, _policy_name, _precision, _Prepared,
                  _resolve_call, _split, _stream, settings_from_params, torch)

__all__ = ["Attention"]


class Attention:
    def __init__(self, policy: str = "crisp", *, backend: str = "auto", kernel: str = "auto", schedule: str = "auto",
                 ping_pong: str = "auto", gqa_packing: str = "auto", **params):
        self._config = _C.Config(_policy_name(policy), settings_from_params(params))
        self._choices = dict(backend=backend, kernel=kernel, schedule=schedule, ping_pong=ping_pong,
                             gqa_packing=gqa_packing)
        _C.Attention(self._config, **self._choices)  # the options' errors now, not at the first plan
        self._native: Optional[_C.Attention] = None
        self._run_key = None  # (device, stream, precision) the native object was made for
        self._call = None  # the planned call's layout and sequences (its block table kept alive for run())
        self._split = None  # the planned (cu_seqlens_q, cu_seqlens_k), spelled out
        self._page_size = 0  # the planned K/V's page size (a contiguous cache_seqlens cache: its row length)
        # plan() and run() release the GIL in the library: one call at a time on an object, so a plan
        # cannot change under a run in another thread (that gave wrong outputs without an error).
        self._lock = threading.Lock()

    @staticmethod
    def _key(q):
        device = q.device if _is_torch(q) else "cpu"
        return (str(device), _stream(q), _precision(q))

    def _device_scope(self, q):
        if _is_torch(q) and q.device.type == "cuda":
            return torch.cuda.device(q.device)
        return _NoScope()

    def plan(self, q, k, cu_seqlens=None, *, layout: Optional[str] = None, causal=True, cu_seqlens_q=None,
             cu_seqlens_k=None, block_table=None, cache_seqlens=None) -> None:
        """Plans q/k (the layouts, ``causal`` and sequences of crisp.prefill: chunks over a KV
        prefix, varlen, paged K/V); replaces any earlier plan. A block table must keep its page ids
        until the last run."""
        _check_causal(causal)
        call = _resolve_call(q, k, k, layout, cu_seqlens, cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens)
        prep = _Prepared(q, k, k, call)
        key = self._key(q)
        with self._lock:
            if self._native is None or key != self._run_key:
                self._native = _C.Attention(self._config, **self._choices, num_threads=_num_threads(q),
                                            precision=key[2], stream=key[1])
                self._run_key = key
            with self._device_scope(q):
                self._native.plan(prep.q_view, prep.k_view, prep.cu_q, prep.cu_k, prep.table)
            self._call, self._split = call, _split(prep)
            self._page_size = prep.table.page_size

    def run(self, q, k, v, *, layout: Optional[str] = None, causal=True):
        """Attention of q/k/v following the last plan; returns ``(out, lse)`` as crisp.prefill.
        k, v: as planned (paged caches when planned with a block table, read through that table).
        No backward: inputs that require grad are refused while grad mode is on."""
        with self._lock:
            return self._run(q, k, v, layout, causal)

    def _run(self, q, k, v, layout: Optional[str], causal):
        if self._native is None or not self._native.planned:
            raise _C.Error("plan: has not been made (Attention.run before Attention.plan); expected plan(q, k) first")
        _check_causal(causal)
        _check_no_grad("Attention.run", q, k, v)
        call = self._call
        if layout is not None and layout != call.layout:
            _check_inputs(q, k, v, None, layout, call.paged_cache)  # a rank/shape error names what is wrong
            raise ValueError(f"layout: {layout!r} differs from the planned {call.layout!r}; expected the plan's layout")
        _check_inputs(q, k, v, None, call.layout, call.paged_cache)
        # `prep` holds the token-major copies the views point into: they must outlive the run.
        prep = _Prepared(q, k, v, call)
        # A batched run's sequences come from its shapes: the plan's must be those (not only its totals).
        _check_planned_sequences(self._split, _split(prep), "q, k")
        # The planned table reads pages of the planned size: a cache of other pages (or rows) would be
        # read at the wrong rows with no error.
        if prep.table.page_size != self._page_size:
            what = "row length" if call.rows_as_pages else "page size"
            raise ValueError(f"k: {what} {prep.table.page_size} differs from the plan's {self._page_size}; expected "
                             f"the cache geometry plan() saw")
        if self._key(q) != self._run_key:
            raise _C.Error(f"q: device/stream/precision {self._key(q)} differ from the plan's {self._run_key}; "
                           "expected the device, current stream and dtype class of plan()")
        out, lse = _output_buffers(q, call.layout)
        ov, lv = _output_views(out, lse, call.layout)
        with self._device_scope(q):
            self._native.run(prep.q_view, prep.k_view, prep.v_view, ov, lv)
        del prep  # after the run (CUDA: enqueued on the stream, so the allocator's reuse is ordered after it)
        return _caller_outputs(out, lse, call.layout)

    def host_plan(self) -> Plan:
        """The last plan as a crisp.Plan (CUDA: copied back, synchronising the stream)."""
        with self._lock:
            if self._native is None:
                raise _C.Error("plan: has not been made (Attention.host_plan before Attention.plan); expected plan(q, k) first")
            return Plan.from_native(self._native.host_plan(), device=self._run_key[0])

    @property
    def backend(self) -> str:
        """The backend of the last plan ("cpu" or "cuda"; "auto" before any)."""
        return self._native.backend if self._native is not None else "auto"
