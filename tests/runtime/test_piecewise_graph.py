"""Piecewise CUDA graphs around host-sync steps: segmentation and bookkeeping with a mock on the
CPU, real capture (a step that calls ``.item()`` between two captured runs) on the GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.runtime.executor import lower
from kfuse.runtime.piecewise_graph import PiecewiseGraphRunner, segments
from tests.runtime.test_cuda_graph import FakeCuda, FakeGraph


class _RecordingGraph(FakeGraph):
    """A fake CUDA graph that keeps the step calls made during its capture and re-runs them on
    replay, writing into the captured output tensors: fixed addresses, as in a real graph."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.work: list[tuple[Any, list[Any], tuple, Any]] = []

    def replay(self) -> None:
        super().replay()
        for fn, xs, extra, y in self.work:
            new = fn(xs, *extra)
            if new is not y:
                y.copy_(new)


class _RecordingCuda(FakeCuda):
    def __init__(self) -> None:
        super().__init__()
        self.current: _RecordingGraph | None = None

    def CUDAGraph(self) -> _RecordingGraph:  # noqa: N802 - mirrors torch.cuda
        return _RecordingGraph(self.log)

    @contextlib.contextmanager
    def graph(self, g: _RecordingGraph, pool: Any = None, stream: Any = None) -> Iterator[None]:
        with super().graph(g, pool, stream):
            self.current = g
            try:
                yield
            finally:
                self.current = None

    def recording(self, fn: Any) -> Any:
        def run(xs: list[Any], *extra: Any) -> Any:
            y = fn(xs, *extra)
            if self.current is not None:
                self.current.work.append((fn, list(xs), extra, y))
            return y

        return run


def _graph() -> Graph:
    b = GraphBuilder("pw")
    x = b.add_input("x", TensorType((4, 5), torch.float32))
    h = b.op("relu", [x])
    attrs = {"fn": lambda xs: xs[0] * float(xs[0].sum().item()), "target": "item", "out_type": TensorType((4, 5), torch.float32)}
    s = b.op("fallback", [h], attrs)  # reads a device value on the host
    y = b.op("layer_norm", [s], {"normalized_shape": (5,)})
    return b.build([b.op("add", [y, b.scalar(1.0)]), h])


def _plan(device: str, backend: str, sync_index: int | None = None) -> Any:
    plan = lower(_graph(), torch.device(device), backend)
    i = sync_index if sync_index is not None else next(i for i, s in enumerate(plan.steps) if s.info.template == "fallback")
    plan.steps[i].host_sync = True
    return plan


def test_segments_split_at_host_sync_steps() -> None:
    plan = _plan("cpu", "torch")
    n = len(plan.steps)
    k = next(i for i, s in enumerate(plan.steps) if s.host_sync)
    segs = segments(plan)
    assert [(s.lo, s.hi, s.sync) for s in segs] == [(0, k, False), (k, k + 1, True), (k + 1, n, False)]
    for s in plan.steps:
        s.host_sync = False
    assert [(s.lo, s.hi, s.sync) for s in segments(plan)] == [(0, n, False)]
    plan.steps[0].host_sync = True
    assert [(s.lo, s.hi, s.sync) for s in segments(plan)] == [(0, 1, True), (1, n, False)]


def test_mock_capture_bookkeeping() -> None:
    cuda = _RecordingCuda()
    plan = _plan("cpu", "torch")
    calls = []
    k = next(i for i, s in enumerate(plan.steps) if s.host_sync)
    inner = plan.steps[k].fn
    plan.steps[k].fn = lambda xs, *a: calls.append(1) or inner(xs, *a)
    for s in plan.steps:
        s.fn = cuda.recording(s.fn)
    x = torch.randn(4, 5)
    r = PiecewiseGraphRunner(plan, [x], warmup=2, cuda=cuda)
    assert r.captured and r.reason == "" and r.graphs == 2
    assert cuda.log.count("capture_begin") == 2 and cuda.log.count("replay") == 2  # each segment replayed after capture
    assert cuda.log.index("side_stream") < cuda.log.index("capture_begin")  # warm-up first
    n0 = len(calls)
    x2 = torch.randn(4, 5)  # not the capture's input: the replays must read the static buffer
    out = r([x2])
    assert len(calls) == n0 + 1 and cuda.log.count("replay") == 4 and r.replays == 1  # sync step eager, both graphs replayed
    assert torch.equal(r.static_inputs[0], x2) and r.static_inputs[0].data_ptr() != x2.data_ptr()
    for got, want in zip(out, reference_run(_graph(), [x2]), strict=True):
        torch.testing.assert_close(got, want)
    assert out[0].data_ptr() != r.static_outputs[0].data_ptr()  # cloned for the caller
    assert r.stats()["host_sync_steps"] == 1 and r.stats()["piecewise"] is True


def test_mock_signature_mismatch_and_failure_run_eagerly() -> None:
    r = PiecewiseGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=FakeCuda())
    x = torch.randn(5, 4).t()  # same shape, other strides
    out = r([x])
    assert r.eager_calls == 1 and r.replays == 0
    torch.testing.assert_close(out[0], reference_run(_graph(), [x])[0])
    cuda = FakeCuda(fail_capture=True)
    bad = PiecewiseGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=cuda)
    assert not bad.captured and "not permitted" in bad.reason and not cuda.capturing
    x = torch.randn(4, 5)
    torch.testing.assert_close(bad([x])[0], reference_run(_graph(), [x])[0])


def test_plan_without_host_sync_is_left_to_the_whole_graph_runner() -> None:
    plan = _plan("cpu", "torch")
    for s in plan.steps:
        s.host_sync = False
    r = PiecewiseGraphRunner(plan, [torch.randn(4, 5)], cuda=FakeCuda())
    assert not r.captured and "no host-sync step" in r.reason


@pytest.mark.gpu
def test_real_piecewise_capture_replays_new_inputs() -> None:
    plan = _plan("cuda", "triton")
    r = PiecewiseGraphRunner(plan, [torch.randn(4, 5, device="cuda")])
    assert r.captured and r.graphs == 2, r.reason
    for _ in range(3):
        x = torch.randn(4, 5, device="cuda")
        for got, want in zip(r([x]), reference_run(_graph(), [x]), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert r.replays == 3
