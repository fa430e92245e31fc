"""Generated lower-triangular test matrices (no downloads), scipy CSR float64.

All are diagonally dominant (|diag| > sum of |off-diagonals| in the row), so solutions stay
bounded and relative errors are meaningful in fp32 and fp64.

* ``banded``      rows depend on the previous ``bandwidth`` rows: levels = n.
* ``powerlaw``    power-law (Pareto) row lengths, half the columns near the row, half uniform.
* ``laplacian2d`` lower triangle of the 5-point Laplacian on a g x g grid (IC(0)-like pattern).
* ``laplacian3d`` lower triangle of the 7-point Laplacian on a g^3 grid.
* ``chain``       each row depends on the previous one only: the worst case, levels = n.
* ``heavyrows``   power-law plus a few very long rows (5/6 of all earlier columns, >= 64 entries):
                  small stand-ins for the ~2000-entry power-law rows (mixed-tiling tests).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp


def _finish(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """Strict-lower entries -> CSR with a dominant diagonal of random sign."""
    off = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    off.sum_duplicates()
    rowsum = np.asarray(abs(off).sum(axis=1)).ravel()
    diag = (rowsum + rng.uniform(0.5, 1.5, n)) * rng.choice([-1.0, 1.0], n)
    mat = (off + sp.diags(diag)).tocsr()
    mat.sort_indices()
    return mat


def banded(n: int, bandwidth: int = 8, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), bandwidth)
    cols = rows - np.tile(np.arange(1, bandwidth + 1), n)
    keep = cols >= 0
    rows, cols = rows[keep], cols[keep]
    return _finish(rows, cols, rng.uniform(-1, 1, rows.size), n, rng)


def powerlaw(
    n: int, mean_len: float = 6.0, alpha: float = 1.8, max_len: int = 2000, locality: float = 1e-3, seed: int = 0
) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    raw = rng.pareto(alpha, n) + 1.0  # Pareto(alpha) on [1, inf)
    lens = np.minimum(np.floor(raw * mean_len * (alpha - 1) / alpha).astype(np.int64), max_len)
    lens = np.minimum(lens, np.arange(n))  # row i has only i earlier rows
    rows = np.repeat(np.arange(n), lens)
    near = rng.random(rows.size) < 0.5
    dist = np.minimum(rng.geometric(locality, rows.size), np.maximum(rows, 1))
    uni = np.floor(rng.random(rows.size) * rows).astype(np.int64)
    cols = np.where(near, rows - dist, uni)
    keep = (cols >= 0) & (cols < rows)
    rows, cols = rows[keep], cols[keep]
    return _finish(rows, cols, rng.uniform(-1, 1, rows.size), n, rng)


def _grid_lower(shape: tuple[int, ...], seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    idx = np.arange(n).reshape(shape)
    rows, cols = [], []
    for axis in range(len(shape)):  # neighbour at -1 along each axis (natural ordering)
        sl_hi = [slice(None)] * len(shape)
        sl_lo = [slice(None)] * len(shape)
        sl_hi[axis] = slice(1, None)
        sl_lo[axis] = slice(None, -1)
        rows.append(idx[tuple(sl_hi)].ravel())
        cols.append(idx[tuple(sl_lo)].ravel())
    r, c = np.concatenate(rows), np.concatenate(cols)
    return _finish(r, c, -rng.uniform(0.5, 1.5, r.size), n, rng)


def laplacian2d(g: int, seed: int = 0) -> sp.csr_matrix:
    return _grid_lower((g, g), seed)


def laplacian3d(g: int, seed: int = 0) -> sp.csr_matrix:
    return _grid_lower((g, g, g), seed)


def chain(n: int, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    rows = np.arange(1, n)
    return _finish(rows, rows - 1, rng.uniform(-1, 1, rows.size), n, rng)


def heavyrows(n: int, n_long: int = 5, seed: int = 0) -> sp.csr_matrix:
    """``powerlaw(n)`` with ``n_long`` rows (two of them adjacent, one the last) made very long."""
    rng = np.random.default_rng(seed)
    base = sp.tril(powerlaw(n, seed=seed), -1).tocoo()
    lo = min(n - 1, 80)
    picks = rng.choice(np.arange(lo, n), size=min(n - lo, max(0, n_long - 2)), replace=False) if n > lo else np.array([], dtype=np.int64)
    heavy = np.unique(np.concatenate([picks, [lo, min(lo + 1, n - 1), n - 1]])).astype(np.int64)
    heavy = heavy[heavy > 0]
    rows, cols = [base.row], [base.col]
    for r in heavy:
        c = rng.choice(r, size=max(1, 5 * r // 6), replace=False)
        rows.append(np.full(c.size, r))
        cols.append(c)
    r_all, c_all = np.concatenate(rows), np.concatenate(cols)
    key = np.unique(r_all.astype(np.int64) * n + c_all)  # drop duplicate entries
    r_all, c_all = key // n, key % n
    return _finish(r_all, c_all, rng.uniform(-1, 1, r_all.size), n, rng)


GENERATORS: dict[str, Callable[..., sp.csr_matrix]] = {
    "banded": banded,
    "powerlaw": powerlaw,
    "laplacian2d": laplacian2d,
    "laplacian3d": laplacian3d,
    "chain": chain,
    "heavyrows": heavyrows,
}


def make(kind: str, size: int, seed: int = 0) -> sp.csr_matrix:
    """``size`` is the row count, except for Laplacians where it is the grid side g."""
    if kind not in GENERATORS:
        raise ValueError(f"unknown matrix kind {kind!r}; choose from {sorted(GENERATORS)}")
    return GENERATORS[kind](size, seed=seed)
