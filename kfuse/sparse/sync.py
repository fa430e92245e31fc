"""Memory-ordering helpers shared by the sync-free kernels (flag wait + acquire fence).

A producer publishes with ``store data; debug_barrier; atomic_xchg(flag, sem="release")``.
A consumer polls the flag with volatile loads (relaxed, served by L2) and, once every flag
it needs is set, issues ``fence.acq_rel.gpu`` so that its later loads see the producer's
data (the PTX fence-based acquire pattern). The Triton interpreter has no inline asm, and
runs programs one after another, so there the fence is compiled out (``HW_FENCE=False``),
and so is the optional poll backoff (``nanosleep``), which is inline asm as well.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.codegen import interpreting


def hw_fence_enabled(device: torch.device) -> bool:
    """The inline-asm fence is only valid on a real CUDA device."""
    return device.type == "cuda" and not interpreting()


@triton.jit
def acquire_fence(token, HW_FENCE: tl.constexpr):
    """fence.acq_rel.gpu after relaxed flag loads; returns ``token`` unchanged.

    ``is_pure=False`` keeps the asm (and its position) in the program; the value dependency
    through ``token`` ties later index arithmetic to it.
    """
    if HW_FENCE:
        token = tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [token], dtype=tl.int32, is_pure=False, pack=1)
    return token


@triton.jit
def backoff(token, BACKOFF_NS: tl.constexpr, HW_ASM: tl.constexpr):
    """``nanosleep.u32 BACKOFF_NS`` (when both are on); returns ``token`` unchanged.

    The sleep leaves L2 to the producers while a program waits; the token keeps the next poll
    after it.
    """
    if BACKOFF_NS > 0:
        if HW_ASM:
            token = tl.inline_asm_elementwise(
                "nanosleep.u32 $2;\n\tmov.b32 $0, $1;", "=r,r,r", [token, token * 0 + BACKOFF_NS], dtype=tl.int32, is_pure=False, pack=1
            )
    return token


@triton.jit
def wait_flags(flag_ptr, idx, mask, target, BACKOFF_NS: tl.constexpr, HW_ASM: tl.constexpr):
    """Spin until ``flag[idx] >= target`` for every lane in ``mask`` (uniform over the program)."""
    f = tl.load(flag_ptr + idx, mask=mask, other=target, volatile=True)
    missing = tl.sum(tl.where(mask & (f < target), 1, 0))
    while missing > 0:
        slept = backoff(missing, BACKOFF_NS, HW_ASM)  # opaque copy of missing: the poll stays after the sleep
        f = tl.load(flag_ptr + idx + (slept - missing), mask=mask, other=target, volatile=True)
        missing = tl.sum(tl.where(mask & (f < target), 1, 0))


@triton.jit
def ld_acquire(ptr, HW_ASM: tl.constexpr):
    """``ld.acquire.gpu.global.b32`` of every lane's ``ptr`` (a volatile load in the interpreter).

    The acquire orders this lane's later loads after the flag it read, with no gpu-scope fence;
    the pointer operand uses the "l" (64-bit register) constraint. Every lane must hold a valid
    pointer (inline asm has no mask): callers point masked lanes at a known-valid address.
    """
    if HW_ASM:
        v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    else:
        v = tl.load(ptr, volatile=True)
    return v


@triton.jit
def wait_flags_acquire(flag_ptr, idx, mask, target, BACKOFF_NS: tl.constexpr, HW_ASM: tl.constexpr):
    """Spin with acquire loads until ``flag[idx] >= target`` on every lane in ``mask``.

    Returns an int32 tensor of zeros shaped like ``idx`` that depends on the last loads, so a
    lane's later address arithmetic can hang off its own acquire (no fence needed for the lane
    that read the flag; other lanes need a CTA barrier after this).
    """
    safe = tl.where(mask, idx, 0)  # flag[0] always exists
    f = tl.where(mask, ld_acquire(flag_ptr + safe, HW_ASM), target)
    missing = tl.sum(tl.where(f < target, 1, 0))
    while missing > 0:
        slept = backoff(missing, BACKOFF_NS, HW_ASM)
        f = tl.where(mask, ld_acquire(flag_ptr + safe + (slept - missing), HW_ASM), target)
        missing = tl.sum(tl.where(f < target, 1, 0))
    return tl.where(f >= target, 0, 1)  # 0, but data-dependent on the acquire loads


@triton.jit
def st_release(ptr, value, HW_ASM: tl.constexpr):
    """``st.release.gpu.global.b32`` of a scalar by every thread (same address, same value).

    On sm_90 this is ``MEMBAR.ALL.GPU`` + ``STG.E.STRONG.GPU``, the same fence that
    ``atomic_xchg(sem="release")`` emits before its ``ATOMG.EXCH`` (docs/sparse.md). The
    interpreter falls back to the exchange.
    """
    if HW_ASM:
        tl.inline_asm_elementwise(
            "st.release.gpu.global.b32 [$1], $2;\n\tmov.b32 $0, 0;", "=r,l,r", [ptr, value], dtype=tl.int32, is_pure=False, pack=1
        )
    else:
        tl.atomic_xchg(ptr, value, sem="release", scope="gpu")
