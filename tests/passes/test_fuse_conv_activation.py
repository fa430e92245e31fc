"""A depthwise conv takes the clamp / ReLU / SiLU after it; other convs and shared outputs keep theirs."""

from __future__ import annotations

import pytest
import torch

import kfuse
from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.passes.fuse_conv_activation import fuse_conv_activation

C = 6


def conv_then(act: str, groups: int = C, second_user: bool = False):
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, C, 5, 7), torch.float32))
    w = b.add_constant(torch.randn(C, C // groups, 3, 3))
    y = b.op("conv2d", [x, w, b.add_constant(torch.randn(C))], {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": groups})
    a = b.op(act, [y], {"lo": 0.0, "hi": 6.0} if act == "clamp" else {})
    return b.build([a, y] if second_user else [a])


@pytest.mark.parametrize("act", ["relu", "clamp", "silu", "gelu", "hardswish", "hardsigmoid"])
def test_depthwise_conv_takes_its_activation(act: str) -> None:
    g = conv_then(act)
    fused = fuse_conv_activation(g)
    assert fused.op_counts() == {"conv2d": 1}, str(fused)
    (conv,) = fused.nodes
    assert conv.name == g.outputs[0] and conv.attrs["act"][0] == (act if act not in ("relu", "clamp") else "clamp")
    x = 4 * torch.randn(2, C, 5, 7)
    torch.testing.assert_close(reference_run(fused, [x])[0], reference_run(g, [x])[0])


@pytest.mark.parametrize("groups,second_user", [(1, False), (2, False), (C, True)])
def test_other_convs_and_shared_outputs_are_left(groups: int, second_user: bool) -> None:
    g = conv_then("relu", groups, second_user)
    assert fuse_conv_activation(g) is g


class _InvertedResidual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = torch.nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.bn = torch.nn.BatchNorm2d(C).eval()
        self.pw = torch.nn.Conv2d(C, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(torch.nn.functional.relu6(self.bn(self.dw(x))))


def test_compiled_block_runs_the_activation_in_the_depthwise_step(device: str) -> None:
    torch.manual_seed(0)
    model, x = _InvertedResidual().to(device).eval(), torch.randn(2, C, 9, 11, device=device)
    cm = kfuse.compile(model, (x,))
    assert "pointwise" not in cm.report["op_counts"], cm.report["op_counts"]
    assert cm.report["fallback"] == [], cm.report["fallback"]  # aten.relu6 is a clamp since session 37
    steps = [k for k in cm.report["kernels"] if "conv2d" in k["ops"] and "depthwise" in k.get("config", "")]
    assert steps and "+ clamp" in steps[0]["config"], cm.report["kernels"]
    tol = 1e-4 if device == "cpu" else 2e-3  # eager's fp32 cuDNN convs run in TF32 on a GPU
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=tol, atol=tol)


def test_through_the_views_between_conv_and_activation() -> None:
    """SegFormer's Mix-FFN: ``dwconv -> flatten(2) -> GELU -> transpose``."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, C, 5, 7), torch.float32))
    w = b.add_constant(torch.randn(C, 1, 3, 3))
    y = b.op("conv2d", [x, w], {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": C})
    f = b.op("reshape", [y], {"shape": (2, C, 35)})
    g = b.build([b.op("permute", [b.op("gelu", [f])], {"dims": (0, 2, 1)})])
    fused = fuse_conv_activation(g)
    assert fused.op_counts() == {"conv2d": 1, "reshape": 1, "permute": 1}, str(fused)
    xv = torch.randn(2, C, 5, 7)
    torch.testing.assert_close(reference_run(fused, [xv])[0], reference_run(g, [xv])[0])
