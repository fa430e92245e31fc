"""The b2b decision compiles its candidates by a first call each in worker threads; a thread's current
CUDA device is its own (device 0), not the lowering's, and Triton launches on the current device, so
each first call makes the decision inputs' device current (a chain of a model on cuda:1 launched its
candidates on cuda:0)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kfuse.kernels.b2b.lower as L


def test_first_calls_run_on_the_inputs_device_in_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    local = threading.local()

    @contextlib.contextmanager
    def fake_on_device(d: Any) -> Iterator[None]:
        before = getattr(local, "device", None)
        local.device = None if d is None else torch.device(d)
        try:
            yield
        finally:
            local.device = before

    monkeypatch.setattr(L, "on_device", fake_on_device)
    seen: list[Any] = []

    def run(xs: list[torch.Tensor]) -> None:
        seen.append(getattr(local, "device", None))

    def bad(xs: list[torch.Tensor]) -> None:
        run(xs)
        raise RuntimeError("out of resources")  # a candidate that fails keeps its error

    xs = [torch.zeros(2, 3)]
    errs = L._first_calls([run, bad, run], xs)
    assert errs[0] is None and errs[2] is None and errs[1] == "failed: RuntimeError"
    assert seen == [xs[0].device] * 3


def test_first_calls_reject_candidates_whose_output_is_not_the_unfused_chains() -> None:
    """Session 28: Triton 3.6 miscompiled some tilings on the H200 (relative errors 0.9-1.8); the
    decision timed them like the rest and could have chosen one. Each first call's output is now
    compared with the unfused chain's before anything is timed."""
    torch.manual_seed(0)
    ref = torch.randn(5, 7)
    rounded = lambda xs: ref.half().float()  # noqa: E731 - fp16 rounding: not wrong
    negated = lambda xs: -ref  # noqa: E731
    nans = lambda xs: torch.where(ref > 1, float("nan"), ref)  # noqa: E731
    narrow = lambda xs: ref[:, :6]  # noqa: E731
    errs = L._first_calls([rounded, negated, nans, narrow], [ref], ref)
    assert errs[0] is None
    assert errs[1] is not None and errs[1].startswith("wrong result (relative error 2")
    assert errs[2] == "wrong result: non-finite values"
    assert errs[3] is not None and "shape (5, 6)" in errs[3]
    # without a reference only failures count (the old contract)
    assert L._first_calls([negated], [ref]) == [None]


def test_a_candidate_whose_compile_times_out_is_dropped_not_compiled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker compiles (parallel_compile) report candidate 1 past the time-out: it is never
    called here, and its error says why; the others run and are checked against the reference."""
    from kfuse.runtime import parallel_compile
    from kfuse.runtime.parallel_compile import PrecompileReport

    ref = torch.randn(5, 3)
    called: list[int] = []

    def cand(i: int, out: torch.Tensor):
        def run(xs):
            called.append(i)
            return out

        return run

    runs = [cand(0, ref.clone()), cand(1, ref.clone()), cand(2, -ref)]
    monkeypatch.setattr(parallel_compile, "precompile", lambda calls, kernel_timeout_s=None: PrecompileReport(requests=3, slow_calls=[1]))
    errs, note = L._compile_candidates(runs, [ref], ref, on_gpu=True)
    assert errs[0] is None and "compile took over" in errs[1] and errs[2] is not None and "wrong" in errs[2]
    assert sorted(called) == [0, 2] and note.endswith(")")
    assert L._compile_candidates(runs, [ref], ref, on_gpu=False) == ([None, None, None], "not compiled (no GPU)")
