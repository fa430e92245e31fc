"""The ``tailsm`` fused version through the co-location path (GPU or interpreter): the CUDA backend launches it with
correct results, the profile samples it next to ``tail``, and an Aker run with it among the versions completes."""

from collections.abc import Callable
from types import SimpleNamespace

import torch

from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import TAIL, TAILSM


def test_tailsm_through_the_backend_profile_and_policy(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("hotspot")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    backend.run_fused(0, "hotspot", 0, w.kernel.n_blocks, TAILSM)
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)  # reference off TF32
    assert torch.equal(w.output(), expect_be)
    prof = S.build_profile(backend, ["hotspot"], [TAIL, TAILSM], reps=1, fit_ratios=(0.5, 1.0, 2.0), heldout_ratios=(1.5,))
    assert set(prof.samples[("40x33x24", "hotspot")]) == {TAIL, TAILSM}
    assert all(len(p) == 4 for p in prof.samples[("40x33x24", "hotspot")].values())
    # a bounded allowance: on the CPU clock (wall time of the interpreter) every launch takes tens of ms
    res = S.run_policy(backend, prof, "aker", [0.0, 1.0], ["hotspot"], qos_ms=1e9, extra_per_query_ms=3 * prof.be["hotspot"].predict(1))
    assert len(res.latencies_ms) == 2 and sum(res.decisions.values()) > 0
