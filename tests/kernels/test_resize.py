"""Bilinear / nearest upsampling against F.interpolate (interpreter on the CPU, compiled on a GPU): both memory
formats, odd sizes, up and down, scale factors that are not in/out, align_corners, a 1x1 map broadcast back
(DeepLabV3's image pool), poisoned outputs, fp16, and the compiled path with no fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cubin_facts import run_offline_script

import kfuse
from kfuse.kernels.resize import source_scale, upsample2d

CASES = [
    # input shape, size or None, scale factor or None, mode, align_corners
    ((2, 5, 6, 4), (13, 9), None, "bilinear", False),
    ((2, 5, 6, 4), (13, 9), None, "bilinear", True),
    ((1, 3, 7, 5), None, 1.7, "bilinear", False),  # the step is 1 / 1.7, not 7 / 11
    ((1, 3, 7, 5), None, (2.0, 3.0), "bilinear", False),
    ((2, 6, 9, 11), (4, 5), None, "bilinear", False),  # down
    ((2, 6, 9, 11), (4, 5), None, "bilinear", True),
    ((3, 4, 1, 1), (7, 6), None, "bilinear", False),  # a 1x1 map broadcast back
    ((2, 3, 5, 5), (5, 5), None, "bilinear", True),  # the same size: a copy
    ((2, 5, 6, 4), None, 2, "nearest", False),
    ((2, 5, 6, 4), (11, 7), None, "nearest", False),
    ((1, 2, 9, 9), (4, 5), None, "nearest", False),  # down
    ((1, 3, 5, 6), None, (1.5, 0.5), "nearest", False),
    ((1, 17, 3, 2), (8, 8), None, "nearest", False),
]


def _reference(x: torch.Tensor, size, scale, mode: str, align: bool) -> torch.Tensor:
    kw = {"align_corners": align} if mode == "bilinear" else {}
    return F.interpolate(x, size=size, scale_factor=scale, mode=mode, **kw)


@pytest.mark.parametrize("shape,size,scale,mode,align", CASES)
@pytest.mark.parametrize("channels_last", [True, False])
def test_equals_pytorch(shape, size, scale, mode, align, channels_last, device) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = _reference(x, size, scale, mode, align)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.full(ref.shape, float("nan"), device=device).contiguous(memory_format=fmt)
    scales = (None, None) if scale is None else (scale, scale) if not isinstance(scale, tuple) else scale
    got = upsample2d(x, tuple(ref.shape[2:]), mode, align, scales, out=out)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    if mode == "nearest":
        assert torch.equal(got, ref)  # a pick, no arithmetic


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_half_precision(mode: str, device) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 7, device=device).half().contiguous(memory_format=torch.channels_last)
    ref = _reference(x.float(), (11, 13), None, mode, False)
    got = upsample2d(x, (11, 13), mode)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=2e-3)


def test_source_scale_follows_pytorch() -> None:
    assert source_scale(7, 11, False, None) == 7 / 11
    assert source_scale(7, 11, False, 1.7) == 1 / 1.7
    assert source_scale(7, 11, True, 1.7) == 6 / 10
    assert source_scale(7, 1, True, None) == 0.0


def test_bad_arguments_are_refused() -> None:
    x = torch.randn(1, 2, 3, 3)
    with pytest.raises(ValueError, match="mode"):
        upsample2d(x, (6, 6), "bicubic")
    with pytest.raises(ValueError, match="align_corners"):
        upsample2d(x, (6, 6), "nearest", align_corners=True)
    with pytest.raises(ValueError, match="N, C, H, W"):
        upsample2d(x[0], (6, 6))


class _SegHead(torch.nn.Module):
    """An FCN-style head: conv, ReLU, a 1x1 classifier, logits upsampled to the input size; and an image-pool
    branch (DeepLabV3's ASPP) broadcast back by a bilinear upsample of a 1x1 map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.pool_conv = torch.nn.Conv2d(8, 8, 1)
        self.cls = torch.nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        pooled = torch.relu(self.pool_conv(F.adaptive_avg_pool2d(y, 1)))
        y = y + F.interpolate(pooled, size=y.shape[-2:], mode="bilinear", align_corners=False)
        return F.interpolate(self.cls(y), size=x.shape[-2:], mode="bilinear", align_corners=False)


def test_segmentation_head_compiles_without_fallback() -> None:
    torch.manual_seed(0)
    m = _SegHead().eval()
    x = torch.randn(2, 3, 17, 13)
    c = kfuse.compile(m, (x,))
    assert c.report["fallback"] == []
    assert [k["template"] for k in c.report["kernels"]].count("resize") == 2
    torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)


_SM90_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kfuse.kernels import resize

k = resize._upsample2d_kernel
names = k.arg_names
sig = {n: "*fp16" for n in ("x_ptr", "y_ptr")}
sig.update({n: "i32" for n in ("N", "C", "H", "W", "OH", "OW", "sxn", "sxh", "sxw", "syn", "syh", "syw")})
sig.update({"scale_h": "fp32", "scale_w": "fp32", "sxc": "constexpr", "syc": "constexpr"})
out = {}
for bilinear in (True, False):
    const = dict(BILINEAR=bilinear, ALIGN_CORNERS=False, DIVIDE=False, BLOCK_P=32, BLOCK_C=128, PDL=False, sxc=1, syc=1)
    s = {n: sig.get(n, "constexpr") for n in names}
    div = ("x_ptr", "y_ptr", "C", "sxn", "sxh", "sxw", "syn", "syh", "syw")  # a 64-channel NHWC map, as the JIT marks it
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = ASTSource(k, s, {(names.index(n),): v for n, v in const.items()}, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    loads = re.findall(r"ld\.global[.\w]*\.v(\d)\.b(\d+)", ptx)
    out[str(bilinear)] = {"vector_loads": len(loads), "stores": len(re.findall(r"st\.global", ptx))}
print(json.dumps(out))
"""


def test_kernel_compiles_for_sm90_with_vector_channel_loads() -> None:
    """Compiled for the H200 offline for a 64-channel NHWC map (strides and channels multiples of 16, as the JIT
    specialises them): each tap is a vector load along the channels, four taps for bilinear, one for nearest."""
    got = run_offline_script(_SM90_SCRIPT, None, timeout=600)
    assert got["True"]["vector_loads"] >= 4 and got["False"]["vector_loads"] >= 1, got
    assert got["True"]["stores"] >= 1 and got["False"]["stores"] >= 1, got


@pytest.mark.gpu
@pytest.mark.parametrize("mode,align", [("bilinear", False), ("bilinear", True), ("nearest", False)])
def test_fp16_channels_last_on_the_gpu(mode: str, align: bool) -> None:
    """Session 43's kernel on the H200: a segmentation head's shapes (odd, 8x up), poisoned output, fp16 against
    PyTorch's CUDA kernel in fp32."""
    torch.manual_seed(0)
    x = torch.randn(3, 21, 33, 31, device="cuda").half().contiguous(memory_format=torch.channels_last)
    ref = _reference(x.float(), (261, 247), None, mode, align)
    out = torch.full(ref.shape, float("nan"), device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    got = upsample2d(x, (261, 247), mode, align, out=out)
    assert not got.isnan().any()
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_segmentation_head_compiles_on_the_gpu() -> None:
    torch.manual_seed(0)
    m = _SegHead().eval().cuda().half()
    x = torch.randn(2, 3, 65, 47, device="cuda").half()
    c = kfuse.compile(m, (x,))
    assert c.report["fallback"] == []
    torch.testing.assert_close(c(x).float(), m(x).float(), rtol=2e-2, atol=2e-2)
