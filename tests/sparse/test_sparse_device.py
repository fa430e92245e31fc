"""A sparse plan works on its own device, not on the machine's current one: tuning times a CPU plan
(the interpreter) by the wall clock on a GPU machine too (it asked ``torch.cuda.is_available()`` and
timed CPU solves with CUDA events), and the Triton launches of the analysis and of each solve run
with the plan's device current (Triton launches on the current device: a plan on cuda:1 with cuda:0
current launched its kernels on cuda:0)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import kfuse.sparse.analysis as A
from kfuse.kernels.codegen import interpreting
from kfuse.sparse import analyze
from kfuse.sparse.matrices import make
from kfuse.sparse.tune import tune

S = importlib.import_module("kfuse.sparse.sptrsv")  # the module: ``kfuse.sparse.sptrsv`` the attribute is the function


def _recording(seen: list[torch.device]) -> Any:
    @contextlib.contextmanager
    def on_device(d: Any) -> Iterator[None]:
        seen.append(torch.device(d))
        yield

    return on_device


@pytest.mark.skipif(not interpreting(), reason="a CPU plan runs in the Triton interpreter")
def test_a_cpu_plan_is_tuned_by_the_wall_clock_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = analyze(make("laplacian2d", 9, seed=2), device="cpu", tune=False)  # short rows: three candidates
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_events(*a: Any, **k: Any) -> None:
        raise AssertionError("a CPU plan must not be timed with CUDA events")

    monkeypatch.setattr(torch.cuda, "synchronize", no_events)
    monkeypatch.setattr(torch.cuda, "Event", no_events)
    got = tune(plan)
    assert len(got) == 3 and all(isinstance(v, float) for v in got.values()), got


def test_the_level_analysis_launches_on_the_matrix_device(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    seen: list[torch.device] = []
    monkeypatch.setattr(A, "on_device", _recording(seen))
    plan = analyze(make("laplacian2d", 9, seed=2), device=device, tune=False)
    assert seen and set(seen) == {plan.device}


def test_each_solve_launches_on_the_plan_device(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    a = make("laplacian2d", 9, seed=2)
    plan = analyze(a, device=device, tune=False)
    seen: list[torch.device] = []
    monkeypatch.setattr(S, "on_device", _recording(seen))
    b = np.random.default_rng(0).standard_normal(a.shape[0])
    x = plan.solve(torch.from_numpy(b).to(device))
    assert seen == [plan.device]
    assert np.abs(a @ x.cpu().numpy() - b).max() < 1e-10
