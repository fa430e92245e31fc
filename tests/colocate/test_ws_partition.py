"""The BE kernels as worker partitions of the ping-pong GEMM (``kfuse.colocate.ws_partition``): their parameters,
their register split, and (offline, sm_90) that the fused kernel keeps the GEMM's wgmma main loop and TMA ring,
runs the BE's own instructions, and spills nothing. Gluon does not run in the interpreter: the numbers and the
outputs are checked on the GPU (``benchmarks/experiments/ws_colocate_probe.py``, and the GPU test below)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kfuse.colocate import workloads, ws_partition
from kfuse.kernels import gemm_ws
from kfuse.kernels.gemm_ws import LOADER_REGS, WsConfig
from tests.colocate.test_plan_gemm import Block
from tests.kernels.cubin_facts import run_offline_script


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
        ("stencil7", {"BY": 6, "BX": 64}, {}, "multiple of 2 x 3"),
        ("cutcp", {"BLOCK": 32, "AC": 24}, {}, "power of two"),
        ("histogram", {"BLOCK": 2048}, {}, "NBINS"),
        ("histogram", {"BLOCK": 2048, "NBINS": 256}, {"regs": 60}, "multiple of 8"),
        ("histogram", {"BLOCK": 2048, "NBINS": 256}, {"warps": 3}, "1, 2, 4 or 8 warps"),
        ("histogram", {"BLOCK": 96, "NBINS": 256}, {}, "power of two"),
        ("mriq", {"BLOCK": 12, "KC": 32}, {}, "power of two of at least 8"),
        ("cutcp", {"BLOCK": 32, "AC": 4}, {"warps": 8}, "at least 4 x 2"),
    ],
)
def test_partitions_that_cannot_run_are_refused_with_the_reason(name: str, consts: dict, kw: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        ws_partition.partition(name, consts, **kw)


def test_a_block_range_outside_the_kernel_is_refused() -> None:
    work = workloads.make("histogram", small=True)
    with pytest.raises(ValueError, match="outside"):
        ws_partition.partition_args(work, 0, work.kernel.n_blocks + 1)


@pytest.mark.parametrize(
    ("name", "kw", "why"),
    [
        ("histogram", {"feed": "tma"}, "only stencil7 has a TMA-fed partition"),
        ("stencil7", {"feed": "tma", "unroll": 4}, r"runs one of \[1, 2\] blocks an iteration"),
        ("stencil7", {"feed": "tma", "slots": 5}, "1 to 4 slots"),
        ("stencil7", {"feed": "cp.async"}, "feed is one of"),
    ],
)
def test_tma_feeds_that_cannot_run_are_refused_with_the_reason(name: str, kw: dict, why: str) -> None:
    consts = {"BY": 8, "BX": 64} if name == "stencil7" else {"BLOCK": 2048, "NBINS": 256}
    with pytest.raises(ValueError, match=why):
        ws_partition.partition(name, consts, **kw)


def test_tma_fed_stencil7_takes_its_source_as_a_descriptor_of_its_windows() -> None:
    part = ws_partition.partition("stencil7", {"BY": 8, "BX": 64}, warps=8, feed="tma", slots=3)
    assert part.params.startswith("be_src_desc, be_src, be_dst, be_nx") and "BE_SLOTS: gl.constexpr" in part.params
    assert part.constexprs["BE_SLOTS"] == 3 and part.key.endswith("_tma3") and part.regs == ws_partition.STENCIL7_TMA_REGS[1]
    assert part.params.endswith("BE_SLOTS: gl.constexpr, BE_U: gl.constexpr") and part.constexprs["BE_U"] == 1
    two = ws_partition.partition("stencil7", {"BY": 8, "BX": 64}, warps=8, unroll=2, feed="tma", slots=2)
    assert two.key.endswith("_u2_tma2") and two.constexprs["BE_U"] == 2 and two.regs == ws_partition.STENCIL7_TMA_REGS[2]
    assert part.arg_types["be_src_desc"].startswith("tensordesc<fp32[1, 8, 64]")
    src = torch.randn(6, 24, 64)
    assert ws_partition.tma_unfit(src) is None
    desc = ws_partition.tma_source(src, {"BY": 8, "BX": 64})
    assert list(desc.block_shape) == [1, 8, 64] and list(desc.shape) == [6, 24, 64]
    for bad, why in ((torch.randn(6, 24, 13), "multiple of 16 bytes"), (torch.randn(6, 64, 24).transpose(1, 2), "contiguous"),
                     (torch.randn(6, 24, 64).half(), "fp32")):  # fmt: skip
        assert why in ws_partition.tma_unfit(bad)


def test_a_small_stencil7_is_not_tma_fed_and_gets_no_tma_candidates() -> None:
    """The CPU's stencil7 (13 columns: rows of 52 bytes) cannot be read by TMA: partition_args says why, and a host offers
    such a source only the LDG form; a source with 16-byte rows gets a TMA form on each host tile with the deepest ring
    that fits (8 BE warps on the 64-row tile only, as the LDG form)."""
    from kfuse.colocate.workloads import Workload

    work = workloads.make("stencil7", small=True)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        ws_partition.partition_args(work, 0, 1, feed="tma")
    a, b = torch.zeros(1, 256, 256, dtype=torch.float16), torch.zeros(1, 256, 256, dtype=torch.float16)
    host = ws_partition.WsHost("h", a, b, torch.zeros(1, 256, 256, dtype=torch.float16), [], None, 132, feeds=("ldg", "tma"))

    def gpu_consts(src: torch.Tensor) -> Workload:  # the GPU's 8 x 64 blocks (16-column warps) on another source
        kernel = replace(work.kernel, args=[src, *work.kernel.args[1:]], consts={"BY": 8, "BX": 64})
        return Workload("stencil7", kernel, work.reference, work.output, work.reset, work.nominal_class)

    gpu_like = gpu_consts(torch.randn(4, 16, 64))
    assert {c.feed for c in host.candidates(gpu_consts(torch.randn(4, 16, 13)))} == {"ldg"}
    tma = [c for c in host.candidates(gpu_like) if c.feed == "tma"]
    assert {(c.cfg.block_m, c.warps, c.slots) for c in tma} == {(64, 4, 4), (64, 8, 4), (128, 4, 3)}
    assert all(c.label.endswith(" tma") for c in tma)
    host.unrolls = (1, 2)  # two blocks an iteration: a slot holds both blocks' windows, a ring of 2 only beside the 64-row tile
    tma2 = [c for c in host.candidates(gpu_like) if c.feed == "tma" and c.unroll == 2]
    assert {(c.cfg.block_m, c.warps, c.slots) for c in tma2} == {(64, 4, 2), (64, 8, 2)} and all(c.label.endswith(" u2 tma") for c in tma2)
    args = ws_partition.partition_args(gpu_like, 0, 5, feed="tma")
    assert list(args)[:3] == ["be_src_desc", "be_src", "be_dst"] and args["be_end"] == 5


def test_the_tma_ring_takes_the_deepest_depth_the_hosts_shared_memory_leaves() -> None:
    consts = {"BY": 8, "BX": 64}
    depths = {name: ws_partition.tma_slots(cfg, consts) for name, cfg, _ in ws_partition.HOST_TILES}
    assert depths == {"pp64x128 s6": 4, "pp128 s4": 3}
    assert {name: ws_partition.tma_slots(cfg, consts, 2) for name, cfg, _ in ws_partition.HOST_TILES} == {"pp64x128 s6": 2, "pp128 s4": 0}
    assert ws_partition.tma_slot_bytes(consts, 2) == 2 * ws_partition.tma_slot_bytes(consts) - 8  # one mbarrier a slot
    for name, cfg, _ in ws_partition.HOST_TILES:
        assert cfg.smem_bytes() + depths[name] * ws_partition.tma_slot_bytes(consts) <= gemm_ws.SMEM_LIMIT
    assert ws_partition.tma_slots(WsConfig(block_m=128, block_n=256, block_k=64, stages=4), consts) == 0
    assert ws_partition.parse_feeds("ldg,tma") == ("ldg", "tma")
    with pytest.raises(ValueError, match="--ws-feed"):
        ws_partition.parse_feeds("ldg,tmem")


@pytest.mark.parametrize(("warps", "regs", "loader"), [(4, 56, LOADER_REGS), (4, 80, LOADER_REGS), (2, 56, 24), (8, 40, 24)])
def test_the_register_split_never_asks_for_more_than_the_sm_holds(warps: int, regs: int, loader: int) -> None:
    """setmaxnreg on whole warpgroups: the loader and a small partition count as 4 warps; over 64 K a warpgroup's
    allocation would spin forever."""
    part = ws_partition.partition("histogram", {"BLOCK": 2048, "NBINS": 256}, warps=warps, regs=regs, loader_regs=loader)
    consumer = part.consumer_regs()
    assert consumer % 8 == 0 and consumer <= gemm_ws.CONSUMER_REGS
    used = 2 * 128 * consumer + 128 * loader + 128 * -(-warps // 4) * regs
    assert 65536 - 256 * 8 < used <= 65536


def test_a_slices_block_range_is_not_specialised() -> None:
    """A slice's ``be_start`` / ``be_end`` change every launch: specialised (divisible by 16, or 1) they would compile
    new variants inside timed launches (session 57's profile read a first ws sample at 16x the GEMM's time)."""
    from kfuse.kernels.epilogue import Epilogue

    part = ws_partition.partition("histogram", {"BLOCK": 2048, "NBINS": 256})
    assert part.unspecialized == ("be_start", "be_end")
    fused = gemm_ws.module(Epilogue((), 0), partition=part).gemm_pingpong_kernel
    assert {p.name for p in fused.params if p.do_not_specialize} == {"be_start", "be_end"}
    alone = gemm_ws.module(Epilogue((), 0)).gemm_pingpong_kernel
    assert not any(p.do_not_specialize for p in alone.params)


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
out = {}
for name, consts, warps, block_m, *rest in json.loads(sys.argv[1]):
    k128 = 1 in rest
    opts = next((r for r in rest if isinstance(r, dict)), {})  # stencil7's blocks an iteration, or its TMA feed and ring
    unroll, feed, slots = opts.get("unroll", 1), opts.get("feed", "ldg"), opts.get("slots", 2)
    cfg = WsConfig(block_m=block_m, block_n=128, block_k=64, stages=4 if block_m == 128 else 6)
    if k128:  # ws_partition.PP64_K128_HOST
        cfg = WsConfig(block_m=block_m, block_n=128, block_k=128, stages=3)
    part = ws_partition.partition(name, consts, warps=warps, unroll=unroll, feed=feed, slots=slots) if name else None
    ck = gemm_ws.compile_offline(epi, 1000, 3072, 768, cfg, row_broadcast=(True,), fast_gelu=True, bias_mode="prefetch",
                                 partition=part)
    sass = ck.asm["sass"]
    facts = sass_facts(ck.asm["cubin"])
    facts.update(shared=ck.metadata.shared, warps=ck.metadata.num_warps, redg=sass.count("REDG.E.ADD"),
                 atoms=sass.count("ATOMS.ADD"), mufu_sin=sass.count("MUFU.SIN"), mufu_cos=sass.count("MUFU.COS"),
                 mufu=sass.count("MUFU."), ldg=sass.count("LDG.E"), stg=sass.count("STG.E"),
                 tma_loads=sass.count("UTMALDG"),
                 named_bars=sorted(set(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING (0x[0-9a-f]+, 0x[0-9a-f]+);", sass))),
                 maxnreg=sorted({int(v, 16) for v in re.findall(r"USETMAXREG\.[A-Z_.]+ (?:UP0, )?(0x[0-9a-f]+)", sass)}))
    out[f"{name or 'none'}_w{warps}_m{block_m}" + ("_k128" if k128 else "") + (f"_u{unroll}" if unroll > 1 else "")
        + (f"_tma{slots}" if feed == "tma" else "")] = facts
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    cases = [["", {}, 4, 128], ["", {}, 4, 64]]
    cases += [[name, consts, 4, 128] for name, consts in GPU_CONSTS.items()]
    cases += [[name, consts, 8, 64] for name, consts in GPU_CONSTS.items()]  # 8 BE warps on the 64 x 128 s6 host
    cases += [["", {}, 4, 64, 1], ["histogram", GPU_CONSTS["histogram"], 8, 64, 1]]  # the probe's K-step-128 host
    cases += [["stencil7", GPU_CONSTS["stencil7"], w, 64, {"unroll": u}] for w, u in ((8, 2), (4, 4))]  # stencil7 unrolled
    cases += [["stencil7", GPU_CONSTS["stencil7"], 4, 64]]  # and one block an iteration on the same host
    # fed by TMA: the deepest ring each host's shared memory leaves (ws_partition.tma_slots: 4 on the s6 host, 3 on pp128 s4)
    cases += [["stencil7", GPU_CONSTS["stencil7"], w, bm, {"feed": "tma", "slots": s}] for w, bm, s in ((8, 64, 4), (4, 128, 3))]
    cases += [["stencil7", GPU_CONSTS["stencil7"], 8, 64, {"feed": "tma", "slots": 2, "unroll": 2}]]  # two blocks an iteration
    return run_offline_script(_COMPILE, cases)


@pytest.mark.parametrize(("warps", "unroll"), [(8, 2), (4, 4)])
def test_unrolled_stencil7_holds_u_blocks_of_loads_without_spills(compiled: dict, warps: int, unroll: int) -> None:
    """U blocks an iteration: U x the loads and stores in the partition's code, issued before any is used, on the
    registers ``STENCIL7_UNROLL_REGS`` gives it, with the consumers left at least ``MIN_CONSUMER_REGS``."""
    alone, one, fused = compiled["none_w4_m64"], compiled[f"stencil7_w{warps}_m64"], compiled[f"stencil7_w{warps}_m64_u{unroll}"]
    assert fused["STL"] == 0 and fused["LDL"] == 0 and fused["LOCAL"] == 0
    assert fused["HGMMA"] == alone["HGMMA"] and fused["warps"] == 12 + warps
    assert fused["ldg"] - alone["ldg"] == unroll * (one["ldg"] - alone["ldg"])
    assert fused["stg"] - alone["stg"] == unroll * (one["stg"] - alone["stg"])
    part = ws_partition.partition("stencil7", GPU_CONSTS["stencil7"], warps=warps, unroll=unroll)
    assert part.regs == ws_partition.STENCIL7_UNROLL_REGS[unroll] and part.consumer_regs() >= ws_partition.MIN_CONSUMER_REGS
    assert {part.regs, part.consumer_regs()} <= set(fused["maxnreg"])


@pytest.mark.parametrize(("warps", "block_m", "slots", "unroll"), [(8, 64, 4, 1), (4, 128, 3, 1), (8, 64, 2, 2)])
def test_tma_fed_stencil7_reads_its_windows_by_tma(compiled: dict, warps: int, block_m: int, slots: int, unroll: int) -> None:
    """The TMA form: five box copies a block (each ring slot filled before the loop, one block a refill), LDG only for the
    x neighbours (a box cannot start off 16 bytes), a block ahead, its ring in the shared memory the host leaves, the slot's refill after
    a barrier of the partition's warps only (a CTA-wide one would wait for the GEMM's warps forever), and no spills on
    ``STENCIL7_TMA_REGS``. With U blocks an iteration: U x the copies and loads, a slot U blocks' windows."""
    u = f"_u{unroll}" if unroll > 1 else ""
    alone, fused = compiled[f"none_w4_m{block_m}"], compiled[f"stencil7_w{warps}_m{block_m}{u}_tma{slots}"]
    assert fused["STL"] == 0 and fused["LDL"] == 0 and fused["LOCAL"] == 0
    assert fused["HGMMA"] == alone["HGMMA"] and fused["warps"] == 12 + warps
    assert fused["tma_loads"] - alone["tma_loads"] == 5 * unroll * (slots + 1)
    # x - 1 and x + 1 by LDG, a scalar load an element (off 16 bytes): 8 x 64 points over the partition's threads, once
    # for the first block before the loop and once in it for the next block (issued before this block's wait)
    assert fused["ldg"] - alone["ldg"] == unroll * 2 * 2 * (8 * 64) // (32 * warps) and fused["stg"] > alone["stg"]
    ring = slots * ws_partition.tma_slot_bytes(GPU_CONSTS["stencil7"], unroll)
    assert abs(fused["shared"] - alone["shared"] - ring) <= 1024 and fused["shared"] <= gemm_ws.SMEM_LIMIT
    own = {b for b in fused["named_bars"] if b not in alone["named_bars"]}
    assert own and all(b.endswith(f", {32 * warps:#x}") for b in own)
    part = ws_partition.partition("stencil7", GPU_CONSTS["stencil7"], warps=warps, unroll=unroll, feed="tma", slots=slots)
    assert part.regs == ws_partition.STENCIL7_TMA_REGS[unroll] and {part.regs, part.consumer_regs()} <= set(fused["maxnreg"])


_COMPILE_ALONE = r"""
import json, sys
import torch, triton
from cubin_facts import sass_facts
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from kfuse.colocate import ws_partition as w
from kfuse.kernels.codegen import load_generated

mod = load_generated("ws_tma_alone", "stencil7", w._TMA_ALONE.format(source=w._STENCIL7_TMA, setup=w.TMA_SETUP))
consts = {"BY": 8, "BX": 64}
desc = w.tma_source(torch.empty(16, 32, 64), consts)
out = {}
for unroll, slots in json.loads(sys.argv[1]):
    sig = {"be_src_desc": mangle_type(desc), "src": "*fp32", "dst": "*fp32", "nx": "i32", "ny": "i32", "nz": "i32", "c0": "fp32",
           "c1": "fp32", "start": "i32", "end": "i32"}
    ce = {"NUM_PROGRAMS": 132, "BE_BY": 8, "BE_BX": 64, "WARPS": 8, "WR": 4, "BE_SLOTS": slots, "BE_U": unroll}
    sig.update({k: "constexpr" for k in ce})
    ck = triton.compile(GluonASTSource(mod.stencil7_tma_alone, sig, constexprs=ce), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 8})
    facts = sass_facts(ck.asm["cubin"])
    sass = ck.asm["sass"]
    facts.update(shared=ck.metadata.shared, tma_loads=sass.count("UTMALDG"), ldg=sass.count("LDG.E"), stg=sass.count("STG.E"))
    out[f"u{unroll}_s{slots}"] = facts
print(json.dumps(out))
"""


@pytest.mark.parametrize(("unroll", "slots"), [(1, 4), (2, 2)])
def test_the_tma_form_alone_compiles_with_its_ring_and_u_blocks_an_iteration(unroll: int, slots: int) -> None:
    """``launch_tma_alone``'s kernel (the partition's code with no GEMM, which ``ws_tma_check.py`` runs first on the GPU),
    offline for sm_90: 5 U copies a fill (the ring's first SLOTS fills and the loop's refill), U x the x-neighbour loads
    and stores, the ring's U-block slots in shared memory, no spills."""
    facts = run_offline_script(_COMPILE_ALONE, [[unroll, slots]])[f"u{unroll}_s{slots}"]
    assert facts["STL"] == 0 and facts["LDL"] == 0 and facts["LOCAL"] == 0
    assert facts["tma_loads"] == 5 * unroll * (slots + 1)
    assert facts["ldg"] == unroll * 2 * 2 * (8 * 64) // (32 * 8) and facts["stg"] == unroll * (8 * 64) // (32 * 8)
    ring = slots * ws_partition.tma_slot_bytes({"BY": 8, "BX": 64}, unroll)
    assert ring <= facts["shared"] <= ring + 1024


def test_the_k128_host_keeps_the_s6_hosts_shared_memory_and_spills_nothing(compiled: dict) -> None:
    from kfuse.colocate.ws_partition import PP64_K128_HOST

    assert PP64_K128_HOST[1].block_k == 128 and PP64_K128_HOST[1].stages == 3
    s6, k128, fused = compiled["none_w4_m64"], compiled["none_w4_m64_k128"], compiled["histogram_w8_m64_k128"]
    assert abs(k128["shared"] - s6["shared"]) <= 1024  # 3 x (64 + 128) x 128 halves = 6 x (64 + 128) x 64
    assert fused["STL"] == 0 and fused["LDL"] == 0 and fused["LOCAL"] == 0
    assert fused["HGMMA"] == k128["HGMMA"] == 2 * s6["HGMMA"]  # twice the K a step: twice the wgmma a step
    assert fused["warps"] == 20 and fused["redg"] > 0


@pytest.mark.parametrize(("be", "warps", "block_m"), [(be, 4, 128) for be in GPU_CONSTS] + [(be, 8, 64) for be in GPU_CONSTS])
def test_sm90_fused_kernel_keeps_the_gemm_and_runs_the_be_without_spills(compiled: dict, be: str, warps: int, block_m: int) -> None:
    alone, fused = compiled[f"none_w4_m{block_m}"], compiled[f"{be}_w{warps}_m{block_m}"]
    assert fused["STL"] == 0 and fused["LDL"] == 0 and fused["LOCAL"] == 0
    assert fused["HGMMA"] == alone["HGMMA"] > 0 and fused["tma_loads"] == alone["tma_loads"] > 0
    assert fused["warps"] == 12 + warps  # 4 + 4 consumer warps, the loader's warpgroup, the BE's
    assert fused["shared"] - alone["shared"] <= 2048  # the BE adds its scratch at most, the ring is the GEMM's
    part = ws_partition.partition(be, GPU_CONSTS[be], warps=warps)
    assert {LOADER_REGS, part.regs, part.consumer_regs()} <= set(fused["maxnreg"])
    if be == "histogram":  # counts in shared memory, one global atomic per bin; its barriers name the partition's threads
        assert fused["atoms"] > 0 and fused["redg"] > 0 and alone["redg"] == 0
        own = {b for b in fused["named_bars"] if b not in alone["named_bars"]}
        assert own and all(b.endswith(f", {32 * warps:#x}") for b in own)
    elif be == "mriq":  # sin and cos on the MUFU, which the GEMM's wgmma leaves idle
        assert fused["mufu_sin"] > 0 and fused["mufu_cos"] > 0 and alone["mufu_sin"] == 0
    elif be == "stencil7":  # seven loads and a store a point, by pointers beside the GEMM's TMA
        assert fused["ldg"] >= alone["ldg"] + 7 and fused["stg"] > alone["stg"]
    else:  # cutcp: the square root on the MUFU
        assert fused["mufu"] > alone["mufu"] and fused["stg"] > alone["stg"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("warps", "unroll", "block_m", "feed"),
    [(4, 1, 128, "ldg"), (8, 2, 64, "ldg"), (4, 4, 64, "ldg")],  # the TMA form: the file's last test
)
def test_unrolled_stencil7_runs_any_block_range_beside_the_gemm(warps: int, unroll: int, block_m: int, feed: str) -> None:
    """The GPU-sized stencil7 (its partition needs 16-column warps) in two launches split at a block that is no multiple
    of U x the programs: each launch's last iteration holds blocks past ``end``, which must not be written. TMA-fed: the
    ring's prefetch must stop at ``end`` too, and the windows at the volume's faces read TMA's zero fill."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import reference

    dev = torch.device("cuda")
    m, n, k = 1000, 776, 328
    a = torch.randn(m, k, device=dev).half()
    b = torch.randn(k, n, device=dev).half() / 16
    bias = torch.randn(n, device=dev).half()
    epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
    ref = reference(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16).float()
    work = workloads.make("stencil7", device=dev)
    work.reset()
    cfg = WsConfig(block_m=block_m, block_n=128, block_k=64, stages=4 if block_m == 128 else 6)
    split = 12345
    slots = ws_partition.tma_slots(cfg, work.kernel.consts, unroll if feed == "tma" else 1) or 2
    for start, end in ((0, split), (split, work.kernel.n_blocks)):
        c = torch.full((1, m, n), float("nan"), device=dev, dtype=torch.float16)
        ws_partition.launch_fused(a.view(1, m, k), b.view(1, k, n), c, [bias.view(1, 1, n).expand(1, m, n)], epi, cfg, work, start,
                                  end, 132, warps=warps, unroll=unroll, feed=feed, slots=slots)  # fmt: skip
        assert (c[0].float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()
        if start == 0:  # the first launch wrote its blocks' whole planes and nothing past its blocks: the rest is still poisoned
            nz, ny, nx = work.output().shape
            planes = split // ((ny // 8) * (nx // 64))  # 8 x 64 blocks, x fastest, then y, then z
            assert torch.isnan(work.output()[planes + 1 :]).all() and not torch.isnan(work.output()[:planes]).any()
    assert workloads.error(work) <= max(work.tol, 1e-3)


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


# ---- the "ws" version in the co-location experiment (lc_items(gemms="plan-ws"), the profile, the CUDA backend) ----


@pytest.fixture(scope="module")
def compiled_block() -> tuple:
    import kfuse

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(3, 11, 40)
    return kfuse.compile(model, (x,), {}, backend="torch", fuse_b2b=False), x


def test_ws_is_a_version_that_applies_to_hosting_plan_gemms_only() -> None:
    from kfuse.colocate.fuser import TAIL, WS, applies, green, parse_version
    from kfuse.colocate.scheduler import LCKernel

    assert parse_version("ws") == WS and WS.describe() == "ws"
    host, ptb_gemm, segment = LCKernel("h", True, "k", host=True), LCKernel("g", True, "k2"), LCKernel("s", False, "k3")
    assert applies(WS, host) and not applies(WS, ptb_gemm) and not applies(WS, segment)
    assert applies(TAIL, ptb_gemm) and not applies(TAIL, host) and not applies(TAIL, segment)
    assert all(applies(green(32), k) for k in (host, ptb_gemm, segment))


def test_plan_ws_keeps_the_plans_kernels_and_hosts_where_the_pingpong_kernel_runs(compiled_block: tuple, monkeypatch) -> None:
    from kfuse.colocate.lc import lc_items, ws_host_summary

    compiled, x = compiled_block
    plan = lc_items(compiled, (x,), {}, gemms="plan")
    on_cpu = lc_items(compiled, (x,), {}, gemms="plan-ws")
    # the same kernels as the plan's; on the CPU the ping-pong kernel cannot run, so nothing hosts
    assert [(i.name, i.key) for i in on_cpu] == [(i.name, i.key) for i in plan]
    assert all(i.host is None and i.kernel is None for i in on_cpu) and ws_host_summary(on_cpu) == {}
    monkeypatch.setattr(gemm_ws, "ws_eligible", lambda a, b, c, split_k=1: None)
    items = lc_items(compiled, (x,), {}, gemms="plan-ws")
    hosts = [i for i in items if i.host is not None]
    assert [i.name for i in hosts] == [i.name for i in plan if i.ops[0] == "matmul"] and len(hosts) == 2  # the norm hosts nothing
    h1, h2 = hosts[0].host, hosts[1].host
    assert h1.a.shape == (1, 33, 40) and h1.b.shape == (1, 40, 56) and h1.c.shape == (1, 33, 56)
    assert [s.op for s in h1.epi.steps] == ["add", "gelu"] and len(h1.extras) == 1 and h1.extras[0].stride(1) == 0  # the bias row
    assert h2.a.shape == (1, 33, 56) and h2.b.shape == (1, 56, 40)
    assert h1.c.data_ptr() != hosts[0].host.a.data_ptr()  # its own output buffer
    assert all(i.fusible for i in hosts) and not any(i.fusible for i in items if i.host is None)
    assert sum(h["count"] for h in ws_host_summary(items).values()) == 2


def test_a_host_chooses_its_tile_per_be_kernel_by_time_once() -> None:
    from kfuse.colocate.ws_partition import HOST_TILES, WsHost

    timed: list[str] = []
    launched: list[tuple[str, int, int]] = []
    host = WsHost("g", None, None, None, [], None, 132, time_ms=lambda fn: (fn(), 3.0 - len(timed))[1])

    def fake_launch(tile, work, start, end):  # noqa: ANN001, ANN202
        timed.append(tile[0])
        launched.append((tile[0], start, end))

    host.launch = fake_launch  # type: ignore[method-assign]
    work = workloads.make("histogram", small=True)  # 128-input blocks: a partition of 4 warps, not of 8 (256 lanes)
    host.fused(work, 2, 5)
    assert timed == [f"{t[0]} w4" for t in HOST_TILES] + [f"{HOST_TILES[-1][0]} w4"]  # each candidate once, then the run
    assert host.chosen["histogram"][0] == f"{HOST_TILES[-1][0]} w4"  # the fastest (the fake clock falls)
    assert launched[-1] == (f"{HOST_TILES[-1][0]} w4", 2, 5)
    host.fused(work, 5, 9)
    assert len(timed) == len(HOST_TILES) + 2 and launched[-1][1:] == (5, 9)  # no second choice
    with pytest.raises(ValueError, match="no worker partition"):
        WsHost("g", None, None, None, [], None, 132, warps=(8,)).choose(work)
    from types import SimpleNamespace

    gpu_sized = SimpleNamespace(name="histogram", kernel=SimpleNamespace(consts={"BLOCK": 2048, "NBINS": 256}, n_blocks=10))
    labels = [c[0] for c in WsHost("g", None, None, None, [], None, 132, warps=(4, 8)).candidates(gpu_sized)]
    assert labels == [f"{t[0]} w{w}" for w in (4, 8) for t in HOST_TILES if w == 4 or t[1].block_m == 64]


def test_a_host_never_chooses_a_candidate_whose_fused_launch_is_wrong() -> None:
    """With ``check`` (the GPU's hosts), each candidate first runs the whole BE kernel beside the GEMM, both outputs
    poisoned and compared with their references; a wrong one is reported and never timed or chosen, even where it
    would be the fastest, and a histogram's counts are left as they were before the choice."""
    from kfuse.colocate.ws_partition import HOST_TILES, WsHost
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand, apply_reference

    m, n, k = 5, 7, 3
    a, b, bias = torch.randn(1, m, k), torch.randn(1, k, n), torch.randn(1, 1, n)
    epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)
    good_c = apply_reference(a @ b, [bias], epi)
    timed: list[str] = []
    host = WsHost("g", a, b, torch.empty(1, m, n), [bias], epi, 132, time_ms=lambda fn: (fn(), 3.0 - len(timed))[1], check=True)
    bad = f"{HOST_TILES[-1][0]} w4"  # the last candidate, the fastest by the falling fake clock

    def fake_launch(cand, work, start, end):  # noqa: ANN001, ANN202
        timed.append(cand[0])
        host.c.copy_(good_c)
        if (start, end) == (0, work.kernel.n_blocks):
            work.output().copy_(work.reference() + (1 if cand[0] == bad else 0))

    host.launch = fake_launch  # type: ignore[method-assign]
    work = workloads.make("histogram", small=True)
    work.reset()
    before = work.output().clone()
    chosen = host.choose(work)
    assert chosen[0] == f"{HOST_TILES[0][0]} w4" and list(host.rejected["histogram"]) == [bad]
    assert "histogram error" in host.rejected["histogram"][bad]
    assert torch.equal(work.output(), before)  # the checks' and timings' counts taken back
    assert timed == [chosen[0], bad]  # each checked once; the one right candidate left needs no timing
    with pytest.raises(RuntimeError, match="wrong result"):  # no candidate right: no choice at all
        host.launch = lambda cand, w, s, e: host.c.fill_(float("nan"))  # type: ignore[method-assign]
        host.chosen.clear()
        host.choose(work)


def test_stencil7_hosts_offer_unrolled_partitions_where_the_consumers_keep_their_registers() -> None:
    from types import SimpleNamespace

    from kfuse.colocate.ws_partition import HOST_TILES, WsHost

    stencil = SimpleNamespace(name="stencil7", kernel=SimpleNamespace(consts={"BY": 8, "BX": 64}, n_blocks=10))
    labels = [c[0] for c in WsHost("g", None, None, None, [], None, 132, warps=(4, 8), unrolls=(1, 2, 4)).candidates(stencil)]
    s6, s4 = (t[0] for t in HOST_TILES)
    # 8 warps with 4 blocks an iteration would leave the consumers 64 registers: not offered
    assert labels == [f"{s6} w4", f"{s4} w4", f"{s6} w4 u2", f"{s4} w4 u2", f"{s6} w4 u4", f"{s4} w4 u4", f"{s6} w8", f"{s6} w8 u2"]
    histogram = SimpleNamespace(name="histogram", kernel=SimpleNamespace(consts={"BLOCK": 2048, "NBINS": 256}, n_blocks=10))
    assert all(" u" not in c[0] for c in WsHost("g", None, None, None, [], None, 132, unrolls=(1, 2)).candidates(histogram))
    assert ws_partition.parse_unrolls("1, 2,4") == (1, 2, 4)
    for bad in ("", "3", "1,x"):
        with pytest.raises(ValueError, match="--ws-unroll"):
            ws_partition.parse_unrolls(bad)
    with pytest.raises(ValueError, match="only stencil7"):
        ws_partition.partition("histogram", {"BLOCK": 2048, "NBINS": 256}, unroll=2)
    with pytest.raises(ValueError, match="unroll is one of"):
        ws_partition.partition("stencil7", {"BY": 8, "BX": 64}, unroll=3)


def test_the_backend_runs_the_ws_version_through_the_host_and_refuses_it_elsewhere() -> None:
    from kfuse.colocate.cuda_backend import CudaBackend
    from kfuse.colocate.fuser import TAIL, WS
    from kfuse.colocate.lc import LCItem

    calls: list[tuple[str, int, int]] = []

    class Host:
        def choose(self, w: workloads.Workload) -> None:
            calls.append((f"choose {w.name}", 0, 0))

        def fused(self, w: workloads.Workload, start: int, end: int) -> None:
            calls.append((w.name, start, end))

    work = workloads.make("histogram", small=True)
    items = [LCItem("g0", None, lambda: None, "k", ("matmul",), host=Host()), LCItem("s0", None, lambda: None, "s", ("relu",))]
    backend = CudaBackend(items, {"histogram": work}, graph_segments=False)
    assert calls == [("choose histogram", 0, 0)]  # the host's tile chosen before any timed launch
    calls.clear()
    assert [k.host for k in backend.lc_kernels()] == [True, False] and [k.fusible for k in backend.lc_kernels()] == [True, False]
    backend.run_fused(0, "histogram", 1, 3, WS)
    assert calls[0] == ("histogram", 1, 3)
    with pytest.raises(ValueError, match="hosts no worker partition"):
        backend.run_fused(1, "histogram", 0, 1, WS)
    with pytest.raises(ValueError, match="not a PTB GEMM"):
        backend.run_fused(0, "histogram", 0, 1, TAIL)


def test_the_profile_measures_the_ws_version_on_hosts_only() -> None:
    from kfuse.colocate import scheduler as S
    from kfuse.colocate.fuser import TAIL, WS
    from kfuse.colocate.sim import SimGPU

    class HostSim(SimGPU):
        def lc_kernels(self) -> list[S.LCKernel]:  # the fusible kernels are plan GEMMs that host a partition
            return [S.LCKernel(k.name, k.fusible, k.key, host=k.fusible) for k in super().lc_kernels()]

    sim = HostSim([0.02, 0.01, 0.02], [True, False, True], {"histogram": (0.002, 0.0001, 4000)}, keys=["g", "s", "g"])
    prof = S.build_profile(sim, ["histogram"], [WS, TAIL], reps=1)
    assert set(prof.fused) == {("g", "histogram")} and set(prof.fused[("g", "histogram")]) == {WS}


def test_repeated_layers_share_one_host_tile_choice(monkeypatch) -> None:
    import kfuse
    from kfuse.colocate.lc import lc_items

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(40, 40), torch.nn.Linear(40, 40)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.b(torch.relu(self.a(x))))

    x = torch.randn(5, 40)
    compiled = kfuse.compile(Twice().eval(), (x,), {}, backend="torch", fuse_b2b=False)
    monkeypatch.setattr(gemm_ws, "ws_eligible", lambda a, b, c, split_k=1: None)
    hosts = [i for i in lc_items(compiled, (x,), {}, gemms="plan-ws") if i.host is not None]
    assert len(hosts) == 2 and hosts[0].key == hosts[1].key
    assert hosts[0].host.chosen is hosts[1].host.chosen and hosts[0].host.a is not hosts[1].host.a
    hosts[0].host.choose(workloads.make("histogram", small=True))  # no timer on the CPU: the first tile
    assert hosts[1].host.chosen["histogram"][0] == f"{ws_partition.HOST_TILES[0][0]} w4"


def test_warp_counts_parse_or_are_refused_by_name() -> None:
    assert ws_partition.parse_warps("4,8") == (4, 8) and ws_partition.parse_warps(" 8 ") == (8,)
    for bad in ("", "6", "4,x", "4,16"):
        with pytest.raises(ValueError, match="--ws-warps takes 4 and / or 8"):
            ws_partition.parse_warps(bad)


def test_a_host_chooses_by_the_sum_over_its_choice_slices() -> None:
    """Session 57's probe: 8 BE warps lose a little at one block a program and win at four (histogram). The choice is
    timed at each of ``choice_slices`` and takes the smallest sum, so the four-block slice can outvote the one-block."""
    from types import SimpleNamespace

    from kfuse.colocate.ws_partition import WsHost

    work = SimpleNamespace(name="histogram", idempotent=True, kernel=SimpleNamespace(consts={"BLOCK": 2048, "NBINS": 256}, n_blocks=10_000))
    cost = {(4, 132): 10.0, (8, 132): 10.5, (4, 528): 20.0, (8, 528): 14.0}  # (warps, blocks) -> us; the tile adds nothing
    current: list[tuple[int, int]] = []
    host = WsHost("g", None, None, None, [], None, 132, time_ms=lambda fn: (fn(), cost[current[-1]])[1])
    host.launch = lambda cand, w, start, end: current.append((cand[3], end))  # type: ignore[method-assign]
    assert host.choose(work)[3] == 8  # 24.5 against 30 in sum, though 4 warps win the one-block slice
    assert set(host.times["histogram"]) == {f"{c[0]} S{s}" for c in host.candidates(work) for s in (1, 4)}
    one_block = WsHost("g", None, None, None, [], None, 132, choice_slices=(1,), time_ms=host.time_ms)
    one_block.launch = host.launch  # type: ignore[method-assign]
    assert one_block.choose(work)[3] == 4


def test_choosing_a_host_tile_leaves_a_non_idempotent_be_output_as_it_was(monkeypatch) -> None:
    """The tile choice times fused launches of BE blocks [0, n): a histogram's atomics would count them on top of the
    slices already run (the GPU test of session 57 read 522 extra counts). The launch here is the histogram's PTB
    kernel (in the interpreter, or on the GPU where there is one), each candidate timed three times."""
    import kfuse
    from kfuse.colocate.lc import lc_items
    from kfuse.colocate.ptb import launch_ptb

    x = torch.randn(5, 40)
    compiled = kfuse.compile(torch.nn.Linear(40, 40).eval(), (x,), {}, backend="torch")
    monkeypatch.setattr(gemm_ws, "ws_eligible", lambda a, b, c, split_k=1: None)
    host = next(i.host for i in lc_items(compiled, (x,), {}, gemms="plan-ws") if i.host is not None)
    # a GPU test run has no interpreter: the PTB kernel then runs on the GPU's copy of the workload
    work = workloads.make("histogram", small=True, device="cuda" if torch.cuda.is_available() else "cpu")
    launches: list[tuple[int, int]] = []

    def launch(cand, w, start, end) -> None:
        launches.append((start, end))
        launch_ptb(w.kernel, start, end, grid=2)

    monkeypatch.setattr(host, "launch", launch)
    host.time_ms = lambda fn: [fn() for _ in range(3)] and 1.0
    work.reset()
    launch_ptb(work.kernel, 0, 1, grid=2)  # a slice the scheduler ran before the choice
    before = work.output().clone()
    assert before.sum().item() > 0
    host.choose(work)
    sizes = {min(work.kernel.n_blocks, s * host.num_programs) for s in host.choice_slices}
    assert len(launches) == 3 * len(host.candidates(work)) * len(sizes)
    assert {end for _, end in launches} == sizes
    assert torch.equal(work.output(), before)
    launch_ptb(work.kernel, 1, work.kernel.n_blocks, grid=2)
    assert workloads.error(work) == 0.0


@pytest.mark.gpu
def test_the_ws_version_runs_a_compiled_models_gemm_step_and_the_be_slice_correctly() -> None:
    """On an sm_90 GPU: a kfuse-compiled model's GEMM steps host a BE slice (``lc_items(gemms="plan-ws")``), and the
    backend's ``ws`` launch writes the step's output (against the fp32 reference of its own operands) and the BE
    kernel's blocks (the whole kernel in one launch, against its reference)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    import kfuse
    from kfuse.colocate.cuda_backend import CudaBackend
    from kfuse.colocate.fuser import WS
    from kfuse.colocate.lc import lc_items
    from kfuse.kernels.gemm import reference

    torch.manual_seed(0)
    model = Block().cuda().half().eval()
    x = torch.randn(3, 11, 40, device="cuda", dtype=torch.float16)
    compiled = kfuse.compile(model, (x,), {}, fuse_b2b=False)
    items = lc_items(compiled, (x,), {}, gemms="plan-ws")
    hosts = [i for i, it in enumerate(items) if it.host is not None]
    assert hosts, "no GEMM step hosts a worker partition"
    work = workloads.make("histogram", small=True, device="cuda")
    backend = CudaBackend(items, {"histogram": work})
    for i in hosts:
        h = items[i].host
        h.c.fill_(float("nan"))
        work.reset()
        backend.run_fused(i, "histogram", 0, work.kernel.n_blocks, WS)
        torch.cuda.synchronize()
        ref = reference(h.a[0], h.b[0], [e[0] for e in h.extras], h.epi, h.c.dtype).float()
        assert (h.c[0].float() - ref).abs().max().item() <= 2e-2 * max(1.0, ref.abs().max().item())
        assert workloads.error(work) == 0.0
        assert items[i].host.chosen["histogram"][1] in {t[1] for t in ws_partition.HOST_TILES}


# last in the file: a fault in the TMA form (session 59's first form faulted with an illegal instruction) loses the CUDA
# context, and every GPU test after it in the process with it
@pytest.mark.gpu
@pytest.mark.parametrize(("warps", "unroll", "block_m"), [(8, 1, 64), (4, 1, 128), (8, 2, 64)])
def test_tma_fed_stencil7_runs_any_block_range_beside_the_gemm(warps: int, unroll: int, block_m: int) -> None:
    """Two blocks an iteration too: the split (12345, odd) leaves a last group with one block live, whose slot's mbarrier
    must complete on the dead block's bare arrival."""
    test_unrolled_stencil7_runs_any_block_range_beside_the_gemm(warps, unroll, block_m, "tma")
