"""CUDA-graph captures run on the capturer's own stream, on the tensors' device: ``torch.cuda.graph``
without ``stream=`` captures on one process-wide side stream, made on whichever device was current
at the first capture, and entering it makes that device current. A model on cuda:1 captured after
anything was captured on cuda:0 then ran its capture with cuda:0 current (Triton launches on the
current device). And the harness's timer follows the device the timed work runs on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kfuse.bench import harness
from kfuse.runtime.cuda_graph import CudaGraphRunner
from kfuse.runtime.piecewise_graph import PiecewiseGraphRunner
from tests.runtime.test_cuda_graph import FakeCuda
from tests.runtime.test_cuda_graph import _plan as whole_plan
from tests.runtime.test_piecewise_graph import _plan as piecewise_plan
from tests.runtime.test_piecewise_graph import _RecordingCuda


class _Streams:
    """What a fake ``torch.cuda`` records: the streams warm-ups ran on and the streams captures ran on."""

    def __init__(self) -> None:
        self.side: list[Any] = []
        self.captured_on: list[Any] = []


class _RecordsStreams:
    """Mixed into a fake ``torch.cuda``: records each warm-up stream and each capture's ``stream=``."""

    def __init__(self) -> None:
        super().__init__()
        self.rec = _Streams()

    @contextlib.contextmanager
    def stream(self, s: Any) -> Iterator[None]:
        self.rec.side.append(s)
        with super().stream(s):  # type: ignore[misc]
            yield

    @contextlib.contextmanager
    def graph(self, g: Any, pool: Any = None, stream: Any = None) -> Iterator[None]:
        self.rec.captured_on.append(stream)
        with super().graph(g, pool, stream):  # type: ignore[misc]
            yield


class _StreamCuda(_RecordsStreams, FakeCuda):
    pass


class _PiecewiseStreamCuda(_RecordsStreams, _RecordingCuda):
    pass


def test_the_whole_plan_graph_is_captured_on_its_warm_up_stream() -> None:
    cuda = _StreamCuda()
    r = CudaGraphRunner(whole_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=cuda)
    assert r.captured and len(cuda.rec.side) == 1
    assert cuda.rec.captured_on == cuda.rec.side  # not None: the process-wide default stream


def test_each_piecewise_graph_is_captured_on_the_warm_up_stream() -> None:
    cuda = _PiecewiseStreamCuda()
    r = PiecewiseGraphRunner(piecewise_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=cuda)
    assert r.captured and r.graphs == 2 and len(cuda.rec.side) == 1
    assert cuda.rec.captured_on == cuda.rec.side * 2


class _FakeTorchCuda:
    """Stand-ins for the ``torch.cuda`` calls a capture makes, recording the streams."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rec = _Streams()
        rec = self.rec

        class Stream:
            def __init__(self, device: Any = None) -> None:
                self.device = device

            def wait_stream(self, other: Any) -> None:
                pass

        class Graph:
            def replay(self) -> None:
                pass

        @contextlib.contextmanager
        def stream(s: Any) -> Iterator[None]:
            rec.side.append(s)
            yield

        @contextlib.contextmanager
        def graph(g: Any, pool: Any = None, stream: Any = None) -> Iterator[None]:
            rec.captured_on.append(stream)
            yield

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def test_the_harness_captures_on_its_warm_up_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeTorchCuda(monkeypatch)
    harness.cuda_graph_callable(lambda: None, (), calls=2)
    assert len(fake.rec.side) == 1 and fake.rec.captured_on == fake.rec.side


def test_a_varlen_bucket_is_captured_on_its_warm_up_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import kfuse.runtime.varlen as V
    from tests.runtime.test_varlen_buckets import _bert_tiny_region

    xs, runner = _bert_tiny_region()
    fake = _FakeTorchCuda(monkeypatch)
    bucket = runner._capture(V.BUCKET, xs)
    assert bucket.graph is not None, runner.note
    assert len(fake.rec.side) == 1 and fake.rec.captured_on == fake.rec.side


def test_cpu_work_is_timed_by_the_wall_clock_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_events(*a: Any, **k: Any) -> None:
        raise AssertionError("work on the CPU must not be timed with CUDA events")

    monkeypatch.setattr(torch.cuda, "synchronize", no_events)
    monkeypatch.setattr(torch.cuda, "Event", no_events)
    x = torch.randn(64, 64)
    assert harness.time_ms(lambda: x @ x, warmup=1, rep=3, device="cpu") >= 0.0
    assert harness.time_ms(lambda: x @ x, warmup=1, rep=3, device=torch.device("cpu")) >= 0.0
