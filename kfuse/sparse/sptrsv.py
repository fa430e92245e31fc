"""Sync-free sparse triangular solve: one kernel launch per solve, no level barriers.

Public API: :func:`analyze` (preprocessing, timed) returning a :class:`SptrsvPlan` whose
``solve`` runs the single kernel, and :func:`sptrsv` (analyse + solve in one call).

Kernel (one tile = R consecutive rows in level order):
  1. take a tile id from a global ticket counter (not ``program_id``: the hardware may start
     programs in any order, but tickets are only taken by programs already running, and a
     tile only depends on smaller tickets, so every wait is on a resident program);
  2. sweep the tile's nonzeros in [R, W] chunks; for dependencies outside the tile, wait on
     done flags (volatile loads), fence, gather x and accumulate;
  3. dependencies inside the tile (a level boundary or a chain inside the tile) are solved in
     registers: Jacobi sweeps on the tile's dense R x R block, exact after (depth+1) sweeps,
     where depth = level(last row) - level(first row);
  4. store x, barrier, release the tile's done flag(s).
Done flags hold an epoch number, so successive solves need no reset launch. How a program
waits (per-row or per-tile flags, poll backoff) and whether it loops over tickets (persistent
grid) are the :class:`~kfuse.sparse.variants.SyncOptions` of the plan or of one solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.sparse.analysis import (
    MAX_RHS_PER_LAUNCH,
    LevelOrdered,
    RowStats,
    Tiling,
    choose_sync,
    choose_tiling,
    compute_levels,
    level_order,
    mixed_tiles,
    row_length_tiling,
    row_stats,
)
from kfuse.sparse.inputs import canonicalize, check_rhs
from kfuse.sparse.sync import acquire_fence, backoff, hw_fence_enabled, st_release, wait_flags, wait_flags_acquire
from kfuse.sparse.tiledeps import tile_dependencies
from kfuse.sparse.variants import DEFAULT, SyncOptions, persistent_grid

_INT32_MAX = 2**31 - 1
DEP_LANES = 32  # producing tiles polled at once (tile-flag variant)
# value flags: x (position order) starts as a signalling NaN; arithmetic never yields one (any
# NaN it produces is quiet), so "bits == sentinel" means "not solved yet"
SENTINEL = {torch.float64: 0x7FF4A5A5A5A5A5A5, torch.float32: 0x7FA5A5A5}
_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32}
_FLAG_CODE = {"tile": 0, "row": 1, "value": 2}
MIXED_LONG_ELEMS = 2048  # mixed tiling: long-row lanes x padded RHS per chunk (256 lanes up to 8 RHS)


@triton.jit
def _solve_tile(
    t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
    n, nrhs, stride_b, stride_x, epoch,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr,
    TILE_FLAGS: tl.constexpr, DW: tl.constexpr, BACKOFF_NS: tl.constexpr,
):  # fmt: skip
    base = t * R
    r = tl.arange(0, R)
    pos = base + r
    rmask = pos < n
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, W)
    q = tl.arange(0, R)
    last = tl.minimum(base + R - 1, n - 1)
    niter = tl.load(lev + last) - tl.load(lev + base) + 1  # in-tile dependency depth + 1
    acc = tl.zeros([R, KP], dtype=vals.dtype.element_ty)
    lloc = tl.zeros([R, R], dtype=vals.dtype.element_ty)
    shift = 0
    if TILE_FLAGS:  # wait once on the producing tiles' flags, fence once, then gather freely
        d0 = tl.load(tdep_ptr + t)
        d1 = tl.load(tdep_ptr + t + 1)
        for doff in range(d0, d1, DW):
            j = doff + tl.arange(0, DW)
            dm = j < d1
            wait_flags(done_ptr, tl.load(tdeps + j, mask=dm, other=0), dm, epoch, BACKOFF_NS, HW_FENCE)
        shift = acquire_fence(d0, HW_FENCE) - d0  # 0, but opaque: the gathers below stay after the fence
    nlen = tl.max(end - start)
    for off in range(0, nlen, W):
        idx = start[:, None] + off + w[None, :]
        m = idx < end[:, None]
        c = tl.load(cols + idx, mask=m, other=0)
        v = tl.load(vals + idx, mask=m, other=0.0)
        ext = m & (c < base)
        if TILE_FLAGS:
            xo = c[:, :, None] * nrhs + kk[None, None, :] + shift
        else:  # one flag per dependency, polled and fenced chunk by chunk
            wait_flags(done_ptr, c, ext, epoch, BACKOFF_NS, HW_FENCE)
            tok = acquire_fence(off, HW_FENCE)
            xo = c[:, :, None] * nrhs + kk[None, None, :] + (tok - off)  # data-dependent on the fence
        xg = tl.load(xp_ptr + xo, mask=ext[:, :, None] & kmask[None, None, :], other=0.0, volatile=True)
        acc += tl.sum(v[:, :, None] * xg, axis=1)
        if niter > 1:
            hit = (m & (c >= base))[:, :, None] & ((c - base)[:, :, None] == q[None, None, :])
            lloc += tl.sum(tl.where(hit, v[:, :, None], 0.0), axis=1)
    row = tl.load(perm + pos, mask=rmask, other=0)
    rk = rmask[:, None] & kmask[None, :]
    rhs = tl.load(b_ptr + row[:, None] * stride_b + kk[None, :], mask=rk, other=0.0) - acc
    d = tl.load(diag + pos, mask=rmask, other=1.0)
    xt = rhs / d[:, None]
    for _ in range(1, niter):
        # the where() keeps Triton from rewriting sum(a[:, :, None] * b[None]) into a tf32 tl.dot
        prod = tl.where(lloc[:, :, None] != 0.0, lloc[:, :, None] * xt[None, :, :], 0.0)
        xt = (rhs - tl.sum(prod, axis=1)) / d[:, None]
    tl.store(xp_ptr + pos[:, None] * nrhs + kk[None, :], xt, mask=rk)
    tl.store(x_ptr + row[:, None] * stride_x + kk[None, :], xt, mask=rk)
    tl.debug_barrier()  # every thread's x stores precede the release below
    if TILE_FLAGS:
        tl.atomic_xchg(done_ptr + t, epoch, sem="release", scope="gpu")
    else:
        tl.atomic_xchg(done_ptr + pos, epoch, mask=rmask, sem="release", scope="gpu")


@triton.jit
def _syncfree_kernel(
    rowptr, cols, vals, diag, perm, lev,  # level-ordered matrix (positions)
    b_ptr, x_ptr, xp_ptr,  # b and x in original row order, xp = x in position order
    done_ptr, ticket_ptr,  # done flags (per row, or per tile with TILE_FLAGS), ticket counter
    tdep_ptr, tdeps,  # per-tile producing tiles (CSR), read only with TILE_FLAGS
    n, nrhs, stride_b, stride_x, epoch, ticket_base, n_tiles,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr,
    TILE_FLAGS: tl.constexpr, DW: tl.constexpr, BACKOFF_NS: tl.constexpr, PERSISTENT: tl.constexpr,
):  # fmt: skip
    t = tl.atomic_add(ticket_ptr, 1) - ticket_base  # dynamic tile id (see module docstring)
    if PERSISTENT:  # a tile only waits on smaller tickets, held by programs that are running
        while t < n_tiles:
            _solve_tile(
                t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
                n, nrhs, stride_b, stride_x, epoch, R, W, KP, HW_FENCE, TILE_FLAGS, DW, BACKOFF_NS,
            )  # fmt: skip
            t = tl.atomic_add(ticket_ptr, 1) - ticket_base
    else:
        _solve_tile(
            t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
            n, nrhs, stride_b, stride_x, epoch, R, W, KP, HW_FENCE, TILE_FLAGS, DW, BACKOFF_NS,
        )  # fmt: skip


@triton.jit
def _solve_tile_fast(
    t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
    n, nrhs, stride_b, stride_x, epoch, SENTINEL,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr,
    FLAGS: tl.constexpr, DW: tl.constexpr, BACKOFF_NS: tl.constexpr, ACQUIRE: tl.constexpr, ST_RELEASE: tl.constexpr,
):  # fmt: skip
    """One tile with every load that does not need x issued before the wait (``prefetch``).

    FLAGS: 0 = per-tile flags, 1 = per-row flags, 2 = value flags (x itself, sentinel = not yet).
    Before waiting: rowptr, level span, perm, b, diag, the first chunk's cols/vals, and the
    in-tile block ``lloc`` (all chunks). After: only the x gather (and later chunks), the
    in-tile sweeps, the store and the release remain on the dependency chain.
    """
    base = t * R
    r = tl.arange(0, R)
    pos = base + r
    rmask = pos < n
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, W)
    q = tl.arange(0, R)
    last = tl.minimum(base + R - 1, n - 1)
    niter = tl.load(lev + last) - tl.load(lev + base) + 1
    row = tl.load(perm + pos, mask=rmask, other=0)
    rk = rmask[:, None] & kmask[None, :]
    bt = tl.load(b_ptr + row[:, None] * stride_b + kk[None, :], mask=rk, other=0.0)
    d = tl.load(diag + pos, mask=rmask, other=1.0)
    nlen = tl.max(end - start)
    idx0 = start[:, None] + w[None, :]
    m0 = idx0 < end[:, None]
    c0 = tl.load(cols + idx0, mask=m0, other=0)
    v0 = tl.load(vals + idx0, mask=m0, other=0.0)
    lloc = tl.zeros([R, R], dtype=vals.dtype.element_ty)
    if niter > 1:  # the in-tile block needs no x: build it before waiting
        for off in range(0, nlen, W):
            idx = start[:, None] + off + w[None, :]
            m = idx < end[:, None]
            c = tl.load(cols + idx, mask=m, other=0)
            v = tl.load(vals + idx, mask=m, other=0.0)
            hit = (m & (c >= base))[:, :, None] & ((c - base)[:, :, None] == q[None, None, :])
            lloc += tl.sum(tl.where(hit, v[:, :, None], 0.0), axis=1)
    shift = 0
    if FLAGS == 0:  # per-tile flags: wait on the producer tiles, then order every lane's gathers
        d0 = tl.load(tdep_ptr + t)
        d1 = tl.load(tdep_ptr + t + 1)
        for doff in range(d0, d1, DW):
            j = doff + tl.arange(0, DW)
            dm = j < d1
            dep = tl.load(tdeps + j, mask=dm, other=0)
            if ACQUIRE:
                shift += tl.sum(wait_flags_acquire(done_ptr, dep, dm, epoch, BACKOFF_NS, HW_FENCE))
            else:
                wait_flags(done_ptr, dep, dm, epoch, BACKOFF_NS, HW_FENCE)
        if ACQUIRE:  # the lanes that acquired are not the lanes that gather: a CTA barrier passes it on
            tl.debug_barrier()
        else:
            shift = acquire_fence(d0, HW_FENCE) - d0
    acc = tl.zeros([R, KP], dtype=vals.dtype.element_ty)
    c = c0
    v = v0
    for off in range(0, nlen, W):
        idx = start[:, None] + off + w[None, :]
        m = idx < end[:, None]
        if off > 0:
            c = tl.load(cols + idx, mask=m, other=0)
            v = tl.load(vals + idx, mask=m, other=0.0)
        ext = m & (c < base)
        emask = ext[:, :, None] & kmask[None, None, :]
        if FLAGS == 2:  # value flags: poll x itself until no gathered value is the sentinel
            xo = c[:, :, None] * nrhs + kk[None, None, :]
            xg = tl.load(xp_ptr + xo, mask=emask, other=0.0, volatile=True)
            missing = tl.sum(tl.where(emask & (xg.to(SENTINEL.dtype, bitcast=True) == SENTINEL), 1, 0))
            while missing > 0:
                slept = backoff(missing, BACKOFF_NS, HW_FENCE)
                xg = tl.load(xp_ptr + xo + (slept - missing), mask=emask, other=0.0, volatile=True)
                missing = tl.sum(tl.where(emask & (xg.to(SENTINEL.dtype, bitcast=True) == SENTINEL), 1, 0))
        else:
            if FLAGS == 1:  # per-row flags: each lane acquires the flag of the column it gathers
                if ACQUIRE:
                    lane = wait_flags_acquire(done_ptr, c, ext, epoch, BACKOFF_NS, HW_FENCE)
                    xo = (c + lane)[:, :, None] * nrhs + kk[None, None, :]
                else:
                    wait_flags(done_ptr, c, ext, epoch, BACKOFF_NS, HW_FENCE)
                    tok = acquire_fence(off, HW_FENCE)
                    xo = c[:, :, None] * nrhs + kk[None, None, :] + (tok - off)
            else:
                xo = c[:, :, None] * nrhs + kk[None, None, :] + shift
            xg = tl.load(xp_ptr + xo, mask=emask, other=0.0, volatile=True)
        acc += tl.sum(v[:, :, None] * xg, axis=1)
    rhs = bt - acc
    xt = rhs / d[:, None]
    for _ in range(1, niter):
        prod = tl.where(lloc[:, :, None] != 0.0, lloc[:, :, None] * xt[None, :, :], 0.0)
        xt = (rhs - tl.sum(prod, axis=1)) / d[:, None]
    tl.store(x_ptr + row[:, None] * stride_x + kk[None, :], xt, mask=rk)
    if FLAGS == 2:  # the value is the flag: a relaxed gpu-scope exchange, no fence, no barrier
        xbits = xp_ptr.to(tl.pointer_type(SENTINEL.dtype), bitcast=True)  # a relaxed store of the bits
        tl.atomic_xchg(xbits + pos[:, None] * nrhs + kk[None, :], xt.to(SENTINEL.dtype, bitcast=True), mask=rk, sem="relaxed", scope="gpu")
    else:
        tl.store(xp_ptr + pos[:, None] * nrhs + kk[None, :], xt, mask=rk)
        tl.debug_barrier()  # every thread's x stores precede the release below
        if FLAGS == 0:
            if ST_RELEASE:
                st_release(done_ptr + t, epoch, HW_FENCE)
            else:
                tl.atomic_xchg(done_ptr + t, epoch, sem="release", scope="gpu")
        else:
            tl.atomic_xchg(done_ptr + pos, epoch, mask=rmask, sem="release", scope="gpu")


@triton.jit
def _syncfree_fast_kernel(
    rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, ticket_ptr, tdep_ptr, tdeps,
    n, nrhs, stride_b, stride_x, epoch, ticket_base, n_tiles, SENTINEL,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr,
    FLAGS: tl.constexpr, DW: tl.constexpr, BACKOFF_NS: tl.constexpr, ACQUIRE: tl.constexpr, ST_RELEASE: tl.constexpr,
    PERSISTENT: tl.constexpr,
):  # fmt: skip
    """The ``prefetch`` variants; tickets are relaxed atomics (they carry no data)."""
    t = tl.atomic_add(ticket_ptr, 1, sem="relaxed") - ticket_base
    if PERSISTENT:
        while t < n_tiles:
            _solve_tile_fast(
                t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
                n, nrhs, stride_b, stride_x, epoch, SENTINEL, R, W, KP, HW_FENCE, FLAGS, DW, BACKOFF_NS, ACQUIRE, ST_RELEASE,
            )  # fmt: skip
            t = tl.atomic_add(ticket_ptr, 1, sem="relaxed") - ticket_base
    else:
        _solve_tile_fast(
            t, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, done_ptr, tdep_ptr, tdeps,
            n, nrhs, stride_b, stride_x, epoch, SENTINEL, R, W, KP, HW_FENCE, FLAGS, DW, BACKOFF_NS, ACQUIRE, ST_RELEASE,
        )  # fmt: skip


@triton.jit
def _value_gather(xp_ptr, xo, emask, SENTINEL, BACKOFF_NS: tl.constexpr, HW_FENCE: tl.constexpr):
    """Gather x (volatile) and poll until no gathered value is the sentinel (value flags)."""
    xg = tl.load(xp_ptr + xo, mask=emask, other=0.0, volatile=True)
    missing = tl.sum(tl.where(emask & (xg.to(SENTINEL.dtype, bitcast=True) == SENTINEL), 1, 0))
    while missing > 0:
        slept = backoff(missing, BACKOFF_NS, HW_FENCE)
        xg = tl.load(xp_ptr + xo + (slept - missing), mask=emask, other=0.0, volatile=True)
        missing = tl.sum(tl.where(emask & (xg.to(SENTINEL.dtype, bitcast=True) == SENTINEL), 1, 0))
    return xg


@triton.jit
def _solve_short_value(
    base, cnt, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr, BACKOFF_NS: tl.constexpr,
):  # fmt: skip
    """Mixed tiling, packed tile: ``cnt`` <= R consecutive short rows from ``base``, value flags.

    The value-flag path of :func:`_solve_tile_fast` with a variable row count.
    """
    r = tl.arange(0, R)
    pos = base + r
    rmask = r < cnt
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, W)
    q = tl.arange(0, R)
    niter = tl.load(lev + base + cnt - 1) - tl.load(lev + base) + 1
    row = tl.load(perm + pos, mask=rmask, other=0)
    rk = rmask[:, None] & kmask[None, :]
    bt = tl.load(b_ptr + row[:, None] * stride_b + kk[None, :], mask=rk, other=0.0)
    d = tl.load(diag + pos, mask=rmask, other=1.0)
    nlen = tl.max(end - start)
    idx0 = start[:, None] + w[None, :]
    m0 = idx0 < end[:, None]
    c0 = tl.load(cols + idx0, mask=m0, other=0)
    v0 = tl.load(vals + idx0, mask=m0, other=0.0)
    lloc = tl.zeros([R, R], dtype=vals.dtype.element_ty)
    if niter > 1:  # the in-tile block needs no x: build it before waiting
        for off in range(0, nlen, W):
            idx = start[:, None] + off + w[None, :]
            m = idx < end[:, None]
            c = tl.load(cols + idx, mask=m, other=0)
            v = tl.load(vals + idx, mask=m, other=0.0)
            hit = (m & (c >= base))[:, :, None] & ((c - base)[:, :, None] == q[None, None, :])
            lloc += tl.sum(tl.where(hit, v[:, :, None], 0.0), axis=1)
    acc = tl.zeros([R, KP], dtype=vals.dtype.element_ty)
    c = c0
    v = v0
    for off in range(0, nlen, W):
        idx = start[:, None] + off + w[None, :]
        m = idx < end[:, None]
        if off > 0:
            c = tl.load(cols + idx, mask=m, other=0)
            v = tl.load(vals + idx, mask=m, other=0.0)
        emask = (m & (c < base))[:, :, None] & kmask[None, None, :]
        xg = _value_gather(xp_ptr, c[:, :, None] * nrhs + kk[None, None, :], emask, SENTINEL, BACKOFF_NS, HW_FENCE)
        acc += tl.sum(v[:, :, None] * xg, axis=1)
    rhs = bt - acc
    xt = rhs / d[:, None]
    for _ in range(1, niter):
        prod = tl.where(lloc[:, :, None] != 0.0, lloc[:, :, None] * xt[None, :, :], 0.0)
        xt = (rhs - tl.sum(prod, axis=1)) / d[:, None]
    tl.store(x_ptr + row[:, None] * stride_x + kk[None, :], xt, mask=rk)
    xbits = xp_ptr.to(tl.pointer_type(SENTINEL.dtype), bitcast=True)  # the value is the flag
    tl.atomic_xchg(xbits + pos[:, None] * nrhs + kk[None, :], xt.to(SENTINEL.dtype, bitcast=True), mask=rk, sem="relaxed", scope="gpu")


@triton.jit
def _solve_long_row(
    p, start, end, cols, vals, diag, perm, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL,
    WL: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr, BACKOFF_NS: tl.constexpr,
):  # fmt: skip
    """Mixed tiling, long tile: the whole program sweeps row ``p`` (entries [start, end)) in chunks of WL lanes.

    Every column is an earlier position (strictly lower, level order): all entries are external.
    The next chunk's cols/vals are loaded before this chunk's gather and poll, so once the
    producers are done a chunk costs one memory round trip (the x gather), not two.
    """
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, WL)
    row = tl.load(perm + p)
    bt = tl.load(b_ptr + row * stride_b + kk, mask=kmask, other=0.0)
    d = tl.load(diag + p)
    idx = start + w
    m = idx < end
    c = tl.load(cols + idx, mask=m, other=0)
    v = tl.load(vals + idx, mask=m, other=0.0)
    acc = tl.zeros([WL, KP], dtype=vals.dtype.element_ty)  # reduced once, after the sweep
    for off in range(start, end, WL):
        idn = off + WL + w
        mn = idn < end
        cn = tl.load(cols + idn, mask=mn, other=0)
        vn = tl.load(vals + idn, mask=mn, other=0.0)
        emask = m[:, None] & kmask[None, :]
        xg = _value_gather(xp_ptr, c[:, None] * nrhs + kk[None, :], emask, SENTINEL, BACKOFF_NS, HW_FENCE)
        acc += v[:, None] * xg
        c = cn
        v = vn
        m = mn
    xt = (bt - tl.sum(acc, axis=0)) / d
    tl.store(x_ptr + row * stride_x + kk, xt, mask=kmask)
    xbits = xp_ptr.to(tl.pointer_type(SENTINEL.dtype), bitcast=True)
    tl.atomic_xchg(xbits + p * nrhs + kk, xt.to(SENTINEL.dtype, bitcast=True), mask=kmask, sem="relaxed", scope="gpu")


@triton.jit
def _solve_mixed_tile(
    t, tile_ptr, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL, LONG_MIN,
    R: tl.constexpr, W: tl.constexpr, WL: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr, BACKOFF_NS: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of the mixed tiling: a one-row tile whose row is longer than LONG_MIN is long, else packed."""
    base = tl.load(tile_ptr + t)
    cnt = tl.load(tile_ptr + t + 1) - base
    s0 = tl.load(rowptr + base)
    s1 = tl.load(rowptr + base + 1)
    if (cnt == 1) & (s1 - s0 > LONG_MIN):
        _solve_long_row(
            base, s0, s1, cols, vals, diag, perm, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL, WL, KP, HW_FENCE, BACKOFF_NS
        )
    else:
        _solve_short_value(
            base, cnt, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL,
            R, W, KP, HW_FENCE, BACKOFF_NS,
        )  # fmt: skip


@triton.jit
def _syncfree_mixed_kernel(
    rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, ticket_ptr, tile_ptr,
    nrhs, stride_b, stride_x, ticket_base, n_tiles, SENTINEL, LONG_MIN,
    R: tl.constexpr, W: tl.constexpr, WL: tl.constexpr, KP: tl.constexpr, HW_FENCE: tl.constexpr,
    BACKOFF_NS: tl.constexpr, PERSISTENT: tl.constexpr,
):  # fmt: skip
    """Mixed tiling (``SyncOptions.long_row_min``): variable-size tiles from ``tile_ptr``, value flags.

    One kernel, one ticket counter, a runtime branch on the tile kind. Tiles are increasing
    position ranges in level order, so ticket t only waits on tiles with smaller tickets, held
    by programs of this same launch that are already running (two kernels sharing the counter
    would need both to be resident for that argument). Tickets are relaxed (they carry no data).
    """
    t = tl.atomic_add(ticket_ptr, 1, sem="relaxed") - ticket_base
    if PERSISTENT:
        while t < n_tiles:
            _solve_mixed_tile(
                t, tile_ptr, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL, LONG_MIN,
                R, W, WL, KP, HW_FENCE, BACKOFF_NS,
            )  # fmt: skip
            t = tl.atomic_add(ticket_ptr, 1, sem="relaxed") - ticket_base
    else:
        _solve_mixed_tile(
            t, tile_ptr, rowptr, cols, vals, diag, perm, lev, b_ptr, x_ptr, xp_ptr, nrhs, stride_b, stride_x, SENTINEL, LONG_MIN,
            R, W, WL, KP, HW_FENCE, BACKOFF_NS,
        )  # fmt: skip


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass
class SptrsvPlan:
    """Result of :func:`analyze`: level-ordered matrix, tiling, workspace, timings."""

    n: int
    nnz: int
    dtype: torch.dtype
    device: torch.device
    lower: bool
    unit_diagonal: bool
    num_levels: int
    tiling: Tiling
    lo: LevelOrdered
    preprocess_ms: dict[str, float]
    sync: SyncOptions = DEFAULT
    stats: RowStats | None = None  # row lengths and levels: what the automatic choice looked at
    level_tiling: Tiling | None = None  # the level kernel's tiling
    _tile_deps: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(repr=False, default_factory=dict)  # R -> CSR
    _mixed_tiles: dict[tuple[int, int], torch.Tensor] = field(repr=False, default_factory=dict)  # (R, threshold) -> tile_ptr
    _done: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]
    _ticket: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]
    _epoch: int = 0
    _tickets_used: int = 0

    def __post_init__(self) -> None:
        self._done = torch.zeros(max(self.n, 1), dtype=torch.int32, device=self.device)
        self._ticket = torch.zeros(1, dtype=torch.int32, device=self.device)

    @property
    def info(self) -> dict[str, Any]:
        """Plain summary (for reports): sizes, levels, tiling, preprocessing times."""
        return {
            "rows": self.n,
            "nnz": self.nnz,
            "levels": self.num_levels,
            "dtype": str(self.dtype).replace("torch.", ""),
            "mode": self.tiling.mode,
            "rows_per_program": self.tiling.rows_per_program,
            "lanes_per_row": self.tiling.lanes_per_row,
            "num_warps": self.tiling.num_warps,
            "sync": self.sync.name,
            "regime": self.stats.regime if self.stats else None,
            "preprocess_ms": dict(self.preprocess_ms),
        }

    def tiling_for(self, kp: int, tiling: Tiling | None = None) -> Tiling:
        """Tiling for KP padded right-hand sides: fewer rows per program as KP grows."""
        t = tiling or self.tiling
        r = t.rows_per_program
        while r > 1 and r * t.lanes_per_row * kp > 2048:
            r //= 2
        return Tiling(r, t.lanes_per_row, t.num_warps if kp == 1 else min(8, max(t.num_warps, 4)))

    def tile_deps(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Producing tiles of every tile for R = ``r`` (computed once per R, then cached)."""
        if r not in self._tile_deps:
            self._tile_deps[r] = tile_dependencies(self.lo.rowptr, self.lo.cols, self.n, r)
        return self._tile_deps[r]

    def mixed_tiles(self, r: int, long_row_min: int) -> torch.Tensor:
        """Tile boundaries of the mixed tiling (``analysis.mixed_tiles``; computed once per R and threshold)."""
        key = (r, long_row_min)
        if key not in self._mixed_tiles:
            self._mixed_tiles[key] = mixed_tiles(self.lo.rowptr, self.n, r, long_row_min)
        return self._mixed_tiles[key]

    def _next_epoch(self, n_tickets: int) -> tuple[int, int]:
        """Epoch and ticket base of the next launch; ``n_tickets`` = tickets that launch takes."""
        if self._epoch + 1 >= _INT32_MAX or self._tickets_used + n_tickets >= _INT32_MAX:
            self._done.zero_()
            self._ticket.zero_()
            self._epoch, self._tickets_used = 0, 0
        self._epoch += 1
        base = self._tickets_used
        self._tickets_used += n_tickets
        return self._epoch, base

    def solve(self, b: Any, out: torch.Tensor | None = None, sync: SyncOptions | None = None, tiling: Tiling | None = None) -> Any:
        """x with A x = b (sync-free, one launch per group of up to 16 right-hand sides).

        ``sync`` overrides the plan's :class:`SyncOptions` and ``tiling`` the plan's tiling for
        this solve (variant and tiling sweeps; the level order does not depend on the tiling).
        """
        b2, was_1d, was_numpy = check_rhs(b, self.n, self.dtype, self.device)
        x = _prepare_out(out, b2)
        k = b2.shape[1]
        opts = sync or self.sync
        if self.n > 0:
            fence = hw_fence_enabled(self.device)
            for g0 in range(0, k, MAX_RHS_PER_LAUNCH):
                kg = min(MAX_RHS_PER_LAUNCH, k - g0)
                kp = _pow2_ceil(kg)
                til = self.tiling_for(kp, tiling)
                r = til.rows_per_program
                if opts.long_row_min:
                    self._solve_mixed(b2[:, g0:], x[:, g0:], kg, kp, til, opts, fence)
                    continue
                n_tiles = triton.cdiv(self.n, r)
                grid = persistent_grid(self.device, n_tiles, opts) if opts.persistent else n_tiles
                # a persistent program also takes the one ticket past the end that stops it
                epoch, base = self._next_epoch(n_tiles + grid if opts.persistent else n_tiles)
                tile = opts.flag_kind == "tile"
                tdep_ptr, tdeps = self.tile_deps(r) if tile else (self._ticket, self._ticket)
                lo = self.lo
                if opts.prefetch:
                    kind = opts.flag_kind
                    sent = SENTINEL[self.dtype]
                    if kind == "value":  # x starts as the sentinel: "not solved yet"
                        xp = torch.full((self.n * kg,), sent, dtype=_INT_OF[self.dtype], device=self.device).view(self.dtype)
                    else:
                        xp = torch.empty(self.n * kg, dtype=self.dtype, device=self.device)
                    _syncfree_fast_kernel[(grid,)](
                        lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels,
                        b2[:, g0:], x[:, g0:], xp, self._done, self._ticket, tdep_ptr, tdeps,
                        self.n, kg, b2.stride(0), x.stride(0), epoch, base, n_tiles, sent,
                        R=r, W=til.lanes_per_row, KP=kp, HW_FENCE=fence, FLAGS=_FLAG_CODE[kind], DW=DEP_LANES,
                        BACKOFF_NS=opts.backoff_ns, ACQUIRE=opts.acquire, ST_RELEASE=opts.st_release, PERSISTENT=opts.persistent,
                        num_warps=til.num_warps,
                    )  # fmt: skip
                    continue
                xp = torch.empty(self.n * kg, dtype=self.dtype, device=self.device)
                _syncfree_kernel[(grid,)](
                    lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels,
                    b2[:, g0:], x[:, g0:], xp, self._done, self._ticket, tdep_ptr, tdeps,
                    self.n, kg, b2.stride(0), x.stride(0), epoch, base, n_tiles,
                    R=r, W=til.lanes_per_row, KP=kp, HW_FENCE=fence,
                    TILE_FLAGS=tile, DW=DEP_LANES, BACKOFF_NS=opts.backoff_ns, PERSISTENT=opts.persistent,
                    num_warps=til.num_warps,
                )  # fmt: skip
        return _finish(x, out, was_1d, was_numpy)

    def _solve_mixed(self, b2: torch.Tensor, x: torch.Tensor, kg: int, kp: int, til: Tiling, opts: SyncOptions, fence: bool) -> None:
        """One launch of the mixed-tiling kernel for ``kg`` right-hand sides (padded to ``kp``)."""
        tile_ptr = self.mixed_tiles(til.rows_per_program, opts.long_row_min)
        n_tiles = tile_ptr.numel() - 1
        grid = persistent_grid(self.device, n_tiles, opts) if opts.persistent else n_tiles
        _, base = self._next_epoch(n_tiles + grid if opts.persistent else n_tiles)  # value flags: no epoch
        sent = SENTINEL[self.dtype]
        xp = torch.full((self.n * kg,), sent, dtype=_INT_OF[self.dtype], device=self.device).view(self.dtype)
        wl = max(1, min(opts.long_lanes, MIXED_LONG_ELEMS // kp))  # [WL, KP] long-row gather
        lo = self.lo
        _syncfree_mixed_kernel[(grid,)](
            lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels, b2, x, xp, self._ticket, tile_ptr,
            kg, b2.stride(0), x.stride(0), base, n_tiles, sent, opts.long_row_min,
            R=til.rows_per_program, W=til.lanes_per_row, WL=wl, KP=kp, HW_FENCE=fence, BACKOFF_NS=opts.backoff_ns,
            PERSISTENT=opts.persistent, num_warps=opts.long_warps,
        )  # fmt: skip


def _prepare_out(out: torch.Tensor | None, b2: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(b2)
    if out.dtype != b2.dtype or out.device != b2.device or out.numel() != b2.numel() or not out.is_contiguous():
        raise ValueError(f"sptrsv: out must be a contiguous {b2.dtype} tensor on {b2.device} with {b2.numel()} elements")
    return out.view(b2.shape)


def _finish(x: torch.Tensor, out: torch.Tensor | None, was_1d: bool, was_numpy: bool) -> Any:
    if out is not None:
        return out
    y = x[:, 0] if was_1d else x
    return y.cpu().numpy() if was_numpy else y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def analyze(
    a: Any,
    lower: bool = True,
    unit_diagonal: bool = False,
    device: torch.device | str | None = None,
    tiling: Tiling | None = None,
    sync: SyncOptions | None = None,
) -> SptrsvPlan:
    """Check and preprocess a triangular CSR matrix (torch sparse CSR or scipy.sparse).

    Times (wall clock, device synchronised) go to ``plan.preprocess_ms``: ``check`` (validation
    and canonical form), ``levels`` (sync-free level kernel), ``reorder`` (level-order
    renumbering), ``tile_deps`` (producing tiles, only with tile flags) and ``total``.
    ``tiling`` overrides the tiling and ``sync`` the kernel variant
    (``kfuse.sparse.variants``; ``LEGACY`` is the original kernel). Left out, both follow the
    matrix's regime (:class:`~kfuse.sparse.analysis.RowStats`, measured choice in docs/sparse.md):
    short rows -> one-warp 8x4 tiles + value flags; long rows -> the row-length tiling + value
    flags with 2 programs per SM; chains and bands (under 4 rows per level) -> the row-length
    tiling + ``LEGACY``. The level kernel uses ``tiling`` or the row-length tiling.
    """
    if device is None and not isinstance(a, torch.Tensor):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    tri = canonicalize(a, lower=lower, unit_diagonal=unit_diagonal, device=device)
    if tri.cols.numel() >= _INT32_MAX or tri.n >= _INT32_MAX // MAX_RHS_PER_LAUNCH:
        raise ValueError(f"sptrsv: matrix too large for 32-bit indexing (n={tri.n}, nnz={tri.nnz})")
    stats = row_stats(tri.rowptr[1:] - tri.rowptr[:-1])
    lev_til = tiling or row_length_tiling(stats)
    _sync(tri.device)
    t1 = time.perf_counter()
    lev = compute_levels(tri, lev_til)
    _sync(tri.device)
    t2 = time.perf_counter()
    lo = level_order(tri, lev)
    _sync(tri.device)
    t3 = time.perf_counter()
    ms = {"check": (t1 - t0) * 1e3, "levels": (t2 - t1) * 1e3, "reorder": (t3 - t2) * 1e3}
    stats = replace(stats, levels=len(lo.level_ptr) - 1)
    til = tiling or choose_tiling(stats)
    sync = sync or choose_sync(stats)
    plan = SptrsvPlan(
        n=tri.n,
        nnz=tri.nnz,
        dtype=tri.dtype,
        device=tri.device,
        lower=lower,
        unit_diagonal=unit_diagonal,
        num_levels=len(lo.level_ptr) - 1,
        tiling=til,
        lo=lo,
        preprocess_ms=ms,
        sync=sync,
        stats=stats,
        level_tiling=lev_til,
    )
    if sync.flag_kind == "tile" and plan.n > 0:  # the one-RHS tiling's lists; other R are built on first use
        plan.tile_deps(til.rows_per_program)
        _sync(tri.device)
    t4 = time.perf_counter()
    ms["tile_deps"] = (t4 - t3) * 1e3
    ms["total"] = (t4 - t0) * 1e3
    return plan


def sptrsv(
    a: Any,
    b: Any,
    lower: bool = True,
    unit_diagonal: bool = False,
    method: str = "syncfree",
) -> Any:
    """Solve ``A x = b`` for triangular CSR ``A`` (or an :class:`SptrsvPlan`).

    ``b`` has shape (n,) or (n, k) (torch tensor or numpy array; the result has the same kind
    and shape). ``method`` is ``"syncfree"`` (one kernel) or ``"levelset"`` (one launch per
    level, the baseline). For repeated solves with one matrix, call :func:`analyze` once and
    pass the plan (or call ``plan.solve``).
    """
    if method not in ("syncfree", "levelset"):
        raise ValueError(f"sptrsv: unknown method {method!r}; use 'syncfree' or 'levelset'")
    if isinstance(a, SptrsvPlan):
        plan = a
    else:
        dev = b.device if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor) else None
        plan = analyze(a, lower=lower, unit_diagonal=unit_diagonal, device=dev)
    if method == "levelset":
        from kfuse.sparse.levelset import levelset_solve

        return levelset_solve(plan, b)
    return plan.solve(b)


__all__ = ["SptrsvPlan", "SyncOptions", "analyze", "sptrsv"]
