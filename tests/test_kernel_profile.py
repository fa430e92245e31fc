"""kfuse.bench.kernel_profile: the kernels of a call, eager and replayed from a CUDA graph (GPU only)."""

from __future__ import annotations

import pytest
import torch

from kfuse.bench.harness import cuda_graph_callable
from kfuse.bench.kernel_profile import profile_summary

pytestmark = pytest.mark.gpu


def test_profile_counts_the_kernels_of_a_call_and_of_its_cuda_graph() -> None:
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)

    def two_kernels(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ x) + 1.0

    for fn in (lambda: two_kernels(a), cuda_graph_callable(two_kernels, (a,))):
        pr = profile_summary(fn, call_ms=1.0, calls=3)
        assert pr["launches"] >= 3  # the GEMM, the relu and the add (or a fused pair of them)
        assert 0 < pr["kernel_us"] < 1000 and pr["uncovered_us"] == round(1000 - pr["kernel_us"], 1)
        assert sum(n for _, _, n in pr["top"]) == pr["launches"]
