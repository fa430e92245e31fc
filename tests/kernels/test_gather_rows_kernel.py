"""Row gather kernel (kfuse.kernels.gather_rows) against index_select, and the norm template's folded gather."""

import pytest
import torch

from kfuse.kernels.gather_rows import gather_rows
from kfuse.kernels.norm import norm, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,n,m", [(37, 40, 53), (5, 8, 5), (64, 200, 17)])
def test_gather_rows_matches_index_select(dtype, rows, n, m, device):
    gen = torch.Generator().manual_seed(rows * n + m)
    x = torch.randn(rows, n, generator=gen).to(device, dtype)
    index = torch.randint(0, rows, (m,), generator=gen)  # repeats allowed
    index[0], index[-1] = rows - 1, 0
    for idx in (index.to(torch.int32), index):
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        gather_rows(x, idx.to(device), out=out)
        assert torch.equal(out, x.index_select(0, idx.to(device)))


def test_gather_rows_reads_a_strided_source_and_reshapes(device):
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6, 7, 48, generator=gen).to(device)
    x = base[:, 1:6]  # rows of one stride, not contiguous as a whole
    index = torch.randperm(30, generator=gen).to(device)
    y = gather_rows(x, index, (5, 6, 48))
    assert torch.equal(y, x.reshape(-1, 48).index_select(0, index).reshape(5, 6, 48))


def test_gather_rows_side_by_side(device):
    """Output rows made of several source rows (Swin's patch merging: 4 of C make one of 4C)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(30, 24, generator=gen).to(device, torch.float16)
    index = torch.randint(0, 30, (36,), generator=gen).to(device)
    out = torch.full((3, 3, 96), float("nan"), dtype=torch.float16, device=device)
    gather_rows(x, index, (3, 3, 96), out=out)
    assert torch.equal(out, x.index_select(0, index).reshape(3, 3, 96))


def test_gather_rows_errors(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="index must be a 1-D int32/int64"):
        gather_rows(x, torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="do not make the output shape"):
        gather_rows(x, torch.zeros(3, dtype=torch.int64, device=device), (2, 16))
    with pytest.raises(ValueError, match="out must be a contiguous"):
        gather_rows(x, torch.zeros(3, dtype=torch.int64, device=device), out=torch.empty(3, 8, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rms", [False, True])
def test_norm_with_row_index_normalises_the_gathered_rows(dtype, rms, device):
    gen = torch.Generator().manual_seed(11 + rms)
    shape, n = (3, 13, 33), 33
    x = torch.randn(shape, generator=gen).to(device, dtype)
    adds = [torch.randn(shape, generator=gen).to(device, dtype), torch.randn(1, 13, n, generator=gen).to(device, dtype)]
    w, b = torch.randn(n, generator=gen).to(device, dtype), torch.randn(n, generator=gen).to(device, dtype)
    index = torch.randperm(39, generator=gen)[:29].to(device, torch.int32)  # a selection, not all rows
    out = torch.full((29, n), float("nan"), dtype=dtype, device=device)
    norm(x, adds, w, None if rms else b, eps=1e-6, rms=rms, out=out, row_index=index)
    ref = reference(x, adds, w, None if rms else b, eps=1e-6, rms=rms).reshape(-1, n).index_select(0, index.long())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="row_index must be"):
        norm(x, row_index=index.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_norm_adds_a_residual_to_its_output(dtype, device):
    """A post-norm residual (Swin-V2: x + LayerNorm(f(x))) in the norm kernel, with and without a gather."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(3, 11, 40, generator=gen).to(device, dtype)
    w, b = torch.randn(40, generator=gen).to(device, dtype), torch.randn(40, generator=gen).to(device, dtype)
    r = torch.randn(3, 11, 40, generator=gen).to(device, dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    out = torch.full((3, 11, 40), float("nan"), dtype=dtype, device=device)
    norm(x, (), w, b, eps=1e-5, residual=r, out=out)
    torch.testing.assert_close(out.float(), reference(x, (), w, b, eps=1e-5) + r.float(), atol=tol, rtol=tol)
    index = torch.randperm(33, generator=gen).to(device)
    y = norm(x, (), w, b, eps=1e-5, residual=r.reshape(33, 40), row_index=index)
    want = reference(x, (), w, b, eps=1e-5).reshape(33, 40).index_select(0, index) + r.reshape(33, 40).float()
    torch.testing.assert_close(y.float(), want, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="residual of shape"):
        norm(x, (), w, b, residual=r[:, :5])
