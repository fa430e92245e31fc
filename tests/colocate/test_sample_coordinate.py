"""The profile's load ratio is the coordinate the run plans in.

BE blocks run in waves of a persistent grid, so the measured solo time of a slice is a staircase in its block
count: on the H200, 1 and 151 lbm blocks both took one 16.8 us wave (x = 1.0 against a 20 us GEMM). Until
session 13 the profile recorded that measured x, while the run turned x = 1.0 into blocks through the BE
kernel's linear fit, 488 blocks, which the same profile had measured at 2.7 T_lc (planned: 1.16). Each key
was refused after its first few launches. This GPU has the same shape: BE waves of 528 blocks, and a fused
launch that stays at ~T_lc while the BE blocks fit the slots the LC kernel leaves free, then grows by a wave.
"""

import pytest

from kfuse.colocate import scheduler as S
from kfuse.colocate.sim import SimGPU

WAVE, FREE, T_WAVE, T_LC = 528, 300, 0.0168, 0.020


class WavedGPU(SimGPU):
    """One fusible GEMM (``T_LC``) and one segment; BE ``lbm`` in waves of ``WAVE`` blocks. A fused launch runs the
    first ``FREE`` BE blocks beside the GEMM for 3% more time; every further wave (of what is left) adds ``T_WAVE``."""

    def __init__(self, free: int = FREE) -> None:
        super().__init__([T_LC, 0.05], [True, False], {"lbm": (0.0056, T_WAVE / WAVE, 8192, WAVE)}, keys=["g", "seg"])
        self.free = free

    def run_fused(self, i: int, be: str, start: int, end: int, version: object) -> float:
        self.launches.append(("fused", (i, be, start, end, version)))
        n = end - start
        return T_LC * 1.03 + T_WAVE * -(-max(0, n - self.free) // WAVE)


def test_every_sample_is_what_its_planned_block_count_measures() -> None:
    gpu = WavedGPU()
    prof = S.build_profile(gpu, ["lbm"], ["tail"], reps=1)
    be = prof.be["lbm"]
    t_lc = prof.lc_ms[0]
    for x, y in prof.samples[("g", "lbm")]["tail"]:
        n = int(be.blocks_for(x * t_lc) + 1e-6)  # the run's split of a slice aimed at x
        assert gpu.run_fused(0, "lbm", 0, n, "tail") / t_lc == pytest.approx(y, rel=1e-6), (x, y, n)


def test_the_run_measures_what_it_planned_on_waved_blocks() -> None:
    gpu = WavedGPU()
    prof = S.build_profile(gpu, ["lbm"], ["tail"], reps=1)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    extra = S.extra_budget(prof, qos, rate)
    arrivals = S.poisson_arrivals(rate, 60, 0)
    ts = S.run_policy(gpu, prof, "timeshare", arrivals, ["lbm"], qos, extra_per_query_ms=extra)
    prof.price_aims("lbm", extra)
    res = S.run_policy(gpu, prof, "aker", arrivals, ["lbm"], qos, extra_per_query_ms=extra)
    fused = res.fused_by_key["g|lbm|tail"]
    launches, _, predicted, measured = fused[0], fused[1], fused[2], fused[3]
    assert launches >= 50  # one fused launch a query, not a few before a refit refuses the key
    assert measured / launches == pytest.approx(predicted / launches, rel=0.05)
    # this GPU's 0.28 ms BE kernels are long against its 0.35 ms QoS: time sharing misses it too, more often
    assert res.refits <= 2 and res.violations <= ts.violations
    assert res.fused_gain_ms > 0 and res.be_throughput > 1.05 * ts.be_throughput


def test_a_calibrated_profile_cuts_the_blocks_its_samples_measured() -> None:
    """The run's solo calibration scales every LC time; a slice aimed at a sample must still cut that sample's blocks
    (session 13 scaled the LC times alone, x1.29, and cut 1.29x the blocks)."""
    gpu = WavedGPU()
    prof = S.build_profile(gpu, ["lbm"], ["tail"], reps=1)
    be = prof.be["lbm"]
    before = [(int(be.blocks_for(x * prof.lc_ms[0]) + 1e-6), y) for x, y in prof.samples[("g", "lbm")]["tail"]]
    prof.rescale_lc(1.29)
    assert prof.lc_ms[0] == pytest.approx(1.29 * T_LC)
    after = [(int(be.blocks_for(x * prof.lc_ms[0]) + 1e-6), y) for x, y in prof.samples[("g", "lbm")]["tail"]]
    assert after == before
    model = prof.fused[("g", "lbm")]["tail"].model
    top = max(x for x, _ in prof.samples[("g", "lbm")]["tail"])
    assert top / 1.1 < max(model.xs) <= top + 1e-9  # the planning model is refitted on the moved samples
    sel = prof.chosen[("g", "lbm")]
    assert sel.opportune_ratio in model.xs


def test_the_profile_samples_inside_the_first_wave_step() -> None:
    """The fit ratios land on either side of this GPU's step at 420 free slots (a flat slice below 300 blocks, the
    next one a wave more); two more samples between them find the flat part closer to the step, and the aim moves there."""
    gpu = WavedGPU(free=420)
    prof = S.build_profile(gpu, ["lbm"], ["tail"], reps=1, knee_samples=2)  # opt-in (colocate_bench --knee-samples) until measured
    be, t_lc = prof.be["lbm"], prof.lc_ms[0]
    pts = [(int(be.blocks_for(x * t_lc) + 1e-6), y) for x, y in prof.samples[("g", "lbm")]["tail"]]
    planned, knee = pts[: len(S.FIT_RATIOS) + len(S.HELDOUT_RATIOS)], pts[len(S.FIT_RATIOS) + len(S.HELDOUT_RATIOS) :]
    flat = max(n for n, y in planned if y < 1.05)
    steep = min(n for n, y in planned if y > 1.05)
    assert flat < 300 < 420 < steep, pts
    assert len(knee) == 2 and all(flat < n < steep for n, _ in knee), pts
    assert all(y == pytest.approx(1.03) for n, y in knee if n <= 420), pts
    prof.price_aims("lbm", 1.0)  # an allowance that does not bind: each slice at its largest saving
    aim_blocks = int(be.blocks_for(prof.chosen[("g", "lbm")].opportune_ratio * t_lc) + 1e-6)
    assert aim_blocks == max(n for n, y in knee if y < 1.05) > flat
    assert S.knee_blocks([0.3, 0.5, 0.52], [1.0, 1.01, 1.04], be, t_lc) == []  # a 3% rise between close samples is noise


def test_cli_passes_knee_samples_to_the_experiment(tmp_path, monkeypatch):
    """``kfuse colocate run --knee-samples 2`` reaches ``run_experiment`` and the recorded command."""
    import json

    from typer.testing import CliRunner

    from kfuse.cli import app
    from kfuse.colocate import experiment

    seen = {}
    real = experiment.run_experiment

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "run_experiment", spy)
    args = ["colocate", "run", "--lc", "mlp-tiny", "--be", "histogram", "--backend", "sim", "--seconds", "0.05", "--knee-samples", "2",
            "--out", str(tmp_path)]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert seen["knee_samples"] == 2
    recs = json.loads((tmp_path / "colocate.json").read_text())
    assert recs and all(rec["command"].endswith("--knee-samples 2") for rec in recs)
    bad = CliRunner().invoke(app, [*args[:-3], "-1", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "knee-samples" in bad.output
