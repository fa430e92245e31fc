"""Persistent-thread-block (PTB) kernels.

A kernel is described by its *block function*: a ``@triton.jit`` function ``fn(bid, *args, *CONSTS)``
that does the work of one original thread block ``bid`` (it must not call ``tl.program_id``).
From it we generate

* the original kernel: one program per block, ``fn(tl.program_id(0), ...)``;
* the PTB kernel: a fixed grid of ``P`` programs, program ``p`` runs blocks
  ``start + p, start + p + P, ...`` below ``end``. The grid no longer depends on the input size, and
  ``[start, end)`` lets any slice of the work run on its own (kernel split).

The GEMM block function (fp16/bf16 tensor cores, or fp32) is here too; convolutions run as
GEMMs (implicit-GEMM shapes ``M = N*OH*OW, N = C_out, K = C_in/groups*KH*KW``), see ``conv_gemm_shape``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.codegen import interpreting, load_generated
from kfuse.runtime.device import first_device


@dataclass
class BlockKernel:
    """One launch's worth of work, described by its block function and arguments."""

    name: str
    module: str  # import path of the module holding the block function
    fn: str  # name of the @triton.jit block function
    args: list[Any]  # runtime arguments (tensors, ints, floats), in the block function's order
    consts: dict[str, Any]  # constexpr arguments, in the block function's order (after args)
    n_blocks: int
    num_warps: int = 4
    num_stages: int = 1
    flops_per_block: float = 0.0  # for utilisation / classification
    bytes_per_block: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def block_fn(self) -> Any:
        return getattr(importlib.import_module(self.module), self.fn)

    def signature_key(self) -> str:
        return f"{self.fn}_{len(self.args)}_{'_'.join(self.consts)}"


def num_sms(device: torch.device | str | None = None) -> int:
    """SMs of ``device`` (None: the current GPU); 4 for the CPU, also on a GPU machine (the interpreter: any small
    number exercises the loop)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        return torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device).multi_processor_count
    return 4


def _params(prefix: str, k: BlockKernel) -> tuple[list[str], list[str]]:
    args = [f"{prefix}a{i}" for i in range(len(k.args))]
    consts = [f"{prefix}{c}" for c in k.consts]
    return args, consts


_ORIG = """
import triton
import triton.language as tl
from {module} import {fn} as block_fn


@triton.jit
def orig_kernel({params}):
    block_fn(tl.program_id(0), {call})


# no specialisation of the range: Triton would compile a new variant for start/end == 1 or % 16 != 0,
# and a kernel split launches arbitrary ranges, so a compile (hundreds of ms) would land mid-run
@triton.jit(do_not_specialize=["start", "end"])
def ptb_kernel({params_ptb}):
    # persistent: a fixed grid, each program loops over original block ids in [start, end)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for bid in range(start + pid, end, nprog):
        block_fn(bid, {call})
"""


def _module_for(k: BlockKernel) -> Any:
    args, consts = _params("", k)
    params = ", ".join(args + [f"{c}: tl.constexpr" for c in consts])
    params_ptb = ", ".join(args + ["start", "end"] + [f"{c}: tl.constexpr" for c in consts])
    src = _ORIG.format(module=k.module, fn=k.fn, params=params, params_ptb=params_ptb, call=", ".join(args + consts))
    return load_generated("ptb", k.signature_key(), src)


def launch_original(k: BlockKernel) -> None:
    """The non-persistent kernel: one program per block."""
    _module_for(k).orig_kernel[(k.n_blocks,)](*k.args, *k.consts.values(), num_warps=k.num_warps, num_stages=k.num_stages)


def launch_ptb(k: BlockKernel, start: int = 0, end: int | None = None, grid: int | None = None) -> Any:
    """Run blocks ``[start, end)`` of ``k`` on a persistent grid of ``grid`` programs (default: one per SM); returns
    what Triton's launch returns (the compiled kernel on a GPU, whose registers and shared memory tell its occupancy;
    None for an empty range)."""
    end = k.n_blocks if end is None else end
    if not 0 <= start <= end <= k.n_blocks:
        raise ValueError(f"{k.name}: block range [{start}, {end}) is outside [0, {k.n_blocks})")
    if start == end:
        return None
    g = max(1, min(grid or num_sms(first_device(k.args, None)), end - start))
    return _module_for(k).ptb_kernel[(g,)](*k.args, start, end, *k.consts.values(), num_warps=k.num_warps, num_stages=k.num_stages)


# ---- GEMM block function ---------------------------------------------------------------------


@triton.jit
def gemm_block(
    bid, a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    # same grouped (swizzled) tile order as kfuse.kernels.gemm, with ``bid`` in place of program_id
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (bid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((bid % group) % size_m)
    pid_n = (bid % group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@dataclass(frozen=True)
class PtbGemmConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def describe(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k}w{self.num_warps}s{self.num_stages}"


# the fp16 LC tile on the GPU: 128 x 128 x 32, 8 warps, 3 stages takes 124 registers a thread and 48 KB of
# shared memory on sm_90, so two programs fit an SM, as CudaBackend's 2-programs-per-SM grid and the tail-fill
# fused kernel assume. The 128 x 128 x 64 tile used through session 9 takes 167 registers: one program per SM,
# and half of every tail-fill grid waited (``kfuse.colocate.occupancy``, tests/colocate/test_occupancy.py)
GPU_FP16_CONFIG = PtbGemmConfig(128, 128, 32, 8, 8, 3)
GPU_FP32_CONFIG = PtbGemmConfig(64, 64, 32, 8, 4, 2)


# the tiles a per-shape choice (``pick_ptb_config``, ``lc_items(gemms="ptb-tuned")``) tries on the GPU: none takes more
# shared memory than the default's 48 KB (3 stages of 128 x 32 + 32 x 128 fp16) or more accumulator registers a thread,
# so the LC's 2-programs-an-SM grid stays; the smaller ones give a few-tile GEMM more programs to spread over the SMs
# (BERT-base B8 S128's 1024 x 768 GEMMs: 48 tiles of 128 x 128 on 132 SMs, 96 of 128 x 64, 192 of 64 x 64)
GPU_FP16_LC_TILES = (GPU_FP16_CONFIG, PtbGemmConfig(128, 64, 32, 8, 4, 3), PtbGemmConfig(64, 128, 32, 8, 4, 3),
                     PtbGemmConfig(64, 64, 64, 8, 4, 3))  # fmt: skip
# the interpreter's: two small tiles, so the choice itself is exercised on the CPU
CPU_LC_TILES = (PtbGemmConfig(16, 16, 16, 2, 4, 1), PtbGemmConfig(32, 16, 16, 2, 4, 1))


def time_ptb(k: BlockKernel, grid: int, reps: int = 20) -> float:
    """Median milliseconds of ``k``'s whole block range on a ``grid``-program persistent launch, after one untimed
    launch (the compile): ``reps`` CUDA-event timings on a GPU, one wall-clock run in the interpreter."""
    from kfuse.bench.harness import time_ms

    device = torch.device("cpu") if interpreting() else first_device(k.args, None)
    on_gpu = device is not None and torch.device(device).type == "cuda"
    return float(time_ms(lambda: launch_ptb(k, 0, k.n_blocks, grid), warmup=1, rep=reps if on_gpu else 1, device=device))


def pick_ptb_config(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, grid: int, candidates: Sequence[PtbGemmConfig] | None = None,
    time_ms: Callable[[BlockKernel, int], float] | None = None,
) -> tuple[PtbGemmConfig, dict[PtbGemmConfig, float]]:  # fmt: skip
    """The fastest of ``candidates`` (default: ``GPU_FP16_LC_TILES`` on a GPU, ``CPU_LC_TILES`` in the interpreter) for
    ``c = a @ b`` as a PTB GEMM on ``grid`` programs, and every candidate's time. ``time_ms(kernel, grid)`` times one
    candidate (default ``time_ptb``); a candidate that fails to compile or run is left out (none left: an error)."""
    if candidates:
        cands = list(candidates)
    elif not a.is_cuda or interpreting():
        cands = list(CPU_LC_TILES)
    else:
        cands = [GPU_FP32_CONFIG] if a.dtype == torch.float32 else list(GPU_FP16_LC_TILES)
    timer = time_ms or time_ptb
    times: dict[PtbGemmConfig, float] = {}
    errors = []
    for cfg in cands:
        try:
            times[cfg] = float(timer(gemm_kernel(a, b, c, cfg), grid))
        except Exception as e:  # noqa: BLE001 - a tile this GPU cannot run is not chosen
            errors.append(f"{cfg}: {type(e).__name__}: {str(e)[:120]}")
    if not times:
        raise RuntimeError(f"pick_ptb_config: no candidate tile ran for {tuple(a.shape)} @ {tuple(b.shape)}: {'; '.join(errors)}")
    return min(times, key=times.__getitem__), times


def default_ptb_config(dtype: torch.dtype, gpu: bool | None = None) -> PtbGemmConfig:
    """One tile for every LC GEMM, so all share one compiled kernel (M, N, K are runtime values).
    ``gpu``: the GPU's tile even under the interpreter (default: the interpreter's small tile there)."""
    if not (gpu if gpu is not None else not interpreting()):
        return PtbGemmConfig(16, 16, 16, 2, 4, 1)
    return GPU_FP32_CONFIG if dtype == torch.float32 else GPU_FP16_CONFIG


def gemm_kernel(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: PtbGemmConfig | None = None, precision: str | None = None, name: str = "gemm"
) -> BlockKernel:
    """``c = a @ b`` (2-D) as a BlockKernel. fp32 inputs use ``precision`` ("ieee": CUDA cores; "tf32": tensor cores)."""
    if a.dim() != 2 or b.dim() != 2 or c.dim() != 2:
        raise ValueError(f"gemm_kernel: 2-D operands expected, got {tuple(a.shape)}, {tuple(b.shape)}, {tuple(c.shape)}")
    m, k = a.shape
    k2, n = b.shape
    if k != k2 or tuple(c.shape) != (m, n):
        raise ValueError(f"gemm_kernel: shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(c.shape)} do not match")
    cfg = config or default_ptb_config(a.dtype, gpu=a.is_cuda)  # the tensors' device: CPU tensors run in the interpreter
    prec = precision or ("ieee" if a.dtype == torch.float32 else "tf32")
    nb = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    return BlockKernel(
        name=name,
        module=__name__,
        fn="gemm_block",
        args=[a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)],
        consts={"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m, "INPUT_PRECISION": prec},
        n_blocks=nb,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        flops_per_block=2.0 * cfg.block_m * cfg.block_n * k,
        bytes_per_block=(cfg.block_m + cfg.block_n) * k * a.element_size() + cfg.block_m * cfg.block_n * c.element_size(),
        meta={"M": m, "N": n, "K": k, "tensor_core": prec != "ieee" or a.dtype != torch.float32},
    )


def ptb_gemm(
    a: torch.Tensor, b: torch.Tensor, start: int = 0, end: int | None = None, grid: int | None = None,
    out: torch.Tensor | None = None, config: PtbGemmConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """``a @ b`` through the PTB GEMM; only the output tiles in block range ``[start, end)`` are written."""
    c = out if out is not None else torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    launch_ptb(gemm_kernel(a, b, c, config), start, end, grid)
    return c


# ---- convolution as GEMM ---------------------------------------------------------------------


def conv_gemm_shape(x_shape: Sequence[int], w_shape: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                    dilation: Sequence[int] = (1, 1), groups: int = 1) -> tuple[int, int, int]:  # fmt: skip
    """Implicit-GEMM problem (M, N, K) of an NCHW conv2d (per group; groups multiply the work)."""
    n, _, h, w = x_shape
    cout, cin_g, kh, kw = w_shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return n * oh * ow, cout // groups, cin_g * kh * kw


def ptb_conv2d(
    x: torch.Tensor, w: torch.Tensor, stride: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0),
    start: int = 0, end: int | None = None, grid: int | None = None, config: PtbGemmConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """conv2d (groups=1, no bias) as im2col + the PTB GEMM; the block range indexes GEMM tiles."""
    n, _, h, wd = x.shape
    cout, _, kh, kw = w.shape
    m, nn, k = conv_gemm_shape(x.shape, w.shape, stride, padding)
    oh = (h + 2 * padding[0] - (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - (kw - 1) - 1) // stride[1] + 1
    cols = torch.nn.functional.unfold(x, (kh, kw), padding=tuple(padding), stride=tuple(stride))  # (n, k, oh*ow)
    a = cols.transpose(1, 2).reshape(m, k)
    b = w.reshape(cout, k).t()
    c = ptb_gemm(a, b, start, end, grid, config=config)
    return c.reshape(n, oh, ow, nn).permute(0, 3, 1, 2)
