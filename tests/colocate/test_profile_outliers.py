"""The profile's timing of one sample (``build_profile``'s ``med``): with two repeats, one that holds a one-off (a
compile its untimed first call did not cover, a stall) must not set the sample. Session 57's ws run kept samples at
4-43,000x the GEMM's time (Triton compiling a new specialisation of the slice's block range inside a timed launch),
which made the scheduler read small fused slices as ruinous."""

from __future__ import annotations

from typing import Any

from kfuse.colocate import scheduler as S
from kfuse.colocate.sim import SimGPU


class OnceSlow(SimGPU):
    """Every fourth fused launch (a new specialisation, say) takes 1,000x its time."""

    def __init__(self) -> None:
        super().__init__(
            [0.02, 0.01], [True, False], {"histogram": (0.002, 0.0001, 4000)}, fused_law=lambda t_lc, t_be, v: t_lc + 0.3 * t_be
        )
        self.fused_calls = 0

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        self.fused_calls += 1
        t = super().run_fused(i, be, start, end, version)
        return 1000.0 * t if self.fused_calls % 4 == 2 else t


def test_a_one_off_in_two_repeats_does_not_set_a_profile_sample() -> None:
    sim = OnceSlow()
    prof = S.build_profile(sim, ["histogram"], [(1, 1)], reps=2)
    ys = [y for pts in prof.samples.values() for vs in pts.values() for _, y in vs]
    assert ys and max(ys) < 5.0  # y = T_fused / T_lc: 1 + 0.3 x at most ~2.2 here; a one-off would read ~1,000
    assert sim.fused_calls > 3 * len(ys)  # a third repeat was taken where two disagreed


def test_two_agreeing_repeats_take_no_third() -> None:
    sim = SimGPU([0.02, 0.01], [True, False], {"histogram": (0.002, 0.0001, 4000)}, fused_law=lambda t_lc, t_be, v: t_lc + 0.3 * t_be)
    calls = []
    orig = sim.run_fused

    def counted(*a: Any) -> float:
        calls.append(a)
        return orig(*a)

    sim.run_fused = counted  # type: ignore[method-assign]
    prof = S.build_profile(sim, ["histogram"], [(1, 1)], reps=2)
    n = sum(len(vs) for pts in prof.samples.values() for vs in pts.values())
    assert len(calls) == 3 * n  # the untimed first call and two repeats a sample
