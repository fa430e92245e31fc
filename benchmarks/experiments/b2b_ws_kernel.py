"""``b2b_ws_kernel``: a warp-specialised two-stage GEMM chain for Hopper, written in Gluon.

    y = act1(act0(x @ W0 + b0) @ W1 + b1),  x (M, K0), W0 (K0, N0), W1 (N0, N1); K0, N1 <= 256

Why a second chunked kernel: ``b2b_chunked_kernel`` (Triton) runs the chunk loop's two products
back to back. The second product of a chunk waits for the first and for its epilogue, and the
tensor cores idle during every epilogue. Its best tiling (64 rows, two programs per SM) also
re-reads the 256 KB of a 256-wide chain's weights from L2 for every 64 rows (6.4 TB/s of L2 at
M = 1M). Triton 3.6 generates neither warp specialisation nor an intra-warpgroup overlap of the
two products, and Gluon lets the kernel say both (the FA3 forward loop, without the softmax):

* one **loader warp** streams, by TMA, the x tile (BLOCK_M rows, all of K0) into ``X_BUFS``
  buffers and each chunk's weight slices ``W0[:, j]`` and ``W1[j, :]`` into ``W0_STAGES``- and
  ``W1_STAGES``-deep rings, signalling ``ready`` mbarriers; the consumers release each buffer through ``empty``
  mbarriers once the MMA that read it has completed;
* the **consumer warps** (two warpgroups, 64 rows each, one 128-row tile; the weight slices are
  shared by 128 rows, half the L2 traffic of 64-row programs) issue the first product of chunk
  j + 1 before the epilogue of chunk j, so the tensor cores run it while the CUDA cores apply
  act0, and the second product of chunk j queues behind it:

      G1(0);  for j: wait(G1(j)) -> issue G1(j+1) -> h_j = act0(acc_j) -> issue G2(j) += h_j W1[j]

The intermediate exists only as a 128 x BLOCK_H slice in registers (the A operand of the second
wgmma); the output tile (128 x N1 fp32, 128 registers a thread) is stored straight from the
accumulator's layout. The grid is persistent: one program per SM loops over row tiles.

Requirements (``ws_eligible``): sm_90, fp16, K0 and N1 padded to a power of two <= 256, at most
one bias per stage, act in ``ACTS``. Gluon does not run in TRITON_INTERPRET; it compiles for sm_90
offline (no spills at h32 with two x buffers and W0 / W1 rings of 2 / 3: 213,316 B of shared memory,
consumers at 240 registers after ``setmaxnreg``).

Experiment (session 17), not part of kfuse: ``ws_probe.py`` measured it correct on every case and
slower than ``b2b_chunked_kernel`` on every case (0.815 against 0.654 ms at 256 -> 256 -> 256, M =
1M), so it was kept here as the record rather than wired into the b2b decision. Likely causes, not
yet separated: the two consumer warpgroups run in lockstep on one tile, so the output store of
each 128 x 256 tile (straight from the accumulator layout, 4-byte stores) leaves the tensor cores
idle; each chunk's first product re-reads the x tile from shared memory (n = 32 wgmma tiles are
bound by shared-memory bandwidth); and no ping-pong between the warpgroups (FA3's named barriers).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from kfuse.kernels.b2b.chain import pad_width
from kfuse.kernels.b2b.configs import SMEM_LIMIT

ACTS = ("none", "relu")  # the stage activations this kernel applies (constexpr codes 0, 1)
BLOCK_M = 128  # two consumer warpgroups of 64 rows


@gluon.jit
def _act(v, ACT: gl.constexpr):
    if ACT == 1:
        v = gl.maximum(v, 0.0)
    return v


@gluon.jit
def _loader(x_desc, w0_desc, w1_desc, x_bufs, w0_bufs, w1_bufs, bars, M, NUM_PROGRAMS: gl.constexpr, NCH: gl.constexpr):
    """One warp: the TMA producer. Every ``empty`` wait starts at phase 1, which a fresh mbarrier
    has already completed, so the rings fill before the consumers release anything."""
    x_ready, x_empty, w0_ready, w0_empty, w1_ready, w1_empty = bars
    X_BUFS: gl.constexpr = x_bufs.shape[0]
    W0_STAGES: gl.constexpr = w0_bufs.shape[0]
    W1_STAGES: gl.constexpr = w1_bufs.shape[0]
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BH: gl.constexpr = w0_desc.block_type.shape[1]
    i = 0
    c = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BM), NUM_PROGRAMS):
        xs = i % X_BUFS
        mbarrier.wait(x_empty.index(xs), ((i // X_BUFS) & 1) ^ 1)
        mbarrier.expect(x_ready.index(xs), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [tile * BM, 0], x_ready.index(xs), x_bufs.index(xs))
        for j in gl.static_range(NCH):
            s0 = c % W0_STAGES
            mbarrier.wait(w0_empty.index(s0), ((c // W0_STAGES) & 1) ^ 1)
            mbarrier.expect(w0_ready.index(s0), w0_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w0_desc, [0, j * BH], w0_ready.index(s0), w0_bufs.index(s0))
            s1 = c % W1_STAGES
            mbarrier.wait(w1_empty.index(s1), ((c // W1_STAGES) & 1) ^ 1)
            mbarrier.expect(w1_ready.index(s1), w1_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w1_desc, [j * BH, 0], w1_ready.index(s1), w1_bufs.index(s1))
            c += 1
        i += 1


@gluon.jit
def _consumer(x_bufs, w0_bufs, w1_bufs, bars, out_ptr, b0_ptr, b1_ptr, M, N0: gl.constexpr, N1: gl.constexpr, stride_om,
              NUM_PROGRAMS: gl.constexpr, NCH: gl.constexpr, HAS_B0: gl.constexpr, HAS_B1: gl.constexpr,
              ACT0: gl.constexpr, ACT1: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The two consumer warpgroups (the default partition): both products, both epilogues, the store."""
    x_ready, x_empty, w0_ready, w0_empty, w1_ready, w1_empty = bars
    X_BUFS: gl.constexpr = x_bufs.shape[0]
    W0_STAGES: gl.constexpr = w0_bufs.shape[0]
    W1_STAGES: gl.constexpr = w1_bufs.shape[0]
    BM: gl.constexpr = x_bufs.shape[1]
    BH: gl.constexpr = w0_bufs.shape[2]
    N1P: gl.constexpr = w1_bufs.shape[2]
    # one wgmma layout per product: warps stacked along M (16 rows a warp, 64 a warpgroup)
    l1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BH, 16])
    l2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N1P, 16])
    h_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l2, k_width=2)
    zero1 = gl.zeros([BM, BH], gl.float32, l1)
    offs_h = gl.arange(0, BH, layout=gl.SliceLayout(0, l1))
    offs_n = gl.arange(0, N1P, layout=gl.SliceLayout(0, l2))
    offs_r = gl.arange(0, BM, layout=gl.SliceLayout(1, l2))
    i = 0
    c = 0
    for tile in range(gl.program_id(0), gl.cdiv(M, BM), NUM_PROGRAMS):
        xs = i % X_BUFS
        mbarrier.wait(x_ready.index(xs), (i // X_BUFS) & 1)
        xb = x_bufs.index(xs)
        mbarrier.wait(w0_ready.index(c % W0_STAGES), (c // W0_STAGES) & 1)
        acc = warpgroup_mma(xb, w0_bufs.index(c % W0_STAGES), zero1, use_acc=False, is_async=True)
        acc_o = gl.zeros([BM, N1P], gl.float32, l2)
        for j in gl.static_range(NCH):
            # wgmma groups retire in issue order: G1(j), G2(j - 1). Waiting for all but the last
            # leaves G2(j - 1) running and makes G1(j) (and G2(j - 2) before it) complete
            acc = warpgroup_mma_wait(0 if j == 0 else 1, deps=(acc,))
            mbarrier.arrive(w0_empty.index(c % W0_STAGES), count=1)
            if j > 1:
                mbarrier.arrive(w1_empty.index((c - 2) % W1_STAGES), count=1)
            if j == NCH - 1:
                mbarrier.arrive(x_empty.index(xs), count=1)
            else:  # the next chunk's first product runs on the tensor cores during this epilogue
                sn = (c + 1) % W0_STAGES
                mbarrier.wait(w0_ready.index(sn), ((c + 1) // W0_STAGES) & 1)
                acc_next = warpgroup_mma(xb, w0_bufs.index(sn), zero1, use_acc=False, is_async=True)
            if HAS_B0:
                cols = j * BH + offs_h
                if N0 % BH == 0:
                    acc = acc + gl.load(b0_ptr + cols).to(gl.float32)[None, :]
                else:
                    acc = acc + gl.load(b0_ptr + cols, mask=cols < N0, other=0.0).to(gl.float32)[None, :]
            h = gl.convert_layout(_act(acc, ACT0).to(gl.float16), h_layout)
            s1 = c % W1_STAGES
            mbarrier.wait(w1_ready.index(s1), (c // W1_STAGES) & 1)
            # queued behind G2(j - 1) on the same accumulator: no wait between them
            acc_o = warpgroup_mma(h, w1_bufs.index(s1), acc_o, is_async=True)
            if j < NCH - 1:
                acc = acc_next
            c += 1
        acc_o = warpgroup_mma_wait(0, deps=(acc_o,))
        if NCH > 1:
            mbarrier.arrive(w1_empty.index((c - 2) % W1_STAGES), count=1)
        mbarrier.arrive(w1_empty.index((c - 1) % W1_STAGES), count=1)
        if HAS_B1:  # loaded here, not hoisted: held across the loop it would cost 64 registers a thread
            acc_o = acc_o + gl.load(b1_ptr + offs_n, mask=offs_n < N1, other=0.0).to(gl.float32)[None, :]
        rows = tile * BM + offs_r
        ptrs = out_ptr + (rows * stride_om)[:, None] + offs_n[None, :]
        if N1 == N1P:
            gl.store(ptrs, _act(acc_o, ACT1).to(gl.float16), mask=(rows < M)[:, None])
        else:
            gl.store(ptrs, _act(acc_o, ACT1).to(gl.float16), mask=(rows < M)[:, None] & (offs_n < N1)[None, :])
        i += 1


@gluon.jit
def b2b_ws_kernel(x_desc, w0_desc, w1_desc, out_ptr, b0_ptr, b1_ptr, M, N0: gl.constexpr, N1: gl.constexpr, stride_om,
                  NUM_PROGRAMS: gl.constexpr, NCH: gl.constexpr, X_BUFS: gl.constexpr, W0_STAGES: gl.constexpr,
                  W1_STAGES: gl.constexpr, HAS_B0: gl.constexpr, HAS_B1: gl.constexpr, ACT0: gl.constexpr,
                  ACT1: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [X_BUFS] + x_desc.block_type.shape, x_desc.layout)
    w0_bufs = gl.allocate_shared_memory(w0_desc.dtype, [W0_STAGES] + w0_desc.block_type.shape, w0_desc.layout)
    w1_bufs = gl.allocate_shared_memory(w1_desc.dtype, [W1_STAGES] + w1_desc.block_type.shape, w1_desc.layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [X_BUFS, 1], mbarrier.MBarrierLayout())
    x_empty = gl.allocate_shared_memory(gl.int64, [X_BUFS, 1], mbarrier.MBarrierLayout())
    w0_ready = gl.allocate_shared_memory(gl.int64, [W0_STAGES, 1], mbarrier.MBarrierLayout())
    w0_empty = gl.allocate_shared_memory(gl.int64, [W0_STAGES, 1], mbarrier.MBarrierLayout())
    w1_ready = gl.allocate_shared_memory(gl.int64, [W1_STAGES, 1], mbarrier.MBarrierLayout())
    w1_empty = gl.allocate_shared_memory(gl.int64, [W1_STAGES, 1], mbarrier.MBarrierLayout())
    for k in gl.static_range(X_BUFS):
        mbarrier.init(x_ready.index(k), count=1)
        mbarrier.init(x_empty.index(k), count=1)
    for k in gl.static_range(W0_STAGES):
        mbarrier.init(w0_ready.index(k), count=1)
        mbarrier.init(w0_empty.index(k), count=1)
    for k in gl.static_range(W1_STAGES):
        mbarrier.init(w1_ready.index(k), count=1)
        mbarrier.init(w1_empty.index(k), count=1)
    bars = (x_ready, x_empty, w0_ready, w0_empty, w1_ready, w1_empty)
    # the loader: one warp at 24 registers, so the consumers can raise theirs to 240 (the arguments
    # are written inline: a tuple held in a variable would turn the constexprs into tensors)
    # fmt: off
    gl.warp_specialize([
        (_consumer, (x_bufs, w0_bufs, w1_bufs, bars, out_ptr, b0_ptr, b1_ptr, M, N0, N1, stride_om,
                     NUM_PROGRAMS, NCH, HAS_B0, HAS_B1, ACT0, ACT1, num_warps)),
        (_loader, (x_desc, w0_desc, w1_desc, x_bufs, w0_bufs, w1_bufs, bars, M, NUM_PROGRAMS, NCH)),
    ], [1], [24])
    # fmt: on


def smem_bytes(k0: int, n1: int, block_h: int, x_bufs: int, w0_stages: int, w1_stages: int) -> int:
    """fp16 shared memory of the kernel's buffers and mbarriers (sm_90 compiles: the buffers plus
    324 B at 256 -> 256 -> 256; the intermediate's layout conversion stays in registers)."""
    k0p, n1p = pad_width(k0), pad_width(n1)
    buffers = x_bufs * BLOCK_M * k0p + w0_stages * block_h * k0p + w1_stages * block_h * n1p
    return 2 * buffers + 16 * (x_bufs + w0_stages + w1_stages) + 256


def ws_eligible(k0: int, n0: int, n1: int, dtype: torch.dtype, acts: tuple[str, str]) -> str | None:
    """Why ``b2b_ws_kernel`` cannot run a chain, or None when it can."""
    if dtype != torch.float16:
        return "the warp-specialised kernel is fp16 only"
    if k0 > 256 or n1 > 256:
        return f"the warp-specialised kernel needs K0 <= 256 and N1 <= 256 (got {k0}, {n1})"
    if any((d * 2) % 16 for d in (k0, n0, n1)):
        return f"the warp-specialised kernel needs 16-byte rows (K0 {k0}, N0 {n0}, N1 {n1})"
    if any(a not in ACTS for a in acts):
        return f"the warp-specialised kernel applies only {ACTS} (got {acts})"
    return None


def descriptors(x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, block_h: int) -> tuple[Any, Any, Any]:
    """Host TMA descriptors: x (M, K0) in BLOCK_M x K0P boxes, W0 (K0, N0) in K0P x BLOCK_H column
    slices, W1 (N0, N1) in BLOCK_H x N1P row slices (TMA fills past every edge with zeros, so the
    padded columns and rows multiply zeros)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    k0p, n1p = pad_width(x.shape[1]), pad_width(w1.shape[1])

    def desc(t: torch.Tensor, block: list[int]) -> Any:
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.float16))

    return desc(x, [BLOCK_M, k0p]), desc(w0, [k0p, block_h]), desc(w1, [block_h, n1p])


def b2b_ws(x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, b0: torch.Tensor | None = None, b1: torch.Tensor | None = None,
           acts: tuple[str, str] = ("relu", "none"), block_h: int = 32, x_bufs: int = 2, w0_stages: int = 2, w1_stages: int = 3,
           num_programs: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Launch the chain on x (M, K0), W0 (K0, N0), W1 (N0, N1), all fp16, row-major, on an sm_90 GPU.
    ``num_programs`` 0: one per SM (capped at the number of row tiles)."""
    why = ws_eligible(x.shape[1], w0.shape[1], w1.shape[1], x.dtype, acts)
    if why:
        raise ValueError(why)
    need = smem_bytes(x.shape[1], w1.shape[1], block_h, x_bufs, w0_stages, w1_stages)
    if need > SMEM_LIMIT:
        raise ValueError(f"b2b_ws: {need} B of shared memory for h{block_h} x{x_bufs} w{w0_stages}/{w1_stages}, more than {SMEM_LIMIT}")
    m, n0, n1 = x.shape[0], w0.shape[1], w1.shape[1]
    out = torch.empty(m, n1, device=x.device, dtype=x.dtype) if out is None else out
    xd, w0d, w1d = descriptors(x, w0, w1, block_h)
    tiles = triton.cdiv(m, BLOCK_M)
    if not num_programs:
        num_programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    num_programs = max(1, min(num_programs, tiles))
    b2b_ws_kernel[(num_programs,)](
        xd, w0d, w1d, out, b0 if b0 is not None else out, b1 if b1 is not None else out, m, N0=n0, N1=n1, stride_om=out.stride(0),
        NUM_PROGRAMS=num_programs, NCH=triton.cdiv(n0, block_h), X_BUFS=x_bufs, W0_STAGES=w0_stages, W1_STAGES=w1_stages,
        HAS_B0=b0 is not None, HAS_B1=b1 is not None, ACT0=ACTS.index(acts[0]), ACT1=ACTS.index(acts[1]),
        num_warps=8, maxnreg=168,
    )  # fmt: skip
    return out
