"""A simulated GPU with known durations, for testing the scheduler without a GPU.

LC kernel i takes ``lc_ms[i]``; BE kernel b takes ``a_b + b_b * blocks``; a fused launch follows a
known two-stage law in the load ratio (``fused_law``); two streams overlap by ``stream_overlap``
of the shorter kernel. Optional multiplicative noise checks robustness to prediction error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kfuse.colocate.scheduler import Backend, LCKernel


def two_stage_law(c_co: float = 0.15, x_star: float = 1.5, c_solo: float = 1.0) -> Callable[[float, float, Any], float]:
    """T_fused = T_lc * (1 + c_co x) below x*, then slope c_solo in x above it (continuous)."""

    def law(t_lc: float, t_be: float, version: Any) -> float:
        x = t_be / t_lc
        g = 1.0 + c_co * min(x, x_star) + c_solo * max(0.0, x - x_star)
        return t_lc * g

    return law


class SimGPU(Backend):
    def __init__(
        self, lc_ms: Sequence[float], fusible: Sequence[bool], be: dict[str, tuple[float, float, int]],
        fused_law: Callable[[float, float, Any], float] | dict[Any, Callable[[float, float, Any], float]] | None = None,
        stream_overlap: float = 0.1, noise: float = 0.0, seed: int = 0, keys: Sequence[str] | None = None,
    ) -> None:  # fmt: skip
        self.lc_ms = list(lc_ms)
        self.fusible = list(fusible)
        self.keys = list(keys) if keys is not None else [f"k{i}" for i in range(len(lc_ms))]
        self.be = be  # name -> (a, b, n_blocks)
        self.law = fused_law or two_stage_law()
        self.stream_overlap = stream_overlap
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.launches: list[tuple[str, Any]] = []

    def _n(self, t: float) -> float:
        return t * (1.0 + self.noise * self.rng.uniform(-1, 1)) if self.noise else t

    def lc_kernels(self) -> list[LCKernel]:
        return [LCKernel(f"lc{i}", f, k) for i, (f, k) in enumerate(zip(self.fusible, self.keys, strict=True))]

    def be_blocks(self, be: str) -> int:
        return self.be[be][2]

    def be_time(self, be: str, n: int) -> float:
        a, b, _ = self.be[be]
        return a + b * n if n > 0 else 0.0

    def run_lc(self, i: int) -> float:
        self.launches.append(("lc", i))
        return self._n(self.lc_ms[i])

    def run_be(self, be: str, start: int, end: int) -> float:
        self.launches.append(("be", (be, start, end)))
        return self._n(self.be_time(be, end - start))

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        if not self.fusible[i]:
            raise ValueError(f"LC kernel {i} is not fusible")
        self.launches.append(("fused", (i, be, start, end, version)))
        law = self.law[version] if isinstance(self.law, dict) else self.law
        return self._n(law(self.lc_ms[i], self.be_time(be, end - start), version))

    def run_concurrent(self, i: int, be: str, start: int, end: int) -> float:
        self.launches.append(("streams", (i, be, start, end)))
        t_lc, t_be = self.lc_ms[i], self.be_time(be, end - start)
        return self._n(t_lc + t_be - self.stream_overlap * min(t_lc, t_be))


def from_items(items: Sequence[Any], be: dict[str, Any], seed: int = 0) -> SimGPU:
    """A simulated GPU for an LC kernel list (``lc.LCItem``) and BE workloads, with roofline-style
    durations: GEMMs at 400 TFLOP/s, other segments 10 us per op, BE blocks from their FLOPs and bytes."""
    from kfuse.colocate.workloads import FP32_PEAK_FLOPS, PEAK_BYTES

    lc_ms, fusible, keys = [], [], []
    for it in items:
        if it.kernel is not None:
            m, n, k = it.kernel.meta["M"], it.kernel.meta["N"], it.kernel.meta["K"]
            lc_ms.append(0.005 + 2.0 * m * n * k / 400e12 * 1e3)
        else:
            lc_ms.append(0.01 * max(1, len(it.ops)))
        fusible.append(it.kernel is not None)
        keys.append(it.key or it.name)
    be_models = {}
    for name, w in be.items():
        k = w.kernel
        per_block = max(k.flops_per_block / FP32_PEAK_FLOPS, k.bytes_per_block / PEAK_BYTES) * 1e3 / 0.7
        be_models[name] = (0.005, per_block, k.n_blocks)
    return SimGPU(lc_ms, fusible, be_models, keys=keys, seed=seed)
