"""Programmatic dependent launch on or off, chosen by timing the whole plan both ways.

PDL lets each kfuse kernel become resident while the previous one drains (``kfuse.kernels.pdl``). It
saved 1-10% on the transformers and ResNet-50 where it was measured (session 23), but on ConvNeXt-T B32
it cost 12%: 2.029 ms with it, 1.780 ms without, in one process (session 40,
``depthwise_model_ab.py --pdl-off-too``; without kfuse's depthwise kernel 1.939 / 1.994, so PDL paid
there). Which side wins depends on the plan's kernels together, not on any one kernel, so with
``Options.pdl = "auto"`` the plan is timed with PDL on and off, A B B A against clock drift, and PDL
is turned off only where that runs more than ``FLIP`` faster. Both sides launch the same kernels on
the same buffers; only the launch attribute and the in-kernel wait differ, so the outputs are equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kfuse.runtime.executor import Plan

FLIP = 0.02  # PDL off must run this much faster to be kept: two timings a side are not finer than that


def choose_pdl(
    plan: Plan,
    xs: list[torch.Tensor],
    timer: Callable[[Plan, list[torch.Tensor]], float] | None = None,
    flip: float = FLIP,
    precompile: Callable[[Plan, list[torch.Tensor]], Any] | None = None,
) -> dict[str, Any]:
    """Time ``plan`` with PDL on and off (A B B A), leave ``plan.pdl`` on the faster side and return
    ``{"on_ms", "off_ms", "kept"}``; ``precompile`` (``executor.precompile_plan``) compiles the PDL-off
    kernels first. A plan without PDL is left alone (``{"kept": False, "timed": False}``)."""
    if not plan.pdl:
        return {"kept": False, "timed": False}
    if timer is None:
        from kfuse.runtime.b2b_recheck import plan_ms

        timer = plan_ms
    times: dict[bool, list[float]] = {True: [], False: []}
    if precompile is not None:  # the PDL=False kernel variants, compiled in parallel rather than one by one in the first timing
        plan.pdl = False
        try:
            precompile(plan, xs)
        finally:
            plan.pdl = True
    try:
        for on in (True, False, False, True):
            plan.pdl = on
            times[on].append(timer(plan, xs))
    finally:
        plan.pdl = True
    on_ms, off_ms = sum(times[True]) / 2, sum(times[False]) / 2
    plan.pdl = not off_ms < (1.0 - flip) * on_ms
    return {"on_ms": round(on_ms, 4), "off_ms": round(off_ms, 4), "kept": plan.pdl, "timed": True}
