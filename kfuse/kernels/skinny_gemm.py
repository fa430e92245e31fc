"""GEMMs of a few rows (a decode step's projections): the weight streamed once, split over K, reduced in-kernel.

At batch 1-16 a decoder's GEMMs are ``[M <= 16, K] @ [K, N]`` with a weight of megabytes: the time is the
weight's bytes over the memory bandwidth (a 1.1B Llama's four projections of a layer, 2048 wide: 42 MB, 9 us at
4.8 TB/s). The tiled template gives such a GEMM ``N / BLOCK_N`` programs (2048 / 64 = 32 on 132 SMs), far too
few to keep enough loads in flight; its split-K adds a second launch for the reduce, which at ~5-20 us a kernel
costs as much as it saves.

Here the grid is ``(N / BLOCK_N) x SPLITS``: each program streams one ``[K / SPLITS, BLOCK_N]`` slab of the
weight (pipelined loads, one 16-row ``tl.dot`` per step, the rows past M masked) and stores its fp32 partial
sums; it then counts itself done on its column block's counter (``atomic_add``, acquire-release), and the
program that arrives last sums the block's partials, applies the generated epilogue and stores the output --
one launch, as cuBLAS's split-K GEMV does. The last program also puts the counter back to zero, so the buffers
are ready for the next call (and for the next replay of a CUDA graph) without a memset.

Two things the decode step needs come with the same kernel:

* ``row_rms``: the RMSNorm in front of the GEMM, folded (``passes/fold_row_norm.py``): the norm's weight is
  folded into the GEMM's (``W' = diag(w) W``, a constant), the GEMM reads the norm's *input* ``x``, and the last
  program scales each row by ``rsqrt(mean(x^2) + eps)``: ``norm(x) @ W = rstd * (x @ W')``. Each program sums the
  squares of the ``x`` values it loads for its product anyway and stores them beside its partials; the last one
  adds the slices' sums (a first version re-read the rows at the end, a serial tail of K / BLOCK_K loads). The
  norm's launch and its output's round trip disappear.
* ``gated``: a gated MLP's ``act(x @ W_gate) * (x @ W_up)`` (two accumulators, as ``gated_gemm``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton

from kfuse.kernels import pdl
from kfuse.kernels.attention import dot_precision
from kfuse.kernels.codegen import KeptBuffers, cdiv, generated, interpreting, num_sms
from kfuse.kernels.epilogue import Epilogue, apply_reference, render
from kfuse.kernels.prefetch import prefetch_wanted, slab_plan

MAX_ROWS = 16  # one tl.dot row block (the smallest tensor-core tile): more rows are the tiled template's
MAX_SLICE = 1024  # K values of A a program loads at once for the row scale (16 x 1024 fp16: 64 registers a thread)

_SOURCE = """
import triton
import triton.language as tl
from kfuse.kernels.pdl import pdl_start
from kfuse.kernels.gated_gemm import gate_activation
from kfuse.kernels.prefetch import prefetch_slab


@triton.jit
def _slab(a_ptr, b_ptr, offs_m, offs_n, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, SQUARES: tl.constexpr):
    # this program's share of the product: rows [0, M) of A times the (k_hi - k_lo, BLOCK_N) slab of B; with
    # SQUARES also the sum of squares of the A values it read (a folded RMSNorm's statistic, from loads made anyway)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_lo + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_lo + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        k_ok = offs_k < k_hi - k
        a = tl.load(a_ptrs, mask=(offs_m < M)[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n < N)[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if SQUARES:
            af = a.to(tl.float32)
            ss += tl.sum(af * af, 1)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc, ss


@triton.jit
def _partials(ws_ptr, part, offs_m, offs_n, M, N, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # the sum of the SPLITS partials of one accumulator (``part`` 0, or 1 for a gated MLP's up half); .cg: from
    # L2, where the other programs' stores are, never from a stale L1 line
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    for s in range(SPLITS):
        p = ws_ptr + ((part * SPLITS + s) * M + offs_m[:, None]) * N + offs_n[None, :]
        acc += tl.load(p, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def skinny_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, count_ptr, {extra_ptrs}
    M, N, K, k_per_split, gate_off, up_off,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, {extra_strides}
    eps, {extra_flags}BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    ROW_RMS: tl.constexpr, SQUARES: tl.constexpr, RMS_SLICE: tl.constexpr, BLOCK_SLICE: tl.constexpr,
    GATED: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr, PF_K: tl.constexpr, PF_N: tl.constexpr, SK: tl.constexpr, SN: tl.constexpr, PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    k_lo = pid_k * k_per_split
    k_hi = min(K, k_lo + k_per_split)
    if PDL and PREFETCH:  # the weight is a constant no kernel writes: stream it into L2 while the previous kernel runs
        prefetch_slab(b_ptr + gate_off, pid_n * BLOCK_N, N, k_lo, k_hi, stride_bk, stride_bn, PF_K, PF_N, SK, SN)
        if GATED:
            prefetch_slab(b_ptr + up_off, pid_n * BLOCK_N, N, k_lo, k_hi, stride_bk, stride_bn, PF_K, PF_N, SK, SN)
    pdl_start(PDL)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if RMS_SLICE:  # the row scale's inputs: this program's A slice in one load, in flight through the main loop
        offs_s = k_lo + tl.arange(0, BLOCK_SLICE)
        x_slice = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_s[None, :] * stride_ak,
                          mask=(offs_m < M)[:, None] & (offs_s < k_hi)[None, :], other=0.0)
    # SQUARES: the sums of squares taken from the main loop's A tiles instead (no extra load, work in the loop)
    acc, ss = _slab(a_ptr, b_ptr + gate_off, offs_m, offs_n, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                    BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, SQUARES)
    if RMS_SLICE:
        xf = x_slice.to(tl.float32)
        ss = tl.sum(xf * xf, 1)
    if GATED:
        up, _ = _slab(a_ptr, b_ptr + up_off, offs_m, offs_n, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                      BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, False)
    # after the partial sums (one or two parts of SPLITS x M x N): each (column block, slice)'s M sums of squares
    if GATED:
        ss_ptr = ws_ptr + 2 * SPLITS * M * N + pid_n * SPLITS * M
    else:
        ss_ptr = ws_ptr + SPLITS * M * N + pid_n * SPLITS * M
    if SPLITS > 1:
        w_ptrs = ws_ptr + ((pid_k * M) + offs_m[:, None]) * N + offs_n[None, :]
        tl.store(w_ptrs, acc, mask=mask)
        if GATED:
            tl.store(w_ptrs + SPLITS * M * N, up, mask=mask)
        if ROW_RMS:
            tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=offs_m < M)
        tl.debug_barrier()  # every thread's partial is stored before the count says so
        is_last = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLITS - 1
    else:
        is_last = pid_k == 0
    if is_last:
        if SPLITS > 1:
            acc = _partials(ws_ptr, 0, offs_m, offs_n, M, N, SPLITS, BLOCK_M, BLOCK_N)
            if GATED:
                up = _partials(ws_ptr, 1, offs_m, offs_n, M, N, SPLITS, BLOCK_M, BLOCK_N)
            if ROW_RMS:
                ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for s in range(SPLITS):
                    ss += tl.load(ss_ptr + s * M + offs_m, mask=offs_m < M, other=0.0, cache_modifier=".cg")
            tl.store(count_ptr + pid_n, 0)  # the next call's count starts from zero
        if ROW_RMS:
            rstd = tl.rsqrt(ss / K + eps)[:, None]
            acc = acc * rstd
            if GATED:
                up = up * rstd
        if GATED:
            acc = gate_activation(acc, ACT) * up
{epilogue_store}
"""


def _epilogue_store(epi: Epilogue, indent: str) -> str:
    """Load the extras at the tile's coordinates (a row-broadcast one, ``XB<j>``, as one row), apply, store."""
    lines = []
    for j in range(epi.n_inputs):
        lines += [
            f"{indent}if XB{j}:",
            f"{indent}    x{j} = tl.load(x{j}_ptr + offs_n * stride_x{j}n, mask=offs_n < N)[None, :]",
            f"{indent}else:",
            f"{indent}    x{j} = tl.load(x{j}_ptr + offs_m[:, None] * stride_x{j}m + offs_n[None, :] * stride_x{j}n, mask=mask)",
        ]
    body = render(epi, indent=indent)
    if body:
        lines.append(body)
    lines.append(
        f"{indent}tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)"
    )
    return "\n".join(lines)


def kernel_source(epi: Epilogue) -> str:
    n = epi.n_inputs
    return _SOURCE.format(
        extra_ptrs="".join(f"x{j}_ptr, " for j in range(n)),
        extra_strides="".join(f"stride_x{j}m, stride_x{j}n, " for j in range(n)),
        extra_flags="".join(f"XB{j}: tl.constexpr, " for j in range(n)),
        epilogue_store=_epilogue_store(epi, " " * 8),
    )


def _module(epi: Epilogue):  # noqa: ANN202 - a generated module of triton JITFunctions
    return generated("skinny", epi.key(), lambda: kernel_source(epi))


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 64
    block_k: int = 128
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 4
    # a folded norm's sums of squares: False from the main loop's A tiles; True from the program's A slice loaded
    # once before the loop and summed after it (slices of at most MAX_SLICE values; longer ones use the loop)
    rms_slice: bool = False

    def describe(self) -> str:
        s = f"n{self.block_n} k{self.block_k} splits{self.splits} w{self.num_warps} s{self.num_stages}"
        return s + (" rms-slice" if self.rms_slice else "")


def splits_for(n: int, k: int, block_n: int, block_k: int, sms: int) -> int:
    """K slices a column block gets: enough programs for about three per SM, each slice at least two K steps."""
    blocks = cdiv(n, block_n)
    most = max(1, k // (2 * block_k))
    return max(1, min(most, cdiv(3 * sms, blocks)))


SMEM_BUDGET = 160 * 1024  # the pipeline's share of sm_90's 227 KB a block: room left for the layout conversions' scratch


def stages_for(block_n: int, block_k: int, parts: int, elem: int) -> int:
    """Pipeline stages (2-4) whose A and B tiles (``parts`` B tiles: two for the gated form) fit ``SMEM_BUDGET``."""
    per_stage = (MAX_ROWS * block_k + parts * block_k * block_n) * elem
    return max(2, min(4, SMEM_BUDGET // per_stage))


def configs(m: int, n: int, k: int, sms: int, gated: bool = False, elem: int = 2) -> list[SkinnyConfig]:
    """The candidates a lowering times: narrow and wide column blocks, short and long K steps, each split for
    about three programs an SM. Two accumulators (``gated``) keep to 64 x 128 tiles."""
    if interpreting():
        return [SkinnyConfig(32, 32, splits_for(n, k, 32, 32, sms), 4, 1)]
    out = []
    parts = 2 if gated else 1
    # session 48's probe (H100, TinyLlama's five decode GEMMs at M = 1 and 8): the fastest of 17 tiles was one of
    # these three on every shape but gate/up (32 x 64, 2.6% ahead of 64 x 128); 128-wide blocks never were
    for block_n, block_k, warps in ((32, 128, 4), (64, 128, 4), (64, 256, 4)):
        if gated and block_n * block_k > 64 * 128:  # two accumulators and two B tiles a stage
            continue
        cfg = SkinnyConfig(block_n, block_k, splits_for(n, k, block_n, block_k, sms), warps, stages_for(block_n, block_k, parts, elem))
        if cfg not in out:
            out.append(cfg)
    return out


def default_config(m: int, n: int, k: int, sms: int, gated: bool = False, elem: int = 2) -> SkinnyConfig:
    return configs(m, n, k, sms, gated, elem)[0 if interpreting() else 1]


_BUFFERS = KeptBuffers()


def _buffers(device: torch.device, parts: int, splits: int, m: int, n: int, blocks: int, owner: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial sums (and sums of squares) and the per-column-block counters of one launch shape and owner."""
    return _BUFFERS.get(
        (str(device), parts, splits, m, n, blocks, owner),
        lambda: (torch.empty(max(1, parts * splits * m * n + blocks * splits * m), dtype=torch.float32, device=device),
                 torch.zeros(max(1, blocks), dtype=torch.int32, device=device)),
    )  # fmt: skip


def _rows(a: torch.Tensor, k: int) -> torch.Tensor:
    if a.shape[-1] != k:
        raise ValueError(f"skinny_gemm: a's last dim is {a.shape[-1]}, the weight's K is {k}")
    try:
        return a.view(-1, k)
    except RuntimeError:
        return a.reshape(-1, k)


def skinny_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    extras: list[torch.Tensor],
    epi: Epilogue,
    out_dtype: torch.dtype,
    config: SkinnyConfig | None = None,
    *,
    row_rms: float | None = None,
    prefetch: bool = True,
    gated: str | None = None,
    gate_first: bool = True,
    owner: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``epi(rows(a) @ b, *extras)`` for ``a`` of at most ``MAX_ROWS`` rows (leading dims merged) and a 2-D ``b``
    (any strides). ``row_rms`` (eps): each row of the product scaled by ``rsqrt(mean(a_row^2) + eps)`` first.
    ``gated`` (an activation of ``gated_gemm.ACTIVATIONS``): ``b`` is ``[K, 2I]`` and the product is
    ``act(a @ b_gate) * (a @ b_up)`` (``[.., I]``) before the epilogue. ``owner`` keeps the buffers of two
    callers of one shape apart (a plan's nodes may run concurrently with the tuner's measurements). ``out``: written
    in place (the output's shape, rows of one stride)."""
    from kfuse.kernels.gated_gemm import ACTIVATIONS

    if a.dtype != b.dtype or b.dim() != 2:
        raise ValueError(f"skinny_gemm: need a 2-D weight of a's dtype, got a {a.dtype} and b {tuple(b.shape)} {b.dtype}")
    k = b.shape[0]
    a2 = _rows(a, k)
    m = a2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"skinny_gemm: {m} rows; at most {MAX_ROWS} (more rows are the tiled template's)")
    if gated is not None and (gated not in ACTIVATIONS or b.shape[1] % 2):
        raise ValueError(f"skinny_gemm: gated needs an activation of {sorted(ACTIVATIONS)} and an even width, got {gated!r}, {b.shape[1]}")
    n = b.shape[1] // 2 if gated else b.shape[1]
    out_shape = (*a.shape[:-1], n)
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != out_dtype or out.device != a.device):
        raise ValueError(f"skinny_gemm: out is {tuple(out.shape)} {out.dtype}, expected {out_shape} {out_dtype} on {a.device}")
    c = out if out is not None else torch.empty(out_shape, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if len(extras) != epi.n_inputs:
        raise ValueError(f"skinny_gemm: the epilogue expects {epi.n_inputs} extra inputs, got {len(extras)}")
    if k == 0:
        acc = torch.zeros((*a.shape[:-1], n), dtype=torch.float32, device=a.device)
        return c.copy_(apply_reference(acc, [e.float() for e in extras], epi))
    try:
        c2 = c.view(m, n)
    except RuntimeError:
        raise ValueError(f"skinny_gemm: out's strides {tuple(c.stride())} do not fold to (rows, N) = {(m, n)}") from None
    ex = [torch.broadcast_to(e, out_shape).reshape(m, n) for e in extras]
    sms = num_sms(a.device, 4)
    cfg = config or default_config(m, n, k, sms, gated is not None, a.element_size())
    block_m = MAX_ROWS
    blocks = cdiv(n, cfg.block_n)
    k_per_split = cdiv(cdiv(k, cfg.splits), cfg.block_k) * cfg.block_k
    splits = cdiv(k, k_per_split)  # rounding K slices to whole steps may leave fewer slices
    ws, count = _buffers(a.device, 2 if gated else 1, splits, m, n, blocks, owner)
    rms_slice = row_rms is not None and cfg.rms_slice and k_per_split <= MAX_SLICE
    half = b.shape[1] // 2
    gate_off = (0 if gate_first else half) * b.stride(1) if gated else 0
    up_off = (half if gate_first else 0) * b.stride(1) if gated else 0
    ex_strides = [s for e in ex for s in (e.stride(0), e.stride(1))]
    flags = {f"XB{j}": e.stride(0) == 0 for j, e in enumerate(ex)}
    _module(epi).skinny_kernel[(blocks, splits)](
        a2, b, c2, ws, count, *ex,
        m, n, k, k_per_split, gate_off, up_off,
        a2.stride(0), a2.stride(1), b.stride(0), b.stride(1), c2.stride(0), c2.stride(1), *ex_strides,
        float(row_rms if row_rms is not None else 0.0), **flags,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLITS=splits,
        ROW_RMS=row_rms is not None, SQUARES=row_rms is not None and not rms_slice, RMS_SLICE=rms_slice,
        BLOCK_SLICE=triton.next_power_of_2(k_per_split) if rms_slice else 16,
        GATED=gated is not None, ACT=ACTIVATIONS.get(gated or "silu", 0),
        PRECISION=dot_precision(a.dtype), **slab_plan(b, cfg.block_n, k_per_split, prefetch),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(),
    )  # fmt: skip
    return c


def reference(
    a: torch.Tensor, b: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, out_dtype: torch.dtype, *,
    row_rms: float | None = None, gated: str | None = None, gate_first: bool = True,
) -> torch.Tensor:  # fmt: skip
    """The oracle in fp32: the product (row-scaled, gated) then the epilogue through the op registry."""
    from kfuse.kernels.gated_gemm import _gate

    x = a.float()
    acc = x @ b.float()
    if row_rms is not None:
        acc = acc * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + row_rms)
    if gated is not None:
        acc = _gate(acc, gated, gate_first)
    return apply_reference(acc, [e.float() for e in extras], epi).to(out_dtype)


def mode(options: Any) -> str:
    """``Options.skinny_gemm`` ("auto" | "never" | "always"), overridden by ``$KFUSE_SKINNY_GEMM``."""
    return os.environ.get("KFUSE_SKINNY_GEMM", getattr(options, "skinny_gemm", "auto") if options is not None else "auto")


def candidates(
    node: Any, graph: Any, backend: str, options: Any, m: int, b_t: Any, out_dtype: torch.dtype,
    gated: str | None = None, gate_first: bool = True,
) -> dict[str, tuple[Callable[[list[torch.Tensor]], torch.Tensor], Any]]:  # fmt: skip
    """This kernel's configs as lowering candidates of a GEMM node (name -> (run, KernelInfo)): every config of
    ``configs`` on the GPU ("auto": the caller times them against its other candidates), the default config
    where it is forced ("always"), none where the node is not eligible or the mode is "never"."""
    from kfuse.runtime.executor import KernelInfo

    how = mode(options)
    a_t = graph.type_of(node.inputs[0])
    if backend == "torch" or how == "never" or not eligible(m, tuple(b_t.shape), a_t.dtype) or a_t.dtype != b_t.dtype:
        return {}
    if how == "auto" and not (backend == "triton" and torch.cuda.is_available()):
        return {}
    k, n = b_t.shape[0], b_t.shape[1] // 2 if gated else b_t.shape[1]
    sms = num_sms(torch.device("cuda"), 4) if torch.cuda.is_available() else 4
    elem = a_t.dtype.itemsize
    cfgs = configs(m, n, k, sms, gated is not None, elem) if how == "auto" else [default_config(m, n, k, sms, gated is not None, elem)]
    if node.attrs.get("row_rms") is not None and how == "auto":  # both ways to the row scale, each config
        cfgs += [replace(c, rms_slice=True) for c in cfgs]
    epi: Epilogue = node.attrs.get("epilogue") or Epilogue()
    eps = node.attrs.get("row_rms")
    owner = zlib.crc32(node.name.encode())  # buffers of its own: a node's launches never share counters with another's
    prefetch = prefetch_wanted(options)
    ops_ = tuple(node.attrs.get("fused_ops", ("matmul",)))
    out: dict[str, tuple[Callable[[list[torch.Tensor]], torch.Tensor], Any]] = {}
    for cfg in cfgs:

        def run(xs: list[torch.Tensor], cfg: SkinnyConfig = cfg) -> torch.Tensor:
            return skinny_gemm(
                xs[0], xs[1], xs[2:], epi, out_dtype, cfg, row_rms=eps, gated=gated, gate_first=gate_first, owner=owner, prefetch=prefetch
            )

        info = KernelInfo(node.name, "skinny_gemm", ops_, describe(cfg, eps is not None, gated), epi.describe())
        out[f"skinny {cfg.describe()}"] = (run, info)
    return out


def eligible(m: int, b_shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """A GEMM this kernel may run: few rows, a 2-D weight, a tensor-core dtype."""
    return 0 < m <= MAX_ROWS and len(b_shape) == 2 and dtype in (torch.float16, torch.bfloat16, torch.float32)


def describe(cfg: SkinnyConfig, row_rms: bool, gated: str | None) -> str:
    extra = (" + rms rows" if row_rms else "") + (f" + {gated}-gated" if gated else "")
    return f"skinny {cfg.describe()}{extra}"
