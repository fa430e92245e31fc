"""Operands in, kernel launched: packing, checking, TMA descriptors, the launch, and the oracle."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.kernels.b2b.chain import MAX_RESIDENT, RESIDENCES, B2BConfig, Chain, chunked_eligible, chunked_parts, pad_constexprs, pad_width
from kfuse.kernels.b2b.configs import default_config
from kfuse.kernels.b2b.source import _TL, _module
from kfuse.kernels.codegen import interpreting, num_sms
from kfuse.kernels.epilogue import apply_reference
from kfuse.kernels.tma import nhwc_box_descriptor, spatial_tile, tma_device
from kfuse.tune.hardware import programs_per_sm, query


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
    asked = cfg
    nb, c, h, w, oh, ow = g.dims
    m = nb * oh * ow
    if m == 0:
        return g.out
    if max(g.x.numel(), g.out.numel()) >= 2**31:
        raise ValueError("b2b: tensors of 2**31 elements or more need 64-bit indexing (not in this template)")
    if cfg.residence not in RESIDENCES:
        raise ValueError(f"b2b: residence must be one of {RESIDENCES}, got {cfg.residence!r}")
    chunked = cfg.residence == "chunked"
    if not chunked and max(g.widths[:-1]) > MAX_RESIDENT:
        raise ValueError(f"b2b: intermediate width {max(g.widths[:-1])} exceeds the resident limit {MAX_RESIDENT} ('chunked' has none)")
    grid: tuple[int, ...]
    out = g.out
    # a GEMM chain's output is (..., N) of any rank: as an (m, N, 1, 1) "image" (a 4-D one, e.g. ConvNeXt's
    # (B, H, W, C) MLP, taken as NCHW was written with its batch stride as the row stride: out of bounds)
    o4 = out if chain.conv else out.reshape(m, g.widths[-1])[:, :, None, None]
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
    pads = pad_constexprs(g.widths)
    block_n = min(cfg.block_n, pad_width(g.widths[-1]))
    precision = "ieee" if g.x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    tiles = -(-m // cfg.block_m)
    single = {"SINGLE_K": g.kernel_hw[0] * g.kernel_hw[1] == 1 and c <= cfg.block_k, "SINGLE_N": g.widths[-1] <= block_n}
    single["PRELOAD"] = cfg.preload and single["SINGLE_N"]
    single["N_STAGES"] = cfg.n_stages or cfg.num_stages
    if cfg.tile_h:
        spatial_tile(cfg.block_m, cfg.tile_h, "b2b", cfg.tile_n)
    conv_descs = None
    if chain.conv and cfg.tma and cfg.tile_h:
        narrow = replace(cfg, block_k=conv_tma_block_k(cfg, c))
        conv_descs = _conv_tma_descriptors(chain, g, narrow, block_n)
        cfg = narrow if conv_descs is not None else cfg
    descs = _tma_descriptors(chain, g, cfg, block_n) if cfg.persistent and cfg.tma and single["SINGLE_K"] and single["SINGLE_N"] else None
    if chunked:
        if g.widths[-1] > block_n:
            raise ValueError(f"b2b: chunked residence needs the last width {g.widths[-1]} in one tile (block_n {cfg.block_n})")
        kernel = _module(chain).b2b_chunked_kernel
        k_step, k_parts, n_a, n_b = chunked_parts(c, g.widths[-1])
        x_d, w0_d, w1_d, out_d, w1b_d, outb_d = _chunked_descriptors(chain, g, cfg, k_step, n_a, n_b)
        ptrs[0], ptrs[1], ptrs[2], ptrs[3] = x_d, w0_d, w1_d, out_d
        n_prog = min(tiles, cfg.programs_per_sm * _num_sms(g.x.device)) if cfg.persistent else tiles
        grid = (n_prog,)
        pdl = cfg.pdl and not interpreting()
        single.update(NUM_PROGRAMS=n_prog, BLOCK_H=cfg.block_h, MASK_H=g.widths[0] % cfg.block_h != 0, PDL=pdl)
        single.update(K_STEP=k_step, K_PARTS=k_parts, N_A=n_a, N_B=n_b, w1b_desc=w1b_d, outb_desc=outb_d)
        cfg = replace(cfg, block_k=k_step)
        if pdl:
            single["launch_pdl"] = True
    elif conv_descs is not None:
        ptrs[0], ptrs[len(chain.stages) + 1] = conv_descs
        bh, bw = spatial_tile(cfg.block_m, cfg.tile_h, "b2b", cfg.tile_n)
        n_sp = -(-nb // cfg.tile_n) * -(-oh // bh) * -(-ow // bw)
        single.update(BNI=cfg.tile_n, BH=bh, BW=bw)
        if cfg.persistent:  # a fixed grid of programs_per_sm x SMs looping over the spatial tiles
            kernel = _module(chain).b2b_conv_tma_persistent_kernel
            n_prog = min(n_sp, max(1, cfg.programs_per_sm) * _num_sms(g.x.device))
            grid = (n_prog,)
            single["NUM_PROGRAMS"] = n_prog
        else:
            kernel = _module(chain).b2b_conv_tma_kernel
            grid = (n_sp,)
    elif descs is not None:
        kernel = _module(chain).b2b_tma_kernel
        ptrs[0], ptrs[len(chain.stages) + 1] = descs
        n_prog = min(tiles, max(1, cfg.programs_per_sm) * _num_sms(g.x.device))
        grid = (n_prog,)
        # programmatic dependent launch only on the GPU: the interpreter has no grid dependencies
        pdl = cfg.pdl and not interpreting()
        single.update(NUM_PROGRAMS=n_prog, TILE_STAGES=cfg.num_stages, PDL=pdl)
        if pdl:
            single["launch_pdl"] = True
    elif cfg.persistent:
        kernel = _module(chain).b2b_persistent_kernel
        n_prog = min(tiles, 2 * _num_sms(g.x.device))
        grid = (n_prog,)
        single.update(NUM_PROGRAMS=n_prog, TILE_STAGES=cfg.num_stages)
    else:
        kernel = _module(chain).b2b_kernel
        grid = (tiles,)
        # one program per row tile: the later stages' weights are always loaded before stage 0
        # (PRELOAD) when the last width is one tile. Loaded after the resident stages' products, as
        # the tile's other operands are, Triton 3.6's sm_90 code gave wrong results or illegal
        # addresses (64 -> 128 -> 32 chains at 4 warps, 64 -> 128 -> 128 -> 32 at 4 and 8; session
        # 28, ``benchmarks/experiments/b2b_tiny_diag.py``: 21 of 69 runs wrong or faulting, 0 of 80
        # preloaded). The cause is in the compiler, not found; the preloading form is the same math
        single["PRELOAD"] = single["SINGLE_N"]
    args = (*ptrs, nb, c, h, w, oh, ow, *g.widths,
            g.x.stride(0), g.x.stride(1), g.x.stride(2), g.x.stride(3),
            o4.stride(0), o4.stride(1), o4.stride(2), o4.stride(3), *strides)  # fmt: skip
    kw = dict(
        SH=g.geom.stride[0], SW=g.geom.stride[1], PH=g.geom.padding[0], PW=g.geom.padding[1],
        DH=g.geom.dilation[0], DW=g.geom.dilation[1], KH=g.kernel_hw[0], KW=g.kernel_hw[1], **pads, **rowbcast,
        BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_N=block_n, SMEM=cfg.residence == "smem", PREC=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **single,
    )  # fmt: skip
    if cfg.persistent and "NUM_PROGRAMS" in kw and not interpreting():
        fit = programs_that_fit(kernel, args, grid, kw, g.x.dtype, g.x.device)
        if fit and fit * _num_sms(g.x.device) < kw["NUM_PROGRAMS"]:
            kw["NUM_PROGRAMS"] = fit * _num_sms(g.x.device)
            grid = (kw["NUM_PROGRAMS"],)
            CAPPED[asked] = fit
    if warmup:
        if not interpreting():
            kernel.warmup(*args, grid=grid, **kw)
    else:
        kernel[grid](*args, **kw)
    return out


# programs per SM that fit, by compiled variant (0: unknown)
_FIT: dict[Any, int] = {}
# the configs whose persistent grid was capped, and the programs per SM they ran with (the report says so)
CAPPED: dict[B2BConfig, int] = {}


def capped_note(cfg: B2BConfig) -> str:
    """ " (ran x2)" after a config whose ``programs_per_sm`` was more than its kernel fits, else ""."""
    return f" (ran x{CAPPED[cfg]})" if cfg in CAPPED else ""


def programs_that_fit(
    kernel: Any, args: tuple[Any, ...], grid: tuple[int, ...], kw: dict[str, Any], dtype: torch.dtype, device: torch.device | None = None
) -> int:  # fmt: skip
    """How many programs of this compiled kernel an SM of ``device`` holds at once (the binary's
    registers and shared memory), or 0 when that cannot be read. A persistent grid sized past it (``programs_per_sm``
    x SMs) gains nothing: the programs beyond it wait for running ones to exit and then start their
    own pipeline. Session 16 found offline that the Hopper pipeliner buffers the weights of the TMA
    persistent kernel ``num_stages`` deep, so most of the 3-4-programs-per-SM candidates took 106-344 KB
    and held one or two programs (or none: then the launch fails and the decision skips the config)."""
    key = (
        id(kernel),
        str(dtype),
        str(device),
        tuple(sorted((k, v) for k, v in kw.items() if isinstance(v, (bool, int, float, str)) and k != "NUM_PROGRAMS")),
    )
    if key not in _FIT:
        try:
            ck = kernel.warmup(*args, grid=grid, **kw)
            ck = ck.result() if hasattr(ck, "result") else ck  # an asynchronous compile hands back a future
            if ck is None:  # compiles being recorded for worker processes (parallel_compile): not known yet
                return 0
            ck._init_handles()  # loads the binary: sets n_regs
            _FIT[key] = programs_per_sm(int(ck.n_regs), int(ck.metadata.shared), int(kw["num_warps"]), query(device))
        except Exception:  # a kernel that does not compile or load fails at its launch, with its own error
            _FIT[key] = 0
    return _FIT[key]


def _tma_descriptors(chain: Chain, g: B2BArgs, cfg: B2BConfig, block_n: int) -> tuple[Any, Any] | None:
    """Host tensor descriptors of x (M, K0) and out (M, N_last) for ``b2b_tma_kernel``, or None
    when TMA cannot describe them (a conv chain, non-contiguous rows, 16-byte misalignment, a GPU
    before Hopper): the launcher then runs the pointer-based persistent kernel."""
    if chain.conv or g.x.dtype not in _TL or not tma_device(g.x):
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


def _chunked_descriptors(chain: Chain, g: B2BArgs, cfg: B2BConfig, k_step: int, n_a: int, n_b: int) -> tuple[Any, Any, Any, Any, Any, Any]:
    """Host TMA descriptors of x (M, K0), W0 (K0, N0), W1 (N0, N1) and out (M, N1) for
    ``b2b_chunked_kernel``, then W1's and out's second-part boxes (N_B columns; the first part's
    again when N_B = 0); raises when the chain or the GPU cannot run it."""
    m, k0 = g.dims[0], g.dims[1]
    why = chunked_eligible(chain.conv, g.widths, k0, g.x.element_size())
    if why is None and (g.x.dtype not in _TL or not tma_device(g.x)):
        why = "chunked residence needs TMA (Hopper or later) and fp16/bf16/fp32"
    if why is None and not all(w.is_contiguous() for w in g.weights):
        why = "chunked residence needs contiguous packed weights"
    x2 = g.x[:, :, 0, 0]
    out2 = g.out.reshape(m, g.widths[-1])
    if why is None and (x2.stride(0) != k0 or x2.stride(1) != 1 or any(t.data_ptr() % 16 for t in (x2, out2, *g.weights))):
        why = "chunked residence needs dense, 16-byte aligned x and output"
    if why is not None:
        raise ValueError(f"b2b: {why}")
    from triton.tools.tensor_descriptor import TensorDescriptor

    n0, n1 = g.widths
    w1_d = TensorDescriptor(g.weights[1], [n0, n1], [n1, 1], [cfg.block_h, n_a])
    out_d = TensorDescriptor(out2, [m, n1], [n1, 1], [cfg.block_m, n_a])
    w1b_d = TensorDescriptor(g.weights[1], [n0, n1], [n1, 1], [cfg.block_h, n_b]) if n_b else w1_d
    outb_d = TensorDescriptor(out2, [m, n1], [n1, 1], [cfg.block_m, n_b]) if n_b else out_d
    return (
        TensorDescriptor(x2, [m, k0], [k0, 1], [cfg.block_m, k_step]),
        TensorDescriptor(g.weights[0], [k0, n0], [n0, 1], [k_step, cfg.block_h]),
        w1_d,
        out_d,
        w1b_d,
        outb_d,
    )


def conv_tma_block_k(cfg: B2BConfig, c: int) -> int:
    """The conv TMA kernel's channel step: the config's, or less for narrow inputs (C = 16 or 32
    would otherwise move and multiply boxes that are half or more zero-filled channels)."""
    return min(cfg.block_k, pad_width(c))


def _conv_tma_descriptors(chain: Chain, g: B2BArgs, cfg: B2BConfig, block_n: int) -> tuple[Any, Any] | None:
    """Host tensor descriptors of the NHWC input (N, H, W, C) with box [BNI, BH, BW, BLOCK_K] and
    of the NHWC output (N, OH, OW, N_last) with box [BNI, BH, BW, BLOCK_N] (BNI = tile_n) for
    ``b2b_conv_tma_kernel``, or None when TMA cannot do the conv: stride other than 1 (a box is a
    dense window; any dilation is fine, it only shifts the taps), channels not the unit-stride dim,
    pixel strides or bases not 16-byte aligned, a GPU before Hopper. The launcher then runs
    ``b2b_kernel``. Any C: the last channel block's box is zero-filled past C."""
    if g.geom.stride != (1, 1) or g.out.dtype != chain.stages[-1].out_dtype or not tma_device(g.x):
        return None
    bh, bw = spatial_tile(cfg.block_m, cfg.tile_h, "b2b", cfg.tile_n)
    x_desc = nhwc_box_descriptor(g.x, bh, bw, cfg.block_k, cfg.tile_n)
    out_desc = nhwc_box_descriptor(g.out, bh, bw, block_n, cfg.tile_n)
    if x_desc is None or out_desc is None:
        return None
    return x_desc, out_desc


def _num_sms(device: torch.device) -> int:
    return num_sms(device, 2)  # the interpreter: a few programs, so the tile loop really loops


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
