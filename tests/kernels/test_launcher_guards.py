"""Launch wrappers reject what their kernels would silently get wrong: caller-given ``out`` buffers
of the wrong shape or an unwritable layout, norm weights that are not a contiguous ``[N]``, and
operands of mixed dtypes (in the Triton interpreter on the CPU, compiled on a GPU)."""

import pytest
import torch
import torch.nn.functional as F

from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue references
from kfuse.kernels import gated_gemm as gg
from kfuse.kernels import norm as nm
from kfuse.kernels.epilogue import Epilogue
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue
from kfuse.kernels.pool import max_pool2d


def test_norm_out_with_strided_last_dim_is_rejected(device):
    # a transposed out used to be copied to a contiguous temporary, written there and dropped
    x = torch.randn(4, 8, device=device)
    out = torch.zeros(8, 4, device=device).t()
    with pytest.raises(ValueError, match="unit-stride"):
        nm.norm(x, out=out)


def test_norm_out_with_row_stride_is_written(device):
    x = torch.randn(4, 8, device=device)
    out = torch.zeros(4, 16, device=device)[:, :8]  # rows of one stride: written in place
    y = nm.norm(x, out=out)
    assert y is out
    torch.testing.assert_close(out, nm.reference(x), atol=1e-4, rtol=1e-4)


def test_norm_out_of_wrong_shape_is_rejected(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="out is"):
        nm.norm(x, out=torch.zeros(8, 8, device=device))


@pytest.mark.parametrize(
    "make", [lambda d: torch.randn(16, device=d)[::2], lambda d: torch.randn(1, device=d).expand(8)], ids=["strided", "expanded"]
)
def test_norm_strided_weight_and_bias(make, device):
    # the kernel reads W + col: a strided or stride-0 weight used to be read as if contiguous
    x = torch.randn(4, 8, device=device)
    w, b = make(device), make(device)
    torch.testing.assert_close(nm.norm(x, weight=w, bias=b), nm.reference(x, weight=w, bias=b), atol=1e-4, rtol=1e-4)


def test_norm_weight_of_wrong_size_is_rejected(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="weight has shape"):
        nm.norm(x, weight=torch.randn(4, device=device))


def test_pool_out_of_wrong_shape_is_rejected(device):
    x = torch.randn(1, 2, 6, 6, device=device)
    with pytest.raises(ValueError, match="out is"):
        max_pool2d(x, 2, out=torch.zeros(1, 2, 4, 4, device=device))


def test_pool_out_of_right_shape_any_layout(device):
    x = torch.randn(1, 2, 6, 6, device=device)
    out = torch.zeros(1, 2, 3, 3, device=device).permute(0, 1, 3, 2)
    max_pool2d(x, 2, out=out)
    torch.testing.assert_close(out, F.max_pool2d(x, 2))


CFG = GemmConfig(16, 16, 16, 1, 4, 1)


def test_gemm_out_of_wrong_shape_is_rejected(device):
    # (6, 5) has the numel of the (5, 6) product: it used to be filled row-major as (5, 6)
    a, b = torch.randn(5, 8, device=device), torch.randn(8, 6, device=device)
    with pytest.raises(ValueError, match="out is"):
        gemm_epilogue(a, b, [], Epilogue(), torch.float32, CFG, out=torch.zeros(6, 5, device=device))


def test_gemm_out_that_does_not_fold_is_reported(device):
    a, b = torch.randn(5, 2, 8, device=device), torch.randn(8, 6, device=device)
    out = torch.zeros(4, 5, 6, device=device).permute(1, 0, 2)[:, :2]
    with pytest.raises(ValueError, match="do not fold"):
        gemm_epilogue(a, b, [], Epilogue(), torch.float32, CFG, out=out)


def test_gemm_mixed_dtypes_are_reported(device):
    with pytest.raises(TypeError, match="one dtype"):
        gemm_epilogue(torch.randn(5, 8, device=device).half(), torch.randn(8, 6, device=device), [], Epilogue(), torch.float32, CFG)


def test_gated_gemm_out_of_wrong_shape_is_rejected(device):
    a, w = torch.randn(5, 8, device=device), torch.randn(8, 12, device=device)
    with pytest.raises(ValueError, match="out is"):
        gg.gated_gemm(a, w, out=torch.zeros(6, 5, device=device))


def test_gated_gemm_transposed_out_is_written(device):
    a, w = torch.randn(5, 8, device=device), torch.randn(8, 12, device=device)
    out = torch.zeros(6, 5, device=device).t()
    gg.gated_gemm(a, w, out=out)
    torch.testing.assert_close(out, gg.reference(a, w), atol=1e-4, rtol=1e-4)


def test_gated_gemm_mixed_dtypes_are_reported(device):
    with pytest.raises(TypeError, match="one dtype"):
        gg.gated_gemm(torch.randn(5, 8, device=device).half(), torch.randn(8, 12, device=device))
