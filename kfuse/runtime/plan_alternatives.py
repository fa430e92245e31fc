"""A lowering race's runner-up timed again inside the whole plan.

A race (``choice.choose``, the gated MLP's decision) times each candidate alone, replayed from a CUDA graph without
programmatic dependent launch. Inside the plan a kernel follows another under PDL, and what it does before its
``griddepcontrol.wait`` overlaps the previous kernel: the skinny GEMM and the gated tile stream their weight into
L2 there (``kernels/prefetch.py``), which no race can see; cuBLAS cannot. So where a race's winner and a close
runner-up differ in that respect, the lowering attaches both to the step (``offer``), and ``recheck`` times the
plan with each in place, A B B A, and keeps the faster.

Steps of one race key (a decoder's twenty-two identical QKV projections) are swapped together: one layer's
difference is a few microseconds in a millisecond step, under the timing's noise; the whole group's is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kfuse.runtime.executor import KernelInfo, Plan, Step

MARGIN = 0.5  # a runner-up within 50% of the race's winner is offered to the plan (the prefetch is worth that much at most)
FLIP = 0.01  # the runner-up must run the plan this much faster to replace the winner (a group of 22 swaps: ~1% and up)


def offer(step: Step, key: Any, winner: str, alternatives: dict[str, tuple[Callable[[list[torch.Tensor]], Any], KernelInfo]]) -> Step:
    """Attach to ``step`` (the race's ``winner``, as lowered) the runners-up the plan should time it against."""
    if alternatives:
        step.alternatives = {winner: (step.fn, step.info), **alternatives}  # type: ignore[attr-defined]
        step.alternative_key = (key, winner, tuple(alternatives))  # type: ignore[attr-defined]
    return step


def runners_up(times: dict[str, float], winner: str, eligible: Any, margin: float = MARGIN) -> list[str]:
    """The fastest eligible candidate within ``margin`` of the winner's time (a list of at most one name)."""
    best = times.get(winner, float("inf"))
    close = [n for n in times if n != winner and eligible(n) and times[n] <= (1.0 + margin) * best]
    return sorted(close, key=lambda n: times[n])[:1]


def recheck(plan: Plan, xs: list[torch.Tensor], timer: Callable[[Plan, list[torch.Tensor]], float] | None = None,
            flip: float = FLIP) -> list[dict[str, Any]]:  # fmt: skip
    """For each group of steps offered alternatives (one race key), time the plan with the winner and with the
    runner-up in every step of the group (A B B A, A the winner) and keep the runner-up where it runs the plan more
    than ``flip`` faster. Returns one entry per group: key, steps, both plan times, the side kept."""
    from kfuse.runtime.b2b_recheck import _install, plan_ms  # a swapped step keeps a cat member's slot writer

    timer = timer or plan_ms
    groups: dict[Any, list[Step]] = {}
    for step in plan.steps:
        key = getattr(step, "alternative_key", None)
        if key is not None:
            groups.setdefault(key, []).append(step)
    done = []
    for key, steps in groups.items():
        winner, other = key[1], key[2][0]
        times: dict[str, list[float]] = {winner: [], other: []}
        for side in (winner, other, other, winner):
            for s in steps:
                _install(s, s.alternatives[side])  # type: ignore[attr-defined]
            times[side].append(timer(plan, xs))
        ms = {side: sum(t) / 2 for side, t in times.items()}
        kept = other if ms[other] < (1.0 - flip) * ms[winner] else winner
        lost = winner if kept == other else other
        for s in steps:
            fn, info = s.alternatives[kept]  # type: ignore[attr-defined]
            note = f"plan {ms[kept]:.4f} ms vs {ms[lost]:.4f} with {lost}"
            _install(s, (fn, KernelInfo(info.name, info.template, info.ops, f"{info.config}; {note}", info.epilogue)))
        done.append({"key": str(key[0])[:120], "steps": len(steps), "winner": winner, "runner_up": other, "kept": kept,
                     "winner_plan_ms": round(ms[winner], 4), "runner_up_plan_ms": round(ms[other], 4)})  # fmt: skip
    return done
