"""The sync-free solve kernels (Triton); the host side is :mod:`kfuse.sparse.sptrsv`.

Three generations, each selectable through :class:`~kfuse.sparse.variants.SyncOptions`:

* ``_syncfree_kernel`` (legacy): one tile = R consecutive rows in level order. A program takes
  a tile id from a global ticket counter (not ``program_id``: the hardware may start programs in
  any order, but tickets are only taken by running programs and a tile only depends on smaller
  tickets, so every wait is on a resident program). It sweeps the tile's nonzeros in [R, W]
  chunks, waits on done flags (volatile loads), fences, gathers x; dependencies inside the tile
  are solved in registers by Jacobi sweeps on the tile's R x R block, exact after depth+1 sweeps;
  then it stores x, barriers and releases the done flags (which hold an epoch number, so
  successive solves need no reset launch).
* ``_syncfree_fast_kernel``: everything that does not need x is loaded before the wait; polls
  with ``ld.acquire`` or, with value flags, on x itself (x starts as a signalling NaN, so the
  value is the flag: no fence, no release on the dependency chain).
* ``_syncfree_mixed_kernel``: value flags with variable-size tiles; a row longer than a threshold
  is a tile of its own, swept by a whole program in wide chunks.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kfuse.sparse.sync import acquire_fence, backoff, st_release, wait_flags, wait_flags_acquire

# ``epoch`` and ``ticket_base`` change with every launch: left to Triton's default integer
# specialisation (divisible by 16 or not, equal to 1), the first solves compiled the kernel up to
# three times, and a tuner timing those solves saw ~300 ms instead of ~0.3 ms.
_PER_LAUNCH = ["ticket_base", "epoch"]


@triton.jit
def _in_tile_block(cols, vals, start, end, base, nlen, niter, R: tl.constexpr, W: tl.constexpr):
    """The tile's own R x R block (dependencies between its rows); zeros when it holds one level."""
    w = tl.arange(0, W)
    q = tl.arange(0, R)
    lloc = tl.zeros([R, R], dtype=vals.dtype.element_ty)
    if niter > 1:
        for off in range(0, nlen, W):
            idx = start[:, None] + off + w[None, :]
            m = idx < end[:, None]
            c = tl.load(cols + idx, mask=m, other=0)
            v = tl.load(vals + idx, mask=m, other=0.0)
            hit = (m & (c >= base))[:, :, None] & ((c - base)[:, :, None] == q[None, None, :])
            lloc += tl.sum(tl.where(hit, v[:, :, None], 0.0), axis=1)
    return lloc


@triton.jit
def _in_tile_sweeps(rhs, d, lloc, niter):
    """Jacobi sweeps x = (rhs - L_tile x) / d, exact after ``niter`` = in-tile depth + 1 sweeps."""
    xt = rhs / d[:, None]
    for _ in range(1, niter):
        # the where() keeps Triton from rewriting sum(a[:, :, None] * b[None]) into a tf32 tl.dot
        prod = tl.where(lloc[:, :, None] != 0.0, lloc[:, :, None] * xt[None, :, :], 0.0)
        xt = (rhs - tl.sum(prod, axis=1)) / d[:, None]
    return xt


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
    xt = _in_tile_sweeps(rhs, d, lloc, niter)
    tl.store(xp_ptr + pos[:, None] * nrhs + kk[None, :], xt, mask=rk)
    tl.store(x_ptr + row[:, None] * stride_x + kk[None, :], xt, mask=rk)
    tl.debug_barrier()  # every thread's x stores precede the release below
    if TILE_FLAGS:
        tl.atomic_xchg(done_ptr + t, epoch, sem="release", scope="gpu")
    else:
        tl.atomic_xchg(done_ptr + pos, epoch, mask=rmask, sem="release", scope="gpu")


@triton.jit(do_not_specialize=_PER_LAUNCH)
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
def _prefetch_tile(
    rowptr, cols, vals, diag, perm, lev, b_ptr, base, pos, rmask, last, nrhs, stride_b,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr,
):  # fmt: skip
    """Every load of a tile (rows ``pos`` where ``rmask``; ``last`` its last row) that needs no x,
    issued before the wait: row spans, in-tile depth, perm, b, diag, the first chunk's cols/vals
    and the in-tile block ``lloc``."""
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, W)
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
    lloc = _in_tile_block(cols, vals, start, end, base, nlen, niter, R, W)
    return start, end, kk, kmask, w, niter, row, rk, bt, d, nlen, c0, v0, lloc


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
    pos = base + tl.arange(0, R)
    rmask = pos < n
    start, end, kk, kmask, w, niter, row, rk, bt, d, nlen, c0, v0, lloc = _prefetch_tile(
        rowptr, cols, vals, diag, perm, lev, b_ptr, base, pos, rmask, tl.minimum(base + R - 1, n - 1), nrhs, stride_b, R, W, KP
    )
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
            xg = _value_gather(xp_ptr, c[:, :, None] * nrhs + kk[None, None, :], emask, SENTINEL, BACKOFF_NS, HW_FENCE)
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
    xt = _in_tile_sweeps(rhs, d, lloc, niter)
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


@triton.jit(do_not_specialize=_PER_LAUNCH)
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
    start, end, kk, kmask, w, niter, row, rk, bt, d, nlen, c0, v0, lloc = _prefetch_tile(
        rowptr, cols, vals, diag, perm, lev, b_ptr, base, pos, rmask, base + cnt - 1, nrhs, stride_b, R, W, KP
    )
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
    xt = _in_tile_sweeps(rhs, d, lloc, niter)
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


@triton.jit(do_not_specialize=_PER_LAUNCH[:1])
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
