"""The torch custom op: CPU here and in CI when torch is installed; CUDA parts skip without a GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import crisp  # noqa: E402
from conftest import cuda_ready, reference_attention, workload_varlen  # noqa: E402

needs_cuda = pytest.mark.skipif(not cuda_ready(), reason="needs a CUDA build of crisp and a GPU")


def random_batched(B, Hq, Hkv, S, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, S, d, generator=g).to(dtype=dtype, device=device) for H in (Hq, Hkv, Hkv))


def sdpa_reference(q, k, v):
    """float64 causal attention of [B, H, S, d] tensors (GQA by repeating kv heads); (out, lse)."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double().cpu(), k.double().cpu().repeat_interleave(group, 1), v.double().cpu().repeat_interleave(group, 1)
    logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    S = q.shape[2]
    logits = logits.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    return torch.softmax(logits, dim=-1) @ v, lse


# ---------------------------------------------------------------- CPU
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_cpu_dense_matches_reference(dtype, tol):
    q, k, v = random_batched(2, 4, 2, 200, 32, dtype)
    out, lse = crisp.prefill(q, k, v, policy="dense")
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (2, 4, 200)
    ref_out, ref_lse = sdpa_reference(q, k, v)
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=tol, rtol=tol)


def test_cpu_varlen_tensor_offsets():
    q, k, v, _ = workload_varlen(4, 2, 64, [600], seed=5)
    cu = torch.tensor([0, 250, 251, 600], dtype=torch.int32)
    out, lse = crisp.prefill(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), policy="dense",
                             cu_seqlens=cu)
    ref_out, ref_lse = reference_attention(q, k, v, cu_seqlens=cu.tolist())
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-5, rtol=2e-5)


def test_custom_op_schema_and_fake_impl():
    q, k, v = random_batched(2, 4, 2, 130, 16)
    torch.library.opcheck(torch.ops.crisp.prefill.default, (q, k, v, None, "crisp", "alpha=1.5", "bhsd"),
                          test_utils=("test_schema", "test_faketensor"))
    qv, kv, vv = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
    cu = torch.tensor([0, 50, 130])
    torch.library.opcheck(torch.ops.crisp.prefill.default, (qv, kv, vv, cu, "dense", "", "thd"),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_cpu():
    q, k, v = random_batched(1, 4, 2, 256, 32)

    def layer(q, k, v):
        out, lse = crisp.prefill(q * 0.5, k, v, policy="dense")
        return out.sum(dim=-1), lse

    compiled = torch.compile(layer, fullgraph=True)
    eager_out, eager_lse = layer(q, k, v)
    comp_out, comp_lse = compiled(q, k, v)
    torch.testing.assert_close(comp_out, eager_out)
    torch.testing.assert_close(comp_lse, eager_lse)


def test_plan_of_torch_tensors_matches_numpy():
    q, k, _, _ = workload_varlen(8, 2, 64, [1200], seed=6)
    a = crisp.plan(torch.from_numpy(q), torch.from_numpy(k))
    b = crisp.plan(q, k)
    np.testing.assert_array_equal(a.sequences[0].col, b.sequences[0].col)
    assert a.sequences[0].routes == b.sequences[0].routes


def test_torch_bad_input():
    q, k, v = random_batched(1, 4, 2, 64, 16)
    with pytest.raises(TypeError, match="mixed torch tensors and numpy"):
        crisp.prefill(q, k.numpy(), v)
    with pytest.raises(TypeError, match="cu_seqlens"):
        crisp.prefill(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                      cu_seqlens=torch.tensor([0.0, 64.0]))
    with pytest.raises(crisp.Error, match="cu_seqlens"):
        crisp.prefill(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu_seqlens=[0, 63])


def test_offsets_on_a_device_whose_values_cannot_be_read_are_refused():
    """Meta tensors (no values) as offsets or key counts: refused naming the argument, not read as
    uninitialised memory."""
    q = torch.randn(100, 2, 16)
    meta = dict(device="meta")
    cu, cu_meta = torch.tensor([0, 30, 100]), torch.tensor([0, 30, 100], **meta)
    calls = [
        ("cu_seqlens", lambda: crisp.prefill(q, q, q, cu_seqlens=cu_meta)),
        ("cu_seqlens_q", lambda: crisp.prefill(q, q, q, cu_seqlens_q=cu_meta, cu_seqlens_k=cu)),
        ("cu_seqlens_k", lambda: crisp.prefill(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu_meta)),
        ("cache_seqlens", lambda: crisp.prefill(q[:10], q, q, cache_seqlens=torch.tensor([60], **meta))),
        ("cu_seqlens", lambda: crisp.plan(q, q, cu_seqlens=cu_meta)),
        ("cu_seqlens", lambda: torch.ops.crisp.prefill(q, q, q, cu_meta, "dense", "", "thd")),
    ]
    for name, call in calls:
        with pytest.raises(ValueError, match=f"{name}: a tensor on meta"):
            call()


def test_sparse_inputs_and_too_many_tokens_are_named():
    q = torch.randn(10, 2, 16)
    with pytest.raises(TypeError, match=r"k: a tensor of layout torch.sparse_coo; expected a dense tensor"):
        crisp.prefill(q, q.to_sparse(), q)
    with pytest.raises(TypeError, match="cu_seqlens: a tensor of layout torch.sparse_coo"):
        crisp.prefill(q, q, q, cu_seqlens=torch.tensor([0, 4, 10]).to_sparse())
    # 2^31 + 5 tokens of one stride-0 row: the token limit is checked before any output is allocated
    # (a 512 GiB allocation would fail first).
    huge = torch.randn(1, 1, 16).expand(2 ** 31 + 5, 1, 16)
    with pytest.raises(crisp.Error, match=r"q: has 2147483653 tokens; expected at most 2147483647"):
        crisp.prefill(huge, huge, huge)
    with pytest.raises(crisp.Error, match=r"k: has 2147483653 tokens"):
        crisp.prefill(q[:, :1], huge, huge)


# ---------------------------------------------------------------- CUDA
def gpu_workload(Hq, Hkv, d, n, dtype, seed=0):
    q, k, v, _ = workload_varlen(Hq, Hkv, d, [n], seed=seed)
    # [T, H, d] -> [1, H, T, d] on the GPU
    return tuple(torch.from_numpy(x).transpose(0, 1).unsqueeze(0).to("cuda", dtype) for x in (q, k, v))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_dense_matches_sdpa_gqa_batched(dtype, d):
    q, k, v = random_batched(2, 8, 2, 777, d, dtype, "cuda", seed=1)
    out, lse = crisp.prefill(q, k, v, policy="dense")
    assert out.shape == q.shape and out.dtype == dtype and lse.dtype == torch.float32
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                                           is_causal=True)
    ref64, ref_lse = sdpa_reference(q, k, v)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(out.double().cpu(), ref64, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=1e-3, rtol=1e-3)


@needs_cuda
def test_gpu_crisp_policy_equals_cpu_backend_on_the_same_plan():
    q, k, v = gpu_workload(8, 2, 128, 4096, torch.bfloat16, seed=2)
    p = crisp.plan(q, k, policy="crisp")  # planned on the GPU
    assert 0.0 < p.density < 1.0
    out, lse = crisp.prefill(q, k, v, policy="crisp")
    out_cpu, lse_cpu = crisp.attend(q.cpu(), k.cpu(), v.cpu(), p)
    torch.testing.assert_close(out.float().cpu(), out_cpu.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), lse_cpu, atol=1e-3, rtol=1e-3)
    # The GPU planner and the CPU planner choose the same layout for the same inputs.
    p_cpu = crisp.plan(q.cpu(), k.cpu(), policy="crisp")
    assert p.sequences[0].routes == p_cpu.sequences[0].routes
    np.testing.assert_array_equal(p.sequences[0].col, p_cpu.sequences[0].col)


@needs_cuda
def test_gpu_varlen_matches_per_sequence_sdpa():
    cu = [0, 300, 1324, 2000]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2000, 8, 64, generator=g).cuda().half()
    k = torch.randn(2000, 4, 64, generator=g).cuda().half()
    v = torch.randn(2000, 4, 64, generator=g).cuda().half()
    out, lse = crisp.prefill(q, k, v, policy="dense", cu_seqlens=torch.tensor(cu, device="cuda"))
    assert lse.shape == (8, 2000)
    for a, b in zip(cu[:-1], cu[1:]):
        qs, ks, vs = (x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks.repeat_interleave(2, 1),
                                                               vs.repeat_interleave(2, 1), is_causal=True)
        torch.testing.assert_close(out[a:b].transpose(0, 1).unsqueeze(0), ref, atol=3e-3, rtol=3e-3)


@needs_cuda
def test_gpu_side_stream_and_torch_compile():
    q, k, v = gpu_workload(8, 2, 128, 2048, torch.bfloat16, seed=4)
    expected, _ = crisp.prefill(q, k, v, policy="crisp")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side, _ = crisp.prefill(q, k, v, policy="crisp")
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, expected, atol=0, rtol=0)
    compiled = torch.compile(lambda q, k, v: crisp.prefill(q, k, v, policy="crisp")[0] + 1, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), expected + 1)


@needs_cuda
def test_gpu_unsupported_dtype_is_an_error():
    q, k, v = random_batched(1, 4, 2, 64, 64, torch.float32, "cuda")
    with pytest.raises(crisp.Error, match="q"):
        crisp.prefill(q, k, v)


def test_flex_block_mask_reproduces_crisp_layout_cpu():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    import crisp.flex
    q, k, v, _ = workload_varlen(8, 2, 64, [1500], seed=1)
    q, k, v = (torch.from_numpy(x).transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    p = crisp.plan(q, k, policy="crisp")
    assert p.density < 1.0
    mask = crisp.flex.block_mask(p.sequences[0], p.block_size, "cpu")
    flex_out = torch.compile(flex.flex_attention)(q, k, v, block_mask=mask, enable_gqa=True)
    crisp_out, _ = crisp.attend(q, k, v, p)
    dense_out, _ = crisp.prefill(q, k, v, policy="dense")
    assert (dense_out - crisp_out).abs().max() > 1e-2  # the layout matters for this input
    torch.testing.assert_close(flex_out, crisp_out, atol=1e-4, rtol=1e-4)


def test_import_crisp_before_torch_in_a_fresh_interpreter():
    """`import crisp` first, then torch (and crisp's OpenMP CPU code after it): torch and crisp._C
    must end up on one libgomp (crisp/__init__.py imports torch first). A fresh interpreter, since
    this process has loaded both already."""
    import subprocess
    import sys

    code = ("import crisp\nimport torch\n"
            "w = crisp.make_workload(num_q_heads=2, num_kv_heads=1, head_dim=32, seq_lens=(300,))\n"
            "print('ok', w['q'].shape)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr[-3000:]}"
    assert result.stdout.startswith("ok")
