"""Test setup: kernels run in the Triton interpreter on the CPU unless a GPU is present."""

import os
import sys

import pytest

try:
    import torch

    _HAS_GPU = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_GPU = False

# the tuner's database starts empty in every test, also on a GPU that kfuse ships records for (kfuse.tune.shipped);
# tests of the seeding turn it on themselves
os.environ.setdefault("KFUSE_SHIPPED_RECORDS", "0")

if not _HAS_GPU:
    # must be set before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # the attention autotuner compiles and times its whole space at each new problem: a GPU test run
    # of the attention file took past its 100 s limit (session 24). Tests pass configs explicitly;
    # test_attention.py::test_autotuner_picks_a_config_of_the_space turns it on for itself
    os.environ.setdefault("KFUSE_ATTN_AUTOTUNE", "0")
    # each test process (14 under xdist on the GPU host) would start a compile worker per core but one
    os.environ.setdefault("KFUSE_COMPILE_WORKERS", "2")


def _interpreter_numpy_ok() -> bool:
    # Triton 3.6's interpreter fails on numpy >= 2.3 ("only 0-dimensional arrays can be converted to
    # Python scalars"): the GPU machine's numpy, where the scripts' --smoke runs use the interpreter
    import numpy

    return tuple(int(p) for p in numpy.__version__.split(".")[:2]) < (2, 3)


def pytest_collection_modifyitems(config, items):
    if not _interpreter_numpy_ok():
        skip_interp = pytest.mark.skip(reason="the Triton 3.6 interpreter needs numpy < 2.3")
        for item in items:
            if "interpreter" in item.keywords:
                item.add_marker(skip_interp)
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return "cuda" if _HAS_GPU else "cpu"


@pytest.fixture(autouse=True)
def _cuda_faults_stay_with_their_test():
    """On a GPU, synchronise after every test so an asynchronous fault (an illegal address) is
    reported on the test that launched the kernel, not on whichever later test first synchronises.
    Such a fault leaves the process's CUDA context unusable: under pytest-xdist the worker exits (xdist
    reports it as crashed in this test and starts a fresh one), alone the run stops. Session 27's first
    whole-suite run on the H200 lost one worker's remaining tests to one unattributed fault."""
    yield
    if not _HAS_GPU:
        return
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any CUDA error here ends this process's use of the GPU
        msg = f"CUDA error after this test, the context is lost: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if os.environ.get("PYTEST_XDIST_WORKER"):
            print(msg, file=sys.stderr, flush=True)
            os._exit(3)
        pytest.exit(msg, returncode=3)
