"""``prio``: the LC kernel and a BE slice as two kernels on prioritized streams, co-resident by the
hardware's block scheduler instead of inside one fused launch.

The fused versions (``fuser.py``) put LC and BE programs in one Triton kernel, so every program
gets the larger branch's warps, registers and shared memory. A BE program then takes an LC GEMM's
~64-100 KB of shared memory, and few fit beside the LC programs (session 15: mri-q's fused slices
cost 1.26-1.42 T_lc at load ratio 0.44-0.66 with ResNet-50). As two kernels, each keeps its own
footprint. The LC kernel goes first, on a high-priority stream, so its programs take their SM slots
before any BE program. The BE slice follows on a low-priority stream and fills what the LC programs
leave free: registers, shared memory and warp slots beside them, then whole SMs in the LC's tail.
The slice runs one program per block (``CudaBackend.run_fused``), so every slot that frees up takes
a fresh block.
While LC programs are pending, the block scheduler dispatches them first. Running BE programs are
not preempted, so BE blocks must be short, as the slices are. The window is measured like a fused
launch: from the LC's start until both kernels are done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

HIGH, LOW = -1, 0  # CUDA stream priorities as torch takes them: lower is more urgent


class PrioStreams:
    """Two streams, the LC's more urgent than the BE's (created on the current device)."""

    def __init__(self) -> None:
        self.hi = torch.cuda.Stream(priority=HIGH)
        self.lo = torch.cuda.Stream(priority=LOW)

    def run(self, lc: Callable[[], None], be: Callable[[], None]) -> None:
        """Enqueue ``lc`` on the urgent stream, then ``be`` on the other; the current stream waits for both."""
        run_beside(self.hi, lc, self.lo, be)


def run_beside(first: torch.cuda.Stream, lc: Callable[[], Any], second: torch.cuda.Stream, be: Callable[[], Any]) -> None:
    """``lc`` enqueued on ``first`` and then ``be`` on ``second``, both after the current stream's work; the current
    stream then waits for both."""
    cur = torch.cuda.current_stream()
    first.wait_stream(cur)
    second.wait_stream(cur)
    with torch.cuda.stream(first):
        lc()
    with torch.cuda.stream(second):
        be()
    cur.wait_stream(first)
    cur.wait_stream(second)


def run_prio(streams: PrioStreams | None, lc: Callable[[], None], be: Callable[[], None]) -> None:
    """Both kernels, concurrent on a GPU; one after the other without one (the interpreter)."""
    if streams is None:
        lc()
        be()
        return
    streams.run(lc, be)
