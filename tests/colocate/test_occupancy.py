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
def test_every_tile_a_shape_may_take_holds_two_programs_per_sm() -> None:
    """``--lc-gemms ptb-tuned`` picks among ``GPU_FP16_LC_TILES`` per shape; the LC's grid stays two programs an SM
    (session 54, offline: 124 / 124 / 156 / 121 registers, 2 / 4 / 3 / 4 programs an SM)."""
    from kfuse.colocate.ptb import GPU_FP16_LC_TILES

    for tile in GPU_FP16_LC_TILES:
        occ = ptb_occupancy(_lc(tile))
        assert occ["stack"] == 0 and occ["programs_per_sm"] >= 2, (tile, occ)


@pytest.mark.slow
def test_the_session_9_tile_held_one_program_per_sm() -> None:
    """The regression the new tile fixes: 128 x 128 x 64 with 3 stages does not fit two programs."""
    assert ptb_occupancy(_lc(PtbGemmConfig(128, 128, 64, 8, 8, 3)))["programs_per_sm"] == 1


def test_mriq_gpu_path_puts_its_trig_on_the_mufu() -> None:
    """mri-q's block as the GPU runs it (``FAST_TRIG``): sin and cos are one MUFU op each, with no
    local-memory range reduction, and the kernel has far fewer FP32 FMA-pipe instructions than with
    libdevice's ``tl.sin`` / ``tl.cos`` (the interpreter's path). Beside a wgmma GEMM, MUFU work runs
    free and FMA work does not (docs/colocate.md, "Session 18")."""
    import dataclasses
    import os
    import re
    import subprocess
    import tempfile

    import triton

    from kfuse.colocate.occupancy import _compile, _params
    from kfuse.colocate.ptb import _module_for
    from kfuse.colocate.workloads import mriq

    k = mriq.make(False, torch.device("cpu"), torch.Generator().manual_seed(0)).kernel
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("the triton wheel has no cuobjdump")
    facts = {}
    for fast in (True, False):
        kk = dataclasses.replace(k, consts={"BLOCK": 32, "KC": 32, "FAST_TRIG": fast})  # the GPU's block
        names, consts = _params("", kk)
        named = [*zip(names, kk.args, strict=True), ("start", 0), ("end", kk.n_blocks)]
        ck = _compile(_module_for(kk).ptb_kernel, named, dict(zip(consts, kk.consts.values(), strict=True)), kk.num_warps, 1)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(bytes(ck.asm["cubin"]))
            f.flush()
            sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        facts[fast] = {
            "mufu_trig": len(re.findall(r"MUFU\.(?:SIN|COS)", sass)),
            "fma_pipe": len(re.findall(r"\b(?:FFMA|FMUL|FADD)\b", sass)),
            "local": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
        }
    assert facts[True]["mufu_trig"] > 0 and facts[True]["local"] == 0, facts
    assert facts[False]["mufu_trig"] == 0 and facts[False]["local"] > 0, facts  # libdevice: polynomials, slow path in local memory
    assert facts[True]["fma_pipe"] * 2 < facts[False]["fma_pipe"], facts
