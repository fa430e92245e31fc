"""The plan's re-check of a race's close runner-up: steps of one race key swapped together, A B B A, the runner-up
kept only where it runs the plan more than the flip threshold faster; the runner-up offered only when eligible and
close (CPU: a timer that reads which kernels are installed)."""

from __future__ import annotations

from kfuse.runtime.executor import KernelInfo, Plan, Step
from kfuse.runtime.plan_alternatives import offer, recheck, runners_up


def _fn(tag: str):
    def run(xs):
        return tag

    run.tag = tag
    return run


def _info(name: str, config: str) -> KernelInfo:
    return KernelInfo(name, "library_gemm" if "cublas" in config else "skinny_gemm", ("matmul",), config, "")


def _plan(groups: dict[str, int]) -> Plan:
    steps = []
    for key, n in groups.items():
        for i in range(n):
            st = Step(f"{key}{i}", (), _fn(f"{key}:cublas"), _info(f"{key}{i}", "cublas"))
            steps.append(offer(st, key, "library", {"skinny n64": (_fn(f"{key}:skinny"), _info(f"{key}{i}", "skinny n64"))}))
    steps.append(Step("other", (), _fn("other"), _info("other", "cublas")))  # offered nothing: never swapped
    return Plan(graph=None, steps=steps, backend="triton")


def _timer(cost: dict[str, float], seen: list[tuple[str, ...]]):
    def time(plan: Plan, xs) -> float:
        tags = tuple(s.fn.tag for s in plan.steps)
        seen.append(tags)
        return 100.0 + sum(cost.get(t, 0.0) for t in tags)

    return time


def test_a_group_is_swapped_together_and_kept_where_the_plan_runs_faster() -> None:
    plan = _plan({"qkv": 3, "down": 2})
    seen: list[tuple[str, ...]] = []
    # in the plan the skinny QKV saves 2 a step (6 of 106: beyond the flip); the skinny down loses 1 a step
    cost = {"qkv:cublas": 2.0, "qkv:skinny": 0.0, "down:cublas": 1.0, "down:skinny": 2.0}
    done = recheck(plan, [], timer=_timer(cost, seen))
    assert [(d["key"], d["steps"], d["kept"]) for d in done] == [("qkv", 3, "skinny n64"), ("down", 2, "library")]
    assert [s.fn.tag for s in plan.steps] == ["qkv:skinny"] * 3 + ["down:cublas"] * 2 + ["other"]
    # A B B A per group, every step of the group swapped at once, the other group as the race left it
    qkv_sides = [t[:3] for t in seen[:4]]
    assert qkv_sides == [("qkv:cublas",) * 3, ("qkv:skinny",) * 3, ("qkv:skinny",) * 3, ("qkv:cublas",) * 3]
    assert all(t[3:] == ("down:cublas", "down:cublas", "other") for t in seen[:4])
    assert len(seen) == 8 and all(t[:3] == ("qkv:skinny",) * 3 for t in seen[4:])  # the kept side during the next group
    assert "plan" in plan.steps[0].info.config and "with library" in plan.steps[0].info.config
    assert done[0]["winner_plan_ms"] == 106.0 + 2.0 and done[0]["runner_up_plan_ms"] == 100.0 + 2.0


def test_a_difference_within_the_flip_keeps_the_races_winner() -> None:
    plan = _plan({"qkv": 2})
    done = recheck(plan, [], timer=_timer({"qkv:cublas": 0.4, "qkv:skinny": 0.0}, []), flip=0.01)  # 0.8 of 100.8: under 1%
    assert done[0]["kept"] == "library" and [s.fn.tag for s in plan.steps[:2]] == ["qkv:cublas"] * 2


def test_runners_up_are_the_fastest_eligible_candidate_within_the_margin() -> None:
    times = {"library": 10.0, "template": 10.5, "skinny a": 14.0, "skinny b": 12.0, "skinny c": 16.0}
    skinny = lambda n: n.startswith("skinny")  # noqa: E731
    assert runners_up(times, "library", skinny) == ["skinny b"]
    assert runners_up(times, "library", skinny, margin=0.1) == []
    assert runners_up({"library": 10.0, "skinny": float("inf")}, "library", skinny) == []  # a failed candidate never
    st = Step("s", (), _fn("x"), _info("s", "cublas"))
    assert offer(st, "k", "library", {}) is st and not hasattr(st, "alternatives")  # nothing to offer: nothing attached
