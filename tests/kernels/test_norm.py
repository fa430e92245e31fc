"""LayerNorm / RMSNorm template with fused addends vs the float32 reference."""

import pytest
import torch

from kfuse.kernels.norm import norm, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 33), (7, 128), (1, 1, 200)])
def test_norm_with_addends(dtype, rms, shape, device):
    gen = torch.Generator().manual_seed(sum(shape) + rms)
    n = shape[-1]
    x = torch.randn(shape, generator=gen).to(device, dtype)
    adds = [torch.randn(shape, generator=gen), torch.randn((1,) + shape[1:], generator=gen), torch.randn(n, generator=gen)]
    adds = [a.to(device, dtype) for a in adds]
    w, b = torch.randn(n, generator=gen).to(device, dtype), torch.randn(n, generator=gen).to(device, dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for k in (0, 1, 3):
        out = torch.full(shape, float("nan"), dtype=dtype, device=device)
        norm(x, adds[:k], w, None if rms else b, eps=1e-6, rms=rms, out=out)
        ref = reference(x, adds[:k], w, None if rms else b, eps=1e-6, rms=rms)
        torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_norm_without_affine_and_errors(device):
    x = torch.randn(3, 10, device=device)
    torch.testing.assert_close(norm(x), reference(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="not a leading-dim broadcast"):
        norm(x, [torch.randn(3, 1, device=device)])
