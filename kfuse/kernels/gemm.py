"""GEMM template with a generated epilogue: C = epilogue(A @ B, extra inputs...).

A is (M, K) with any strides, B is (K, N) with any strides, accumulation is fp32. The epilogue
(bias, activation, residual, scale, casts, ...) is rendered from an ``Epilogue`` program into the
kernel source, so every combination is its own specialised kernel; sources are written to the
kernel cache and imported (Triton needs kernels to live in files).

Tile parameters (BLOCK_M/N/K, GROUP_M swizzle, num_warps, num_stages) are template parameters
chosen by the tuner; ``default_config`` gives a shape-based choice when nothing was tuned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kfuse.kernels.codegen import load_generated
from kfuse.kernels.epilogue import Epilogue, apply_reference, render

_TEMPLATE = '''
import triton
import triton.language as tl


@triton.jit
def gemm_kernel(
    a_ptr, b_ptr, c_ptr, {extra_ptrs}
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, {extra_strides}
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # grouped ordering: GROUP_M row-blocks share B tiles while they are hot in L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m

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

    mask = mask_m[:, None] & mask_n[None, :]
{load_extras}
{epilogue}
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
'''


def kernel_source(epi: Epilogue) -> str:
    n = epi.n_inputs
    loads = "\n".join(
        f"    x{j} = tl.load(x{j}_ptr + offs_m[:, None] * stride_x{j}m + offs_n[None, :] * stride_x{j}n, mask=mask)"
        for j in range(n)
    )
    return _TEMPLATE.format(
        extra_ptrs="".join(f"x{j}_ptr, " for j in range(n)),
        extra_strides="".join(f"stride_x{j}m, stride_x{j}n, " for j in range(n)),
        load_extras=loads,
        epilogue=render(epi),
    )


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def describe(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_config(m: int, n: int, k: int) -> GemmConfig:
    """A reasonable tile for the problem when no tuning record exists."""
    if interpreting():
        return GemmConfig(32, 32, 32, 4, 4, 1)
    if m * n >= 1 << 20:
        return GemmConfig(128, 128, 64, 8, 8, 3)
    if m * n >= 1 << 16:
        return GemmConfig(64, 128, 64, 8, 4, 3)
    return GemmConfig(32, 64, 64, 8, 4, 3)


def _kernel(epi: Epilogue):  # noqa: ANN202 - a triton JITFunction
    return load_generated("gemm", epi.key(), kernel_source(epi)).gemm_kernel


def gemm_epilogue(
    a: torch.Tensor,
    b: torch.Tensor,
    extras: list[torch.Tensor],
    epi: Epilogue,
    out_dtype: torch.dtype,
    config: GemmConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``epi(a @ b, *extras)`` in one kernel. ``a`` may have leading batch dims (they fold into M);
    ``b`` is 2-D; extras broadcast to the output shape."""
    if b.dim() != 2:
        raise ValueError(f"gemm_epilogue: B must be 2-D, got shape {tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"gemm_epilogue: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    k, n = b.shape
    out_shape = tuple(a.shape[:-1]) + (n,)
    a2 = a.reshape(-1, k)
    m = a2.shape[0]
    c = out if out is not None else torch.empty((m, n), dtype=out_dtype, device=a.device)
    c2 = c.view(m, n)
    ex2 = [torch.broadcast_to(e, out_shape).reshape(m, n) for e in extras]
    if len(ex2) != epi.n_inputs:
        raise ValueError(f"epilogue expects {epi.n_inputs} extra inputs, got {len(ex2)}")
    cfg = config or default_config(m, n, k)
    precision = "ieee" if a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    if m == 0 or n == 0:
        return c.reshape(out_shape)
    if k == 0:  # nothing to multiply: the product is zero, the epilogue still applies
        return apply_reference(torch.zeros(out_shape, device=a.device), extras, epi).to(out_dtype)
    grid = (triton_cdiv(m, cfg.block_m) * triton_cdiv(n, cfg.block_n),)
    strides: list[int] = []
    for e in ex2:
        strides += [e.stride(0), e.stride(1)]
    _kernel(epi)[grid](
        a2, b, c2, *ex2,
        m, n, k,
        a2.stride(0), a2.stride(1), b.stride(0), b.stride(1), c2.stride(0), c2.stride(1), *strides,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return c.reshape(out_shape)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def reference(a: torch.Tensor, b: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, out_dtype: torch.dtype) -> torch.Tensor:
    """The oracle: fp32 matmul then the epilogue through the op registry."""
    acc = torch.matmul(a.float(), b.float())
    return apply_reference(acc, [e.float() if e.is_floating_point() else e for e in extras], epi).to(out_dtype)
