"""A compile follows its inputs' device, not the machine's current one: the compile and every call run
with the inputs' GPU current (Triton launches on the current device; inputs on cuda:1 with cuda:0
current ran kfuse's kernels on cuda:0), and the tuning stage times kernels on the device the plan
runs on, which the graph's constants need not be on (ONNX initializers are CPU tensors for a GPU
model too: the tuner took the first constant's device, so a GPU ONNX model was not tuned)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kfuse
import kfuse.runtime.compiled_model as CM
import kfuse.tune.tuner as T
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.runtime.device import on_device


def test_on_device_makes_a_gpu_current_and_leaves_the_cpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[torch.device] = []

    @contextlib.contextmanager
    def fake_device(d: Any) -> Iterator[None]:
        entered.append(torch.device(d))
        yield

    monkeypatch.setattr(torch.cuda, "device", fake_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with on_device(torch.device("cuda", 1)):
        pass
    with on_device("cpu"), on_device(None), on_device("cuda:0"), on_device("cuda"):  # nothing to switch
        pass
    assert entered == [torch.device("cuda", 1)]


def test_the_compile_and_each_call_run_on_the_inputs_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import kfuse.models as zoo

    seen: list[torch.device] = []

    def recording(device: torch.device) -> contextlib.AbstractContextManager[Any]:
        seen.append(device)
        return on_device(device)

    monkeypatch.setattr(CM, "on_device", recording)
    m, a, kw = zoo.build("mlp-tiny", batch=2)
    c = kfuse.compile(m, a, kw, check=False)
    assert seen == [torch.device("cpu")]  # the compile
    c(*a, **kw)
    assert seen == [torch.device("cpu")] * 2  # and the call


def test_the_compile_tells_the_pipeline_where_the_plan_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import kfuse.models as zoo

    devices: list[Any] = []
    real = CM.optimize

    def recording(graph: Any, options: Any = None, pipeline: Any = None, device: Any = None) -> Any:
        devices.append(device)
        return real(graph, options, pipeline, device=device)

    monkeypatch.setattr(CM, "optimize", recording)
    m, a, kw = zoo.build("mlp-tiny", batch=2)
    kfuse.compile(m, a, kw, check=False)
    assert devices == [torch.device("cpu")]


class _Stop(Exception):
    pass


def test_the_tuner_times_on_the_plans_device_not_the_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph's constants are CPU tensors (as an ONNX model's initializers are); the plan runs on a GPU."""
    import kfuse.models as zoo

    seen: list[Any] = []

    class Recording(T.Tuner):
        def __init__(self, *a: Any, **k: Any) -> None:
            seen.append(k.get("device"))
            raise _Stop  # no further: there is no GPU to tune on here

    monkeypatch.setattr(T, "Tuner", Recording)
    m, a, kw = zoo.build("mlp-tiny", batch=2)  # weights on the CPU
    graph = import_module(m, a, kw).graph
    assert all(t.device.type == "cpu" for t in graph.constants.values())
    with pytest.raises(_Stop):
        optimize(graph, Options(tune="fast"), device=torch.device("cuda", 1))
    assert seen == [torch.device("cuda", 1)]
