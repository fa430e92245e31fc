"""CUDA-graph runner: bookkeeping with a mock on the CPU, real capture on the GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_pointwise import fuse_pointwise
from kfuse.runtime.cuda_graph import CudaGraphRunner, signature
from kfuse.runtime.executor import lower


class FakeGraph:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def replay(self) -> None:
        self.log.append("replay")


class FakeCuda:
    """Records what the runner asks of torch.cuda; capture just runs the plan on the CPU."""

    def __init__(self, fail_capture: bool = False) -> None:
        self.log: list[str] = []
        self.fail_capture = fail_capture
        self.capturing = False

    def is_available(self) -> bool:
        return True

    def Stream(self) -> Any:  # noqa: N802 - mirrors torch.cuda
        log = self.log

        class S:
            def wait_stream(self, other: Any) -> None:
                log.append("wait_stream")

        return S()

    def current_stream(self) -> Any:
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s: Any) -> Iterator[None]:
        self.log.append("side_stream")
        yield

    def synchronize(self) -> None:
        self.log.append("synchronize")

    def clear_cublas_workspaces(self) -> None:
        self.log.append("clear_cublas_workspaces")

    def CUDAGraph(self) -> FakeGraph:  # noqa: N802
        return FakeGraph(self.log)

    @contextlib.contextmanager
    def graph(self, g: FakeGraph, pool: Any = None, stream: Any = None) -> Iterator[None]:
        self.log.append("capture_begin")
        self.capturing = True
        try:
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield
        finally:
            self.capturing = False
            self.log.append("capture_end")


def _graph() -> Graph:
    b = GraphBuilder("cg")
    x = b.add_input("x", TensorType((4, 5), torch.float32))
    y = b.op("layer_norm", [b.op("relu", [x])], {"normalized_shape": (5,)})
    return b.build([b.op("add", [y, b.scalar(1.0)])])


def _plan(device: str, backend: str) -> Any:
    return lower(fuse_pointwise(_graph()), torch.device(device), backend)


def test_mock_capture_bookkeeping() -> None:
    cuda = FakeCuda()
    plan = _plan("cpu", "torch")
    x = torch.randn(4, 5)
    r = CudaGraphRunner(plan, [x], warmup=2, cuda=cuda)
    assert r.captured and r.reason == "" and r.captures == 1
    assert cuda.log.count("side_stream") == 1 and "capture_begin" in cuda.log
    assert cuda.log.index("side_stream") < cuda.log.index("capture_begin")  # warm-up before capture
    assert plan.arena is not None  # the arena exists before capture: fixed addresses
    x2 = torch.randn(4, 5)
    out = r([x2])
    assert cuda.log[-1] == "replay" and r.replays == 1
    torch.testing.assert_close(r.static_inputs[0], x2)  # inputs copied into the static buffer
    assert out[0].data_ptr() != r.static_outputs[0].data_ptr()  # cloned for the caller
    same = r([x2], clone_outputs=False)
    assert same[0].data_ptr() == r.static_outputs[0].data_ptr()


def test_capture_takes_a_fresh_cublas_workspace() -> None:
    """The cached cuBLAS workspace is dropped right before capture (after the warm-up), so the
    captured GEMMs allocate theirs in the graph's own pool (``own_cublas_workspace``)."""
    cuda = FakeCuda()
    CudaGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], warmup=2, cuda=cuda)
    i = cuda.log.index("capture_begin")
    assert cuda.log[i - 1] == "clear_cublas_workspaces" and cuda.log.count("clear_cublas_workspaces") == 1
    assert cuda.log.index("side_stream") < i - 1


def test_mock_signature_mismatch_runs_eagerly() -> None:
    r = CudaGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=FakeCuda())
    x = torch.randn(5, 4).t()  # same shape, other strides
    assert signature([x]) != r.signature
    out = r([x])
    assert r.eager_calls == 1 and r.replays == 0
    torch.testing.assert_close(out[0], reference_run(_graph(), [x])[0])


def test_mock_capture_failure_falls_back_with_reason() -> None:
    cuda = FakeCuda(fail_capture=True)
    r = CudaGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=cuda)
    assert not r.captured and "not permitted when stream is capturing" in r.reason
    assert cuda.log[-1] == "synchronize" and not cuda.capturing  # device left usable
    x = torch.randn(4, 5)
    torch.testing.assert_close(r([x])[0], reference_run(_graph(), [x])[0])
    assert r.eager_calls == 1 and r.stats()["captured"] is False


def test_precheck_reasons() -> None:
    class NoCuda(FakeCuda):
        def is_available(self) -> bool:
            return False

    r = CudaGraphRunner(_plan("cpu", "torch"), [torch.randn(4, 5)], cuda=NoCuda())
    assert not r.captured and r.reason == "no CUDA device"
    r2 = CudaGraphRunner(_plan("cpu", "triton-interpreter"), [torch.randn(4, 5)], cuda=FakeCuda())
    assert "does not run on the GPU" in r2.reason


@pytest.mark.gpu
def test_real_capture_replays_new_inputs() -> None:
    plan = _plan("cuda", "triton")
    x = torch.randn(4, 5, device="cuda")
    r = CudaGraphRunner(plan, [x])
    assert r.captured, r.reason
    for _ in range(3):
        x = torch.randn(4, 5, device="cuda")
        torch.testing.assert_close(r([x])[0], reference_run(_graph(), [x])[0], rtol=1e-4, atol=1e-4)
    assert r.replays == 3


@pytest.mark.gpu
def test_real_capture_failure_is_safe() -> None:
    b = GraphBuilder("sync")
    x = b.add_input("x", TensorType((4,), torch.float32))
    attrs = {"fn": lambda xs: xs[0] * float(xs[0].sum().item()), "target": "item", "out_type": TensorType((4,), torch.float32)}
    bad = b.op("fallback", [x], attrs)
    g = b.build([bad])
    r = CudaGraphRunner(lower(g, torch.device("cuda"), "triton"), [torch.randn(4, device="cuda")])
    assert not r.captured and r.reason
    x = torch.randn(4, device="cuda")
    torch.testing.assert_close(r([x])[0], x * x.sum())


_WORKSPACE_SCRIPT = """
import torch
from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.runtime.cuda_graph import CudaGraphRunner
from kfuse.runtime.executor import lower

a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
a @ a  # creates the cuBLAS handle (not allowed during a capture)
torch.cuda.synchronize()
# an earlier capture on torch.cuda.graph's shared capture stream caches a cuBLAS workspace in that
# graph's pool (what the tuner's timing graphs do), and the graph goes away
tmp = torch.cuda.CUDAGraph()
with torch.cuda.graph(tmp):
    a @ a
del tmp
b = GraphBuilder("mm")
x = b.add_input("x", TensorType((64, 64), torch.float16))
w = b.add_input("w", TensorType((64, 64), torch.float16))
g = b.build([b.op("relu", [b.op("matmul", [x, w])])])
s = torch.randn(64, 64, device="cuda", dtype=torch.float16)
r = CudaGraphRunner(lower(g, torch.device("cuda"), "torch"), [s, s])
assert r.captured, r.reason
# the graph's pool holds its GEMM's own cuBLAS workspace (MiBs), not only its 8 KB tensors
pool = tuple(r.graph.pool())
segments = torch.cuda.memory._snapshot()["segments"]
in_pool = sum(blk["size"] for seg in segments if tuple(seg.get("segment_pool_id", ())) == pool
              for blk in seg["blocks"] if blk["state"] == "active_allocated")
assert in_pool >= 1 << 20, f"{in_pool} bytes allocated in the graph's pool: no workspace of its own"
# what torch.compile(mode="reduce-overhead") does around its captures, then memory churn
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.empty_cache()
junk = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(64)]
for _ in range(3):
    x, w = torch.randn(64, 64, device="cuda", dtype=torch.float16), torch.randn(64, 64, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(r([x, w])[0], torch.relu(x @ w), rtol=2e-2, atol=2e-2)
torch.cuda.synchronize()
print("ok")
"""


@pytest.mark.gpu
def test_replay_survives_a_cleared_cublas_workspace() -> None:
    """Session 26's Llama-1b B8 fault: the plan's graph reused PyTorch's cached cuBLAS workspace,
    which a reduce-overhead compile's clearing of the cache freed. The graph must hold a workspace
    in its own pool (the replay after clearing did not fault on this small GEMM without the fix,
    so the pool's contents are what is checked). A child process: a fault would poison this one."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _WORKSPACE_SCRIPT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]


def test_copy_outputs_option_reaches_the_graph_runner() -> None:
    from types import SimpleNamespace

    from kfuse.compiler import Options
    from kfuse.runtime.compiled_model import Variant

    seen: list[bool] = []

    class Runner:
        def __call__(self, xs: list[torch.Tensor], clone_outputs: bool = True) -> list[torch.Tensor]:
            seen.append(clone_outputs)
            return xs

    for flag in (True, False):
        imported = SimpleNamespace(graph_inputs=lambda flat: flat[:1])
        Variant(imported, [], None, Runner(), 0.0, copy_outputs=flag).run([torch.ones(1)])  # type: ignore[arg-type]
    assert seen == [True, False] and Options().copy_outputs is True


@pytest.mark.gpu
def test_outputs_without_copy_are_the_graph_buffers() -> None:
    import kfuse

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).cuda().eval()
    x1, x2 = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        kept = kfuse.compile(model, (x1,))
        reused = kfuse.compile(model, (x1,), copy_outputs=False)
        a1, a2 = kept(x1), kept(x2)
        b1 = reused(x1)
        b1_values = b1.clone()
        b2 = reused(x2)
        assert a1.data_ptr() != a2.data_ptr() and b1.data_ptr() == b2.data_ptr()  # the next call overwrote b1
        torch.testing.assert_close(b1_values, model(x1), rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(b2, model(x2), rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(a1, model(x1), rtol=1e-3, atol=1e-3)


def _writing_plan() -> Any:
    """A plan whose run writes its second input (a cache): ``cache <- cache + x``, returns relu of it."""
    b = GraphBuilder("state")
    x = b.add_input("x", TensorType((4, 5), torch.float32))
    cache = b.add_input("cache", TensorType((4, 5), torch.float32))
    new = b.op("add", [cache, x])
    g = b.build([new, b.op("relu", [new])])
    plan = lower(g, torch.device("cpu"), "torch")
    plan.input_writes = ((0, 1),)
    return plan


def test_written_inputs_are_bound_by_address_not_copied() -> None:
    """A written input (a KV cache) is neither copied in nor out: each new address gets its own graph,
    captured without a warm-up run (which would write the caller's state); a few are kept."""
    from kfuse.runtime.cuda_graph import MAX_BOUND_GRAPHS

    cuda = FakeCuda()
    plan = _writing_plan()
    example = [torch.randn(4, 5), torch.randn(4, 5)]
    r = CudaGraphRunner(plan, example, cuda=cuda, bound=[1])
    assert r.captured and r.captures == 1 and r.stats()["bound_graphs"] == 1
    cache, x = torch.randn(4, 5), torch.randn(4, 5)
    warmups = cuda.log.count("side_stream")
    r([x, cache])
    assert r.captures == 2 and cuda.log.count("side_stream") == warmups  # captured for this cache, no warm-up
    assert r.static_inputs[1] is cache and r.stats()["bound_graphs"] == 1  # the clone and its graph are gone
    torch.testing.assert_close(r.static_inputs[0], x)  # the other input was copied
    r([torch.randn(4, 5), cache])
    assert r.captures == 2 and r.replays == 2  # same cache, same graph
    for _ in range(MAX_BOUND_GRAPHS + 2):
        r([x, torch.randn(4, 5)])
    assert r.stats()["bound_graphs"] == MAX_BOUND_GRAPHS and r.eager_calls == 0


def test_a_failed_capture_for_a_new_cache_runs_eagerly() -> None:
    cuda = FakeCuda()
    plan = _writing_plan()
    r = CudaGraphRunner(plan, [torch.randn(4, 5), torch.randn(4, 5)], cuda=cuda, bound=[1])
    cuda.fail_capture = True
    cache, x = torch.randn(4, 5), torch.randn(4, 5)
    want = cache + x
    out = r([x, cache])
    assert r.eager_calls == 1 and "new addresses of written inputs" in r.reason
    torch.testing.assert_close(cache, want)  # the eager run wrote the cache
    torch.testing.assert_close(out[0], want.relu())
