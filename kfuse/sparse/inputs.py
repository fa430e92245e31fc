"""Input checking for triangular solves: one canonical form, clear errors.

Whatever comes in (scipy.sparse matrix/array of any format, torch sparse CSR/COO tensor), the
solvers see a :class:`TriangularCSR`: the strictly-triangular part as a *lower* CSR in "solve
order" (for an upper matrix the index order is reversed, so row ``p`` of the canonical form is
original row ``n-1-p``), the diagonal in the same order, and the map back to original rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class TriangularCSR:
    """Strictly lower CSR in solve order plus diagonal; all tensors on ``device``."""

    n: int
    rowptr: torch.Tensor  # int64 [n+1]
    cols: torch.Tensor  # int64 [nnz_off], every col < its row
    vals: torch.Tensor  # dtype [nnz_off]
    diag: torch.Tensor  # dtype [n]; ones when unit_diagonal
    order: torch.Tensor  # int64 [n]: canonical row p is original row order[p]
    dtype: torch.dtype
    device: torch.device
    nnz: int  # stored entries used, diagonal included (ones for unit_diagonal count as n)


def _is_scipy_sparse(a: Any) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover
        return False
    return sp.issparse(a)


def _to_csr_parts(a: Any, device: torch.device | None) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, cols, rowptr, colidx, values) from a scipy or torch sparse matrix."""
    if _is_scipy_sparse(a):
        m = a.tocsr()
        m.sum_duplicates()  # also sorts indices
        vals = np.asarray(m.data)
        if vals.dtype not in (np.float32, np.float64):
            raise TypeError(f"sptrsv: matrix dtype {vals.dtype} is not supported; use float32 or float64")
        dev = device or torch.device("cpu")
        return (
            m.shape[0],
            m.shape[1],
            torch.from_numpy(np.asarray(m.indptr, dtype=np.int64)).to(dev),
            torch.from_numpy(np.asarray(m.indices, dtype=np.int64)).to(dev),
            torch.from_numpy(vals).to(dev),
        )
    if isinstance(a, torch.Tensor):
        if a.layout == torch.sparse_coo:
            a = a.coalesce().to_sparse_csr()
        if a.layout != torch.sparse_csr:
            raise TypeError(
                f"sptrsv: expected a sparse CSR matrix (torch.sparse_csr or scipy.sparse), got a torch tensor with layout {a.layout}; "
                "convert it with .to_sparse_csr()"
            )
        if a.dim() != 2:
            raise ValueError(f"sptrsv: the matrix must be 2-D, got shape {tuple(a.shape)}")
        if a.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"sptrsv: matrix dtype {a.dtype} is not supported; use torch.float32 or torch.float64")
        dev = device or a.device
        return (
            a.shape[0],
            a.shape[1],
            a.crow_indices().to(dev, torch.int64),
            a.col_indices().to(dev, torch.int64),
            a.values().to(dev),
        )
    raise TypeError(f"sptrsv: expected a torch sparse CSR tensor or a scipy.sparse matrix, got {type(a).__name__}")


def canonicalize(a: Any, lower: bool, unit_diagonal: bool, device: torch.device | str | None = None) -> TriangularCSR:
    """Check ``a`` and bring it to the canonical strictly-lower form (see module docstring)."""
    dev = torch.device(device) if device is not None else None
    nrows, ncols, rowptr, cols, vals = _to_csr_parts(a, dev)
    if nrows != ncols:
        raise ValueError(f"sptrsv: the matrix must be square, got shape ({nrows}, {ncols})")
    n = nrows
    if vals.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"sptrsv: matrix dtype {vals.dtype} is not supported; use float32 or float64")
    if not torch.isfinite(vals).all():
        raise ValueError("sptrsv: the matrix has NaN or infinite entries")
    lengths = rowptr[1:] - rowptr[:-1]
    rows = torch.repeat_interleave(torch.arange(n, device=rowptr.device), lengths)
    wrong = (cols > rows) if lower else (cols < rows)
    wrong &= vals != 0  # explicitly stored zeros in the other triangle are harmless
    if bool(wrong.any()):
        i = int(torch.nonzero(wrong)[0, 0])
        side = "above" if lower else "below"
        raise ValueError(
            f"sptrsv: the matrix is not {'lower' if lower else 'upper'} triangular: entry ({int(rows[i])}, {int(cols[i])}) "
            f"is {side} the diagonal (pass lower={not lower} if that was meant)"
        )
    on_diag = cols == rows
    if unit_diagonal:
        diag = torch.ones(n, dtype=vals.dtype, device=vals.device)
    else:
        diag = torch.zeros(n, dtype=vals.dtype, device=vals.device)
        diag.index_add_(0, rows[on_diag], vals[on_diag])
        zero = diag == 0
        if bool(zero.any()):
            i = int(torch.nonzero(zero)[0, 0])
            raise ValueError(
                f"sptrsv: the matrix is singular: the diagonal entry of row {i} is zero or missing "
                "(pass unit_diagonal=True if the diagonal is implicitly one)"
            )
    keep = ((cols < rows) if lower else (cols > rows)) & (vals != 0)
    r, c, v = rows[keep], cols[keep], vals[keep]
    if lower:
        order = torch.arange(n, device=vals.device)
        rowptr_off = torch.zeros(n + 1, dtype=torch.int64, device=vals.device)
        rowptr_off[1:] = torch.cumsum(torch.bincount(r, minlength=n), 0)
    else:
        # reverse the index order: an upper-triangular solve is a lower one read backwards
        order = torch.arange(n - 1, -1, -1, device=vals.device)
        r, c = n - 1 - r, n - 1 - c
        diag = diag.flip(0)
        key = torch.argsort(r * max(n, 1) + c)
        r, c, v = r[key], c[key], v[key]
        rowptr_off = torch.zeros(n + 1, dtype=torch.int64, device=vals.device)
        rowptr_off[1:] = torch.cumsum(torch.bincount(r, minlength=n), 0)
    nnz = int(c.numel()) + n
    return TriangularCSR(n, rowptr_off, c, v, diag, order, vals.dtype, vals.device, nnz)


def check_rhs(b: Any, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, bool, bool]:
    """b as a contiguous (n, k) tensor on ``device``; returns (b2d, was_1d, was_numpy)."""
    was_numpy = isinstance(b, np.ndarray)
    if was_numpy:
        if b.dtype not in (np.float32, np.float64):
            raise TypeError(f"sptrsv: right-hand side dtype {b.dtype} is not supported; use float32 or float64")
        bt = torch.from_numpy(np.ascontiguousarray(b)).to(device)
    elif isinstance(b, torch.Tensor):
        if b.is_sparse or b.layout != torch.strided:
            raise TypeError("sptrsv: the right-hand side must be a dense tensor")
        bt = b
    else:
        raise TypeError(f"sptrsv: the right-hand side must be a torch tensor or numpy array, got {type(b).__name__}")
    if bt.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"sptrsv: right-hand side dtype {bt.dtype} is not supported; use float32 or float64")
    if bt.dtype != dtype:
        raise TypeError(f"sptrsv: right-hand side dtype {bt.dtype} differs from the matrix dtype {dtype}; cast one of them")
    if bt.dim() not in (1, 2):
        raise ValueError(f"sptrsv: the right-hand side must have shape (n,) or (n, k), got {tuple(bt.shape)}")
    if bt.shape[0] != n:
        raise ValueError(f"sptrsv: the right-hand side has {bt.shape[0]} rows but the matrix has {n}")
    if bt.device != device:
        raise ValueError(f"sptrsv: the right-hand side is on {bt.device} but the matrix was analysed on {device}")
    was_1d = bt.dim() == 1
    b2 = bt.reshape(n, 1) if was_1d else bt
    return b2.contiguous(), was_1d, was_numpy
