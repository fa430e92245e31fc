"""The generated Triton source of the chain kernels: ``b2b_kernel`` (one program per row tile),
``b2b_persistent_kernel``, ``b2b_tma_kernel`` (GEMM chains, TMA rows in and out) and
``b2b_conv_tma_kernel`` (conv chains, TMA spatial boxes)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kfuse.kernels.b2b.chain import Chain
from kfuse.kernels.codegen import load_generated
from kfuse.kernels.epilogue import render


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


def _stage_tail(chain: Chain, s: int, offs_n: str, mask_n: str, ind: int, acc: str = "acc", preloaded: bool = False) -> str:
    """Bias + extra loads + the generated epilogue of stage ``s`` applied to ``acc``.
    ``preloaded``: under PRELOAD the row-broadcast extras were loaded before the tile loop
    (``_vector_preloads``) and are used from registers."""
    st = chain.stages[s]
    lines = []
    if st.has_bias:
        lines.append(f"{acc} += tl.load(bias{s}_ptr + {offs_n}, mask={mask_n}, other=0.0).to(tl.float32)[None, :]")
    for j in range(st.epilogue.n_inputs):
        # an extra broadcast along the rows (a Linear's bias: strides 0 but the channel's) is
        # loaded once per tile as a vector, not as a BLOCK_M x N tile of repeated values
        vector = f"tl.load(e{s}_{j}_ptr + {offs_n} * se{s}_{j}c, mask={mask_n}, other=0.0)[None, :]"
        if preloaded:
            vector = f"ev{s}_{j} if PRELOAD else {vector}"
        lines += [
            f"if ROWBCAST_{s}_{j}:",
            f"    e{s}_{j} = {vector}",
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
    pads = ", ".join(
        [f"P{s}: tl.constexpr, PADDED{s}: tl.constexpr" for s in range(L - 1)] + [f"{b}: tl.constexpr" for b in _rowbcast_names(chain)]
    )
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
        "    PRELOAD: tl.constexpr, N_STAGES: tl.constexpr,",
    ]
    body = _body(chain)
    src = ["import triton", "import triton.language as tl", "import triton.language.extra.cuda", "", ""]
    src += ["@triton.jit", "def b2b_kernel(", *params, "):"]
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
        src += ["", "", *_conv_tma_kernel(chain, params, persistent=True)]
    else:
        src += ["", "", *_tma_kernel(chain, ptrs, params)]
        if L == 2:
            src += ["", "", *_chunked_kernel(chain, params)]
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
    consts = "    NUM_PROGRAMS: tl.constexpr, TILE_STAGES: tl.constexpr, PDL: tl.constexpr,"
    src = ["@triton.jit", "def b2b_tma_kernel(", *sig, consts, "):"]
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
    src += ["    if PRELOAD:"] + [f"        wt{s} = {wload[s]}" for s in range(L)] + _vector_preloads(chain)
    src += [
        "    if PDL:",
        "        # programmatic dependent launch (launch_pdl): this grid started while the previous",
        "        # kernel drained; the weights above (constants) loaded meanwhile. Nothing a previous",
        "        # kernel writes is read or written before the wait. Then the next kernel may start",
        "        # its own prologue as soon as SM room frees up (it waits for this grid the same way)",
        "        tl.extra.cuda.gdc_wait()",
        "        tl.extra.cuda.gdc_launch_dependents()",
    ]
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
                # padded columns (width < its power-of-two pad) are zeroed; the select costs
                # ~150 of the tile loop's 457 sm_90 instructions (128->64 chain), so only then
                f"        if PADDED{s - 1}:",
                f"            h = tl.where(prev_mask[None, :], acc, 0.0).to({prev_dtype})",
                "        else:",
                f"            h = acc.to({prev_dtype})",
                "        if SMEM:",
                "            acc = tl.trans(tl.dot(tl.trans(b), tl.trans(h), input_precision=PREC))",
                "        else:",
                "            acc = tl.dot(h, b, input_precision=PREC)",
            ]
        src += [_stage_tail(chain, s, "offs_n", "mask_n", 8, preloaded=True), "        prev_mask = mask_n"]
    src += [f"        out_desc.store([off, 0], acc.to({out_t}))"]
    return [ln for chunk in src for ln in chunk.split("\n")]


def _chunked_kernel(chain: Chain, params: list[str]) -> list[str]:
    """``b2b_chunked_kernel``: a two-stage GEMM chain with the intermediate produced and consumed
    BLOCK_H columns at a time, the loop of FlashAttention's forward pass without the softmax:

        for each chunk j:  h_j = epilogue0(x_tile @ W0[:, j]);  acc += h_j @ W1[j, :]

    The x tile (K0 in K_PARTS steps of K_STEP columns) and the output accumulator (N1 in one tile,
    or two of power-of-two widths N_A + N_B, e.g. 192 = 128 + 64) stay on chip for the whole loop;
    only a BLOCK_M x BLOCK_H slice of the intermediate ever exists, in registers (the A operand of
    the second product). A 256 -> 256 -> 256 chain thus holds 128 + 32-64 accumulator registers a
    thread instead of 2 x 128, and the intermediate's width is not bounded by what a program can
    hold. Stage 0's epilogue must be elementwise (each chunk is finished alone). x, the weights and
    the output move by TMA (host descriptors; zero fill past K0, N0 and N1 pads every dimension);
    the chunk loop is what Triton's pipeliner multi-buffers (num_stages). The K steps and the two
    output parts keep widths that are not powers of two (ViT-Ti's 192) from running at the next
    power of two, where a quarter of each product would multiply zero fill.
    ``NUM_PROGRAMS``: the grid; fewer programs than row tiles loop over them (persistent)."""
    sig = [p.replace("x_ptr", "x_desc").replace("out_ptr", "out_desc").replace("w0_ptr", "w0_desc").replace("w1_ptr", "w1_desc")
           for p in params]  # fmt: skip
    mid_t = _tl_dtype(chain.stages[0].out_dtype)
    out_t = _tl_dtype(chain.stages[1].out_dtype)
    consts = [
        "    w1b_desc, outb_desc,",
        "    NUM_PROGRAMS: tl.constexpr, BLOCK_H: tl.constexpr, MASK_H: tl.constexpr, PDL: tl.constexpr,",
        "    K_STEP: tl.constexpr, K_PARTS: tl.constexpr, N_A: tl.constexpr, N_B: tl.constexpr,",
    ]
    src = ["@triton.jit", "def b2b_chunked_kernel(", *sig, *consts, "):"]
    src += [
        "    M = NB",
        "    oh = 0",
        "    ow = 0",
        "    if PDL:  # as in b2b_tma_kernel: nothing a previous kernel writes is touched before the wait",
        "        tl.extra.cuda.gdc_wait()",
        "        tl.extra.cuda.gdc_launch_dependents()",
        "    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), NUM_PROGRAMS, num_stages=1):",
        "        off = tile * BLOCK_M",
        "        offs_m = off + tl.arange(0, BLOCK_M)",
        "        mask_m = offs_m < M",
        "        n_idx = tl.where(mask_m, offs_m, 0)",
        "        a0 = x_desc.load([off, 0])",
    ]
    src += [f"        if K_PARTS > {k}:\n            a{k} = x_desc.load([off, {k} * K_STEP])" for k in range(1, 4)]
    src += [
        "        acc_o = tl.zeros((BLOCK_M, N_A), dtype=tl.float32)",
        "        if N_B > 0:",
        "            acc_ob = tl.zeros((BLOCK_M, N_B), dtype=tl.float32)",
        "        for h0 in tl.range(0, N0, BLOCK_H, num_stages=N_STAGES):",
        "            offs_n = h0 + tl.arange(0, BLOCK_H)",
        "            mask_n = offs_n < N0",
        "            acc = tl.dot(a0, w0_desc.load([0, h0]), input_precision=PREC)",
    ]
    src += [
        f"            if K_PARTS > {k}:\n                acc = tl.dot(a{k}, w0_desc.load([{k} * K_STEP, h0]), acc, input_precision=PREC)"
        for k in range(1, 4)
    ]
    src += [
        _stage_tail(chain, 0, "offs_n", "mask_n", 12),
        "            if MASK_H:  # the last chunk's columns past N0 (the epilogue of a zero need not be zero)",
        f"                h = tl.where(mask_n[None, :], acc, 0.0).to({mid_t})",
        "            else:",
        f"                h = acc.to({mid_t})",
        "            acc_o = tl.dot(h, w1_desc.load([h0, 0]), acc_o, input_precision=PREC)",
        "            if N_B > 0:",
        "                acc_ob = tl.dot(h, w1b_desc.load([h0, N_A]), acc_ob, input_precision=PREC)",
        "        offs_o = tl.arange(0, N_A)",
        "        mask_o = offs_o < N1",
        _stage_tail(chain, 1, "offs_o", "mask_o", 8, acc="acc_o"),
        f"        out_desc.store([off, 0], acc_o.to({out_t}))",
        "        if N_B > 0:  # the output's second part (columns N_A ..)",
        "            offs_o = N_A + tl.arange(0, N_B)",
        "            mask_o = offs_o < N1",
        _stage_tail(chain, 1, "offs_o", "mask_o", 12, acc="acc_ob"),
        f"            outb_desc.store([off, N_A], acc_ob.to({out_t}))",
    ]
    return [ln for chunk in src for ln in chunk.split("\n")]


def _vector_preloads(chain: Chain) -> list[str]:
    """Under PRELOAD, the row-broadcast extras (biases) loaded once per program like the weights:
    per tile they were ~48 scalar 16-bit loads a thread (sm_90 SASS of the 128->64 chain)."""
    lines = []
    for s, st in enumerate(chain.stages):
        n_pad = f"P{s}" if s < len(chain.stages) - 1 else "BLOCK_N"
        for j in range(st.epilogue.n_inputs):
            offs = f"tl.arange(0, {n_pad})"
            lines += [
                f"        if ROWBCAST_{s}_{j}:",
                f"            ev{s}_{j} = tl.load(e{s}_{j}_ptr + {offs} * se{s}_{j}c, mask={offs} < N{s}, other=0.0)[None, :]",
            ]
    return lines


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
            f"    if PADDED{s - 1}:  # padded columns are zeroed (a costly select on sm_90)",
            f"        h = tl.where(mask_n[None, :], acc, 0.0).to({prev_dtype})",
            "    else:",
            f"        h = acc.to({prev_dtype})",
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
            f"        for n0 in tl.range(0, N{s}, BLOCK_N, num_stages=N_STAGES):",
            "            offs_o = n0 + tl.arange(0, BLOCK_N)",
            _indent("\n".join(x for x in loop if x), 12),
        ]
    return src


def _conv_tma_kernel(chain: Chain, params: list[str], persistent: bool = False) -> list[str]:
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
    name = "b2b_conv_tma_persistent_kernel" if persistent else "b2b_conv_tma_kernel"
    consts = "    BNI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr," + (" NUM_PROGRAMS: tl.constexpr," if persistent else "")
    head = ["@triton.jit", f"def {name}(", *sig, consts, "):"]
    src = [
        "    # a program owns BNI images x BH x BW output pixels; row r is image r // (BH * BW)",
        "    tiles_w = tl.cdiv(OW, BW)",
        "    per_group = tl.cdiv(OH, BH) * tiles_w",
        "    img0 = (sp // per_group) * BNI",
        "    tile = sp % per_group",
        "    oh0 = (tile // tiles_w) * BH",
        "    ow0 = (tile % tiles_w) * BW",
        "    rows = tl.arange(0, BLOCK_M)",
        "    n_idx = img0 + rows // (BH * BW)",
        "    oh = oh0 + (rows % (BH * BW)) // BW",
        "    ow = ow0 + rows % BW",
        "    # rows past the right / bottom edge or the last image are computed (on whatever the boxes",
        "    # hold) but never stored (TMA clips them); the extras' loads are masked with them",
        "    mask_m = (oh < OH) & (ow < OW) & (n_idx < NB)",
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
        "        box = x_desc.load([img0, oh0 + (tap // KW) * DH - PH, ow0 + (tap % KW) * DW - PW, cb * BLOCK_K])",
        "        a = box.reshape(BLOCK_M, BLOCK_K)",
        "        cc = cb * BLOCK_K + offs_k",
        "        b = tl.load(w0_ptr + (tap * C + cc)[:, None] * N0 + offs_n[None, :], mask=(cc < C)[:, None] & mask_n[None, :], other=0.0)",
        "        acc_t = tl.dot(tl.trans(b), tl.trans(a), acc_t, input_precision=PREC)",
        "    acc = tl.trans(acc_t)",
        _stage_tail(chain, 0, "offs_n", "mask_n", 4),
    ]
    src += _later_stages(chain, lambda c0: [f"out_desc.store([img0, oh0, ow0, {c0}], acc_o.to({out_t}).reshape(BNI, BH, BW, BLOCK_N))"])
    body = [ln for chunk in src for ln in chunk.split("\n")]
    if not persistent:
        return head + ["    sp = tl.program_id(0)", *body]
    # persistent: a fixed grid loops over the spatial tiles, so a program's last output stores
    # drain while it starts the next tile's stage 0 (one program per SM at 192 KB otherwise exits,
    # waits for its stores and hands the SM to a new program that reloads its prologue)
    n_tiles = "tl.cdiv(NB, BNI) * tl.cdiv(OH, BH) * tl.cdiv(OW, BW)"
    loop = [f"    for sp in tl.range(tl.program_id(0), {n_tiles}, NUM_PROGRAMS, num_stages=1):"]
    return head + loop + [("    " + ln) if ln.strip() else ln for ln in body]


_TL = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}


def _tl_dtype(d: torch.dtype) -> str:
    if d not in _TL:
        raise ValueError(f"b2b: intermediate dtype {d} is not supported (fp16, bf16, fp32)")
    return _TL[d]


def _module(chain: Chain):  # noqa: ANN202 - a generated module holding a triton JITFunction
    return load_generated("b2b", chain.key(), kernel_source(chain))
