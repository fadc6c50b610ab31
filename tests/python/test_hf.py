"""attn_implementation="crisp" in transformers, on a tiny random Llama (no download).
CPU (float32) always when torch + transformers are installed; CUDA (bfloat16) with a GPU."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import crisp  # noqa: E402
import crisp.hf  # noqa: E402
from conftest import cuda_ready  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DEVICES = [("cpu", torch.float32)] + ([("cuda", torch.bfloat16)] if cuda_ready() else [])


def tiny_llama(device, dtype, head_dim=64):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=4 * head_dim, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                      max_position_embeddings=8192, initializer_range=0.05)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


@pytest.fixture(scope="module", autouse=True)
def registered():
    crisp.hf.register("crisp")
    crisp.hf.register("crisp_dense", policy="dense")


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_greedy_generation_equals_sdpa_on_short_prompts(device, dtype):
    model = tiny_llama(device, dtype)
    g = torch.Generator().manual_seed(1)
    for length in (5, 37, 100):
        ids = torch.randint(0, 1000, (1, length), generator=g).to(device)
        outputs = {}
        for impl in ("sdpa", "crisp"):
            model.set_attn_implementation(impl)
            crisp.hf.reset_stats()
            with torch.no_grad():
                outputs[impl] = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
            if impl == "crisp":
                # Prefill ran through crisp in every layer; the 15 decode steps fell back to sdpa.
                assert crisp.hf.stats["crisp"] == 2, crisp.hf.stats
                assert crisp.hf.stats["fallback_reasons"] == {"decode (one query token)": 2 * 15}
        assert outputs["crisp"].tolist() == outputs["sdpa"].tolist(), length


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_long_prompt_logits_dense_policy(device, dtype):
    model = tiny_llama(device, dtype, head_dim=128 if device == "cuda" else 64)
    ids = torch.randint(0, 1000, (1, 1500), generator=torch.Generator().manual_seed(2)).to(device)
    logits = {}
    for impl in ("sdpa", "crisp_dense", "crisp"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits[impl] = model(ids).logits.float()
    scale = logits["sdpa"].abs().max()
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # bf16: a few ulps of the logit scale
    err = (logits["crisp_dense"] - logits["sdpa"]).abs().max()
    assert err <= tol * scale, (float(err), float(scale))
    assert torch.isfinite(logits["crisp"]).all()


def test_padded_batch_falls_back_to_sdpa():
    model = tiny_llama("cpu", torch.float32)
    ids = torch.randint(0, 1000, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    out = {}
    for impl in ("sdpa", "crisp"):
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        with torch.no_grad():
            out[impl] = model(ids, attention_mask=mask).logits
    assert crisp.hf.stats["crisp"] == 0 and crisp.hf.stats["sdpa"] == 2
    torch.testing.assert_close(out["crisp"], out["sdpa"])


def test_unbatched_prefill_without_padding_uses_crisp_for_batch_of_two():
    model = tiny_llama("cpu", torch.float32)
    ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(4))
    out = {}
    for impl in ("sdpa", "crisp_dense"):
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        with torch.no_grad():
            out[impl] = model(ids).logits
    assert crisp.hf.stats["crisp"] == 2
    torch.testing.assert_close(out["crisp_dense"], out["sdpa"], atol=1e-4, rtol=1e-4)


def test_register_rejects_bad_params():
    with pytest.raises(crisp.Error, match="alpha"):
        crisp.hf.register("crisp_bad", alpha=-2.0)
