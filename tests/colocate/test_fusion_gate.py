"""What makes a fusion trusted: measured overlap, the error-inflated prediction, robustness to one stall."""

import ast
import math

import torch

from kfuse.colocate import fuser, ptb
from kfuse.colocate import scheduler as S
from kfuse.colocate.predictor import LinearModel, OnlineTwoStage, TwoStageModel
from kfuse.colocate.selector import plan_fusion, select_version
from kfuse.colocate.sim import SimGPU, overlap_law


def _online(overlap: float, err: float = 0.0) -> OnlineTwoStage:
    xs = [0.25, 0.5, 1.0, 1.5, 2.0]
    om = OnlineTwoStage.fit(xs, [(1 + x) * (1 - overlap) if (1 + x) * (1 - overlap) > max(1, x) else max(1, x) for x in xs])
    om.errors = [err] * 4
    return om


def test_selection_trusts_the_measured_overlap_not_the_model() -> None:
    optimistic = TwoStageModel(0.2, 0.2, 1.0, 0.56)  # the H200's 25088x128x512|sgemm fit promised a 78% reduction
    assert optimistic.best_reduction > 0.7
    assert select_version({"1:2": optimistic}, {"1:2": 0.03}, min_overlap=0.05) is None
    sel = select_version({"1:2": optimistic}, {"1:2": 0.21}, min_overlap=0.05)
    assert sel is not None and sel.measured == 0.21


def test_plan_fusion_declines_where_time_sharing_does_as_well() -> None:
    be = LinearModel(0.03, 0.001)  # 1000 blocks per ms of marginal time
    assert plan_fusion(1.0, be, _online(0.0), 10_000, headroom=10.0).empty  # serial: nothing to gain
    assert plan_fusion(1.0, be, _online(-0.2), 10_000, headroom=10.0).empty
    good = plan_fusion(1.0, be, _online(0.3), 10_000, headroom=10.0)
    assert not good.empty and good.t_fused - 1.0 < 0.95 * be.b * good.blocks
    # the same pair with a 40% recent prediction error: the pessimistic extra eats the gain
    assert plan_fusion(1.0, be, _online(0.3, err=0.4), 10_000, headroom=10.0).empty
    assert plan_fusion(1.0, be, _online(0.3), 10_000, headroom=0.0).empty


def test_one_stall_does_not_wreck_the_online_model() -> None:
    om = _online(0.3)
    model = om.model
    assert not om.observe(1.0, 1.0, 500.0)  # a JIT compile timed with the launch (the H200 run: 1700x errors)
    assert om.model == model and om.outliers == 1 and om.error_bound < 0.05
    t = om.predict(1.0, 1.0)
    assert not om.observe(1.0, 1.0, t)  # the next launch is normal: the stall is dropped
    assert om.model == model
    om.observe(1.0, 1.0, 500.0)
    om.observe(1.0, 1.0, 500.0)  # twice in a row: the law changed, refit
    assert om.refits == 1 and om.predict(1.0, 1.0) > 10 * t


def test_profile_records_measured_overlap() -> None:
    lc, fus, keys = [0.5, 1.0] * 3, [False, True] * 3, ["s", "g"] * 3
    sim = SimGPU(lc, fus, {"be": (0.01, 0.001, 4000)}, fused_law={"good": overlap_law(0.3), "none": overlap_law(0.0)}, keys=keys)
    prof = S.build_profile(sim, ["be"], ["none", "good"], reps=1)
    sel = prof.chosen[("g", "be")]
    assert sel.version == "good" and math.isclose(sel.measured, prof.measured_overlap(("g", "be"), "good", sel.opportune_ratio))
    assert 0.2 < sel.measured <= 0.3 + 1e-9
    none = S.build_profile(SimGPU(lc, fus, {"be": (0.01, 0.001, 4000)}, fused_law=overlap_law(0.02), keys=keys), ["be"], ["v"], reps=1)
    assert none.chosen == {}  # 2% measured overlap is below the 5% threshold


def _not_specialised(source: str) -> dict[str, set[str]]:
    """Per @triton.jit function of a generated module: the names in its do_not_specialize list."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                for kw in getattr(d, "keywords", []):
                    if kw.arg == "do_not_specialize":
                        out[node.name] = set(ast.literal_eval(kw.value))
    return out


def test_range_bounds_are_not_specialised() -> None:
    """start/end == 1 or % 16 != 0 must not be new Triton variants: a compile would be timed mid-run
    (the interpreter ignores the decorator, so the generated sources are checked)."""
    a = ptb.gemm_kernel(*(torch.zeros(16, 16) for _ in range(3)))
    assert {"start", "end"} <= _not_specialised(ptb._ORIG.format(module="m", fn="f", params="x", params_ptb="x", call="x"))["ptb_kernel"]
    fused = _not_specialised(fuser.fused_source(a, a))
    for fn in ("fused_kernel", "tail_kernel", "tailx_kernel", "tailsm_kernel"):
        assert {"l_start", "l_end", "b_start", "b_end", "period", "r1"} <= fused[fn]
