"""NHWC max pooling against F.max_pool2d (in the interpreter on the CPU, compiled on a GPU):
channels-last and NCHW inputs, odd sizes, stride/padding/dilation/ceil_mode, poisoned outputs,
NaN propagation, and the lowering."""

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse.kernels.pool import max_pool2d, out_size

CASES = [
    # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 5, 13, 11), 3, 2, 1, 1, False),  # ResNet's stem pool on odd sizes
    ((1, 17, 9, 9), 2, 2, 0, 1, True),
    ((3, 3, 10, 7), (3, 2), (1, 2), (1, 1), 1, False),
    ((1, 8, 12, 12), 3, 1, 1, 2, False),
    ((2, 4, 7, 7), 3, 3, 1, 1, True),
    ((1, 1, 1, 1), 1, 1, 0, 1, False),
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", CASES)
@pytest.mark.parametrize("channels_last", [True, False])
def test_equals_pytorch(shape, k, s, p, d, ceil, channels_last, device) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = F.max_pool2d(x, k, s, p, d, ceil)
    out = torch.full(ref.shape, float("nan"), device=device).contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    got = max_pool2d(x, k, s, p, d, ceil, out=out)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    y = max_pool2d(x, k, s, p, d, ceil)
    if y.shape[1] > 1 and y.shape[2] * y.shape[3] > 1:  # otherwise both formats are the same layout
        assert y.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_output_size_matches_pytorch_ceil_rule() -> None:
    for size in range(1, 20):
        for k, s, p in ((3, 2, 1), (2, 2, 0), (3, 3, 1), (5, 2, 2)):
            for ceil in (False, True):
                expect = F.max_pool2d(torch.zeros(1, 1, size + 5, size), k, s, p, 1, ceil).shape[-1] if size + 2 * p >= k else None
                if expect is not None:
                    assert out_size(size, k, s, p, 1, ceil) == expect, (size, k, s, p, ceil)


def test_nan_propagates_and_fp16(device) -> None:
    x = torch.randn(1, 4, 6, 6, device=device)
    x[0, 1, 2, 2] = float("nan")
    got = max_pool2d(x, 3, 2, 1)
    torch.testing.assert_close(got, F.max_pool2d(x, 3, 2, 1), equal_nan=True, rtol=0, atol=0)
    xh = torch.randn(2, 8, 9, 9, device=device).half().contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(max_pool2d(xh, 3, 2, 1), F.max_pool2d(xh.float(), 3, 2, 1).half(), rtol=0, atol=0)


def test_bad_input_is_a_clear_error(device) -> None:
    with pytest.raises(ValueError, match="N, C, H, W"):
        max_pool2d(torch.randn(3, 4, 5, device=device), 2)
    with pytest.raises(ValueError, match="padding"):
        max_pool2d(torch.randn(1, 1, 8, 8, device=device), 2, 2, 2)


@pytest.fixture
def exact_fp32_convs():
    """On the GPU cuDNN runs fp32 convolutions in TF32 by default: the eager ResNet the compiled
    one is checked against would be ~1e-3 off (kfuse's fp32 conv kernels are IEEE)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


def test_resnet_pool_runs_on_the_kernel(device, exact_fp32_convs, monkeypatch) -> None:
    import kfuse.models as zoo
    from kfuse.runtime import choice

    # on the GPU the lowering keeps the kernel only where it times faster than PyTorch (the CPU has
    # nothing to time: always the kernel); a choice that always finds the kernel faster tests the
    # kernel's step in the compiled model on both
    real = choice.choose

    def kernel_for_pools(node, graph, candidates, key, inputs=None):
        if node.op == "max_pool2d":
            return "kernel", dict.fromkeys(candidates, 0.0)
        return real(node, graph, candidates, key, inputs)

    monkeypatch.setattr(choice, "choose", kernel_for_pools)
    m, a, kw = zoo.build("resnet-tiny", batch=2, device=device)
    compiled = kfuse.compile(m, a, kw)
    pools = [k for k in compiled.report["kernels"] if k["ops"] == ["max_pool2d"]]
    assert pools and all(k["template"] == "pool" for k in pools)
    assert compiled.report["max_rel_err"] < 1e-4


_PTX = r"""
import os, re
os.environ["TRITON_INTERPRET"] = "0"
from kfuse.sass.examples import compile_sm90
import sys
from kfuse.kernels import pool
if sys.argv[1:] == ["avg"]:
    fn = pool._avg_pool2d_kernel
    const = dict(PDL=False, sxc=1, syc=1, KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, COUNT_PAD=True, DIVISOR=0, BLOCK_P=32, BLOCK_C=64)
else:
    fn = pool._max_pool2d_kernel
    const = dict(PDL=False, sxc=1, syc=1, KH=3, KW=3, SH=2, SW=2, PH=1, PW=1, DH=1, DW=1, BLOCK_P=32, BLOCK_C=64)
sig = {n: ("*fp16" if n.endswith("_ptr") else "i32") for n in fn.arg_names if n not in const}
ptx = compile_sm90(fn, sig, const, num_warps=4, num_stages=1, divisible=tuple(k for k in sig if not k.endswith("_ptr"))).asm["ptx"]
print(len(re.findall(r"ld\.global(\.\w+)*\.v4", ptx)), len(re.findall(r"ld\.global", ptx)))
"""


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_sm90_loads_are_16_byte_vectors(kind: str) -> None:
    """Channels-last tiles: every tap is loaded as 16-byte vectors (compiled for sm_90 on the CPU)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _PTX, kind], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    v4, total = (int(x) for x in r.stdout.split()[-2:])
    assert v4 == total and v4 >= 9, (v4, total)


AVG_CASES = [
    # shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 5, 13, 11), 3, 1, 1, False, True, None),  # Inception's pool branch, odd sizes
    ((2, 5, 13, 11), 3, 1, 1, False, False, None),
    ((1, 17, 9, 9), 2, 2, 0, False, True, None),  # DenseNet's transition on an odd map
    ((3, 3, 10, 7), (3, 2), (2, 1), (1, 1), True, True, None),  # ceil_mode: the last window past the padded edge
    ((3, 3, 10, 7), (3, 2), (2, 1), (1, 1), True, False, None),
    ((1, 6, 8, 8), 3, 2, 1, False, True, 5),
    ((1, 1, 1, 1), 1, 1, 0, False, True, None),
]


@pytest.mark.parametrize("shape,k,s,p,ceil,cip,div", AVG_CASES)
@pytest.mark.parametrize("channels_last", [True, False])
def test_avg_pool_equals_pytorch(shape, k, s, p, ceil, cip, div, channels_last, device) -> None:
    from kfuse.kernels.pool import avg_pool2d

    torch.manual_seed(1)
    x = torch.randn(shape, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = F.avg_pool2d(x, k, s, p, ceil, cip, div)
    out = torch.full(ref.shape, float("nan"), device=device).contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    got = avg_pool2d(x, k, s, p, ceil, cip, div, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_avg_pool_into_a_channel_slice_and_fp16(device) -> None:
    from kfuse.kernels.pool import avg_pool2d

    x = torch.randn(2, 6, 9, 11, device=device).half().contiguous(memory_format=torch.channels_last)
    buf = torch.full((2, 10, 4, 5), float("nan"), device=device).half().contiguous(memory_format=torch.channels_last)
    avg_pool2d(x, 2, 2, out=buf[:, 3:9])
    torch.testing.assert_close(buf[:, 3:9].float(), F.avg_pool2d(x.float(), 2, 2), rtol=2e-3, atol=2e-3)
    assert torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 9:]).all()
    with pytest.raises(ValueError, match="at most half"):
        avg_pool2d(x, 2, 2, 2)
    with pytest.raises(ValueError, match="divisor_override"):
        avg_pool2d(x, 2, 2, divisor_override=0)


def test_avg_pool_runs_on_the_kernel_in_a_compiled_model(device) -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(torch.relu(self.conv(x)), 3, 1, 1)

    m = M().eval().to(device)
    x = torch.randn(2, 3, 9, 7, device=device)
    cm = kfuse.compile(m, (x,))
    if device == "cpu":  # on a GPU PyTorch's pool may win the race
        assert [k["template"] for k in cm.report["kernels"] if k["ops"] == ["avg_pool2d"]] == ["pool"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
