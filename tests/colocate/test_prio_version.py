"""The ``prio`` version (LC kernel and BE slice on prioritized streams): parsed and named like the
fused versions, refused by the one-launch fuser with the reason, run by the CUDA backend with both
results correct, and measured by the profile next to ``tail``."""

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from kfuse.colocate import ptb
from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import PRIO, TAIL, launch_args, parse_version
from kfuse.colocate.prio import run_prio


def test_prio_is_a_named_version_the_fuser_does_not_launch(device: str) -> None:
    assert parse_version("prio") == PRIO and PRIO.describe() == "prio"
    a, b = torch.randn(8, 16, device=device).half(), torch.randn(16, 8, device=device).half()
    gemm = ptb.gemm_kernel(a, b, torch.empty(8, 8, device=device).half())
    with pytest.raises(ValueError, match="prioritized streams"):
        launch_args(gemm, (0, gemm.n_blocks), gemm, (0, gemm.n_blocks), PRIO, sms=2)


def test_run_prio_without_streams_runs_both_in_order() -> None:
    order: list[str] = []
    run_prio(None, lambda: order.append("lc"), lambda: order.append("be"))
    assert order == ["lc", "be"]


def test_prio_through_the_backend_and_the_profile(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("histogram")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    n = w.kernel.n_blocks
    half = max(1, n // 2)  # at the GPU's block size the small histogram is one block: it all runs beside the LC GEMM
    backend.run_fused(0, "histogram", 0, half, PRIO)  # half the BE kernel with the LC GEMM
    backend.run_be("histogram", half, n)  # the rest alone
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)  # reference off TF32
    assert torch.equal(w.output(), expect_be)
    prof = S.build_profile(backend, ["histogram"], [TAIL, PRIO], reps=1, fit_ratios=(0.5, 1.0, 2.0), heldout_ratios=(1.5,))
    assert set(prof.samples[("40x33x24", "histogram")]) == {TAIL, PRIO}
