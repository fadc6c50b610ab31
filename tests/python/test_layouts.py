"""Layouts stated, never guessed: crisp.prefill / plan / attend take layout="bhsd" | "bshd" | "thd",
refuse shapes that fit two layouts without one, take causal (True only), return contiguous
outputs, and answer flash-attn's / SDPA's keywords. numpy here; torch below when installed."""
import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import crisp
from conftest import HAVE_TORCH, HAVE_TRANSFORMERS, batched_to_varlen, reference_attention

RNG = np.random.default_rng(11)


def bshd(B, Hq, Hkv, S, d, dtype=np.float32):
    """Random q, k, v in [batch, seq, heads, dim]."""
    return tuple(RNG.standard_normal((B, S, H, d)).astype(dtype) for H in (Hq, Hkv, Hkv))


def to_bhsd(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def reference_bshd(q, k, v):
    """float64 reference of [B, S, H, d] inputs: out [B, S, Hq, d], lse [B, Hq, S]."""
    B, S = q.shape[:2]
    cu = [b * S for b in range(B + 1)]
    flat = [x.reshape(B * S, *x.shape[2:]) for x in (q, k, v)]
    out, lse = reference_attention(*flat, cu_seqlens=cu)
    return out.reshape(q.shape), lse.reshape(-1, B, S).transpose(1, 0, 2)


@pytest.mark.parametrize("B", [1, 3])
def test_bshd_and_bhsd_give_the_reference_in_their_own_layout(B):
    q, k, v = bshd(B, 4, 4, 70, 16)  # MHA: both layouts fit, so layout is required
    ref_out, ref_lse = reference_bshd(q, k, v)
    out, lse = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    assert out.shape == q.shape and out.flags.c_contiguous and lse.flags.c_contiguous
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=2e-5)
    out_h, lse_h = crisp.prefill(*(to_bhsd(x) for x in (q, k, v)), policy="dense", layout="bhsd")
    assert out_h.shape == (B, 4, 70, 16) and out_h.flags.c_contiguous and lse_h.flags.c_contiguous
    np.testing.assert_allclose(out_h, to_bhsd(ref_out), atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse_h, ref_lse, atol=2e-5, rtol=2e-5)


def test_thd_layout_is_varlen():
    q, k, v = bshd(1, 4, 2, 90, 16)
    flat = [x[0] for x in (q, k, v)]
    out, lse = crisp.prefill(*flat, policy="dense", layout="thd", cu_seqlens=[0, 40, 90])
    ref_out, ref_lse = reference_attention(*flat, cu_seqlens=[0, 40, 90])
    assert out.flags.c_contiguous
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=2e-5)


def test_shapes_that_fit_two_layouts_need_the_layout_argument():
    # flash-attn's [batch, seq, heads, dim] (1, 256, 4, 16) is also [batch, heads, seq, dim] of 256
    # heads of 4 tokens: without layout it is an error naming the argument, never a guess.
    q, k, v = bshd(1, 4, 4, 256, 16)
    for call in (lambda: crisp.prefill(q, k, v), lambda: crisp.plan(q, k)):
        with pytest.raises(ValueError, match="layout") as info:
            call()
        assert "bhsd" in str(info.value) and "bshd" in str(info.value)


def test_gqa_shapes_fit_one_layout_only():
    q, k, v = bshd(2, 4, 2, 33, 16)  # k's 2 heads: only [batch, seq, heads, dim] fits
    a, la = crisp.prefill(q, k, v, policy="dense")
    b, lb = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    qh, kh, vh = (to_bhsd(x) for x in (q, k, v))
    c, _ = crisp.prefill(qh, kh, vh, policy="dense")  # and [batch, heads, seq, dim] reads as bhsd
    np.testing.assert_allclose(c, to_bhsd(a), atol=1e-6)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(layout="bsdh"), ValueError, ["layout", "'bhsd'", "'bshd'", "'thd'"]),
    (dict(layout="thd"), ValueError, ["q: rank 4", "layout='thd'"]),
    (dict(layout="bshd", cu_seqlens=[0, 8]), ValueError, ["cu_seqlens", "layout='thd'"]),
    (dict(causal=False), ValueError, ["causal", "causal=True"]),
    (dict(causal="yes"), TypeError, ["causal"]),
    (dict(is_causal=False), ValueError, ["causal"]),
    (dict(causal=False, is_causal=True), ValueError, ["causal, is_causal: both given"]),
    (dict(dropout_p=0.1), ValueError, ["dropout_p", "dropout"]),
    (dict(window_size=(128, 4)), ValueError, ["window_size", "causal"]),
    (dict(window_size=128), TypeError, ["window_size", "(left, right)"]),
    (dict(window_size=(127, 0), window=128), ValueError, ["window, window_size"]),
    (dict(softcap=30.0), ValueError, ["softcap"]),
    (dict(return_attn_probs=True), ValueError, ["return_attn_probs"]),
    (dict(alibi_slopes=np.ones(4)), ValueError, ["alibi_slopes"]),
    (dict(scale=0.1, softmax_scale=0.2), ValueError, ["scale, softmax_scale"]),
    (dict(cu_seqlens_q=[0, 8], cu_seqlens_k=[0, 4, 8]), ValueError, ["cu_seqlens_q", "cu_seqlens_k"]),
    (dict(cu_seqlens_q=[0, 8]), ValueError, ["cu_seqlens_q", "batched layout"]),
    (dict(max_seqlen_q="8"), TypeError, ["max_seqlen_q"]),
])
def test_bad_layout_causal_and_foreign_keywords_name_the_argument(kwargs, exc, words):
    q, k, v = bshd(1, 4, 4, 8, 16)
    kwargs.setdefault("layout", "bshd")
    with pytest.raises(exc) as info:
        crisp.prefill(q, k, v, **kwargs)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_flash_attn_and_sdpa_keywords_at_neutral_values_are_accepted():
    q, k, v = bshd(1, 4, 2, 60, 16)
    flat = [x[0] for x in (q, k, v)]
    cu = np.array([0, 25, 60], dtype=np.int32)
    plain, plain_lse = crisp.prefill(*flat, policy="dense", cu_seqlens=cu, softmax_scale=0.2)
    out, lse = crisp.prefill(*flat, policy="dense", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=35,
                             max_seqlen_k=35, dropout_p=0.0, softmax_scale=None, scale=0.2, causal=True,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=True,
                             return_attn_probs=False)
    np.testing.assert_array_equal(out, plain)
    np.testing.assert_array_equal(lse, plain_lse)
    # The neutral values as any number equal to them (numpy's scalars among them), not a bool.
    for zero in (0, np.float64(0.0), np.int64(0), np.float32(-0.0)):
        out, _ = crisp.prefill(*flat, policy="dense", cu_seqlens=cu, softmax_scale=0.2, dropout_p=zero, softcap=zero)
        np.testing.assert_array_equal(out, plain)
    for value in (False, np.float64(0.1), "0"):
        with pytest.raises(ValueError, match="dropout_p"):
            crisp.prefill(*flat, cu_seqlens=cu, dropout_p=value)


def test_flash_attn_window_size_is_crisps_window():
    # flash-attn's window_size=(left, 0): a query sees itself and `left` keys before it, crisp's
    # window = left + 1 (spec §12); (-1, -1) and (-1, 0) are no window.
    q, k, v = bshd(1, 4, 2, 300, 16)
    flat = [x[0] for x in (q, k, v)]
    cu = np.array([0, 120, 300], dtype=np.int32)
    windowed, windowed_lse = crisp.prefill(*flat, policy="dense", cu_seqlens=cu, window=50)
    fa, fa_lse = crisp.prefill(*flat, policy="dense", cu_seqlens=cu, window_size=(49, 0))
    np.testing.assert_array_equal(fa, windowed)
    np.testing.assert_array_equal(fa_lse, windowed_lse)
    plain, _ = crisp.prefill(*flat, policy="dense", cu_seqlens=cu)
    for none in ((-1, -1), (-1, 0)):
        np.testing.assert_array_equal(crisp.prefill(*flat, policy="dense", cu_seqlens=cu, window_size=none)[0], plain)
    assert np.abs(windowed - plain).max() > 1e-3  # the window changed the attention


def test_plan_records_layout_independent_shapes_and_attend_takes_a_layout():
    q, k, v = bshd(1, 4, 4, 300, 16)
    p = crisp.plan(q, k, policy="crisp", layout="bshd", block_size=64)
    assert p.block_size == 64 and p.sequences[0].block_size == 64 and p.sequences[0].n_k == 300
    assert p.device == "cpu" and p.sequences[0].device == "cpu"
    out, _ = crisp.attend(q, k, v, p, layout="bshd")
    out_h, _ = crisp.attend(*(to_bhsd(x) for x in (q, k, v)), p, layout="bhsd")
    np.testing.assert_allclose(to_bhsd(out), out_h, atol=1e-6)
    with pytest.raises(ValueError, match="layout"):
        crisp.attend(q, k, v, p)
    with pytest.raises(ValueError, match="causal"):
        crisp.attend(q, k, v, p, layout="bshd", causal=False)


def test_attention_object_takes_layout_and_causal():
    q, k, v = bshd(2, 4, 4, 50, 16)
    attention = crisp.Attention("dense")
    with pytest.raises(ValueError, match="layout"):
        attention.plan(q, k)
    attention.plan(q, k, layout="bshd")
    out, lse = attention.run(q, k, v, layout="bshd")
    assert out.flags.c_contiguous and lse.flags.c_contiguous
    ref_out, ref_lse = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    with pytest.raises(ValueError, match="causal"):
        attention.run(q, k, v, layout="bshd", causal=False)


def test_attention_object_runs_a_copied_batched_layout():
    """A "bhsd" batch of several rows is copied token-major before the library sees it: the copies
    must outlive the run (a freed copy's memory is reused for the outputs)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 256, 32)).astype(np.float32) for _ in range(3))
    attention = crisp.Attention("dense")
    attention.plan(q, k, layout="bhsd")
    ref_out, ref_lse = crisp.prefill(q, k, v, policy="dense", layout="bhsd")
    for _ in range(2):
        out, lse = attention.run(q, k, v, layout="bhsd")
        np.testing.assert_array_equal(out, ref_out)
        np.testing.assert_array_equal(lse, ref_lse)


@pytest.mark.parametrize("module,extra,missing", [("hf", "hf", "transformers"), ("flex", "torch", "torch")])
def test_lazy_submodule_names_the_missing_extra(module, extra, missing):
    """crisp.hf / crisp.flex without their packages: an ImportError naming the pip extra. A fresh
    interpreter where the package is made unimportable (sys.modules[name] = None)."""
    code = (f"import sys\nsys.modules[{missing!r}] = None\nimport crisp\n"
            f"try:\n    crisp.{module}\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"crisp-attention[{extra}]" in result.stdout and missing in result.stdout, result.stdout


# ---------------------------------------------------------------- torch
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")


@needs_torch
def test_torch_flash_attn_layout_and_contiguous_outputs():
    import torch
    q, k, v = (torch.from_numpy(x) for x in bshd(2, 4, 4, 64, 16))
    with pytest.raises(ValueError, match="layout"):
        crisp.prefill(q, k, v)
    out, lse = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    ref_out, ref_lse = reference_bshd(q.numpy(), k.numpy(), v.numpy())
    assert out.is_contiguous() and lse.is_contiguous() and lse.shape == (2, 4, 64)
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-5, rtol=2e-5)
    out_h, lse_h = crisp.prefill(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), policy="dense",
                                 layout="bhsd")
    assert out_h.is_contiguous() and lse_h.is_contiguous()
    torch.testing.assert_close(out_h, out.transpose(1, 2))


@needs_torch
def test_torch_neutral_keywords_as_0_dim_tensors():
    import torch
    q, k, v = (torch.from_numpy(x) for x in bshd(1, 4, 2, 40, 16))
    plain, _ = crisp.prefill(q, k, v, policy="dense", layout="bshd")
    out, _ = crisp.prefill(q, k, v, policy="dense", layout="bshd", dropout_p=torch.tensor(0.0),
                           softcap=torch.tensor(0))
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    for value in (torch.tensor(0.5), torch.tensor([0.0]), torch.tensor(False)):
        with pytest.raises(ValueError, match="softcap"):
            crisp.prefill(q, k, v, layout="bshd", softcap=value)


@needs_torch
def test_torch_custom_op_fake_matches_real_for_each_layout():
    import torch
    q, k, v = (torch.from_numpy(x) for x in bshd(2, 4, 2, 40, 16))
    for layout, args in (("bshd", (q, k, v)), ("bhsd", tuple(x.transpose(1, 2) for x in (q, k, v)))):
        torch.library.opcheck(torch.ops.crisp.prefill.default, (*args, None, "dense", "", layout),
                              test_utils=("test_schema", "test_faketensor"))


@needs_torch
def test_torch_training_gets_a_clear_no_backward_error():
    import torch
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in bshd(1, 4, 2, 32, 16))
    out, _ = crisp.prefill(q, k, v, policy="dense")  # the forward pass runs (evaluation under grad)
    with pytest.raises(RuntimeError, match="no backward.*no_grad"):
        out.sum().backward()
    p = crisp.plan(q.detach(), k.detach())
    with pytest.raises(RuntimeError, match="no backward"):
        crisp.attend(q, k, v, p)
    with torch.no_grad():
        crisp.attend(q, k, v, p)


@needs_torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or
                    importlib.util.find_spec("torch.nn.attention.flex_attention") is None,
                    reason="needs torch with FlexAttention")
def test_flex_block_mask_takes_block_size_and_device_from_the_plan():
    import torch
    import crisp.flex
    q, k, _ = (torch.from_numpy(x) for x in bshd(1, 4, 2, 200, 16))
    p = crisp.plan(q, k, policy="dense", block_size=64)
    mask = crisp.flex.block_mask(p)
    assert mask.BLOCK_SIZE == (64, 64) and mask.kv_num_blocks.device == torch.device("cpu")
    assert mask.kv_num_blocks.shape == (1, 4, 4)  # ceil(200 / 64) rows of blocks per head
    assert crisp.flex.block_mask(p.sequences[0]).BLOCK_SIZE == (64, 64)
    with pytest.raises(ValueError, match="block_size"):
        crisp.flex.block_mask(p, 128)


@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TRANSFORMERS), reason="needs torch and transformers")
def test_import_crisp_exposes_hf_and_flex():
    import crisp as c
    assert {"hf", "flex"} <= set(dir(c))
    assert callable(c.hf.register) and callable(c.flex.block_mask)
