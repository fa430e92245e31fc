"""GEMM template with a generated epilogue: C = epilogue(A @ B, extra inputs...).

A is (M, K) and B is (K, N), either with any strides (row- or column-major, transposed views
need no copy), optionally batched (a leading batch dimension, broadcast by a zero stride).
Accumulation is fp32. The epilogue (bias, activation, residual, scale, casts, ...) is rendered
from an ``Epilogue`` program into the kernel source, so every combination is its own
specialised kernel; sources are written to the kernel cache and imported (Triton needs kernels
to live in files).

Three pointer-based variants share one main loop (``_mainloop``, cp.async loads on sm_80+):

* ``gemm_kernel``: one program per output tile, grouped (swizzled) tile order for L2 reuse;
  with ``SPLIT_K > 1`` each program reduces one slice of K into an fp32 workspace and
  ``splitk_reduce_kernel`` sums the slices and applies the epilogue (small M*N, large K).
* ``gemm_persistent_kernel``: a fixed grid of ``NUM_PROGRAMS`` (= number of SMs) programs that
  loop over tiles, for Hopper where launch/tail effects matter on mid-size problems.

and two for Hopper that load the A and B tiles by TMA (host-side tensor descriptors, made per
call), with the same generated epilogue:

* ``gemm_tma_kernel``: one program per output tile (``GemmConfig.tma``); 10-18% faster than
  ``gemm_kernel`` on the H200.
* ``gemm_tma_persistent_kernel`` (``tma`` and ``persistent``): ``NUM_PROGRAMS`` (= number of
  SMs) programs loop over the (batch, tile) space with ``tl.range(flatten=, warp_specialize=)``
  so that, with K only a few blocks (BERT/GPT-2: K=768), the next tile's loads overlap this
  tile's epilogue. Its options are compile hints (``flatten``, ``warp_specialize``,
  ``epilogue_subtile``). On the H200 (one run of ``benchmarks/experiments/gemm_ws_probe.py``)
  the flattened loop is 5-15% faster than ``gemm_tma_kernel`` at K=768; Triton 3.6's Hopper warp
  specialisation takes effect only with num_warps=4 and without ``flatten``, deadlocks with
  BLOCK_M > 64 and is 1.7-2x slower than the flattened loop on 64-row tiles (the limits are hard
  rules in ``kfuse.tune.space``).

* ``gemm_tma_resident_kernel`` (``tma`` and ``resident_b``): for GEMMs whose whole K is one tile
  (K <= 256) and one batch: each program loads its B column block once and keeps it in shared
  memory, then streams A's row tiles through ``num_stages`` TMA buffers. On the H200 (session 14,
  ``benchmarks/experiments/resident_gemm_probe.py``) 64x128x256 s4 ran M=262144 x 256 x 256 with
  bias + ReLU in 79-84 us, against 87-96 for cuBLASLt with the epilogue; at M=1M it ties the
  library (~3.2 TB/s). ``resident_smem_bytes`` is its shared memory, which decides its stages.

Two block functions hold one tile of the pointer and TMA kernels each, with ``bid`` in place of the tile index:
``gemm_tile`` and ``gemm_tma_tile``. They are the persistent-thread-block form of this template that co-location
(``kfuse.colocate.plan_gemm``) runs over any tile range, alone or fused beside a best-effort kernel's blocks.

A ``GemmConfig`` with ``ws`` set runs one of the Gluon warp-specialised kernels of ``gemm_ws.py``
(a loader warp and consumer warpgroups; ping-pong or cooperative) with the same generated epilogue,
where they can run (sm_90, one batch, TMA-describable operands and output); elsewhere its tile runs
on ``gemm_tma_persistent_kernel``.

The TMA kernels are used only when TMA can describe the operands (``tma_operands``: A K-contiguous, B row-
or column-major, 16-byte aligned base and leading strides, fp16/bf16/fp32) and without split-K;
otherwise ``launch`` runs the matching pointer kernel. Both also store the output tile by TMA
(``TMA_STORE``: ``c_desc.store``, a host descriptor of C's exact shape, 3-D for batched C; TMA
clips ragged tiles, so no mask) when TMA can describe C (``tma_output``: the same checks), else
by pointers. The extra inputs are loaded by pointers either way. The persistent kernel stages the
stored tile in shared memory next to its live pipeline buffers (``kfuse.tune.space`` counts it);
offline sm_90 compiles (``benchmarks/experiments/gemm_store_sass.py``) show 1-3% fewer hot-loop
instructions than the (vectorised) pointer store and, on 128-row tiles without the subtiled
epilogue, 38-64 fewer registers/thread; not yet timed on a GPU.

Tile parameters (BLOCK_M/N/K, GROUP_M, num_warps, num_stages, split-K, persistent, tma and the
persistent TMA kernel's hints) are template parameters chosen by the tuner (``kfuse.tune``);
``default_config`` gives a shape-based choice when nothing was tuned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from kfuse.kernels import gemm_ws, pdl
from kfuse.kernels.codegen import cdiv, generated, interpreting, num_sms
from kfuse.kernels.epilogue import Epilogue, apply_reference, exact_gelu, render
from kfuse.kernels.norm import norm
from kfuse.kernels.tma import TMA_DTYPES, tma_device

_HEADER = """
import triton
import triton.language as tl
from kfuse.kernels.pdl import pdl_start


@triton.jit
def _mainloop(a_ptr, b_ptr, offs_m, offs_n, M, N, k_lo, k_hi,
              stride_am, stride_ak, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # ragged edges are masked, not clamped: offs_m/offs_n stay provably contiguous, so the
    # loads along the contiguous dimension stay 16-byte vectors and the wgmma pipeline is fed
    # (clamping with tl.where cost 10x on the H200, see docs/perf-notes.md)
    mask_m = offs_m < M
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_lo + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_lo + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            k_left = k_hi - k
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped ordering: GROUP_M row-blocks share B tiles while they are hot in L2
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((tile % group) % size_m)
    pid_n = (tile % group) // size_m
    return pid_m, pid_n


@triton.jit
def _tma_tile(desc, bat, row, col, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BATCHED: tl.constexpr):
    # a (BLOCK_R, BLOCK_C) tile through a host-side tensor descriptor; out-of-bounds rows and
    # columns read zeros (the descriptor has the operand's exact shape), batched operands use a
    # 3-D descriptor so a ragged tile never reads into the next batch
    if BATCHED:
        t = desc.load([bat, row, col]).reshape(BLOCK_R, BLOCK_C)
    else:
        t = desc.load([row, col])
    return t


@triton.jit
def _tma_operands(a_desc, b_desc, bat, off_m, off_n, k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr, B_KMAJOR: tl.constexpr):
    # one K step's A (BLOCK_M, BLOCK_K) and B (BLOCK_K, BLOCK_N) tiles by TMA
    a = _tma_tile(a_desc, bat, off_m, k, BLOCK_M, BLOCK_K, A_BATCHED)
    if B_KMAJOR:  # B column-major: the descriptor is B^T (N, K)
        b = _tma_tile(b_desc, bat, off_n, k, BLOCK_N, BLOCK_K, B_BATCHED).T
    else:
        b = _tma_tile(b_desc, bat, k, off_n, BLOCK_K, BLOCK_N, B_BATCHED)
    return a, b


@triton.jit
def _tma_store(desc, bat, row, col, tile, BATCHED: tl.constexpr):
    # the output tile through a host-side descriptor of C's exact shape: TMA clips the rows and
    # columns past M and N (no mask); batched C has a 3-D descriptor, so a ragged tile never
    # writes into the next batch. The tile is staged in shared memory (kfuse.tune.space counts it)
    if BATCHED:
        desc.store([bat, row, col], tile.reshape(1, tile.shape[0], tile.shape[1]))
    else:
        desc.store([row, col], tile)
"""

_MAIN = """

@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, {extra_ptrs}
    M, N, K, k_per_split,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
    stride_ws, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        acc = _mainloop(a_ptr + pid_b * stride_ab, b_ptr + pid_b * stride_bb, offs_m, offs_n, M, N, 0, K,
                        stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INPUT_PRECISION)
{epilogue_store}
    else:
        # one K slice per program; the fp32 partial goes to the workspace, the reduce kernel
        # sums the slices and applies the epilogue
        pid_k = tl.program_id(2)
        k_lo = pid_k * k_per_split
        k_hi = min(K, k_lo + k_per_split)
        acc = _mainloop(a_ptr + pid_b * stride_ab, b_ptr + pid_b * stride_bb, offs_m, offs_n, M, N, k_lo, k_hi,
                        stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INPUT_PRECISION)
        nb = tl.num_programs(1)
        w_ptrs = ws_ptr + (pid_k * nb + pid_b) * stride_ws + offs_m[:, None] * N + offs_n[None, :]
        tl.store(w_ptrs, acc, mask=mask)


@triton.jit
def splitk_reduce_kernel(
    ws_ptr, c_ptr, {extra_ptrs}
    M, N, stride_ws, stride_cb, stride_cm, stride_cn, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_N)
    pid_b = tl.program_id(1).to(tl.int64)
    nb = tl.num_programs(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * nb + pid_b) * stride_ws + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
{epilogue_store_4}


@triton.jit
def gemm_persistent_kernel(
    a_ptr, b_ptr, c_ptr, {extra_ptrs}
    M, N, K, n_batch,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
    {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in range(tl.program_id(0), tiles_per_batch * n_batch, NUM_PROGRAMS):
        gemm_tile(t, a_ptr, b_ptr, c_ptr, {extra_ptrs}M, N, K,
                  stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
                  {extra_strides}{extra_flag_args}BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, INPUT_PRECISION)


@triton.jit
def gemm_tile(
    bid, a_ptr, b_ptr, c_ptr, {extra_ptrs}
    M, N, K,
    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
    {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    # one (batch, tile), epilogue included, ``bid`` its index: the body of gemm_persistent_kernel's loop and the
    # persistent-thread-block form of this template (kfuse.colocate.plan_gemm), which a PTB or fused launch runs
    # over any block range beside another kernel's blocks
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    pid_b = (bid // tiles_per_batch).to(tl.int64)
    pid_m, pid_n = _tile_coords(bid % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = _mainloop(a_ptr + pid_b * stride_ab, b_ptr + pid_b * stride_bb, offs_m, offs_n, M, N, 0, K,
                    stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INPUT_PRECISION)
{epilogue_store_4}


@triton.jit
def gemm_tma_tile(
    bid, a_desc, b_desc, c_ptr, c_desc, {extra_ptrs}
    M, N, K,
    stride_cb, stride_cm, stride_cn, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr, B_KMAJOR: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    TMA_STORE: tl.constexpr, C_BATCHED: tl.constexpr,
):
    # gemm_tile with the operands (and C, where TMA_STORE) by TMA: the tile of gemm_tma_kernel and of the persistent
    # TMA kernel's loop, so the PTB form of a plan step that runs the TMA kernels keeps their main loop
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    bat = bid // tiles_per_batch
    pid_m, pid_n = _tile_coords(bid % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a, b = _tma_operands(a_desc, b_desc, bat, off_m, off_n, k, BLOCK_M, BLOCK_N, BLOCK_K, A_BATCHED, B_BATCHED, B_KMAJOR)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    pid_b = bat.to(tl.int64)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    col_n = off_n
{epilogue_store_tma_4}


@triton.jit
def gemm_tma_kernel(
    a_desc, b_desc, c_ptr, c_desc, {extra_ptrs}
    M, N, K,
    stride_cb, stride_cm, stride_cn, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr, B_KMAJOR: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    TMA_STORE: tl.constexpr, C_BATCHED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    # A and B tiles come in by TMA (Hopper's bulk tensor copies, zero-filled past the edges,
    # so no masks and no K tail); the epilogue loads its extra inputs by pointers as gemm_kernel
    # does and stores C by TMA (TMA_STORE, c_desc) or, when TMA cannot describe C, by pointers
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    bat = tl.program_id(1)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a, b = _tma_operands(a_desc, b_desc, bat, off_m, off_n, k, BLOCK_M, BLOCK_N, BLOCK_K, A_BATCHED, B_BATCHED, B_KMAJOR)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    pid_b = bat.to(tl.int64)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    col_n = off_n
{epilogue_store_tma_4}


@triton.jit
def gemm_tma_persistent_kernel(
    a_desc, b_desc, c_ptr, c_desc, {extra_ptrs}
    M, N, K, n_batch,
    stride_cb, stride_cm, stride_cn, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, A_BATCHED: tl.constexpr, B_BATCHED: tl.constexpr, B_KMAJOR: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    TMA_STORE: tl.constexpr, C_BATCHED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    # gemm_tma_kernel's tile, but NUM_PROGRAMS programs walk the (batch, tile) space; the tile
    # loop and the K loop form one nest that the compiler can flatten (FLATTEN: the next tile's
    # first TMA loads are issued while this tile's epilogue runs, which matters when K is only a
    # few blocks) or split into load and MMA/epilogue warp groups (WARP_SPECIALIZE). Both are
    # compile hints: the interpreter runs the plain nest.
    # The descriptors are host-side (tma_operands, as for gemm_tma_kernel), not built in the
    # kernel by tl.make_tensor_descriptor: those need a scratch buffer per launch from
    # triton.set_allocator, a per-thread (ContextVar) setting a library cannot make for its
    # caller's threads without replacing the caller's allocator. Host-side ones need nothing
    # global, run in the interpreter and compile warp-specialised for sm_90.
    tiles_per_batch = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), tiles_per_batch * n_batch, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        bat = t // tiles_per_batch
        pid_m, pid_n = _tile_coords(t % tiles_per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            a, b = _tma_operands(a_desc, b_desc, bat, off_m, off_n, kb * BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K, A_BATCHED, B_BATCHED, B_KMAJOR)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        pid_b = bat.to(tl.int64)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        if EPILOGUE_SUBTILE:
            # the epilogue on two (BLOCK_M, BLOCK_N / 2) halves: the extra inputs' tiles and the
            # epilogue's temporaries are live for half the tile at a time (big tiles spill); with
            # TMA_STORE c_desc's block is the half tile
            acc_lo, acc_hi = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            offs_n = off_n + tl.arange(0, BLOCK_N // 2)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            acc = acc_lo
            col_n = off_n
{epilogue_store_tma_12}
            offs_n += BLOCK_N // 2
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            acc = acc_hi
            col_n = off_n + BLOCK_N // 2
{epilogue_store_tma_12}
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            col_n = off_n
{epilogue_store_tma_12}


@triton.jit
def gemm_tma_resident_kernel(
    a_desc, b_desc, c_ptr, c_desc, {extra_ptrs}
    M, N, K,
    stride_cb, stride_cm, stride_cn, {extra_strides}
    {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, B_KMAJOR: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    TMA_STORE: tl.constexpr, C_BATCHED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    # For GEMMs whose whole K is one tile (BLOCK_K >= K) and whose B column block is small
    # (the 256-wide layers of MLP chains). Each program loads its B column block ONCE and keeps
    # it in shared memory, then walks row tiles: the only per-tile traffic is A's (BLOCK_M, K)
    # tile in and C's tile out, which the pipeliner overlaps across iterations, instead of
    # re-fetching B from L2 for every tile. Programs p, p + n_cols, ... share column block
    # p % n_cols (the launcher makes NUM_PROGRAMS a multiple of n_cols). One batch, 2-D B.
    n_cols = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    off_n = (pid % n_cols) * BLOCK_N
    if B_KMAJOR:  # B column-major: the descriptor is B^T (N, K)
        b = b_desc.load([off_n, 0]).T
    else:
        b = b_desc.load([0, off_n])
    bat = 0
    pid_b = 0
    offs_n = off_n + tl.arange(0, BLOCK_N)
    col_n = off_n
    for t in tl.range(pid // n_cols, tl.cdiv(M, BLOCK_M), NUM_PROGRAMS // n_cols):
        off_m = t * BLOCK_M
        a = a_desc.load([off_m, 0])
        acc = tl.dot(a, b, input_precision=INPUT_PRECISION)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{epilogue_store_tma_8}
"""


def _epilogue_store(epi: Epilogue, indent: str, tma: bool = False) -> str:
    """Load the extra inputs at the tile's coordinates, apply the epilogue, store once. An extra
    broadcast along the rows (a bias: row stride 0, flag ``XB<j>`` set by the launcher) is loaded
    once per tile as a (1, BLOCK_N) vector: as a full tile it costs BLOCK_M x BLOCK_N / threads
    registers and loads of repeated values (in the b2b template that spilled; docs/perf-notes.md).
    ``tma``: the TMA kernels' store, by ``c_desc`` at (``bat``, ``off_m``, ``col_n``) when the
    kernel's ``TMA_STORE`` is set, else by pointers."""
    lines = []
    for j in range(epi.n_inputs):
        lines += [
            f"{indent}if XB{j}:",
            f"{indent}    x{j} = tl.load(x{j}_ptr + pid_b * stride_x{j}b + offs_n * stride_x{j}n, mask=offs_n < N)[None, :]",
            f"{indent}else:",
            f"{indent}    x{j} = tl.load(x{j}_ptr + pid_b * stride_x{j}b + offs_m[:, None] * stride_x{j}m"
            f" + offs_n[None, :] * stride_x{j}n, mask=mask)",
        ]
    body = render(epi, indent=indent)
    if body:
        lines.append(body)
    store = [
        f"{indent}c_ptrs = c_ptr + pid_b * stride_cb + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn",
        f"{indent}tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)",
    ]
    if tma:
        lines.append(f"{indent}if TMA_STORE:  # one asynchronous bulk copy of the tile; TMA clips it at M and N (no mask)")
        lines.append(f"{indent}    _tma_store(c_desc, bat, off_m, col_n, acc.to(c_ptr.dtype.element_ty), C_BATCHED)")
        lines.append(f"{indent}else:")
        store = [" " * 4 + line for line in store]
    return "\n".join(lines + store)


def kernel_source(epi: Epilogue) -> str:
    n = epi.n_inputs
    return _HEADER + _MAIN.format(
        extra_ptrs="".join(f"x{j}_ptr, " for j in range(n)),
        extra_strides="".join(f"stride_x{j}b, stride_x{j}m, stride_x{j}n, " for j in range(n)),
        extra_flags="".join(f"XB{j}: tl.constexpr, " for j in range(n)),
        epilogue_store=_epilogue_store(epi, " " * 8),
        epilogue_store_4=_epilogue_store(epi, " " * 4),
        extra_flag_args="".join(f"XB{j}, " for j in range(n)),
        epilogue_store_tma_4=_epilogue_store(epi, " " * 4, tma=True),
        epilogue_store_tma_8=_epilogue_store(epi, " " * 8, tma=True),
        epilogue_store_tma_12=_epilogue_store(epi, " " * 12, tma=True),
    )


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    persistent: bool = False
    tma: bool = False  # A/B tiles (and C, where describable) by TMA descriptors (sm_90; pointers when ineligible)
    # compile hints of the persistent TMA kernel (persistent and tma), ignored by the others
    warp_specialize: bool = False  # load and MMA/epilogue warp groups (sm_90: num_warps 4, BLOCK_M 64 only)
    flatten: bool = False  # the tile loop and the K loop pipelined as one loop
    epilogue_subtile: bool = False  # the epilogue on two half tiles (fewer live registers)
    # B's column block loaded once per program and kept in shared memory (tma, block_k >= K,
    # one batch): gemm_tma_resident_kernel; ignored (the other kernels run) when ineligible
    resident_b: bool = False
    # the Gluon warp-specialised kernels of gemm_ws.py (sm_90, one batch, TMA operands and output):
    # "pingpong" (num_warps 4: two consumer warpgroups on alternate tiles) or "coop" (num_warps 8:
    # two warpgroups on one tile); where ineligible the persistent TMA kernel runs the same tile
    ws: str = ""
    # ping-pong only: the two consumers stage their output tiles in one set of buffers (a ring stage more)
    shared_c: bool = False

    def describe(self) -> str:
        s = f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"
        if self.split_k > 1:
            s += f" splitk{self.split_k}"
        if self.persistent:
            s += " persistent"
        if self.tma:
            s += " tma"
        if self.warp_specialize:
            s += " ws"
        if self.flatten:
            s += " flat"
        if self.epilogue_subtile:
            s += " sub"
        if self.resident_b:
            s += " resident"
        if self.ws:
            s += f" {self.ws}"
        if self.shared_c:
            s += " sc"
        return s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_config(m: int, n: int, k: int) -> GemmConfig:
    """A reasonable tile for the problem when no tuning record exists."""
    if interpreting():
        return GemmConfig(32, 32, 32, 4, 4, 1)
    if m * n >= 1 << 20:
        return GemmConfig(128, 128, 64, 8, 8, 3)
    if m * n >= 1 << 16:
        return GemmConfig(64, 128, 64, 8, 4, 3)
    return GemmConfig(32, 64, 64, 8, 4, 3)


def _module(epi: Epilogue):  # noqa: ANN202 - a generated module of triton JITFunctions
    return generated("gemm2", epi.key(), lambda: kernel_source(epi))


def _num_sms(device: torch.device) -> int:
    return num_sms(device, 4)


def _as_batched(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """``x`` (..., R, C) broadcast to ``batch + (R, C)`` and viewed as 3-D (a copy only when the
    batch dims cannot be merged by strides)."""
    x = x.expand(*batch, *x.shape[-2:])
    if len(batch) == 1:
        return x
    return x.reshape(-1, *x.shape[-2:])


@dataclass
class GemmCall:
    """Operands of one GEMM launch in canonical 3-D form: a (B, M, K), b (B, K, N), c (B, M, N)."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    extras: list[torch.Tensor]
    out_shape: tuple[int, ...]


def prepare(
    a: torch.Tensor, b: torch.Tensor, extras: list[torch.Tensor], out_dtype: torch.dtype, out: torch.Tensor | None = None
) -> GemmCall:
    """Normalise operands to 3-D views. ``b`` 2-D: ``a``'s leading dims fold into M; ``b`` with
    batch dims: batched GEMM with matmul broadcasting of the batch dims."""
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"gemm_epilogue: operands must be at least 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"gemm_epilogue: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    k, n = b.shape[-2], b.shape[-1]
    if b.dim() == 2:
        out_shape = tuple(a.shape[:-1]) + (n,)
        rows = 1
        for s in a.shape[:-1]:
            rows *= s
        a3 = a.reshape(rows, k).unsqueeze(0)
        b3 = b.unsqueeze(0)
    else:
        batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        out_shape = batch + (a.shape[-2], n)
        a3, b3 = _as_batched(a, batch), _as_batched(b, batch)
    nb, m = a3.shape[0], a3.shape[1]
    if out is not None and (tuple(out.shape) != out_shape or out.device != a.device):
        raise ValueError(f"gemm_epilogue: out is {tuple(out.shape)} on {out.device}, expected {out_shape} on {a.device}")
    c = out if out is not None else torch.empty(out_shape, dtype=out_dtype, device=a.device)
    try:
        c3 = c.view(nb, m, n)
    except RuntimeError:
        raise ValueError(f"gemm_epilogue: out's strides {tuple(c.stride())} do not fold to (batch, M, N) = {(nb, m, n)}") from None
    ex3 = [torch.broadcast_to(e, out_shape).reshape(nb, m, n) for e in extras]
    return GemmCall(a3, b3, c3, ex3, out_shape)


def gemm_epilogue(
    a: torch.Tensor,
    b: torch.Tensor,
    extras: list[torch.Tensor],
    epi: Epilogue,
    out_dtype: torch.dtype,
    config: GemmConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``epi(a @ b, *extras)`` in one kernel (two with split-K). ``a`` may have leading batch
    dims (they fold into M when ``b`` is 2-D, else they broadcast against ``b``'s); extras
    broadcast to the output shape. Operands may be transposed views (any strides)."""
    if a.dtype != b.dtype:
        raise TypeError(f"gemm_epilogue: operands must have one dtype, got {a.dtype} and {b.dtype}")
    g = prepare(a, b, extras, out_dtype, out)
    if len(g.extras) != epi.n_inputs:
        raise ValueError(f"epilogue expects {epi.n_inputs} extra inputs, got {len(g.extras)}")
    nb, m, k = g.a.shape
    n = g.b.shape[2]
    if m == 0 or n == 0 or nb == 0:
        return g.c.view(g.out_shape)
    if k == 0:  # nothing to multiply: the product is zero, the epilogue still applies (into the caller's out)
        return g.c.view(g.out_shape).copy_(apply_reference(torch.zeros(g.out_shape, device=a.device), extras, epi))
    cfg = config or default_config(m, n, k)
    launch(g, epi, cfg)
    return g.c.view(g.out_shape)


def _go(kernel: Any, grid: tuple[int, ...], warmup: bool, *args: Any, pdl_ok: bool = True, **kwargs: Any) -> None:
    """Launch, or with ``warmup`` only compile (the tuner compiles candidates in parallel). ``pdl_ok``
    False: never with programmatic dependent launch (the kernel does not wait for its predecessor)."""
    launch = pdl.launch_kwargs() if pdl_ok else {"PDL": False}
    if not warmup:
        kernel[grid](*args, **kwargs, **launch)
    elif not interpreting():
        kernel.warmup(*args, grid=grid, **kwargs, **launch)


def _tma_ok(t: torch.Tensor, batched: bool) -> bool:
    """Can a TMA descriptor describe the 3-D view ``t`` (2-D: ``t[0]``)? The last dimension must
    be contiguous, the base address and the other strides 16-byte aligned."""
    e = t.element_size()
    return t.stride(2) == 1 and t.data_ptr() % 16 == 0 and (t.stride(1) * e) % 16 == 0 and (not batched or (t.stride(0) * e) % 16 == 0)


def _descriptor(t: torch.Tensor, batched: bool, block: tuple[int, int]) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    if batched:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, *block])
    return TensorDescriptor(t[0], list(t.shape[1:]), list(t.stride()[1:]), list(block))


def tma_operands(a: torch.Tensor, b: torch.Tensor, cfg: GemmConfig) -> tuple[Any, Any, dict[str, bool]] | None:
    """Descriptors of the 3-D operands ``a`` (B, M, K) and ``b`` (B, K, N) for ``gemm_tma_kernel``
    and its layout constexprs, or None when TMA cannot load them (A not K-contiguous, B neither
    row- nor column-major, misaligned base or strides, other dtypes, a GPU before Hopper).
    A column-major B is described as B^T (N, K). An operand broadcast along the batch (batch
    stride 0) or with one batch gets a 2-D descriptor; others a 3-D one of the exact shape, so
    ragged tiles read zeros, never the next batch."""
    if a.dtype not in TMA_DTYPES or b.dtype != a.dtype:
        return None
    if not tma_device(a):
        return None
    nb = a.shape[0]
    a_batched = nb > 1 and a.stride(0) != 0
    b_batched = nb > 1 and b.stride(0) != 0
    if not _tma_ok(a, a_batched):
        return None
    bt = b.transpose(1, 2)
    if _tma_ok(b, b_batched):
        b_kmajor, b_view, b_block = False, b, (cfg.block_k, cfg.block_n)
    elif _tma_ok(bt, b_batched):
        b_kmajor, b_view, b_block = True, bt, (cfg.block_n, cfg.block_k)
    else:
        return None
    a_desc = _descriptor(a, a_batched, (cfg.block_m, cfg.block_k))
    b_desc = _descriptor(b_view, b_batched, b_block)
    return a_desc, b_desc, {"A_BATCHED": a_batched, "B_BATCHED": b_batched, "B_KMAJOR": b_kmajor}


def tma_output(c: torch.Tensor, cfg: GemmConfig) -> tuple[Any, dict[str, bool]]:
    """The C operand of the TMA kernels: ``(c_desc, constexprs)``. ``c_desc`` describes the 3-D
    output ``c`` (B, M, N) with C's exact shape (a 2-D descriptor of ``c[0]`` for one batch, else
    3-D) and the block the kernel stores (``(BLOCK_M, BLOCK_N)``; the persistent kernel's subtiled
    epilogue stores half tiles, ``(BLOCK_M, BLOCK_N // 2)``). When TMA cannot describe C (last
    dim not contiguous, base or leading strides not 16-byte aligned, another dtype, a GPU before
    Hopper) ``c_desc`` is ``c`` itself, an unused placeholder, and ``TMA_STORE`` is False: the
    kernels store by pointers."""
    batched = c.shape[0] > 1
    if c.dtype not in TMA_DTYPES or not tma_device(c) or not _tma_ok(c, batched):
        return c, {"TMA_STORE": False, "C_BATCHED": False}
    sub = cfg.persistent and cfg.epilogue_subtile
    block = (cfg.block_m, cfg.block_n // 2 if sub else cfg.block_n)
    return _descriptor(c, batched, block), {"TMA_STORE": True, "C_BATCHED": batched}


def _row_broadcast_flags(extras: list[torch.Tensor]) -> dict[str, bool]:
    """``XB<j>``: extra j is the same for every row (row stride 0, e.g. a bias broadcast to (B, M, N))."""
    return {f"XB{j}": e.stride(1) == 0 for j, e in enumerate(extras)}


def resident_eligible(g: GemmCall, cfg: GemmConfig) -> bool:
    """Can ``gemm_tma_resident_kernel`` run this call with ``cfg``? It needs the whole K in one
    tile (``block_k >= K``), one batch and a B shared by it (2-D), and is asked for by
    ``cfg.resident_b`` (with ``tma``; TMA eligibility of the operands is checked by the caller)."""
    nb, _, k = g.a.shape
    return cfg.resident_b and cfg.tma and nb == 1 and cfg.block_k >= k and cfg.split_k == 1


SMEM_PER_SM = 233472  # sm_90 (H100/H200): shared memory per SM, bytes (227 KB of it per block)


def resident_smem_bytes(cfg: GemmConfig, elem: int, tma_store: bool = True) -> int:
    """Shared memory of one ``gemm_tma_resident_kernel`` program: B's (BLOCK_K, BLOCK_N) block,
    ``num_stages`` A tiles (BLOCK_M, BLOCK_K) and the staged C tile of the TMA store (sm_90
    offline compiles ask for this plus <= 1.3 KB of barriers)."""
    return (cfg.block_k * cfg.block_n + cfg.num_stages * cfg.block_m * cfg.block_k + (cfg.block_m * cfg.block_n if tma_store else 0)) * elem


def resident_programs_per_sm(cfg: GemmConfig, elem: int) -> int:
    """How many resident programs share an SM (1-4): a second one overlaps its loads with the
    first one's MMA and epilogue, as warp specialisation would."""
    return max(1, min(4, SMEM_PER_SM // (resident_smem_bytes(cfg, elem) + 2048)))


def launch(g: GemmCall, epi: Epilogue, cfg: GemmConfig, warmup: bool = False) -> None:
    """Launch the kernel(s) for a prepared call with config ``cfg`` (``warmup``: compile only)."""
    nb, m, k = g.a.shape
    n = g.b.shape[2]
    a, b, c = g.a, g.b, g.c
    mod = _module(epi)
    precision = "ieee" if a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    ex_strides: list[int] = []
    for e in g.extras:
        ex_strides += [e.stride(0), e.stride(1), e.stride(2)]
    xb = _row_broadcast_flags(g.extras)
    ab = (a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1), c.stride(2))
    split = max(1, min(cfg.split_k, cdiv(k, cfg.block_k)))
    ws = cfg if cfg.ws else None
    if cfg.ws:
        # where the Gluon kernels cannot run, the same tile runs on the persistent TMA kernel
        # (Triton's tiles are powers of two: a 192-wide or -high ping-pong tile runs at 128 there)
        cfg = replace(cfg, ws="", shared_c=False, block_m=1 << (cfg.block_m.bit_length() - 1), block_n=1 << (cfg.block_n.bit_length() - 1))
    tma = tma_operands(a, b, cfg) if cfg.tma and split == 1 else None
    if ws is not None and tma is not None and gemm_ws.ws_eligible(a, b, c, split) is None:
        gemm_ws.launch(a, b, c, g.extras, epi, gemm_ws.ws_config(ws, a.element_size()), _num_sms(a.device), warmup,
                       fast_gelu=not exact_gelu(a.dtype))  # fmt: skip
        return
    if ws is not None and tma is not None:
        cfg = replace(cfg, persistent=True)
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    if tma is not None and resident_eligible(g, cfg):
        a_desc, b_desc, layout = tma
        c_desc, store = tma_output(c, cfg)
        n_cols = cdiv(n, cfg.block_n)
        slots = _num_sms(a.device) * resident_programs_per_sm(cfg, a.element_size())
        n_prog = min(max(1, slots // n_cols), cdiv(m, cfg.block_m)) * n_cols
        _go(mod.gemm_tma_resident_kernel, (n_prog,), warmup,
            a_desc, b_desc, c, c_desc, *g.extras, m, n, k, c.stride(0), c.stride(1), c.stride(2), *ex_strides,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, NUM_PROGRAMS=n_prog,
            B_KMAJOR=layout["B_KMAJOR"], INPUT_PRECISION=precision, **xb, **store,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    if tma is not None and cfg.persistent:
        a_desc, b_desc, layout = tma
        c_desc, store = tma_output(c, cfg)
        n_prog = min(_num_sms(a.device), tiles * nb)
        _go(mod.gemm_tma_persistent_kernel, (n_prog,), warmup,
            a_desc, b_desc, c, c_desc, *g.extras, m, n, k, nb, c.stride(0), c.stride(1), c.stride(2), *ex_strides,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, NUM_PROGRAMS=n_prog,
            **layout, INPUT_PRECISION=precision, **xb, FLATTEN=cfg.flatten, WARP_SPECIALIZE=cfg.warp_specialize,
            EPILOGUE_SUBTILE=cfg.epilogue_subtile, **store, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            pdl_ok=not cfg.warp_specialize,  # Triton 3.6's warp specialisation pass fails on the in-kernel wait
        )  # fmt: skip
        return
    if tma is not None:
        a_desc, b_desc, layout = tma
        c_desc, store = tma_output(c, cfg)
        _go(mod.gemm_tma_kernel, (tiles, nb), warmup,
            a_desc, b_desc, c, c_desc, *g.extras, m, n, k, c.stride(0), c.stride(1), c.stride(2), *ex_strides,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            **layout, INPUT_PRECISION=precision, **xb, **store, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    if cfg.persistent and split == 1:
        n_prog = min(_num_sms(a.device), tiles * nb)
        _go(mod.gemm_persistent_kernel, (n_prog,), warmup,
            a, b, c, *g.extras, m, n, k, nb, *ab, *ex_strides,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            NUM_PROGRAMS=n_prog, EVEN_K=k % cfg.block_k == 0, INPUT_PRECISION=precision, **xb,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    # K slices are whole BLOCK_K multiples so every slice but the last is even
    k_per_split = cdiv(cdiv(k, split), cfg.block_k) * cfg.block_k
    split = cdiv(k, k_per_split)
    ws = torch.empty((split, nb, m, n), dtype=torch.float32, device=a.device) if split > 1 else c
    even_k = k % cfg.block_k == 0
    _go(mod.gemm_kernel, (tiles, nb, split), warmup,
        a, b, c, ws, *g.extras, m, n, k, k_per_split, *ab, m * n, *ex_strides,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SPLIT_K=split, EVEN_K=even_k, INPUT_PRECISION=precision, **xb,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        epilogue_pass(g, epi, ws, split, warmup)


def epilogue_pass(g: GemmCall, epi: Epilogue, ws: torch.Tensor, slices: int = 1, warmup: bool = False) -> None:
    """Sum the ``slices`` contiguous (B, M, N) partial products in ``ws`` (fp32 split-K partials,
    or one GEMM result of any float dtype), apply ``epi`` and store into ``g.c``: the split-K
    reduce, also the rest-of-epilogue kernel after a library GEMM."""
    nb, m, n = g.c.shape
    c = g.c
    ex_strides = [s for e in g.extras for s in (e.stride(0), e.stride(1), e.stride(2))]
    xb = _row_broadcast_flags(g.extras)
    rb = (64, 64)
    _go(_module(epi).splitk_reduce_kernel, (cdiv(m, rb[0]) * cdiv(n, rb[1]), nb), warmup,
        ws, c, *g.extras, m, n, m * n, c.stride(0), c.stride(1), c.stride(2), *ex_strides,
        BLOCK_M=rb[0], BLOCK_N=rb[1], SPLIT_K=slices, **xb, num_warps=4,
    )  # fmt: skip


def reference(a: torch.Tensor, b: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, out_dtype: torch.dtype) -> torch.Tensor:
    """The oracle: fp32 matmul then the epilogue through the op registry."""
    acc = torch.matmul(a.float(), b.float())
    return apply_reference(acc, [e.float() if e.is_floating_point() else e for e in extras], epi).to(out_dtype)


# ---------------------------------------------------------------------------------------
# lowering of ``gemm_epilogue`` nodes (registered by kfuse.runtime.executor)
# ---------------------------------------------------------------------------------------
def lower_gemm_epilogue(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step running the node with this template; None (PyTorch) on the "torch" backend.
    The config: the node's (set by the tuning stage), else the database's when tuning is
    on, else ``default_config``."""
    if backend == "torch":
        return None
    from kfuse.ir.graph import TensorType
    from kfuse.runtime.executor import KernelInfo, Step

    epi = node.attrs["epilogue"]
    out_t = node.ttype
    a_t, b_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    assert isinstance(a_t, TensorType) and isinstance(b_t, TensorType)
    m = a_t.numel // max(1, a_t.shape[-1]) if b_t.rank == 2 else a_t.shape[-2]
    cfg = node.attrs.get("config")
    if cfg is None and options is not None and getattr(options, "tune", "none") != "none" and backend == "triton":
        from kfuse.tune.tuner import lookup_config, problem_of

        prob = problem_of(node, graph)
        cfg = lookup_config(prob, options.tune) if prob is not None else None
    cfg = cfg or default_config(m, b_t.shape[-1], b_t.shape[-2])

    eps = node.attrs.get("row_rms")  # a folded RMSNorm (passes/fold_row_norm): A is the norm's input
    row_scale = None if eps is None else (lambda x: norm(x, rms=True, eps=eps))

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        a = xs[0] if row_scale is None else row_scale(xs[0])
        return gemm_epilogue(a, xs[1], xs[2:], epi, out_t.dtype, cfg)

    folded = " after the folded norm's row scale" if eps is not None else ""
    info = KernelInfo(node.name, "gemm_epilogue", node.attrs["fused_ops"], cfg.describe() + folded, epi.describe())
    from kfuse.kernels import skinny_gemm
    from kfuse.kernels.gemm_library import maybe_library_step

    more = skinny_gemm.candidates(node, graph, backend, options, m, b_t, out_t.dtype)
    if more and skinny_gemm.mode(options) == "always":
        run, info = next(iter(more.values()))
        return Step(node.name, node.inputs, run, info)
    step = maybe_library_step(node, graph, backend, run, info, options, more=more, row_scale=row_scale)
    return step or Step(node.name, node.inputs, run, info)
