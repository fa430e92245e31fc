"""Operator sinking: a permute shared by an elementwise op's full-size operands moves below it."""

from __future__ import annotations

import pytest
import torch

import kfuse
from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.ir.graph import Graph
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.simplify import algebraic_simplify
from kfuse.passes.sink_permutes import sink_permutes

B, H, W, C = 2, 3, 5, 7
TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def convnext_like_block(residual: str = "permute", gamma_shape: tuple[int, ...] = (C, 1, 1)) -> Graph:
    """``x (NHWC) -> matmul + bias -> permute to NCHW -> * gamma -> + residual -> permute back``."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, H, W, C), torch.float32))
    layout = "channels_last" if residual == "channels_last" else "contiguous"
    if residual == "permute":
        r_in = b.add_input("r", TensorType((B, H, W, C), torch.float32))
        res = b.op("permute", [r_in], {"dims": TO_NCHW})
    else:  # an NCHW value: laid out channels-last (a conv's output) or plain
        res = b.add_input("r", TensorType((B, C, H, W), torch.float32, layout))
    y = b.op("add", [b.op("matmul", [x, b.add_constant(torch.randn(C, C))]), b.add_constant(torch.randn(C))])
    y = b.op("permute", [y], {"dims": TO_NCHW})
    y = b.op("mul", [y, b.add_constant(torch.rand(gamma_shape) + 0.5)])
    y = b.op("add", [res, y])
    return b.build([b.op("permute", [y], {"dims": TO_NHWC})])


def inputs(g: Graph, device: str) -> list[torch.Tensor]:
    xs = []
    for _, t in g.inputs:
        v = torch.randn(t.shape, device=device)
        xs.append(v.contiguous(memory_format=torch.channels_last) if t.layout == "channels_last" else v)
    return xs


@pytest.mark.parametrize("residual", ["permute", "channels_last"])
def test_the_permutes_leave_and_the_epilogue_takes_the_chain(residual: str, device: str) -> None:
    g = convnext_like_block(residual)
    sunk = algebraic_simplify(sink_permutes(g))
    # the permute pair around the chain cancels; only the residual's view of an NHWC value stays
    assert sunk.op_counts().get("permute", 0) == (1 if residual == "channels_last" else 0), str(sunk)
    xs = inputs(g, device)
    torch.testing.assert_close(reference_run(sunk, xs)[0], reference_run(g, xs)[0])
    fused = fuse_epilogues(sunk)
    assert fused.op_counts().get("gemm_epilogue") == 1 and "add" not in fused.op_counts(), str(fused)
    torch.testing.assert_close(reference_run(fused, xs)[0], reference_run(g, xs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma_shape", [(C, 1, 1), (1, C, 1, 1), (1,), ()])
def test_broadcast_operands_are_permuted_with_the_output(gamma_shape: tuple[int, ...], device: str) -> None:
    g = convnext_like_block("permute", gamma_shape)
    sunk = algebraic_simplify(sink_permutes(g))
    assert "permute" not in sunk.op_counts(), str(sunk)
    xs = inputs(g, device)
    torch.testing.assert_close(reference_run(sunk, xs)[0], reference_run(g, xs)[0])


def test_a_plain_full_size_operand_keeps_the_graph() -> None:
    # an NCHW-contiguous residual would be read through a new permute: not rewritten
    g = convnext_like_block("contiguous")
    sunk = sink_permutes(g)
    add = next(n for n in sunk.nodes if n.op == "add" and "r" in n.inputs)
    assert add.ttype.shape == (B, C, H, W)


def test_different_permutes_keep_the_graph() -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, C, C, C), torch.float32))
    a1 = b.op("permute", [x], {"dims": (0, 2, 3, 1)})
    a2 = b.op("permute", [x], {"dims": (0, 3, 1, 2)})
    g = b.build([b.op("add", [a1, a2])])
    assert sink_permutes(g).op_counts() == g.op_counts()


def test_a_unary_op_and_a_graph_output_keep_their_values(device: str) -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, H, W, C), torch.float32))
    p = b.op("permute", [x], {"dims": TO_NCHW})
    private = b.op("permute", [b.op("neg", [x])], {"dims": TO_NCHW})
    g = b.build([b.op("gelu", [p]), p, b.op("gelu", [private])])
    sunk = sink_permutes(g)
    assert sunk.outputs == g.outputs
    gelus = [n for n in sunk.nodes if n.op == "gelu"]
    # the permute that is also an output stays, so its gelu stays in its frame; the private one moves
    assert gelus[0].inputs == (p,) and sunk.node_map()[gelus[1].inputs[0]].op == "neg"
    xs = inputs(g, device)
    for got, want in zip(reference_run(sunk, xs), reference_run(g, xs), strict=True):
        torch.testing.assert_close(got, want)


def test_a_permute_read_by_others_too_keeps_its_elementwise_readers() -> None:
    """Swin-V2's cosine attention: ``q * q`` and ``q / norm`` both read the permuted ``q``; sinking the permute
    below ``q * q`` would part it from the sum over the head dim and the divide that follow in q's frame."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, H, W, C), torch.float32))
    q = b.op("permute", [x], {"dims": (0, 2, 1, 3)})
    sq = b.op("mul", [q, q])
    norm = b.op("sqrt", [b.op("sum", [sq], {"dims": (3,), "keepdim": True})])
    g = b.build([b.op("div", [q, norm])])
    assert sink_permutes(g) is g


def test_convnext_residual_adds_join_the_mlp_and_norm_kernels(device: str) -> None:
    """ConvNeXt's blocks: no residual add is left as its own kernel; the compiled model matches."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[2, 1], layer_scale_init_value=0.5, num_stages=2)
    model = transformers.ConvNextModel(cfg).to(device).eval()
    x = torch.randn(1, 3, 32, 32, device=device)
    compiled = kfuse.compile(model, (x,))
    report = compiled.report
    assert report["op_counts"].get("pointwise", 0) <= 1, report["op_counts"]  # the pooler's mean only
    if device == "cpu":  # on a GPU the b2b decision is measured and may leave the two GEMMs apart
        epilogues = [k.get("epilogue", "") for k in report["kernels"] if k["template"] == "b2b_chain"]
        assert any(e.endswith("add(in2)") for e in epilogues), epilogues
    tol = 1e-4 if device == "cpu" else 2e-3  # on a GPU eager's fp32 cuDNN convs run in TF32 (cudnn.allow_tf32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x)[0], rtol=tol, atol=tol)


def test_a_channels_last_value_alone_is_left_as_it_is() -> None:
    """relu(conv output) has no permute to move: the graph comes back unchanged, at once (the first version of
    the pass rewrote such a node back and forth until its rewrite budget ran out)."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, C, H, W), torch.float32, "channels_last"))
    y = b.op("relu", [x])
    g = b.build([b.op("add", [y, x])])
    assert sink_permutes(g) is g
