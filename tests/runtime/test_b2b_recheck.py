"""The plan-level re-check of close b2b decisions: the faster side *in the plan* is kept, far
decisions are left alone, and the step, its kernel info and its report entry say what happened."""

from __future__ import annotations

import pytest
import torch

from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_b2b import b2b_report, fuse_b2b
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.report import b2b_lines
from kfuse.runtime.b2b_recheck import recheck_b2b
from kfuse.runtime.executor import execute, lower


@pytest.fixture(autouse=True)
def _fresh_decisions() -> None:
    from kfuse.kernels.b2b import lower as k
    from kfuse.runtime import b2b_recheck

    k._DECIDED.clear()
    b2b_recheck._VERDICTS.clear()


def _plan(monkeypatch: pytest.MonkeyPatch, fused_ms: float, unfused_ms: float, device: str):  # noqa: ANN202
    """A two-layer MLP lowered for ``device`` with the decision measured (its timings faked:
    ``fused_ms`` for every fused candidate, ``unfused_ms`` for the pair)."""
    from kfuse.kernels.b2b import lower as k

    b = GraphBuilder("mlp")
    x = b.add_input("x", TensorType((9, 24), torch.float32))
    h = b.op("relu", [b.op("add", [b.op("matmul", [x, b.add_constant(torch.randn(24, 32) / 5)]), b.add_constant(torch.randn(32))])])
    y = b.op("add", [b.op("matmul", [h, b.add_constant(torch.randn(32, 16) / 6)]), b.add_constant(torch.randn(16))])
    g = fuse_b2b(fuse_epilogues(b.build([y])))
    calls = {"n": 0}

    def fake_time(fn, reps: int = 15) -> float:  # noqa: ANN001 - the pair is timed first
        calls["n"] += 1
        return unfused_ms if calls["n"] == 1 else fused_ms

    monkeypatch.setattr(k, "graph_time_ms", fake_time)
    monkeypatch.setattr(k, "candidate_configs", lambda m, w, k0=None, image=None, elem=2, sms=132: [k.default_config(m, w, "register")])
    # the measured decision runs for backend "triton"; on the CPU the kernels run in the interpreter
    plan = lower(g, torch.device(device), "triton")
    if device == "cpu":
        plan.backend = "triton-interpreter"
    return g, plan


@pytest.mark.parametrize("in_plan_faster", ["fused", "unfused"])
def test_close_decision_keeps_the_side_faster_in_the_plan(monkeypatch: pytest.MonkeyPatch, in_plan_faster: str, device: str) -> None:
    g, plan = _plan(monkeypatch, fused_ms=0.97, unfused_ms=1.0, device=device)  # fused chosen, 3% apart
    step = plan.steps[0]
    assert step.b2b["fused"] and step.info.template == "b2b_chain"
    order: list[str] = []

    def timer(p, xs) -> float:  # noqa: ANN001
        side = "fused" if p.steps[0].info.template == "b2b_chain" else "unfused"
        order.append(side)
        return 1.0 if side == in_plan_faster else 1.2

    xs = [torch.randn(9, 24, device=device)]
    done = recheck_b2b(plan, xs, timer=timer)
    assert order == ["fused", "unfused", "unfused", "fused"]  # A B B A, A the decision's side
    assert done == [{"node": step.output, "fused_plan_ms": 1.0 if in_plan_faster == "fused" else 1.2,
                     "unfused_plan_ms": 1.0 if in_plan_faster == "unfused" else 1.2,
                     "kept": in_plan_faster, "changed": in_plan_faster == "unfused"}]  # fmt: skip
    assert step.b2b["fused"] == (in_plan_faster == "fused")
    assert step.info.template == ("b2b_chain" if in_plan_faster == "fused" else "b2b_chain(unfused)")
    assert step.b2b["residence"] == ("register" if in_plan_faster == "fused" else "none")
    torch.testing.assert_close(execute(plan, xs)[0], reference_run(g, xs)[0], rtol=1e-4, atol=1e-4)
    entry = b2b_report(plan)["fused"][0]
    assert entry["plan_recheck"]["kept"] == in_plan_faster
    assert "in the whole plan" in b2b_lines(b2b_report(plan))[0]
    if in_plan_faster == "unfused":
        assert "measured in the plan" in entry["decided_by"]


@pytest.mark.parametrize("unfused_in_plan,kept", [(0.99, "fused"), (0.97, "unfused")])
def test_the_plan_overturns_a_decision_only_beyond_the_noise(
    monkeypatch: pytest.MonkeyPatch, unfused_in_plan: float, kept: str, device: str
) -> None:
    """The other side must run more than FLIP (2%) faster in the plan: a 1% lead is within what two
    timings a side can tell apart, and the decision stands."""
    _, plan = _plan(monkeypatch, fused_ms=0.97, unfused_ms=1.0, device=device)  # fused chosen

    def timer(p, xs) -> float:  # noqa: ANN001
        return 1.0 if p.steps[0].info.template == "b2b_chain" else unfused_in_plan

    done = recheck_b2b(plan, [torch.randn(9, 24, device=device)], timer=timer)
    assert done[0]["kept"] == kept and done[0]["changed"] == (kept == "unfused")
    assert plan.steps[0].b2b["fused"] == (kept == "fused")


def test_far_decision_is_not_rechecked(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _, plan = _plan(monkeypatch, fused_ms=0.5, unfused_ms=1.0, device=device)
    timed: list[int] = []
    assert recheck_b2b(plan, [torch.randn(9, 24, device=device)], timer=lambda p, xs: timed.append(1) or 1.0) == []
    assert not timed and "plan_recheck" not in plan.steps[0].b2b


def test_identical_chain_keeps_both_sides(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A chain that reuses an earlier chain's decision can still be re-checked: both sides exist."""
    from kfuse.kernels.b2b import lower as k

    g, plan = _plan(monkeypatch, fused_ms=1.02, unfused_ms=1.0, device=device)  # unfused kept, 2% apart
    step2 = k.lower_b2b_chain(g.nodes[0], g, "triton")
    assert "identical chain" in step2.b2b["decided_by"] and set(step2.b2b_sides) == {"fused", "unfused"}
    assert "_sides" not in step2.b2b and "_sides" not in plan.steps[0].b2b


def test_an_identical_chain_reuses_the_verdict(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """A second plan with the same chain (a second compile, or a repeated block) takes the first
    re-check's verdict without timing the plan again."""
    g, plan = _plan(monkeypatch, fused_ms=0.97, unfused_ms=1.0, device=device)
    timed: list[int] = []

    def timer(p, xs) -> float:  # noqa: ANN001
        timed.append(1)
        return 1.0 if p.steps[0].info.template != "b2b_chain" else 1.2  # the pair is faster in the plan

    xs = [torch.randn(9, 24, device=device)]
    assert recheck_b2b(plan, xs, timer=timer)[0]["kept"] == "unfused" and len(timed) == 4
    plan2 = lower(g, torch.device(device), "triton")
    if device == "cpu":
        plan2.backend = "triton-interpreter"
    again = recheck_b2b(plan2, xs, timer=timer)
    assert len(timed) == 4 and again[0]["kept"] == "unfused" and again[0]["reused"]
    assert plan2.steps[0].info.template == "b2b_chain(unfused)" and not plan2.steps[0].b2b["fused"]
    torch.testing.assert_close(execute(plan2, xs)[0], reference_run(g, xs)[0], rtol=1e-4, atol=1e-4)
