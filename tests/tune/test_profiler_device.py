"""The tuner measures on its own GPU, not on whichever is current: its search runs with the tuned
device current (Triton launches, CUDA events and graphs go to the current device), and the
profiler's CUDA-graph timing captures on a stream of the runner's device (``torch.cuda.graph``'s
default capture stream is one per process, made on the device current at the first capture, and
entering it makes that device current)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kfuse.tune.tuner as T
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT
from kfuse.tune.profiler import Profiler
from kfuse.tune.space import GemmProblem


def test_graph_timing_captures_on_a_stream_of_the_runners_device(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    captured_on: list[Any] = []

    class Stream:
        def __init__(self, device: Any = None) -> None:
            self.device = device
            made.append(self)

    class Graph:
        def replay(self) -> None:
            pass

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def elapsed_time(self, other: Any) -> float:
            return 0.4

    @contextlib.contextmanager
    def graph(g: Any, pool: Any = None, stream: Any = None) -> Iterator[None]:
        captured_on.append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    class Runner:
        def run(self, cfg: Any, i: int) -> None:
            pass

    dev = torch.device("cuda", 1)
    ms = Profiler(flush_l2=False)._graph_time(None, Runner(), dev)  # type: ignore[arg-type]
    assert ms == pytest.approx(0.4 / Profiler.GRAPH_LAUNCHES)
    assert len(captured_on) == 1 and captured_on[0] in made and captured_on[0].device == dev


class _Stop(Exception):
    pass


def test_the_search_runs_with_the_tuned_device_current(monkeypatch: pytest.MonkeyPatch) -> None:
    current: list[Any] = [None]
    seen: list[Any] = []

    @contextlib.contextmanager
    def fake_on_device(d: Any) -> Iterator[None]:
        before, current[0] = current[0], torch.device(d)
        try:
            yield
        finally:
            current[0] = before

    def fake_search(*a: Any, **k: Any) -> Any:
        seen.append(current[0])
        raise _Stop

    monkeypatch.setattr(T, "on_device", fake_on_device)
    monkeypatch.setattr(T, "search", fake_search)
    monkeypatch.setattr(T, "make_runner", lambda problem, device, epi=None: object())  # no GPU here to allocate on
    tuner = T.Tuner("fast", db=TuningDB(":memory:"), hw=DEFAULT, device="cuda:1", progress=False)
    with pytest.raises(_Stop):
        tuner.tune(GemmProblem(64, 64, 64))
    assert seen == [torch.device("cuda", 1)]


def test_a_config_whose_compile_times_out_on_a_worker_is_recorded_and_not_compiled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Profiler._compile_all`` on a GPU runner: worker compiles (parallel_compile) report config
    1 past ``compile_timeout_s``; it is a "timeout" measurement and the runner never compiles it."""
    from kfuse.kernels.gemm import GemmConfig
    from kfuse.runtime import parallel_compile
    from kfuse.runtime.parallel_compile import PrecompileReport

    cfgs = [GemmConfig(64, 64, 32, 8, 4, 3), GemmConfig(128, 64, 32, 8, 4, 3), GemmConfig(64, 128, 32, 8, 4, 3)]
    compiled: list[Any] = []

    class Runner:
        device = torch.device("cuda")

        def compile(self, cfg: Any) -> None:
            compiled.append(cfg)

    seen: dict[str, Any] = {}

    def fake_precompile(calls: list[Any], kernel_timeout_s: float = 0.0, wait: bool = True) -> PrecompileReport:
        seen["calls"], seen["timeout"] = len(calls), kernel_timeout_s
        return PrecompileReport(requests=3, compiled=2, timed_out=[1], slow_calls=[1])

    monkeypatch.setattr(parallel_compile, "precompile", fake_precompile)
    prof = Profiler(compile_timeout_s=45.0)
    failed = prof._compile_all(cfgs, Runner())
    assert seen == {"calls": 3, "timeout": 45.0}
    assert list(failed) == [cfgs[1]] and failed[cfgs[1]].status == "timeout" and "45 s" in failed[cfgs[1]].error
    assert compiled == [cfgs[0], cfgs[2]] and prof.precompile is not None
