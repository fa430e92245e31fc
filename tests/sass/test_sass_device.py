"""The SASS evaluation worker runs on the GPU of the kernel's tensors: a spawned process starts on
device 0, so a model on ``cuda:1`` had its candidate schedules timed and verified on another GPU."""

from __future__ import annotations

import pytest
import torch

import kfuse.sass.verify as V
from kfuse.sass.api import _cuda_index


class _Conn:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, msg: tuple) -> None:
        self.sent.append(msg)

    def recv(self) -> tuple:
        return ("stop",)


def test_the_worker_makes_the_specs_gpu_current(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: order.append(("set_device", i)))
    monkeypatch.setattr(V, "_Runner", lambda spec: order.append("runner"))
    spec = V.LaunchSpec("k", b"", {}, {}, {}, [], [], (1, 1, 1), device_index=1)
    conn = _Conn()
    V._worker(conn, spec)
    assert order == [("set_device", 1), "runner"] and conn.sent == [("ready", None)]


def test_cpu_arguments_mean_device_zero() -> None:
    assert _cuda_index([torch.zeros(2), 3, None]) == 0 and _cuda_index([]) == 0
