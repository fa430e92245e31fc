"""The ``tailsm`` fused version through the co-location path on the CPU: the CUDA backend launches it with
correct results, the profile samples it next to ``tail``, and an Aker run with it among the versions completes."""

import torch

from kfuse.colocate import cuda_backend as cb
from kfuse.colocate import ptb, workloads
from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import TAIL, TAILSM
from kfuse.colocate.lc import LCItem


def test_tailsm_through_the_backend_profile_and_policy() -> None:
    a, b = torch.randn(40, 24).half(), torch.randn(24, 33).half()
    c = torch.full((40, 33), float("nan"), dtype=torch.float16)
    gemm = ptb.gemm_kernel(a, b, c)
    items = [LCItem("gemm0", gemm, None, "40x33x24", ("matmul",)), LCItem("seg0", None, lambda: None, "", ("relu",))]
    w = workloads.make("hotspot", small=True)
    w.reset()
    ptb.launch_original(w.kernel)
    expect_be = w.output().clone()
    backend = cb.CudaBackend(items, {"hotspot": w})
    w.reset()
    backend.run_fused(0, "hotspot", 0, w.kernel.n_blocks, TAILSM)
    assert torch.allclose(c.float(), a.float() @ b.float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(w.output(), expect_be)
    prof = S.build_profile(backend, ["hotspot"], [TAIL, TAILSM], reps=1, fit_ratios=(0.5, 1.0, 2.0), heldout_ratios=(1.5,))
    assert set(prof.samples[("40x33x24", "hotspot")]) == {TAIL, TAILSM}
    assert all(len(p) == 4 for p in prof.samples[("40x33x24", "hotspot")].values())
    # a bounded allowance: on the CPU clock (wall time of the interpreter) every launch takes tens of ms
    res = S.run_policy(backend, prof, "aker", [0.0, 1.0], ["hotspot"], qos_ms=1e9, extra_per_query_ms=3 * prof.be["hotspot"].predict(1))
    assert len(res.latencies_ms) == 2 and sum(res.decisions.values()) > 0
