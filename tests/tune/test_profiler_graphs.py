"""The profiler's CUDA-graph timing path falls back to events when capture is impossible."""

from __future__ import annotations

import pytest
import torch

from kfuse.tune.profiler import Profiler


class _NoGraphRunner:
    device = torch.device("cpu")
    n_sets = 2

    def run(self, cfg: object, i: int) -> torch.Tensor:
        return torch.ones(1)


def test_graph_timing_returns_none_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("exercised for real on the GPU")
    p = Profiler()
    assert p._graph_time(object(), _NoGraphRunner(), torch.device("cpu")) is None  # type: ignore[arg-type]


@pytest.mark.gpu
def test_graph_timing_on_gpu() -> None:
    class Runner:
        device = torch.device("cuda")
        n_sets = 2
        a = torch.randn(512, 512, device="cuda", dtype=torch.float16)

        def run(self, cfg: object, i: int) -> torch.Tensor:
            return self.a @ self.a

    ms = Profiler()._graph_time(object(), Runner(), torch.device("cuda"))  # type: ignore[arg-type]
    assert ms is not None and 0 < ms < 1.0


class _HeatingRunner:
    """A GPU that clocks down under sustained load (as an H200 at its power limit): every run costs
    its config's time times a factor that grows with the runs so far, up to 1.3 after 8 runs. The
    time passes on a virtual clock (``now``), which the test hands to the profiler in place of
    ``time.perf_counter``: real sleeps of a few ms overshoot by more than the configs differ on a
    loaded CI machine (this test failed once that way)."""

    device = torch.device("cpu")
    n_sets = 2

    def __init__(self, cost: dict[str, float]) -> None:
        self.cost, self.runs, self.clock_s = cost, 0, 0.0

    def now(self) -> float:
        return self.clock_s

    def run(self, cfg: str, i: int) -> torch.Tensor:
        self.runs += 1
        self.clock_s += self.cost[cfg] * (1 + 0.3 * min(1.0, self.runs / 8)) / 1e3
        return torch.ones(1)


def test_recheck_rotates_the_order_so_heating_cannot_pick_the_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed one after the other, the config timed first looks fastest on a heating GPU; in rotated
    rounds the truly faster one wins."""
    from types import SimpleNamespace

    from kfuse.tune import profiler

    runner = _HeatingRunner({"slow-first": 4.4, "fast-second": 4.0})
    monkeypatch.setattr(profiler, "time", SimpleNamespace(perf_counter=runner.now))
    p = Profiler(warmup=0, rep=3, timeout_ms=1e3)
    sequential = {c: p._time(c, runner).time_ms for c in ("slow-first", "fast-second")}  # type: ignore[arg-type]
    assert sequential["slow-first"] < sequential["fast-second"]  # the bias the recheck removes
    runner.runs = 0
    again = p.recheck(["slow-first", "fast-second"], runner, rounds=6)  # type: ignore[list-item, arg-type]
    assert set(again) == {"slow-first", "fast-second"} and again["fast-second"] < again["slow-first"]


def test_search_rechecks_only_close_finalists_on_a_real_runner() -> None:
    from kfuse.tune.profiler import Measurement
    from kfuse.tune.search import _recheck_finalists

    ok = [Measurement("a", 1.00, "ok"), Measurement("b", 1.03, "ok"), Measurement("c", 1.20, "ok")]  # type: ignore[arg-type]
    seen: list[list[str]] = []

    class Spy(Profiler):
        def recheck(self, configs, runner, rounds=5):  # type: ignore[no-untyped-def, override]
            seen.append(list(configs))
            return {"a": 1.05, "b": 0.98}

    assert _recheck_finalists(ok, Spy(), _HeatingRunner({})) == ("b", 0.98)  # type: ignore[arg-type]
    assert seen == [["a", "b"]]  # c is 20% slower: not a finalist
    assert _recheck_finalists(ok, Spy(measure=lambda c, p: 1.0), _HeatingRunner({})) == ("a", 1.00)  # injected measure: no recheck
    assert _recheck_finalists(ok, Spy(), None) == ("a", 1.00) and len(seen) == 1
