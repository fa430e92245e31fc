"""Shared set-up of the co-location tests: a one-GEMM LC model and a small BE workload on the CUDA
backend (on the GPU when there is one, else in the Triton interpreter on the CPU)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from kfuse.colocate import cuda_backend as cb
from kfuse.colocate import ptb, workloads
from kfuse.colocate.lc import LCItem


@pytest.fixture
def gemm_lc_backend(device: str) -> Callable[[str], SimpleNamespace]:
    """``make(be)``: a 40x33x24 LC GEMM (key ``"40x33x24"``, its output ``c`` NaN-poisoned) and one
    non-GEMM step, the small ``be`` workload with the output of its original kernel (``expect_be``)
    and reset again, and the CUDA backend over both."""

    def make(be: str) -> SimpleNamespace:
        a, b = torch.randn(40, 24, device=device).half(), torch.randn(24, 33, device=device).half()
        c = torch.full((40, 33), float("nan"), dtype=torch.float16, device=device)
        gemm = ptb.gemm_kernel(a, b, c)
        items = [LCItem("gemm0", gemm, None, "40x33x24", ("matmul",)), LCItem("seg0", None, lambda: None, "", ("relu",))]
        w = workloads.make(be, small=True, device=device)
        w.reset()
        ptb.launch_original(w.kernel)
        expect_be = w.output().clone()
        backend = cb.CudaBackend(items, {be: w})
        w.reset()
        return SimpleNamespace(a=a, b=b, c=c, w=w, expect_be=expect_be, backend=backend)

    return make


@pytest.fixture
def colocate_cli(tmp_path, monkeypatch) -> Callable[..., tuple]:  # noqa: ANN001
    """``run(versions, *extra)``: ``kfuse colocate run`` on the simulated mlp-tiny + histogram with ``versions`` and
    ``extra`` options; returns the CLI result, the keyword arguments ``run_experiment`` received and the records
    written (None where the command failed)."""
    import json

    from typer.testing import CliRunner

    from kfuse.cli import app
    from kfuse.colocate import experiment

    seen: dict = {}
    real = experiment.run_experiment

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "run_experiment", spy)

    def run(versions: str, *extra: str) -> tuple:
        args = ["colocate", "run", "--lc", "mlp-tiny", "--be", "histogram", "--backend", "sim", "--seconds", "0.05",
                "--versions", versions, "--out", str(tmp_path), *extra]  # fmt: skip
        r = CliRunner().invoke(app, args)
        recs = json.loads((tmp_path / "colocate.json").read_text()) if r.exit_code == 0 else None
        return r, dict(seen), recs

    return run
