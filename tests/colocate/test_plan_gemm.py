"""The PTB form of a compiled plan's GEMM steps (``kfuse.colocate.plan_gemm``, ``lc_items(gemms="plan-ptb")``): kfuse's
own template with the step's tile, operands and epilogue, one output tile a block; any block range on any grid, alone
or fused beside a BE kernel, writes exactly the plan step's output."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import kfuse
from kfuse.colocate import fuser, plan_gemm, workloads
from kfuse.colocate.lc import lc_items
from kfuse.colocate.ptb import launch_ptb
from kfuse.ir.graph import Node
from kfuse.kernels.gemm import GemmConfig
from kfuse.runtime.executor import plan_values


class Block(torch.nn.Module):
    """Two GEMMs with epilogues (bias + GELU; bias + residual) on shapes no tile divides, then a norm (not a GEMM)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(40, 56)
        self.fc2 = torch.nn.Linear(56, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x + self.fc2(F.gelu(self.fc1(x))), (40,))


@pytest.fixture(scope="module")
def compiled_block() -> tuple:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = Block().to(device, dtype).eval()
    x = torch.randn(3, 11, 40, device=device, dtype=dtype)
    # no back-to-back fusion: the two GEMMs stay two gemm_epilogue steps
    compiled = kfuse.compile(model, (x,), {}, backend="torch" if device == "cpu" else "triton", fuse_b2b=False)
    variant = next(iter(compiled.variants.values()))
    env = plan_values(variant.plan, variant.imported.graph_inputs(pytree.tree_leaves(((x,), {}))))
    return compiled, x, variant.plan, env


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.reshape(want.shape).double().cpu(), want.double().cpu()
    tol = 1e-4 if want.dtype == torch.float32 else 2e-2
    assert not torch.isnan(got).any()
    assert (got - want).abs().max() <= tol * max(1.0, want.abs().max().item())


def _splits(n: int, rng: random.Random) -> list[tuple[int, int]]:
    cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(3))})
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def test_every_gemm_step_becomes_its_templates_block_kernel(compiled_block: tuple) -> None:
    compiled, x, plan, env = compiled_block
    items = lc_items(compiled, (x,), {}, gemms="plan-ptb")
    kernels = [it for it in items if it.kernel is not None]
    assert len(kernels) == 2  # fc1 (bias + GELU) and fc2 (bias + residual)
    rng = random.Random(1)
    for it in kernels:
        k = it.kernel
        assert k.fn in ("gemm_tile", "gemm_tma_tile") and k.module.startswith("kfuse_gen_gemm2_")
        assert k.meta["programs_per_sm"] in (1, 2)
        assert it.key.startswith(f"1x33x{k.meta['N']}x{k.meta['K']}:")
        out = plan_gemm.output(k)
        out.fill_(float("nan"))  # poisoned: every element must be written by some block
        for s, e in _splits(k.n_blocks, rng):
            launch_ptb(k, s, e, grid=rng.randint(1, 5))
        _close(out, env[it.name])


def test_other_steps_stay_the_plans_segments(compiled_block: tuple) -> None:
    compiled, x, _, _ = compiled_block
    plan = lc_items(compiled, (x,), {}, gemms="plan")
    ptb = lc_items(compiled, (x,), {}, gemms="plan-ptb")
    assert [it.ops for it in plan] == [it.ops for it in ptb]
    assert any(b.kernel is None for b in ptb)  # the norm
    for a, b in zip(plan, ptb, strict=True):
        assert a.kernel is None and a.run is not None  # "plan": every GEMM a segment of its own
        if b.kernel is None:  # the same segment in both forms
            assert b.key == a.key
            b.run()


@pytest.mark.parametrize(
    ("config", "form", "note"),
    [
        (GemmConfig(16, 32, 16, 2, 4, 1, tma=True), "tma", None),
        (GemmConfig(48, 24, 16, 2, 4, 1, tma=True, ws="pingpong"), "tma", "Gluon pingpong kernel -> Triton TMA tile 32x16"),
        (GemmConfig(16, 16, 16, 2, 4, 1, split_k=3), "pointers", "split-K 3 -> 1"),
    ],
)
def test_a_tuned_tile_keeps_its_form_or_says_what_changed(compiled_block: tuple, config: GemmConfig, form: str, note: str | None) -> None:
    _, _, plan, env = compiled_block
    nodes = {n.name: n for n in plan.graph.nodes}
    step = next(s for s in plan.steps if s.output in nodes and nodes[s.output].op == "gemm_epilogue")
    node = nodes[step.output]
    tuned = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "config": config})
    xs = [env[i] for i in step.inputs]
    k, info = plan_gemm.plan_gemm_kernel(tuned, plan.graph, xs)
    aligned = xs[0].stride(-2) * xs[0].element_size() % 16 == 0  # 40 fp32 / fp16 elements: TMA can describe A
    assert info.form == (form if aligned else "pointers")
    assert info.plan_config == config.describe()
    if note:
        assert note in info.changed and note in info.describe()
    out = plan_gemm.output(k)
    out.fill_(float("nan"))
    launch_ptb(k, 0, k.n_blocks, grid=3)
    _close(out, env[step.output])


@pytest.mark.parametrize("version", ["tail", "1:1"])
def test_fused_beside_a_be_kernel_the_plan_step_is_unchanged(compiled_block: tuple, version: str) -> None:
    compiled, x, _, env = compiled_block
    it = next(i for i in lc_items(compiled, (x,), {}, gemms="plan-ptb") if i.kernel is not None)
    lc = it.kernel
    be = workloads.make("histogram", small=True, device=plan_gemm.output(lc).device)
    out = plan_gemm.output(lc)
    out.fill_(float("nan"))
    be.reset()  # histogram accumulates into its bins
    fuser.launch_fused(lc, be.kernel, fuser.parse_version(version), (0, lc.n_blocks), (0, be.kernel.n_blocks), sms=2)
    _close(out, env[it.name])
    assert workloads.error(be) < 1e-3  # the BE blocks did their work too


def test_the_lcs_grid_follows_each_kernels_programs_per_sm(compiled_block: tuple) -> None:
    """A plan tile that fits one program an SM gets a grid of one an SM (two would queue half the grid behind the
    first wave), in the solo launch, on a partition and in the tail-fill fused launch."""
    from kfuse.colocate.cuda_backend import CudaBackend

    compiled, x, _, _ = compiled_block
    items = lc_items(compiled, (x,), {}, gemms="plan-ptb")
    k = next(i.kernel for i in items if i.kernel is not None)
    backend = CudaBackend(items, {}, graph_segments=False)
    k.meta["programs_per_sm"] = 1
    assert backend.lc_grid_of(k) == backend.sms and backend.lc_grid_of(k, 7) == 7
    be = workloads.make("histogram", small=True, device=plan_gemm.output(k).device)
    grid, _, _ = fuser.launch_args(k, (0, k.n_blocks), be.kernel, (0, 1), fuser.TAIL, sms=10)
    assert grid == 10
    k.meta["programs_per_sm"] = 2
    assert backend.lc_grid_of(k) == 2 * backend.sms
    assert fuser.launch_args(k, (0, k.n_blocks), be.kernel, (0, 1), fuser.TAIL, sms=10)[0] == 20


def test_not_a_gemm_node_is_refused(compiled_block: tuple) -> None:
    _, _, plan, env = compiled_block
    node = next(n for n in plan.graph.nodes if n.op == "gemm_epilogue")
    other = Node(node.name, "relu", node.inputs, node.type, node.attrs)
    with pytest.raises(ValueError, match="not gemm_epilogue"):
        plan_gemm.plan_gemm_kernel(other, plan.graph, [env[i] for i in node.inputs])


def test_fit_stages_cuts_the_ring_until_the_blocks_share_an_sm() -> None:
    # BERT-base's tuned tiles on the H100 (the shipped records): 4 stages, 160-213 KB, one block an SM
    big = GemmConfig(128, 128, 64, 8, 4, 4, tma=True)
    assert plan_gemm.tile_shared_bytes(big, 2, tma_store=True) == 163840
    assert plan_gemm.fit_stages(big, 2, 2, tma_store=True).num_stages == 2  # 98 KB: two an SM
    assert plan_gemm.fit_stages(big, 1, 2, tma_store=True) == big  # one an SM: nothing to cut
    wide_k = GemmConfig(64, 128, 128, 8, 4, 4, tma=True)
    assert plan_gemm.fit_stages(wide_k, 2, 2, tma_store=True).num_stages == 2  # 114,688 B of 115,648 an SM half
    assert plan_gemm.fit_stages(wide_k, 4, 2, tma_store=True).num_stages == plan_gemm.MIN_STAGES  # never below two
    small = GemmConfig(64, 64, 32, 8, 4, 3)
    assert plan_gemm.fit_stages(small, 2, 2, tma_store=False) == small


@pytest.fixture(scope="module")
def bert_ffn1_node() -> tuple:
    """BERT-base B8 S128's FFN1 step (1024 x 3072 x 768, bias + GELU) in fp16, as a plan holds it."""

    class Ffn1(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(768, 3072)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.gelu(self.fc(x))

    x = torch.randn(8, 128, 768).half()
    compiled = kfuse.compile(Ffn1().half().eval(), (x,), {}, backend="torch", fuse_b2b=False)
    variant = next(iter(compiled.variants.values()))
    env = plan_values(variant.plan, variant.imported.graph_inputs([x]))
    node = next(n for n in variant.plan.graph.nodes if n.op == "gemm_epilogue")
    step = next(s for s in variant.plan.steps if s.output == node.name)
    return variant.plan, node, [env[i] for i in step.inputs]


@pytest.mark.slow
def test_the_plans_tiles_take_an_sm_and_the_cut_ones_share_it(bert_ffn1_node: tuple) -> None:
    """Offline sm_90 compiles (session 55): the plan's tuned tile for this shape (the Gluon ping-pong kernel's
    128 x 192 x 64, four stages, on Triton's 128 x 128 TMA tile) takes 160 KB of shared memory, one block an SM, and
    so does its fused kernel beside a BE kernel; with its stages cut for two (``plan-ptb2``) the tile and the fused
    kernel hold two, so an LC block and a BE block can share an SM."""
    pytest.importorskip("elftools")  # the register count comes from the cubin (session 55's GPU run had no pyelftools)
    from kfuse.colocate.occupancy import fused_occupancy, ptb_occupancy
    from kfuse.colocate.workloads import hotspot

    plan, node, xs = bert_ffn1_node
    tuned = Node(node.name, node.op, node.inputs, node.type,
                 {**node.attrs, "config": GemmConfig(128, 192, 64, 8, 4, 4, tma=True, ws="pingpong", shared_c=True)})  # fmt: skip
    be = hotspot.make(False, torch.device("cpu"), torch.Generator().manual_seed(0)).kernel
    be.consts = {"BY": 16, "BX": 64}  # the GPU's block
    as_tuned, info = plan_gemm.plan_gemm_kernel(tuned, plan.graph, xs)
    assert info.form == "tma" and ptb_occupancy(as_tuned)["programs_per_sm"] == 1
    assert fused_occupancy(as_tuned, be, fuser.parse_version("1:1"))["programs_per_sm"] == 1
    cut, info = plan_gemm.plan_gemm_kernel(tuned, plan.graph, xs, share_sm=2)
    assert "stages 4 -> 2 (2 blocks an SM)" in info.changed
    occ = ptb_occupancy(cut)
    assert occ["stack"] == 0 and occ["programs_per_sm"] >= 2, occ
    assert fused_occupancy(cut, be, fuser.parse_version("1:1"))["programs_per_sm"] >= 2


def test_colocation_tiles_offer_a_deeper_pipeline_in_the_same_shared_memory() -> None:
    # FFN2's tuned tile (64 x 128 x 128, four stages, C by TMA: 213 KB): two stages of it, or the C tile stored by
    # pointers, or half the K step at four stages (112 KB: the bytes in flight of two, a pipeline twice as deep)
    tile = GemmConfig(64, 128, 128, 1, 4, 4, tma=True)
    got = plan_gemm.colocation_tiles(tile, 2, 2, tma_store=True)
    assert got[0] == (replace(tile, num_stages=2), True, "stages 4 -> 2 (2 blocks an SM)")
    assert (replace(tile, block_k=64, num_stages=4), True, "K step 128 -> 64") in got
    for t, store, _ in got:
        assert plan_gemm.tile_shared_bytes(t, 2, store) <= plan_gemm.SM_SHARED_BYTES // 2 - plan_gemm.BLOCK_RESERVED_BYTES
    assert len({(t, s) for t, s, _ in got}) == len(got)
    small = GemmConfig(32, 32, 32, 4, 4, 2)  # already fits: only itself
    assert plan_gemm.colocation_tiles(small, 2, 2, tma_store=False) == [(small, False, "")]


def test_the_fastest_colocation_tile_is_chosen_and_every_one_is_correct(compiled_block: tuple) -> None:
    _, _, plan, env = compiled_block
    nodes = {n.name: n for n in plan.graph.nodes}
    step = next(s for s in plan.steps if s.output in nodes and nodes[s.output].op == "gemm_epilogue")
    node = nodes[step.output]
    # fp32 here, a 60-stage ring the cut must shorten, C by TMA: each candidate a different kernel
    tuned = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "config": GemmConfig(32, 32, 64, 2, 4, 60, tma=True)})
    xs = [env[i] for i in step.inputs]
    seen: list[str] = []

    def fake_time(k: object) -> float:  # every candidate is run and checked, and the last one "wins"
        out = plan_gemm.output(k)
        out.fill_(float("nan"))
        launch_ptb(k, 0, k.n_blocks, grid=2)
        _close(out, env[step.output])
        seen.append(f"{k.consts['BLOCK_K']}/{k.num_stages}/{k.consts.get('TMA_STORE')}")
        return 10.0 - len(seen)

    k, info = plan_gemm.plan_gemm_kernel(tuned, plan.graph, xs, share_sm=2, time_ms=fake_time)
    assert len(seen) >= 2 and len(k.meta["fit_ms"]) == len(seen)
    assert f"{k.consts['BLOCK_K']}/{k.num_stages}/{k.consts.get('TMA_STORE')}" == seen[-1]
    assert min(k.meta["fit_ms"].values()) == 10.0 - len(seen)
    assert any("2 blocks an SM" in c for c in info.changed)


def test_the_runs_summary_lists_each_gemm_shape_once(compiled_block: tuple) -> None:
    from kfuse.colocate.lc import plan_gemm_summary

    compiled, x, _, _ = compiled_block
    summary = plan_gemm_summary(lc_items(compiled, (x,), {}, gemms="plan-ptb2"))
    assert len(summary) == 2 and all(g["count"] == 1 for g in summary.values())
    for g in summary.values():
        assert g["form"] in ("tma", "pointers") and g["programs_per_sm"] in (1, 2) and isinstance(g["changed"], list)
        assert ("ptb_ms" in g) == torch.cuda.is_available()  # the GPU times each step beside the plan's own kernel
    assert plan_gemm_summary(lc_items(compiled, (x,), {}, gemms="plan")) == {}
