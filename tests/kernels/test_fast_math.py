"""The transcendental epilogue ops (GELU erf and tanh forms, sigmoid, SiLU, tanh) are rendered
with fast division and exp instead of libdevice's erf and IEEE division (kfuse/ir/ops.py): each
rendered expression, run as a Triton kernel, matches PyTorch in float64 over the whole range,
tails and extreme values included."""

import pytest
import torch
import torch.nn.functional as F
import triton

from kfuse.ir import ops
from kfuse.kernels.codegen import load_generated

_SRC = """import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < N)
    y = EXPR
    tl.store(y_ptr + o, y, mask=o < N)
"""

REFERENCES = {
    "gelu": lambda v: F.gelu(v, approximate="none"),
    "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "tanh": torch.tanh,
}


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    extremes = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 5.0, -5.0, 30.0, -30.0, 88.0, -88.0, 200.0, -200.0, 3e38, -3e38])
    return torch.cat([torch.linspace(-15, 15, 30011), torch.randn(20000, generator=g) * 4, extremes])


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_rendered_op_matches_torch(name: str, device: str) -> None:
    x = _inputs().to(device)
    mod = load_generated("test_fast_math", name, _SRC.replace("EXPR", ops.get(name).triton.format("x")))
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    mod.k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    y = y.cpu()
    ref = REFERENCES[name](x.cpu().double())  # the float64 reference on the CPU
    assert not y.isnan().any()
    err = (y.double() - ref).abs()
    # within a few fp32 ulps of max(1, |value|) (A&S erfc: < 1.5e-7 absolute), and relatively
    # close wherever the value is not tiny
    assert (err <= 2e-6 + 1e-6 * ref.abs()).all()
    big = ref.abs() > 1e-2
    assert (err[big] / ref.abs()[big]).max().item() < 5e-5
