"""Test setup: kernels run in the Triton interpreter on the CPU unless a GPU is present."""

import os

import pytest

try:
    import torch

    _HAS_GPU = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_GPU = False

if not _HAS_GPU:
    # must be set before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # the attention autotuner compiles and times its whole space at each new problem: a GPU test run
    # of the attention file took past its 100 s limit (session 24). Tests pass configs explicitly;
    # test_attention.py::test_autotuner_picks_a_config_of_the_space turns it on for itself
    os.environ.setdefault("KFUSE_ATTN_AUTOTUNE", "0")


def pytest_collection_modifyitems(config, items):
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return "cuda" if _HAS_GPU else "cpu"
