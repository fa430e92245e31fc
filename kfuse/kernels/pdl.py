"""Programmatic dependent launch (PDL, sm_90) for the kernels of a compiled plan.

In a CUDA graph each kernel normally starts only after the previous one has finished and its
memory is flushed: at small batch the GPU then spends ~1-2 us a launch with no kernel running
(BERT-base B1 S128: 0.15 ms of its 0.46 between ~86 kernels). With PDL a kernel is launched with
``launch_pdl=True`` and its programs may become resident while the previous grid drains; each one
waits at ``gdc_wait`` (``griddepcontrol.wait``) until the previous grid has completed and its
writes are visible, so nothing the previous kernel writes is read, and nothing it reads is
overwritten, before that wait. The kernels call the wait first, before any load or store, and then
``gdc_launch_dependents`` so that the next kernel may in turn start as soon as room frees up.

Correctness does not depend on every kernel taking part: a kernel launched without the attribute
(cuBLAS, a PyTorch fallback, a copy) waits for full completion as usual, and a PDL kernel after it
waits for it at ``gdc_wait``. What must never happen is a PDL launch of a kernel that does not
wait, so the launch keyword and the kernel's ``PDL`` constexpr come from one place,
``launch_kwargs``.

The Gluon kernels wait with ``pdl_gluon.pdl_start``, the same two instructions as inline PTX.

Whether a plan uses PDL is ``Options.pdl``; the executor opens ``scope(plan.pdl)`` around its
steps, so kernels launched by the tuner, the profiler or a test outside a plan run without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import triton
import triton.language as tl

from kfuse.kernels.codegen import interpreting

_ENABLED: ContextVar[bool] = ContextVar("kfuse_pdl", default=False)


def active() -> bool:
    """Whether kernels launched now take part in PDL (never in the interpreter: it has no grids)."""
    return _ENABLED.get() and not interpreting()


@contextlib.contextmanager
def scope(enabled: bool) -> Iterator[None]:
    """Kernels launched inside take part in PDL when ``enabled`` (and on a GPU)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def launch_kwargs() -> dict[str, Any]:
    """Keywords for a ``kernel[grid](...)`` call whose kernel takes a ``PDL: tl.constexpr``: the
    constexpr that makes it wait, and the launch attribute, always together."""
    return {"PDL": True, "launch_pdl": True} if active() else {"PDL": False}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    # first thing in a kernel: wait for the previous grid (its writes visible), then let the next
    # grid's programs become resident as this one's leave
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
