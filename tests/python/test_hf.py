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
                # Prefill ran through crisp in every layer; the 15 decode steps ran on sdpa.
                assert crisp.hf.stats["crisp"] == 2 and crisp.hf.stats["decode"] == 2 * 15, crisp.hf.stats
                assert crisp.hf.stats["sdpa"] == 0 and crisp.hf.stats["fallback_reasons"] == {}
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


def test_padded_batch_runs_crisp_through_varlen():
    model = tiny_llama("cpu", torch.float32)
    ids = torch.randint(0, 1000, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    out = {}
    for impl in ("sdpa", "crisp_dense"):
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        with torch.no_grad():
            out[impl] = model(ids, attention_mask=mask).logits
    assert crisp.hf.stats["crisp"] == 2 and crisp.hf.stats["varlen"] == 2 and crisp.hf.stats["sdpa"] == 0
    valid = mask.bool()  # padded positions' outputs are not defined by either
    torch.testing.assert_close(out["crisp_dense"][valid], out["sdpa"][valid], atol=1e-4, rtol=1e-4)


def with_cache(model, cache):
    """The keyword argument that hands `cache` to model.forward and generate: transformers 5 names
    it `cache` (`past_key_values` is deprecated there, to go in 5.40), earlier versions
    `past_key_values`."""
    import inspect
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def chunked_generate(model, ids, mask, chunks, max_new_tokens=12):
    """Prefill ids[:, :chunks[-1]] chunk by chunk into a cache (model(input_ids=chunk,
    cache=cache)), then generate from the whole of ids: its first step is the chunk of
    the remaining prompt tokens over the filled cache. Returns (chunk logits, generated ids)."""
    from transformers import DynamicCache
    cache = DynamicCache()
    cache_kwarg = with_cache(model, cache)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, start = [], 0
    with torch.no_grad():
        for end in chunks:
            logits.append(model(input_ids=ids[:, start:end], attention_mask=mask[:, :end],
                                position_ids=positions[:, start:end], use_cache=True, **cache_kwarg).logits)
            start = end
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                   min_new_tokens=max_new_tokens, do_sample=False, **cache_kwarg)
    return logits, generated


@pytest.mark.parametrize("device,dtype", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_prefill_generate_equals_sdpa_with_zero_fallbacks(padded, device, dtype):
    """Issue 16's transformers acceptance on a tiny Llama: a chunked prefill (chunks of 1, < B,
    unaligned sizes over a filled cache), then generate over the prefilled cache, gives sdpa's
    greedy answer through crisp's dense policy; every prefill call ran on crisp (chunks counted),
    only the decode steps on sdpa. padded: a left-padded batch of two (varlen through cu_seqlens)."""
    model = tiny_llama(device, dtype)
    batch = 2 if padded else 1
    ids = torch.randint(0, 1000, (batch, 150), generator=torch.Generator().manual_seed(6)).to(device)
    mask = torch.ones(batch, 150, dtype=torch.long, device=device)
    if padded:
        mask[1, :37] = 0
    chunks = [40, 57, 100]  # ends of chunks of 40, 17 (< B) and 43; then generate's own chunk: 100..149
    results = {}
    for impl in ("sdpa", "crisp_dense"):
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        results[impl] = chunked_generate(model, ids, mask, chunks)
        if impl == "crisp_dense":
            stats = dict(crisp.hf.stats)
    layers, new_tokens = 2, 12
    assert stats["sdpa"] == 0 and stats["fallback_reasons"] == {}, stats
    assert stats["crisp"] == layers * (len(chunks) + 1), stats
    assert stats["chunks"] == layers * len(chunks), stats  # every call but the first chunk has a KV prefix
    assert stats["decode"] == layers * (new_tokens - 1), stats
    if padded:
        assert stats["varlen"] == stats["crisp"], stats
    for (start, end), a, b in zip(zip([0] + chunks, chunks), *(results[i][0] for i in ("crisp_dense", "sdpa"))):
        valid = mask[:, start:end].bool()  # padded positions' outputs are not defined by either
        tol = 1e-4 if dtype == torch.float32 else 3e-2 * float(b.abs().max())  # bf16: ulps of the logit scale
        torch.testing.assert_close(a[valid], b[valid], atol=tol, rtol=1e-4 if dtype == torch.float32 else 3e-2)
    assert results["crisp_dense"][1].tolist() == results["sdpa"][1].tolist()


def test_masks_crisp_reads_and_masks_it_leaves_to_sdpa():
    from crisp.hf import _key_ranges
    q_len, k_len = 4, 10
    i, j = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
    bottom_right = j <= (k_len - q_len) + i
    left_padded = bottom_right & (j >= 3)
    mask = torch.stack([bottom_right, left_padded])[:, None]
    assert _key_ranges(mask, q_len, k_len) == [(0, 10), (3, 10)]
    additive = torch.zeros(2, 1, q_len, k_len).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert _key_ranges(additive, q_len, k_len) == [(0, 10), (3, 10)]
    static_tail = j <= (9 - q_len) + i  # a static cache's unused slot after the last key
    assert _key_ranges(static_tail[None, None], q_len, k_len) == [(0, 9)]
    top_left = (j <= i)[None, None]  # sdpa's is_causal for q_len < k_len: bottom-right over keys 0..3
    assert _key_ranges(top_left, q_len, k_len) == [(0, 4)]
    window = (bottom_right & (j > (k_len - q_len) + i - 3))[None, None]  # sliding window of 3 keys
    assert _key_ranges(window, q_len, k_len) is None  # not plain causal
    # As the layer's window: the first query (position 6) sees keys 4..6, so the keys start at 4.
    assert _key_ranges(window, q_len, k_len, window=3) == [(4, 10)]
    assert _key_ranges(window, q_len, k_len, window=4) is None  # another window
    assert _key_ranges(bottom_right[None, None], q_len, k_len, window=3) is None  # no window applied
    padded_window = (left_padded & (j > (k_len - q_len) + i - 5))[None, None]  # padding inside the window
    assert _key_ranges(padded_window, q_len, k_len, window=5) == [(3, 10)]
    assert _key_ranges(torch.ones(1, 1, q_len, k_len, dtype=torch.bool), q_len, k_len) is None  # bidirectional
    holes = bottom_right.clone()
    holes[:, 5] = False  # a key masked in the middle (packed sequences, custom masks)
    assert _key_ranges(holes[None, None], q_len, k_len) is None
    # Rows before a row's first key are padding only if they see no key (or, torch's fix for fully
    # masked rows on older versions, every key): packed sequences' first segment is not padding.
    n = 6
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    segment = torch.arange(n) >= 2
    packed = (j <= i) & (segment[:, None] == segment[None, :])  # two sequences: tokens 0-1 and 2-5
    assert _key_ranges(packed[None, None], n, n) is None
    padded = (j <= i) & (j >= 2)  # tokens 0-1 left padding: their rows see no key
    assert _key_ranges(padded[None, None], n, n) == [(2, 6)]
    padded_fixed = padded | ~padded.any(dim=1, keepdim=True)  # sdpa_mask's allow_torch_fix
    assert _key_ranges(padded_fixed[None, None], n, n) == [(2, 6)]


def test_packed_sequences_fall_back_to_sdpa():
    """A block-diagonal (packed sequences) 4D mask is not causal with padding: every call falls back
    to sdpa, with its reason, and the first sequence's outputs are sdpa's (not zeroes)."""
    model = tiny_llama("cpu", torch.float32)
    n = 40
    ids = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(8))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    segment = torch.arange(n) >= 20
    mask = ((j <= i) & (segment[:, None] == segment[None, :]))[None, None]
    out = under_each(model, ("sdpa", "crisp_dense"), lambda m: m(input_ids=ids, attention_mask=mask).logits)
    stats = out["crisp_dense"][1]
    assert stats["crisp"] == 0 and stats["sdpa"] == 2, stats
    assert stats["fallback_reasons"] == {crisp.hf._MASK_REASON: 2}, stats
    torch.testing.assert_close(out["crisp_dense"][0], out["sdpa"][0], atol=1e-5, rtol=1e-5)


def test_head_dim_the_backend_cannot_run_falls_back_to_sdpa():
    """Head dim 512: more than the CPU backend takes (256); the layer runs on sdpa, counted."""
    model = tiny_llama("cpu", torch.float32, head_dim=512)
    ids = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(9))
    out = under_each(model, ("sdpa", "crisp"), lambda m: m(input_ids=ids).logits)
    stats = out["crisp"][1]
    assert stats["crisp"] == 0 and stats["fallback_reasons"] == {"head dim 512 on CPU": 2}, stats
    torch.testing.assert_close(out["crisp"][0], out["sdpa"][0], atol=1e-5, rtol=1e-5)


def under_each(model, impls, run):
    """{impl: (run(model), crisp.hf.stats after it)} with the model's attention set to each impl in
    turn, the statistics reset before each run, gradients off."""
    results = {}
    for impl in impls:
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        with torch.no_grad():
            results[impl] = (run(model), dict(crisp.hf.stats))
    return results


def test_unbatched_prefill_without_padding_uses_crisp_for_batch_of_two():
    model = tiny_llama("cpu", torch.float32)
    ids = torch.randint(0, 1000, (2, 300), generator=torch.Generator().manual_seed(4))
    out = under_each(model, ("sdpa", "crisp_dense"), lambda m: m(ids).logits)
    assert out["crisp_dense"][1]["crisp"] == 2
    torch.testing.assert_close(out["crisp_dense"][0], out["sdpa"][0], atol=1e-4, rtol=1e-4)


def tiny_gemma3(window, device="cpu", dtype=torch.float32):
    """A tiny random Gemma 3: a sliding-window layer of `window` keys, then a global one."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=window,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
                           query_pre_attn_scalar=64, initializer_range=0.05)
    return Gemma3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_gemma3_sliding_window_layers_run_on_crisp(device, dtype):
    """A sliding-window layer runs crisp's dense preset with the layer's window: logits equal sdpa's
    on a prompt 12 windows long, in one pass and in chunks over the cache, with no fallback."""
    model = tiny_gemma3(window=32, device=device, dtype=dtype)
    ids = torch.randint(3, 1000, (1, 384), generator=torch.Generator().manual_seed(6)).to(device)
    one_pass = under_each(model, ("sdpa", "crisp_dense"), lambda m: m(ids).logits)
    logits = {impl: result for impl, (result, _) in one_pass.items()}
    stats = one_pass["crisp_dense"][1]
    assert stats["crisp"] == 2 and stats["windowed"] == 1, stats
    assert stats["sdpa"] == 0 and stats["fallback_reasons"] == {}, stats
    # float32: 1e-4; bf16: a few ulps of the logit scale (as the Llama tests)
    scale = float(logits["sdpa"].abs().max())
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2 * scale, rtol=3e-2)
    torch.testing.assert_close(logits["crisp_dense"], logits["sdpa"], **tol)
    if dtype == torch.float32:
        # The window changed the attention: the same model without its window answers otherwise, by
        # ten times the tolerance above (on the CPU; bf16's tolerance is too coarse to show it).
        wide = tiny_gemma3(window=4096, device=device, dtype=dtype)
        wide.set_attn_implementation("sdpa")
        with torch.no_grad():
            assert (wide(ids).logits - logits["sdpa"]).abs().max() > 10 * tol["atol"]

    from transformers import DynamicCache

    def in_chunks(m):  # chunks of three windows over the growing cache
        cache_kwarg = with_cache(m, DynamicCache(config=m.config))
        return torch.cat([m(ids[:, start:start + 96], use_cache=True, **cache_kwarg).logits
                          for start in range(0, 384, 96)], dim=1)
    runs = under_each(model, ("sdpa", "crisp_dense"), in_chunks)
    chunked = {impl: result for impl, (result, _) in runs.items()}
    stats = runs["crisp_dense"][1]
    assert stats["crisp"] == 8 and stats["windowed"] == 4 and stats["sdpa"] == 0, stats
    torch.testing.assert_close(chunked["crisp_dense"], chunked["sdpa"], **tol)
    torch.testing.assert_close(chunked["crisp_dense"], logits["crisp_dense"], **tol)


def test_gemma3_greedy_generation_equals_sdpa():
    model = tiny_gemma3(window=16)
    # Token ids from 3 on: Gemma 3's pad id is 0, and generate masks pad tokens (a mask crisp
    # leaves to sdpa: holes in the keys).
    ids = torch.randint(3, 1000, (1, 200), generator=torch.Generator().manual_seed(7))
    runs = under_each(model, ("sdpa", "crisp"), lambda m: (
        m.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12), m(ids).logits))
    (tokens, logits), stats = runs["crisp"]
    # The prefill of generate and the forward pass: both layers on crisp, the window's too.
    assert stats["crisp"] == 4 and stats["windowed"] == 2, stats
    assert stats["sdpa"] == 0 and stats["decode"] == 2 * 11, stats
    torch.testing.assert_close(logits, runs["sdpa"][0][1], atol=1e-4, rtol=1e-4)
    assert tokens.tolist() == runs["sdpa"][0][0].tolist()


def test_register_rejects_bad_params():
    with pytest.raises(crisp.Error, match="alpha"):
        crisp.hf.register("crisp_bad", alpha=-2.0)


def smollm2_path():
    """The real model of issue 4 where scripts/fetch_model.sh puts it (or CRISP_MODEL_PATH)."""
    import os
    import pathlib
    if os.environ.get("CRISP_MODEL_PATH"):
        return pathlib.Path(os.environ["CRISP_MODEL_PATH"])
    root = pathlib.Path(os.environ.get("CRISP_MODEL_DIR") or pathlib.Path(__file__).resolve().parents[2] / ".cache/model")
    return root / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_chunked_prefill_generate_equals_sdpa():
    """Issue 16's acceptance on the real model: SmolLM2-135M-Instruct (transformers' GGUF loader,
    float32 on the CPU) prefilled in chunks over a filled cache, then generate: the same greedy
    answer through crisp's dense policy as through sdpa, and no fallback for any chunk."""
    for package in ("gguf", "accelerate"):  # what transformers' GGUF loader needs
        pytest.importorskip(package)
    path = smollm2_path()
    if not path.is_file():
        pytest.skip(f"model file {path} not found: run scripts/fetch_model.sh (or set CRISP_MODEL_PATH)")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    text = ("The Eiffel Tower is in Paris. The Colosseum is in Rome. The Brandenburg Gate is in Berlin. "
            "The Sagrada Familia is in Barcelona. Question: in which city is the Colosseum? Answer: The Colosseum is in")
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    chunks = [n // 3, n // 3 + 1 + n // 4]  # unaligned chunk sizes; generate prefills the rest as a chunk
    mask = torch.ones_like(ids)
    layers = model.config.num_hidden_layers
    answers = {}
    for impl in ("sdpa", "crisp_dense"):
        model.set_attn_implementation(impl)
        crisp.hf.reset_stats()
        answers[impl] = chunked_generate(model, ids, mask, chunks, max_new_tokens=8)[1][0, n:].tolist()
        if impl == "crisp_dense":
            stats = dict(crisp.hf.stats)
    assert answers["crisp_dense"] == answers["sdpa"], [tokenizer.decode(a) for a in answers.values()]
    assert stats["sdpa"] == 0 and stats["chunks"] == layers * len(chunks), stats
