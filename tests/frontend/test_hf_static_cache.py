"""Generation with a static KV cache (``cache_implementation="static"``, the form Hugging Face recommends for
``torch.compile``): the decode step writes the cache in place, and every step after the first replays one
compiled plan. With a growing ``DynamicCache`` each new length would be another compile."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kfuse.frontend.dynamo import kfuse_backend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).to(DEVICE, dtype).eval()


def _cache(model: torch.nn.Module, slots: int) -> object:
    """A static cache the caller makes and passes (room for ``slots`` tokens), as a server reusing its memory would."""
    return transformers.StaticCache(config=model.config, max_cache_len=slots)


def _generate_with_kfuse(model: torch.nn.Module, ids: torch.Tensor, new: int, cache: object = None) -> tuple[torch.Tensor, list]:
    """Greedy generation the way Hugging Face compiles a static-cache decode step (``compile_config``; on the
    CPU only when asked to), with kfuse as the backend; returns the tokens and what kfuse made of each graph."""
    made: list = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> object:
        fn = kfuse_backend(gm, example_inputs, **kwargs)
        made.append(fn)
        return fn

    torch._dynamo.reset()
    config = transformers.CompileConfig(backend=backend)
    config._compile_all_devices = True  # transformers compiles on CUDA by itself, on the CPU when told to
    with torch.no_grad():
        if cache is None:
            out = model.generate(ids, max_new_tokens=new, do_sample=False, cache_implementation="static", compile_config=config)
        else:
            out = model.generate(ids, max_new_tokens=new, do_sample=False, past_key_values=cache, compile_config=config)
    return out, made


def test_static_cache_generation_equals_eager() -> None:
    model = _llama()
    ids = torch.randint(0, 97, (1, 5), device=DEVICE)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static")
    got, made = _generate_with_kfuse(model, ids, 5)
    assert torch.equal(got, want)
    assert len(made) == 1  # transformers compiles the decode step (the prefill runs eagerly)
    decode = getattr(made[0], "kfuse_compiled", None)
    assert decode is not None  # kfuse's, not left to PyTorch
    assert len(decode.variants) == 1  # one plan for every decode step
    writes = decode.report["state_writes"]
    assert all(w["how"] == "in place" for w in writes), writes
    assert sum(w["op"] == "cache_write" for w in writes) == 4  # K and V of 2 layers (and 2 length counters)
    templates = [k["template"] for k in decode.report["kernels"]]
    # the keys' rotary in their writes; each layer's key and value writes in one launch (the value's step a view)
    assert templates.count("cache_write") == 2 and templates.count("rotary") == 2


def test_a_callers_long_cache_runs_the_decode_kernel() -> None:
    """A cache with room for 48 tokens: the decode step's attention (1 query row, 2 query heads per key/value
    head, 48 slots, the unfilled ones masked) runs the split-KV decode kernel; tokens equal eager's."""
    model = _llama()
    ids = torch.randint(0, 97, (1, 5), device=DEVICE)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False, past_key_values=_cache(model, 48))
    got, made = _generate_with_kfuse(model, ids, 4, _cache(model, 48))
    assert torch.equal(got, want)
    templates = [k["template"] for k in made[0].kfuse_compiled.report["kernels"]]
    if DEVICE == "cpu":  # on a GPU the attention of each layer is timed against the dense kernel and SDPA
        assert templates.count("decode_attention") == 2, templates  # one a layer


@pytest.mark.gpu
def test_static_cache_decode_replays_one_cuda_graph_per_cache() -> None:
    """On the GPU the decode step is one CUDA graph bound to the cache's tensors: a second generation (a new
    cache) captures once more, no step copies a cache, and the tokens match eager PyTorch's."""
    model = _llama(torch.float16)
    ids = torch.randint(0, 97, (1, 7), device=DEVICE)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    got, made = _generate_with_kfuse(model, ids, 6)
    assert torch.equal(got, want)
    decode = made[0].kfuse_compiled
    runner = decode.variant.runner
    assert decode.report["cuda_graph"] == "captured" and runner is not None
    first = runner.stats()
    assert first["replays"] >= 5 and first["eager_calls"] == 0
    assert first["bound_graphs"] == 1  # the graph on the cache's own tensors; the warm-up clones are gone
    assert not any(k["template"] == "fallback" and "index_copy" in k["ops"][0] for k in decode.report["kernels"])


_SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)
FAMILIES = {  # transformers class names and what differs from _SMALL
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=1, head_dim=16)),  # multi-query
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, pad_token_id=0)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=96, word_embed_proj_dim=64)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_families_generate_as_eager_does(family: str) -> None:
    """Across decoder families (grouped- and multi-query attention, partial rotary, learned positions): the decode
    step is one kfuse graph, its cache and counters written in place, and the tokens are eager's."""
    cfg_name, model_name, extra = FAMILIES[family]
    shape = dict(_SMALL, **extra)
    if family == "opt":
        shape.pop("intermediate_size")
    cfg = getattr(transformers, cfg_name)(**shape)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(cfg).to(DEVICE).eval()
    ids = torch.randint(1, 97, (1, 5), device=DEVICE)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=3, do_sample=False, past_key_values=_cache(model, 40))
    got, made = _generate_with_kfuse(model, ids, 3, _cache(model, 40))
    assert torch.equal(got, want)
    assert len(made) == 1 and getattr(made[0], "kfuse_compiled", None) is not None, [getattr(f, "kfuse_eager", "") for f in made]
    report = made[0].kfuse_compiled.report
    assert report["state_writes"] and all(w["how"] == "in place" for w in report["state_writes"])
    assert report["fallback"] == []
    configs = [k.get("config", "") for k in report["kernels"]]
    # the positions' add folded into every write; a layer's key and value writes in one launch
    assert sum("index + offset" in c for c in configs) == cfg.num_hidden_layers, configs
    assert sum("rows in the same launch" in c for c in configs) == cfg.num_hidden_layers, configs
    if family != "opt":  # rotary families: the query's rotary is read by the attention kernel
        assert sum("query rotary folded in" in c for c in configs) == cfg.num_hidden_layers, configs


def test_kfuse_compile_of_a_decode_step_with_a_static_cache() -> None:
    """``kfuse.compile(model, (), {"past_key_values": StaticCache, ...})``: torch.export cannot take the cache, so
    Dynamo's frontend compiles the step. Compiling runs the step once to trace it; the cache (and its length
    counters) must be as before, so the caller's first call writes position 5, as eager's does."""
    import kfuse

    model = _llama()
    mine, theirs = _cache(model, 40), _cache(model, 40)
    ids = torch.randint(0, 97, (1, 5), device=DEVICE)
    with torch.no_grad():
        for cache in (mine, theirs):
            model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(5, device=DEVICE))
        before = [t.clone() for la in mine.layers for t in (la.keys, la.values)]
        compiled = kfuse.compile(model, (), {"input_ids": ids[:, :1], "past_key_values": mine, "cache_position": torch.tensor([5])})
        assert all(torch.equal(t, b) for t, b in zip([t for la in mine.layers for t in (la.keys, la.values)], before, strict=True))
        assert type(compiled).__name__ == "DynamoCompiledModel" and compiled.report["state_writes"]
        for pos in (5, 6):
            step = {"input_ids": ids[:, pos - 5 : pos - 4], "cache_position": torch.tensor([pos], device=DEVICE)}
            got = compiled(past_key_values=mine, **step).logits
            want = model(past_key_values=theirs, **step).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.layers[1].keys, theirs.layers[1].keys, rtol=1e-4, atol=1e-4)
