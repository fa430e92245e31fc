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


class Stalled(SimGPU):
    """The machine stalls for the first ``stalled`` fused launches: every repeat of the samples taken then reads 100x
    (session 58: one key's samples all read 22-188x the GEMM), so a third repeat cannot tell."""

    def __init__(self, stalled: int) -> None:
        super().__init__(
            [0.02, 0.01, 0.02], [True, False, True], {"histogram": (0.002, 0.0001, 4000)},
            fused_law=lambda t_lc, t_be, v: t_lc + 0.3 * t_be, keys=["g", "s", "h"],
        )  # fmt: skip
        self.stalled, self.fused_calls = stalled, 0

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        self.fused_calls += 1
        t = super().run_fused(i, be, start, end, version)
        return 100.0 * t if self.fused_calls <= self.stalled else t


def test_samples_a_stall_covered_are_taken_again_after_the_other_keys() -> None:
    sim = Stalled(stalled=12)  # the untimed call and two repeats of the first four samples of key "g"
    logs: list[str] = []
    prof = S.build_profile(sim, ["histogram"], [(1, 1)], reps=2, log=logs.append)
    ys = [y for pts in prof.samples.values() for vs in pts.values() for x, y in vs]
    assert ys and max(ys) < S.implausible(0.0)  # 1 + 0.3 x at most here; without the retake four samples read ~100
    assert any("4 fused samples" in line and "taken again" in line for line in logs)
    assert prof.heldout["fused_two_stage"]["mean"] < 0.1  # the held-out error is the curve's, not the stall's
    assert all(m.model is not None for ms in prof.fused.values() for m in ms.values())


def test_a_steep_real_curve_is_not_taken_again() -> None:
    """Stencil7 in a worker partition runs at y ~ 1 + 3 x: inside the bound, so its samples are kept as measured."""
    sim = SimGPU([0.02, 0.01], [True, False], {"stencil7": (0.002, 0.0001, 4000)}, fused_law=lambda t_lc, t_be, v: t_lc + 3.0 * t_be)
    logs: list[str] = []
    prof = S.build_profile(sim, ["stencil7"], [(1, 1)], reps=2, log=logs.append)
    xs_ys = [p for pts in prof.samples.values() for vs in pts.values() for p in vs]
    assert max(y for _, y in xs_ys) > 5.0 and not any("taken again" in line for line in logs)
