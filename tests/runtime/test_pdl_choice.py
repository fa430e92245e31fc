"""Options.pdl = "auto": the plan is timed with programmatic dependent launch on and off (A B B A) and
PDL is turned off only where that is more than FLIP faster (kfuse.runtime.pdl_choice)."""

from __future__ import annotations

import pytest
import torch

from kfuse.compiler import Options
from kfuse.ir.graph import GraphBuilder
from kfuse.runtime.executor import Plan, lower, pdl_wanted
from kfuse.runtime.pdl_choice import FLIP, choose_pdl


def _plan(pdl: bool = True) -> Plan:
    return Plan(GraphBuilder().build([]), [], "triton", release_after=[], use_memory_plan=False, pdl=pdl)


def _timer(on_ms: float, off_ms: float, seen: list[bool]):
    def timer(plan: Plan, xs: list[torch.Tensor]) -> float:
        seen.append(plan.pdl)
        return on_ms if plan.pdl else off_ms

    return timer


def test_pdl_is_turned_off_where_the_plan_runs_faster_without_it() -> None:
    seen: list[bool] = []
    plan = _plan()
    got = choose_pdl(plan, [], timer=_timer(2.029, 1.780, seen))  # ConvNeXt-T B32, session 40
    assert seen == [True, False, False, True]  # A B B A against clock drift
    assert got == {"on_ms": 2.029, "off_ms": 1.78, "kept": False, "timed": True} and plan.pdl is False


@pytest.mark.parametrize("off_ms", [1.0, 1.0 - FLIP / 2])
def test_pdl_stays_on_unless_off_wins_by_more_than_the_flip_margin(off_ms: float) -> None:
    plan = _plan()
    got = choose_pdl(plan, [], timer=_timer(1.0, off_ms, []))
    assert got["kept"] is True and plan.pdl is True


def test_the_pdl_off_kernels_are_precompiled_with_pdl_off_and_the_plan_left_on() -> None:
    states: list[bool] = []
    plan = _plan()
    choose_pdl(plan, [], timer=_timer(1.0, 1.0, []), precompile=lambda p, xs: states.append(p.pdl))
    assert states == [False] and plan.pdl is True


def test_a_timer_failure_leaves_pdl_on() -> None:
    def broken(plan: Plan, xs: list[torch.Tensor]) -> float:
        if not plan.pdl:
            raise RuntimeError("capture failed")
        return 1.0

    plan = _plan()
    with pytest.raises(RuntimeError):
        choose_pdl(plan, [], timer=broken)
    assert plan.pdl is True


def test_a_plan_without_pdl_is_not_timed() -> None:
    seen: list[bool] = []
    plan = _plan(pdl=False)
    assert choose_pdl(plan, [], timer=_timer(1.0, 0.5, seen)) == {"kept": False, "timed": False}
    assert seen == [] and plan.pdl is False


def test_options_pdl_accepts_true_false_and_auto_only() -> None:
    g = GraphBuilder().build([])
    assert Options().pdl == "auto"
    assert lower(g, torch.device("cpu"), backend="triton", options=Options(pdl="auto")).pdl  # on until timed
    assert pdl_wanted(True) and not pdl_wanted(False)
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        lower(g, torch.device("cpu"), backend="triton", options=Options(pdl="off"))


@pytest.mark.gpu
def test_auto_times_the_compiled_plan_both_ways_and_keeps_its_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    import kfuse
    import kfuse.models as zoo

    for decision in ("KFUSE_B2B_DECIDE", "KFUSE_GATED_DECIDE"):  # the two compiles must choose the same kernels
        monkeypatch.setenv(decision, "rule")
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")

    torch.manual_seed(0)
    m, a, kw = zoo.build("bert-tiny", batch=2, seq=64, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        auto = kfuse.compile(m, a, kw)
        plain = kfuse.compile(m, a, kw, pdl=False)
        choice = auto.report["pdl_choice"]
        assert choice["timed"] and choice["on_ms"] > 0 and choice["off_ms"] > 0
        assert auto.report["pdl"] == choice["kept"]
        for w, o in zip(torch.utils._pytree.tree_leaves(plain(*a, **kw)), torch.utils._pytree.tree_leaves(auto(*a, **kw)), strict=True):
            if isinstance(w, torch.Tensor):
                assert torch.equal(w, o)


def test_the_summary_says_whether_pdl_was_kept_and_on_what_times() -> None:
    from kfuse.report import pdl_lines

    timed = {"pdl": False, "pdl_choice": {"on_ms": 2.029, "off_ms": 1.78, "kept": False, "timed": True}}
    assert pdl_lines(timed) == ["programmatic dependent launch: off (whole plan timed: 2.029 ms with it, 1.78 ms without)"]
    assert pdl_lines({"pdl": True}) == ["programmatic dependent launch: on"]
    assert pdl_lines({}) == []
