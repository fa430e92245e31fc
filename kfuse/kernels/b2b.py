"""Back-to-back (persistent) GEMM / Conv chains in one kernel (Bolt's persistent kernel fusion).

A chain is ``stage 0 -> stage 1 -> ... -> stage L-1``. Stage 0 is a GEMM ``x (M, K0) @ W0`` or an
implicit-GEMM convolution (any KxK, stride, padding, on an (N, C, H, W) input of any memory
format; M = N*OH*OW output pixels). Every later stage is a GEMM whose K is the previous stage's
N (a Linear, or a 1x1 / stride-1 / unpadded convolution, which is the same GEMM on the pixel
rows). Each stage has its own generated epilogue (``Epilogue``: bias, activation, residual...).

Threadblock residence: a program owns BLOCK_M rows and computes the *whole* width N_l of every
intermediate stage (padded to a power of two >= 16), so stage l+1 can start from stage l's tile
without any other program's data. The intermediate tile is rounded to the intermediate's dtype
(as the unfused graph would store it), its padded columns are zeroed, and it is fed to the next
``tl.dot`` directly. Only the last stage is stored to global memory (``tests/kernels/test_b2b.py``
checks the compiled sm_90 PTX: exactly one global store instruction per kernel).

Where the intermediate lives between the two ``tl.dot`` calls is decided by the tiling, as in
CUTLASS's b2b example, and is a template parameter here (``residence``):

* ``"register"`` (RF-resident): the warps of a program are stacked along M only (the M tile is
  ``16 * num_warps`` rows on mma.sync, one 64-row warpgroup per 4 warps on wgmma), so each warp
  already holds complete rows of the GEMM0 accumulator, which are exactly the A-operand rows it
  needs for GEMM1. Triton converts the accumulator layout to the dot-operand layout in registers
  (on sm_90 the second product is a register-A ``wgmma ... {%r..}`` instruction) - no shared
  memory traffic for the intermediate.
* ``"smem"`` (shared-memory-resident): the intermediate is written to shared memory and GEMM1
  reads it from there (``st.shared`` of the tile, then a shared-memory-descriptor ``wgmma`` /
  ``ldmatrix``). Triton has no explicit shared-memory allocation in the language, so the
  template expresses it as the product in transposed form, ``out^T = W1^T @ h^T``: ``h^T`` is
  the B operand, and B operands of tensor-core MMAs always come from shared memory. This frees
  the intermediate's registers while GEMM1 runs (wide N0, many stages) at the price of a
  round trip through shared memory.

Hopper conv chains also have ``b2b_conv_tma_kernel`` (configs with ``tma`` and a spatial tile
``tile_h``): a program owns a tile_h x (BLOCK_M / tile_h) pixel tile of one image, and stage 0's
A tiles are TMA boxes of the NHWC input shifted by each filter tap (TMA's zero fill of the
out-of-bounds part is the padding), as in CUTLASS's Hopper implicit-GEMM convs; the output
tiles leave by TMA stores. Stride 1, NHWC, 16-byte aligned rows; else ``b2b_kernel`` runs.

The launcher takes torch tensors; ``reference`` is the oracle (stage by stage in fp32, rounding
the intermediates to their dtypes like the unfused graph).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.kernels.codegen import as_pair, interpreting, load_generated
from kfuse.kernels.epilogue import Epilogue, apply_reference, render

MAX_RESIDENT = 256  # widest intermediate a program keeps resident (N0 <= 256, issue 5)
RESIDENCES = ("register", "smem")


def pad_width(n: int) -> int:
    """The resident tile width for an intermediate of width ``n``: a power of two >= 16."""
    p = 16
    while p < n:
        p *= 2
    return p


# ---------------------------------------------------------------------------------------
# the chain description and the generated source
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One stage of a chain: its epilogue, whether it has a separate bias vector (conv nodes
    carry their bias apart from the epilogue), and the dtype its result is rounded to."""

    epilogue: Epilogue
    out_dtype: torch.dtype
    has_bias: bool = False


@dataclass(frozen=True)
class Chain:
    stages: tuple[Stage, ...]
    conv: bool = False  # stage 0 is an implicit-GEMM convolution

    def key(self) -> str:
        parts = [f"{s.epilogue.key()}:{s.has_bias}:{s.out_dtype}" for s in self.stages]
        return ("conv" if self.conv else "gemm") + "_" + hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]

    def describe(self) -> str:
        return " => ".join(("conv" if (i == 0 and self.conv) else "gemm") + f"[{s.epilogue.describe()}]" for i, s in enumerate(self.stages))


@dataclass(frozen=True)
class B2BConfig:
    block_m: int = 64
    block_k: int = 32  # stage 0's K step
    block_n: int = 64  # last stage's N step
    num_warps: int = 4
    num_stages: int = 2
    residence: str = "register"
    persistent: bool = False  # fixed grid looping over row tiles, pipelined across tiles
    # the resident stages' weights are loaded before stage 0's GEMM (when the last width fits one
    # N tile), so their latency overlaps stage 0's loads instead of following its GEMM
    preload: bool = False
    # with ``persistent``: GEMM chains whose K0 and last width fit one tile read x and write the
    # output by TMA (``b2b_tma_kernel``); the pipeliner keeps TILE_STAGES row tiles in flight
    tma: bool = False
    programs_per_sm: int = 2  # persistent grid = programs_per_sm x SMs (capped at the tile count)
    # with ``tma`` on a conv chain: the spatial tile of ``b2b_conv_tma_kernel``, tile_h x
    # (block_m // tile_h) output pixels of one image (powers of two); 0: not that kernel
    tile_h: int = 0

    def describe(self) -> str:
        d = f"{self.residence} m{self.block_m} k{self.block_k} n{self.block_n} w{self.num_warps} s{self.num_stages}"
        d += (" persistent" if self.persistent else "") + (" preload" if self.preload else "")
        if self.tma and self.tile_h:
            d += f" tma {self.tile_h}x{self.block_m // self.tile_h}"
        elif self.tma:
            d += f" tma x{self.programs_per_sm}"
        return d

    def as_dict(self) -> dict[str, Any]:
        keys = ("block_m", "block_k", "block_n", "num_warps", "num_stages", "residence", "persistent", "preload", "tma", "programs_per_sm",
                "tile_h")  # fmt: skip
        return {k: getattr(self, k) for k in keys}


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


def _stage_tail(chain: Chain, s: int, offs_n: str, mask_n: str, ind: int, acc: str = "acc") -> str:
    """Bias + extra loads + the generated epilogue of stage ``s`` applied to ``acc``."""
    st = chain.stages[s]
    lines = []
    if st.has_bias:
        lines.append(f"{acc} += tl.load(bias{s}_ptr + {offs_n}, mask={mask_n}, other=0.0).to(tl.float32)[None, :]")
    for j in range(st.epilogue.n_inputs):
        # an extra broadcast along the rows (a Linear's bias: strides 0 but the channel's) is
        # loaded once per tile as a vector, not as a BLOCK_M x N tile of repeated values
        lines += [
            f"if ROWBCAST_{s}_{j}:",
            f"    e{s}_{j} = tl.load(e{s}_{j}_ptr + {offs_n} * se{s}_{j}c, mask={mask_n}, other=0.0)[None, :]",
            "else:",
            f"    e{s}_{j} = tl.load(e{s}_{j}_ptr + (n_idx * se{s}_{j}n + oh * se{s}_{j}h + ow * se{s}_{j}w)[:, None]"
            f" + {offs_n}[None, :] * se{s}_{j}c, mask=mask_m[:, None] & {mask_n}[None, :], other=0.0)",
        ]
    body = "\n".join(lines)
    epi = render(st.epilogue, acc=acc, inp=lambda j, s=s: f"e{s}_{j}", indent="")
    return _indent("\n".join(x for x in (body, epi) if x), ind)


def kernel_source(chain: Chain) -> str:
    """Triton source of ``b2b_kernel`` (one program per row tile) and ``b2b_persistent_kernel``
    (a fixed grid looping over row tiles, software-pipelined across tiles) for ``chain``."""
    L = len(chain.stages)
    if L < 2:
        raise ValueError("a b2b chain has at least two stages")
    ptrs = ["x_ptr"] + [f"w{s}_ptr" for s in range(L)] + ["out_ptr"]
    strides: list[str] = []
    for s, st in enumerate(chain.stages):
        if st.has_bias:
            ptrs.append(f"bias{s}_ptr")
        for j in range(st.epilogue.n_inputs):
            ptrs.append(f"e{s}_{j}_ptr")
            strides += [f"se{s}_{j}n", f"se{s}_{j}c", f"se{s}_{j}h", f"se{s}_{j}w"]
    dims = ", ".join(f"N{s}" for s in range(L))
    pads = ", ".join([f"P{s}: tl.constexpr" for s in range(L - 1)] + [f"{b}: tl.constexpr" for b in _rowbcast_names(chain)])
    params = [
        f"    {', '.join(ptrs)},",
        f"    NB, C, H, W, OH, OW, {dims},",
        "    sxn, sxc, sxh, sxw, son, soc, soh, sow,",
        f"    {', '.join(strides) + ',' if strides else ''}",
        "    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,",
        "    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,",
        f"    {pads},",
        "    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,",
        "    SMEM: tl.constexpr, PREC: tl.constexpr, SINGLE_K: tl.constexpr, SINGLE_N: tl.constexpr,",
        "    PRELOAD: tl.constexpr,",
    ]
    body = _body(chain)
    src = ["import triton", "import triton.language as tl", "", "", "@triton.jit", "def b2b_kernel(", *params, "):"]
    src += ["    M = NB * OH * OW", "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)", *body]
    # persistent: the loop over row tiles is what Triton's software pipeliner overlaps (the next
    # tiles' loads are in flight while this tile's GEMMs and store run); with a single K step there
    # is no inner loop, so the tile loop is the innermost one and is pipelined
    src += ["", "", "@triton.jit", "def b2b_persistent_kernel(", *params]
    src += ["    NUM_PROGRAMS: tl.constexpr, TILE_STAGES: tl.constexpr,", "):"]
    src += [
        "    M = NB * OH * OW",
        "    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), NUM_PROGRAMS, num_stages=TILE_STAGES):",
        "        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)",
        *[("    " + ln) if ln.strip() else ln for ln in body],
    ]
    if chain.conv:
        src += ["", "", *_conv_tma_kernel(chain, params)]
    else:
        src += ["", "", *_tma_kernel(chain, ptrs, params)]
    return "\n".join(src) + "\n"


def _tma_kernel(chain: Chain, ptrs: list[str], params: list[str]) -> list[str]:
    """``b2b_tma_kernel``: the persistent GEMM chain with x tiles loaded and output tiles stored
    by TMA (host tensor descriptors ``x_desc`` (M, K0) and ``out_desc`` (M, N_last)). Memory-bound
    chains (small widths, large M) need many row tiles in flight per SM: descriptor loads in the
    tile loop are what Triton's pipeliner multi-buffers (TILE_STAGES deep), where the pointer
    kernel's masked gathers were not overlapped (its persistent form measured 3x slower than one
    program per tile). Only for K0 and the last width in one tile each (SINGLE_K, SINGLE_N)."""
    L = len(chain.stages)
    sig = [p.replace("x_ptr", "x_desc").replace("out_ptr", "out_desc") for p in params]
    out_t = _tl_dtype(chain.stages[-1].out_dtype)
    src = ["@triton.jit", "def b2b_tma_kernel(", *sig, "    NUM_PROGRAMS: tl.constexpr, TILE_STAGES: tl.constexpr,", "):"]
    src += ["    M = NB", "    oh = 0", "    ow = 0"]
    # the weights: loop-invariant; with PRELOAD loaded once per program, before the tile loop
    wload = []
    for s in range(L):
        k_pad, k_dim = ("BLOCK_K", "C") if s == 0 else (f"P{s - 1}", f"N{s - 1}")
        n_pad = f"P{s}" if s < L - 1 else "BLOCK_N"
        wload.append(
            f"tl.load(w{s}_ptr + tl.arange(0, {k_pad})[:, None] * N{s} + tl.arange(0, {n_pad})[None, :],"
            f" mask=(tl.arange(0, {k_pad}) < {k_dim})[:, None] & (tl.arange(0, {n_pad}) < N{s})[None, :], other=0.0)"
        )
    src += ["    if PRELOAD:"] + [f"        wt{s} = {wload[s]}" for s in range(L)]
    src += [
        "    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), NUM_PROGRAMS, num_stages=TILE_STAGES):",
        "        off = tile * BLOCK_M",
        "        offs_m = off + tl.arange(0, BLOCK_M)",
        "        mask_m = offs_m < M",
        "        n_idx = tl.where(mask_m, offs_m, 0)",
        "        a = x_desc.load([off, 0])",
    ]
    for s in range(L):
        n_pad = f"P{s}" if s < L - 1 else "BLOCK_N"
        src += [
            f"        offs_n = tl.arange(0, {n_pad})",
            f"        mask_n = offs_n < N{s}",
            "        if PRELOAD:",
            f"            b = wt{s}",
            "        else:",
            f"            b = {wload[s]}",
        ]
        if s == 0:
            src += ["        acc = tl.dot(a, b, input_precision=PREC)"]
        else:
            prev_dtype = _tl_dtype(chain.stages[s - 1].out_dtype)
            src += [
                f"        h = tl.where(prev_mask[None, :], acc.to({prev_dtype}), 0.0).to({prev_dtype})",
                "        if SMEM:",
                "            acc = tl.trans(tl.dot(tl.trans(b), tl.trans(h), input_precision=PREC))",
                "        else:",
                "            acc = tl.dot(h, b, input_precision=PREC)",
            ]
        src += [_stage_tail(chain, s, "offs_n", "mask_n", 8), "        prev_mask = mask_n"]
    src += [f"        out_desc.store([off, 0], acc.to({out_t}))"]
    return [ln for chunk in src for ln in chunk.split("\n")]


def _rowbcast_names(chain: Chain) -> list[str]:
    """One constexpr per epilogue extra: true when the launcher saw it broadcast along the rows."""
    return [f"ROWBCAST_{s}_{j}" for s, st in enumerate(chain.stages) for j in range(st.epilogue.n_inputs)]


def _body(chain: Chain) -> list[str]:
    """The kernel body for the row tile ``offs_m`` (function-level indentation)."""
    src = [
        "    mask_m = offs_m < M",
        "    offs_m = tl.where(mask_m, offs_m, 0)",
    ]
    if chain.conv:
        src += [
            "    n_idx = offs_m // (OH * OW)",
            "    rem = offs_m % (OH * OW)",
            "    oh = rem // OW",
            "    ow = rem % OW",
        ]
    else:  # a GEMM is the 1x1 conv of an NBx1x1 image: row m is image m
        src += ["    n_idx = offs_m", "    oh = offs_m * 0", "    ow = offs_m * 0"]
    src += _preload(chain)
    # ---- stage 0: the K loop over (kh, kw, channel block) from global memory -----------------
    src += [
        "    ih0 = oh * SH - PH",
        "    iw0 = ow * SW - PW",
        "    x_base = x_ptr + n_idx * sxn",
        "    offs_k = tl.arange(0, BLOCK_K)",
        "    offs_n = tl.arange(0, P0)",
        "    mask_n = offs_n < N0",
        "    if SINGLE_K:  # one tap, all channels in one step: no K loop",
        "        ok = mask_m & (ih0 >= 0) & (ih0 < H) & (iw0 >= 0) & (iw0 < W)",
        "        a = tl.load(x_base[:, None] + (ih0 * sxh + iw0 * sxw)[:, None] + offs_k[None, :] * sxc,"
        " mask=ok[:, None] & (offs_k < C)[None, :], other=0.0)",
        "        b = tl.load(w0_ptr + offs_k[:, None] * N0 + offs_n[None, :], mask=(offs_k < C)[:, None] & mask_n[None, :], other=0.0)",
        "        acc = tl.dot(a, b, input_precision=PREC)",
        "    else:",
        "        acc = tl.zeros((BLOCK_M, P0), dtype=tl.float32)",
        "        n_cb = tl.cdiv(C, BLOCK_K)",
        "        for it in range(0, KH * KW * n_cb):",
        "            cb = it % n_cb",
        "            tap = it // n_cb",
        "            ih = ih0 + (tap // KW) * DH",
        "            iw = iw0 + (tap % KW) * DW",
        "            ok = mask_m & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
        "            cc = cb * BLOCK_K + offs_k",
        "            a = tl.load(x_base[:, None] + (ih * sxh + iw * sxw)[:, None] + cc[None, :] * sxc,"
        " mask=ok[:, None] & (cc < C)[None, :], other=0.0)",
        "            b = tl.load(w0_ptr + (tap * C + cc)[:, None] * N0 + offs_n[None, :],"
        " mask=(cc < C)[:, None] & mask_n[None, :], other=0.0)",
        "            acc = tl.dot(a, b, acc, input_precision=PREC)",
        _stage_tail(chain, 0, "offs_n", "mask_n", 4),
    ]
    store = [
        "o_ptrs = out_ptr + (n_idx * son + oh * soh + ow * sow)[:, None] + offs_o[None, :] * soc",
        "tl.store(o_ptrs, acc_o.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_o[None, :])",
    ]
    src += _later_stages(chain, lambda n0: store)
    return [ln for chunk in src for ln in chunk.split("\n")]


def _preload(chain: Chain) -> list[str]:
    """With PRELOAD, the resident stages' weights: in flight while stage 0 loads and multiplies."""
    src = ["    if PRELOAD:  # only with SINGLE_N (the launcher): every weight is one tile"]
    for s in range(1, len(chain.stages)):
        n_range = f"P{s}" if s < len(chain.stages) - 1 else "BLOCK_N"
        src += [
            f"        wk{s} = tl.arange(0, P{s - 1})",
            f"        wn{s} = tl.arange(0, {n_range})",
            f"        wpre{s} = tl.load(w{s}_ptr + wk{s}[:, None] * N{s} + wn{s}[None, :],"
            f" mask=(wk{s} < N{s - 1})[:, None] & (wn{s} < N{s})[None, :], other=0.0)",
        ]
    return src


def _later_stages(chain: Chain, store: Callable[[str], list[str]]) -> list[str]:
    """Stages 1..L-1 from stage 0's ``acc`` (``mask_n`` its columns): each resident intermediate
    feeds the next ``tl.dot``; the last stage runs in N tiles (one, or a loop), each written by
    ``store(first column)`` (the kernel's only global store)."""
    L = len(chain.stages)
    src: list[str] = []
    for s in range(1, L):
        prev_dtype = _tl_dtype(chain.stages[s - 1].out_dtype)
        src += [
            f"    # stage {s}: the intermediate of stage {s - 1} stays on chip",
            f"    h = tl.where(mask_n[None, :], acc.to({prev_dtype}), 0.0).to({prev_dtype})",
            f"    offs_k = tl.arange(0, P{s - 1})",
            f"    mask_k = offs_k < N{s - 1}",
        ]
        if s < L - 1:
            src += [
                f"    offs_n = tl.arange(0, P{s})",
                f"    mask_n = offs_n < N{s}",
                "    if PRELOAD:",
                f"        b = wpre{s}",
                "    else:",
                f"        b = tl.load(w{s}_ptr + offs_k[:, None] * N{s} + offs_n[None, :],"
                " mask=mask_k[:, None] & mask_n[None, :], other=0.0)",
                "    if SMEM:",
                "        acc = tl.trans(tl.dot(tl.trans(b), tl.trans(h), input_precision=PREC))",
                "    else:",
                "        acc = tl.dot(h, b, input_precision=PREC)",
                _stage_tail(chain, s, "offs_n", "mask_n", 4),
            ]
            continue
        load_o = f"tl.load(w{s}_ptr + offs_k[:, None] * N{s} + offs_o[None, :], mask=mask_k[:, None] & mask_o[None, :], other=0.0)"
        head = [f"mask_o = offs_o < N{s}"]
        mma = [
            "if SMEM:",
            "    acc_o = tl.trans(tl.dot(tl.trans(b_o), tl.trans(h), input_precision=PREC))",
            "else:",
            "    acc_o = tl.dot(h, b_o, input_precision=PREC)",
            _stage_tail(chain, s, "offs_o", "mask_o", 0, acc="acc_o"),
        ]
        one_tile = [*head, "if PRELOAD:", f"    b_o = wpre{s}", "else:", f"    b_o = {load_o}", *mma, *store("0")]
        loop = [*head, f"b_o = {load_o}", *mma, *store("n0")]
        src += [
            "    if SINGLE_N:  # the whole last width in one tile: no N loop",
            "        offs_o = tl.arange(0, BLOCK_N)",
            _indent("\n".join(x for x in one_tile if x), 8),
            "    else:",
            f"        for n0 in range(0, N{s}, BLOCK_N):",
            "            offs_o = n0 + tl.arange(0, BLOCK_N)",
            _indent("\n".join(x for x in loop if x), 12),
        ]
    return src


def _conv_tma_kernel(chain: Chain, params: list[str]) -> list[str]:
    """``b2b_conv_tma_kernel``: the conv chain for Hopper with stage 0's A tiles and the output
    tiles moved by TMA, as CUTLASS's Hopper implicit-GEMM convs do. A program owns a BH x BW
    spatial tile of one image (BLOCK_M = BH * BW output pixels); for each filter tap and channel
    block it loads the input box [1, BH, BW, BLOCK_K] of the NHWC input shifted by the tap
    (host descriptor ``x_desc`` over (N, H, W, C)). TMA zero-fills the box's out-of-bounds part,
    negative coordinates included, which is exactly the convolution's zero padding (stride 1
    only: the launcher falls back to ``b2b_kernel`` otherwise). The last stage's tiles are stored
    through ``out_desc`` over the NHWC output (N, OH, OW, N_last), which clips the rows past the
    image's right / bottom edge."""
    sig = [p.replace("x_ptr", "x_desc").replace("out_ptr", "out_desc") for p in params]
    out_t = _tl_dtype(chain.stages[-1].out_dtype)
    src = ["@triton.jit", "def b2b_conv_tma_kernel(", *sig, "    BH: tl.constexpr, BW: tl.constexpr,", "):"]
    src += [
        "    tiles_w = tl.cdiv(OW, BW)",
        "    per_image = tl.cdiv(OH, BH) * tiles_w",
        "    n_idx = tl.program_id(0) // per_image",
        "    tile = tl.program_id(0) % per_image",
        "    oh0 = (tile // tiles_w) * BH",
        "    ow0 = (tile % tiles_w) * BW",
        "    oh = oh0 + tl.arange(0, BLOCK_M) // BW",
        "    ow = ow0 + tl.arange(0, BLOCK_M) % BW",
        "    # rows past the right / bottom edge are computed (on whatever the boxes hold) but never",
        "    # stored (TMA clips them); the extras' loads are masked with them",
        "    mask_m = (oh < OH) & (ow < OW)",
        *_preload(chain),
        "    offs_k = tl.arange(0, BLOCK_K)",
        "    offs_n = tl.arange(0, P0)",
        "    mask_n = offs_n < N0",
        "    # stage 0: one box per (tap, channel block); channels past C are zero-filled like the padding.",
        "    # The product in transposed form, acc^T = W0^T @ A^T: A^T is the MMA's B operand, which is read",
        "    # from shared memory, so the box's reshape folds into a view of the TMA buffer and wgmma reads",
        "    # it there (as the A operand the reshaped box is copied to registers, ldmatrix every K step)",
        "    acc_t = tl.zeros((P0, BLOCK_M), dtype=tl.float32)",
        "    n_cb = tl.cdiv(C, BLOCK_K)",
        "    for it in range(0, KH * KW * n_cb):",
        "        cb = it % n_cb",
        "        tap = it // n_cb",
        "        box = x_desc.load([n_idx, oh0 + (tap // KW) * DH - PH, ow0 + (tap % KW) * DW - PW, cb * BLOCK_K])",
        "        a = box.reshape(BLOCK_M, BLOCK_K)",
        "        cc = cb * BLOCK_K + offs_k",
        "        b = tl.load(w0_ptr + (tap * C + cc)[:, None] * N0 + offs_n[None, :], mask=(cc < C)[:, None] & mask_n[None, :], other=0.0)",
        "        acc_t = tl.dot(tl.trans(b), tl.trans(a), acc_t, input_precision=PREC)",
        "    acc = tl.trans(acc_t)",
        _stage_tail(chain, 0, "offs_n", "mask_n", 4),
    ]
    src += _later_stages(chain, lambda n0: [f"out_desc.store([n_idx, oh0, ow0, {n0}], acc_o.to({out_t}).reshape(1, BH, BW, BLOCK_N))"])
    return [ln for chunk in src for ln in chunk.split("\n")]


_TL = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}


def _tl_dtype(d: torch.dtype) -> str:
    if d not in _TL:
        raise ValueError(f"b2b: intermediate dtype {d} is not supported (fp16, bf16, fp32)")
    return _TL[d]


def _module(chain: Chain):  # noqa: ANN202 - a generated module holding a triton JITFunction
    return load_generated("b2b", chain.key(), kernel_source(chain))


# ---------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------
def default_config(m: int, widths: list[int], residence: str | None = None) -> B2BConfig:
    """A tile for the chain when nothing was measured. Register residence while the widest
    resident tile is at most 128 columns; wider tiles go through shared memory."""
    widest = max(pad_width(w) for w in widths[:-1])
    res = residence or ("register" if widest <= 128 else "smem")
    last = min(pad_width(widths[-1]), 128)
    if interpreting():
        return B2BConfig(16, 32, min(last, 64), 4, 1, res)
    if widest <= 64:
        return B2BConfig(128, 64, last, 8 if res == "smem" else 4, 2, res)
    if widest <= 128:
        return B2BConfig(64, 64, last, 4, 2, res)
    return B2BConfig(64, 32, min(last, 64), 8 if res == "smem" else 4, 2, res)


def candidate_configs(m: int, widths: list[int], k0: int | None = None) -> list[B2BConfig]:
    """The few configs the fused-vs-unfused decision measures on the GPU. Chains of more than
    three stages compile slowly (a wide register-resident 9-stage chain takes minutes of ptxas):
    they try only the default and one smem-resident alternative. GEMM chains whose first K
    (``k0``) fits one K step also try the persistent kernel pipelined across row tiles, the form
    for memory-bound chains (small widths, large M): the next tiles' loads are in flight while
    a tile's GEMMs and store run."""
    widest = max(pad_width(w) for w in widths[:-1])
    last = min(pad_width(widths[-1]), 128)
    persistent: list[B2BConfig] = []
    if k0 is not None and k0 <= 128 and widths[-1] <= 128 and len(widths) <= 3:
        bk = max(16, pad_width(k0))
        res = "register" if widest <= 128 else "smem"
        persistent = [B2BConfig(128, bk, last, 4 if res == "register" else 8, 3, res, True),
                      B2BConfig(64, bk, last, 4, 4, res, True)]  # fmt: skip
        # the same loop with x and the output moved by TMA (b2b_tma_kernel): deeper pipelines for
        # the narrow chains, more programs per SM where registers allow (~115 regs at 32 wide,
        # 230-255 at 64-128 wide on sm_90)
        if widest <= 64:
            persistent += [B2BConfig(128, bk, last, 4, 4, res, True, tma=True, programs_per_sm=2),
                           B2BConfig(128, bk, last, 4, 3, res, True, preload=True, tma=True, programs_per_sm=2),
                           B2BConfig(64, bk, last, 4, 4, res, True, tma=True, programs_per_sm=4)]  # fmt: skip
        else:
            persistent += [B2BConfig(64, bk, last, 4, 3, res, True, tma=True, programs_per_sm=2),
                           B2BConfig(64, bk, last, 4, 2, res, True, preload=True, tma=True, programs_per_sm=2),
                           B2BConfig(128, bk, last, 8, 2, res, True, tma=True, programs_per_sm=1)]  # fmt: skip
            if bk <= 64:  # 64 -> 128 -> 64: the best two of the session-5 sweep at M = 1M (0.110 ms vs 0.120)
                persistent += [B2BConfig(128, bk, last, 8, 2, res, True, preload=True, tma=True, programs_per_sm=2),
                               B2BConfig(128, bk, last, 4, 2, res, True, tma=True, programs_per_sm=2)]  # fmt: skip
    if len(widths) > 3:
        first = default_config(m, widths)
        alt = B2BConfig(128, 32, min(last, 64), 8, 2, "smem") if widest > 128 else default_config(m, widths, "smem")
        return [first] if alt == first else [first, alt]
    out = [default_config(m, widths, "register"), default_config(m, widths, "smem")]
    if widest <= 128:
        out += [B2BConfig(128, 64, last, 8, 2, "register"), B2BConfig(64, 64, last, 4, 3, "register")]
        if k0 is None:  # conv chains: the best of the session-5 sweep on the H200 (3x3 -> 1x1 at 64/128 wide)
            out += [B2BConfig(128, 64, last, 4, 3, "register"), B2BConfig(128, 64, last, 4, 2, "smem"),
                    B2BConfig(64, 64, last, 4, 2, "smem")]  # fmt: skip
        if k0 is not None and k0 <= 128 and widths[-1] <= 128 and len(widths) <= 3:
            # the first K in one step (no K loop: on sm_90 a 128-wide chain then needs ~150
            # registers instead of ~235, so more programs fit an SM), and the same with the
            # resident weights preloaded; the default tile with preload too
            bk = max(16, pad_width(k0))
            out += [B2BConfig(64, bk, last, 4, 2, "register"), B2BConfig(64, bk, last, 4, 2, "register", preload=True)]
            # twice the rows per program: half the weight traffic from L2, which bounds 128-wide
            # chains at M = 1M (16384 programs x 64 KB of weights each with 64-row tiles)
            out += [B2BConfig(128, bk, last, 8, 2, "register")]
            out += [replace(default_config(m, widths, "register"), preload=True)]
    else:
        out += [B2BConfig(64, 64, min(last, 64), 4, 2, "register"), B2BConfig(128, 32, min(last, 64), 8, 2, "smem")]
    out += persistent
    if k0 is None:
        # conv chains: the Hopper kernel with TMA boxes (b2b_conv_tma_kernel; stride-1 NHWC
        # convs, else these run b2b_kernel): 8x16 and 16x8 pixel tiles of 128 rows, 8x8 of 64.
        # Register-resident up to 128 wide (no spills on sm_90: 124 / 76 registers at 64 wide,
        # 218 / 122 at 128), 8 warps through shared memory above
        if widest <= 128:
            out += [B2BConfig(128, 64, last, 4, 3, "register", tma=True, tile_h=8),
                    B2BConfig(128, 64, last, 4, 3, "register", tma=True, tile_h=16),
                    B2BConfig(64, 64, last, 4, 3, "register", tma=True, tile_h=8)]  # fmt: skip
        else:
            out += [B2BConfig(128, 64, min(last, 64), 8, 2, "smem", tma=True, tile_h=8),
                    B2BConfig(64, 64, min(last, 64), 4, 2, "smem", tma=True, tile_h=8)]  # fmt: skip
    seen, uniq = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


# ---------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------
@dataclass
class ConvGeom:
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)


def pack_first(w: torch.Tensor, conv: bool) -> torch.Tensor:
    """Stage 0's weight as a row-major (KH*KW*C, N0) matrix (GEMM: (K0, N0) made contiguous)."""
    if conv:
        return w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]).contiguous()
    return w.contiguous()


def pack_next(w: torch.Tensor) -> torch.Tensor:
    """A later stage's weight as a row-major (N_{l-1}, N_l) matrix (1x1 conv: (OC, C, 1, 1))."""
    if w.dim() == 4:
        return w.reshape(w.shape[0], w.shape[1]).t().contiguous()
    return w.contiguous()


@dataclass
class B2BArgs:
    """Everything a launch needs besides the config (built once per call by ``prepare``)."""

    x: torch.Tensor
    weights: list[torch.Tensor]  # packed
    biases: list[torch.Tensor | None]
    extras: list[list[torch.Tensor]]
    out: torch.Tensor
    dims: tuple[int, ...] = field(default_factory=tuple)  # NB, C, H, W, OH, OW
    widths: list[int] = field(default_factory=list)
    geom: ConvGeom = field(default_factory=ConvGeom)
    kernel_hw: tuple[int, int] = (1, 1)


def _out_hw(h: int, w: int, kh: int, kw: int, g: ConvGeom) -> tuple[int, int]:
    oh = (h + 2 * g.padding[0] - g.dilation[0] * (kh - 1) - 1) // g.stride[0] + 1
    ow = (w + 2 * g.padding[1] - g.dilation[1] * (kw - 1) - 1) // g.stride[1] + 1
    return oh, ow


def prepare(
    chain: Chain,
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    extras: list[list[torch.Tensor]],
    packed: list[torch.Tensor] | None = None,
    geom: ConvGeom | None = None,
    channels_last: bool = True,
    out: torch.Tensor | None = None,
) -> B2BArgs:
    """Check and normalise the operands. GEMM chains: ``x`` (..., K0) and weights (K, N);
    conv chains: ``x`` (N, C, H, W) any memory format, weights (OC, C, KH, KW) with every stage
    after the first 1x1."""
    L = len(chain.stages)
    if not (len(weights) == len(biases) == len(extras) == L):
        raise ValueError(f"b2b: chain has {L} stages, got {len(weights)} weights, {len(biases)} biases, {len(extras)} extra lists")
    geom = geom or ConvGeom()
    packed = packed or [pack_first(weights[0], chain.conv)] + [pack_next(w) for w in weights[1:]]
    widths = [int(p.shape[1]) for p in packed]
    for s in range(1, L):
        if packed[s].shape[0] != widths[s - 1]:
            raise ValueError(f"b2b: stage {s} takes K={packed[s].shape[0]}, stage {s - 1} makes N={widths[s - 1]}")
        if widths[s - 1] > MAX_RESIDENT:
            raise ValueError(f"b2b: intermediate width {widths[s - 1]} exceeds the resident limit {MAX_RESIDENT}")
    for s, st in enumerate(chain.stages):
        if len(extras[s]) != st.epilogue.n_inputs:
            raise ValueError(f"b2b: stage {s} epilogue expects {st.epilogue.n_inputs} extra inputs, got {len(extras[s])}")
        if st.has_bias != (biases[s] is not None):
            raise ValueError(f"b2b: stage {s} bias presence does not match the chain")
    if chain.conv:
        if x.dim() != 4:
            raise ValueError(f"b2b conv: input must be (N, C, H, W), got {tuple(x.shape)}")
        nb, c, h, w = x.shape
        kh, kw = weights[0].shape[2], weights[0].shape[3]
        if weights[0].shape[1] != c:
            raise ValueError(f"b2b conv: input has {c} channels, weight expects {weights[0].shape[1]}")
        oh, ow = _out_hw(h, w, kh, kw, geom)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        if out is None:
            out = torch.empty((nb, widths[-1], oh, ow), dtype=chain.stages[-1].out_dtype, device=x.device, memory_format=fmt)
        elif tuple(out.shape) != (nb, widths[-1], oh, ow):
            raise ValueError(f"b2b conv: out has shape {tuple(out.shape)}, expected {(nb, widths[-1], oh, ow)}")
        # stage s's extras have stage s's channel count
        ex = [[torch.broadcast_to(e, (nb, widths[s], oh, ow)) for e in es] for s, es in enumerate(extras)]
        dims = (nb, c, h, w, oh, ow)
        return B2BArgs(x, packed, biases, ex, out, dims, widths, geom, (kh, kw))
    if x.shape[-1] != packed[0].shape[0]:
        raise ValueError(f"b2b: input has K={x.shape[-1]}, the first weight expects {packed[0].shape[0]}")
    lead = tuple(x.shape[:-1])
    m = 1
    for d in lead:
        m *= d
    x2 = x.reshape(m, x.shape[-1])
    if out is None:
        out = torch.empty(lead + (widths[-1],), dtype=chain.stages[-1].out_dtype, device=x.device)
    elif tuple(out.shape) != lead + (widths[-1],) or not out.is_contiguous():
        raise ValueError(f"b2b: out must be contiguous with shape {lead + (widths[-1],)}, got {tuple(out.shape)}")
    ex2 = [[torch.broadcast_to(e, lead + (widths[s],)).reshape(m, widths[s]) for e in es] for s, es in enumerate(extras)]
    # as an (m, c, 1, 1) "image": only the n and c strides matter
    x4 = x2[:, :, None, None]
    ex4 = [[e[:, :, None, None] for e in es] for es in ex2]
    return B2BArgs(x4, packed, biases, ex4, out, (m, x.shape[-1], 1, 1, 1, 1), widths, geom, (1, 1))


def launch(chain: Chain, g: B2BArgs, cfg: B2BConfig, warmup: bool = False) -> torch.Tensor:
    nb, c, h, w, oh, ow = g.dims
    m = nb * oh * ow
    if m == 0:
        return g.out
    if max(g.x.numel(), g.out.numel()) >= 2**31:
        raise ValueError("b2b: tensors of 2**31 elements or more need 64-bit indexing (not in this template)")
    if cfg.residence not in RESIDENCES:
        raise ValueError(f"b2b: residence must be one of {RESIDENCES}, got {cfg.residence!r}")
    grid: tuple[int, ...]
    out = g.out
    o4 = out if out.dim() == 4 else out.reshape(m, g.widths[-1])[:, :, None, None]
    ptrs: list[Any] = [g.x, *g.weights, o4]
    strides: list[int] = []
    rowbcast: dict[str, bool] = {}
    for s in range(len(chain.stages)):
        if g.biases[s] is not None:
            ptrs.append(g.biases[s])
        for j, e in enumerate(g.extras[s]):
            ptrs.append(e)
            strides += [e.stride(0), e.stride(1), e.stride(2), e.stride(3)]
            # GEMM chains index extras by row only (oh = ow = 0): the pixel strides do not matter
            rowbcast[f"ROWBCAST_{s}_{j}"] = e.stride(0) == 0 and (not chain.conv or e.stride(2) == e.stride(3) == 0)
    pads = {f"P{s}": pad_width(g.widths[s]) for s in range(len(chain.stages) - 1)}
    block_n = min(cfg.block_n, pad_width(g.widths[-1]))
    precision = "ieee" if g.x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    tiles = -(-m // cfg.block_m)
    single = {"SINGLE_K": g.kernel_hw[0] * g.kernel_hw[1] == 1 and c <= cfg.block_k, "SINGLE_N": g.widths[-1] <= block_n}
    single["PRELOAD"] = cfg.preload and single["SINGLE_N"]
    if cfg.tile_h and (cfg.tile_h & (cfg.tile_h - 1) or cfg.block_m % cfg.tile_h or cfg.block_m & (cfg.block_m - 1)):
        raise ValueError(f"b2b: tile_h {cfg.tile_h} must be a power of two dividing block_m {cfg.block_m} (a power of two)")
    conv_descs = None
    if chain.conv and cfg.tma and cfg.tile_h:
        narrow = replace(cfg, block_k=conv_tma_block_k(cfg, c))
        conv_descs = _conv_tma_descriptors(chain, g, narrow, block_n)
        cfg = narrow if conv_descs is not None else cfg
    descs = _tma_descriptors(chain, g, cfg, block_n) if cfg.persistent and cfg.tma and single["SINGLE_K"] and single["SINGLE_N"] else None
    if conv_descs is not None:
        kernel = _module(chain).b2b_conv_tma_kernel
        ptrs[0], ptrs[len(chain.stages) + 1] = conv_descs
        bh, bw = cfg.tile_h, cfg.block_m // cfg.tile_h
        grid = (nb * -(-oh // bh) * -(-ow // bw),)
        single.update(BH=bh, BW=bw)
    elif descs is not None:
        kernel = _module(chain).b2b_tma_kernel
        ptrs[0], ptrs[len(chain.stages) + 1] = descs
        n_prog = min(tiles, max(1, cfg.programs_per_sm) * _num_sms(g.x.device))
        grid = (n_prog,)
        single.update(NUM_PROGRAMS=n_prog, TILE_STAGES=cfg.num_stages)
    elif cfg.persistent:
        kernel = _module(chain).b2b_persistent_kernel
        n_prog = min(tiles, 2 * _num_sms(g.x.device))
        grid = (n_prog,)
        single.update(NUM_PROGRAMS=n_prog, TILE_STAGES=cfg.num_stages)
    else:
        kernel = _module(chain).b2b_kernel
        grid = (tiles,)
    args = (*ptrs, nb, c, h, w, oh, ow, *g.widths,
            g.x.stride(0), g.x.stride(1), g.x.stride(2), g.x.stride(3),
            o4.stride(0), o4.stride(1), o4.stride(2), o4.stride(3), *strides)  # fmt: skip
    kw = dict(
        SH=g.geom.stride[0], SW=g.geom.stride[1], PH=g.geom.padding[0], PW=g.geom.padding[1],
        DH=g.geom.dilation[0], DW=g.geom.dilation[1], KH=g.kernel_hw[0], KW=g.kernel_hw[1], **pads, **rowbcast,
        BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_N=block_n, SMEM=cfg.residence == "smem", PREC=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **single,
    )  # fmt: skip
    if warmup:
        if not interpreting():
            kernel.warmup(*args, grid=grid, **kw)
    else:
        kernel[grid](*args, **kw)
    return out


def _tma_descriptors(chain: Chain, g: B2BArgs, cfg: B2BConfig, block_n: int) -> tuple[Any, Any] | None:
    """Host tensor descriptors of x (M, K0) and out (M, N_last) for ``b2b_tma_kernel``, or None
    when TMA cannot describe them (a conv chain, non-contiguous rows, 16-byte misalignment, a GPU
    before Hopper): the launcher then runs the pointer-based persistent kernel."""
    if chain.conv or g.x.dtype not in _TL:
        return None
    if g.x.is_cuda and torch.cuda.get_device_capability(g.x.device)[0] < 9:
        return None
    m, k0 = g.dims[0], g.dims[1]
    n_last = g.widths[-1]
    x2 = g.x[:, :, 0, 0]
    out2 = g.out.reshape(m, n_last)
    e = x2.element_size()
    for t, cols in ((x2, k0), (out2, n_last)):
        if t.stride(1) != 1 or t.stride(0) != cols or (cols * e) % 16 or t.data_ptr() % 16:
            return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    x_desc = TensorDescriptor(x2, [m, k0], [k0, 1], [cfg.block_m, cfg.block_k])
    out_desc = TensorDescriptor(out2, [m, n_last], [n_last, 1], [cfg.block_m, block_n])
    return x_desc, out_desc


def conv_tma_block_k(cfg: B2BConfig, c: int) -> int:
    """The conv TMA kernel's channel step: the config's, or less for narrow inputs (C = 16 or 32
    would otherwise move and multiply boxes that are half or more zero-filled channels)."""
    return min(cfg.block_k, pad_width(c))


def _conv_tma_descriptors(chain: Chain, g: B2BArgs, cfg: B2BConfig, block_n: int) -> tuple[Any, Any] | None:
    """Host tensor descriptors of the NHWC input (N, H, W, C) with box [1, BH, BW, BLOCK_K] and
    of the NHWC output (N, OH, OW, N_last) with box [1, BH, BW, BLOCK_N] for
    ``b2b_conv_tma_kernel``, or None when TMA cannot do the conv: stride other than 1 (a box is a
    dense window; any dilation is fine, it only shifts the taps), channels not the unit-stride dim,
    pixel strides or bases not 16-byte aligned, a GPU before Hopper. The launcher then runs
    ``b2b_kernel``. Any C: the last channel block's box is zero-filled past C."""
    if g.geom.stride != (1, 1) or g.x.dtype not in _TL or g.out.dtype != chain.stages[-1].out_dtype:
        return None
    if g.x.is_cuda and torch.cuda.get_device_capability(g.x.device)[0] < 9:
        return None
    bh, bw = cfg.tile_h, cfg.block_m // cfg.tile_h
    x, out = g.x, g.out
    for t, box_c in ((x, cfg.block_k), (out, block_n)):
        e = t.element_size()
        # TMA: 16-byte aligned base and strides, an inner box of >= 16 bytes, box dims <= 256
        if t.stride(1) != 1 or t.data_ptr() % 16 or any(t.stride(d) * e % 16 for d in (0, 2, 3)):
            return None
        if box_c * e % 16 or max(bh, bw, box_c) > 256:
            return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    nb, c, h, w, oh, ow = g.dims
    x_desc = TensorDescriptor(x, [nb, h, w, c], [x.stride(0), x.stride(2), x.stride(3), 1], [1, bh, bw, cfg.block_k])
    out_desc = TensorDescriptor(out, [nb, oh, ow, g.widths[-1]], [out.stride(0), out.stride(2), out.stride(3), 1], [1, bh, bw, block_n])
    return x_desc, out_desc


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: a few programs, so the tile loop really loops


def b2b_chain(
    chain: Chain,
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    extras: list[list[torch.Tensor]],
    config: B2BConfig | None = None,
    packed: list[torch.Tensor] | None = None,
    geom: ConvGeom | None = None,
    channels_last: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the whole chain in one kernel; returns the last stage's output (written to ``out``
    when given)."""
    g = prepare(chain, x, weights, biases, extras, packed, geom, channels_last, out)
    cfg = config or default_config(g.dims[0] * g.dims[4] * g.dims[5], g.widths)
    return launch(chain, g, cfg)


def reference(
    chain: Chain,
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    extras: list[list[torch.Tensor]],
    geom: ConvGeom | None = None,
) -> torch.Tensor:
    """The oracle: each stage in fp32, intermediates rounded to their dtypes (as stored unfused)."""
    geom = geom or ConvGeom()
    h = x
    for s, st in enumerate(chain.stages):
        b = None if biases[s] is None else biases[s].float()
        if chain.conv:
            g = geom if s == 0 else ConvGeom()
            acc = F.conv2d(h.float(), weights[s].float(), b, g.stride, g.padding, g.dilation)
        else:
            acc = torch.matmul(h.float(), weights[s].float())
            if b is not None:
                acc = acc + b
        ex = [e.float() if e.is_floating_point() else e for e in extras[s]]
        h = apply_reference(acc, ex, st.epilogue).to(st.out_dtype)
    return h


# ---------------------------------------------------------------------------------------
# inspecting the generated code (no GPU needed)
# ---------------------------------------------------------------------------------------
_CONSTEXPRS = (
    "SH",
    "SW",
    "PH",
    "PW",
    "DH",
    "DW",
    "KH",
    "KW",
    "BLOCK_M",
    "BLOCK_K",
    "BLOCK_N",
    "SMEM",
    "PREC",
    "SINGLE_K",
    "SINGLE_N",
    "PRELOAD",
    "NUM_PROGRAMS",
    "TILE_STAGES",
    "BH",
    "BW",
)
_TT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_asm(
    chain: Chain, widths: list[int], cfg: B2BConfig, dtype: torch.dtype = torch.float16, arch: int = 90,
    kernel_hw: tuple[int, int] = (1, 1), widths_k0: int = 1 << 30, jit_like: bool = False,
    int_args: dict[str, int] | None = None, rowbcast: bool = False,
) -> dict[str, str]:  # fmt: skip
    """Compile the chain's kernel for sm_<arch> on any machine and return its ``asm`` dict
    (``ttgir``, ``ptx``, ``cubin``...). Under ``TRITON_INTERPRET=1`` the compile runs in a child
    process without it (the interpreter replaces ``@triton.jit`` functions). ``jit_like``: a GEMM
    chain on contiguous tensors as the JIT specialises it; ``int_args``: integer arguments' values
    (e.g. a conv chain's sizes and strides), specialised as the JIT would (1 -> constant, multiples
    of 16 -> divisible); ``rowbcast``: every epilogue extra is a row-broadcast vector (a bias).
    A conv chain's config with ``tma`` and ``tile_h`` compiles ``b2b_conv_tma_kernel`` (descriptors
    ``tensordesc<t[1, BH, BW, BLOCK_K]>`` for x, ``[1, BH, BW, BLOCK_N]`` for the output; C =
    ``widths_k0`` narrows BLOCK_K as the launcher does)."""
    if interpreting():
        import pickle
        import subprocess
        import sys

        env = dict(os.environ, TRITON_INTERPRET="0")  # "0", not unset: kfuse's import would set it again
        code = (
            "import pickle,sys;from kfuse.kernels.b2b import compile_asm;"
            "a=pickle.loads(sys.stdin.buffer.read());"
            "sys.stdout.buffer.write(pickle.dumps({k:v for k,v in compile_asm(*a).items() if isinstance(v,(str,bytes))}))"
        )
        job = pickle.dumps((chain, widths, cfg, dtype, arch, kernel_hw, widths_k0, jit_like, int_args, rowbcast))
        proc = subprocess.run([sys.executable, "-c", code], input=job, capture_output=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the b2b kernel for sm_{arch} failed:\n{proc.stderr.decode()[-3000:]}")
        return pickle.loads(proc.stdout)
    import triton
    from triton.backends.compiler import GPUTarget

    tma = cfg.persistent and cfg.tma and not chain.conv
    conv_tma = chain.conv and cfg.tma and cfg.tile_h > 0  # b2b_conv_tma_kernel: 4-D NHWC boxes
    if conv_tma and widths_k0 < 1 << 30:  # the launcher's channel step for C = widths_k0
        cfg = replace(cfg, block_k=conv_tma_block_k(cfg, widths_k0))
    mod = _module(chain)
    jf = mod.b2b_persistent_kernel if cfg.persistent else mod.b2b_kernel
    jf = mod.b2b_conv_tma_kernel if conv_tma else mod.b2b_tma_kernel if tma else jf
    t = _TT[dtype]
    sig: dict[str, str] = {}
    const: dict[str, Any] = {}
    divisible: list[str] = []
    block_n = min(cfg.block_n, pad_width(widths[-1]))
    for name in jf.arg_names:
        if name in ("x_desc", "out_desc"):
            inner = cfg.block_k if name == "x_desc" else block_n
            rows = f"1, {cfg.tile_h}, {cfg.block_m // cfg.tile_h}" if conv_tma else f"{cfg.block_m}"
            sig[name] = f"tensordesc<{t}[{rows}, {inner}]>"
        elif name.endswith("_ptr"):
            sig[name] = f"*{t}"
            divisible.append(name)
        elif name in _CONSTEXPRS or (name.startswith("P") and name[1:].isdigit()) or name.startswith("ROWBCAST_"):
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    const.update(SH=1, SW=1, PH=kernel_hw[0] // 2, PW=kernel_hw[1] // 2, DH=1, DW=1, KH=kernel_hw[0], KW=kernel_hw[1])
    const.update({f"P{s}": pad_width(widths[s]) for s in range(len(widths) - 1)})
    const.update({b: rowbcast for b in _rowbcast_names(chain)})
    const.update(BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_N=min(cfg.block_n, pad_width(widths[-1])))
    const.update(SMEM=cfg.residence == "smem", PREC="tf32" if dtype == torch.float32 else "ieee")
    # the launcher's specialisations for a GEMM chain whose K0 and last width fit one tile each
    const.update(SINGLE_K=kernel_hw == (1, 1) and widths_k0 <= cfg.block_k, SINGLE_N=widths[-1] <= const["BLOCK_N"])
    const.update(PRELOAD=cfg.preload and const["SINGLE_N"])
    if cfg.persistent:
        const.update(NUM_PROGRAMS=264, TILE_STAGES=cfg.num_stages)
    if tma:
        const.update(NUM_PROGRAMS=132 * cfg.programs_per_sm, TILE_STAGES=cfg.num_stages)
    if conv_tma:
        const.update(BH=cfg.tile_h, BW=cfg.block_m // cfg.tile_h)
    if jit_like and not chain.conv:
        # what the JIT sees for a GEMM chain on contiguous tensors: the unit strides and the 1x1
        # "image" sizes are specialised to 1, the other integers are multiples of 16
        for name in ("sxc", "sxh", "sxw", "soc", "soh", "sow", "H", "W", "OH", "OW"):
            if name not in sig:
                continue
            sig[name] = "constexpr"
            const[name] = 1
        divisible += [k for k, v in sig.items() if v == "i32"]
    for name, v in (int_args or {}).items():  # what the JIT sees for these values: 1 is a constant,
        if name not in sig or sig[name] != "i32":  # multiples of 16 are marked divisible
            raise ValueError(f"compile_asm: {name!r} is not an integer argument of the kernel")
        if v == 1:
            sig[name] = "constexpr"
            const[name] = 1
        elif v % 16 == 0:
            divisible.append(name)
    names = list(jf.arg_names)
    const = {k: v for k, v in const.items() if k in names}  # e.g. the tile loop's constexprs of another kernel
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in divisible}
    src = triton.compiler.ASTSource(jf, sig, constexprs=const, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return dict(ck.asm)


def ptx_summary(ptx: str) -> dict[str, int]:
    """Counts of the instructions that show where data lives: global stores/loads, shared
    stores/loads, and tensor-core MMAs (wgmma with A from registers vs from shared memory)."""
    import re

    lines = [ln.strip() for ln in ptx.splitlines()]
    wg = [ln for ln in lines if ln.startswith("wgmma.mma_async")]
    # wgmma's A operand is either a register list "{%r..}" or a 64-bit shared-memory descriptor "%rd.."
    wg_rs = [ln for ln in wg if re.search(r"\}\s*,\s*\{", ln)]
    return {
        "st.global": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?st\.global", ln)),
        "ld.global": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?ld\.global", ln)),
        "cp.async": sum(1 for ln in lines if ln.startswith("cp.async") and "commit" not in ln and "wait" not in ln),
        "st.shared": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?st\.shared", ln) or ln.startswith("stmatrix")),
        "ld.shared": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?ld\.shared", ln) or ln.startswith("ldmatrix")),
        "wgmma": len(wg),
        "wgmma_a_regs": len(wg_rs),
        "mma.sync": sum(1 for ln in lines if ln.startswith("mma.sync")),
    }


def ptx_global_store_bases(ptx: str) -> list[set[str]]:
    """For every ``st.global`` in ``ptx``, the kernel parameters its address is computed from
    (a forward taint analysis over the PTX registers, iterated to a fixpoint for loops)."""
    import re

    params: dict[str, int] = {}
    taint: dict[str, set[str]] = {}
    body = [ln.strip() for ln in ptx.splitlines()]
    for ln in body:
        m = re.match(r"ld\.param\.\w+\s+(%\w+),\s*\[(\w+)\]", ln)
        if m:
            taint.setdefault(m.group(1), set()).add(m.group(2))
            params[m.group(2)] = 1
    ins = []
    for ln in body:
        m = re.match(r"(@!?%p\d+\s+)?([a-z][\w.]*)\s+(.*);", ln)
        if m:
            ins.append((m.group(2), m.group(3)))
    changed = True
    while changed:
        changed = False
        for op, rest in ins:
            if op.startswith(("st.", "ld.param", "bra", "wgmma", "mma")):
                continue
            regs = re.findall(r"%\w+", rest)
            if len(regs) < 2:
                continue
            dst, srcs = regs[0], regs[1:]
            src_t: set[str] = set()
            for r in srcs:
                src_t |= taint.get(r, set())
            if src_t - taint.get(dst, set()):
                taint.setdefault(dst, set()).update(src_t)
                changed = True
    out = []
    for op, rest in ins:
        if op.startswith("st.global"):
            addr = re.search(r"\[\s*(%\w+)", rest)
            out.append(set(taint.get(addr.group(1), set())) if addr else set())
    return out


# ---------------------------------------------------------------------------------------
# lowering of ``b2b_chain`` nodes, with the fused-vs-unfused decision
# ---------------------------------------------------------------------------------------
from kfuse.runtime.executor import LOWERINGS, KernelInfo, Step, lowering  # noqa: E402


def _random_like(t: Any, device: torch.device) -> torch.Tensor:
    if t.dtype.is_floating_point:
        x = torch.randn(t.shape, dtype=t.dtype, device=device)
    else:
        x = torch.ones(t.shape, dtype=t.dtype, device=device)
    if getattr(t, "layout", "") == "channels_last" and x.dim() == 4:  # time with the strides the model will use
        x = x.to(memory_format=torch.channels_last)
    return x


def _time(fn: Any, reps: int = 15) -> float:
    # GPU time from CUDA-graph replays: the plan runs in a CUDA graph, so the unfused chain's
    # extra launches cost GPU time only, not Python launch overhead. Ten calls per graph: one
    # replay's fixed ~5 us would otherwise be a third of a small chain's time and hide a 10% gap
    from kfuse.bench.harness import gpu_time_ms, graph_ms_per_call

    if not torch.cuda.is_available():
        return gpu_time_ms(fn, warmup=1, rep=2)
    fn()  # compile outside the capture
    try:
        return graph_ms_per_call(fn, (), calls=10, warmup=2, rep=reps)[0]
    except Exception:  # capture failed: plain timing
        torch.cuda.synchronize()
        return gpu_time_ms(fn, warmup=3, rep=reps)


@lowering("b2b_chain")
def lower_b2b_chain(node: Any, graph: Any, backend: str, options: Any = None) -> Step | None:
    """The fused chain as one kernel; on a GPU, fused and unfused are measured on random inputs
    of the right shapes and the faster is kept (``step.b2b`` records the decision)."""
    if backend == "torch":
        return None
    a = node.attrs
    chain: Chain = a["chain"]
    stages = a["unfused"]
    # operand positions of each stage inside the fused node's inputs
    pos, slices = 0, []
    for s, n in enumerate(stages):
        take = len(n.inputs) - (0 if s == 0 else 1)
        slices.append((pos, pos + take))
        pos += take
    packed_cache: dict[torch.device, list[torch.Tensor]] = {}
    geom = ConvGeom(as_pair(a.get("stride"), 1), as_pair(a.get("padding"), 0), as_pair(a.get("dilation"), 1))
    channels_last = a["out_type"].layout == "channels_last"

    def split(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], list[Any], list[list[torch.Tensor]]]:
        ws, bs, es = [], [], []
        for s, (lo, hi) in enumerate(slices):
            part = xs[lo:hi] if s == 0 else [None, *xs[lo:hi]]
            nconv = 3 if chain.stages[s].has_bias else 2
            ws.append(part[1])
            bs.append(part[2] if chain.stages[s].has_bias else None)
            es.append(list(part[nconv:]))
        return xs[0], ws, bs, es

    def fused_with(cfg: B2BConfig) -> Any:
        def run(xs: list[torch.Tensor]) -> torch.Tensor:
            x, ws, bs, es = split(xs)
            pk = packed_cache.get(x.device)
            if pk is None:
                pk = packed_cache[x.device] = [pack_first(ws[0], chain.conv)] + [pack_next(w) for w in ws[1:]]
            return b2b_chain(chain, x, ws, bs, es, cfg, pk, geom, channels_last)

        return run

    m = _rows(graph, node, chain)
    widths = list(a["widths"])
    cfg = a.get("config") or default_config(m, widths)
    decision: dict[str, Any] = {"residence": cfg.residence, "config": cfg.describe(), "decided_by": "rule"}
    run = fused_with(cfg)
    template = "b2b_chain"
    if backend == "triton" and os.environ.get("KFUSE_B2B_DECIDE", "measure") == "measure":
        try:
            run, template, decision = _decide(node, graph, backend, options, fused_with, m, widths)
        except Exception as e:  # a measurement that fails keeps the rule's choice, and says why
            decision["decided_by"] = f"rule (measurement failed: {type(e).__name__}: {str(e)[:120]})"
    epis = " => ".join(n.attrs["epilogue"].describe() for n in stages)
    info = KernelInfo(node.name, template, a["fused_ops"], decision.get("config", ""), epis)
    step = Step(node.name, node.inputs, run, info)
    step.b2b = decision  # type: ignore[attr-defined]  # read by kfuse.passes.fuse_b2b.b2b_report
    return step


def _rows(graph: Any, node: Any, chain: Chain) -> int:
    t = node.attrs["out_type"]
    if chain.conv:
        return t.shape[0] * t.shape[2] * t.shape[3]
    return t.numel // max(1, t.shape[-1])


def _unfused_run(node: Any, graph: Any, backend: str, options: Any) -> Any:
    """The chain as its original kernels, one after the other (each with its own lowering)."""
    from kfuse.runtime.executor import _takes_options, _torch_step

    steps = []
    # the stage lowerings look up their operand types, intermediates included
    ctx = graph.replace(nodes=tuple(graph.nodes) + tuple(node.attrs["unfused"]))
    for n in node.attrs["unfused"]:
        fn = LOWERINGS.get(n.op)
        st = None
        if fn is not None:
            st = fn(n, ctx, backend, options=options) if _takes_options(fn) else fn(n, ctx, backend)
        steps.append(st or _torch_step(n))

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        env = dict(zip(node.attrs["input_names"], xs, strict=True))
        out = None
        for st in steps:
            out = st.fn([env[i] for i in st.inputs])
            env[st.output] = out
        return out

    return run


def _decide(
    node: Any, graph: Any, backend: str, options: Any, fused_with: Any, m: int, widths: list[int]
) -> tuple[Any, str, dict[str, Any]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    xs = []
    for name in node.inputs:
        c = graph.constants.get(name)
        xs.append(c.to(device) if c is not None else _random_like(graph.type_of(name), device))
    unfused = _unfused_run(node, graph, backend, options)
    t_unfused = _time(lambda: unfused(xs))
    best: tuple[float, B2BConfig | None] = (float("inf"), None)
    tried = {}
    x_t = graph.type_of(node.inputs[0])
    k0 = None if node.attrs["chain"].conv or x_t.rank < 2 else int(x_t.shape[-1])
    for cfg in candidate_configs(m, widths, k0):
        try:
            run = fused_with(cfg)
            t = _time(lambda run=run: run(xs))
        except Exception as e:  # a config that does not compile (registers, smem) is skipped
            tried[cfg.describe()] = f"failed: {type(e).__name__}"
            continue
        tried[cfg.describe()] = round(t, 4)
        if t < best[0]:
            best = (t, cfg)
    t_fused, cfg = best
    d: dict[str, Any] = {"unfused_ms": round(t_unfused, 4), "fused_ms": round(t_fused, 4), "tried": tried, "decided_by": "measured"}
    if cfg is not None and t_fused < t_unfused:
        d.update(residence=cfg.residence, config=cfg.describe(), fused=True)
        return fused_with(cfg), "b2b_chain", d
    d.update(residence="none", config="unfused (measured faster)", fused=False)
    return unfused, "b2b_chain(unfused)", d
