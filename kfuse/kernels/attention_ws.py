"""Warp-specialised attention for Hopper (sm_90), written in Gluon: an **experiment**, compiled and
checked offline in session 24, correct on the H200 but 2-35% slower than the Triton kernel (session 25,
``experiments/s25_attention_ws_probe.json``), and not in the autotuner's space.

Why: on the H200, SDPA's cuDNN backend runs BERT/GPT-style attention 4-17% faster than kfuse's
Triton kernel at head dim 64 and 1.3x faster at 128 (``BENCHMARKS.md``, attention, session 24). The
Triton kernel loads K and V with pointers in the same warps that run the wgmma's and the softmax.
This kernel splits the work the way ``gemm_ws.py`` does for GEMMs:

* a **loader** warp brings the program's Q tiles by TMA once, then each K and V tile into a
  ``STAGES``-deep ring of shared-memory slots (a ``k_ready`` and a ``v_ready`` mbarrier a slot, so
  the scores can start before V lands; ``empty`` counts one arrival from each consumer);
* two or three **consumer** warpgroups (``consumers``), each with its own BLOCK_M query rows (a program
  covers ``consumers`` * BLOCK_M; with three, FlashAttention-3's choice at head dim 64, each has 160
  registers a thread instead of 232, and a program's last tiles may lie past the sequence: their
  rows are computed from whatever TMA reads there and not stored),
  read every K/V slot: S = Q K^T from shared memory, the online softmax in registers, P converted
  in registers to the wgmma's A operand, O += P V. While one consumer runs its softmax the other's
  wgmma's can use the tensor cores. ``pipelined`` configs also issue the next tile's scores before
  this tile's softmax (FlashAttention-3's intra-warpgroup overlap; two score tiles live at once).
  ``pingpong`` configs (dense) make the two consumers take turns at the tensor cores through two
  mbarriers, FlashAttention-3's inter-warpgroup schedule (``_consumer_pingpong``).

The exponent is one FFMA of the unscaled score (as in ``attention.py``). Causal (top-left, Sq = Sk):
a consumer masks the key tile on its diagonal and skips the tiles past it (still waiting on and
freeing their slots, which the other consumer reads).

Inputs are ``[B, H, S, D]`` views whose rows TMA can address as a 2-D tensor: either the heads are
row blocks of it (contiguous ``[B, H, S, D]``) or column blocks (``[B, S, H, D]`` storage, e.g. slices of
one QKV projection output); see ``tma_view``. ``eligible`` says why a problem is not taken: sequence
lengths must be multiples of both tiles (no row of a tile may belong to the next head or batch),
head dim 64 or 128, fp16 or bf16, no mask, no packed sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from kfuse.kernels import pdl
from kfuse.kernels.pdl_gluon import pdl_start

# registers a thread, by consumer warpgroups a program (FlashAttention-3's split). The loader's one
# warp occupies a warpgroup's registers, so 2 x 4 x 32 x 232 + 4 x 32 x 40 and 3 x 4 x 32 x 160 + 4 x 32 x 24
# both fit the SM's 65,536; with 3 consumers a 40-register loader would not (setmaxnreg would wait forever)
LOADER_REGS = {2: 40, 3: 24}
CONSUMER_REGS = {2: 232, 3: 160}
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class WsAttnConfig:
    block_m: int = 64  # query rows a consumer warpgroup (the program covers ``consumers`` times that)
    block_n: int = 128  # keys a K/V tile
    stages: int = 2
    pipelined: bool = False  # tile j + 1's scores issued before tile j's softmax (``_consumer``)
    pingpong: bool = False  # dense, two consumers: they take turns at the tensor cores (``_consumer_pingpong``)
    consumers: int = 2  # consumer warpgroups a program: 2 (232 registers each) or 3 (160 each)

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        return (self.consumers * self.block_m + 2 * self.stages * self.block_n) * head_dim * elem + 1024

    def describe(self) -> str:
        form = (" pipe" if self.pipelined else "") + (" pp" if self.pingpong else "")
        return f"ws {self.consumers}x{self.block_m}x{self.block_n} s{self.stages}" + form


def config_space(head_dim: int, causal: bool = False) -> list[WsAttnConfig]:
    """Tiles whose Q tiles and ``stages`` K and V tiles fit the 227 KB of an sm_90 SM. Two consumers:
    plain, pipelined and (dense only) ping-pong; three consumers (head dim 64, FlashAttention-3's
    choice there): plain, whose 160 registers a thread hold one score tile, not two."""
    out = []
    for bn in (64, 128):
        for stages in (2, 3, 4):
            forms = [(False, False), (True, False)] + ([] if causal else [(False, True)])
            cands = [WsAttnConfig(64, bn, stages, pipelined, pingpong) for pipelined, pingpong in forms]
            if head_dim == 64:
                cands.append(WsAttnConfig(64, bn, stages, consumers=3))
            out += [c for c in cands if c.smem_bytes(head_dim) <= 232448]
    return out


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, q_row, q_col, kv_row, kv_col, n_tiles):
    # one warp: every consumer's Q tile once, then the K and V tiles in order through the ring. A
    # slot's first ``empty`` wait is at phase 1, which a fresh barrier has completed
    STAGES: gl.constexpr = k_bufs.shape[0]
    CONSUMERS: gl.constexpr = q_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
    for i in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(q_desc, [q_row + i * BLOCK_M, q_col], q_ready, q_bufs.index(i))
    for j in range(n_tiles):
        s = j % STAGES
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, kv_col], k_ready.index(s), k_bufs.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, kv_col], v_ready.index(s), v_bufs.index(s))


@gluon.jit
def _online_softmax(qk, m_i, l_i, acc, j, row0, scale_log2, CAUSAL: gl.constexpr, p_layout: gl.constexpr, DTYPE: gl.constexpr):
    # one key tile's scores into the running max, sum and output; returns P as the wgmma's A operand.
    # Causal: the tile that crosses the warpgroup's diagonal is masked (cols > row)
    BLOCK_M: gl.constexpr = qk.shape[0]
    BLOCK_N: gl.constexpr = qk.shape[1]
    if CAUSAL:
        if (j + 1) * BLOCK_N > row0:
            rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, qk.type.layout))
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, qk.type.layout))
            qk = gl.where(cols[None, :] <= rows[:, None], qk, -1.0e30)
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * scale_log2)
    p = gl.exp2(qk * scale_log2 - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    return gl.convert_layout(p.to(DTYPE), p_layout), m_new, l_i, acc


@gluon.jit
def _scores_to_p(qk, m_i, l_i, scale_log2, p_layout: gl.constexpr, DTYPE: gl.constexpr):
    # the first half of ``_online_softmax`` (dense): P as the wgmma's A operand, the new max and sum,
    # and the factor the output still has to be rescaled by once its pending P V product has landed
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * scale_log2)
    p = gl.exp2(qk * scale_log2 - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return gl.convert_layout(p.to(DTYPE), p_layout), m_new, l_i, alpha


@gluon.jit
def _store_rows(acc, l_i, o_ptr, o_base, stride_os, row0, SEQ):
    # rows past the sequence (three consumers: a program's last tiles may lie past it) are not stored
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))[:, None]
    offs_m = row0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc.type.layout))
    offs_d = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    ptrs = o_ptr + o_base + offs_m[:, None] * stride_os + offs_d[None, :]
    gl.store(ptrs, out.to(o_ptr.dtype.element_ty), mask=(offs_m < SEQ)[:, None])


@gluon.jit
def _consumer(q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row, n_tiles, scale_log2,
              SEQ, CAUSAL: gl.constexpr, WG: gl.constexpr, PIPELINED: gl.constexpr):  # fmt: skip
    # one warpgroup: query rows first_row + WG * BLOCK_M .. + BLOCK_M of the program's head.
    # PIPELINED: the scores of tile j + 1 are issued (async wgmma) before tile j's softmax runs, so the
    # tensor cores work while this warpgroup computes exponentials (FlashAttention-3's intra-warpgroup
    # overlap); two score tiles live at once
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.shape[1]
    HEAD_D: gl.constexpr = q_bufs.shape[2]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row0 = first_row + WG * BLOCK_M
    m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    q = q_bufs.index(WG)
    # the key tiles this warpgroup computes; causal: the rest (right of its last row) are only freed
    n_mine = n_tiles
    if CAUSAL:
        n_mine = gl.minimum(n_tiles, (row0 + BLOCK_M - 1) // BLOCK_N + 1)
    mbarrier.wait(q_ready, 0)
    if PIPELINED:
        mbarrier.wait(k_ready.index(0), 0)
        qk = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(0, deps=(qk,))
        for j in range(n_mine - 1):
            s = j % STAGES
            s1 = (j + 1) % STAGES
            mbarrier.wait(k_ready.index(s1), ((j + 1) // STAGES) & 1)
            qk_next = warpgroup_mma(q, k_bufs.index(s1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            p16, m_i, l_i, acc = _online_softmax(qk, m_i, l_i, acc, j, row0, scale_log2, CAUSAL, p_layout, q_bufs.dtype)
            mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
            acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
            qk, acc = warpgroup_mma_wait(0, deps=(qk_next, acc))
            mbarrier.arrive(empty.index(s), count=1)
        last = n_mine - 1
        s = last % STAGES
        p16, m_i, l_i, acc = _online_softmax(qk, m_i, l_i, acc, last, row0, scale_log2, CAUSAL, p_layout, q_bufs.dtype)
        mbarrier.wait(v_ready.index(s), (last // STAGES) & 1)
        acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(s), count=1)
    else:
        for j in range(n_mine):
            s = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_ready.index(s), phase)
            qk = warpgroup_mma(q, k_bufs.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=(qk,))
            p16, m_i, l_i, acc = _online_softmax(qk, m_i, l_i, acc, j, row0, scale_log2, CAUSAL, p_layout, q_bufs.dtype)
            mbarrier.wait(v_ready.index(s), phase)
            acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index(s), count=1)
    for j in range(n_mine, n_tiles):  # the other warpgroup reads these slots: wait for them, then free them
        s = j % STAGES
        mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
        mbarrier.arrive(empty.index(s), count=1)
    _store_rows(acc, l_i, o_ptr, o_base, stride_os, row0, SEQ)


@gluon.jit
def _consumer_pingpong(q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, empty, turn, o_ptr, o_base, stride_os, first_row, n_tiles,
                       scale_log2, SEQ_Q, WG: gl.constexpr):  # fmt: skip
    # dense, FlashAttention-3's inter-warpgroup ping-pong: in its turn a warpgroup issues tile j + 1's
    # scores and tile j's P V back to back, hands the turn to the other warpgroup (``turn``: one
    # mbarrier each, count 1), and runs tile j + 1's softmax while the other's products use the tensor
    # cores. The output is rescaled only after its pending P V has landed. (The compiler places the
    # softmax after the wait for P V, so only the overlap between the warpgroups is there; measured
    # within 2% of the plain form, session 25.) Both consumers take n_tiles - 1 turns; warpgroup 0's
    # first wait is at phase 1, which a fresh barrier has completed
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.shape[1]
    HEAD_D: gl.constexpr = q_bufs.shape[2]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    DTYPE: gl.constexpr = q_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row0 = first_row + WG * BLOCK_M
    m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    q = q_bufs.index(WG)
    mbarrier.wait(q_ready, 0)
    mbarrier.wait(k_ready.index(0), 0)
    qk = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    qk = warpgroup_mma_wait(0, deps=(qk,))
    p16, m_i, l_i, alpha = _scores_to_p(qk, m_i, l_i, scale_log2, p_layout, DTYPE)
    for j in range(n_tiles - 1):
        s = j % STAGES
        s1 = (j + 1) % STAGES
        mbarrier.wait(k_ready.index(s1), ((j + 1) // STAGES) & 1)
        mbarrier.wait(v_ready.index(s), (j // STAGES) & 1)
        mbarrier.wait(turn.index(WG), (j & 1) ^ (1 - WG))
        qk = warpgroup_mma(q, k_bufs.index(s1).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
        mbarrier.arrive(turn.index(1 - WG), count=1)
        qk = warpgroup_mma_wait(1, deps=(qk,))  # the scores have landed; P V may still run
        p16, m_i, l_i, alpha = _scores_to_p(qk, m_i, l_i, scale_log2, p_layout, DTYPE)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(s), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    last = n_tiles - 1
    s = last % STAGES
    mbarrier.wait(v_ready.index(s), (last // STAGES) & 1)
    acc = warpgroup_mma(p16, v_bufs.index(s), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(empty.index(s), count=1)
    _store_rows(acc, l_i, o_ptr, o_base, stride_os, row0, SEQ_Q)


@gluon.jit
def attn_ws_kernel(q_desc, k_desc, v_desc, o_ptr, scale_log2, H, KV_GROUP, SEQ_Q, SEQ_K,
                   q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, stride_ob, stride_oh, stride_os,
                   STAGES: gl.constexpr, CAUSAL: gl.constexpr, PIPELINED: gl.constexpr, PINGPONG: gl.constexpr,
                   CONSUMERS: gl.constexpr, LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   PDL: gl.constexpr):  # fmt: skip
    # program (pid_m, b * H + h): query rows pid_m * CONSUMERS * BLOCK_M .. + CONSUMERS * BLOCK_M of head
    # h of batch b. A head's rows in the TMA views: row b * rb + h * rh + s, column h * ch (``tma_view``)
    pdl_start(PDL)
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    kv_h = h // KV_GROUP
    first_row = pid_m * CONSUMERS * BLOCK_M
    n_tiles = gl.cdiv(SEQ_K, BLOCK_N)
    if CAUSAL:
        n_tiles = gl.minimum(n_tiles, gl.cdiv(first_row + CONSUMERS * BLOCK_M, BLOCK_N))
    q_row = b * q_rb + h * q_rh + first_row
    q_col = h * q_ch
    kv_row = b * kv_rb + kv_h * kv_rh
    kv_col = kv_h * kv_ch
    o_base = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)  # every consumer reads every slot
    FIRST: gl.constexpr = 0
    SECOND: gl.constexpr = 1
    THIRD: gl.constexpr = 2
    # consumer 0 is the default partition (the kernel's 4 warps); arguments written inline (a tuple
    # held in a variable would turn the constexprs into tensors)
    # fmt: off
    if PINGPONG:
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        gl.warp_specialize([
            (_consumer_pingpong, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, turn, o_ptr, o_base, stride_os,
                                  first_row, n_tiles, scale_log2, SEQ_Q, FIRST)),
            (_consumer_pingpong, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, turn, o_ptr, o_base, stride_os,
                                  first_row, n_tiles, scale_log2, SEQ_Q, SECOND)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, q_row, q_col, kv_row,
                       kv_col, n_tiles)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize([
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row,
                         n_tiles, scale_log2, SEQ_Q, CAUSAL, FIRST, PIPELINED)),
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row,
                         n_tiles, scale_log2, SEQ_Q, CAUSAL, SECOND, PIPELINED)),
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row,
                         n_tiles, scale_log2, SEQ_Q, CAUSAL, THIRD, PIPELINED)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, q_row, q_col, kv_row,
                       kv_col, n_tiles)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row,
                         n_tiles, scale_log2, SEQ_Q, CAUSAL, FIRST, PIPELINED)),
            (_consumer, (q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, o_ptr, o_base, stride_os, first_row,
                         n_tiles, scale_log2, SEQ_Q, CAUSAL, SECOND, PIPELINED)),
            (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready.index(0), k_ready, v_ready, empty, q_row, q_col, kv_row,
                       kv_col, n_tiles)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    # fmt: on


@dataclass(frozen=True)
class TmaView:
    """A ``[B, H, S, D]`` view as a 2-D tensor TMA can address: ``view`` is ``[rows, cols]`` with unit
    column stride, and head h of batch b starts at row ``b * rb + h * rh``, column ``h * ch``."""

    view: torch.Tensor
    rb: int
    rh: int
    ch: int


def tma_view(t: torch.Tensor) -> TmaView | None:
    """The 2-D form of ``t`` (``[B, H, S, D]``, any strides with a unit last one), or None where its
    heads are neither whole row blocks nor column blocks of one row-major tensor."""
    b, h, s, d = t.shape
    sb, sh, ss, sd = t.stride()
    if sd != 1 or ss < d or (b > 1 and sb % ss) or (t.element_size() * ss) % 16 or t.data_ptr() % 16:
        return None
    rb = sb // ss if b > 1 else 0
    if h == 1 or (sh >= ss * s and sh % ss == 0):  # heads are row blocks (contiguous [B, H, S, D])
        rh = sh // ss if h > 1 else 0
        rows = (b - 1) * rb + (h - 1) * rh + s
        return TmaView(t.as_strided((rows, d), (ss, 1)), rb, rh, 0)
    if sh >= d and (h - 1) * sh + d <= ss and (sh * t.element_size()) % 16 == 0:  # heads are column blocks
        rows = (b - 1) * rb + s
        return TmaView(t.as_strided((rows, (h - 1) * sh + d), (ss, 1)), rb, 0, sh)
    return None


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, cfg: WsAttnConfig, has_mask: bool = False) -> str | None:
    """None when ``attention_ws`` can run this problem with ``cfg``, else why not."""
    if has_mask:
        return "masks are not supported"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"fp16/bf16 only (got {q.dtype})"
    d = q.shape[-1]
    if d not in (64, 128):
        return f"head dim {d} (64 or 128 only)"
    sq, sk = q.shape[2], k.shape[2]
    if causal and sq != sk:
        return "causal needs as many keys as queries"
    if causal and cfg.pingpong:
        return "the ping-pong form is dense only (causal consumers take unequal numbers of turns)"
    if cfg.consumers not in (2, 3):
        return f"{cfg.consumers} consumer warpgroups (2 or 3)"
    if cfg.consumers == 3 and (cfg.pingpong or cfg.pipelined):
        return "three consumers run the plain form only (160 registers a thread hold one score tile)"
    # a program's last consumer tiles may lie past the queries (their rows are not stored), never partly
    q_tile = cfg.block_m if cfg.consumers == 3 else 2 * cfg.block_m
    if sq % q_tile or sk % cfg.block_n:
        return f"sequence {sq} x {sk} is not a multiple of the tiles ({q_tile} queries, {cfg.block_n} keys)"
    if k.stride() != v.stride():
        return "K and V must have the same strides"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if tma_view(t) is None:
            return f"TMA cannot address {name} (strides {tuple(t.stride())})"
    if cfg.pingpong and cfg.pipelined:
        return "pipelined and ping-pong are two forms of one loop: pick one"
    if cfg.smem_bytes(d, q.element_size()) > 232448:
        return "the tiles do not fit in shared memory"
    return None


def _descs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: WsAttnConfig) -> tuple[Any, Any, Any, TmaView, TmaView]:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    tdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[q.dtype]
    d = q.shape[-1]
    qv, kv, vv = tma_view(q), tma_view(k), tma_view(v)
    assert qv is not None and kv is not None and vv is not None

    def desc(view: torch.Tensor, rows: int) -> Any:
        block = [rows, d]
        return TensorDescriptor.from_tensor(view, block, gl.NVMMASharedLayout.get_default_for(block, tdt))

    return desc(qv.view, cfg.block_m), desc(kv.view, cfg.block_n), desc(vv.view, cfg.block_n), qv, kv


def attention_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: WsAttnConfig | None = None,
) -> torch.Tensor:
    """Attention on ``[B, H, S, D]`` views (K/V may have H / G heads) with the warp-specialised
    kernel; raises ValueError with ``eligible``'s reason where it cannot run. Needs an sm_90 GPU."""
    cfg = config or WsAttnConfig()
    why = eligible(q, k, v, causal, cfg)
    if why:
        raise ValueError(f"attention_ws: {why}")
    b, h, s, d = q.shape
    hk = k.shape[1]
    if h % hk:
        raise ValueError(f"attention_ws: {h} query heads cannot share {hk} key/value heads")
    scale = d**-0.5 if scale is None else float(scale)
    if scale <= 0:
        raise ValueError("attention_ws: the scale must be positive (the exponent keeps the scores unscaled)")
    o = out if out is not None else torch.empty((b, h, s, d), dtype=q.dtype, device=q.device)
    qd, kd, vd, qv, kvv = _descs(q, k, v, cfg)
    grid = (-(-s // (cfg.consumers * cfg.block_m)), b * h)
    attn_ws_kernel[grid](
        qd, kd, vd, o, scale * _LOG2E, h, h // hk, s, k.shape[2],
        qv.rb, qv.rh, qv.ch, kvv.rb, kvv.rh, kvv.ch, o.stride(0), o.stride(1), o.stride(2),
        STAGES=cfg.stages, CAUSAL=bool(causal), PIPELINED=cfg.pipelined, PINGPONG=cfg.pingpong, CONSUMERS=cfg.consumers,
        LOADER_REGS=LOADER_REGS[cfg.consumers], CONSUMER_REGS=CONSUMER_REGS[cfg.consumers], num_warps=4, **pdl.launch_kwargs(),
    )  # fmt: skip
    return o


def compile_offline(
    b: int, h: int, hk: int, s: int, d: int, causal: bool, cfg: WsAttnConfig, dtype: torch.dtype = torch.float16, layout: str = "bhsd"
) -> Any:
    """Compile the kernel for sm_90 without a GPU and return Triton's ``CompiledKernel`` (its
    ``asm["sass"]`` needs the ``nvdisasm`` the Triton wheel carries). ``layout``: "bhsd" (contiguous
    heads, row blocks) or "bshd" (heads as column blocks of one projection output)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    def make(heads: int) -> torch.Tensor:
        if layout == "bhsd":
            return torch.empty((b, heads, s, d), dtype=dtype)
        return torch.empty((b, s, heads, d), dtype=dtype).permute(0, 2, 1, 3)

    q, k, v = make(h), make(hk), make(hk)
    why = eligible(q, k, v, causal, cfg)
    if why:
        raise ValueError(f"attention_ws: {why}")
    qd, kd, vd, _, _ = _descs(q, k, v, cfg)
    fn = attn_ws_kernel
    ptr = {torch.float16: "*fp16", torch.bfloat16: "*bf16"}[dtype]
    sig: dict[str, str] = {"q_desc": mangle_type(qd), "k_desc": mangle_type(kd), "v_desc": mangle_type(vd), "o_ptr": ptr}
    sig["scale_log2"] = "fp32"
    for name in (
        "H",
        "KV_GROUP",
        "SEQ_Q",
        "SEQ_K",
        "q_rb",
        "q_rh",
        "q_ch",
        "kv_rb",
        "kv_rh",
        "kv_ch",
        "stride_ob",
        "stride_oh",
        "stride_os",
    ):
        sig[name] = "i32"
    constexprs = {"STAGES": cfg.stages, "CAUSAL": causal, "PIPELINED": cfg.pipelined, "PINGPONG": cfg.pingpong, "CONSUMERS": cfg.consumers}
    constexprs.update(LOADER_REGS=LOADER_REGS[cfg.consumers], CONSUMER_REGS=CONSUMER_REGS[cfg.consumers], PDL=False)
    for name in constexprs:
        sig[name] = "constexpr"
    keyed = {(fn.arg_names.index(name),): val for name, val in constexprs.items()}
    src = GluonASTSource(fn, sig, keyed)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
