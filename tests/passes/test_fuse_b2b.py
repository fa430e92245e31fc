"""fuse_b2b: eligible GEMM/conv chains become one ``b2b_chain`` node; ineligible ones stay,
with the reason recorded; fused graphs compute what the original graphs compute."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kfuse
from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_b2b import fuse_b2b
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.runtime.executor import execute, lower


@pytest.fixture(autouse=True)
def _fresh_decisions() -> None:
    """Each test measures its own decisions (the lowering caches them per process)."""
    from kfuse.kernels.b2b import lower as k

    k._DECIDED.clear()


def _linear(b: GraphBuilder, x: str, k: int, n: int, act: str | None = "relu") -> str:
    w = b.add_constant(torch.randn(k, n) / k**0.5)
    bias = b.add_constant(torch.randn(n))
    y = b.op("add", [b.op("matmul", [x, w]), bias])
    return b.op(act, [y]) if act else y


def _mlp(widths: list[int], m: int = 13, k0: int = 24, extra_use: int | None = None) -> Graph:
    b = GraphBuilder("mlp")
    x = b.add_input("x", TensorType((m, k0), torch.float32))
    h, k, outs = x, k0, []
    for i, n in enumerate(widths):
        h = _linear(b, h, k, n, "relu" if i < len(widths) - 1 else None)
        if extra_use == i:
            outs.append(b.op("mul", [h, b.scalar(2.0)]))
        k = n
    return b.build([h, *outs])


def _conv(b: GraphBuilder, x: str, c: int, oc: int, k: int, stride: int = 1, pad: int = 0) -> str:
    w = b.add_constant(torch.randn(oc, c, k, k) / (c * k * k) ** 0.5)
    bias = b.add_constant(torch.randn(oc))
    return b.op("relu", [b.op("conv2d", [x, w, bias], {"stride": (stride, stride), "padding": (pad, pad)})])


def _run(g: Graph) -> tuple[Graph, list[torch.Tensor], list[torch.Tensor]]:
    """The pass, and both graphs through the reference executor: PyTorch only, no kernel, so on the CPU
    on any machine (the kernels are run by the tests that lower a plan)."""
    fused = fuse_b2b(fuse_epilogues(g))
    xs = [torch.randn(t.shape) for _, t in g.inputs]
    return fused, reference_run(g, xs), reference_run(fused, xs)


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def _reasons(g: Graph) -> list[str]:
    return [n.attrs["b2b"] for n in g.nodes if isinstance(n.attrs.get("b2b"), str) and n.attrs["b2b"].startswith("not fused")]


@pytest.mark.parametrize("widths", [[16, 32], [64, 128, 48], [256, 256, 256, 4]])
def test_mlp_chain_fuses_whole(widths: list[int]) -> None:
    g, ref, got = _run(_mlp(widths))
    assert g.op_counts() == {"b2b_chain": 1}
    node = g.nodes[0]
    assert list(node.attrs["widths"]) == widths
    assert node.attrs["chain"].stages[0].has_bias is False  # the bias is in the GEMM epilogue
    _close(ref, got)


def test_intermediate_used_twice_is_not_fused() -> None:
    g, ref, got = _run(_mlp([32, 16], extra_use=0))
    assert "b2b_chain" not in g.op_counts()
    assert any("used 2 times" in r for r in _reasons(g))
    _close(ref, got)


def test_wide_intermediate_is_not_fused_and_chain_stops_there() -> None:
    g, ref, got = _run(_mlp([64, 512, 32]))
    # 24 -> 64 -> 512 fuses (N0=64 resident); 512 -> 32 would need N0=512 resident
    assert g.op_counts() == {"b2b_chain": 1, "gemm_epilogue": 1}
    chain = next(n for n in g.nodes if n.op == "b2b_chain")
    assert "N0=512" in chain.attrs["b2b_stopped"] and "> 256" in chain.attrs["b2b_stopped"]
    _close(ref, got)


def test_wide_intermediate_fuses_chunked_in_two_stage_chains(device: str) -> None:
    """Past 256 columns a two-GEMM chain still fuses (the intermediate made and consumed in
    column chunks); the chain then stops at two stages, and the lowering runs the chunked kernel."""
    g, ref, got = _run(_mlp([512, 32]))
    assert g.op_counts() == {"b2b_chain": 1}
    _close(ref, got)
    g3, ref3, got3 = _run(_mlp([512, 32, 16]))
    assert g3.op_counts() == {"b2b_chain": 1, "gemm_epilogue": 1}
    chain = next(n for n in g3.nodes if n.op == "b2b_chain")
    assert list(chain.attrs["widths"]) == [512, 32] and "two stages only" in chain.attrs["b2b_stopped"]
    _close(ref3, got3)
    # backend "triton-interpreter": the rule's config, not a measured decision (on a GPU the kernel is compiled)
    plan = lower(g, torch.device(device), "triton-interpreter")
    x = torch.randn(13, 24)
    torch.testing.assert_close(execute(plan, [x.to(device)])[0].cpu(), reference_run(g, [x])[0], rtol=1e-3, atol=1e-3)
    assert plan.steps[0].b2b["residence"] == "chunked"


@pytest.mark.parametrize("widths,k0,why", [([512, 30], 24, "16-byte rows"), ([512, 32], 300, "K0 <= 256")])
def test_wide_intermediate_that_cannot_be_chunked_is_not_fused(widths: list[int], k0: int, why: str) -> None:
    g, ref, got = _run(_mlp(widths, k0=k0))
    assert "b2b_chain" not in g.op_counts()
    assert any("N0=512" in r and why in r for r in _reasons(g))
    _close(ref, got)


def test_weight_not_constant_is_not_fused() -> None:
    b = GraphBuilder("dyn")
    x = b.add_input("x", TensorType((9, 16), torch.float32))
    w1 = b.add_input("w1", TensorType((32, 8), torch.float32))
    h = _linear(b, x, 16, 32)
    y = b.op("matmul", [h, w1])
    g, ref, got = _run(b.build([y]))
    assert "b2b_chain" not in g.op_counts()
    assert any("not a constant" in r for r in _reasons(g))
    _close(ref, got)


def _convnet(second_k: int, second_pad: int, second_stride: int = 1, c0: int = 16) -> Graph:
    b = GraphBuilder("convs")
    x = b.add_input("x", TensorType((2, 8, 7, 6), torch.float32))
    h = _conv(b, x, 8, c0, 3, 1, 1)
    y = _conv(b, h, c0, 12, second_k, second_stride, second_pad)
    return b.build([y])


def test_conv3x3_then_1x1_fuses() -> None:
    g, ref, got = _run(_convnet(1, 0))
    assert g.op_counts() == {"b2b_chain": 1}
    chain = g.nodes[0].attrs["chain"]
    assert chain.conv and all(s.has_bias for s in chain.stages)
    _close(ref, got)


@pytest.mark.parametrize(
    "k,pad,stride,c0,why",
    [(3, 1, 1, 16, "is 3x3"), (1, 0, 2, 16, "stride (2, 2)"), (1, 1, 1, 16, "padded (1, 1)"), (1, 0, 1, 320, "N0=320")],
)
def test_ineligible_conv_chain_keeps_reason(k: int, pad: int, stride: int, c0: int, why: str) -> None:
    g, ref, got = _run(_convnet(k, pad, stride, c0))
    assert "b2b_chain" not in g.op_counts()
    assert any(why in r for r in _reasons(g)), _reasons(g)
    _close(ref, got)


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(20, 48)
        self.b = nn.Linear(48, 40)
        self.c = nn.Linear(40, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.c(torch.nn.functional.gelu(self.b(h))) + h.sum(-1, keepdim=True)


def test_compile_end_to_end_report(device: str) -> None:
    """Through ``kfuse.compile``: the report's b2b section lists the fused chain and the
    reason the first layer stayed out (its output is read twice)."""
    m = _MLP().to(device)
    x = torch.randn(2, 7, 20, device=device)
    c = kfuse.compile(m, (x,))
    rep = c.report["b2b"]
    assert len(rep["fused"]) == 1 and len(rep["fused"][0]["stages"]) == 2
    assert rep["fused"][0]["residence"] in ("register", "smem")
    assert any("used 2 times" in r["reason"] for r in rep["not_fused"])
    assert c.report["max_rel_err"] < 1e-4
    off = kfuse.compile(m, (x,), fuse_b2b=False)
    assert off.report["b2b"] == {"fused": [], "not_fused": []}
    torch.testing.assert_close(c(x), off(x), rtol=1e-4, atol=1e-4)


def test_kernel_plan_runs_fused_chain(device: str) -> None:
    """Lowered on the interpreter backend (the rule's config, no measured decision; on a GPU the
    kernel is compiled), the chain runs the b2b template."""
    g = fuse_b2b(fuse_epilogues(_mlp([32, 64, 16], m=11)))
    plan = lower(g, torch.device(device), "triton-interpreter")
    assert [k.template for k in plan.kernels] == ["b2b_chain"]
    x = torch.randn(11, 24)
    torch.testing.assert_close(execute(plan, [x.to(device)])[0].cpu(), reference_run(g, [x])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,batch,n_chains", [("nerf-mlp", 3, 1), ("mlp-tiny", 5, 1), ("repvgg-tiny", 1, 6), ("mixer-tiny", 1, 4)])
def test_zoo_models_fuse(name: str, batch: int, n_chains: int, device: str) -> None:
    import kfuse.models

    model, args, kwargs = kfuse.models.build(name, batch=batch, device=device)
    c = kfuse.compile(model, args, kwargs)
    assert len(c.report["b2b"]["fused"]) == n_chains
    assert c.report["max_rel_err"] < 1e-3


@pytest.mark.parametrize("fused_faster", [True, False])
def test_decision_keeps_the_faster(monkeypatch: pytest.MonkeyPatch, fused_faster: bool, device: str) -> None:
    """The GPU decision path (timings mocked): the faster of fused / unfused is kept, and the
    step records both times, the configs tried and the residence."""
    from kfuse.kernels.b2b import lower as k

    g = fuse_b2b(fuse_epilogues(_mlp([32, 16], m=9)))
    node = g.nodes[0]
    calls = iter(range(100))

    def fake_time(fn, reps: int = 20) -> float:  # noqa: ANN001
        fn()  # every candidate really runs
        i = next(calls)
        if i == 0:  # the unfused chain is timed first
            return 1.0
        return 0.5 + i * 0.01 if fused_faster else 2.0

    monkeypatch.setattr(k, "graph_time_ms", fake_time)
    two = lambda m, w, k0=None, image=None, elem=2, sms=132: [k.default_config(m, w, "register"), k.default_config(m, w, "smem")]  # noqa: E731
    monkeypatch.setattr(k, "candidate_configs", two)
    step = k.lower_b2b_chain(node, g, "triton-interpreter")
    run, template, d = k._decide(node, g, "triton-interpreter", None, lambda cfg: step.fn, 9, [32, 16])
    assert d["decided_by"] == "measured" and d["unfused_ms"] == 1.0 and len(d["tried"]) == 2
    if fused_faster:
        assert template == "b2b_chain" and d["fused"] and d["residence"] == "register" and d["fused_ms"] == 0.51
    else:
        assert template == "b2b_chain(unfused)" and not d["fused"] and d["residence"] == "none"
    x = torch.randn(9, 24)
    xs = [x.to(device)] + [g.constants[i].to(device) for i in node.inputs[1:]]
    torch.testing.assert_close(run(xs).cpu(), reference_run(g, [x])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("enabled", [False, True])
def test_tma_conv_candidates_only_when_enabled(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    """``Options.b2b_conv_tma`` (on by default) puts the TMA conv-chain kernel's candidates in the
    decision; off, only the pointer-based kernels are measured."""
    from kfuse.compiler import Options
    from kfuse.kernels.b2b import lower as k

    g = fuse_b2b(fuse_epilogues(_convnet(1, 0)))
    node = g.nodes[0]
    tried: list[object] = []

    def fake_time(fn, reps: int = 20) -> float:  # noqa: ANN001
        return 1.0

    monkeypatch.setattr(k, "graph_time_ms", fake_time)
    real = k.candidate_configs
    cands = real(84, [16, 12])
    assert any(c.tile_h > 0 for c in cands)  # the list itself has them
    monkeypatch.setattr(k, "candidate_configs", lambda m, w, k0=None, image=None, elem=2, sms=132: cands)
    fused_with = lambda cfg: tried.append(cfg) or (lambda xs: None)  # noqa: E731
    k._decide(node, g, "triton-interpreter", Options(b2b_conv_tma=enabled), fused_with, 84, [16, 12])
    assert any(c.tile_h > 0 for c in tried) == enabled
    assert len(tried) == sum(1 for c in cands if enabled or c.tile_h == 0)
    assert Options().b2b_conv_tma


def test_identical_chains_reuse_the_measured_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second chain with the same stages and operand shapes takes the first one's decision
    without measuring (ResNet-50 repeats its bottlenecks); another shape measures again."""
    from kfuse.kernels.b2b import lower as k

    timed: list[int] = []

    def fake_time(fn, reps: int = 20) -> float:  # noqa: ANN001
        timed.append(1)
        return 1.0 if len(timed) == 1 else 0.5

    monkeypatch.setattr(k, "graph_time_ms", fake_time)
    monkeypatch.setattr(k, "candidate_configs", lambda m, w, k0=None, image=None, elem=2, sms=132: [k.default_config(m, w, "register")])
    g = fuse_b2b(fuse_epilogues(_mlp([32, 16], m=9)))
    node = g.nodes[0]
    step = k.lower_b2b_chain(node, g, "triton-interpreter")
    _, t1, d1 = k._decide(node, g, "triton-interpreter", None, lambda cfg: step.fn, 9, [32, 16])
    assert len(timed) == 2 and t1 == "b2b_chain" and d1["decided_by"] == "measured"
    _, t2, d2 = k._decide(node, g, "triton-interpreter", None, lambda cfg: step.fn, 9, [32, 16])
    assert len(timed) == 2, "the identical chain was measured again"
    assert t2 == t1 and d2["config"] == d1["config"] and "identical chain" in d2["decided_by"]
    g2 = fuse_b2b(fuse_epilogues(_mlp([32, 16], m=11)))
    step2 = k.lower_b2b_chain(g2.nodes[0], g2, "triton-interpreter")  # its own kernel: the decision checks its output
    k._decide(g2.nodes[0], g2, "triton-interpreter", None, lambda cfg: step2.fn, 11, [32, 16])
    assert len(timed) == 4  # another M: measured


@pytest.mark.parametrize("enabled", [False, True])
def test_pdl_candidates_only_with_the_option(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    """Programmatic dependent launch is opt-in (``Options.b2b_pdl``) until measured on the H200."""
    from kfuse.compiler import Options
    from kfuse.kernels.b2b import lower as k

    monkeypatch.setattr(k, "graph_time_ms", lambda fn, reps=20: 1.0)
    g = fuse_b2b(fuse_epilogues(_mlp([32, 16], m=9)))
    node = g.nodes[0]
    cands = k.candidate_configs(262144, [64, 64], 64)
    assert any(c.pdl for c in cands)
    monkeypatch.setattr(k, "candidate_configs", lambda m, w, k0=None, image=None, elem=2, sms=132: cands)
    tried: list[object] = []
    fused_with = lambda cfg: tried.append(cfg) or (lambda xs: None)  # noqa: E731
    k._decide(node, g, "triton-interpreter", Options(b2b_pdl=enabled), fused_with, 9, [32, 16])
    assert any(c.pdl for c in tried) == enabled and not Options().b2b_pdl


def test_report_says_what_each_chain_became(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """The human-readable summary has one line per chain: fused with which config, or kept
    unfused, with the measured times and what the unfused stages run; and the links not fused."""
    from kfuse.report import b2b_lines, summary_lines

    # the compiled line is the rule's: on a GPU the decision would otherwise be measured
    monkeypatch.setenv("KFUSE_B2B_DECIDE", "rule")
    m = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16)).eval().to(device)
    c = kfuse.compile(m, (torch.randn(11, 24, device=device),))
    lines = [ln for ln in summary_lines(c.report) if ln.startswith("b2b ")]
    assert len(lines) == 1 and ": fused, register" in lines[0] and "(rule)" in lines[0], lines
    stage = "gemm_epilogue 64x128x256 g1 w4 s4 tma resident"
    measured = {
        "fused": [{"node": "add_7", "stages": ["relu_4", "add_7"], "widths": [256, 256], "fused": False, "fused_ms": 0.2245,
                   "unfused_ms": 0.1578, "decided_by": "measured", "unfused_kernels": [stage, stage]}],
        "not_fused": [{"node": "relu_9", "reason": "intermediate used twice"}],
    }  # fmt: skip
    got = b2b_lines(measured)
    assert got[0].startswith("b2b add_7 (relu_4 -> add_7, widths [256, 256]): kept unfused; measured fused 0.2245 ms vs unfused 0.1578 ms")
    assert "unfused stages: gemm_epilogue 64x128x256" in got[0]
    assert got[1] == "b2b not fused at relu_9: intermediate used twice"
    assert b2b_lines(None) == [] and b2b_lines({"fused": [], "not_fused": []}) == []


def test_vit_ti16_ffns_fuse_as_chunked_chains(device: str) -> None:
    """ViT-Ti/16 (DeiT-Tiny): every FFN (192 -> 768 -> 192, GELU, residual) is a two-stage chain
    with a 768-wide intermediate, fused by the default pipeline, and the fused graph computes
    what the imported one computes (on a 2-layer cut of the same widths, to keep the CPU run short)."""
    from kfuse.compiler import Options, optimize
    from kfuse.frontend.torch_export import import_module
    from kfuse.models import vit

    model, args, kwargs = kfuse.models.build("vit-ti16", batch=1)
    g = optimize(import_module(model, args, kwargs).graph, Options()).graph
    chains = [n for n in g.nodes if n.op == "b2b_chain"]
    assert len(chains) == 12 and all(list(n.attrs["widths"]) == [768, 192] for n in chains)
    small = vit.build_vit("vit-ti16", num_hidden_layers=2, image_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    imported = import_module(small, (x,), {}).graph
    fused = optimize(imported, Options(layout="nchw")).graph
    assert fused.op_counts().get("b2b_chain") == 2
    _close(reference_run(imported, [x]), reference_run(fused, [x]))
    # the chunked kernel itself (the rule's config; on a GPU compiled), against the reference on the CPU
    plan = lower(fused, torch.device(device), "triton-interpreter")
    assert [s.b2b["residence"] for s in plan.steps if hasattr(s, "b2b")] == ["chunked", "chunked"]
    torch.testing.assert_close(execute(plan, [x.to(device)])[0].cpu(), reference_run(imported, [x])[0], rtol=1e-3, atol=1e-3)


def test_chunked_chain_runs_unfused_before_hopper(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A chain past 256 columns fuses only through the chunked kernel, which needs TMA: on a GPU
    before Hopper the lowering runs the pair, by rule, and says why."""
    from kfuse.kernels.b2b import lower as k

    monkeypatch.setattr(k, "_tma_gpu", lambda: False)
    g, ref, _ = _run(_mlp([512, 32]))
    step = k.lower_b2b_chain(g.nodes[0], g, "triton")
    assert step.info.template == "b2b_chain(unfused)" and "needs TMA" in step.b2b["config"] and step.b2b["decided_by"] == "rule"
    x = torch.randn(13, 24)
    got = step.fn([x.to(device)] + [g.constants[i].to(device) for i in g.nodes[0].inputs[1:]])
    torch.testing.assert_close(got.cpu(), reference_run(g, [x])[0], rtol=1e-3, atol=1e-3)


def _nhwc_convnet(c_in: int = 8) -> Graph:
    """A 3x3 -> 1x1 conv chain after the layout pass (NHWC inside the graph)."""
    from kfuse.passes.layout import layout_pass

    b = GraphBuilder("convs")
    x = b.add_input("x", TensorType((2, c_in, 9, 6), torch.float32))
    h = _conv(b, x, c_in, 16, 3, 1, 1)
    y = _conv(b, h, 16, 16, 1, 1, 0)
    return fuse_b2b(fuse_epilogues(layout_pass()(b.build([y]))))


def test_where_the_tma_conv_kernel_runs_only_its_tilings_are_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stride-1 NHWC conv chain with 16-byte channel rows runs ``b2b_conv_tma_kernel`` for its TMA tilings;
    there the pointer-based tilings (which lost every recorded H200 decision) are not compiled or timed.
    Channel rows not 16-byte aligned, NCHW, or the TMA conv kernel turned off: every tiling is measured."""
    from kfuse.compiler import Options
    from kfuse.kernels.b2b import lower as k

    monkeypatch.setattr(k, "graph_time_ms", lambda fn, reps=20: 1.0)

    def tried_on(g: Graph, options: object = None) -> tuple[list[object], list[object]]:
        node = next(n for n in g.nodes if n.op == "b2b_chain")
        m, widths = k._rows(g, node, node.attrs["chain"]), list(node.attrs["widths"])
        image = tuple(int(v) for v in (node.attrs["out_type"].shape[0], *node.attrs["out_type"].shape[2:]))
        cands = k.candidate_configs(m, widths, None, image, elem=4)
        tried: list[object] = []
        k._DECIDED.clear()
        k._decide(node, g, "triton-interpreter", options, lambda cfg: tried.append(cfg) or (lambda xs: None), m, widths)
        return tried, cands

    g = _nhwc_convnet()
    node = next(n for n in g.nodes if n.op == "b2b_chain")
    assert k._conv_tma_runs(node, g)
    tried, cands = tried_on(g)
    assert tried and all(c.tile_h > 0 for c in tried) and len(tried) == sum(c.tile_h > 0 for c in cands) < len(cands)
    odd = _nhwc_convnet(c_in=6)  # 24-byte channel rows: no TMA box
    assert not k._conv_tma_runs(next(n for n in odd.nodes if n.op == "b2b_chain"), odd)
    for other, options in ((odd, None), (fuse_b2b(fuse_epilogues(_convnet(1, 0))), None), (g, Options(b2b_conv_tma=False))):
        tried, cands = tried_on(other, options)
        assert any(c.tile_h == 0 for c in tried)  # the pointer-based tilings are measured


def test_first_calls_tell_a_gpu_fault_from_a_failure() -> None:
    """A candidate whose first call faults the GPU is marked "fault:" (the decision then stops the compile with
    the candidates named, kfuse.runtime.cuda_fault), one that only fails "failed:", and a right one passes."""
    from kfuse.kernels.b2b import lower

    xs = [torch.randn(4, 8)]

    def fault(xs):  # noqa: ANN001, ANN202
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def fails(xs):  # noqa: ANN001, ANN202
        raise ValueError("b2b: chunked residence needs TMA")

    errs = lower._first_calls([fault, fails, lambda xs: xs[0] * 1.0], xs, ref=xs[0])
    assert errs[0].startswith("fault: RuntimeError") and "illegal memory access" in errs[0]
    assert errs[1] == "failed: ValueError" and errs[2] is None
