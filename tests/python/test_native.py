"""The package without torch: numpy arrays through the native module (runs in CI)."""
import numpy as np
import pytest

import crisp
from conftest import batched_to_varlen, reference_attention, workload_varlen

RNG = np.random.default_rng(7)


def random_batched(B, Hq, Hkv, S, d, dtype=np.float32):
    return tuple(RNG.standard_normal((B, H, S, d)).astype(dtype) for H in (Hq, Hkv, Hkv))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-11)])
def test_dense_batched_gqa_matches_float64_reference(dtype, tol):
    q, k, v = random_batched(2, 4, 2, 300, 32, dtype)
    out, lse = crisp.prefill(q, k, v, policy="dense")
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (2, 4, 300)
    ref_out, ref_lse = reference_attention(batched_to_varlen(q), batched_to_varlen(k), batched_to_varlen(v),
                                           cu_seqlens=[0, 300, 600])
    np.testing.assert_allclose(batched_to_varlen(out), ref_out, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse.transpose(1, 0, 2).reshape(4, 600), ref_lse, atol=tol, rtol=tol)


def test_dense_varlen_matches_reference_and_softmax_scale():
    q, k, v, _ = workload_varlen(4, 1, 64, [513], seed=3)
    cu = [0, 100, 357, 513]
    out, lse = crisp.prefill(q, k, v, policy="dense", cu_seqlens=cu, softmax_scale=0.07)
    ref_out, ref_lse = reference_attention(q, k, v, cu_seqlens=cu, scale=0.07)
    assert out.shape == q.shape and lse.shape == (4, 513)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("policy", ["dense", "crisp"])
def test_sliding_window_matches_windowed_reference(policy):
    # A window narrower than the sequences (spec §12): the dense preset's band is windowed causal
    # attention; a sparse policy computes it on the blocks of its plan, which keeps every block of
    # these short sequences (below min_budget), so both equal the reference.
    q, k, v, _ = workload_varlen(4, 2, 64, [700], seed=5)
    cu = [0, 300, 700]
    out, lse = crisp.prefill(q, k, v, policy=policy, cu_seqlens=cu, window=130)
    ref_out, ref_lse = reference_attention(q, k, v, cu_seqlens=cu, window=130)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=2e-5)
    full_out, _ = reference_attention(q, k, v, cu_seqlens=cu)
    assert np.abs(ref_out - full_out).max() > 1e-3  # the window changed the attention
    p = crisp.plan(q, k, policy="dense", cu_seqlens=cu, window=130)
    # The band, not every causal block, where the window is narrower than a block's reach: the
    # 400-token sequence (its last row starts at 384, window from 255: block 1 on).
    assert p.density < 1.0 and (p.sequences[1].density < 1.0).all()


def test_noncontiguous_batched_input_equals_contiguous():
    q, k, v = random_batched(3, 2, 2, 130, 16)
    # A [B, S, H, d] buffer seen as [B, H, S, d] (zero-copy path) vs the contiguous [B, H, S, d].
    tm = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v)]
    a, la = crisp.prefill(q, k, v, policy="dense", layout="bhsd")  # MHA shapes fit both layouts
    b, lb = crisp.prefill(*tm, policy="dense", layout="bhsd")
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)


def test_plan_shapes_and_csr_invariants():
    q, k, v, cu = workload_varlen(8, 2, 64, [1000, 300], seed=1)
    p = crisp.plan(q, k, policy="crisp", cu_seqlens=cu)
    assert isinstance(p, crisp.Plan)
    assert (p.num_q_heads, p.num_kv_heads, p.head_dim, p.block_size) == (8, 2, 64, 128)
    assert [s.n_k for s in p.sequences] == [1000, 300] and p.cu_seqlens == cu
    for s in p.sequences:
        N = s.num_blocks
        assert N == -(-s.n_k // 128)
        assert s.row_ptr.shape == (8, N + 1) and s.row_ptr.dtype == np.int32
        assert s.col_offsets[-1] == s.col.size and len(s.routes) == 8
        assert set(s.routes) <= {"vs", "pe", "dense"}
        mask = s.block_mask()
        assert mask.shape == (8, N, N)
        assert not np.triu(mask, 1).any()  # causal blocks only
        assert mask[:, np.arange(N), np.arange(N)].all() and mask[:, :, 0].all()  # diagonal and sink
        causal_blocks = N * (N + 1) / 2
        np.testing.assert_allclose(s.density, mask.sum(axis=(1, 2)) / causal_blocks)
        counts, indices = s.kv_blocks()
        for h in range(8):
            for r in range(N):
                cols = s.columns(h)[s.row_ptr[h, r]:s.row_ptr[h, r + 1]]
                np.testing.assert_array_equal(indices[h, r, :counts[h, r]], cols)
                np.testing.assert_array_equal(np.flatnonzero(mask[h, r]), cols)
    dense = crisp.plan(q, k, policy="dense", cu_seqlens=cu)
    assert dense.density == 1.0 and all(r == "dense" for s in dense.sequences for r in s.routes)


def test_attend_with_plan_equals_prefill():
    q, k, v, cu = workload_varlen(4, 2, 64, [1500], seed=2)
    out, lse = crisp.prefill(q, k, v, policy="crisp")
    p = crisp.plan(q, k, policy="crisp")
    assert p.density < 1.0  # the structured workload is sparse: the test exercises a real layout
    out2, lse2 = crisp.attend(q, k, v, p)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    # Sparse output differs from dense (the layout drops blocks) but covers most of the mass.
    dense_out, dense_lse = crisp.prefill(q, k, v, policy="dense")
    recall = np.exp(lse - dense_lse)
    assert recall.max() <= 1.0 + 1e-5 and recall.mean() > 0.5


def test_attend_and_run_refuse_inputs_of_other_sequences():
    """A plan runs on inputs of its own sequences: a plan of one 200-token sequence is not the plan
    of a batch of two 100-token rows (the totals agree, the causal masks do not)."""
    q, k, v = random_batched(2, 4, 2, 100, 16)
    q1, k1 = (x.transpose(1, 0, 2, 3).reshape(1, x.shape[1], 200, 16) for x in (q, k))  # one sequence
    one = crisp.plan(q1, k1, policy="dense", layout="bhsd")
    with pytest.raises(crisp.Error) as info:
        crisp.attend(q, k, v, one, layout="bhsd")
    for w in ("plan: made for 1 sequence", "(200, 200)", "q, k give 2 sequences", "(100, 100)"):
        assert w in str(info.value), str(info.value)
    out, lse = crisp.attend(q, k, v, crisp.plan(q, k, policy="dense", layout="bhsd"), layout="bhsd")
    np.testing.assert_array_equal(out, crisp.prefill(q, k, v, policy="dense", layout="bhsd")[0])
    attention = crisp.Attention("dense")
    attention.plan(q, k, layout="bhsd")
    q4, k4, v4 = (x.reshape(x.shape[0], x.shape[1], 2, 50, 16).transpose(0, 2, 1, 3, 4).reshape(4, x.shape[1], 50, 16)
                  for x in (q, k, v))  # the same tokens as 4 rows of 50
    with pytest.raises(crisp.Error, match=r"plan: made for 2 sequences.*q, k give 4 sequences"):
        attention.run(q4, k4, v4)
    np.testing.assert_array_equal(attention.run(q, k, v)[0], out)


def test_params_reach_the_config():
    q, k, v, _ = workload_varlen(4, 2, 64, [2000], seed=4)
    p = crisp.plan(q, k, policy="crisp", alpha=3.0, block_size=64, routing="jsd")
    assert p.block_size == 64 and p.config["alpha"] == "3" and p.config["routing"] == "jsd"
    assert p.sequences[0].num_blocks == 32


def test_fine_blocks_below_plans_short_prompts_at_64():
    q, k, v, _ = workload_varlen(4, 2, 64, [2000], seed=4)
    p = crisp.plan(q, k, policy="crisp", fine_blocks_below=4096)
    assert p.block_size == 64 and p.sequences[0].num_blocks == 32
    assert p.config["uniform_floor_blocks"] == "64" and p.config["fine_blocks_below"] == "0"
    assert crisp.plan(q, k, policy="crisp", fine_blocks_below=2000).block_size == 128


@pytest.mark.parametrize("call,exc,words", [
    (lambda q, k, v: crisp.prefill(q[0], k, v), ValueError, ["k, v: ranks"]),
    (lambda q, k, v: crisp.prefill(q, k[:, :, :10], v), ValueError, ["k: shape", "seq>=64"]),
    (lambda q, k, v: crisp.prefill(q, np.concatenate([k] * 2, 1)[:, :3], v[:, :1].repeat(3, 1)), crisp.Error,
     ["k:", "divide"]),
    (lambda q, k, v: crisp.prefill(q, k, v, alpha=-1.0), crisp.Error, ["alpha", "expected"]),
    (lambda q, k, v: crisp.prefill(q, k, v, no_such_param=1), crisp.Error, ["no_such_param", "unknown"]),
    (lambda q, k, v: crisp.prefill(q, k, v, policy="fast"), crisp.Error, ["preset", "crisp, flexprefill"]),
    (lambda q, k, v: crisp.prefill(q, k, v, policy=None), TypeError, ["policy"]),
    (lambda q, k, v: crisp.prefill(q, k, v, cu_seqlens=[0, 64]), ValueError, ["cu_seqlens", "varlen"]),
    (lambda q, k, v: crisp.prefill(q.astype(np.int32), k.astype(np.int32), v.astype(np.int32)), TypeError,
     ["q: dtype int32"]),
    (lambda q, k, v: crisp.prefill(q, k.astype(np.float64), v), TypeError, ["dtypes"]),
    (lambda q, k, v: crisp.prefill(q, k, v, alpha=[1]), TypeError, ["alpha"]),
    (lambda q, k, v: crisp.plan(q, k, tau_proxy="high"), crisp.Error, ["tau_proxy"]),
])
def test_bad_input_names_the_argument(call, exc, words):
    q, k, v = random_batched(1, 4, 2, 64, 16)
    with pytest.raises(exc) as info:
        call(q, k, v)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_bad_varlen_offsets_and_nonfinite_values():
    q, k, v = (x[0].transpose(1, 0, 2).copy() for x in random_batched(1, 2, 2, 64, 16))
    with pytest.raises(crisp.Error, match="cu_seqlens"):
        crisp.prefill(q, k, v, cu_seqlens=[0, 30, 60])
    with pytest.raises(crisp.Error, match="cu_seqlens"):
        crisp.prefill(q, k, v, cu_seqlens=[0, 40, 30, 64])
    q[5, 1, 3] = np.nan
    with pytest.raises(crisp.Error, match="non-finite"):
        crisp.prefill(q, k, v)


def test_limits_are_the_librarys():
    # The bounds the package checks before allocating are the library's own (crisp/limits.h):
    # d = MAX_HEAD_DIM runs, one more is refused by the library itself, naming q.
    assert crisp.MAX_TOKENS == 2 ** 31 - 1
    q, k, v = random_batched(1, 2, 1, 32, crisp.MAX_HEAD_DIM)
    out, lse = crisp.prefill(q, k, v, policy="dense", layout="bhsd")
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    q, k, v = random_batched(1, 2, 1, 32, crisp.MAX_HEAD_DIM + 1)
    with pytest.raises(crisp.Error, match="q: head dim d = 257"):
        crisp.prefill(q, k, v, policy="dense", layout="bhsd")
    assert [d for d in (32, 64, 96, 128, 256, 512) if crisp.cuda_head_dim_supported(d)] == [64, 128, 256]


def test_crisp_error_is_a_value_error():
    assert issubclass(crisp.Error, ValueError)


def test_numpy_scalar_params():
    q, k, _, _ = workload_varlen(4, 2, 64, [600], seed=8)
    p = crisp.plan(q, k, alpha=np.float64(2.5), min_budget=np.int64(256))
    assert p.config["alpha"] == "2.5" and p.config["min_budget"] == "256"
    with pytest.raises(TypeError, match="alpha"):
        crisp.plan(q, k, alpha=True)


@pytest.mark.parametrize("name", ["alpha=1;tau", "alpha x", "", "1alpha", "alpha;"])
def test_parameter_names_are_plain_identifiers(name):
    # "alpha=1;tau" would otherwise reach the library as two settings.
    q, k, v, _ = workload_varlen(2, 1, 16, [64], seed=8)
    for call in (lambda: crisp.prefill(q, k, v, **{name: 2}), lambda: crisp.Attention("dense", **{name: 2})):
        with pytest.raises(ValueError, match="not a parameter name") as info:
            call()
        assert repr(name) in str(info.value)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(seed=-1), ValueError, ["seed: -1", "[0, 2^64)"]),
    (dict(seed=2 ** 64), ValueError, ["seed", "[0, 2^64)"]),
    (dict(seed=1.5), TypeError, ["seed", "float"]),
    (dict(seq_lens=256), TypeError, ["seq_lens", "sequence of ints"]),
    (dict(head_dim="64"), TypeError, ["head_dim"]),
])
def test_make_workload_bad_arguments_name_the_argument(kwargs, exc, words):
    kwargs = {"seq_lens": (256,), **kwargs}
    with pytest.raises(exc) as info:
        crisp.make_workload(**kwargs)
    for w in words:
        assert w in str(info.value), str(info.value)
    assert crisp.make_workload(2, 1, 16, [64], seed=2 ** 64 - 1)["q"].shape == (2, 64, 16)


def test_gqa_union_is_a_superset_shared_by_each_group():
    q, k, v, cu = workload_varlen(8, 2, 64, [1500, 700], seed=6)
    p = crisp.plan(q, k, policy="crisp", cu_seqlens=cu)
    u = crisp.gqa_union(p)
    assert u.density >= p.density
    for s, su in zip(p.sequences, u.sequences):
        own, union = s.block_mask(), su.block_mask()
        assert (union >= own).all()  # every head keeps its own blocks
        for g in range(2):  # 4 query heads per kv head, one layout per group
            group = union[4 * g : 4 * g + 4]
            assert (group == group[0]).all()
            np.testing.assert_array_equal(group[0], own[4 * g : 4 * g + 4].any(axis=0))
    out, lse = crisp.attend(q, k, v, u)  # the union plan runs like any plan
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    with pytest.raises(TypeError, match="plan"):
        crisp.gqa_union("not a plan")


def test_attention_plans_once_and_runs_twice_identically():
    q, k, v, cu = workload_varlen(4, 2, 32, [700, 300], seed=5)
    attention = crisp.Attention("crisp", backend="cpu")
    attention.plan(q, k, cu_seqlens=cu)
    assert attention.backend == "cpu"
    out1, lse1 = attention.run(q, k, v)
    out2, lse2 = attention.run(q, k, v)
    np.testing.assert_array_equal(out1, out2)
    np.testing.assert_array_equal(lse1, lse2)
    out, lse = crisp.prefill(q, k, v, policy="crisp", cu_seqlens=cu)
    np.testing.assert_array_equal(out1, out)
    np.testing.assert_array_equal(lse1, lse)
    assert attention.host_plan().density == crisp.plan(q, k, policy="crisp", cu_seqlens=cu).density


@pytest.mark.parametrize("kwargs,words", [
    (dict(kernel="fastest"), "kernel"),
    (dict(backend="tpu"), "backend"),
    (dict(kernel="portable", schedule="grid"), "options.cuda.schedule"),
    (dict(backend="cpu", gqa_packing="pack"), "options.cuda"),
])
def test_attention_bad_options_name_the_option(kwargs, words):
    with pytest.raises(crisp.Error, match=words.replace(".", r"\.")):
        crisp.Attention("crisp", **kwargs)


def test_attention_run_before_plan_names_the_plan():
    q, k, v = random_batched(1, 2, 2, 64, 16)
    with pytest.raises(crisp.Error, match="plan"):
        crisp.Attention("dense").run(q, k, v)
