"""Epilogue fusion: GEMM and conv anchors, graph before/after, numerics through the reference
executor and through the generated kernels (the interpreter on the CPU, compiled on a GPU) on odd shapes."""

import pytest
import torch

from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.runtime.executor import execute, lower


def _gemm_graph(m, k, n, batched=False):
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((m, k), torch.float32))
    w = b.add_constant(torch.randn(2, k, n) if batched else torch.randn(k, n))
    bias = b.add_constant(torch.randn(n))
    r = b.add_input("r", TensorType((2, m, n) if batched else (m, n), torch.float32))
    y = b.op("matmul", [x, w])
    y = b.op("add", [y, bias])
    y = b.op("gelu", [y], {"approximate": "none"})
    y = b.op("add", [y, r])
    return b.build([y])


@pytest.mark.parametrize("m,k,n", [(1, 24, 40), (37, 20, 45), (33, 70, 17)])
@pytest.mark.parametrize("batched", [False, True])
def test_gemm_chain_becomes_one_node(m, k, n, batched, device):
    g = _gemm_graph(m, k, n, batched)
    f = fuse_epilogues(g)
    assert f.op_counts() == {"gemm_epilogue": 1}
    node = f.nodes[0]
    assert node.attrs["fused_ops"] == ("matmul", "add", "gelu", "add")
    assert node.name == g.outputs[0]
    xs = [torch.randn(m, k, device=device), torch.randn((2, m, n) if batched else (m, n), device=device)]
    ref = reference_run(g, xs)[0]
    torch.testing.assert_close(reference_run(f, xs)[0], ref, rtol=1e-5, atol=1e-5)
    # backend "triton-interpreter": the template itself, with no measured swap to cuBLAS (on a GPU the kernel is compiled)
    plan = lower(f, torch.device(device), "triton-interpreter")
    assert plan.kernels[0].template == "gemm_epilogue"
    torch.testing.assert_close(execute(plan, xs)[0], ref, rtol=1e-4, atol=1e-4)


def test_escaping_value_cuts_region(device):
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((5, 8), torch.float32))
    y = b.op("matmul", [x, b.add_constant(torch.randn(8, 6))])
    z = b.op("relu", [y])
    out = b.op("tanh", [z])
    g = b.build([out, z])
    f = fuse_epilogues(g)
    assert f.op_counts() == {"gemm_epilogue": 1, "tanh": 1}
    xs = [torch.randn(5, 8, device=device)]
    for a, r in zip(reference_run(f, xs), reference_run(g, xs), strict=True):
        torch.testing.assert_close(a, r)


def test_conv_anchor(device):
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((2, 5, 9, 7), torch.float32))
    res = b.add_input("res", TensorType((2, 6, 9, 7), torch.float32))
    y = b.op("conv2d", [x, b.add_constant(torch.randn(6, 5, 3, 3)), b.add_constant(torch.randn(6))],
             {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1})  # fmt: skip
    y = b.op("add", [y, res])
    y = b.op("relu", [y])
    g = b.build([y])
    f = fuse_epilogues(g)
    assert f.op_counts() == {"conv_epilogue": 1}
    node = f.nodes[0]
    assert node.attrs["has_bias"] and node.attrs["fused_ops"] == ("conv2d", "add", "relu")
    xs = [torch.randn(2, 5, 9, 7), torch.randn(2, 6, 9, 7)]
    # the reference on the CPU: on a GPU, PyTorch's fp32 convolution would run in TF32 through cuDNN
    ref = reference_run(g, xs)[0]
    # backend "triton-interpreter": the template itself, with no measured swap to cuDNN (on a GPU the kernel is compiled)
    plan = lower(f, torch.device(device), "triton-interpreter")
    assert plan.kernels[0].template == "conv_epilogue"
    torch.testing.assert_close(execute(plan, [x.to(device) for x in xs])[0].cpu(), ref, rtol=1e-4, atol=1e-4)


def test_grouped_conv_not_an_anchor():
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((1, 4, 5, 5), torch.float32))
    y = b.op("conv2d", [x, b.add_constant(torch.randn(4, 1, 3, 3))], {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 4})
    g = b.build([b.op("relu", [y])])
    assert fuse_epilogues(g).op_counts() == {"conv2d": 1, "relu": 1}
