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
