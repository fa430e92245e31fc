"""The tuner compiles every problem's first batch at once before measuring any (``Tuner.compile_ahead``):
the batch it compiles ahead is the one ``search`` measures first, a config past the compile time-out there
is recorded as a time-out and never compiled again, and nothing happens off the GPU or for one problem."""

from __future__ import annotations

import pytest

from kfuse.runtime import parallel_compile
from kfuse.runtime.parallel_compile import PrecompileReport
from kfuse.tune import tuner as tuner_mod
from kfuse.tune.cost_model import CostModel
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT, lookup
from kfuse.tune.profiler import Measurement, Profiler
from kfuse.tune.search import Budget, first_batch, search
from kfuse.tune.space import ConvProblem, GemmProblem, estimate_ms
from kfuse.tune.tuner import Tuner

PROBLEMS = [GemmProblem(4096, 3072, 768), GemmProblem(1024, 768, 3072, n_extras=1), ConvProblem(8, 64, 28, 28, 128, 3, 3, (1, 1), (1, 1))]


class Recording(Profiler):
    """Measures with the analytic estimate and keeps each batch it was asked to measure."""

    def __init__(self) -> None:
        super().__init__(measure=lambda cfg, problem: estimate_ms(cfg, problem, DEFAULT), check=False)
        self.batches: list[list] = []

    def profile(self, problem, configs, runner=None, on_result=None):  # noqa: ANN001, ANN201
        self.batches.append(list(configs))
        return super().profile(problem, configs, runner, on_result)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.signature()[:40])
def test_first_batch_is_what_search_measures_first(problem) -> None:  # noqa: ANN001
    budget = Budget.for_mode("fast")
    neighbour = GemmProblem(4096, 2304, 768) if isinstance(problem, GemmProblem) else ConvProblem(8, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1))
    for neighbours in ([], [(neighbour, first_batch(neighbour, DEFAULT, CostModel(DEFAULT), budget)[0])]):
        ahead = first_batch(problem, DEFAULT, CostModel(DEFAULT), budget, neighbours)
        prof = Recording()
        search(problem, DEFAULT, prof, None, CostModel(DEFAULT), budget, neighbours)
        assert ahead and prof.batches[0] == ahead
    # a resumed problem: what was measured before is neither compiled ahead nor measured again
    earlier = [Measurement(ahead[0], 1.0, "ok")]
    again = first_batch(problem, DEFAULT, CostModel(DEFAULT), budget, already=earlier)
    assert ahead[0] not in again


class FakeRunner:
    compiled: list = []

    def __init__(self, problem, device, epi=None) -> None:  # noqa: ANN001
        self.problem = problem

    def compile(self, cfg) -> None:  # noqa: ANN001
        FakeRunner.compiled.append((self.problem.signature(), cfg))


def test_compile_ahead_compiles_every_first_batch_in_one_call_and_remembers_the_slow(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    FakeRunner.compiled = []
    batches: list[int] = []

    def fake_precompile(calls, workers=None, kernel_timeout_s=600.0, wait=True):  # noqa: ANN001, ANN202
        calls = list(calls)
        batches.append(len(calls))
        for c in calls:
            c()
        return PrecompileReport(requests=len(calls), compiled=len(calls) - 1, timed_out=[0], slow_calls=[1])

    monkeypatch.setattr(tuner_mod, "make_runner", FakeRunner)
    monkeypatch.setattr(parallel_compile, "enabled", lambda: True)
    monkeypatch.setattr(parallel_compile, "precompile", fake_precompile)
    t = Tuner("fast", db=TuningDB(tmp_path / "db.sqlite"), hw=lookup("NVIDIA H200"), device="cuda", progress=False)
    todo = [(p, None) for p in PROBLEMS]
    t.compile_ahead(todo)
    assert batches == [len(FakeRunner.compiled)]  # one call for all problems
    want = [(p.signature(), c) for p in PROBLEMS for c in first_batch(p, t.hw, CostModel(t.hw), t.budget)]
    assert FakeRunner.compiled == want
    slow_sig, slow_cfg = want[1]
    assert t.profiler.slow_configs == {slow_sig: {slow_cfg}}
    assert t.stats.compiled_ahead == len(want) and "compiled ahead" in t.stats.line("fast")

    # the profiler then records that config as a time-out without compiling or timing it
    measured = []
    prof = Profiler(measure=lambda cfg, problem: measured.append(cfg) or 1.0, check=False)
    prof.slow_configs = t.profiler.slow_configs
    slow_problem = next(p for p in PROBLEMS if p.signature() == slow_sig)
    res = prof.profile(slow_problem, [slow_cfg, want[0][1]])
    assert [m.status for m in res] == ["timeout", "ok"] and measured == [want[0][1]]

    # one problem, or no GPU: nothing compiled ahead
    FakeRunner.compiled, batches[:] = [], []
    t.compile_ahead(todo[:1])
    cpu = Tuner("fast", db=TuningDB(tmp_path / "db2.sqlite"), hw=lookup("NVIDIA H200"), device="cpu", progress=False)
    cpu.compile_ahead(todo)
    assert batches == [] and FakeRunner.compiled == []
