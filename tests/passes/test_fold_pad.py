"""Zero padding in front of a conv: imported as a ``pad`` op (none when it pads nothing) and absorbed into the
conv's padding (Hugging Face's MobileNet-V2 pads before every conv, TF style); an asymmetric one leaves the rest
as the conv's ``pad_end``, which every conv kernel honours."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.passes.fold_pad import fold_pad


def conv_after_pad(pads: tuple[int, ...], value: float = 0.0, second_user: bool = False):
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, 3, 7, 8), torch.float32))
    p = b.op("pad", [x], {"pads": pads, "value": value})
    w = b.add_constant(torch.randn(4, 3, 3, 3))
    y = b.op("conv2d", [p, w], {"stride": (1, 1), "padding": (1, 0), "dilation": (1, 1), "groups": 1})
    return b.build([y, p] if second_user else [y])


@pytest.mark.parametrize(
    "pads,value,second_user,folds",
    [((1, 1, 2, 2), 0.0, False, True), ((2, 2), 0.0, False, True), ((0, 1, 0, 1), 0.0, False, True),
     ((1, 2, 0, 3), 0.0, False, True), ((1, 0, 0, 0), 0.0, False, False),
     ((1, 1, 1, 1), 0.5, False, False), ((1, 1, 1, 1), 0.0, True, False), ((1, 1, 1, 1, 1, 1), 0.0, False, False)],
)  # fmt: skip
def test_zero_pads_join_the_conv(pads, value, second_user, folds) -> None:
    if len(pads) == 6:  # a pad of the channels too: the conv's weight would not fit; build a matching one
        b = GraphBuilder()
        x = b.add_input("x", TensorType((2, 3, 7, 8), torch.float32))
        p = b.op("pad", [x], {"pads": pads, "value": value})
        y = b.op(
            "conv2d", [p, b.add_constant(torch.randn(4, 5, 3, 3))], {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
        )
        g = b.build([y])
    else:
        g = conv_after_pad(pads, value, second_user)
    folded = fold_pad(g)
    assert ("pad" not in folded.op_counts()) == folds, str(folded)
    if folds and len(pads) == 4 and (pads[0] != pads[1] or pads[2] != pads[3]):  # the rest at the bottom / right
        conv = next(n for n in folded.nodes if n.op == "conv2d")
        assert conv.attrs["pad_end"] == (pads[3] - pads[2], pads[1] - pads[0])
    x = torch.randn(2, 3, 7, 8)
    for got, want in zip(reference_run(folded, [x]), reference_run(g, [x]), strict=True):
        torch.testing.assert_close(got, want)


class _TfPadded(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = torch.nn.Parameter(torch.randn(3, 3, 1, 1)), torch.nn.Parameter(torch.randn(3, 3, 3, 3))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t = F.conv2d(F.pad(t, (0, 0, 0, 0)), self.w1)  # TF-style "same" padding of a 1x1 conv: nothing
        a = F.conv2d(F.pad(t, (1, 1, 1, 1)), self.w3)  # symmetric: the conv's padding
        b = F.conv2d(F.pad(t, (0, 1, 0, 1)), self.w3, stride=2).mean()  # asymmetric (stride 2): padding + pad_end
        return a + b + F.conv2d(F.pad(t, (2, 1, 0, 0)), self.w3).mean()  # less at the end: a pad


def test_import_pads_natively_and_drops_empty_ones() -> None:
    model, x = _TfPadded().eval(), torch.randn(2, 3, 7, 8)
    cm = kfuse.compile(model, (x,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    assert cm.report["op_counts"].get("pad", 0) == 1, cm.report["op_counts"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)


class _TfSameStride2(torch.nn.Module):
    """EfficientNet's stride-2 blocks: a 3x3 and a 5x5 depthwise conv after TF "same" pads (one more at the
    bottom and right), a dense stride-2 stem conv after its pad, each with its activation."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.dw3 = torch.nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.dw5 = torch.nn.Conv2d(8, 8, 5, stride=2, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.stem(F.pad(x, (0, 1, 0, 1))))
        y = F.silu(self.dw3(F.pad(y, (0, 1, 0, 1))))
        return F.silu(self.dw5(F.pad(y, (1, 2, 1, 2))))


@pytest.mark.parametrize("size", [(16, 16), (15, 18)])  # even and odd sizes: the last row / column past the edge
def test_asymmetric_pads_run_in_the_conv_kernels(size, device, monkeypatch) -> None:
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    model = _TfSameStride2().to(device).eval()
    x = torch.randn(2, 3, *size, device=device)
    cm = kfuse.compile(model, (x,))
    assert cm.report["op_counts"].get("pad", 0) == 0, cm.report["op_counts"]
    templates = [k["template"] for k in cm.report["kernels"]]
    assert templates.count("conv_epilogue") == 1 and templates.count("depthwise_conv") == 2, templates
    assert not any("pad" in k["ops"] for k in cm.report["kernels"]), cm.report["kernels"]  # the rest: layout copies
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
