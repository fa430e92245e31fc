"""The real GPU backend: every launch is timed with CUDA events and synchronised, and that time
advances the scheduler's clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kfuse.colocate.fuser import FusedVersion, launch_fused
from kfuse.colocate.lc import LCItem
from kfuse.colocate.ptb import launch_ptb, num_sms
from kfuse.colocate.scheduler import Backend, LCKernel
from kfuse.colocate.workloads import Workload


def timed(fn: Callable[[], Any]) -> float:
    """Milliseconds of the GPU work ``fn`` launches (CPU wall clock without a GPU)."""
    if not torch.cuda.is_available():
        import time

        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


class CudaBackend(Backend):
    def __init__(self, items: Sequence[LCItem], be: dict[str, Workload], lc_programs_per_sm: int = 2, be_programs_per_sm: int = 4) -> None:
        self.items = list(items)
        self.be = be
        self.sms = num_sms()
        self.lc_grid = lc_programs_per_sm * self.sms
        self.be_grid = be_programs_per_sm * self.sms
        self.launches = 0
        if torch.cuda.is_available():
            self.s1, self.s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def lc_kernels(self) -> list[LCKernel]:
        return [LCKernel(it.name, it.kernel is not None, it.key) for it in self.items]

    def be_blocks(self, be: str) -> int:
        return self.be[be].kernel.n_blocks

    def _lc(self, i: int) -> Callable[[], None]:
        it = self.items[i]
        if it.kernel is not None:
            k = it.kernel
            return lambda: launch_ptb(k, 0, k.n_blocks, self.lc_grid)
        assert it.run is not None
        return it.run

    def run_lc(self, i: int) -> float:
        self.launches += 1
        return timed(self._lc(i))

    def run_be(self, be: str, start: int, end: int) -> float:
        self.launches += 1
        k = self.be[be].kernel
        return timed(lambda: launch_ptb(k, start, end, self.be_grid))

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        it = self.items[i]
        if it.kernel is None:
            raise ValueError(f"LC kernel {it.name} is not a PTB GEMM: it cannot be fused")
        self.launches += 1
        v = version if isinstance(version, FusedVersion) else FusedVersion(*version)
        lk, bk = it.kernel, self.be[be].kernel
        return timed(lambda: launch_fused(lk, bk, v, (0, lk.n_blocks), (start, end), self.sms))

    def run_concurrent(self, i: int, be: str, start: int, end: int) -> float:
        self.launches += 1
        lc = self._lc(i)
        k = self.be[be].kernel
        if not torch.cuda.is_available():
            return timed(lambda: (lc(), launch_ptb(k, start, end, self.be_grid)))

        def both() -> None:
            cur = torch.cuda.current_stream()
            self.s1.wait_stream(cur)
            self.s2.wait_stream(cur)
            with torch.cuda.stream(self.s2):
                launch_ptb(k, start, end, self.be_grid)
            with torch.cuda.stream(self.s1):
                lc()
            cur.wait_stream(self.s1)
            cur.wait_stream(self.s2)

        return timed(both)
