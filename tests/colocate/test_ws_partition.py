"""The BE kernels as worker partitions of the ping-pong GEMM (``kfuse.colocate.ws_partition``): their parameters,
their register split, and (offline, sm_90) that the fused kernel keeps the GEMM's wgmma main loop and TMA ring,
runs the BE's own instructions, and spills nothing. Gluon does not run in the interpreter: the numbers and the
outputs are checked on the GPU (``benchmarks/experiments/ws_colocate_probe.py``, and the GPU test below)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kfuse.colocate import workloads, ws_partition
from kfuse.kernels import gemm_ws
from kfuse.kernels.gemm_ws import LOADER_REGS, WsConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
from cubin_facts import run_offline_script  # noqa: E402


def test_partition_parameters_follow_the_workloads_block_function() -> None:
    work = workloads.make("histogram", small=True)
    part = ws_partition.for_workload(work)
    assert part.params.startswith("be_data, be_hist, be_n, be_start, be_end, BE_BLOCK: gl.constexpr")
    assert part.constexprs == {"BE_BLOCK": work.kernel.consts["BLOCK"], "BE_NBINS": 256, "BE_WARPS": 4}
    assert part.call == "(_be_histogram, (be_data, be_hist, be_n, be_start, be_end, NUM_PROGRAMS, BE_BLOCK, BE_NBINS, BE_WARPS))"
    args = ws_partition.partition_args(work, 1, 3)
    assert args["be_data"] is work.kernel.args[0] and args["be_hist"] is work.kernel.args[1] and args["be_n"] == work.kernel.args[2]
    assert (args["be_start"], args["be_end"]) == (1, 3)
    mriq = workloads.make("mriq", small=True)
    assert list(ws_partition.partition_args(mriq, 0, 1))[:3] == ["be_kx", "be_ky", "be_kz"]


@pytest.mark.parametrize(
    ("name", "consts", "kw", "why"),
    [
        ("lbm", {"BLOCK": 128}, {}, "no worker-partition form"),
        ("stencil7", {"BY": 6, "BX": 64}, {}, "multiple of 2 x warps"),
        ("cutcp", {"BLOCK": 32, "AC": 24}, {}, "power of two"),
        ("histogram", {"BLOCK": 2048}, {}, "NBINS"),
        ("histogram", {"BLOCK": 2048, "NBINS": 256}, {"regs": 60}, "multiple of 8"),
        ("histogram", {"BLOCK": 2048, "NBINS": 256}, {"warps": 3}, "1, 2, 4 or 8 warps"),
        ("histogram", {"BLOCK": 96, "NBINS": 256}, {}, "power of two"),
        ("mriq", {"BLOCK": 16, "KC": 32}, {}, "8 x warps"),
    ],
)
def test_partitions_that_cannot_run_are_refused_with_the_reason(name: str, consts: dict, kw: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ws_partition.partition(name, consts, **kw)


def test_a_block_range_outside_the_kernel_is_refused() -> None:
    work = workloads.make("histogram", small=True)
    with pytest.raises(ValueError, match="outside"):
        ws_partition.partition_args(work, 0, work.kernel.n_blocks + 1)


@pytest.mark.parametrize(("warps", "regs", "loader"), [(4, 56, LOADER_REGS), (4, 80, LOADER_REGS), (2, 56, 24), (8, 40, 24)])
def test_the_register_split_never_asks_for_more_than_the_sm_holds(warps: int, regs: int, loader: int) -> None:
    """setmaxnreg on whole warpgroups: the loader and a small partition count as 4 warps; over 64 K a warpgroup's
    allocation would spin forever."""
    part = ws_partition.partition("histogram", {"BLOCK": 2048, "NBINS": 256}, warps=warps, regs=regs, loader_regs=loader)
    consumer = part.consumer_regs()
    assert consumer % 8 == 0 and consumer <= gemm_ws.CONSUMER_REGS
    used = 2 * 128 * consumer + 128 * loader + 128 * -(-warps // 4) * regs
    assert 65536 - 256 * 8 < used <= 65536


def test_a_partition_runs_in_the_pingpong_kernel_only() -> None:
    part = ws_partition.partition("histogram", {"BLOCK": 2048, "NBINS": 256})
    a = torch.zeros(1, 64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="ping-pong kernel only"):
        gemm_ws.run_module(None, a, a, a, [], WsConfig(schedule="coop"), 132, partition=part)


# the workloads' block constexprs on a GPU (the CPU makes the interpreter's smaller blocks)
GPU_CONSTS = {"histogram": {"BLOCK": 2048, "NBINS": 256}, "mriq": {"BLOCK": 32, "KC": 32}, "stencil7": {"BY": 8, "BX": 64},
              "cutcp": {"BLOCK": 32, "AC": 32}}  # fmt: skip

_COMPILE = r"""
import json, re, sys
from cubin_facts import sass_facts
from kfuse.ir import ops
from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm_ws import WsConfig
from kfuse.colocate import ws_partition
add = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
epi = Epilogue((add, EpilogueStep("gelu", (Operand("reg", 1),))), 1)
cfg = WsConfig(block_m=128, block_n=128, block_k=64, stages=4)
out = {}
for name, consts in json.loads(sys.argv[1]):
    part = ws_partition.partition(name, consts) if name else None
    ck = gemm_ws.compile_offline(epi, 1000, 3072, 768, cfg, row_broadcast=(True,), fast_gelu=True, bias_mode="prefetch",
                                 partition=part)
    sass = ck.asm["sass"]
    facts = sass_facts(ck.asm["cubin"])
    facts.update(shared=ck.metadata.shared, warps=ck.metadata.num_warps, redg=sass.count("REDG.E.ADD"),
                 atoms=sass.count("ATOMS.ADD"), mufu_sin=sass.count("MUFU.SIN"), mufu_cos=sass.count("MUFU.COS"),
                 mufu=sass.count("MUFU."), ldg=sass.count("LDG.E"), stg=sass.count("STG.E"),
                 tma_loads=sass.count("UTMALDG"),
                 named_bars=sorted(set(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (0x[0-9a-f]+), 0x80", sass))),
                 maxnreg=sorted({int(v, 16) for v in re.findall(r"USETMAXREG\.[A-Z_.]+ (?:UP0, )?(0x[0-9a-f]+)", sass)}))
    out[name or "none"] = facts
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    cases = [["", {}], *([name, consts] for name, consts in GPU_CONSTS.items())]
    return run_offline_script(_COMPILE, cases)


@pytest.mark.parametrize("be", list(GPU_CONSTS))
def test_sm90_fused_kernel_keeps_the_gemm_and_runs_the_be_without_spills(compiled: dict, be: str) -> None:
    alone, fused = compiled["none"], compiled[be]
    assert fused["STL"] == 0 and fused["LDL"] == 0 and fused["LOCAL"] == 0
    assert fused["HGMMA"] == alone["HGMMA"] > 0 and fused["tma_loads"] == alone["tma_loads"] > 0
    assert fused["warps"] == 16  # 4 + 4 consumer warps, the loader's warpgroup, the BE's 4
    assert fused["shared"] - alone["shared"] <= 2048  # the BE adds its scratch at most, the ring is the GEMM's
    part = ws_partition.partition(be, GPU_CONSTS[be])
    assert {LOADER_REGS, part.regs, part.consumer_regs()} <= set(fused["maxnreg"])
    if be == "histogram":  # counts in shared memory, one global atomic per bin; its barriers name the partition's 128 threads
        assert fused["atoms"] > 0 and fused["redg"] > 0 and alone["redg"] == 0
        assert len(fused["named_bars"]) > len(alone["named_bars"])
    elif be == "mriq":  # sin and cos on the MUFU, which the GEMM's wgmma leaves idle
        assert fused["mufu_sin"] > 0 and fused["mufu_cos"] > 0 and alone["mufu_sin"] == 0
    elif be == "stencil7":  # seven loads and a store a point, by pointers beside the GEMM's TMA
        assert fused["ldg"] >= alone["ldg"] + 7 and fused["stg"] > alone["stg"]
    else:  # cutcp: the square root on the MUFU
        assert fused["mufu"] > alone["mufu"] and fused["stg"] > alone["stg"]


@pytest.mark.gpu
@pytest.mark.parametrize("be", ["histogram", "mriq"])
def test_fused_launch_matches_both_references(be: str) -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import reference

    dev = torch.device("cuda")
    m, n, k = 1000, 776, 328  # not multiples of the tile (rows 16-byte aligned, as TMA needs)
    a = torch.randn(m, k, device=dev).half()
    b = torch.randn(k, n, device=dev).half() / 16
    bias = torch.randn(n, device=dev).half()
    epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
    c = torch.full((1, m, n), float("nan"), device=dev, dtype=torch.float16)
    work = workloads.make(be, small=True, device=dev)
    work.reset()
    cfg = WsConfig(block_m=128, block_n=128, block_k=64, stages=4)
    warps = 2 if be == "mriq" else 4  # the small mri-q's 16-voxel blocks: 8 rows a warp
    ws_partition.launch_fused(a.view(1, m, k), b.view(1, k, n), c, [bias.view(1, 1, n).expand(1, m, n)], epi, cfg, work, 0,
                              work.kernel.n_blocks, 132, warps=warps)  # fmt: skip
    ref = reference(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16).float()
    assert (c[0].float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()
    assert workloads.error(work) <= max(work.tol, 1e-3)
