"""A GPU fault while a compile measures a candidate is not a candidate that lost.

Compile-time decisions (template vs library, fused vs unfused, attention tiles, gated GEMMs) run
their candidates and let one that fails lose. An illegal address or a launch failure is different:
it leaves the CUDA context unusable, so every later CUDA call of the process fails too. Until
session 35 those decisions caught the fault like any failure and went on, and the error surfaced
at an unrelated call (ConvNeXt-T's compile on the H200 reported it while packing a convolution's
weight, Swin-T's while drawing random inputs for an attention choice): nothing named the kernel.
``check`` turns such a failure into a ``CudaFault`` that names the candidate and the node.
"""

from __future__ import annotations

import torch

# messages of the sticky errors (cudaErrorIllegalAddress, LaunchFailure, MisalignedAddress, ...): the context
# is lost whatever else. Any other CUDA error (an invalid launch argument, no kernel image) is a fault only
# if the GPU no longer synchronizes after it; out of memory is an ordinary failure, the context survives it
_STICKY_TEXT = ("illegal memory access", "illegal address", "unspecified launch failure", "misaligned address",
                "illegal instruction", "hardware stack error", "uncorrectable ECC")  # fmt: skip


class CudaFault(RuntimeError):
    """The GPU faulted while kfuse ran ``what``; the process's CUDA context is lost."""


def is_fault(e: BaseException) -> bool:
    """Whether ``e`` is a GPU fault that lost the context (not an ordinary failure: a compile error, out of
    memory, or a CUDA error after which the GPU still synchronizes)."""
    text = str(e)
    if "out of memory" in text:
        return False
    if any(t in text for t in _STICKY_TEXT):
        return True
    acc = getattr(torch, "AcceleratorError", None)
    if (acc is not None and isinstance(e, acc)) or "CUDA error" in text:
        return context_lost() is not None
    return False


def context_lost(device: torch.device | str | None = None) -> str | None:
    """The error of ``torch.cuda.synchronize(device)`` where the GPU no longer works, else None. Without a
    ``device``, also None without a GPU or before CUDA was initialised (nothing can have faulted); a given
    device (the tuner's runner's) is synchronised as it is."""
    if device is None and not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - any failure to synchronize means the context is gone
        return f"{type(e).__name__}: {first_line(e)}"
    return None


def check(e: BaseException, what: str) -> None:
    """Raise ``CudaFault`` (from ``e``) when ``e`` is a GPU fault, or when the GPU no longer synchronizes
    after it; return when it is an ordinary failure, which the caller records (the candidate loses)."""
    if isinstance(e, CudaFault):  # raised further in, with the candidate named: pass it on as it is
        raise e
    why = f"{type(e).__name__}: {first_line(e)}" if is_fault(e) else None
    if why is None and (lost := context_lost()) is not None:  # an innocent-looking error, and the GPU is gone
        why = f"{type(e).__name__}: {first_line(e)}; then {lost}"
    if why is not None:
        raise CudaFault(
            f"kfuse: the GPU faulted while running {what} ({why}). The CUDA context is lost: restart the process "
            "(a template-vs-library candidate is remembered in the tuning database and skipped from then on). "
            "Please report it with the model."
        ) from e


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of ``e``'s message, at most ``limit`` characters."""
    lines = str(e).strip().splitlines()
    return lines[0][:limit] if lines else ""
