"""Aker's horizontal fusion with per-kernel resources: a best-effort (BE) kernel's blocks run by a worker
partition of kfuse's warp-specialised ping-pong GEMM (``kfuse.kernels.gemm_ws``), beside the GEMM's own
warps, in one launch.

Why: session 55 found that a Triton fused kernel (``kfuse.colocate.fuser``) is one program whose shared
memory and registers are the larger branch's, and the compiled plan's tuned GEMM tiles take one block an SM
(160-213 KB): a BE block can share the SM only if the LC tile gives up half its pipeline (its GEMMs 1.5x
slower). Aker's CUDA C++ form gives each kernel its own thread blocks' resources inside one launch. A Gluon
``warp_specialize`` partition is that form here: the BE's warps get their own registers (``setmaxnreg``;
the GEMM's consumers keep the rest of the 64 K), and the GEMM keeps its tile, ring depth and schedule. Only
the BE's own shared memory (a histogram's 1 KB scratch; the TMA-fed stencil7's ring of windows, ``feed="tma"``) is
added to the LC's.

The partition runs BE blocks ``start + p, start + p + P, ...`` below ``end`` in program ``p`` of the GEMM's
``P`` programs (the PTB walk of ``kfuse.colocate.ptb``), so any slice of the BE kernel rides along with one
GEMM launch; the launch ends when both the GEMM's tiles and the slice are done, which is what the selector's
fused-time predictor prices. Each BE kernel here is its ``kfuse.colocate.workloads`` block function written
again in Gluon (explicit layouts), checked against the same reference.

Gluon does not run in ``TRITON_INTERPRET``: the CPU tests compile the fused kernels for sm_90 offline and
check their SASS (wgmma, the BE's atomics or MUFU ops, the register split, no spills); the numbers come from
``benchmarks/experiments/ws_colocate_probe.py`` on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kfuse.colocate.workloads import Workload
from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue
from kfuse.kernels.gemm_ws import LOADER_REGS, SMEM_LIMIT, WorkerPartition, WsConfig

# the BE warps' registers a thread: enough for each function below without spills on sm_90 (checked offline
# by tests/colocate/test_ws_partition.py); the ping-pong GEMM's consumers get the rest (WorkerPartition.consumer_regs)
BE_REGS = {"histogram": 56, "mriq": 80, "stencil7": 56, "cutcp": 80}
# stencil7 with U blocks an iteration (``unroll``) holds U x its loads: registers a thread by U (checked offline as above)
STENCIL7_UNROLL_REGS = {1: 56, 2: 96, 4: 168}
# how a BE partition reads its input: "ldg", each thread's loads into its registers; "tma" (stencil7), the TMA engine
# copies each block's windows into a ring of shared memory (``_STENCIL7_TMA``), so the bytes in flight are not bounded
# by the partition's registers (session 58: stencil7 in 4-8 warps ran at 1/3-1/2 of its rate alone, y ~ 1 + 0.9-3x)
FEEDS = ("ldg", "tma")
# the TMA form with U blocks an iteration: no window load is held in a register, only the x neighbours (checked offline, no spills)
STENCIL7_TMA_REGS = {1: 56, 2: 80}
TMA_SLOTS = (4, 3, 2)  # the ring depths (blocks in flight a program) a host tries, the deepest first that fits its shared memory

_HISTOGRAM = """

@gluon.jit
def _be_histogram(data, hist, n, start, end, NUM_PROGRAMS: gl.constexpr, BLOCK: gl.constexpr, NBINS: gl.constexpr,
                  WARPS: gl.constexpr):
    # kfuse.colocate.workloads.histogram's block: BLOCK 8-bit values counted in registers, one atomic a bin
    values: gl.constexpr = gl.BlockedLayout([BLOCK // (32 * WARPS)], [32], [WARPS], [0])
    bins: gl.constexpr = gl.BlockedLayout([max(NBINS // (32 * WARPS), 1)], [32], [WARPS], [0])
    for bid in range(start + gl.program_id(0), end, NUM_PROGRAMS):
        offs = bid * BLOCK + gl.arange(0, BLOCK, values)
        m = offs < n
        v = gl.load(data + offs, mask=m, other=0).to(gl.int32)
        h = gl.histogram(v, NBINS, mask=m, layout=bins)
        gl.atomic_add(hist + gl.arange(0, NBINS, bins), h, sem="relaxed")
"""

_MRIQ = """

@gluon.jit
def _sin_approx(x):
    return gl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _cos_approx(x):
    return gl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _be_mriq(kx, ky, kz, phimag, x, y, z, qr, qi, num_k, num_x, start, end, NUM_PROGRAMS: gl.constexpr,
             BLOCK: gl.constexpr, KC: gl.constexpr, WARPS: gl.constexpr, WR: gl.constexpr):
    # kfuse.colocate.workloads.mriq's block: BLOCK voxels against the k-space samples in chunks of KC, sin and
    # cos on the MUFU (the arguments stay within [-4.8, 4.8]: the workload draws k and x in [-0.5, 0.5])
    # WR warps down the voxels (8 rows a warp), the rest across the samples
    tile: gl.constexpr = gl.BlockedLayout([1, KC // (4 * (WARPS // WR))], [8, 4], [WR, WARPS // WR], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, tile)
    cols: gl.constexpr = gl.SliceLayout(0, tile)
    for bid in range(start + gl.program_id(0), end, NUM_PROGRAMS):
        offs = bid * BLOCK + gl.arange(0, BLOCK, rows)
        m = offs < num_x
        px = gl.load(x + offs, mask=m, other=0.0)
        py = gl.load(y + offs, mask=m, other=0.0)
        pz = gl.load(z + offs, mask=m, other=0.0)
        acc_r = gl.zeros([BLOCK], gl.float32, rows)
        acc_i = gl.zeros([BLOCK], gl.float32, rows)
        for k0 in range(0, num_k, KC):
            ko = k0 + gl.arange(0, KC, cols)
            km = ko < num_k
            ax = gl.load(kx + ko, mask=km, other=0.0)
            ay = gl.load(ky + ko, mask=km, other=0.0)
            az = gl.load(kz + ko, mask=km, other=0.0)
            ph = gl.load(phimag + ko, mask=km, other=0.0)
            arg = 6.283185307179586 * (ax[None, :] * px[:, None] + ay[None, :] * py[:, None] + az[None, :] * pz[:, None])
            acc_r += gl.sum(ph[None, :] * _cos_approx(arg), axis=1)
            acc_i += gl.sum(ph[None, :] * _sin_approx(arg), axis=1)
        gl.store(qr + offs, acc_r, mask=m)
        gl.store(qi + offs, acc_i, mask=m)
"""

_STENCIL7 = """

@gluon.jit
def _be_stencil7(src, dst, nx, ny, nz, c0, c1, start, end, NUM_PROGRAMS: gl.constexpr, BY: gl.constexpr, BX: gl.constexpr,
                 WARPS: gl.constexpr, WR: gl.constexpr, U: gl.constexpr):
    # kfuse.colocate.workloads.stencil7's block: a BY x BX tile of one z plane, 7-point stencil, boundary copied;
    # WR warps down the rows (2 rows a warp), the rest across. U of the program's blocks an iteration (its blocks
    # first, first + P, ..., as the PTB walk), all their loads issued before any is used: U x the bytes in flight
    tile: gl.constexpr = gl.BlockedLayout([U, 1, BX // (16 * (WARPS // WR))], [1, 2, 16], [1, WR, WARPS // WR], [2, 1, 0])
    per_block: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, tile))
    per_row: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, tile))
    per_col: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, tile))
    tiles_x = gl.cdiv(nx, BX)
    tiles_y = gl.cdiv(ny, BY)
    plane = nx * ny
    for first in range(start + gl.program_id(0), end, NUM_PROGRAMS * U):
        bid = first + gl.arange(0, U, per_block) * NUM_PROGRAMS
        live = (bid < end)[:, None, None]
        tx = bid % tiles_x
        t = bid // tiles_x
        ty = t % tiles_y
        z = (t // tiles_y)[:, None, None]
        y = (ty * BY)[:, None, None] + gl.arange(0, BY, per_row)[None, :, None]
        x = (tx * BX)[:, None, None] + gl.arange(0, BX, per_col)[None, None, :]
        inb = live & (y < ny) & (x < nx)
        idx = z * plane + y * nx + x
        c = gl.load(src + idx, mask=inb, other=0.0)
        inner = inb & (x > 0) & (x < nx - 1) & (y > 0) & (y < ny - 1) & (z > 0) & (z < nz - 1)
        s = gl.load(src + idx - 1, mask=inner, other=0.0) + gl.load(src + idx + 1, mask=inner, other=0.0)
        s += gl.load(src + idx - nx, mask=inner, other=0.0) + gl.load(src + idx + nx, mask=inner, other=0.0)
        s += gl.load(src + idx - plane, mask=inner, other=0.0) + gl.load(src + idx + plane, mask=inner, other=0.0)
        gl.store(dst + idx, gl.where(inner, c0 * c + c1 * s, c), mask=inb)
"""

_STENCIL7_TMA = """

@gluon.jit
def _be_stencil7_tma(src_desc, src, dst, nx, ny, nz, c0, c1, start, end, windows, ready, NUM_PROGRAMS: gl.constexpr,
                     BY: gl.constexpr, BX: gl.constexpr, WARPS: gl.constexpr, WR: gl.constexpr, SLOTS: gl.constexpr,
                     U: gl.constexpr):
    # stencil7's block fed by TMA: five windows (the point and its y and z neighbours, each a [1, BY, BX] box of src at
    # (z, y, x) + an offset; coordinates outside src read 0, which only boundary points, copied, would use) land in a ring
    # of SLOTS slots of shared memory, SLOTS groups ahead. A group is U of the program's blocks (first, first + P, ..., as
    # the PTB walk and the LDG form's U), computed in one iteration: U x the points a thread, once the per-iteration work
    # (the slot's wait and phase, the barriers, the coordinates). Window k of a group's block u is windows[5 slot + k][u],
    # all counted by the slot's mbarrier in ready. Triton's barrier analysis puts a barrier of the partition's warps after
    # each copy (all signal one mbarrier allocation): an allocation and an mbarrier a window kind halve those barriers but
    # add four waits a block, and made the form 13-20% slower (session 61, H100). One thread issues the copies, so the
    # bytes in flight do not take the warps' registers (the LDG form holds each load in one). A box's innermost coordinate
    # must sit on 16 bytes (an H100 run faulted with an illegal instruction at the x - 1 box), and a shared-memory view may
    # not start inside its own size (Triton's subslice rule), so the x neighbours come by LDG from L2, where the earlier
    # groups' windows brought them: the next group's, issued before this group's wait (session 60)
    # The coordinates are stepped (a step of NUM_PROGRAMS or U x NUM_PROGRAMS blocks, split once into x, y and z tiles),
    # not divided: three integer divisions a block made the form issue-bound (Nsight Compute, session 60)
    tile: gl.constexpr = gl.BlockedLayout([U, 1, BX // (16 * (WARPS // WR))], [1, 2, 16], [1, WR, WARPS // WR], [2, 1, 0])
    per_block: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, tile))
    GROUP: gl.constexpr = NUM_PROGRAMS * U  # the blocks a program steps over an iteration
    tiles_x = gl.cdiv(nx, BX)
    tiles_y = gl.cdiv(ny, BY)
    bx, by, bz = _stencil7_tile(NUM_PROGRAMS, tiles_x, tiles_y)  # a block's step, then a group's
    gx, gy, gz = _stencil7_tile(GROUP, tiles_x, tiles_y)
    first = start + gl.program_id(0)
    for p in gl.static_range(SLOTS):
        if first + p * GROUP < end:
            fx, fy, fz = _stencil7_tile(first + p * GROUP, tiles_x, tiles_y)
            _stencil7_fetch(src_desc, windows, ready, p, fx, fy, fz, bx, by, bz, tiles_x, tiles_y, BY, BX, U)
    lane = gl.arange(0, U, per_block) * NUM_PROGRAMS  # a group's blocks from its first
    tx, ty, tz = _stencil7_tile(first + lane, tiles_x, tiles_y)  # the next group's tiles (this group's on entry)
    rx, ry, rz = _stencil7_tile(first + SLOTS * GROUP, tiles_x, tiles_y)  # the next refill's first block's
    idx, inb, inner = _stencil7_points(tx, ty, tz, first + lane < end, nx, ny, nz, BY, BX, tile)
    sides = gl.load(src + idx - 1, mask=inner, other=0.0) + gl.load(src + idx + 1, mask=inner, other=0.0)
    i = 0
    for g in range(first, end, GROUP):
        # the next group's x neighbours in flight while this group waits for its slot and computes
        tx, ty, tz = _stencil7_step(tx, ty, tz, gx, gy, gz, tiles_x, tiles_y)
        n_idx, n_inb, n_inner = _stencil7_points(tx, ty, tz, g + GROUP + lane < end, nx, ny, nz, BY, BX, tile)
        n_sides = gl.load(src + n_idx - 1, mask=n_inner, other=0.0) + gl.load(src + n_idx + 1, mask=n_inner, other=0.0)
        s = i % SLOTS
        mbarrier.wait(ready.index(s), (i // SLOTS) & 1)
        c = windows.index(5 * s).load(tile)
        acc = sides + windows.index(5 * s + 1).load(tile) + windows.index(5 * s + 2).load(tile)
        acc += windows.index(5 * s + 3).load(tile) + windows.index(5 * s + 4).load(tile)
        gl.thread_barrier()  # every warp has read slot s (a barrier of this partition's warps): refill it SLOTS groups ahead
        if g + SLOTS * GROUP < end:
            _stencil7_fetch(src_desc, windows, ready, s, rx, ry, rz, bx, by, bz, tiles_x, tiles_y, BY, BX, U)
        rx, ry, rz = _stencil7_step(rx, ry, rz, gx, gy, gz, tiles_x, tiles_y)
        gl.store(dst + idx, gl.where(inner, c0 * c + c1 * acc, c), mask=inb)
        idx, inb, inner, sides = n_idx, n_inb, n_inner, n_sides
        i += 1


@gluon.jit
def _stencil7_tile(bid, tiles_x, tiles_y):
    # block bid's tile (or a step of bid blocks split into tiles): x and y tile indices and z plane (the PTB walk's
    # order, x fastest)
    t = bid // tiles_x
    return bid % tiles_x, t % tiles_y, t // tiles_y


@gluon.jit
def _stencil7_step(tx, ty, tz, step_x, step_y, step_z, tiles_x, tiles_y):
    # the tile a step on (the step split by _stencil7_tile): add its x, y and z parts with their carries (each part below
    # its radix, so one carry at most)
    tx += step_x
    cx = (tx >= tiles_x).to(gl.int32)
    ty += step_y + cx
    cy = (ty >= tiles_y).to(gl.int32)
    return tx - cx * tiles_x, ty - cy * tiles_y, tz + step_z + cy


@gluon.jit
def _stencil7_points(tx, ty, tz, live, nx, ny, nz, BY: gl.constexpr, BX: gl.constexpr, tile: gl.constexpr):
    # the points of a group's blocks at tiles (tx, ty, tz) (vectors over its U blocks) in layout tile: their offsets in src,
    # which are in the grid, which are inside (none of a block that is not live, at or past the range's end)
    per_row: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, tile))
    per_col: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, tile))
    y = (ty * BY)[:, None, None] + gl.arange(0, BY, per_row)[None, :, None]
    x = (tx * BX)[:, None, None] + gl.arange(0, BX, per_col)[None, None, :]
    z = tz[:, None, None]
    inb = (y < ny) & (x < nx) & live[:, None, None]
    inner = inb & (x > 0) & (x < nx - 1) & (y > 0) & (y < ny - 1) & (z > 0) & (z < nz - 1)
    return z * (nx * ny) + y * nx + x, inb, inner


@gluon.jit
def _stencil7_fetch(src_desc, windows, ready, s, tx, ty, tz, bx, by, bz, tiles_x, tiles_y, BY: gl.constexpr, BX: gl.constexpr,
                    U: gl.constexpr):
    # the five windows of each of the U blocks of a group (the first at tile (tx, ty, tz), the next a block's step
    # (bx, by, bz) on) into slot s. All U blocks are copied, those past the range's end too (their tiles may lie past the
    # volume: TMA reads zeros; they are never stored), so the slot's mbarrier expects a fixed count of bytes (a box's
    # bytes count in full, zero fill too)
    bar = ready.index(s)
    mbarrier.expect(bar, 5 * U * BY * BX * 4)
    for u in gl.static_range(U):
        y = ty * BY
        x = tx * BX
        tma.async_copy_global_to_shared(src_desc, [tz, y, x], bar, windows.index(5 * s).slice(u, 1))
        tma.async_copy_global_to_shared(src_desc, [tz, y - 1, x], bar, windows.index(5 * s + 1).slice(u, 1))
        tma.async_copy_global_to_shared(src_desc, [tz, y + 1, x], bar, windows.index(5 * s + 2).slice(u, 1))
        tma.async_copy_global_to_shared(src_desc, [tz - 1, y, x], bar, windows.index(5 * s + 3).slice(u, 1))
        tma.async_copy_global_to_shared(src_desc, [tz + 1, y, x], bar, windows.index(5 * s + 4).slice(u, 1))
        if u + 1 < U:
            tx, ty, tz = _stencil7_step(tx, ty, tz, bx, by, bz, tiles_x, tiles_y)
"""

# the TMA form's ring and its mbarriers, in the kernel's body (``WorkerPartition.setup``), initialised with the GEMM's before
# the partitions start (no fence and barrier of the partition's own before its first copy)
TMA_SETUP = """    be_windows = gl.allocate_shared_memory(gl.float32, [BE_SLOTS * 5, BE_U, BE_BY, BE_BX], be_src_desc.layout)
    be_ready = gl.allocate_shared_memory(gl.int64, [BE_SLOTS, 1], mbarrier.MBarrierLayout())
    for q in gl.static_range(BE_SLOTS):
        mbarrier.init(be_ready.index(q), count=1)
"""

_CUTCP = """

@gluon.jit
def _be_cutcp(atoms, out, n_atoms, gx, gy, gz, h, cutoff2, start, end, NUM_PROGRAMS: gl.constexpr, BLOCK: gl.constexpr,
              AC: gl.constexpr, WARPS: gl.constexpr, WR: gl.constexpr):
    # kfuse.colocate.workloads.cutcp's block: BLOCK lattice points against the atoms in chunks of AC, cut off
    tile: gl.constexpr = gl.BlockedLayout([1, AC // (4 * (WARPS // WR))], [8, 4], [WR, WARPS // WR], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, tile)
    cols: gl.constexpr = gl.SliceLayout(0, tile)
    n = gx * gy * gz
    inv_c2 = 1.0 / cutoff2
    for bid in range(start + gl.program_id(0), end, NUM_PROGRAMS):
        offs = bid * BLOCK + gl.arange(0, BLOCK, rows)
        m = offs < n
        px = (offs % gx).to(gl.float32) * h
        py = ((offs // gx) % gy).to(gl.float32) * h
        pz = (offs // (gx * gy)).to(gl.float32) * h
        acc = gl.zeros([BLOCK], gl.float32, rows)
        for a0 in range(0, n_atoms, AC):
            ao = a0 + gl.arange(0, AC, cols)
            am = ao < n_atoms
            ax = gl.load(atoms + 4 * ao, mask=am, other=1e6)
            ay = gl.load(atoms + 4 * ao + 1, mask=am, other=1e6)
            az = gl.load(atoms + 4 * ao + 2, mask=am, other=1e6)
            aq = gl.load(atoms + 4 * ao + 3, mask=am, other=0.0)
            dx = px[:, None] - ax[None, :]
            dy = py[:, None] - ay[None, :]
            dz = pz[:, None] - az[None, :]
            r2 = dx * dx + dy * dy + dz * dz
            inside = (r2 < cutoff2) & (r2 > 0.0)
            s = 1.0 - r2 * inv_c2
            e = aq[None, :] * s * s / gl.sqrt(gl.where(inside, r2, 1.0))
            acc += gl.sum(gl.where(inside, e, 0.0), axis=1)
        gl.store(out + offs, acc, mask=m)
"""

# per BE kernel: its Gluon source, the kernel parameters (runtime ones in the workload's BlockKernel argument
# order, then the block range), their Triton types for an offline compile, and the block function's constexprs
_KERNELS: dict[str, dict[str, Any]] = {
    "histogram": {
        "source": _HISTOGRAM,
        "fn": "_be_histogram",
        "args": {"be_data": "*u8", "be_hist": "*i32", "be_n": "i32"},
        "consts": ("BLOCK", "NBINS"),
    },
    "mriq": {
        "source": _MRIQ,
        "fn": "_be_mriq",
        "args": {
            **{f"be_{v}": "*fp32" for v in ("kx", "ky", "kz", "phimag", "x", "y", "z", "qr", "qi")},
            "be_num_k": "i32",
            "be_num_x": "i32",
        },
        "consts": ("BLOCK", "KC"),
    },
    "stencil7": {
        "source": _STENCIL7,
        "fn": "_be_stencil7",
        "args": {"be_src": "*fp32", "be_dst": "*fp32", "be_nx": "i32", "be_ny": "i32", "be_nz": "i32", "be_c0": "fp32", "be_c1": "fp32"},
        "consts": ("BY", "BX"),
    },
    "cutcp": {
        "source": _CUTCP,
        "fn": "_be_cutcp",
        "args": {
            "be_atoms": "*fp32",
            "be_out": "*fp32",
            "be_n_atoms": "i32",
            "be_gx": "i32",
            "be_gy": "i32",
            "be_gz": "i32",
            "be_h": "fp32",
            "be_cutoff2": "fp32",
        },  # fmt: skip
        "consts": ("BLOCK", "AC"),
    },
}
NAMES = tuple(_KERNELS)
# stencil7 fed by TMA: src arrives also as a tensor descriptor of [1, BY, BX] boxes (``tma_source``), the rest as the LDG form
_STENCIL7_TMA_SPEC: dict[str, Any] = {
    "source": _STENCIL7_TMA,
    "fn": "_be_stencil7_tma",
    "args": {"be_src_desc": "", **_KERNELS["stencil7"]["args"]},
    "consts": ("BY", "BX"),
}


def _window_layout() -> Any:
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)  # plain rows: windows read at any offset


def tma_source(src: torch.Tensor, consts: dict[str, Any]) -> Any:
    """stencil7's ``src`` (fp32 [nz, ny, nx]) as the TMA descriptor the ``tma`` form reads its [1, BY, BX] windows through."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor.from_tensor(src, [1, int(consts["BY"]), int(consts["BX"])], _window_layout())


def tma_unfit(src: torch.Tensor) -> str | None:
    """Why stencil7's ``src`` cannot be read by TMA (a contiguous fp32 3-D tensor, 16-byte aligned, rows a multiple of 16
    bytes: the copy engine's rules for a global tensor), or None."""
    if src.dtype != torch.float32 or src.dim() != 3 or not src.is_contiguous():
        return f"TMA reads a contiguous fp32 [nz, ny, nx] tensor, not {tuple(src.shape)} {src.dtype}"
    if src.data_ptr() % 16 or (src.shape[2] * 4) % 16:
        return f"TMA needs a 16-byte aligned tensor with rows a multiple of 16 bytes (nx = {src.shape[2]})"
    return None


def tma_slot_bytes(consts: dict[str, Any], unroll: int = 1) -> int:
    """Shared memory of one ring slot of the ``tma`` form: a group's (``unroll`` blocks') five fp32 windows and its mbarrier."""
    return 5 * unroll * int(consts["BY"]) * int(consts["BX"]) * 4 + 8


def tma_slots(cfg: WsConfig, consts: dict[str, Any], unroll: int = 1) -> int:
    """The deepest ring of ``TMA_SLOTS`` that fits beside host tile ``cfg``'s shared memory, or 0 (none fits)."""
    return next((s for s in TMA_SLOTS if cfg.smem_bytes() + s * tma_slot_bytes(consts, unroll) <= SMEM_LIMIT), 0)


def partition(
    name: str,
    consts: dict[str, Any],
    warps: int = 4,
    regs: int | None = None,
    loader_regs: int = LOADER_REGS,
    unroll: int = 1,
    feed: str = "ldg",
    slots: int = TMA_SLOTS[-1],
) -> WorkerPartition:
    """The worker partition running BE kernel ``name``'s blocks with its block function's constexprs ``consts``
    (``BLOCK``, and ``NBINS`` / ``KC`` / ``BY``, ``BX`` / ``AC``) on ``warps`` warps of ``regs`` registers a thread,
    the GEMM's loader warp on ``loader_regs``; stencil7 runs ``unroll`` of its blocks an iteration (1, 2 or 4), or with
    ``feed="tma"`` reads them through a ring of ``slots`` blocks of shared memory filled by TMA."""
    if name not in _KERNELS:
        raise ValueError(f"no worker-partition form of BE kernel {name!r}; there is one of: {', '.join(NAMES)}")
    if unroll != 1 and name != "stencil7":
        raise ValueError(f"{name}: only stencil7's partition runs several blocks an iteration (unroll {unroll})")
    if unroll not in STENCIL7_UNROLL_REGS:
        raise ValueError(f"stencil7: unroll is one of {sorted(STENCIL7_UNROLL_REGS)}, not {unroll}")
    if feed not in FEEDS:
        raise ValueError(f"feed is one of {FEEDS}, not {feed!r}")
    tma_fed = feed == "tma"
    if tma_fed and name != "stencil7":
        raise ValueError(f"{name}: only stencil7 has a TMA-fed partition")
    if tma_fed and unroll not in STENCIL7_TMA_REGS:
        raise ValueError(f"stencil7: the TMA-fed partition runs one of {sorted(STENCIL7_TMA_REGS)} blocks an iteration, not {unroll}")
    if tma_fed and not 1 <= slots <= 4:
        raise ValueError(f"stencil7: a TMA ring of 1 to 4 slots, not {slots}")
    spec = _STENCIL7_TMA_SPEC if tma_fed else _KERNELS[name]
    missing = [c for c in spec["consts"] if c not in consts]
    if missing:
        raise ValueError(f"{name}: the block function's constexprs {missing} are missing")
    if warps not in (1, 2, 4, 8):
        raise ValueError(f"a worker partition has 1, 2, 4 or 8 warps, not {warps}")
    if regs is None:
        regs = STENCIL7_TMA_REGS[unroll] if tma_fed else STENCIL7_UNROLL_REGS[unroll] if name == "stencil7" else BE_REGS[name]
    for r in (regs, loader_regs):
        if r % 8 or not 24 <= r <= 256:
            raise ValueError(f"setmaxnreg takes a multiple of 8 in [24, 256] registers a thread, not {r}")
    _check_layout(name, consts, warps)
    rows = _warp_rows(name, consts, warps)  # 2-D tiles: warps down the rows (the rest across), or None (1-D)
    const_names = [f"BE_{c}" for c in spec["consts"]] + ["BE_WARPS"] + ([] if rows is None else ["BE_WR"])
    const_names += ["BE_SLOTS", "BE_U"] if tma_fed else ["BE_U"] if name == "stencil7" else []
    arg_types = dict(spec["args"])
    if tma_fed:  # the descriptor's type names its box and layout, not the tensor's shape
        from triton.runtime.jit import mangle_type

        arg_types["be_src_desc"] = mangle_type(tma_source(torch.empty(1, int(consts["BY"]), int(consts["BX"])), consts))
    params = ", ".join([*spec["args"], "be_start", "be_end", *(f"{c}: gl.constexpr" for c in const_names)])
    ring = ["be_windows", "be_ready"] if tma_fed else []  # allocated by the kernel (``TMA_SETUP``), passed in
    call_args = ", ".join([*spec["args"], "be_start", "be_end", *ring, "NUM_PROGRAMS", *const_names])
    constexprs = {f"BE_{c}": consts[c] for c in spec["consts"]} | {"BE_WARPS": warps} | ({} if rows is None else {"BE_WR": rows})
    constexprs |= {"BE_U": unroll} if name == "stencil7" else {}
    constexprs |= {"BE_SLOTS": slots} if tma_fed else {}
    key = f"{name}_w{warps}_r{regs}" + ("" if loader_regs == LOADER_REGS else f"_l{loader_regs}") + (f"_u{unroll}" if unroll > 1 else "")
    key += f"_tma{slots}" if tma_fed else ""
    return WorkerPartition(
        key, spec["source"], params, f"({spec['fn']}, ({call_args}))", warps, regs,
        {**arg_types, "be_start": "i32", "be_end": "i32"}, constexprs, loader_regs, ("be_start", "be_end"), TMA_SETUP if tma_fed else "",
    )  # fmt: skip


_TMA_ALONE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
{source}

# the parameters named as the fused kernel's (``TMA_SETUP`` reads be_src_desc, BE_SLOTS, BE_U, BE_BY, BE_BX)
@gluon.jit
def stencil7_tma_alone(be_src_desc, src, dst, nx, ny, nz, c0, c1, start, end, NUM_PROGRAMS: gl.constexpr, BE_BY: gl.constexpr,
                       BE_BX: gl.constexpr, WARPS: gl.constexpr, WR: gl.constexpr, BE_SLOTS: gl.constexpr, BE_U: gl.constexpr):
{setup}    _be_stencil7_tma(be_src_desc, src, dst, nx, ny, nz, c0, c1, start, end, be_windows, be_ready, NUM_PROGRAMS, BE_BY, BE_BX,
                     WARPS, WR, BE_SLOTS, BE_U)
"""


def launch_tma_alone(work: Workload, start: int, end: int, warps: int = 8, slots: int = TMA_SLOTS[0], num_programs: int = 132,
                     unroll: int = 1) -> None:  # fmt: skip
    """stencil7's TMA form as a kernel of its own (no GEMM beside it): ``num_programs`` programs of ``warps`` warps run
    blocks ``[start, end)`` through the partition's code, ``unroll`` blocks an iteration, a ring of ``slots``. The
    partition's rate alone, and a check of the TMA form apart from the warp-specialised kernel."""
    from kfuse.kernels.codegen import generated

    part = for_workload(work, warps, unroll=unroll, feed="tma", slots=slots)  # checks the layout and the ring
    mod = generated("ws_tma_alone", "stencil7", lambda: _TMA_ALONE.format(source=_STENCIL7_TMA, setup=TMA_SETUP))
    args = partition_args(work, start, end, feed="tma")
    c = part.constexprs
    mod.stencil7_tma_alone[(num_programs,)](*args.values(), NUM_PROGRAMS=num_programs, BE_BY=c["BE_BY"], BE_BX=c["BE_BX"],
                                            WARPS=warps, WR=c["BE_WR"], BE_SLOTS=slots, BE_U=unroll, num_warps=warps)  # fmt: skip


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_layout(name: str, consts: dict[str, Any], warps: int) -> None:
    """The Gluon functions' layouts cover their tiles exactly on ``warps`` warps."""
    if name == "histogram":
        block, lanes = int(consts["BLOCK"]), 32 * warps
        if block % lanes or not _pow2(block):
            raise ValueError(f"histogram: BLOCK {block} must be a power of two and a multiple of {lanes} (32 x {warps} warps)")
    elif name in ("mriq", "cutcp"):  # 8 rows and 4 columns a warp; BLOCK / 8 warps down, the rest across the chunk
        block, chunk = int(consts["BLOCK"]), int(consts["KC"] if name == "mriq" else consts["AC"])
        rows = _warp_rows(name, consts, warps)
        if block < 8 or not _pow2(block) or not _pow2(chunk) or chunk < 4 * (warps // rows):
            raise ValueError(f"{name}: BLOCK must be a power of two of at least 8 and its chunk a power of two of at least 4 x "
                             f"{warps // rows} (the warps across) for the layout on {warps} warps ({block}, {chunk})")  # fmt: skip
    elif name == "stencil7":  # 2 rows and 16 columns a warp
        by, bx = int(consts["BY"]), int(consts["BX"])
        rows = _warp_rows(name, consts, warps)
        if by % 2 or by % (2 * rows) or warps % rows or not _pow2(bx) or bx < 16 * (warps // rows):
            raise ValueError(f"stencil7: BY must be a multiple of 2 x {rows} and BX a power of two of at least 16 x "
                             f"{warps // rows} for the layout on {warps} warps ({by}, {bx})")  # fmt: skip


def _warp_rows(name: str, consts: dict[str, Any], warps: int) -> int | None:
    """How many of ``warps`` a 2-D BE tile puts down its rows (the others go across): as many as its rows take."""
    if name in ("mriq", "cutcp"):
        return max(1, min(warps, int(consts["BLOCK"]) // 8))
    if name == "stencil7":
        return max(1, min(warps, int(consts["BY"]) // 2))
    return None


def for_workload(
    work: Workload,
    warps: int = 4,
    regs: int | None = None,
    loader_regs: int = LOADER_REGS,
    unroll: int = 1,
    feed: str = "ldg",
    slots: int = TMA_SLOTS[-1],
) -> WorkerPartition:
    """``partition`` for a ``kfuse.colocate.workloads`` BE kernel, with its block constexprs."""
    return partition(work.name, work.kernel.consts, warps, regs, loader_regs, unroll, feed, slots)


def partition_args(work: Workload, start: int, end: int, feed: str = "ldg") -> dict[str, Any]:
    """The fused kernel's BE arguments: ``work``'s block-function arguments and the block range ``[start, end)``; with
    ``feed="tma"`` stencil7's ``src`` goes as its TMA descriptor (``tma_source``)."""
    names = list(_KERNELS[work.name]["args"])
    if len(names) != len(work.kernel.args):
        raise ValueError(f"{work.name}: {len(work.kernel.args)} block-function arguments, the partition takes {len(names)}")
    if not 0 <= start <= end <= work.kernel.n_blocks:
        raise ValueError(f"{work.name}: block range [{start}, {end}) is outside [0, {work.kernel.n_blocks})")
    args = dict(zip(names, work.kernel.args, strict=True)) | {"be_start": start, "be_end": end}
    if feed == "tma":
        src = args.get("be_src")
        why = "only stencil7 is TMA-fed" if src is None else tma_unfit(src)
        if why is not None:
            raise ValueError(f"{work.name}: {why}")
        args = {"be_src_desc": tma_source(src, work.kernel.consts), **args}
    return args


def launch_fused(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, cfg: WsConfig,
                 work: Workload, start: int, end: int, num_programs: int, warps: int = 4, regs: int | None = None,
                 fast_gelu: bool = True, loader_regs: int = LOADER_REGS, unroll: int = 1, feed: str = "ldg",
                 slots: int = TMA_SLOTS[-1]) -> None:  # fmt: skip
    """One launch: ``c = epi(a @ b, extras)`` by the ping-pong GEMM (``cfg``, ``num_programs`` programs) and BE
    blocks ``[start, end)`` of ``work`` by a worker partition of ``warps`` warps (``unroll`` blocks an iteration, or
    ``feed="tma"`` through a ring of ``slots``). Operands as ``gemm_ws.launch`` takes them (a batch of one)."""
    part = for_workload(work, warps, regs, loader_regs, unroll, feed, slots)
    args = partition_args(work, start, end, feed)
    gemm_ws.launch(a, b, c, extras, epi, cfg, num_programs, fast_gelu=fast_gelu, partition=part, partition_args=args)


# the ping-pong tiles a plan GEMM may host a BE partition on, with the loader's registers. Session 56's probe (H100,
# BERT-base's four GEMMs): the 64 x 128 tile at six stages was the fastest host on every row (0-13% over the best solo
# kernel); the 128 x 192 tile (the tuned one for 1024 x 3072 x 768) spills at the consumers' 208-216 registers beside a
# partition and never won (``PP192_HOST``, kept for the probe), so a host times only these two
HOST_TILES: tuple[tuple[str, WsConfig, int], ...] = (
    ("pp64x128 s6", WsConfig(block_m=64, block_n=128, block_k=64, stages=6), LOADER_REGS),
    ("pp128 s4", WsConfig(block_m=128, block_n=128, block_k=64, stages=4), LOADER_REGS),
)
PP192_HOST = ("pp192 s4 sc", WsConfig(block_m=128, block_n=192, block_k=64, stages=4, shared_c=True), 24)
# the 64 x 128 tile with K steps of 128 at three stages: the shared memory of the s6 host, half its barrier round trips a K
# (the plan's ffn2 kernel, 1024 x 768 x 3072, is a 64 x 128 x 128 Triton tile; the s6 host ran 11% over it in session
# 57's probe); offered to the probe first, not yet a host choice: no spills offline beside 4 or 8 BE warps
PP64_K128_HOST = ("pp64x128 k128 s3", WsConfig(block_m=64, block_n=128, block_k=128, stages=3), LOADER_REGS)


class Candidate(NamedTuple):
    """One way a host runs a BE kernel beside its GEMM."""

    label: str
    cfg: WsConfig  # the host tile
    loader: int  # the GEMM loader's registers a thread
    warps: int  # the BE partition's warps
    unroll: int = 1  # stencil7's blocks an iteration (the LDG form)
    feed: str = "ldg"  # FEEDS
    slots: int = 0  # the TMA form's ring depth (``tma_slots``)


HOST_WARPS = (4, 8)  # the BE partition's warp counts a host may offer
# a candidate must leave the GEMM's consumers this many registers a thread: the 64 x 128 tile's accumulator takes 64, and
# session 57's 128-row tile with 8 BE warps (its consumers at 128 - 40) ran 3-10x slower
MIN_CONSUMER_REGS = 128


def _parse_counts(text: str, allowed: tuple[int, ...], option: str, takes: str) -> tuple[int, ...]:
    """``"4,8"`` -> (4, 8), every count one of ``allowed``; else ValueError naming ``option`` and what it ``takes``."""
    try:
        counts = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        counts = ()
    if not counts or any(c not in allowed for c in counts):
        raise ValueError(f"{option} takes {takes}, got {text!r}")
    return counts


def parse_warps(text: str) -> tuple[int, ...]:
    """``"4,8"`` -> (4, 8): the BE warp counts a host tries (``--ws-warps``); ValueError naming what is wrong."""
    return _parse_counts(text, HOST_WARPS, "--ws-warps", "4 and / or 8")


def parse_feeds(text: str) -> tuple[str, ...]:
    """``"ldg,tma"`` -> ("ldg", "tma"): how stencil7's partition may read its input (``--ws-feed``); ValueError naming what is wrong."""
    feeds = tuple(f.strip() for f in text.split(",") if f.strip())
    if not feeds or any(f not in FEEDS for f in feeds):
        raise ValueError(f"--ws-feed takes some of {', '.join(FEEDS)}, got {text!r}")
    return feeds


def parse_unrolls(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2): stencil7's blocks an iteration a host tries (``--ws-unroll``); ValueError naming what is wrong."""
    allowed = tuple(STENCIL7_UNROLL_REGS)
    return _parse_counts(text, allowed, "--ws-unroll", f"some of {', '.join(map(str, allowed))}")


@dataclass
class WsHost:
    """A plan ``gemm_epilogue`` step that can carry a BE slice (``lc_items(gemms="plan-ws")``): its operands as
    ``gemm_ws`` takes them (3-D views, one batch), its own output buffer, its epilogue. The LC runs the plan's own
    kernel alone; a fused launch runs the step on a ping-pong tile of ``tiles`` with the slice in a worker partition
    of ``warps`` warps. Tile and warps are chosen per BE kernel (``choose``: the CUDA backend calls it when built) as the
    fastest in sum over slices of ``choice_slices`` BE blocks a program (``chosen``, every candidate's time per slice
    in ``times``); ``time_ms`` None (the CPU) takes the first that can run."""

    name: str
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    extras: list[torch.Tensor]
    epi: Epilogue
    num_programs: int
    fast_gelu: bool = True
    tiles: tuple[tuple[str, WsConfig, int], ...] = HOST_TILES
    # 8 BE warps: twice the BE's latency hiding for 24-40 fewer registers a consumer thread. Session 57's probe
    # (``ws_colocate_probe.py --warps 4,8``, H100): histogram's atomics gain (ffn1, four blocks a program: be_free 0.36
    # -> 0.87), mri-q loses a little (0.75 -> 0.52 on attn-out at four): ``choose`` times both
    warps: tuple[int, ...] = HOST_WARPS
    # the slices a choice is timed at, in BE blocks a program: the scheduler aims at 0.25-1 GEMM-lengths of BE work
    # (one to four blocks a program), and session 57's probe ranked the warp counts differently at one and at four
    choice_slices: tuple[int, ...] = (1, 4)
    # stencil7's blocks an iteration (``partition``'s unroll) a host tries; others run one. Offline (sm_90, the s6 host):
    # 2 at 8 warps and 4 at 4 warps compile without spills and leave the consumers 136 / 152 registers
    unrolls: tuple[int, ...] = (1,)
    # how stencil7's partition reads its input (``FEEDS``): "tma" adds the TMA-fed form on each host tile whose shared
    # memory leaves a ring of ``TMA_SLOTS``
    feeds: tuple[str, ...] = ("ldg",)
    time_ms: Callable[[Callable[[], Any]], float] | None = None
    # check each candidate's fused launch (the whole BE kernel beside the GEMM) against both references before timing it,
    # and never choose one that is wrong (``wrong``); the GPU's hosts do (``host_for``)
    check: bool = False
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)  # BE kernel -> candidate -> why it was wrong
    chosen: dict[str, Candidate] = field(default_factory=dict)
    times: dict[str, dict[str, float]] = field(default_factory=dict)
    plan_kernel: str = ""  # what the plan runs for the step alone (its config and epilogue), for the logs

    def candidates(self, work: Workload) -> list[Candidate]:
        """Every tile x BE warp count (x blocks an iteration or the TMA feed, stencil7) whose partition ``work``'s blocks
        fit (``partition`` checks the layout), that leaves the GEMM's consumers ``MIN_CONSUMER_REGS`` and, TMA-fed, whose
        ring fits beside the tile's shared memory."""
        stencil = work.name == "stencil7"
        forms = [(u, "ldg") for u in (self.unrolls if stencil else (1,)) if "ldg" in self.feeds or not stencil]
        if stencil and "tma" in self.feeds and tma_unfit(work.kernel.args[0]) is None:
            forms += [(u, "tma") for u in self.unrolls if u in STENCIL7_TMA_REGS]
        out = []
        for w in self.warps:
            for u, feed in forms:
                try:
                    part = for_workload(work, w, unroll=u, feed=feed)
                except ValueError:
                    continue
                if u > 1 and part.consumer_regs() < MIN_CONSUMER_REGS:
                    continue
                label = f" w{w}" + (f" u{u}" if u > 1 else "") + (" tma" if feed == "tma" else "")
                for name, cfg, loader in self.tiles:
                    # 8 BE warps leave a 128-row tile's consumers too few registers: 3-10x slower in session 57's probe
                    if w > 4 and cfg.block_m > 64:
                        continue
                    slots = tma_slots(cfg, work.kernel.consts, u) if feed == "tma" else 0
                    if feed == "tma" and not slots:
                        continue
                    out.append(Candidate(name + label, cfg, loader, w, u, feed, slots))
        if not out:
            raise ValueError(f"{self.name}: no worker partition of {work.name} fits {self.warps} warps")
        return out

    def launch(self, cand: Candidate, work: Workload, start: int, end: int) -> None:
        launch_fused(self.a, self.b, self.c, self.extras, self.epi, cand.cfg, work, start, end, self.num_programs, warps=cand.warps,
                     fast_gelu=self.fast_gelu, loader_regs=cand.loader, unroll=cand.unroll, feed=cand.feed,
                     slots=cand.slots or TMA_SLOTS[-1])  # fmt: skip

    def gemm_reference(self) -> torch.Tensor:
        """The step's output in fp32 from its own operands (what every candidate's GEMM must write)."""
        from kfuse.kernels.epilogue import apply_reference

        return apply_reference(torch.matmul(self.a.float(), self.b.float()), [x.float() for x in self.extras], self.epi)

    def wrong(self, cand: Candidate, work: Workload, ref: torch.Tensor) -> str | None:
        """Why ``cand``'s fused launch of the whole BE kernel is wrong (its output against the BE's reference, the GEMM's
        against ``ref``, both poisoned first), or None."""
        from kfuse.colocate.workloads import error

        work.reset()
        self.c.fill_(float("nan"))
        self.launch(cand, work, 0, work.kernel.n_blocks)
        be_err = error(work)
        if not be_err <= max(work.tol, 1e-3):
            return f"{work.name} error {be_err:.1e}"
        gemm_err = ((self.c.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
        return None if gemm_err < 2e-2 else f"GEMM error {gemm_err:.1e}"

    def choose(self, work: Workload) -> Candidate:
        if work.name not in self.chosen:
            cands = self.candidates(work)
            # checking and timing run BE blocks many times: work that is not idempotent (a histogram's atomics) gets its
            # output back as it was, or the slices run before this choice would count twice
            kept = None if work.idempotent else work.output().clone()
            if self.check:
                ref = self.gemm_reference()
                why = {c[0]: self.wrong(c, work, ref) for c in cands}
                self.rejected[work.name] = {label: w for label, w in why.items() if w is not None}
                cands = [c for c in cands if why[c[0]] is None]
                if not cands:
                    raise RuntimeError(f"{self.name}: every worker partition of {work.name} computed a wrong result: {why}")
            best = cands[0]
            if self.time_ms is not None and len(cands) > 1:
                sizes = sorted({min(work.kernel.n_blocks, s * self.num_programs) for s in self.choice_slices})
                times = {(c[0], n): self.time_ms(lambda c=c, n=n: self.launch(c, work, 0, n)) for c in cands for n in sizes}
                per_program = {n: max(1, round(n / self.num_programs)) for n in sizes}
                self.times[work.name] = {f"{label} S{per_program[n]}": ms for (label, n), ms in times.items()}
                best = min(cands, key=lambda c: sum(times[c[0], n] for n in sizes))
            if kept is not None:
                work.output().copy_(kept)
            self.chosen[work.name] = best
        return self.chosen[work.name]

    def fused(self, work: Workload, start: int, end: int) -> None:
        """The step's GEMM and BE blocks ``[start, end)`` of ``work`` in one launch."""
        self.launch(self.choose(work), work, start, end)


def host_for(node: Any, inputs: list[torch.Tensor], name: str, num_programs: int,
             time_ms: Callable[[Callable[[], Any]], float] | None = None,
             warps: tuple[int, ...] = HOST_WARPS, unrolls: tuple[int, ...] = (1,),
             feeds: tuple[str, ...] = ("ldg",)) -> tuple[WsHost | None, str]:  # fmt: skip
    """The ``WsHost`` of a plan step (``node`` on its ``inputs``: A, B, then the epilogue's extras), or None and why
    it cannot host: not a ``gemm_epilogue``, a folded norm, or a call the ping-pong kernel cannot run
    (``gemm_ws.ws_eligible``: an sm_90 GPU, one batch, fp16 / bf16, TMA-describable operands)."""
    from kfuse.kernels import gemm
    from kfuse.kernels.epilogue import exact_gelu

    if node.op != "gemm_epilogue":
        return None, f"a {node.op} step"
    if node.attrs.get("row_rms") is not None:
        return None, "a folded RMSNorm (the step scales A's rows first)"
    g = gemm.prepare(inputs[0], inputs[1], list(inputs[2:]), node.ttype.dtype)
    c = torch.empty_like(g.c)
    why = gemm_ws.ws_eligible(g.a, g.b, c)
    if why is not None:
        return None, why
    host = WsHost(name, g.a, g.b, c, list(g.extras), node.attrs["epilogue"], num_programs, not exact_gelu(g.a.dtype), warps=warps,
                  unrolls=unrolls, feeds=feeds, time_ms=time_ms, check=time_ms is not None)  # fmt: skip
    return host, ""
