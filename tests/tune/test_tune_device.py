"""The tuner follows the model's device, not the machine's (session 27's whole-suite run on the H200:
a CPU model compiled with tuning on a GPU machine tuned on the GPU, and ``query("cpu")`` read the
GPU's properties for a CPU device)."""

from __future__ import annotations

import pytest
import torch

import kfuse.tune.tuner as T
from kfuse.tune.hardware import DEFAULT, query


def test_query_of_a_cpu_device_is_the_default_entry_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_gpu_here(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a CPU device must not read a GPU's properties")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_gpu_here)
    assert query("cpu") == DEFAULT and query(torch.device("cpu")) == DEFAULT


def test_tune_graph_tunes_on_the_weights_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import kfuse
    import kfuse.models as zoo

    seen: list[object] = []
    real = T.Tuner

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **k) -> None:  # noqa: ANN002, ANN003
            seen.append(k.get("device"))
            super().__init__(*a, **k)

    monkeypatch.setattr(T, "Tuner", Recording)
    m, a, kw = zoo.build("mlp-tiny", batch=2)  # built on the CPU
    kfuse.compile(m, a, kw, tune="fast", check=False)
    assert seen and all(d is not None and torch.device(d).type == "cpu" for d in seen), seen


def test_lookup_keeps_one_tuner_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lookup_config`` answers from the current GPU's records: on a node with two GPU models, one
    cached tuner (made on whichever GPU was current first) would key every lookup by that GPU."""
    made: list[object] = []

    class Fake:
        def __init__(self, mode: str, progress: bool = True, device: object = None) -> None:
            made.append(device)
            self.device = device

        def lookup(self, problem: object) -> object:
            return self.device

    current = [0]
    monkeypatch.setattr(T, "_LOOKUP", {})
    monkeypatch.setattr(T, "Tuner", Fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    assert T.lookup_config(object()) == torch.device("cuda", 0)
    current[0] = 1
    assert T.lookup_config(object()) == torch.device("cuda", 1)
    current[0] = 0
    assert T.lookup_config(object()) == torch.device("cuda", 0)
    assert made == [torch.device("cuda", 0), torch.device("cuda", 1)]
