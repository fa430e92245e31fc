"""``kfuse.compile(..., sass=True)``: which plan steps the SASS tuner gets, with what arguments, and the report.
The search itself needs the GPU (tests/sass covers the tuner's parts on sm_90 cubins); here it is replaced."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from kfuse.runtime import sass_plan
from kfuse.runtime.sass_plan import Launch, bind_launch, unsupported_reason
from kfuse.sass.examples import as_jit_function


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr = 128):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * alpha, mask=offs < n)


def test_bind_launch_orders_every_parameter_and_drops_launch_options() -> None:
    fn = as_jit_function(_scale_kernel)
    x, y = torch.randn(1000), torch.empty(1000)
    args, grid = bind_launch(fn, (x, y), {"n": 1000, "alpha": 2.0, "num_warps": 4}, lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),))
    assert args[:2] == [x, y] and args[2:] == [1000, 2.0, 128]  # the constexpr default applied
    assert grid == (8, 1, 1)
    args, grid = bind_launch(fn, (x, y, 7, 0.5), {"BLOCK": 64}, (3, 2))
    assert args[2:] == [7, 0.5, 64] and grid == (3, 2, 1)


def test_bind_launch_names_a_missing_argument() -> None:
    with pytest.raises(TypeError, match="alpha"):
        bind_launch(as_jit_function(_scale_kernel), (torch.randn(4), torch.empty(4), 4), {}, (1,))


def test_unsupported_steps_say_why() -> None:
    ok = Launch(None, SimpleNamespace(name="k"), [torch.randn(4), 3], (1, 1, 1))
    assert unsupported_reason([]).startswith("no Triton launch")
    assert unsupported_reason([ok, ok]).startswith("2 Triton launches")
    tma = type("TensorDescriptor", (), {})()
    assert "TMA descriptor" in unsupported_reason([Launch(None, SimpleNamespace(name="k"), [tma, 3], (1, 1, 1))])
    assert unsupported_reason([ok]) is None


def _fake_plan(n_steps: int) -> Any:
    steps = [SimpleNamespace(output=f"s{i}", inputs=["x"] if i == 0 else [f"s{i - 1}"], fn=lambda xs: xs[0] + 1.0) for i in range(n_steps)]
    graph = SimpleNamespace(inputs=[("x", None)])
    return SimpleNamespace(steps=steps, constants={}, graph=graph)


def test_tune_plan_takes_the_hottest_tunable_steps_and_reports_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _fake_plan(4)
    times = {0: 0.5, 1: 3.0, 2: 2.0, 3: 1.0}  # hottest first: s1 (library), s2 (two launches), s3, s0
    kinds = {"s1": 0, "s2": 2, "s3": 1, "s0": 1}
    current: dict[str, str] = {}

    def profile(plan: Any, xs: Any) -> list[dict[str, Any]]:
        return [{"time_ms": times[i]} for i in range(len(plan.steps))]

    for st in plan.steps:  # remember which step runs, so the fake capture knows what it launched
        st.fn = (lambda name: lambda xs: (current.__setitem__("step", name), xs[0] + 1.0)[1])(st.output)

    @contextmanager
    def capture() -> Any:
        launches: list[Launch] = []
        yield launches
        k = kinds[current["step"]]
        launches += [Launch(None, SimpleNamespace(name=f"k_{current['step']}"), [torch.randn(2), 1], (4, 1, 1))] * k

    calls = []

    def optimize(kernel: Any, args: Any, grid: Any, **kw: Any) -> Any:
        calls.append((kernel.name, grid, kw["samples"], kw["strategy"].iterations))
        ok = kernel.name == "k_s3"
        return SimpleNamespace(accepted=ok, reason="verified on 50 random input sets" if ok else "no gain", triton_ms=1.0,
                               kfuse_ms=0.9 if ok else 1.0, verified_samples=50 if ok else 0, moves_applied=3 if ok else 0,
                               search_s=1.23, from_cache=False)  # fmt: skip

    monkeypatch.setattr(sass_plan, "capture_launches", capture)
    rep = sass_plan.tune_plan(plan, [torch.zeros(2)], kernels=2, samples=50, iterations=7, profile=profile, optimize=optimize)
    assert calls == [("k_s3", (4, 1, 1), 50, 7), ("k_s0", (4, 1, 1), 50, 7)]
    assert [k["kernel"] for k in rep["kernels"]] == ["k_s3", "k_s0"]
    assert rep["applied"] is True and rep["kernels"][0]["verified_samples"] == 50
    assert [(s["step"], s["reason"].split(" ")[0]) for s in rep["skipped"]] == [("s1", "no"), ("s2", "2")]


def test_a_tuner_failure_is_reported_and_the_next_kernel_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _fake_plan(2)

    @contextmanager
    def capture() -> Any:
        yield [Launch(None, SimpleNamespace(name="k"), [torch.randn(2)], (1, 1, 1))]

    def optimize(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("worker died")

    monkeypatch.setattr(sass_plan, "capture_launches", capture)
    rep = sass_plan.tune_plan(plan, [torch.zeros(2)], profile=lambda p, xs: [{"time_ms": 1.0}, {"time_ms": 2.0}], optimize=optimize)
    assert rep["applied"] is False and rep["kernels"] == []
    assert all(s["reason"].startswith("tuner failed: RuntimeError") for s in rep["skipped"])


def test_capture_launches_records_a_launch_and_restores_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.jit import JITFunction

    compiled = SimpleNamespace(name="_scale_kernel")
    fake_run = lambda self, *a, grid, warmup, **kw: compiled  # noqa: E731 - Triton's launcher, without a GPU
    monkeypatch.setattr(JITFunction, "run", fake_run)
    fn = as_jit_function(_scale_kernel)
    x, y = torch.randn(10), torch.empty(10)
    with pytest.raises(ValueError), sass_plan.capture_launches() as launches:
        fn[(5,)](x, y, 10, 2.0, num_warps=2)
        raise ValueError("the step failed")
    assert JITFunction.run is fake_run  # restored, even after an error
    assert len(launches) == 1 and launches[0].kernel is compiled and launches[0].name == "_scale_kernel"
    assert launches[0].grid == (5, 1, 1) and launches[0].args[2:] == [10, 2.0, 128]


def test_the_real_profiler_ranks_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``profile_plan`` itself (not a fake): every step gets its measured time, and the order follows it.
    Session 10's H200 run read a key the profiler does not write and ranked every step at 0 ms."""
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.runtime.executor import lower

    b = GraphBuilder("rank")
    x = b.add_input("x", TensorType((64, 48), torch.float32))
    y = b.op("matmul", [x, b.add_constant(torch.randn(48, 40))])
    z = b.op("softmax", [b.op("relu", [y])], {"dim": 1})
    plan = lower(b.build([z]), torch.device("cpu"), "triton-interpreter")
    seen: list[str] = []

    @contextmanager
    def capture() -> Any:
        yield []  # no Triton launch recorded: every step is skipped with its time

    monkeypatch.setattr(sass_plan, "capture_launches", capture)
    rep = sass_plan.tune_plan(plan, [torch.randn(64, 48)], kernels=1, optimize=lambda *a, **k: seen.append("called"))
    ms = [s["ms"] for s in rep["skipped"]]
    assert len(ms) == len(plan.steps) and all(t > 0 for t in ms) and ms == sorted(ms, reverse=True)
    assert seen == [] and rep["applied"] is False
