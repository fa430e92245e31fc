"""Zero padding in front of a conv: imported as a ``pad`` op (none when it pads nothing) and absorbed into the
conv's padding where symmetric (Hugging Face's MobileNet-V2 pads before every conv, TF style)."""

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
    [((1, 1, 2, 2), 0.0, False, True), ((2, 2), 0.0, False, True), ((0, 1, 0, 1), 0.0, False, False),
     ((1, 1, 1, 1), 0.5, False, False), ((1, 1, 1, 1), 0.0, True, False), ((1, 1, 1, 1, 1, 1), 0.0, False, False)],
)  # fmt: skip
def test_symmetric_zero_pads_join_the_conv(pads, value, second_user, folds) -> None:
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
        return a + F.conv2d(F.pad(t, (0, 1, 0, 1)), self.w3, stride=2).mean()  # asymmetric (stride 2): a pad


def test_import_pads_natively_and_drops_empty_ones() -> None:
    model, x = _TfPadded().eval(), torch.randn(2, 3, 7, 8)
    cm = kfuse.compile(model, (x,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    assert cm.report["op_counts"].get("pad", 0) == 1, cm.report["op_counts"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
