"""Warp-specialised, persistent GEMMs for Hopper (sm_90), written in Gluon, with kfuse's generated
epilogue:

    C = epilogue(A @ B, extra inputs...),  A (M, K) K-contiguous, B (K, N) row- or column-major

Why: at BERT/GPT-2's K = 768 the Triton kernels (``gemm.py``) run the main loop and then the
epilogue in one instruction stream, and Triton 3.6 does not warp-specialise Hopper GEMMs with
128-row tiles (docs/perf-notes.md, sessions 2, 5, 7). Here a **loader** warp (few registers) walks the
program's tiles and streams A's and B's K blocks by TMA into a ``STAGES``-deep ring of shared-memory
slots, each with a ``ready`` and an ``empty`` mbarrier, and the consumers (registers raised by
``setmaxnreg``) run one of two schedules (``WsConfig.schedule``):

* ``gemm_pingpong_kernel`` (cuBLAS's ping-pong): two consumer warpgroups own alternate tiles of the
  program (128 x 128, 64 x 128, 128 x 64, 64 x 256, or 128 x 192 / 64 x 192 / 192 x 128 held as two
  power-of-two accumulator pieces: ``WsConfig.pieces``, ``row_pieces``; at most 192 accumulator
  registers a thread).
  A *turn* barrier lets a consumer start its main loop only when the other has issued all of its
  own: the two main loops take turns on the tensor cores, each epilogue runs beside the other
  consumer's main loop, and no consumer waits on a slot's phase parity before the slot's previous
  use has been waited for (the ring is shared and parity waits cannot tell two uses apart). Each
  consumer stores through its own staging buffer by TMA, or both through one set (``shared_c``).
* ``gemm_coop_kernel``: two warpgroups on one 128 x 256 (or 128 x 128) tile, held as two column
  halves, so the epilogue and the TMA stores run half a tile at a time (fewer live registers;
  ``c_bufs`` staging buffers).
* ``gemm_rows_kernel`` (an experiment, not in the tuner's space): two warpgroups on one 192- or
  256-row tile, a row piece each (128 rows and the rest) over one B block a K step, each slot freed
  when both have read it; the fastest main loop here, but each tile's epilogue is exposed.

Each consumer keeps one wgmma group per accumulator in flight and frees a slot as soon as the
wgmma that read it has retired. Extra inputs are loaded by pointers in the accumulator's layout (a
bias row once per tile). GELU follows kfuse's policy (``epilogue.exact_gelu``): by default the tanh
form on ``tanh.approx.f32`` (``fast_gelu``), as cuBLASLt's GELU epilogue.

Measured on the H200 (session 18, ``benchmarks/experiments/pingpong_probe.py`` and
``ws_epilogue_probe.py``, ``ws_overlap_probe.py``): without an epilogue the ping-pong kernel ties
the bare cuBLAS GEMM on most of BERT/GPT-2's shapes (0.89-1.24x, at or under it on 5-7 of 12); bias or ReLU add 1-5%, the exact
GELU 40-75%, the tanh-form GELU 6-12%. The schedule does overlap an epilogue's waits and MUFU work
with the other warpgroup's main loop (free up to its length), but not FP32 FMA-pipe work, which slows
the other warpgroup's wgmma as much as a serial epilogue would: an epilogue is cheap here when it has
few FP32 ALU instructions. Tuned in ``gemm_bench``: 1.01-1.26x the bare cuBLAS GEMM with bias + GELU,
against 1.14-1.71x for the Triton template.

Session 19: the 192-wide tiles take BERT T4096's qkv, attn_out and ffn2 from 1.06-1.18x to 1.01-1.09x
the bare cuBLAS GEMM (wave quantization: 192 tiles of 128 x 128 on 132 SMs are 2 main loops a program
where 128 tiles of 128 x 192 are 1) and are 14-19% slower where the waves already come out even (3
stages, 192 accumulator registers); the fast GELU in 5 FP32 instructions a value instead of 7. Tuned,
with the three sides timed interleaved: 1.02-1.16x and 1.04-1.15x the bare cuBLAS GEMM in two runs (docs/perf-notes.md, "Session 19").

Session 20: Nsight Compute showed the H200 running these GEMMs at its power limit, where time follows
energy: kfuse's bias + GELU kernel took as many cycles as cuBLAS's bare GEMM but ran at a 5% lower clock,
moving 1.48x its bytes through L2 (cuBLAS multicasts B to 2-CTA clusters, which Gluon 3.6 cannot). The
192 x 128 tile (``row_pieces``: a 128-row and a 64-row accumulator over one B block, 17% fewer operand
bytes) with the consumers sharing their staging buffers (``shared_c``: a fourth ring stage) took issue 3's
record to 0.96-1.11x the bare cuBLAS GEMM, at or under it on 3 of 12 shapes. Folding the bias into the
accumulator (``BIAS_MODES``) was measured slower where tiles are many and is not used.

Session 21 (``ws_power_probe.py`` runs 3-7, ``ncu_gemm_probe.py --set t4096 / rows``): without its
epilogue the tuned 192 x 128 ping-pong kernel is at or under the bare cuBLAS GEMM on 8-11 of the 12
shapes and the rows kernel on 10-11 (0.88-1.02x): the main loop is at library speed. The bias + GELU
epilogue costs 2-7% where a program holds many tiles and 4 us of a 15 us kernel where it holds one (BERT
T4096 attn_out, Nsight Compute). Every form tried that moves the epilogue's work elsewhere was slower
on the many-tile shapes: the bias row by TMA (``bias_mode="tma"``: no global loads or spills, +3-4%),
one column a thread ("blocked"), the rows kernel with its own epilogue (1.04-1.16x) or with a third
warpgroup running the epilogues beside the next main loop (1.01-1.17x; +10% cycles at the same clock),
and the output stored from the registers without staging (1.03-1.30x). kfuse keeps the ping-pong kernel
with the epilogue's pointer load.

Session 30 (``ws_power_probe.py`` run 9): the bias row's loads issued at the tile's start, before the
consumer's turn wait (``bias_mode="prefetch"``, kfuse's default since): the 128 x 128 tile 2-4% faster on
the K = 768 shapes (at or under the bare cuBLAS GEMM on 5 of 12 shapes, from 0), the 192 x 128 tile 1-2%
on BERT T4096 qkv / ffn1 and within 0.6% elsewhere.

Session 31 (``ws_power_probe.py`` run 10): half the f16x2 GELU's values on an FMA-pipe polynomial
(``gelu_mix``, ``gelu_poly``) where every program holds one tile: 2.4% faster on BERT T4096 attn_out, where the MUFU
bounded the exposed epilogue (now bound by one warp's issue: ~0.6 us); the many-tile shapes within -0.7..+0.7% with
it, so they keep the MUFU form.

Requirements (``ws_eligible``): an sm_90 GPU, one batch, fp16/bf16 operands and output,
TMA-describable A, B and C, no split-K. Gluon does not run in TRITON_INTERPRET: the CPU tests compile
the kernels for sm_90 offline (``compile_offline``) and check their SASS (HGMMA, TMA, no spills); the
numerical tests run on the GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from kfuse.kernels import gelu_poly, pdl
from kfuse.kernels.codegen import cdiv, generated, interpreting
from kfuse.kernels.epilogue import Epilogue, render

SMEM_LIMIT = 232448  # sm_90: dynamic shared memory per block (227 KB)
WS_DTYPES = (torch.float16, torch.bfloat16)
LOADER_REGS = 40  # the loader warp's registers after setmaxnreg (its share goes to the consumers)
CONSUMER_REGS = 232  # the ping-pong kernel's second consumer warpgroup (the first gets what is left)

_SOURCE = """
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from kfuse.kernels.pdl_gluon import pdl_start  # programmatic dependent launch (kfuse.kernels.pdl)

# the rendered epilogue is written against triton.language's names, which Gluon shares, except the
# NaN-propagation enum of max/min (kfuse.ir.ops: relu, clamp, maximum, minimum propagate NaN)
tl = gl
if not hasattr(gl, "PropagateNan"):
    import triton.language as _tl_lang

    gl.PropagateNan = _tl_lang.PropagateNan


@gluon.jit
def _gelu_fast(x):
    # tanh-form GELU on the MUFU's tanh (tanh.approx.f32, one instruction, relative error < 2^-10.9),
    # written for the FP32 pipe, which an epilogue shares with the other consumer's wgmma (MUFU work
    # runs free beside it): with h = x / 2, gelu(x) = h + h tanh(h (2 k0 + 8 k1 h^2)), k0 = sqrt(2 / pi),
    # k1 = 0.044715 k0: 5 FP32 instructions a value (FMUL, FMUL, FFMA, FMUL, FFMA) where
    # 0.5 x (1 + tanh(k0 (x + 0.044715 x^3))) as written compiles to 7; the exact form takes ~28
    h = x * 0.5
    p = gl.fma(h * h, 0.285419265090401, 1.5957691216057308)
    t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [h * p], dtype=gl.float32, is_pure=True, pack=1)
    return gl.fma(h, t, h)


{gelu16_fns}

@gluon.jit
def _tile_coords(t, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    # grouped order: GROUP_M row tiles walk the columns together, so B's column blocks are
    # re-read from L2 while hot
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (t // per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (t % per_group) % rows, (t % per_group) // rows


@gluon.jit
def _b_block(b_bufs, s, B_KMAJOR: gl.constexpr):
    # slot s of a B ring as the wgmma's (BLOCK_K, N) operand: a column-major B is held as B^T tiles
    if B_KMAJOR:
        return b_bufs.index(s).permute((1, 0))
    else:
        return b_bufs.index(s)


@gluon.jit
def _row(ptr, stride, off_n, N, WIDTH: gl.constexpr, layout: gl.constexpr):
    # columns off_n .. off_n + WIDTH of a row input as a (1, WIDTH) row in the accumulator's layout, in
    # the input's dtype (bias mode "prefetch" keeps it so through the main loop: half an fp32 row's registers)
    offs = off_n + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    return gl.load(ptr + offs * stride, mask=offs < N, other=0.0)[None, :]


@gluon.jit
def _bias_row(ptr, stride, off_n, N, WIDTH: gl.constexpr, layout: gl.constexpr):
    # the same row in fp32
    return _row(ptr, stride, off_n, N, WIDTH, layout).to(gl.float32)


@gluon.jit
def _row_blocked(ptr, stride, off_n, N, WIDTH: gl.constexpr, layout: gl.constexpr):
    # the same bias row, loaded one column a thread of the warpgroup (one pointer a thread where the
    # accumulator's layout needs WIDTH / 4) and converted through shared memory
    cols: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = off_n + gl.arange(0, WIDTH, layout=cols)
    row = gl.load(ptr + offs * stride, mask=offs < N, other=0.0)
    return gl.convert_layout(row, gl.SliceLayout(0, layout)).to(gl.float32)[None, :]


@gluon.jit
def _store_tile(acc, buf, c_desc, off_m, off_n, PENDING: gl.constexpr):
    # the tile out through a staging buffer by TMA, once at most PENDING earlier stores (the one that
    # last read this buffer among them) are still in flight
    tma.store_wait(PENDING)
    buf.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], buf)


@gluon.jit
def _loader(a_desc, a_lo_desc, b_desc, b_lo_desc, a_bufs, a_lo_bufs, b_bufs, b_lo_bufs, ready, empty, M, N, K,
            BLOCK_N: gl.constexpr, NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
            M_LO: gl.constexpr, N_LO: gl.constexpr, bias_desc, bias_bufs, bias_ready, bias_free, BIAS_TMA: gl.constexpr):
    # one warp: the TMA producer. A slot's first ``empty`` wait is at phase 1, which a fresh
    # mbarrier has already completed, so the ring fills before any consumer frees a slot. A tile
    # whose width (height) is not a power of two (Gluon's shapes are) is loaded as two pieces:
    # ``b_bufs`` holds its first BLOCK_N - N_LO columns, ``b_lo_bufs`` the last N_LO (``a_bufs`` its
    # first rows, ``a_lo_bufs`` the last M_LO). BIAS_TMA: each tile's bias row also comes by TMA, into
    # a ring of its own (``bias_bufs``, one row a slot) that the consumers read in their epilogues
    STAGES: gl.constexpr = a_bufs.shape[0]
    BIAS_SLOTS: gl.constexpr = bias_bufs.shape[0]
    M_HI: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = M_HI + M_LO
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    N_HI: gl.constexpr = BLOCK_N - N_LO
    nbytes: gl.constexpr = (a_desc.block_type.nbytes + b_desc.block_type.nbytes + (b_lo_desc.block_type.nbytes if N_LO > 0 else 0)
                            + (a_lo_desc.block_type.nbytes if M_LO > 0 else 0))
    k_steps = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    c = 0
    i = 0
    for t in range(gl.program_id(0), num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = _tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if BIAS_TMA:  # the slot the epilogue of tile i - BIAS_SLOTS has read
            bs = i % BIAS_SLOTS
            mbarrier.wait(bias_free.index(bs), ((i // BIAS_SLOTS) & 1) ^ 1)
            mbarrier.expect(bias_ready.index(bs), bias_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(bias_desc, [0, pid_n * BLOCK_N], bias_ready.index(bs), bias_bufs.index(bs))
            i += 1
        for kb in range(k_steps):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, kb * BLOCK_K], ready.index(s), a_bufs.index(s))
            if M_LO > 0:
                tma.async_copy_global_to_shared(a_lo_desc, [pid_m * BLOCK_M + M_HI, kb * BLOCK_K], ready.index(s), a_lo_bufs.index(s))
            if B_KMAJOR:
                tma.async_copy_global_to_shared(b_desc, [pid_n * BLOCK_N, kb * BLOCK_K], ready.index(s), b_bufs.index(s))
                if N_LO > 0:
                    tma.async_copy_global_to_shared(b_lo_desc, [pid_n * BLOCK_N + N_HI, kb * BLOCK_K], ready.index(s), b_lo_bufs.index(s))
            else:
                tma.async_copy_global_to_shared(b_desc, [kb * BLOCK_K, pid_n * BLOCK_N], ready.index(s), b_bufs.index(s))
                if N_LO > 0:
                    tma.async_copy_global_to_shared(b_lo_desc, [kb * BLOCK_K, pid_n * BLOCK_N + N_HI], ready.index(s), b_lo_bufs.index(s))
            c += 1


@gluon.jit
def _consumer(a_bufs, a_lo_bufs, b_bufs, b_lo_bufs, ready, empty, turn, cfree, c_smem, c_lo_smem, c_desc, c_lo_desc, {extra_ptrs}M, N, K,
              {extra_strides}{extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
              M_LO: gl.constexpr, N_LO: gl.constexpr, SHARED_C: gl.constexpr, WG: gl.constexpr, bias_bufs, bias_ready, bias_free):
    # one warpgroup: the main loop, the epilogue and the store of the program's tiles WG, WG + 2, ...;
    # with N_LO > 0 (M_LO > 0) the tile's last N_LO columns (M_LO rows) are a second accumulator
    # (``acc_lo``, stored through c_lo_desc). SHARED_C: both consumers stage their tiles in the same
    # buffers, handed over by ``cfree`` (their epilogues take turns anyway), which leaves the ring more
    # shared memory
    STAGES: gl.constexpr = a_bufs.shape[0]
    BIAS_SLOTS: gl.constexpr = bias_bufs.shape[0]
    M_HI: gl.constexpr = c_desc.block_type.shape[0]
    N_HI: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_M: gl.constexpr = M_HI + M_LO
    BLOCK_N: gl.constexpr = N_HI + N_LO
    HAS_LO: gl.constexpr = M_LO + N_LO > 0
    LO_M: gl.constexpr = c_lo_desc.block_type.shape[0]  # the second piece: its rows and columns,
    LO_N: gl.constexpr = c_lo_desc.block_type.shape[1]
    LO_DM: gl.constexpr = BLOCK_M - LO_M  # and where it starts in the tile
    LO_DN: gl.constexpr = BLOCK_N - LO_N
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N_HI, 16])
    zero = gl.zeros([M_HI, N_HI], gl.float32, acc_layout)
    if HAS_LO:
        lo_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, LO_N, 16])
        zero_lo = gl.zeros([LO_M, LO_N], gl.float32, lo_layout)
{first_k}
    k_steps = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    my_tiles = gl.cdiv(num_tiles - gl.program_id(0), NUM_PROGRAMS)
    for i in range(WG, my_tiles, 2):
        t = gl.program_id(0) + i * NUM_PROGRAMS
        pid_m, pid_n = _tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        c = i * k_steps  # every tile has k_steps slots, so tile i's first is at i * k_steps
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = zero
        if HAS_LO:
            acc_lo = zero_lo
{acc_init}
        # wait for the other consumer's main loop of tile i - 1 (consumer 0's first wait passes): a
        # ``ready`` wait is by phase parity, and must not start before the slot's previous use
        mbarrier.wait(turn.index(WG), ((i // 2) & 1) ^ (1 - WG))
        for kb in range(k_steps):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), _b_block(b_bufs, s, B_KMAJOR), acc, use_acc=kb >= FIRST_K, is_async=True)
            # one block's group(s) in flight: the previous block's wgmma has retired, so its slot is free
            if M_LO > 0:
                acc_lo = warpgroup_mma(a_lo_bufs.index(s), _b_block(b_bufs, s, B_KMAJOR), acc_lo, use_acc=kb >= FIRST_K, is_async=True)
            elif N_LO > 0:
                acc_lo = warpgroup_mma(a_bufs.index(s), _b_block(b_lo_bufs, s, B_KMAJOR), acc_lo, use_acc=kb >= FIRST_K, is_async=True)
            if HAS_LO:
                acc, acc_lo = warpgroup_mma_wait(2, deps=(acc, acc_lo))
            else:
                acc = warpgroup_mma_wait(1, deps=(acc,))
            if kb > 0:
                mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
            c += 1
        mbarrier.arrive(turn.index(1 - WG), count=1)  # the other consumer's main loop may start
        if HAS_LO:
            acc, acc_lo = warpgroup_mma_wait(0, deps=(acc, acc_lo))
        else:
            acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
        if SHARED_C:  # the previous tile's stores (the other consumer's) have left the staging buffers
            mbarrier.wait(cfree, (i - 1) & 1, pred=i > 0)
        if HAS_LO:  # the small piece first: fewer registers live beside the large accumulator
            hi = acc
            acc = acc_lo
            offs_m = off_m + LO_DM + gl.arange(0, LO_M, layout=gl.SliceLayout(1, lo_layout))
            offs_n = off_n + LO_DN + gl.arange(0, LO_N, layout=gl.SliceLayout(0, lo_layout))
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{pp_epilogue_12}
            # own buffers: after this consumer's previous tile left c_lo_smem
            _store_tile(acc, c_lo_smem, c_lo_desc, off_m + LO_DM, off_n + LO_DN, 0)
            acc = hi
        offs_m = off_m + gl.arange(0, M_HI, layout=gl.SliceLayout(1, acc_layout))
        offs_n = off_n + gl.arange(0, N_HI, layout=gl.SliceLayout(0, acc_layout))
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{pp_epilogue}
        if HAS_LO:
            _store_tile(acc, c_smem, c_desc, off_m, off_n, 1)  # the small piece's store may stay in flight
        else:
            _store_tile(acc, c_smem, c_desc, off_m, off_n, 0)  # own buffer: after this consumer's previous tile left c_smem
        if SHARED_C:  # the staging buffers are read: the other consumer's next tile may fill them
            tma.store_wait(0)
            mbarrier.arrive(cfree, count=1)
    tma.store_wait(0)


@gluon.jit{pingpong_jit}
def gemm_pingpong_kernel(a_desc, a_lo_desc, b_desc, b_lo_desc, c_desc, c_lo_desc, bias_desc, {extra_ptrs}M, N, K, {extra_strides}
                         {extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                         B_KMAJOR: gl.constexpr, M_LO: gl.constexpr, N_LO: gl.constexpr, SHARED_C: gl.constexpr,
                         LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PDL: gl.constexpr{partition_params}):
    pdl_start(PDL)
    # N_LO > 0 (M_LO > 0): the tile is c_desc's width + N_LO columns wide (height + M_LO rows high),
    # the second piece loaded through b_lo_desc (a_lo_desc) and stored through c_lo_desc; the unused
    # descriptors are the first pieces' again. bias_desc (bias mode "tma"): the bias row as a (1, N)
    # tensor, one tile's columns a block; otherwise c_desc again, unused
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c0 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    if SHARED_C:
        c1 = c0
    else:
        c1 = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    if M_LO > 0:
        a_lo_bufs = gl.allocate_shared_memory(a_lo_desc.dtype, [STAGES] + a_lo_desc.block_type.shape, a_lo_desc.layout)
    else:
        a_lo_bufs = a_bufs
    if N_LO > 0:
        b_lo_bufs = gl.allocate_shared_memory(b_lo_desc.dtype, [STAGES] + b_lo_desc.block_type.shape, b_lo_desc.layout)
    else:
        b_lo_bufs = b_bufs
    if M_LO + N_LO > 0:
        c0_lo = gl.allocate_shared_memory(c_lo_desc.dtype, c_lo_desc.block_type.shape, c_lo_desc.layout)
        if SHARED_C:
            c1_lo = c0_lo
        else:
            c1_lo = gl.allocate_shared_memory(c_lo_desc.dtype, c_lo_desc.block_type.shape, c_lo_desc.layout)
    else:
        c0_lo = c0
        c1_lo = c1
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    BIAS_TMA: gl.constexpr = {bias_tma}
    if BIAS_TMA:  # a slot a tile: the loader refills one after the epilogue BIAS_SLOTS tiles back has read it
        BIAS_SLOTS: gl.constexpr = {bias_slots}
        bias_bufs = gl.allocate_shared_memory(bias_desc.dtype, [BIAS_SLOTS] + bias_desc.block_type.shape, bias_desc.layout)
        bias_ready = gl.allocate_shared_memory(gl.int64, [BIAS_SLOTS, 1], mbarrier.MBarrierLayout())
        bias_free = gl.allocate_shared_memory(gl.int64, [BIAS_SLOTS, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(BIAS_SLOTS):
            mbarrier.init(bias_ready.index(s), count=1)
            mbarrier.init(bias_free.index(s), count=1)
    else:
        bias_bufs = a_bufs
        bias_ready = ready
        bias_free = empty
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    cfree = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    mbarrier.init(cfree.index(0), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1] + N_LO{partition_setup}
    FIRST: gl.constexpr = 0
    SECOND: gl.constexpr = 1
    # consumer 0 is the default partition (the kernel's 4 warps); the arguments are written inline:
    # a tuple held in a variable would turn the constexprs into tensors
    # fmt: off
    gl.warp_specialize([
        (_consumer, (a_bufs, a_lo_bufs, b_bufs, b_lo_bufs, ready, empty, turn, cfree.index(0), c0, c0_lo, c_desc, c_lo_desc,
                     {extra_args}M, N, K, {extra_stride_args}{extra_flag_args}NUM_PROGRAMS, GROUP_M, B_KMAJOR, M_LO, N_LO,
                     SHARED_C, FIRST, bias_bufs, bias_ready, bias_free)),
        (_consumer, (a_bufs, a_lo_bufs, b_bufs, b_lo_bufs, ready, empty, turn, cfree.index(0), c1, c1_lo, c_desc, c_lo_desc,
                     {extra_args}M, N, K, {extra_stride_args}{extra_flag_args}NUM_PROGRAMS, GROUP_M, B_KMAJOR, M_LO, N_LO,
                     SHARED_C, SECOND, bias_bufs, bias_ready, bias_free)),
        (_loader, (a_desc, a_lo_desc, b_desc, b_lo_desc, a_bufs, a_lo_bufs, b_bufs, b_lo_bufs, ready, empty, M, N, K, BLOCK_N, NUM_PROGRAMS,
                   GROUP_M, B_KMAJOR, M_LO, N_LO, bias_desc, bias_bufs, bias_ready, bias_free, BIAS_TMA)),{partition_entry}
    ], [4, 1{partition_warps}], [CONSUMER_REGS, LOADER_REGS{partition_regs}])
    # fmt: on


@gluon.jit
def _rows_consumer(a_bufs, b_bufs, ready, empty, c_smem, c_desc, {extra_ptrs}M, N, K, {extra_strides}
                   {extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
                   BLOCK_M: gl.constexpr, DM: gl.constexpr):
    # one warpgroup of ``gemm_rows_kernel``: rows DM .. DM + PM of every tile of the program, over the
    # same B blocks as the other warpgroup (which holds the tile's other rows), then their epilogue
    # and store. Both consume every ring slot in order (a slot is free once both have arrived), so a
    # ``ready`` wait never runs ahead of the slot's previous use
    STAGES: gl.constexpr = a_bufs.shape[0]
    PM: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    zero = gl.zeros([PM, BLOCK_N], gl.float32, acc_layout)
    k_steps = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    c = 0
    for t in range(gl.program_id(0), num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = _tile_coords(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = zero
        for kb in range(k_steps):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), _b_block(b_bufs, s, B_KMAJOR), acc, use_acc=kb > 0, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))
            if kb > 0:
                mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
            c += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
        off_m = pid_m * BLOCK_M + DM
        off_n = pid_n * BLOCK_N
        offs_m = off_m + gl.arange(0, PM, layout=gl.SliceLayout(1, acc_layout))
        offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{rows_epilogue}
        _store_tile(acc, c_smem, c_desc, off_m, off_n, 0)  # after this warpgroup's previous tile left c_smem
    tma.store_wait(0)


@gluon.jit
def gemm_rows_kernel(a_desc, a_lo_desc, b_desc, b_lo_desc, c_desc, c_lo_desc, bias_desc, {extra_ptrs}M, N, K, {extra_strides}
                     {extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     B_KMAJOR: gl.constexpr, M_LO: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     PDL: gl.constexpr):
    pdl_start(PDL)
    # two consumer warpgroups on one tile of a_desc's + M_LO rows, a row piece each (its A block through
    # a_desc / a_lo_desc, its store through c_desc / c_lo_desc) over one B block a K step: where a
    # program holds one tile, its epilogue runs on both warpgroups at once (the ping-pong kernel runs it
    # on one while the other has no tile). The arguments are the ping-pong kernel's (b_lo_desc and
    # bias_desc unused)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    a_lo_bufs = gl.allocate_shared_memory(a_lo_desc.dtype, [STAGES] + a_lo_desc.block_type.shape, a_lo_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_hi = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_lo = gl.allocate_shared_memory(c_lo_desc.dtype, c_lo_desc.block_type.shape, c_lo_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both warpgroups free a slot
    M_HI: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = M_HI + M_LO
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    TOP: gl.constexpr = 0
    NO_LO: gl.constexpr = 0
    NO_TMA_BIAS: gl.constexpr = False
    # fmt: off
    gl.warp_specialize([
        (_rows_consumer, (a_bufs, b_bufs, ready, empty, c_hi, c_desc, {extra_args}M, N, K, {extra_stride_args}{extra_flag_args}
                          NUM_PROGRAMS, GROUP_M, B_KMAJOR, BLOCK_M, TOP)),
        (_rows_consumer, (a_lo_bufs, b_bufs, ready, empty, c_lo, c_lo_desc, {extra_args}M, N, K, {extra_stride_args}{extra_flag_args}
                          NUM_PROGRAMS, GROUP_M, B_KMAJOR, BLOCK_M, M_HI)),
        (_loader, (a_desc, a_lo_desc, b_desc, b_desc, a_bufs, a_lo_bufs, b_bufs, b_bufs, ready, empty, M, N, K, BLOCK_N, NUM_PROGRAMS,
                   GROUP_M, B_KMAJOR, M_LO, NO_LO, a_desc, a_bufs, ready, empty, NO_TMA_BIAS)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    # fmt: on


@gluon.jit
def _coop_consumer(a_bufs, b_bufs, ready, empty, c_bufs, c_desc, {extra_ptrs}M, N, K, {extra_strides}
                   {extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, B_KMAJOR: gl.constexpr,
                   num_warps: gl.constexpr):
    # two warpgroups on one BLOCK_M x BLOCK_N tile, its columns as two accumulators (halves), so the
    # epilogue and the store run half a tile at a time (fewer live registers, two TMA stores)
    STAGES: gl.constexpr = a_bufs.shape[0]
    C_BUFS: gl.constexpr = c_bufs.shape[0]
    BLOCK_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    HALF: gl.constexpr = c_desc.block_type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HALF, 16])
    zero = gl.zeros([BLOCK_M, HALF], gl.float32, acc_layout)
    k_steps = gl.cdiv(K, BLOCK_K)
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, 2 * HALF)
    c = 0
    for t in range(gl.program_id(0), num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = _tile_coords(t, M, N, BLOCK_M, 2 * HALF, GROUP_M)
        acc0 = zero
        acc1 = zero
        for kb in range(k_steps):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            a = a_bufs.index(s)
            if B_KMAJOR:
                b0 = b_bufs.index(s).slice(0, HALF, dim=0).permute((1, 0))
                b1 = b_bufs.index(s).slice(HALF, HALF, dim=0).permute((1, 0))
            else:
                b0 = b_bufs.index(s).slice(0, HALF, dim=1)
                b1 = b_bufs.index(s).slice(HALF, HALF, dim=1)
            acc0 = warpgroup_mma(a, b0, acc0, use_acc=kb > 0, is_async=True)
            acc1 = warpgroup_mma(a, b1, acc1, use_acc=kb > 0, is_async=True)
            # this block's two groups in flight; the previous block's have retired: free its slot
            acc0, acc1 = warpgroup_mma_wait(2, deps=(acc0, acc1))
            if kb > 0:
                mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
            c += 1
        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
        mbarrier.arrive(empty.index((c - 1) % STAGES), count=1)
        off_m = pid_m * BLOCK_M
        offs_m = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        for h in gl.static_range(2):
            if h == 0:
                acc = acc0
            else:
                acc = acc1
            off_n = pid_n * 2 * HALF + h * HALF
            offs_n = off_n + gl.arange(0, HALF, layout=gl.SliceLayout(0, acc_layout))
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{epilogue_12}
            _store_tile(acc, c_bufs.index(h % C_BUFS), c_desc, off_m, off_n, C_BUFS - 1)
    tma.store_wait(0)


@gluon.jit
def gemm_coop_kernel(a_desc, b_desc, c_desc, {extra_ptrs}M, N, K, {extra_strides}
                     {extra_flags}NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     C_BUFS: gl.constexpr, B_KMAJOR: gl.constexpr, LOADER_REGS: gl.constexpr, PDL: gl.constexpr):
    pdl_start(PDL)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [C_BUFS] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    BLOCK_N: gl.constexpr = 2 * c_desc.block_type.shape[1]
    WARPS: gl.constexpr = gl.num_warps()
    NO_LO: gl.constexpr = 0
    NO_TMA_BIAS: gl.constexpr = False
    # fmt: off
    gl.warp_specialize([
        (_coop_consumer, (a_bufs, b_bufs, ready, empty, c_bufs, c_desc, {extra_args}M, N, K, {extra_stride_args}
                          {extra_flag_args}NUM_PROGRAMS, GROUP_M, B_KMAJOR, WARPS)),
        (_loader, (a_desc, a_desc, b_desc, b_desc, a_bufs, a_bufs, b_bufs, b_bufs, ready, empty, M, N, K, BLOCK_N, NUM_PROGRAMS,
                   GROUP_M, B_KMAJOR, NO_LO, NO_LO, a_desc, a_bufs, ready, empty, NO_TMA_BIAS)),
    ], [1], [LOADER_REGS])
    # fmt: on
{partition_source}
"""


FAST_EXPRS = {"gelu": "_gelu_fast({0})", "gelu_tanh": "_gelu_fast({0})"}
GELU_OPS = ("gelu", "gelu_tanh")


def gelu16_enabled() -> bool:
    """The f16x2 GELU (``_gelu_f16x2``) for fp16 outputs where the fast GELU applies; ``KFUSE_GELU16=0``
    keeps the fp32 form (``_gelu_fast``) everywhere."""
    return os.environ.get("KFUSE_GELU16", "1") != "0"


def gelu16_form(epi: Epilogue) -> tuple[str, int | None] | None:
    """How the epilogue can end in f16x2 (``gelu16``): ("bias_gelu", j) for exactly add(product,
    input j) then GELU; ("gelu", None) when GELU is its last step and its only GELU (the steps
    before stay fp32, the value is rounded to fp16 once, at the GELU); else None."""
    steps = epi.steps
    if not steps or steps[-1].op not in GELU_OPS or sum(s.op in GELU_OPS for s in steps) != 1:
        return None
    if steps[-1].args[0].kind != "reg" or steps[-1].args[0].index != len(steps) - 1:
        return None
    j = folded_input(epi)
    if len(steps) == 2 and j is not None:
        return "bias_gelu", j
    return "gelu", None


# where the ping-pong kernel reads a bias row: "epilogue" (kfuse's kernels) loads it beside the
# accumulator (16 four-byte loads a thread and a piece, no spills as the JIT specialises a launch: the
# 344 B of spills sessions 20-21 counted came from an offline compile without the row's stride 1). The others were
# measured slower on the H200 where a program holds many tiles (session 21, ``ws_power_probe.py``):
# "tma" has the loader warp bring each tile's row into a 4-slot ring of shared memory, which the
# epilogue reads in the accumulator's layout (no global loads, pointers or spills): 3-4% slower on BERT
# T16384 qkv / ffn1 and GPT-2 qkv, 1-3% faster on three BERT T4096 shapes (one to three tiles a program,
# within those shapes' run-to-run spread); "blocked" loads the row one column a thread and converts it
# through shared memory (the same pattern); "fold" starts the accumulator from it, 2-5% slower (session
# 20). Both spill-free forms read the row from shared memory, which the other consumer's wgmma and the
# TMA loads keep busy: the likely cost (not proven). "prefetch" (session 30) issues the row's loads at the
# tile's start, before the consumer's turn wait, so their latency hides behind the other consumer's main
# loop, and the 192 x 128 tile's two row pieces share them (half the LDG)

BIAS_MODES = ("epilogue", "fold", "blocked", "tma", "prefetch")
TMA_BIAS_SLOTS = 4  # bias mode "tma": rows in flight (the loader refills a slot four tiles on)


def folded_input(epi: Epilogue) -> int | None:
    """The extra input whose bias row the ping-pong kernel can add by starting the accumulator from
    it (``bias_mode`` "fold"): the epilogue's first step adds input j to the product and j is used
    nowhere else. Then, when j is a row (``XB<j>``), the epilogue skips the add and loads no bias."""
    if not epi.steps or epi.steps[0].op != "add":
        return None
    args = epi.steps[0].args
    kinds = sorted((a.kind, a.index) for a in args if a.kind in ("reg", "in"))
    if len(args) != 2 or [k for k, _ in kinds] != ["in", "reg"] or ("reg", 0) not in kinds:
        return None
    j = next(i for k, i in kinds if k == "in")
    used_later = any(a.kind == "in" and a.index == j for step in epi.steps[1:] for a in step.args)
    return None if used_later else j


# gelu_mix (the f16x2 GELU only): half of every tile's GELU values go through gelu_poly's polynomial on
# the FMA pipe instead of the MUFU. ``launch`` turns it on where a program holds one tile, whose epilogue
# runs with no main loop beside it, so the MUFU bounds it (session 30); session 31 measured BERT T4096
# attn_out 2.4% and ffn2 0.7% faster that way, and the many-tile shapes within -0.7..+0.7% (their
# epilogues share the FMA pipe with the other consumer's wgmma). A branch on the program's last tile
# (both epilogues in one kernel) measured no better there and up to 4% slower on the 128 x 128 tile.
_MUFU_PAIR = (  # %kf_h (f16x2, h = x / 2) -> $0 = h + h tanh(h (2 k0 + 8 k1 h^2)): the tanh form of _gelu_f16x2
    "mul.rn.f16x2 %kf_q, %kf_h, %kf_h; mov.b32 %kf_c, 0x34913491; mov.b32 %kf_k, 0x3E623E62; "
    "fma.rn.f16x2 %kf_q, %kf_q, %kf_c, %kf_k; mul.rn.f16x2 %kf_q, %kf_h, %kf_q; tanh.approx.f16x2 %kf_q, %kf_q; "
    "fma.rn.f16x2 $0, %kf_h, %kf_q, %kf_h;"
)
_HALF = "mov.b32 %kf_c, 0x38003800;"  # 0.5 in both halves


def _gelu16_source() -> str:
    """The generated module's f16x2 GELUs, all built on ``_MUFU_PAIR``: ``_gelu_f16x2`` and
    ``_bias_gelu_f16x2`` (every value on the MUFU's tanh) and their ``gelu_mix`` forms, which of every
    four values (``pack=4``: two f16x2 registers) send the second pair through ``gelu_poly``'s
    polynomial on the FMA pipe."""
    regs = ".reg .b32 %kf_h, %kf_q, %kf_c, %kf_k;"
    mix_regs = ".reg .b32 %kf_h, %kf_q, %kf_c, %kf_k, %kf_v; " + gelu_poly.PTX_REGS
    plain = f"{{ {regs} {_HALF} mul.rn.f16x2 %kf_h, $1, %kf_c; {_MUFU_PAIR} }}"
    bias = f"{{ {regs} {_HALF} fma.rn.f16x2 %kf_h, $1, %kf_c, $2; {_MUFU_PAIR} }}"
    mix = f"{{ {mix_regs} {_HALF} mul.rn.f16x2 %kf_h, $2, %kf_c; {_MUFU_PAIR} {gelu_poly.ptx_pair('$1', '$3')} }}"
    # (the second pair's h before _MUFU_PAIR, which reuses %kf_c)
    bias_mix = (f"{{ {mix_regs} {_HALF} fma.rn.f16x2 %kf_h, $2, %kf_c, $4; fma.rn.f16x2 %kf_v, $3, %kf_c, $5; "
                f"add.rn.f16x2 %kf_v, %kf_v, %kf_v; {_MUFU_PAIR} {gelu_poly.ptx_pair('$1', '%kf_v')} }}")  # fmt: skip
    return f"""
@gluon.jit
def _gelu_f16x2(x):
    # the tanh-form GELU of _gelu_fast, for an fp16 output, two values an instruction: the fp32 value
    # rounded to fp16 (the store's conversion, moved ahead), then HMUL2 / HFMA2 on f16x2 pairs and
    # tanh.approx.f16x2 (which ptxas splits into two MUFU.TANH.F16 on sm_90: one MUFU op a value, as the
    # fp32 form; session 30): 2.5 FMA-pipe instructions a value where
    # _gelu_fast takes 5. The FMA pipe is what an epilogue takes from the other consumer's wgmma
    # (session 18); tanh.approx.f32 is as coarse (2^-10.9) as the f16 one, so the error stays in
    # the same range (tests/kernels/test_fast_math.py emulates it)
    return gl.inline_asm_elementwise("{plain}", "=r,r", [x.to(gl.float16)], dtype=gl.float16, is_pure=True, pack=2)


@gluon.jit
def _bias_gelu_f16x2(x, row):
    # gelu(x + row) for an fp16 output, as _gelu_f16x2 with the add folded into the halving:
    # h = x / 2 + row / 2 in one HFMA2 (halving is exact, so this is (x + row) / 2 rounded once);
    # row / 2 is computed on the (1, N) row before it is broadcast
    x, half_row = gl.broadcast(x, (row.to(gl.float32) * 0.5).to(gl.float16))
    return gl.inline_asm_elementwise("{bias}", "=r,r,r", [x.to(gl.float16), half_row], dtype=gl.float16, is_pure=True, pack=2)


@gluon.jit
def _gelu_mix_f16x2(x):
    # _gelu_f16x2 with half the values on gelu_poly's polynomial (FMA pipe) instead of the MUFU
    return gl.inline_asm_elementwise("{mix}", "=r,=r,r,r", [x.to(gl.float16)], dtype=gl.float16, is_pure=True, pack=4)


@gluon.jit
def _bias_gelu_mix_f16x2(x, row):
    # _bias_gelu_f16x2 with half the values on gelu_poly's polynomial: h = x / 2 + row / 2, v = 2 h
    x, half_row = gl.broadcast(x, (row.to(gl.float32) * 0.5).to(gl.float16))
    return gl.inline_asm_elementwise("{bias_mix}", "=r,=r,r,r,r,r", [x.to(gl.float16), half_row], dtype=gl.float16, is_pure=True,
                                     pack=4)
"""


def _epilogue(
    epi: Epilogue,
    indent: str,
    fast_gelu: bool = False,
    mode: str = "epilogue",
    piece: tuple[str, str, str] = (),
    last_piece: bool = True,
    gelu16: bool = False,
    gelu_mix: bool = False,
) -> str:
    """The epilogue in the accumulator's layout: extra input j as a (1, BLOCK_N) row when it is the
    same for every row (``XB<j>``: a bias), else as a tile; then the rendered steps. ``mode``
    (ping-pong only): "epilogue" loads a row here; "blocked" loads it one column a thread and moves
    it into the accumulator's layout through shared memory (``piece``: the names of the piece's
    first column, width and layout); "fold" skips the first step's add of a row the accumulator
    started from (``folded_input``); "tma" reads the row the loader brought into ``bias_bufs`` and,
    in the tile's ``last_piece``, frees its slot at once (fewer registers live through the steps).
    ``gelu16`` (an fp16 output, the fast GELU): the GELU, and the bias add before it, on f16x2 pairs
    (``gelu16_form``); the tile leaves the epilogue as fp16. ``gelu_mix`` (with ``gelu16``): half the
    GELU's values on the FMA pipe (``_gelu16_source``)."""
    folded = folded_input(epi) if mode == "fold" else None
    tma_row = folded_input(epi) if mode == "tma" else None
    tile = "gl.load(x{j}_ptr + offs_m[:, None] * stride_x{j}m + offs_n[None, :] * stride_x{j}n, mask=mask)"
    lines = []
    for j in range(epi.n_inputs):
        if j == folded:
            continue
        if j == tma_row:  # the loader brought this tile's bias row into bias_bufs (the kernel runs only with XB<j>)
            lines += [f"{indent}mbarrier.wait(bias_ready.index(i % BIAS_SLOTS), (i // BIAS_SLOTS) & 1)",
                      f"{indent}x{j} = bias_bufs.index(i % BIAS_SLOTS).load({piece[2]})"]  # fmt: skip
            if last_piece:  # (the arrive follows a warpgroup barrier: every thread has read the row)
                lines.append(f"{indent}mbarrier.arrive(bias_free.index(i % BIAS_SLOTS), count=1)")
            continue
        load_row = f"gl.load(x{j}_ptr + offs_n * stride_x{j}n, mask=offs_n < N)[None, :]"
        if mode == "prefetch":  # loaded at the tile's start (``_tile_start``)
            load_row = f"x{j}_pre" + ("_lo" if piece[2] == "lo_layout" else "")
        if mode == "blocked":
            off, width, layout = piece
            load_row = f"_row_blocked(x{j}_ptr, stride_x{j}n, {off}, N, {width}, {layout})"
        lines += [f"{indent}if XB{j}:", f"{indent}    x{j} = {load_row}", f"{indent}else:", f"{indent}    x{j} = {tile.format(j=j)}"]
    form = gelu16_form(epi) if gelu16 and fast_gelu else None
    exprs = FAST_EXPRS if fast_gelu else None
    suffix = "_mix_f16x2" if gelu_mix else "_f16x2"
    if form is not None:
        exprs = {op: f"_gelu{suffix}({{0}})" for op in GELU_OPS}
    body = render(epi, indent=indent, exprs=exprs)
    if form is not None and form[0] == "bias_gelu" and folded is None:
        body = f"{indent}acc = _bias_gelu{suffix}(acc, x{form[1]})"
    if body and folded is not None:
        first, _, rest = body.partition("\n")  # the first step: acc_r1 = (acc + x<j>)
        j = folded
        lines += [f"{indent}if XB{j}:", f"{indent}    acc_r1 = acc  # the bias row is in the accumulator", f"{indent}else:",
                  f"{indent}    x{j} = {tile.format(j=j)}", f"{indent}    {first.strip()}"]  # fmt: skip
        body = rest
    if body:
        lines.append(body)
    return "\n".join(lines) if lines else f"{indent}pass"


def _tile_start(epi: Epilogue, mode: str) -> tuple[str, str]:
    """The ping-pong consumer's ``FIRST_K`` (the first K step that accumulates into the initial
    value) and the statements at a tile's start, before the turn wait (this consumer's accumulators
    are dead then): "fold" starts the accumulators from the bias row."""
    no_fold = "    FIRST_K: gl.constexpr = 1"
    j = folded_input(epi)
    if mode == "fold" and j is not None:
        first = f"    FIRST_K: gl.constexpr = 0 if XB{j} else 1  # a bias row starts the accumulator"
        init = "\n".join([
            f"        if XB{j}:",
            f"            acc = gl.broadcast(_bias_row(x{j}_ptr, stride_x{j}n, off_n, N, N_HI, acc_layout), acc)[0]",
            "            if HAS_LO:",
            f"                acc_lo = gl.broadcast(_bias_row(x{j}_ptr, stride_x{j}n, off_n + LO_DN, N, LO_N, lo_layout), acc_lo)[0]",
        ])  # fmt: skip
        return first, init
    if mode == "prefetch":  # every bias row's loads issued before the turn wait, where the other consumer's
        # main loop hides their latency (the epilogue, run after this consumer's main loop, waits for none)
        lines = []
        for j in range(epi.n_inputs):
            hi = f"_row(x{j}_ptr, stride_x{j}n, off_n, N, N_HI, acc_layout)"
            lo = f"_row(x{j}_ptr, stride_x{j}n, off_n + LO_DN, N, LO_N, lo_layout)"
            lines += [f"        if XB{j}:", f"            x{j}_pre = {hi}", "            if HAS_LO:", f"                x{j}_pre_lo = {lo}"]
        return no_fold, "\n".join(lines) if lines else "        pass"
    return no_fold, "        pass"


@dataclass(frozen=True)
class WorkerPartition:
    """Another kernel's work run by extra warps of the ping-pong kernel, beside its GEMM (Aker's
    horizontal fusion with per-kernel resources: ``kfuse.colocate.ws_partition``). ``source``: the
    Gluon function(s); ``params``: the kernel's extra parameters, written ``name, NAME: gl.constexpr``
    and passed as keywords at a launch; ``call``: the ``warp_specialize`` entry, ``(fn, (args...))``
    (the GEMM's ``NUM_PROGRAMS`` is in scope); ``warps`` / ``regs``: the partition's warps and its
    registers a thread after ``setmaxnreg`` (the GEMM's consumers keep what is left of 64 K)."""

    key: str
    source: str
    params: str
    call: str
    warps: int
    regs: int
    arg_types: dict[str, str]  # the runtime parameters' Triton types ("*i32", "i32"), for compile_offline
    constexprs: dict[str, Any]  # the constexpr parameters' values
    loader_regs: int = LOADER_REGS  # the loader warp's registers beside this partition (24 leaves the consumers 16 more)
    # runtime parameters that change from launch to launch (a slice's block range): not specialised, or a new value's
    # divisibility by 16 (or a 1) would compile another variant inside a timed launch
    unspecialized: tuple[str, ...] = ()
    # Gluon statements in the kernel's body before ``warp_specialize``: the partition's shared memory and mbarriers, which
    # ``call`` then passes in, allocated and initialised as the GEMM's own before any partition starts
    setup: str = ""

    def consumer_regs(self) -> int:
        """The GEMM's second consumer warpgroup's registers a thread beside this partition: an even split between
        the two consumers of what the loader and this partition leave of the SM's 64 K (a multiple of 8, at most
        CONSUMER_REGS). ``setmaxnreg`` acts on whole warpgroups, so Triton pads the one-warp loader and a partition
        of fewer than 4 warps to 4; registers over 64 K would leave a warpgroup spinning in its allocation."""
        left = 65536 - 128 * self.loader_regs - 128 * -(-self.warps // 4) * self.regs
        return min(CONSUMER_REGS, left // 256 // 8 * 8)


def kernel_source(epi: Epilogue, fast_gelu: bool = False, bias_mode: str = "epilogue", gelu16: bool = False,
                  gelu_mix: bool = False, partition: WorkerPartition | None = None) -> str:  # fmt: skip
    """The Gluon module of the kernels specialised to ``epi`` (``fast_gelu``: GELU in the tanh form
    on ``tanh.approx.f32``, or with ``gelu16`` on f16x2 pairs for an fp16 output; ``bias_mode``: where
    the ping-pong kernel reads a bias row, ``BIAS_MODES``; ``gelu_mix``: the ping-pong kernel sends half
    its f16x2 GELU values to the FMA pipe; ``partition``: a third worker partition in the ping-pong kernel)."""
    if bias_mode not in BIAS_MODES:
        raise ValueError(f"bias_mode {bias_mode!r}: one of {BIAS_MODES}")
    if gelu_mix and bias_mode == "fold":
        raise ValueError("gelu_mix applies to the f16x2 GELU after a bias add; bias_mode 'fold' removes that add")
    n = epi.n_inputs
    first_k, tile_start = _tile_start(epi, bias_mode)
    tma_row = folded_input(epi) if bias_mode == "tma" else None
    marker = "" if tma_row is None else f"\nBIAS_TMA_INPUT = {tma_row}  # run_module passes extra input {tma_row} as a TMA row\n"
    return marker + _SOURCE.format(
        extra_ptrs="".join(f"x{j}_ptr, " for j in range(n)),
        extra_strides="".join(f"stride_x{j}m, stride_x{j}n, " for j in range(n)),
        extra_flags="".join(f"XB{j}: gl.constexpr, " for j in range(n)),
        extra_args="".join(f"x{j}_ptr, " for j in range(n)),
        extra_stride_args="".join(f"stride_x{j}m, stride_x{j}n, " for j in range(n)),
        extra_flag_args="".join(f"XB{j}, " for j in range(n)),
        epilogue_12=_epilogue(epi, " " * 12, fast_gelu, gelu16=gelu16),
        rows_epilogue=_epilogue(epi, " " * 8, fast_gelu, gelu16=gelu16),
        pp_epilogue=_epilogue(epi, " " * 8, fast_gelu, bias_mode, ("off_n", "N_HI", "acc_layout"), gelu16=gelu16, gelu_mix=gelu_mix),
        pp_epilogue_12=_epilogue(
            epi, " " * 12, fast_gelu, bias_mode, ("off_n + LO_DN", "LO_N", "lo_layout"), last_piece=False, gelu16=gelu16, gelu_mix=gelu_mix
        ),
        gelu16_fns=_gelu16_source(),
        first_k=first_k,
        acc_init=tile_start,
        bias_tma=tma_row is not None,
        bias_slots=TMA_BIAS_SLOTS,
        pingpong_jit="" if partition is None or not partition.unspecialized else f"(do_not_specialize={list(partition.unspecialized)!r})",
        partition_params="" if partition is None else ", " + partition.params,
        partition_entry="" if partition is None else f"\n        {partition.call},",
        partition_warps="" if partition is None else f", {partition.warps}",
        partition_regs="" if partition is None else f", {partition.regs}",
        partition_source="" if partition is None else partition.source,
        partition_setup="" if partition is None or not partition.setup else "\n" + partition.setup.rstrip("\n"),
    )


def module(epi: Epilogue, fast_gelu: bool = False, bias_mode: str = "epilogue", gelu16: bool = False, gelu_mix: bool = False,
           partition: WorkerPartition | None = None) -> Any:  # fmt: skip
    gelu16 = gelu16 and fast_gelu and gelu16_form(epi) is not None
    gelu_mix = gelu_mix and gelu16
    key = epi.key() + ("_fastgelu" if fast_gelu else "") + ("_gelu16" if gelu16 else "")
    key += "" if bias_mode == "epilogue" else f"_{bias_mode}"
    key += "_mix" if gelu_mix else ""
    key += "" if partition is None else f"_with_{partition.key}"
    return generated("gemm_ws", key, lambda: kernel_source(epi, fast_gelu, bias_mode, gelu16, gelu_mix, partition))


@dataclass(frozen=True)
class WsConfig:
    """A warp-specialised kernel's schedule and tile. ``pingpong``: two consumer warpgroups on
    alternate ``block_m x block_n`` tiles (4 warps each, the accumulator at most 192 registers a
    thread); ``shared_c``: the two consumers stage their tiles' TMA stores in one set of buffers,
    which leaves the ring a stage more. ``coop``: two warpgroups on one ``block_m x block_n`` tile
    (8 warps, block_m 128), held as two column halves; ``c_bufs`` staging buffers for the halves'
    TMA stores. ``rows``: two warpgroups on one ``block_m x block_n`` tile (block_m 192 or 256), a row
    piece each (128 and the rest) over one B block a K step, so a program's last tile's epilogue runs
    on both (one store buffer a piece)."""

    schedule: str = "pingpong"  # "pingpong" | "coop" | "rows"
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    group_m: int = 8
    c_bufs: int = 2  # coop only
    shared_c: bool = False  # ping-pong only

    @property
    def store_n(self) -> int:
        """Columns of one TMA store (the coop kernel stores half tiles; a ping-pong tile whose width is
        not a power of two stores its ``pieces`` one after the other)."""
        return self.block_n // 2 if self.schedule == "coop" else self.pieces[0]

    @property
    def pieces(self) -> tuple[int, int]:
        """A ping-pong tile's columns as (hi, lo), both powers of two (Gluon's tensor shapes are): 192
        -> (128, 64); lo = 0 for a power-of-two width. The pieces are two accumulators, two B buffers
        per ring slot and two TMA stores; the width is what wave quantization needs (BERT-base's
        N = 768 is four 192-wide tiles). The coop kernel's tile is one piece."""
        if self.schedule in ("coop", "rows"):
            return self.block_n, 0
        hi = 1 << (self.block_n.bit_length() - 1)
        return hi, self.block_n - hi

    @property
    def row_pieces(self) -> tuple[int, int]:
        """A ping-pong tile's rows as (hi, lo) in the same way: a 192 x 128 tile is a 128 x 128 and a
        64 x 128 accumulator, two A buffers per ring slot (both read with the same B block: three
        m64n128 wgmma a K step where 128 x 192 issues two m64n128 and two m64n64) and two TMA stores."""
        if self.schedule == "coop":
            return self.block_m, 0
        if self.schedule == "rows":  # a warpgroup's piece: at most 128 rows (128 accumulator registers)
            return 128, self.block_m - 128
        hi = 1 << (self.block_m.bit_length() - 1)
        return hi, self.block_m - hi

    def smem_bytes(self, elem: int = 2) -> int:
        """Shared memory of one program: the ring of A and B slots, the C staging buffers (one per
        consumer, one set with ``shared_c``, or ``c_bufs``) and the mbarriers."""
        ring = self.stages * (self.block_m * self.block_k + self.block_k * self.block_n)
        if self.schedule == "pingpong":
            staged = (1 if self.shared_c else 2) * self.block_n
        elif self.schedule == "rows":  # one store buffer a row piece: the tile once
            staged = self.block_n
        else:
            staged = self.c_bufs * self.store_n
        return elem * (ring + self.block_m * staged) + 16 * self.stages + 64

    def describe(self) -> str:
        s = f"{self.schedule} {self.block_m}x{self.block_n}x{self.block_k} s{self.stages} g{self.group_m}"
        if self.schedule == "coop":
            return s + f" c{self.c_bufs}"
        return s + (" sc" if self.shared_c else "")


def ws_config(cfg: Any, elem: int = 2) -> WsConfig:
    """The ``WsConfig`` of a ``GemmConfig`` with ``ws`` set: its tile, stages and swizzle; the coop
    kernel stages both output halves (two buffers) where shared memory allows, else one."""
    shared = bool(getattr(cfg, "shared_c", False))
    ws = WsConfig(cfg.ws, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages, cfg.group_m, 2, shared)
    if ws.schedule == "coop" and ws.smem_bytes(elem) > SMEM_LIMIT:
        ws = WsConfig(cfg.ws, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages, cfg.group_m, 1, shared)
    return ws


def _tma_row_layout(dtype: torch.dtype) -> Any:
    # the bias row's slots are one row each: no swizzle (a 128-byte swizzle would need 8 rows)
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * dtype.itemsize, rank=2)


def tma_bias_ineligible(extras: list[torch.Tensor], j: int, cfg: WsConfig) -> str | None:
    """Why extra input ``j`` (a 3-D view, one batch) cannot reach the ping-pong kernel's epilogue by
    TMA (bias mode "tma"), or None: it must be a row (stride 0 over the rows), contiguous, 16-byte
    aligned, with the row's bytes a multiple of 16, and the tile's columns one piece."""
    if j >= len(extras):
        return f"the epilogue has no extra input {j}"
    e = extras[j][0]
    n = e.shape[1]
    if cfg.schedule != "pingpong" or cfg.pieces[1]:
        return "only the ping-pong kernel with a power-of-two tile width reads a TMA row"
    if e.stride(0) != 0:
        return f"extra input {j} is not a row (strides {tuple(e.stride())})"
    if e.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"extra input {j} is {e.dtype}"
    if (n > 1 and e.stride(1) != 1) or e.data_ptr() % 16 or (n * e.element_size()) % 16:
        return f"TMA cannot describe extra input {j} as a row ({n} columns, stride {e.stride(1)}, address {e.data_ptr() % 16} mod 16)"
    return None


def ws_eligible(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, split_k: int = 1) -> str | None:
    """Why the warp-specialised kernels cannot run the 3-D call ``a`` (B, M, K) @ ``b`` (B, K, N) -> ``c``,
    or None when it can."""
    if interpreting() or a.device.type != "cuda":
        return "the warp-specialised kernels are Gluon, which runs only on a GPU"
    if torch.cuda.get_device_capability(a.device) != (9, 0):
        return "the warp-specialised kernels use sm_90 wgmma and TMA"
    if a.shape[0] != 1:
        return "the warp-specialised kernels run one batch"
    if split_k > 1:
        return "the warp-specialised kernels have no split-K"
    if a.dtype not in WS_DTYPES or b.dtype != a.dtype or c.dtype not in WS_DTYPES:
        return f"the warp-specialised kernels take fp16/bf16 (got {a.dtype}, {b.dtype} -> {c.dtype})"
    for name, t in (("A", a[0]), ("C", c[0])):
        if t.stride(1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return f"TMA cannot describe {name} (strides {tuple(t.stride())})"
    b2 = b[0]
    if b2.data_ptr() % 16 or not any(b2.stride(1 - d) == 1 and (b2.stride(d) * b2.element_size()) % 16 == 0 for d in (0, 1)):
        return f"TMA cannot describe B (strides {tuple(b2.stride())})"
    return None


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, cfg: WsConfig,
           num_programs: int, warmup: bool = False, fast_gelu: bool = False, bias_mode: str = "prefetch",
           gelu_mix: bool | None = None, partition: WorkerPartition | None = None,
           partition_args: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Run ``c = epi(a @ b, *extras)`` on 3-D views with one batch (``ws_eligible``) with the
    schedule and tile of ``cfg``; ``num_programs``: the persistent grid (one per SM). ``warmup``:
    compile only. ``bias_mode``: where the ping-pong kernel reads a bias row (``BIAS_MODES``; "prefetch" by
    default); "tma" falls back to "epilogue" where the row cannot come by TMA (``launch_bias_mode``).
    ``gelu_mix``: half the f16x2 GELU's values on the FMA pipe; by default where every program holds
    at most one tile (``mix_gelu_by_default``). ``partition``: another kernel's blocks beside the GEMM in the
    ping-pong kernel (``WorkerPartition``), its runtime arguments in ``partition_args``."""
    if bias_mode == "tma":
        bias_mode = launch_bias_mode(epi, extras, cfg, a.element_size())
    gelu16 = c.dtype == torch.float16 and gelu16_enabled()
    if gelu_mix is None:
        gelu_mix = mix_gelu_by_default(a.shape[1], b.shape[2], cfg, num_programs)
    mod = module(epi, fast_gelu, bias_mode, gelu16, gelu_mix, partition)
    run_module(mod, a, b, c, extras, cfg, num_programs, warmup, partition, partition_args)


def mix_gelu_by_default(m: int, n: int, cfg: WsConfig, num_programs: int) -> bool:
    """``launch``'s ``gelu_mix`` policy: on where the ping-pong kernel gives each program at most one
    tile, so no main loop runs beside any epilogue and the MUFU bounds it (see ``_gelu16_source``)."""
    return cfg.schedule == "pingpong" and cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) <= num_programs


def launch_bias_mode(epi: Epilogue, extras: list[torch.Tensor], cfg: WsConfig, elem: int = 2) -> str:
    """How ``launch(..., bias_mode="tma")`` reads the epilogue's bias row: "tma" (the loader warp
    brings each tile's row into a ring of shared memory: no global loads, pointers or spills in the
    epilogue) where the row is TMA-describable and its ring fits beside the config's, else "epilogue"."""
    j = folded_input(epi)
    if j is None or tma_bias_ineligible(extras, j, cfg):
        return "epilogue"
    return "tma" if cfg.smem_bytes(elem) + tma_bias_smem(cfg, extras[j].element_size()) <= SMEM_LIMIT else "epilogue"


def tma_bias_smem(cfg: WsConfig, bias_elem: int = 2) -> int:
    """Shared memory of bias mode "tma" beside ``cfg.smem_bytes()``: the rows' ring and its barriers."""
    return TMA_BIAS_SLOTS * (cfg.block_n * bias_elem + 16)


def run_module(mod: Any, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, extras: list[torch.Tensor], cfg: WsConfig,
               num_programs: int, warmup: bool = False, partition: WorkerPartition | None = None,
               partition_args: dict[str, Any] | None = None) -> None:  # fmt: skip
    """``launch`` with the generated module given (experiments time variants of its source); ``partition``: the
    module's worker partition (``module(..., partition=)``), its runtime arguments in ``partition_args``."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if partition is not None and cfg.schedule != "pingpong":
        raise ValueError(f"a worker partition runs in the ping-pong kernel only, not {cfg.schedule!r}")
    a2, b2, c2 = a[0], b[0], c[0]
    m, k = a2.shape
    n = b2.shape[1]
    tdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}

    def desc(t: torch.Tensor, block: list[int]) -> Any:
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, tdt[t.dtype]))

    b_kmajor = b2.stride(1) != 1  # column-major B: described as B^T (N, K)
    hi, lo = cfg.pieces
    m_hi, m_lo = cfg.row_pieces
    a_desc = desc(a2, [m_hi, cfg.block_k])
    a_lo_desc = desc(a2, [m_lo, cfg.block_k]) if m_lo else a_desc
    b_desc = desc(b2.t(), [hi, cfg.block_k]) if b_kmajor else desc(b2, [cfg.block_k, hi])
    c_desc = desc(c2, [m_hi, cfg.store_n])
    b_lo_desc, c_lo_desc = b_desc, c_desc
    if lo:
        b_lo_desc = desc(b2.t(), [lo, cfg.block_k]) if b_kmajor else desc(b2, [cfg.block_k, lo])
        c_lo_desc = desc(c2, [cfg.block_m, lo])
    elif m_lo:
        c_lo_desc = desc(c2, [m_lo, cfg.block_n])
    bias_desc = c_desc
    j = getattr(mod, "BIAS_TMA_INPUT", None)
    if j is not None:
        why = tma_bias_ineligible(extras, j, cfg)
        if why:
            raise ValueError(f"bias mode 'tma': {why}")
        row = extras[j][0].as_strided((1, n), (n, 1))
        bias_desc = TensorDescriptor.from_tensor(row, [1, hi], _tma_row_layout(row.dtype))
    ex: list[Any] = []
    ex_strides: list[int] = []
    flags = {}
    for j, e in enumerate(extras):
        ex.append(e[0])
        ex_strides += [e.stride(1), e.stride(2)]
        flags[f"XB{j}"] = e.stride(1) == 0
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    # with a worker partition every program runs its share of the other kernel, tiles or none
    grid = num_programs if partition is not None else max(1, min(num_programs, tiles))
    meta: dict[str, Any] = dict(NUM_PROGRAMS=grid, GROUP_M=cfg.group_m, STAGES=cfg.stages, B_KMAJOR=b_kmajor, **flags)
    meta["LOADER_REGS"] = LOADER_REGS
    if cfg.schedule in ("pingpong", "rows"):
        kernel, warps = mod.gemm_pingpong_kernel, 4
        args: tuple[Any, ...] = (a_desc, a_lo_desc, b_desc, b_lo_desc, c_desc, c_lo_desc, bias_desc, *ex, m, n, k, *ex_strides)
        meta.update(M_LO=m_lo, CONSUMER_REGS=CONSUMER_REGS)
        if cfg.schedule == "rows":
            kernel = mod.gemm_rows_kernel
        else:
            meta.update(N_LO=lo, SHARED_C=cfg.shared_c)
            if partition is not None:
                meta.update(CONSUMER_REGS=partition.consumer_regs(), LOADER_REGS=partition.loader_regs, **partition.constexprs,
                            **(partition_args or {}))  # fmt: skip
    else:
        kernel, warps = mod.gemm_coop_kernel, 8
        args = (a_desc, b_desc, c_desc, *ex, m, n, k, *ex_strides)
        meta["C_BUFS"] = cfg.c_bufs
    meta.update(pdl.launch_kwargs())
    if warmup:
        kernel.warmup(*args, grid=(grid,), num_warps=warps, **meta)
    else:
        kernel[(grid,)](*args, num_warps=warps, **meta)


def compile_offline(epi: Epilogue, m: int, n: int, k: int, cfg: WsConfig, num_programs: int = 132, b_kmajor: bool = False,
                    row_broadcast: tuple[bool, ...] = (), dtype: torch.dtype = torch.float16, fast_gelu: bool = False,
                    bias_mode: str = "epilogue", pdl_wait: bool = False, gelu16: bool = False, gelu_mix: bool = False,
                    partition: WorkerPartition | None = None) -> Any:  # fmt: skip
    """Compile the kernel for sm_90 without a GPU (``triton.compile`` on the Gluon source) and return
    Triton's ``CompiledKernel`` (``.asm["sass"]`` needs ``nvdisasm``, which the Triton wheel carries).
    ``row_broadcast[j]``: extra input j is a bias row (``XB<j>``); ``bias_mode``: ``BIAS_MODES``;
    ``gelu_mix``: half the f16x2 GELU's values on the FMA pipe; ``partition``: a worker partition beside the
    ping-pong kernel's GEMM."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    tdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[dtype]

    def desc(shape: tuple[int, int], block: list[int]) -> Any:
        t = torch.empty(shape, dtype=dtype)
        return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, tdt))

    coop = cfg.schedule == "coop"
    hi, lo = cfg.pieces
    m_hi, m_lo = cfg.row_pieces
    a_d = desc((m, k), [m_hi, cfg.block_k])
    a_lo = desc((m, k), [m_lo, cfg.block_k]) if m_lo else a_d
    b_d = desc((n, k), [hi, cfg.block_k]) if b_kmajor else desc((k, n), [cfg.block_k, hi])
    c_d = desc((m, n), [m_hi, cfg.store_n])
    b_lo = (desc((n, k), [lo, cfg.block_k]) if b_kmajor else desc((k, n), [cfg.block_k, lo])) if lo else b_d
    c_lo = desc((m, n), [cfg.block_m, lo]) if lo else (desc((m, n), [m_lo, cfg.block_n]) if m_lo else c_d)
    if partition is not None and cfg.schedule != "pingpong":
        raise ValueError(f"a worker partition runs in the ping-pong kernel only, not {cfg.schedule!r}")
    mod = module(epi, fast_gelu, bias_mode, gelu16 and dtype == torch.float16, gelu_mix, partition)
    rows = cfg.schedule == "rows"
    fn = mod.gemm_coop_kernel if coop else (mod.gemm_rows_kernel if rows else mod.gemm_pingpong_kernel)
    ptr = "*fp16" if dtype == torch.float16 else "*bf16"
    sig: dict[str, str] = {"a_desc": mangle_type(a_d)}
    if not coop:
        sig["a_lo_desc"] = mangle_type(a_lo)
    sig["b_desc"] = mangle_type(b_d)
    if not coop:
        sig["b_lo_desc"] = mangle_type(b_lo)
    sig["c_desc"] = mangle_type(c_d)
    if not coop:
        sig["c_lo_desc"] = mangle_type(c_lo)
        bias_d = c_d
        if getattr(mod, "BIAS_TMA_INPUT", None) is not None:
            bias_d = TensorDescriptor.from_tensor(torch.empty((1, n), dtype=dtype), [1, hi], _tma_row_layout(dtype))
        sig["bias_desc"] = mangle_type(bias_d)
    for j in range(epi.n_inputs):
        sig[f"x{j}_ptr"] = ptr
    sig.update(M="i32", N="i32", K="i32")
    # as the JIT specialises a launch (``launch``): a contiguous input's column stride 1 is a constexpr,
    # a row's row stride 0 and 16-divisible sizes carry the divisibility hint, so the offline code is
    # the code that runs (the bias row's loads vectorise only with its stride known)
    hinted = [name for name, size in (("M", m), ("N", n), ("K", k)) if size % 16 == 0]
    constexprs: dict[str, Any] = {}
    for j in range(epi.n_inputs):
        is_row = j < len(row_broadcast) and bool(row_broadcast[j])
        sig[f"stride_x{j}m"] = "i32"
        hinted += [f"x{j}_ptr"] + ([f"stride_x{j}m"] if is_row or n % 16 == 0 else [])
        constexprs[f"stride_x{j}n"] = 1
    constexprs.update({f"XB{j}": bool(row_broadcast[j]) if j < len(row_broadcast) else False for j in range(epi.n_inputs)})
    # in the kernels' argument order
    constexprs.update(NUM_PROGRAMS=num_programs, GROUP_M=cfg.group_m, STAGES=cfg.stages, **({"C_BUFS": cfg.c_bufs} if coop else {}))
    constexprs["B_KMAJOR"] = b_kmajor
    if not coop:
        constexprs.update(M_LO=m_lo, **({} if rows else {"N_LO": lo, "SHARED_C": cfg.shared_c}))
    constexprs["LOADER_REGS"] = LOADER_REGS
    if not coop:
        constexprs["CONSUMER_REGS"] = CONSUMER_REGS
    constexprs["PDL"] = pdl_wait
    if partition is not None:
        constexprs.update(CONSUMER_REGS=partition.consumer_regs(), LOADER_REGS=partition.loader_regs)
        sig.update(partition.arg_types)
        constexprs.update(partition.constexprs)
    for name in constexprs:
        sig[name] = "constexpr"
    sig = {name: sig[name] for name in fn.arg_names}  # the kernel's argument order
    keyed = {(fn.arg_names.index(name),): v for name, v in constexprs.items()}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in hinted}
    src = GluonASTSource(fn, sig, keyed, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8 if coop else 4})
