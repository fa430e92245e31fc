"""The co-location kernels' residency on sm_90, from an offline compile (as the JIT specialises at launch).

CudaBackend runs LC GEMMs on 2 programs per SM, and the tail-fill fused kernel puts BE blocks into the second
slot; session 9 found the LC tile it used took 167 registers a thread (one program per SM)."""

import pytest
import torch

from kfuse.colocate.fuser import TAIL, FusedVersion
from kfuse.colocate.occupancy import fused_occupancy, programs_per_sm, ptb_occupancy
from kfuse.colocate.ptb import PtbGemmConfig, default_ptb_config, gemm_kernel
from kfuse.colocate.workloads import hotspot, stencil7


def test_programs_per_sm_arithmetic() -> None:
    assert programs_per_sm(124, 48 * 1024, 8) == 2  # 128 registers x 256 threads x 2 = 65536
    assert programs_per_sm(167, 96 * 1024, 8) == 1
    assert programs_per_sm(32, 1024, 4) == 16  # warps bound: 64 / 4
    assert programs_per_sm(64, 120 * 1024, 4) == 1  # shared memory bound


def _lc(config: PtbGemmConfig) -> object:
    a, b, c = torch.randn(1024, 3072).half(), torch.randn(3072, 768).half(), torch.empty(1024, 768).half()
    return gemm_kernel(a, b, c, config=config)


def _be(module: object) -> object:
    k = module.make(False, torch.device("cpu"), torch.Generator().manual_seed(0)).kernel
    k.consts = {"BY": 16, "BX": 64} if module is hotspot else k.consts  # the GPU's block (the interpreter's is smaller)
    return k


@pytest.mark.slow
def test_lc_gemm_and_its_tail_fill_kernels_hold_two_programs_per_sm() -> None:
    lc = _lc(default_ptb_config(torch.float16, gpu=True))
    occ = ptb_occupancy(lc)
    assert occ["stack"] == 0 and occ["programs_per_sm"] >= 2, occ
    for mode in ("tail", "tailx", "tailsm"):
        for be in (_be(hotspot), _be(stencil7)):
            f = fused_occupancy(lc, be, FusedVersion(TAIL.r1, 0, mode))
            assert f["stack"] == 0 and f["programs_per_sm"] >= TAIL.r1, (mode, be.name, f)


@pytest.mark.slow
def test_the_session_9_tile_held_one_program_per_sm() -> None:
    """The regression the new tile fixes: 128 x 128 x 64 with 3 stages does not fit two programs."""
    assert ptb_occupancy(_lc(PtbGemmConfig(128, 128, 64, 8, 8, 3)))["programs_per_sm"] == 1
