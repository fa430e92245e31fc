"""Gated-MLP recognition on imported Llama graphs and on look-alikes that must stay unfused; the
lowering's fused-vs-unfused decision runs both sides (in the interpreter on the CPU, compiled on a GPU)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse
import kfuse.models
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.kernels import gated_gemm as G
from kfuse.runtime.executor import choose_backend
from kfuse.runtime.profile import node_flops


def _graphs(model, args, kwargs=None, **opts):
    g = import_module(model, args, kwargs or {}).graph
    return optimize(g, Options(fuse_gated_mlp=False, **opts)).graph, optimize(g, Options(**opts)).graph


def _ops(g, op):
    return [n for n in g.nodes if n.op == op]


def test_llama_mlp_becomes_one_gated_gemm_per_layer(device):
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=2, seq=9, seed=3, device=device)
    off, on = _graphs(model, args, kwargs)
    gated = _ops(on, "gated_gemm")
    assert len(gated) == 2 and len(_ops(on, "gemm_epilogue")) == len(_ops(off, "gemm_epilogue")) - 2
    for n in gated:
        assert n.attrs["act"] == "silu" and n.ttype.shape == (2, 9, 256)
        assert [u.op for u in n.attrs["unfused"]] == ["gemm_epilogue", "slice", "slice", "pointwise"]
        # the merged GEMM's FLOPs (18 rows x K 128 x 2 x 256 columns), not the halved output's
        assert node_flops(n, on) == 2.0 * 18 * 128 * 512
    xs = list(args)
    for a, b in zip(reference_run(off, xs), reference_run(on, xs), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


class _Mlp(nn.Module):
    """gate/up projections in the forms that must (hf) and must not (the others) fuse."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        bias = form == "bias"
        self.gate, self.up, self.down = nn.Linear(32, 48, bias=bias), nn.Linear(32, 48, bias=bias), nn.Linear(48, 32)

    def forward(self, x: torch.Tensor):  # noqa: ANN201
        g, u = self.gate(x), self.up(x)
        if self.form == "act_on_up":
            return self.down(g * F.silu(u))
        h = self.down(F.gelu(g, approximate="tanh") * u) if self.form == "geglu" else self.down(F.silu(g) * u)
        return (h, g) if self.form == "gate_read_twice" else h


@pytest.mark.parametrize("form,fused", [("hf", True), ("geglu", True), ("act_on_up", True), ("bias", False), ("gate_read_twice", False)])
def test_only_the_gated_form_fuses(form, fused, device, monkeypatch):
    # the fused kernel by the rule on a GPU too, where the lowering would time it against the unfused
    # pair and may keep the pair (the CPU never measures; the decision has its own test below)
    monkeypatch.setenv("KFUSE_GATED_DECIDE", "rule")
    # act_on_up fuses too: the gate is then the second half of the merged weight
    x = torch.randn(3, 7, 32, device=device)
    model = _Mlp(form).to(device).eval()
    off, on = _graphs(model, (x,))
    assert len(_ops(on, "gated_gemm")) == int(fused)
    for a, b in zip(reference_run(off, [x]), reference_run(on, [x]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    compiled = kfuse.compile(model, (x,))
    x2 = torch.randn(3, 7, 32, device=device)
    with torch.no_grad():
        got, ref = compiled(x2), model(x2)
    got, ref = (got[0], ref[0]) if isinstance(ref, tuple) else (got, ref)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert ("gated_gemm" in [k["template"] for k in compiled.report["kernels"]]) == fused


def test_decision_times_the_unfused_pair_and_every_tile(monkeypatch, device):
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=1, seq=8, seed=5, device=device)
    _, g = _graphs(model, args, kwargs, fold_row_norm=False)  # the spies' tiles read the plain MLP input
    node = _ops(g, "gated_gemm")[0]
    G._DECIDED.clear()
    asked, timed = [], []
    real_time = G.graph_time_ms

    def spy_time(fn, *a, **k):
        t = real_time(fn, *a, **k)  # a timing that raises is not recorded
        timed.append((len(asked), t))  # how many fused runs had been built when this one was timed
        return t

    def fused_with(c):
        asked.append(c)
        return lambda xs: G.gated_gemm(xs[0], xs[1], config=c)

    together = []
    monkeypatch.setattr(G, "graph_time_ms", spy_time)
    monkeypatch.setattr(G, "compile_together", lambda fns, xs, wait=False: together.append((len(timed), len(fns))))
    backend = choose_backend(torch.device(device))  # "triton-interpreter" on the CPU, "triton" on a GPU
    cfg, note = G._decide(node, g, backend, Options(), fused_with)
    space = G.config_space(g.type_of(node.inputs[0]).dtype.itemsize)
    assert asked == space
    # the unfused pair first; then every tile, built once, compiled together before any is timed; then one timing each
    assert together == [(1, len(space))]
    assert [i for i, _ in timed] == [0] + [len(space)] * len(space)
    assert all(0 < t < float("inf") for _, t in timed)
    assert "inf" not in note and (cfg is None or cfg in space)
    assert G._decide(node, g, backend, Options(), None) == (cfg, note)  # identical layers: decided once
    assert len(timed) == len(space) + 1  # and nothing timed again


def test_decision_never_times_a_tile_that_computes_the_wrong_result(monkeypatch, device):
    """Session 28 found Triton 3.6 miscompiling b2b tilings on the H200; every measured decision now
    checks a candidate's output against the unfused kernels' before timing it."""
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=1, seq=8, seed=5, device=device)
    _, g = _graphs(model, args, kwargs, fold_row_norm=False)  # the spies' tiles read the plain MLP input
    node = _ops(g, "gated_gemm")[0]
    G._DECIDED.clear()
    space = G.config_space(g.type_of(node.inputs[0]).dtype.itemsize)
    bad = space[0]
    timed: list[int] = []
    real_time = G.graph_time_ms
    monkeypatch.setattr(G, "graph_time_ms", lambda fn, *a, **k: timed.append(1) or real_time(fn, *a, **k))

    def fused_with(c):
        if c == bad:  # a miscompiled tile: right shape, wrong values
            return lambda xs: -G.gated_gemm(xs[0], xs[1], config=c)
        return lambda xs: G.gated_gemm(xs[0], xs[1], config=c)

    cfg, note = G._decide(node, g, choose_backend(torch.device(device)), Options(), fused_with)
    assert cfg != bad and f"skipped {bad.describe()}: wrong result" in note
    assert len(timed) == len(space)  # the unfused pair and every tile but the wrong one
    G._DECIDED.clear()
