"""Kernel-by-kernel GPU time of a callable, from ``torch.profiler`` (CUPTI sees the kernels a CUDA graph replays).

What a benchmark prints beside its wall time: where the GPU time of one call goes, by kernel name, and how much of
the call's wall time no kernel covers (launch gaps, host work, waits between dependent launches).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch


def kernel_table(fn: Callable[[], Any], calls: int, sequence: list[float] | None = None, match: str = "") -> list[tuple[str, float, int]]:
    """(name, microseconds per call, launches per call), largest first. ``sequence`` gets, in launch order,
    the microseconds of each launch of the last call whose name holds ``match`` (one layer each)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    ks = sorted(
        ((e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda r: r[1],
    )
    total: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for name, t0, t1 in ks:
        total[name] += (t1 - t0) / calls
        count[name] += 1
    if sequence is not None and match:
        hits = [t1 - t0 for name, t0, t1 in ks if any(m in name for m in match.split(","))]
        sequence.extend(hits[len(hits) - len(hits) // calls :])
    return sorted(((n, us, count[n] // calls) for n, us in total.items()), key=lambda r: -r[1])


def profile_summary(fn: Callable[[], Any], call_ms: float, calls: int = 5, top: int = 25) -> dict[str, Any]:
    """The kernels of one call of ``fn`` (``top`` largest by time), their summed time and launches, and the share
    of ``call_ms`` (the call's measured wall time) that no kernel covers."""
    rows = kernel_table(fn, calls)
    kernel_us = sum(us for _, us, _ in rows)
    return {
        "kernel_us": round(kernel_us, 1),
        "launches": sum(n for _, _, n in rows),
        "uncovered_us": round(call_ms * 1e3 - kernel_us, 1),
        "top": [[name[:120], round(us, 2), n] for name, us, n in rows[:top]],
    }
