"""Global average pooling of channels-last maps (``kfuse.kernels.global_pool``) against PyTorch: odd sizes, one
pixel, narrow channel blocks, fp16, poisoned output; and the graph path:
an NHWC graph's squeeze-excitation pool is this kernel, not the generated row reduction."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cubin_facts import run_offline_script

import kfuse
from kfuse.kernels.global_pool import global_avg_pool


@pytest.mark.parametrize("shape", [(2, 20, 7, 9), (3, 70, 1, 1), (1, 5, 33, 31), (2, 130, 4, 1), (1, 8, 1, 6)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_equals_pytorch(shape, channels_last, device) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).to(device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out = torch.full((shape[0], shape[1], 1, 1), float("nan"), device=device)
    got = global_avg_pool(x, out=out)
    torch.testing.assert_close(got, F.adaptive_avg_pool2d(x, 1), rtol=1e-5, atol=1e-5)


def test_narrow_channel_blocks_and_half_precision(device) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 40, 41, 37, device=device).half().contiguous(memory_format=torch.channels_last)
    got = global_avg_pool(x, programs=10**6)  # as many programs as can be: 16-channel blocks, the last one partial
    assert got.dtype == torch.float16 and got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.float(), F.adaptive_avg_pool2d(x.float(), 1), rtol=1e-3, atol=1e-3)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="4-D"):
        global_avg_pool(torch.randn(2, 3, 4))


class _SE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.out = nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        return self.out(y * s)


def test_an_nhwc_squeeze_excitation_pool_is_the_kernel() -> None:
    torch.manual_seed(0)
    m = _SE().eval()
    x = torch.randn(2, 8, 11, 9)
    c = kfuse.compile(m, (x,))
    templates = [k["template"] for k in c.report["kernels"]]
    assert templates.count("global_pool") == 1, c.report["kernels"]
    assert not [k for k in c.report["kernels"] if "adaptive_avg_pool2d" in k["ops"] and k["template"] != "global_pool"]
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    old = kfuse.compile(m, (x,), global_pool=False)  # the generated reduction, as before (an A/B)
    assert not [k for k in old.report["kernels"] if k["template"] == "global_pool"]
    assert [k for k in old.report["kernels"] if k["template"] == "pointwise" and "adaptive_avg_pool2d" in k["ops"]]
    with torch.no_grad():
        torch.testing.assert_close(old(x), m(x), rtol=1e-4, atol=1e-4)


_SM90_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kfuse.kernels import global_pool as P

k = P._mean_pixels
names = k.arg_names
sig = {"x_ptr": "*fp16", "y_ptr": "*fp16", "inv": "fp32"}
sig.update({n: "i32" for n in ("C", "HW", "sxn", "sxp", "syn")})
s = {n: sig.get(n, "constexpr") for n in names}
const = {"sxc": 1, "syc": 1, "BLOCK_R": 64, "BLOCK_C": 64}
div = ("x_ptr", "y_ptr", "C", "sxn", "sxp", "syn")  # a 64-channel NHWC map, as the JIT marks it
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
src = ASTSource(k, s, {(names.index(n),): v for n, v in const.items()}, attrs=attrs)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
print(json.dumps({"vector_loads": len(re.findall(r"ld\.global[.\w]*\.v4\.b32", ptx)), "stores": len(re.findall(r"st\.global", ptx))}))
"""


def test_channel_loads_are_vectors_on_sm90() -> None:
    """Compiled for the H200 offline for a 64-channel NHWC map: the [pixels, channels] tile loads 16-byte vectors
    along the channels (the generated row reduction read pixels C elements apart), and the means are stored."""
    got = run_offline_script(_SM90_SCRIPT, None, timeout=600)
    assert got["vector_loads"] >= 1 and got["stores"] >= 1, got


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 224, 56, 56), (32, 1088, 7, 7), (32, 96, 112, 112), (1, 1280, 7, 7)])
def test_squeeze_excitation_shapes_on_the_gpu(shape) -> None:
    """RegNet-Y's and EfficientNet's SE maps in fp16, channels-last, poisoned output, against PyTorch in fp32."""
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda").half().contiguous(memory_format=torch.channels_last)
    out = torch.full((shape[0], shape[1], 1, 1), float("nan"), device="cuda", dtype=torch.float16)
    got = global_avg_pool(x, out=out)
    torch.testing.assert_close(got.float(), F.adaptive_avg_pool2d(x.float(), 1), rtol=2e-3, atol=2e-3)
