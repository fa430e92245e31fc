"""Batches measured before their slowest compiles (``parallel_compile.Quorum``), the stragglers
measured when ready (``Profiler.settle``) and folded into their problem's result (``merge_late``,
``Tuner._settle``). All on the CPU: stand-in workers, runners and profilers."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from kfuse.kernels.gemm import GemmConfig
from kfuse.runtime import parallel_compile
from kfuse.runtime.parallel_compile import CompileRequest, PrecompileReport, Quorum
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT
from kfuse.tune.profiler import Deferred, Measurement, Profiler
from kfuse.tune.search import SearchResult, merge_late
from kfuse.tune.space import GemmProblem
from kfuse.tune.tuner import Tuner

CFGS = [GemmConfig(bm, bn, 32, 8, 4, 3) for bm, bn in ((64, 64), (128, 64), (64, 128), (128, 128))]
PROBLEM = GemmProblem(512, 512, 512)


# ---- the quorum rule and compile_in_workers with it ------------------------------------------
def test_quorum_settles_after_its_fraction_and_grace() -> None:
    q = Quorum(fraction=0.6, grace=0.5, min_grace_s=0.2)
    assert not q.reached(5, 10) and q.reached(6, 10) and q.reached(1, 1)
    assert q.settled(10, 10, None, 0.0, 0.0)  # all answered
    assert not q.settled(6, 10, None, 5.0, 0.0)  # no quorum yet
    # quorum at t=2 s after the start at 0: waits max(0.2, 0.5 x 2) = 1 s more
    assert not q.settled(6, 10, 2.0, 2.9, 0.0) and q.settled(6, 10, 2.0, 3.0, 0.0)
    assert q.settled(6, 10, 0.1, 0.35, 0.0) and not q.settled(6, 10, 0.1, 0.25, 0.0)  # the minimum grace


class _SleepyWorker:
    """A stand-in compile worker: answers a request after the seconds its qualname names."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.ready.set()
        self.busy = threading.Lock()

    def alive(self) -> bool:
        return True

    def ask(self, req: CompileRequest, timeout_s: float) -> dict[str, Any]:
        s = float(req.qualname)
        if s > timeout_s:
            time.sleep(timeout_s)
            raise TimeoutError(f"compile took over {timeout_s:g} s")
        time.sleep(s)
        return {"ok": True, "hash": req.qualname, "s": s}

    def close(self) -> None:
        pass


def _requests(seconds: list[float]) -> list[CompileRequest]:
    return [CompileRequest("m", None, str(s), f"spec{i}", ("cuda", 90, 32)) for i, s in enumerate(seconds)]


@pytest.fixture
def sleepy_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel_compile, "_POOL", [_SleepyWorker() for _ in range(5)])
    monkeypatch.setattr(parallel_compile, "start_pool", lambda n=None: len(parallel_compile._POOL))


def test_a_batch_with_a_quorum_returns_before_its_straggler_which_still_completes(sleepy_pool: None) -> None:
    reqs = _requests([0.05, 0.05, 0.05, 0.05, 1.5])
    t0 = time.perf_counter()
    rep = parallel_compile.compile_in_workers(reqs, workers=5, quorum=Quorum(0.6, 0.5, 0.2))
    returned = time.perf_counter() - t0
    assert returned < 1.0 and rep.pending == [4] and rep.compiled == 4
    assert not rep.pending_answered()
    assert rep.wait_pending(10.0) and rep.pending_answered()
    assert rep.compiled == 5 and "1.5" in rep.hashes
    # without a quorum the same batch waits for it
    t0 = time.perf_counter()
    rep = parallel_compile.compile_in_workers(reqs, workers=5)
    assert time.perf_counter() - t0 >= 1.4 and rep.pending == [] and rep.compiled == 5


def test_a_pending_request_past_the_time_out_is_reported_slow_when_waited_for(sleepy_pool: None) -> None:
    reqs = _requests([0.02, 0.02, 0.02, 3.0])
    rep = parallel_compile.compile_in_workers(reqs, workers=4, kernel_timeout_s=0.6, quorum=Quorum(0.5, 0.5, 0.1))
    rep.per_call = [[0], [1], [2], [3]]
    assert rep.pending == [3]
    assert rep.wait_pending(5.0)
    assert rep.timed_out == [3] and rep.slow_calls == [3]


def test_wait_pending_gives_up_at_its_time_out(sleepy_pool: None) -> None:
    rep = parallel_compile.compile_in_workers(_requests([0.01, 0.01, 0.01, 2.0]), workers=4, quorum=Quorum(0.5, 0.5, 0.1))
    assert rep.pending == [3]
    assert not rep.wait_pending(0.2)


# ---- the profiler: deferred configs, settled later ------------------------------------------
class _Runner:
    device = torch.device("cuda")
    n_sets = 1

    def __init__(self) -> None:
        self.compiled: list[Any] = []

    def compile(self, cfg: Any) -> None:
        self.compiled.append(cfg)


def _stub_profiler(monkeypatch: pytest.MonkeyPatch, report: PrecompileReport, times: dict[Any, float]) -> Profiler:
    def fake_precompile(calls: list[Any], kernel_timeout_s: float = 0.0, wait: bool = True, quorum: Any = None) -> PrecompileReport:
        assert quorum is not None
        return report

    monkeypatch.setattr(parallel_compile, "precompile", fake_precompile)
    prof = Profiler(compile_timeout_s=30.0)
    prof.quorum = Quorum()
    monkeypatch.setattr(prof, "_one", lambda problem, cfg, runner: Measurement(cfg, times[cfg], "ok"))
    return prof


def test_configs_still_compiling_are_deferred_then_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    # calls 0..3, call i made request i; requests 2 and 3 were pending when the batch settled
    report = PrecompileReport(requests=4, compiled=2, per_call=[[0], [1], [2], [3]], pending=[2, 3], pending_calls=[2, 3])
    times = dict(zip(CFGS, (1.0, 0.9, 0.5, 2.0), strict=True))
    prof = _stub_profiler(monkeypatch, report, times)
    runner = _Runner()
    seen: list[Measurement] = []
    now = prof.profile(PROBLEM, CFGS, runner, seen.append)  # type: ignore[arg-type]
    assert [m.config for m in now] == CFGS[:2] and runner.compiled == CFGS[:2]  # the pending ones not compiled here
    assert len(prof.deferred) == 1 and prof.deferred[0].configs == CFGS[2:] and not prof.deferred[0].ready()
    report._answer(2)
    report._answer(3)
    item = prof.deferred[0]
    assert item.ready()
    late = prof.settle(item, seen.append)
    assert [m.config for m in late] == CFGS[2:] and [m.time_ms for m in late] == [0.5, 2.0]
    assert runner.compiled == CFGS and prof.deferred == [] and len(seen) == 4


def test_a_deferred_config_past_the_compile_time_out_is_recorded_and_not_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    report = PrecompileReport(requests=3, compiled=2, per_call=[[0], [1], [2]], pending=[2], pending_calls=[2])
    prof = _stub_profiler(monkeypatch, report, dict.fromkeys(CFGS, 1.0))
    runner = _Runner()
    prof.profile(PROBLEM, CFGS[:3], runner)  # type: ignore[arg-type]
    report.timed_out.append(2)
    report._answer(2)
    late = prof.settle(prof.deferred[0])
    assert [(m.config, m.status) for m in late] == [(CFGS[2], "timeout")] and "30 s" in late[0].error
    assert CFGS[2] not in runner.compiled


# ---- folding late measurements into a result, and into the tuner's choice -------------------
def test_merge_late_takes_a_faster_late_config_and_keeps_a_slower_one() -> None:
    res = SearchResult(PROBLEM, CFGS[0], 1.0, 10, [Measurement(CFGS[0], 1.0, "ok")])
    assert not merge_late(res, [Measurement(CFGS[1], 1.4, "ok"), Measurement(CFGS[2], None, "failed", "x")], Profiler(), None)
    assert res.best == CFGS[0] and res.n_measured == 3
    assert merge_late(res, [Measurement(CFGS[3], 0.7, "ok")], Profiler(), None)
    assert res.best == CFGS[3] and res.best_ms == 0.7
    empty = SearchResult(PROBLEM, None, None, 10, [])
    assert merge_late(empty, [Measurement(CFGS[1], 2.0, "ok")], Profiler(), None) and empty.best == CFGS[1]


def test_the_tuner_adopts_a_late_winner_and_records_it_as_done(tmp_path: Any) -> None:
    db = TuningDB(str(tmp_path / "t.sqlite"))
    t = Tuner("fast", db=db, hw=DEFAULT, device="cpu", progress=False)
    res = SearchResult(PROBLEM, CFGS[0], 1.0, 10, [Measurement(CFGS[0], 1.0, "ok")])
    t._done(PROBLEM, res)
    assert t.lookup(PROBLEM) == CFGS[0]

    class StubProfiler:
        measure = None

        def __init__(self) -> None:
            self.deferred = [Deferred(PROBLEM, _Runner(), [CFGS[1]], [0], PrecompileReport())]  # type: ignore[arg-type]

        def settle(self, item: Deferred, on_result: Any = None, timeout_s: Any = None) -> list[Measurement]:
            self.deferred.remove(item)
            m = Measurement(CFGS[1], 0.6, "ok")
            on_result(m)
            return [m]

        def recheck(self, configs: Any, runner: Any, rounds: int = 5) -> dict[Any, float]:
            return {c: (0.6 if c == CFGS[1] else 1.0) for c in configs}

    t.profiler = StubProfiler()  # type: ignore[assignment]
    out = {PROBLEM.signature(): CFGS[0]}
    t._settle({PROBLEM.signature(): res}, out, block=True)
    assert out[PROBLEM.signature()] == CFGS[1] and t.lookup(PROBLEM) == CFGS[1]
    assert t.stats.deferred == 1 and t.stats.late_wins == 1 and "1 won" in t.stats.line("fast")
