"""Hugging Face decoder models as users hand them over: the KV cache in the output, a no_grad
rotary block, the ExportedProgram path, and regions kfuse must refuse rather than miscompile."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.bench.harness import max_rel_err

transformers = pytest.importorskip("transformers")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _llama(use_cache: bool = True) -> nn.Module:
    shape = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
    cfg = transformers.LlamaConfig(**shape, use_cache=use_cache)
    return transformers.LlamaModel(cfg).to(DEVICE).eval()


def _mistral() -> nn.Module:
    # sliding-window attention: its mask builder makes tensor constants in forward
    shape = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
    return transformers.MistralModel(transformers.MistralConfig(**shape, sliding_window=6)).to(DEVICE).eval()


def _neox() -> nn.Module:
    cfg = transformers.GPTNeoXConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    return transformers.GPTNeoXModel(cfg).to(DEVICE).eval()


def _ids(seq: int = 11) -> torch.Tensor:
    return torch.randint(0, 97, (2, seq), device=DEVICE)


def _tensors(cache: object) -> list[torch.Tensor]:
    """Every layer's keys then values (transformers 5: ``layers``; older: ``key_cache`` lists)."""
    if hasattr(cache, "layers"):
        return [la.keys for la in cache.layers] + [la.values for la in cache.layers]
    return list(cache.key_cache) + list(cache.value_cache)


def _cache_err(got: object, ref: object) -> float:
    """Largest relative error over every layer's keys and values of two DynamicCaches."""
    assert type(got).__name__ == type(ref).__name__ == "DynamicCache"
    pairs = list(zip(_tensors(got), _tensors(ref), strict=True))
    assert all(g.shape == r.shape for g, r in pairs)
    return max(max_rel_err(g, r) for g, r in pairs)


@pytest.mark.parametrize("build", [_llama, _mistral, _neox], ids=["llama", "mistral", "gpt-neox"])
def test_decoder_returning_its_kv_cache_compiles(build, monkeypatch) -> None:  # noqa: ANN001 - a model factory, the fixture
    # kfuse's own GEMM and attention kernels on a GPU too, where the lowering would otherwise time them
    # against cuBLAS / SDPA and may keep the library (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    # torch.export cannot return a DynamicCache until it is registered as a pytree; kfuse does that
    # on the failure and exports again, so the compiled model returns the same structure
    model = build()
    compiled = kfuse.compile(model, (_ids(),))
    x = _ids()  # other token ids than the example's
    with torch.no_grad():
        got, ref = compiled(x), model(x)
    assert max_rel_err(got.last_hidden_state, ref.last_hidden_state) < 1e-4
    assert _cache_err(got.past_key_values, ref.past_key_values) < 1e-4
    assert compiled.report["fallback"] == []
    templates = {k["template"] for k in compiled.report["kernels"]}
    assert {"gemm_epilogue", "fused_attention"} <= templates


def test_decoder_through_torch_compile_reads_each_calls_tokens() -> None:
    # HF forwards take *args: Dynamo sees the ids as args[0]; they must stay an input of the
    # compiled graph, not be frozen with the weights
    torch._dynamo.reset()
    model = _llama()
    fast = torch.compile(model, backend="kfuse")
    with torch.no_grad():
        for _ in range(2):
            x = _ids()
            got, ref = fast(x), model(x)
            assert max_rel_err(got.last_hidden_state, ref.last_hidden_state) < 1e-4
            assert _cache_err(got.past_key_values, ref.past_key_values) < 1e-4


def test_exported_program_with_a_no_grad_region_is_inlined() -> None:
    # exported with grad enabled, Llama's rotary embedding (@torch.no_grad) becomes a
    # wrap_with_set_grad_enabled sub-graph; kfuse imports it inline. No inputs given: the
    # program's own example inputs are used
    model = _llama(use_cache=False)
    x = _ids()
    with torch.enable_grad():
        ep = torch.export.export(model, (x,), strict=False)
    assert any("wrap_with_set_grad_enabled" in str(n.target) for n in ep.graph_module.graph.nodes)
    compiled = kfuse.compile(ep)
    x2 = _ids()
    with torch.no_grad():
        assert max_rel_err(compiled(x2).last_hidden_state, model(x2).last_hidden_state) < 1e-4
    assert compiled.report["fallback"] == []


class _AutocastRegion(nn.Module):
    def __init__(self, enabled: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.enabled = enabled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # autocast of the inputs' device: a CPU region around GPU ops would change nothing
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.enabled):
            y = self.lin(x).sin()
        return y.float() * 2


def test_disabled_autocast_region_is_inlined_and_enabled_one_refused(device: str) -> None:
    x = torch.randn(3, 8, device=device)
    off = _AutocastRegion(enabled=False).to(device).eval()
    with torch.enable_grad():
        ep = torch.export.export(off, (x,), strict=False)
    assert any("wrap_with_autocast" in str(n.target) for n in ep.graph_module.graph.nodes)
    compiled = kfuse.compile(ep, (x,))
    x2 = torch.randn(3, 8, device=device)
    with torch.no_grad():
        assert max_rel_err(compiled(x2), off(x2)) < 1e-5
    on = _AutocastRegion(enabled=True).to(device).eval()
    ep_on = torch.export.export(on, (x,), strict=False)
    # running it in fp32 would silently differ from the model's bf16 result
    with pytest.raises(NotImplementedError, match="autocast region"):
        kfuse.compile(ep_on, (x,))


def test_exported_program_without_example_inputs_is_a_clear_error() -> None:
    model = nn.Linear(4, 4).eval()
    ep = torch.export.export(model, (torch.randn(2, 4),))
    ep._example_inputs = None  # as a program loaded from an older save, which records none
    with pytest.raises(TypeError, match="pass them"):
        kfuse.compile(ep)


def test_moe_routing_goes_through_the_dynamo_frontend() -> None:
    """Mixtral's expert routing writes into slices that torch.export cannot functionalise: kfuse.compile falls
    back to Dynamo's frontend (as torch.compile(backend="kfuse"), which splits the graph where it must; session
    35's architecture sweep) and its report says so; ``frontend="export"`` refuses it with an error that names
    the way that works."""
    from kfuse.frontend.dynamo import DynamoCompiledModel
    from kfuse.frontend.torch_export import ExportError

    shape = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=96, num_local_experts=4, num_experts_per_tok=2)  # fmt: skip
    m = transformers.MixtralModel(transformers.MixtralConfig(**shape)).to(DEVICE).eval()
    ids = torch.randint(3, 90, (2, 11), device=DEVICE)
    with torch.no_grad():
        ref = m(ids).last_hidden_state
        with pytest.raises(ExportError, match=r'torch\.compile\(model, backend="kfuse"\)'):
            kfuse.compile(m, (ids,), frontend="export")
        torch._dynamo.reset()
        cm = kfuse.compile(m, (ids,))
        assert isinstance(cm, DynamoCompiledModel)
        rep = cm.report
        assert rep["frontend"] == "dynamo" and "functionalise" in rep["frontend_reason"] and rep["graphs"] >= 1, rep["graphs"]
        assert rep["kernels"] and rep["max_rel_err"] < (2e-2 if DEVICE == "cuda" else 1e-4)
        ids2 = torch.randint(3, 90, (2, 11), device=DEVICE)
        out, ref2 = cm(ids2).last_hidden_state, m(ids2).last_hidden_state
        torch._dynamo.reset()
        out_tc = torch.compile(m, backend="kfuse")(ids).last_hidden_state
    assert max_rel_err(out, ref2) < (2e-2 if DEVICE == "cuda" else 1e-4)
    assert max_rel_err(out_tc, ref) < (2e-2 if DEVICE == "cuda" else 1e-4)


def test_the_dynamo_fallback_report_prints() -> None:
    """The joined report of a Dynamo-compiled model has what the CLI's summary reads (and the reason)."""
    from kfuse.frontend.dynamo import DynamoCompiledModel
    from kfuse.report import plan_table, summary_lines

    class _Branch(torch.nn.Module):  # a branch on a value: torch.export cannot trace it, Dynamo breaks the graph there
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x) * 2
            if y.sum() > 10:
                return torch.tanh(y) + 1
            return y - 1

    x = torch.randn(6, 8, device=DEVICE)
    m = _Branch()
    torch._dynamo.reset()
    cm = kfuse.compile(m, (x,))
    assert isinstance(cm, DynamoCompiledModel)
    for t in (x, -x, x * 0.01):  # both branches
        torch.testing.assert_close(cm(t), m(t))
    lines = summary_lines(cm.report)
    assert any(line.startswith("frontend: Dynamo") for line in lines), lines
    assert cm.report["graphs"] >= 2 and "torch.export failed" in cm.report["frontend_reason"]
    plan_table(cm.report)


def test_a_data_dependent_shape_goes_through_dynamo() -> None:
    """``nonzero`` makes a shape depend on the values: torch.export traces it with an unbacked size, which a
    static kfuse plan cannot take; kfuse.compile goes through Dynamo, which runs the nonzero between graphs."""
    from kfuse.frontend.dynamo import DynamoCompiledModel

    class _Select(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            idx = (x[:, 0] > 0).nonzero().squeeze(1)
            return torch.relu(x[idx] * 3).sum(0) + 1

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 8, generator=gen).to(DEVICE)
    m = _Select()
    torch._dynamo.reset()
    cm = kfuse.compile(m, (x,))
    assert isinstance(cm, DynamoCompiledModel) and "depends on the data" in cm.report["frontend_reason"]
    for _ in range(3):  # other rows selected: other sizes
        t = torch.randn(9, 8, generator=gen).to(DEVICE)
        torch.testing.assert_close(cm(t), m(t))


@pytest.mark.gpu
def test_a_returned_kv_cache_survives_the_next_call_on_the_gpu() -> None:
    """Under a CUDA graph the cache's tensors are not copied out of the graph's buffers by kfuse (the
    DynamicCache rebuild copies them, ``kfuse.runtime.output_copy``): a second call must not change the first
    call's cache, nor its hidden state, which kfuse does copy."""
    model = _llama().half()
    compiled = kfuse.compile(model, (_ids(),))
    assert compiled.report["cuda_graph"] == "captured"
    assert compiled.variant.call_copies is not None and not all(compiled.variant.call_copies)
    a, b = _ids(), _ids()
    with torch.no_grad():
        got_a = compiled(a)
        got_b = compiled(b)  # replays into the same buffers
        ref_a, ref_b = model(a), model(b)
    assert max_rel_err(got_a.last_hidden_state, ref_a.last_hidden_state) < 2e-2
    assert _cache_err(got_a.past_key_values, ref_a.past_key_values) < 2e-2
    assert _cache_err(got_b.past_key_values, ref_b.past_key_values) < 2e-2
