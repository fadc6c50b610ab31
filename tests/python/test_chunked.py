"""Queries over a KV prefix (chunked prefill, bottom-right causal) and paged K/V (block tables) in
crisp.prefill / plan / attend / Attention and the custom op, against the float64 reference.
numpy on the CPU backend; torch (CPU, and CUDA where the backend takes chunks) when installed."""
import numpy as np
import pytest

import crisp
from conftest import HAVE_TORCH, cuda_ready, reference_attention

BLOCK = 64  # block size of these tests: chunk sizes below are stated against it
N_K = 300   # keys of one sequence: 4 whole blocks and a partial one
# n_q in {1, < B, B, unaligned (the first query inside a block), n_k (a whole prompt)}.
CHUNKS = [1, 40, BLOCK, 100, N_K]
TOL = dict(atol=2e-5, rtol=2e-5)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def sequences(lengths, Hq=4, Hkv=2, d=16, seed=0):
    """Random varlen q [sum n_q, Hq, d], k/v [sum n_k, Hkv, d] and the offsets of (n_q, n_k) pairs."""
    rng = np.random.default_rng(seed)
    cu_q = [0] + list(np.cumsum([n_q for n_q, _ in lengths]))
    cu_k = [0] + list(np.cumsum([n_k for _, n_k in lengths]))
    return (randn(rng, cu_q[-1], Hq, d), randn(rng, cu_k[-1], Hkv, d), randn(rng, cu_k[-1], Hkv, d),
            [int(x) for x in cu_q], [int(x) for x in cu_k])


def paged(k, v, cu_k, page_size=16, seed=0):
    """The contiguous varlen k/v as a vLLM cache [num_pages, page_size, Hkv, d] with the pages of
    every sequence shuffled through the pool (and a spare page), and its int32 block table."""
    rng = np.random.default_rng(seed)
    counts = [-(-(cu_k[s + 1] - cu_k[s]) // page_size) for s in range(len(cu_k) - 1)]
    num_pages = sum(counts) + 1
    order = rng.permutation(num_pages)
    H, d = k.shape[1:]
    k_cache, v_cache = (np.full((num_pages, page_size, H, d), np.nan, np.float32) for _ in range(2))
    table = np.zeros((len(counts), max(counts)), np.int32)
    used = 0
    for s, count in enumerate(counts):
        for p in range(count):
            page = order[used]
            used += 1
            table[s, p] = page
            a = cu_k[s] + p * page_size
            b = min(a + page_size, cu_k[s + 1])
            k_cache[page, : b - a], v_cache[page, : b - a] = k[a:b], v[a:b]
    k_cache, v_cache = (np.nan_to_num(x, nan=0.0) for x in (k_cache, v_cache))  # unused slots: finite
    return k_cache, v_cache, table


@pytest.mark.parametrize("n_q", CHUNKS)
def test_chunk_matches_the_bottom_right_causal_reference(n_q):
    q, k, v, cu_q, cu_k = sequences([(n_q, N_K)], seed=n_q)
    out, lse = crisp.prefill(q, k, v, policy="dense", block_size=BLOCK)  # thd: one sequence, n_q <= n_k
    ref_out, ref_lse = reference_attention(q, k, v, cu_q, cu_seqlens_k=cu_k)
    assert out.shape == q.shape and lse.shape == (4, n_q)
    np.testing.assert_allclose(out, ref_out, **TOL)
    np.testing.assert_allclose(lse, ref_lse, **TOL)
    p = crisp.plan(q, k, policy="crisp", block_size=BLOCK)
    s = p.sequences[0]
    assert (s.q_offset, s.n_q, s.kv_offset, s.n_k) == (0, n_q, 0, N_K)
    assert s.first_row == (N_K - n_q) // BLOCK and s.num_blocks == -(-N_K // BLOCK)
    sparse, _ = crisp.prefill(q, k, v, policy="crisp", block_size=BLOCK)
    assert np.isfinite(sparse).all()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_batched_chunk_layouts(layout):
    rng = np.random.default_rng(5)
    B, n_q, n_k = 2, 100, N_K
    q, k, v = randn(rng, B, n_q, 4, 16), randn(rng, B, n_k, 2, 16), randn(rng, B, n_k, 2, 16)
    ref = [reference_attention(q[b], k[b], v[b], [0, n_q], cu_seqlens_k=[0, n_k]) for b in range(B)]
    ref_out, ref_lse = np.stack([r[0] for r in ref]), np.stack([r[1] for r in ref])
    args = (q, k, v) if layout == "bshd" else tuple(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    out, lse = crisp.prefill(*args, policy="dense", block_size=BLOCK)  # GQA + n_q < n_k: one layout fits
    assert out.flags.c_contiguous and lse.shape == (B, 4, n_q)
    np.testing.assert_allclose(out if layout == "bshd" else out.transpose(0, 2, 1, 3), ref_out, **TOL)
    np.testing.assert_allclose(lse, ref_lse, **TOL)


def test_varlen_mixing_chunks_and_prompts():
    lengths = [(1, 50), (40, 200), (BLOCK, BLOCK), (100, N_K), (N_K, N_K)]
    q, k, v, cu_q, cu_k = sequences(lengths, seed=7)
    out, lse = crisp.prefill(q, k, v, policy="dense", block_size=BLOCK, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ref_out, ref_lse = reference_attention(q, k, v, cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_allclose(out, ref_out, **TOL)
    np.testing.assert_allclose(lse, ref_lse, **TOL)
    p = crisp.plan(q, k, policy="crisp", block_size=BLOCK, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert p.cu_seqlens == cu_q and p.cu_seqlens_k == cu_k
    again, again_lse = crisp.attend(q, k, v, crisp.plan(q, k, policy="dense", block_size=BLOCK, cu_seqlens_q=cu_q,
                                                        cu_seqlens_k=cu_k))
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(again_lse, lse)


@pytest.mark.parametrize("policy", ["dense", "crisp"])
def test_shuffled_pages_equal_contiguous(policy):
    lengths = [(1, 50), (40, 200), (100, N_K), (N_K, N_K)]
    q, k, v, cu_q, cu_k = sequences(lengths, seed=9)
    k_cache, v_cache, table = paged(k, v, cu_k)
    contiguous = crisp.prefill(q, k, v, policy=policy, block_size=BLOCK, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    pages = crisp.prefill(q, k_cache, v_cache, policy=policy, block_size=BLOCK, cu_seqlens_q=cu_q,
                          cu_seqlens_k=cu_k, block_table=table)
    for a, b in zip(contiguous, pages):
        np.testing.assert_array_equal(a, b)
    lengths_only = crisp.prefill(q, k_cache, v_cache, policy=policy, block_size=BLOCK, cu_seqlens_q=cu_q,
                                 cache_seqlens=np.diff(cu_k).astype(np.int32), block_table=table)
    np.testing.assert_array_equal(lengths_only[0], pages[0])
    if policy == "dense":
        ref_out, _ = reference_attention(q, k, v, cu_q, cu_seqlens_k=cu_k)
        np.testing.assert_allclose(pages[0], ref_out, **TOL)
    # plan, then attend through the same table; and the Attention object.
    p = crisp.plan(q, k_cache, policy=policy, block_size=BLOCK, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                   block_table=table)
    np.testing.assert_array_equal(crisp.attend(q, k_cache, v_cache, p, block_table=table)[0], pages[0])
    attention = crisp.Attention(policy, block_size=BLOCK)
    attention.plan(q, k_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table)
    np.testing.assert_array_equal(attention.run(q, k_cache, v_cache)[0], pages[0])


def test_flash_attn_with_kvcache_style_call():
    """q [batch, n_q, Hq, d] over paged caches with cache_seqlens, as flash_attn_with_kvcache."""
    n_q, lens = 24, [200, 130]
    q, k, v, cu_q, cu_k = sequences([(n_q, n) for n in lens], seed=11)
    k_cache, v_cache, table = paged(k, v, cu_k, page_size=32, seed=2)
    out, lse = crisp.prefill(q.reshape(2, n_q, 4, 16), k_cache, v_cache, policy="dense", layout="bshd",
                             block_table=table, cache_seqlens=np.array(lens, np.int32))
    ref_out, ref_lse = reference_attention(q, k, v, cu_q, cu_seqlens_k=cu_k)
    np.testing.assert_allclose(out, ref_out.reshape(2, n_q, 4, 16), **TOL)
    np.testing.assert_allclose(lse, ref_lse.reshape(4, 2, n_q).transpose(1, 0, 2), **TOL)


def test_contiguous_cache_with_cache_seqlens():
    """A contiguous [batch, seq_cache, Hkv, d] cache whose rows hold cache_seqlens[b] keys each."""
    rng = np.random.default_rng(13)
    n_q, lens = 10, [40, 64]
    q, k, v = randn(rng, 2, n_q, 4, 16), randn(rng, 2, 64, 2, 16), randn(rng, 2, 64, 2, 16)
    k[0, 40:] = v[0, 40:] = 1e3  # past row 0's length: must not be read
    out, _ = crisp.prefill(q, k, v, policy="dense", layout="bshd", cache_seqlens=lens)
    for b, n in enumerate(lens):
        ref, _ = reference_attention(q[b], k[b, :n], v[b, :n], [0, n_q], cu_seqlens_k=[0, n])
        np.testing.assert_allclose(out[b], ref, **TOL)
    kh, vh = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (k, v))  # and as [batch, Hkv, seq, d]
    attention = crisp.Attention("dense")
    attention.plan(q.transpose(0, 2, 1, 3), kh, layout="bhsd", cache_seqlens=lens)
    out_h, _ = attention.run(q.transpose(0, 2, 1, 3), kh, vh)
    np.testing.assert_array_equal(out_h.transpose(0, 2, 1, 3), out)


def test_chunked_prefill_in_pieces_equals_one_shot():
    """A prompt prefilled in chunks (each over the keys so far) gives the whole prompt's rows."""
    q, k, v, _, _ = sequences([(N_K, N_K)], seed=15)
    whole, whole_lse = crisp.prefill(q, k, v, policy="dense", block_size=BLOCK)
    start = 0
    for size in (1, 40, BLOCK, 100, 95):
        end = start + size
        out, lse = crisp.prefill(q[start:end], k[:end], v[:end], policy="dense", block_size=BLOCK)
        np.testing.assert_allclose(out, whole[start:end], atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(lse, whole_lse[:, start:end], atol=1e-6, rtol=1e-5)
        start = end
    assert start == N_K


def bad_calls():
    q, k, v, cu_q, cu_k = sequences([(20, 50), (10, 40)], seed=17)
    k_cache, v_cache, table = paged(k, v, cu_k)
    rng = np.random.default_rng(1)
    qb, kb = randn(rng, 1, 16, 4, 8), randn(rng, 1, 10, 2, 8)
    return [
        (lambda: crisp.prefill(qb, kb, kb, layout="bshd"), ValueError, ["k: shape", "seq>=16"]),  # n_q > n_k
        (lambda: crisp.prefill(q, k, v, cu_seqlens_k=cu_k), ValueError, ["cu_seqlens_q", "only cu_seqlens_k"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=cu_q), ValueError, ["cu_seqlens_k", "only cu_seqlens_q"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=[0, 90]), crisp.Error,
         ["cu_seqlens_k", "sequences"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=[0, 25, 30], cu_seqlens_k=[0, 20, 90]), crisp.Error,
         ["cu_seqlens_q", "n_q <= n_k"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, cache_seqlens=[50, 40]), ValueError,
         ["cu_seqlens_k, cache_seqlens"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, block_table=table), ValueError,
         ["block_table", "cache_seqlens"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=table.astype(np.int64)), TypeError, ["block_table", "int32"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table[:1]),
         ValueError, ["block_table", "num_sequences=2"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cache_seqlens=[50], block_table=table),
         ValueError, ["cache_seqlens", "one key count per sequence"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table), ValueError,
         ["k: rank 3", "num_pages, page_size"]),
        (lambda: crisp.prefill(q, k_cache[:, :8], v_cache[:, :8], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=table), ValueError, ["k: page size 8", "multiple of 16"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table + 100),
         crisp.Error, ["batch.block_table", "page ids in"]),
        (lambda: crisp.prefill(q, k_cache, v_cache[:, :, :1], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=table), ValueError, ["v: shape"]),
        (lambda: crisp.prefill(qb, kb[:, :, :1].repeat(2, 1), kb[:, :, :1].repeat(2, 1), layout="bshd", cache_seqlens=[16]),
         ValueError, ["cache_seqlens", "multiple of 16"]),
        # A block table as a list: page ids are ints (a float is not truncated to one), in int32's
        # range, in rectangular rows.
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=(table + 0.7).tolist()), TypeError, ["block_table", "int page ids"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=[table[0].tolist(), table[1, :1].tolist()]), ValueError,
         ["block_table", "rectangular"]),
        (lambda: crisp.prefill(q, k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                               block_table=[[0, 2 ** 32 + 1], [1, 2]]), ValueError, ["block_table", "int32"]),
        # attend runs the plan's key counts: other cache_seqlens are refused, not ignored.
        (lambda: crisp.attend(q, k_cache, v_cache, crisp.plan(q, k_cache, policy="dense", cu_seqlens_q=cu_q,
                                                              block_table=table, cache_seqlens=[50, 40]),
                              block_table=table, cache_seqlens=[50, 30]), crisp.Error,
         ["plan: made for 2 sequences", "(10, 40)", "cache_seqlens give", "(10, 30)"]),
        (lambda: crisp.prefill(q, k, v, cu_seqlens_q=[0, 20, 2 ** 70], cu_seqlens_k=cu_k), ValueError,
         ["cu_seqlens_q", "beyond int64"]),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())))
def test_bad_input_names_the_argument(case):
    expect_error_naming(*bad_calls()[case])


def test_bool_page_ids_are_refused():
    """A bool is not a page id: a block table list mixing bools with ints (which numpy reads as an
    int array, True as page 1), all bools, or a bool array / tensor is refused by name, not run."""
    q, k, v, cu_q, cu_k = sequences([(32, 32)], seed=23)
    k_cache, v_cache, table = paged(k, v, cu_k)  # two pages of 16 keys (ids < 3: a spare page)

    def call(block_table):
        return crisp.prefill(q, k_cache, v_cache, policy="dense", cu_seqlens_q=cu_q, cache_seqlens=[32],
                             block_table=block_table)

    call([[0, 1]])  # the same call with ints runs
    for bad in ([[0, True]], [[True, 0]], [[0, np.True_]], [[True, False]]):
        expect_error_naming(lambda: call(bad), TypeError, ["block_table", "bool", "int page ids"])
    expect_error_naming(lambda: call(np.array([[True, False]])), TypeError, ["block_table", "dtype bool", "int32"])
    if HAVE_TORCH:
        import torch
        t = torch.from_numpy
        expect_error_naming(lambda: crisp.prefill(t(q), t(k_cache), t(v_cache), policy="dense",
                                                  cu_seqlens_q=torch.tensor(cu_q), cache_seqlens=torch.tensor([32]),
                                                  block_table=torch.tensor([[True, False]])),
                            TypeError, ["block_table", "torch.bool", "torch.int32"])


def test_attention_run_refuses_another_cache_geometry():
    """Attention.run reads the planned table's pages: a cache of another page size (or, for a
    contiguous cache_seqlens cache, another row length) whose token count fits was read at the
    wrong rows with no error."""
    q, k, v, cu_q, cu_k = sequences([(10, 64), (10, 64)], seed=29)
    k16, v16, table16 = paged(k, v, cu_k, page_size=16, seed=3)
    k32, v32, table32 = paged(k, v, cu_k, page_size=32, seed=3)
    attention = crisp.Attention("dense")
    attention.plan(q, k16, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table16)
    attention.run(q, k16, v16)
    expect_error_naming(lambda: attention.run(q, k32, v32), ValueError, ["k: page size 32", "plan's 16"])
    rng = np.random.default_rng(31)
    qb = randn(rng, 2, 10, 4, 16)
    rows = crisp.Attention("dense")
    rows.plan(qb, randn(rng, 2, 64, 2, 16), layout="bshd", cache_seqlens=50)
    expect_error_naming(lambda: rows.run(qb, randn(rng, 2, 96, 2, 16), randn(rng, 2, 96, 2, 16), layout="bshd"),
                        ValueError, ["k: row length 96", "plan's 64"])


def test_attention_calls_on_one_object_do_not_overlap():
    """plan() and run() release the GIL in the library: from two threads, a run that overlapped a
    plan read a plan being replaced (a wrong output in one of three racing runs of 200). The object
    serialises its calls: a run started while a (slowed) plan is in progress waits for it."""
    import threading
    import time
    q, k, v, cu_q, _ = sequences([(64, 64)], seed=43)
    attention = crisp.Attention("dense")
    attention.plan(q, k, cu_seqlens=cu_q)
    real = attention._native
    state = {"in_plan": False, "overlaps": 0}

    class SlowPlan:  # the native object, with a plan that takes 0.3 s and a run that notes an overlap
        planned = True

        def plan(self, *args):
            state["in_plan"] = True
            time.sleep(0.3)
            real.plan(*args)
            state["in_plan"] = False

        def run(self, *args):
            state["overlaps"] += state["in_plan"]
            return real.run(*args)

        def __getattr__(self, name):
            return getattr(real, name)

    attention._native = SlowPlan()
    planner = threading.Thread(target=attention.plan, args=(q, k), kwargs=dict(cu_seqlens=cu_q))
    planner.start()
    time.sleep(0.1)  # the plan is in progress
    out, _ = attention.run(q, k, v)
    planner.join()
    assert state["overlaps"] == 0
    np.testing.assert_array_equal(out, crisp.prefill(q, k, v, policy="dense", cu_seqlens=cu_q)[0])


def test_attend_of_a_paged_plan_needs_its_table():
    q, k, v, cu_q, cu_k = sequences([(10, 64)], seed=37)
    k_cache, v_cache, table = paged(k, v, cu_k, page_size=16)
    p = crisp.plan(q, k_cache, policy="dense", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, block_table=table)
    assert p.page_size == 16
    assert crisp.plan(q, k, policy="dense", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).page_size == 0
    expect_error_naming(lambda: crisp.attend(q, k_cache, v_cache, p), ValueError,
                        ["block_table: not given", "pages of 16"])
    expect_error_naming(lambda: crisp.attend(q, k_cache, v_cache, p.native, block_table=table), TypeError,
                        ["plan: got the native", "crisp.Plan"])


def test_keywords_named_as_given():
    """Keywords ported from SDPA / flash-attn: refused under the caller's spelling, with the value
    given; output buffers and misspelt names are not silently ignored."""
    q, k, v, cu_q, _ = sequences([(64, 64)], seed=41)
    call = lambda **kw: crisp.prefill(q, k, v, policy="dense", cu_seqlens=cu_q, **kw)  # noqa: E731
    expect_error_naming(lambda: call(out=np.empty_like(q)), TypeError, ["out: output buffers are not taken"])
    expect_error_naming(lambda: call(lse=np.empty((4, 64), np.float32)), TypeError, ["lse: output buffers are not taken"])
    expect_error_naming(lambda: call(rotary_cos=np.ones(4)), ValueError, ["rotary_cos", "after RoPE"])
    expect_error_naming(lambda: call(softmax_scal=None), ValueError, ["softmax_scal: not a parameter name"])
    expect_error_naming(lambda: call(is_causal=False), ValueError, ["is_causal: False is not supported"])
    expect_error_naming(lambda: call(scale=0.0), ValueError, ["scale: 0", "None for 1/sqrt(d)"])
    expect_error_naming(lambda: call(enable_gqa=1), ValueError, ["enable_gqa: 1;"])
    expect_error_naming(lambda: call(deterministic="yes"), TypeError, ["deterministic: got str"])
    # The neutral values still run: flash-attn's defaults among them (out=None: a new output).
    call(softmax_scale=None, deterministic=True, scale=None, out=None, lse=None, rotary_cos=None, rotary_sin=None,
         cache_batch_idx=None, cache_leftpad=None, num_splits=0)


def expect_error_naming(call, exc, words):
    """call() raises exc whose message holds every one of words."""
    with pytest.raises(exc) as info:
        call()
    for w in words:
        assert w in str(info.value), str(info.value)


# ---------------------------------------------------------------- torch
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")


@needs_torch
def test_torch_chunk_and_pages_through_the_custom_op():
    import torch
    lengths = [(1, 50), (100, N_K), (N_K, N_K)]
    q, k, v, cu_q, cu_k = sequences(lengths, seed=19)
    k_cache, v_cache, table = paged(k, v, cu_k)
    ref_out, ref_lse = reference_attention(q, k, v, cu_q, cu_seqlens_k=cu_k)
    t = torch.from_numpy
    out, lse = crisp.prefill(t(q), t(k_cache), t(v_cache), policy="dense", block_size=BLOCK,
                             cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32), cache_seqlens=t(np.diff(cu_k)),
                             block_table=t(table))
    np.testing.assert_allclose(out.numpy(), ref_out, **TOL)
    np.testing.assert_allclose(lse.numpy(), ref_lse, **TOL)
    cu_q_t, cu_k_t = torch.tensor(cu_q), torch.tensor(cu_k)
    for args in ((t(q), t(k), t(v), cu_q_t, "dense", "", "thd", cu_k_t, None),
                 (t(q), t(k_cache), t(v_cache), cu_q_t, "crisp", "block_size=64", "thd", cu_k_t, t(table))):
        torch.library.opcheck(torch.ops.crisp.prefill.default, args, test_utils=("test_schema", "test_faketensor"))


def op_bad_calls():
    """Direct calls of torch.ops.crisp.prefill that crisp.prefill would refuse: the op refuses them
    too (its arguments are crisp.prefill's, checked by the same function)."""
    import torch
    op = torch.ops.crisp.prefill
    q, kc = torch.randn(10, 2, 16), torch.randn(4, 16, 2, 16)
    qb = torch.randn(3, 10, 2, 16)
    cu_k, table = torch.tensor([0, 20]), torch.tensor([[2, 3]], dtype=torch.int32)
    return [
        (lambda: op(q, kc, kc, None, "dense", "", "thd", cu_k, table.long()), TypeError, ["block_table", "int32"]),
        (lambda: op(qb, kc, kc, None, "dense", "", "bshd", torch.tensor([0, 16, 32, 48]), table[:, :1]), ValueError,
         ["block_table: shape (1, 1)", "num_sequences=3"]),
        (lambda: op(q, kc, kc, None, "dense", "", "thd", cu_k, table[0]), ValueError, ["block_table: shape (2,)"]),
        (lambda: op(q, kc, kc, None, "dense", "", "thd", None, table), ValueError, ["block_table", "cu_seqlens_k"]),
        (lambda: op(q, kc, kc, None, "dense", "", "thd", cu_k, table.to("meta")), ValueError,
         ["block_table: on meta", "q's device"]),
        (lambda: op(qb, qb, qb, torch.tensor([0, 5, 10]), "dense", "", "bshd"), ValueError,
         ["cu_seqlens", "batched layout"]),
        (lambda: op(qb, qb, qb, None, "dense", "", "bshd", torch.tensor([0, 10, 20, 30])), ValueError,
         ["cu_seqlens_k", "batched layout"]),
        (lambda: op(qb, kc, kc, None, "dense", "", "bshd", cu_k, table.repeat(3, 1)), ValueError,
         ["cu_seqlens_k: 2 key offsets, but q has 3 sequence(s)"]),
    ]


@needs_torch
@pytest.mark.parametrize("case", range(len(op_bad_calls()) if HAVE_TORCH else 1))
def test_custom_op_called_directly_checks_like_prefill(case):
    expect_error_naming(*op_bad_calls()[case])


@needs_torch
def test_torch_cache_seqlens_tensor_values_are_checked_as_a_list():
    """cache_seqlens as a tensor gets the answers of a list, naming cache_seqlens (not the block
    table or key offsets it becomes)."""
    import torch
    qb, kc = torch.randn(2, 10, 4, 16), torch.randn(2, 48, 2, 16)
    for lens in ([30, 60], torch.tensor([30, 60])):  # a contiguous cache of 48 positions per row
        with pytest.raises(ValueError, match=r"cache_seqlens: \[30, 60\] exceed the 48 positions of k"):
            crisp.prefill(qb, kc, kc, layout="bshd", cache_seqlens=lens)
    q, pages, table = torch.randn(10, 2, 16), torch.randn(4, 16, 2, 16), torch.tensor([[0, 1]], dtype=torch.int32)
    for lens in ([0], torch.tensor([0])):
        with pytest.raises(ValueError, match="cache_seqlens: .0.; expected every sequence to have at least one key"):
            crisp.prefill(q, pages, pages, block_table=table, cache_seqlens=lens)


@needs_torch
def test_torch_compile_of_a_chunk():
    import torch
    q, k, v, _, _ = sequences([(40, N_K)], seed=21)
    q, k, v = (torch.from_numpy(x).unsqueeze(0) for x in (q, k, v))  # bshd
    compiled = torch.compile(lambda q, k, v: crisp.prefill(q, k, v, policy="dense", layout="bshd")[0] * 2,
                             fullgraph=True)
    expected, _ = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    torch.testing.assert_close(compiled(q, k, v), expected * 2)
    # varlen offsets as tensors: read inside the op, so the graph has no host read of them.
    lengths = [(1, 50), (100, N_K)]
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.tensor(x)
                           for x in sequences(lengths, seed=22))
    varlen = torch.compile(lambda q, k, v, cu_q, cu_k: crisp.prefill(q, k, v, policy="dense", cu_seqlens_q=cu_q,
                                                                     cu_seqlens_k=cu_k)[0], fullgraph=True)
    expected, _ = crisp.prefill(q, k, v, policy="dense", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    torch.testing.assert_close(varlen(q, k, v, cu_q, cu_k), expected)


@needs_torch
def test_flex_block_mask_of_an_aligned_chunk():
    import torch
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    import crisp.flex
    w = crisp.make_workload(4, 2, 32, [640], seed=3)
    n_q = 640 - 2 * BLOCK  # the chunk starts block 2
    q, k, v = (torch.from_numpy(w[n]).unsqueeze(0) for n in ("q", "k", "v"))  # bhsd
    q = q[:, :, -n_q:].contiguous()
    p = crisp.plan(q, k, policy="crisp", block_size=BLOCK)
    mask = crisp.flex.block_mask(p)
    assert mask.kv_num_blocks.shape == (1, 4, -(-n_q // BLOCK))
    flex_out = torch.compile(flex.flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)
    crisp_out, _ = crisp.attend(q, k, v, p)
    torch.testing.assert_close(flex_out, crisp_out, atol=1e-4, rtol=1e-4)
    unaligned = crisp.plan(q[:, :, 1:], k, policy="crisp", block_size=BLOCK)
    with pytest.raises(ValueError, match="plan: a chunk"):
        crisp.flex.block_mask(unaligned)


@pytest.mark.skipif(not cuda_ready(), reason="needs CUDA")
@pytest.mark.parametrize("paged_kv", [False, True])
def test_gpu_chunks_match_the_cpu_backend(paged_kv):
    """CUDA chunks and pages against the CPU backend on the same plan."""
    import torch
    lengths = [(1, 500), (100, 700), (256, 1024)]
    q, k, v, cu_q, cu_k = sequences(lengths, Hq=8, Hkv=2, d=128, seed=23)
    extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    if paged_kv:
        k, v, table = paged(k, v, cu_k, page_size=64)
        extra["block_table"] = table
    cpu_out, _ = crisp.prefill(q, k, v, policy="dense", **extra)
    g = {n: torch.from_numpy(x).to("cuda", torch.bfloat16) for n, x in (("q", q), ("k", k), ("v", v))}
    if paged_kv:
        extra["block_table"] = torch.from_numpy(table).cuda()
    out, lse = crisp.prefill(g["q"], g["k"], g["v"], policy="dense", **extra)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.float().cpu(), torch.from_numpy(cpu_out), atol=3e-2, rtol=3e-2)


def test_readme_example_runs():
    """The README's Python example of chunked prefill and paged K/V, run as written."""
    import pathlib
    import re
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Chunked prefill and paged K/V (Python)", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
