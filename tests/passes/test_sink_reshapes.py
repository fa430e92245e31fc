"""Operator sinking: reshapes move out of GEMM chains so epilogues can fuse."""

from __future__ import annotations

import pytest
import torch

import kfuse
import kfuse.models as zoo
from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.ir.graph import Graph
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.sink_reshapes import sink_reshapes

B, S, K, N = 2, 5, 12, 7


def conv1d_like(extra_full_operand: bool = False) -> Graph:
    """GPT-2's Conv1D: view(-1, K) -> matmul + bias -> view(B, S, N) -> gelu -> + residual."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, S, K), torch.float32))
    res = b.add_input("res", TensorType((B, S, N), torch.float32))
    x2 = b.op("reshape", [x], {"shape": (B * S, K)})
    m = b.op("matmul", [x2, b.add_constant(torch.randn(K, N))])
    other = b.add_constant(torch.randn(B * S, N)) if extra_full_operand else b.add_constant(torch.randn(N))
    y = b.op("add", [m, other])
    y = b.op("mul", [y, b.scalar(0.5)])
    y3 = b.op("reshape", [y], {"shape": (B, S, N)})
    g = b.op("gelu", [y3])
    return b.build([b.op("add", [g, res])])


def _structure(g: Graph) -> tuple:
    return [(n.name, n.op, tuple(n.inputs), n.type) for n in g.nodes], tuple(g.outputs)


def inputs(device: str) -> list[torch.Tensor]:
    return [torch.randn(B, S, K, device=device), torch.randn(B, S, N, device=device)]


def test_reshapes_leave_the_chain_and_the_epilogue_takes_it_all(device: str) -> None:
    g = conv1d_like()
    sunk = sink_reshapes(g)
    assert "reshape" not in sunk.op_counts(), str(sunk)
    mm = next(n for n in sunk.nodes if n.op == "matmul")
    assert sunk.type_of(mm.inputs[0]).shape == (B, S, K)  # type: ignore[union-attr]
    xs = inputs(device)
    torch.testing.assert_close(reference_run(sunk, xs)[0], reference_run(g, xs)[0])
    fused = fuse_epilogues(sunk)
    assert fused.op_counts() == {"gemm_epilogue": 1}, str(fused)
    torch.testing.assert_close(reference_run(fused, xs)[0], reference_run(g, xs)[0], rtol=1e-5, atol=1e-5)


def test_full_shape_operand_blocks_sinking(device: str) -> None:
    g = conv1d_like(extra_full_operand=True)
    sunk = sink_reshapes(g)
    # the add with a (B*S, N) operand cannot move past the reshape; the math stays the same
    assert sunk.op_counts().get("reshape", 0) >= 1
    xs = inputs(device)
    torch.testing.assert_close(reference_run(sunk, xs)[0], reference_run(g, xs)[0])


def test_reshape_changing_last_dim_is_left_alone() -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((4, 6), torch.float32))
    y = b.op("relu", [x])
    z = b.op("reshape", [y], {"shape": (8, 3)})
    g = b.build([z])
    out = sink_reshapes(g)
    # order and wiring, not op counts: a reshape moved above the relu has the same counts
    assert _structure(out) == _structure(g), str(out)


def test_value_used_twice_is_not_moved(device: str) -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((6, 4), torch.float32))
    y = b.op("relu", [x])
    z = b.op("reshape", [y], {"shape": (2, 3, 4)})
    g = b.build([z, y])
    out = sink_reshapes(g)
    assert _structure(out) == _structure(g), str(out)
    xs = [torch.randn(6, 4, device=device)]
    for got, ref in zip(reference_run(out, xs), reference_run(g, xs), strict=True):
        torch.testing.assert_close(got, ref)


def test_gpt2_chains_fuse_into_gemm_epilogues(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # kfuse's own kernels on a GPU too, where the lowering would time GEMMs against cuBLAS and b2b chains
    # against their unfused GEMMs and may keep either (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    monkeypatch.setenv("KFUSE_B2B_DECIDE", "rule")
    model, args, kwargs = zoo.build("gpt2-tiny", batch=2, seq=8, device=device)
    compiled = kfuse.compile(model, args, kwargs)
    counts = compiled.report["op_counts"]
    assert counts.get("reshape", 0) == 0 and counts.get("pointwise", 0) <= 1, counts
    # fc + bias + gelu_new (recognised as gelu_tanh) in one GEMM epilogue, per layer: here the
    # first stage of a b2b chain with c_proj (the 512-wide intermediate in chunks)
    fc = [k for k in compiled.report["kernels"] if k["template"] in ("gemm_epilogue", "b2b_chain") and "gelu_tanh" in k["ops"]]
    assert len(fc) == 2
    assert all(k["ops"][:3] == ["matmul", "add", "gelu_tanh"] for k in fc), fc
    assert compiled.report["max_rel_err"] < 1e-4


def test_flatten_below_a_plain_matmul_moves_to_its_input(device: str) -> None:
    """A flatten that reached a 3-D GEMM's output (GPT-2's c_proj input view, moved up through the
    GELU) moves on into the GEMM's input, so it never splits the GEMM from its epilogue."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, S, K), torch.float32))
    m = b.op("matmul", [x, b.add_constant(torch.randn(K, N))])
    flat = b.op("reshape", [m], {"shape": (B * S, N)})
    y = b.op("gelu_tanh", [b.op("add", [flat, b.add_constant(torch.randn(N))])])
    g = b.build([y])
    sunk = sink_reshapes(g)
    order = [n.op for n in sunk.nodes]
    assert order.index("reshape") < order.index("matmul"), order
    fused = fuse_epilogues(sunk)
    gemm = next(n for n in fused.nodes if n.op == "gemm_epilogue")
    assert list(gemm.attrs["fused_ops"]) == ["matmul", "add", "gelu_tanh"]
    xs = [torch.randn(B, S, K, device=device)]
    torch.testing.assert_close(reference_run(fused, xs)[0], reference_run(g, xs)[0])


class _Conv1dFrontEnd(torch.nn.Module):
    """Whisper's front end: conv1d -> GELU twice (the second strided), then a scaled ReLU; ``length`` 1 makes
    the last conv's output [N, C, 1, 1] as a conv2d, where the squeeze keeps the last dim (1)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv1d(6, 8, 3, padding=1)
        self.c2 = torch.nn.Conv1d(8, 8, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv1d(8, 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.gelu(self.c2(torch.nn.functional.gelu(self.c1(x))))
        return y, torch.relu(self.c3(y[..., :3]))


def test_a_conv1d_takes_its_activation_past_the_squeeze() -> None:
    from kfuse.frontend.torch_export import import_module

    x = torch.randn(2, 6, 11)
    model = _Conv1dFrontEnd().eval()
    g = import_module(model, (x,)).graph
    s = sink_reshapes(g)
    prod = s.node_map()
    gelus = [n for n in s.nodes if n.op == "gelu"]
    assert len(gelus) == 2 and all(prod[n.inputs[0]].op == "conv2d" for n in gelus)
    relu = next(n for n in s.nodes if n.op == "relu")
    assert prod[relu.inputs[0]].op == "reshape"  # the [N, C, 1, 1] squeeze stays where it was
    for a, b in zip(reference_run(g, [x]), reference_run(s, [x]), strict=True):
        torch.testing.assert_close(a, b)
    cm = kfuse.compile(model, (x,))
    convs = [k for k in cm.report["kernels"] if k["template"] == "conv_epilogue"]
    assert sum("gelu" in k["ops"] for k in convs) == 2, convs
    for got, want in zip(cm(x), model(x), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
