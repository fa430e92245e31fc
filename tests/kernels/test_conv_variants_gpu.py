"""Session 42's kernel variants on the GPU in fp16 (the interpreter runs them in fp32 on the CPU in
test_conv.py, test_rotary.py and test_pointwise.py): grouped convs, the squeeze-excitation input scale, the
asymmetric pad's ``pad_end``, the interleaved rotary, and ``amax``'s NaN, which only the GPU's ``tl.max`` drops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.kernels import rotary as R
from kfuse.kernels.conv import ConvConfig, ConvParams, conv_epilogue, reference
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)


@pytest.mark.gpu
@pytest.mark.parametrize("c,oc,groups,k,stride,scaled,pad_end", [
    (128, 128, 2, 3, 1, False, (0, 0)),  # RegNet-Y's 64 channels a group
    (96, 48, 24, 3, 2, False, (1, 1)),  # narrow groups (4 in, 2 out), strided, a folded TF pad
    (64, 32, 1, 1, 1, True, (0, 0)),  # an SE-scaled 1x1 projection
    (48, 48, 3, 3, 1, True, (0, 0)),  # scaled and grouped
])  # fmt: skip
@pytest.mark.parametrize("cfg", [None, ConvConfig(64, 32, 32, 8, 4, 3, False), ConvConfig(64, 32, 32, 8, 4, 3, True)])
def test_conv_variants_fp16(c, oc, groups, k, stride, scaled, pad_end, cfg) -> None:
    gen = torch.Generator().manual_seed(c + oc + groups)
    x = torch.randn(4, c, 17, 19, generator=gen).half().cuda().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(oc, c // groups, k, k, generator=gen) / (c // groups * k * k) ** 0.5).half().cuda()
    b = torch.randn(oc, generator=gen).half().cuda()
    s = (torch.rand(4, c, 1, 1, generator=gen) + 0.5).half().cuda() if scaled else None
    p = ConvParams((stride, stride), (k // 2, k // 2) if not any(pad_end) else (0, 0), groups=groups, pad_end=pad_end)
    want = reference(x, w, b, [], RELU, p, torch.float16, in_scale=s)
    out = torch.full(want.shape, float("nan"), dtype=torch.float16, device="cuda").contiguous(memory_format=torch.channels_last)
    conv_epilogue(x, w, b, [], RELU, p, torch.float16, cfg, out=out, in_scale=s)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_interleaved_rotary_fp16() -> None:
    gen = torch.Generator().manual_seed(7)
    b, s, h, d, rot = 2, 33, 4, 64, 32
    x = torch.randn(b, s, 3 * h * d, generator=gen).half().cuda()[..., : h * d].reshape(b, s, h, d)
    ang = (torch.rand(s, rot // 2, generator=gen) * 6.0).repeat_interleave(2, -1).cuda()[None, :, None, :]
    out = R.rotary(x, ang.cos().half(), ang.sin().half(), rotary_dims=rot, interleaved=True)
    want = R.reference(x, ang.cos().half(), ang.sin().half(), rotary_dims=rot, interleaved=True)
    torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [7, 4097])
def test_amax_keeps_a_nan_on_the_gpu(length: int) -> None:
    from kfuse.passes.fuse_pointwise import fuse_pointwise
    from kfuse.runtime.executor import execute, lower

    b = GraphBuilder("amax_nan")
    x = b.add_input("x", TensorType((3, length), torch.float32))
    g = fuse_pointwise(b.build([b.op("amax", [b.op("mul", [x, b.scalar(2.0)])], {"dims": (1,), "keepdim": False})]))
    xs = torch.randn(3, length, device="cuda")
    xs[1, length // 2] = float("nan")
    (got,) = execute(lower(g, torch.device("cuda"), "triton"), [xs])
    assert torch.isnan(got[1]) and not torch.isnan(got[[0, 2]]).any()
    torch.testing.assert_close(got, (xs * 2).amax(1), equal_nan=True)


@pytest.mark.gpu
def test_se_block_and_tf_pads_compile_fp16(monkeypatch) -> None:
    """A compiled model with all three conv changes in one plan: a TF-padded stride-2 depthwise conv, a grouped
    3x3 with its ReLU, and the SE scale read by the 1x1 projection (the template forced over cuDNN)."""
    import kfuse

    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")

    class _Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw = torch.nn.Conv2d(64, 64, 3, stride=2, groups=64)
            self.grouped = torch.nn.Conv2d(64, 64, 3, padding=1, groups=4)
            self.fc1, self.fc2 = torch.nn.Conv2d(64, 16, 1), torch.nn.Conv2d(16, 64, 1)
            self.proj = torch.nn.Conv2d(64, 32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.silu(self.dw(F.pad(x, (0, 1, 0, 1))))
            y = torch.relu(self.grouped(y))
            s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
            return self.proj(y * s)

    torch.manual_seed(0)
    m = _Block().half().cuda().eval()
    x = torch.randn(8, 64, 32, 32, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    cm = kfuse.compile(m, (x,))
    ops = [tuple(k["ops"]) for k in cm.report["kernels"]]
    assert ("conv2d", "relu") in ops and any(o[0] == "mul" and "conv2d" in o for o in ops), ops
    assert not any("pad" in o for o in ops), ops
    with torch.no_grad():
        want = m(x).float()
        got = cm(x).float()
    assert (got - want).abs().max() / want.abs().max() < 2e-2
