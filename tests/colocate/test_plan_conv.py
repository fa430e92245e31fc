"""The PTB form of a compiled plan's convolutions (``kfuse.colocate.plan_conv``, ``lc_items(gemms="plan-ptb")``):
kfuse's own implicit-GEMM conv template with the step's tile, input, packed weight and epilogue, one output tile a
block; any block range on any grid, alone or fused beside a BE kernel, writes exactly the plan step's output."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import kfuse
from kfuse.colocate import fuser, plan_conv, plan_gemm, workloads
from kfuse.colocate.lc import lc_items
from kfuse.colocate.ptb import launch_ptb
from kfuse.ir.graph import Node
from kfuse.kernels.conv import ConvConfig
from kfuse.runtime.executor import plan_values


class Cnn(torch.nn.Module):
    """A 3x3 conv (bias + ReLU), a 1x1 conv with a residual add, a strided 3x3 and a grouped 3x3, on a map no tile
    divides."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(16, 24, 3, padding=1)
        self.c2 = torch.nn.Conv2d(24, 16, 1)
        self.c3 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.c4 = torch.nn.Conv2d(32, 32, 3, padding=1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.c1(x))
        y = F.relu(x + self.c2(y))
        return F.relu(self.c4(F.relu(self.c3(y))))


@pytest.fixture(scope="module")
def compiled_cnn() -> tuple:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    x = torch.randn(2, 16, 9, 11, device=device, dtype=dtype)
    compiled = kfuse.compile(Cnn().to(device, dtype).eval(), (x,), {}, backend="torch" if device == "cpu" else "triton", fuse_b2b=False)
    variant = next(iter(compiled.variants.values()))
    env = plan_values(variant.plan, variant.imported.graph_inputs(pytree.tree_leaves(((x,), {}))))
    return compiled, x, variant.plan, env


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape and not torch.isnan(got).any()
    tol = 1e-4 if want.dtype == torch.float32 else 2e-2
    assert (got - want).abs().max() <= tol * max(1.0, want.abs().max().item())


def test_every_conv_step_becomes_its_templates_block_kernel(compiled_cnn: tuple) -> None:
    compiled, x, plan, env = compiled_cnn
    items = lc_items(compiled, (x,), {}, gemms="plan-ptb")
    convs = [it for it in items if it.kernel is not None]
    assert len(convs) == 4 and all(it.kernel.fn in ("conv_tile", "conv_tma_tile") for it in convs)
    assert len({it.key for it in convs}) == 4  # the 3x3 and the strided 3x3 share an epilogue, not a geometry
    rng = random.Random(2)
    for it in convs:
        k = it.kernel
        out = plan_gemm.output(k)
        out.fill_(float("nan"))  # poisoned: every element must be written by some block
        cuts = sorted({0, k.n_blocks, *(rng.randrange(k.n_blocks + 1) for _ in range(3))})
        for s, e in zip(cuts[:-1], cuts[1:], strict=True):
            launch_ptb(k, s, e, grid=rng.randint(1, 5))
        _close(out, env[it.name])


def _conv_step(plan: object, env: dict, first_op_input_channels: int) -> tuple:
    nodes = {n.name: n for n in plan.graph.nodes}
    for s in plan.steps:
        n = nodes.get(s.output)
        if n is not None and n.op == "conv_epilogue" and env[s.inputs[0]].shape[1] == first_op_input_channels:
            return s, n
    raise AssertionError("no such conv step")


def test_the_tma_tile_and_a_cut_pipeline_give_the_same_output(compiled_cnn: tuple) -> None:
    _, _, plan, env = compiled_cnn
    step, node = _conv_step(plan, env, 16)  # c1: 3x3, stride 1 (TMA can do it where the map is aligned)
    xs = [env[i] for i in step.inputs]
    for config, share in ((ConvConfig(32, 16, 16, 4, 4, 3, tile_h=4), 0), (ConvConfig(32, 32, 16, 4, 4, 4), 2)):
        tuned = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "config": config})
        made = plan_conv.plan_conv_kernel(tuned, plan.graph, xs, share_sm=share)
        assert made is not None
        k, info = made
        assert info.plan_config == config.describe()
        assert xs[0].is_contiguous(memory_format=torch.channels_last)  # the layout pass's NHWC map: TMA boxes can read it
        assert (info.form, k.fn) == (("tma", "conv_tma_tile") if config.tile_h else ("pointers", "conv_tile"))
        if share:
            assert "stages 4 -> 3 (2 blocks an SM)" not in info.changed  # 4 stages of 32 x 32 x 16 fit two already
        out = plan_gemm.output(k)
        out.fill_(float("nan"))
        launch_ptb(k, 0, k.n_blocks, grid=3)
        _close(out, env[step.output])


def test_fused_beside_a_be_kernel_the_plan_conv_is_unchanged(compiled_cnn: tuple) -> None:
    compiled, x, _, env = compiled_cnn
    it = next(i for i in lc_items(compiled, (x,), {}, gemms="plan-ptb2") if i.kernel is not None)
    lc = it.kernel
    be = workloads.make("hotspot", small=True, device=plan_gemm.output(lc).device)
    out = plan_gemm.output(lc)
    out.fill_(float("nan"))
    be.reset()
    fuser.launch_fused(lc, be.kernel, fuser.parse_version("1:1"), (0, lc.n_blocks), (0, be.kernel.n_blocks), sms=2)
    _close(out, env[it.name])
    assert workloads.error(be) <= max(be.tol, 1e-4)


def test_a_conv_with_an_input_prologue_stays_the_plans_step(compiled_cnn: tuple) -> None:
    _, _, plan, env = compiled_cnn
    step, node = _conv_step(plan, env, 16)
    scaled = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "in_scale": True})
    assert plan_conv.plan_conv_kernel(scaled, plan.graph, [env[i] for i in step.inputs]) is None
    with pytest.raises(ValueError, match="not conv_epilogue"):
        plan_conv.plan_conv_kernel(Node(node.name, "relu", node.inputs, node.type, node.attrs), plan.graph, [])


def test_the_fastest_colocation_tile_of_a_conv_is_chosen_and_every_one_is_correct(compiled_cnn: tuple) -> None:
    _, _, plan, env = compiled_cnn
    step, node = _conv_step(plan, env, 16)
    # a TMA tile with a K step of 64 and a ring the cut must shorten: stage cut, pointer store, half K step
    tuned = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "config": ConvConfig(32, 32, 64, 4, 4, 60, tile_h=4)})
    xs = [env[i] for i in step.inputs]
    seen: list[tuple] = []

    def fake_time(k: object) -> float:  # every candidate runs and is checked; the last one "wins"
        out = plan_gemm.output(k)
        out.fill_(float("nan"))
        launch_ptb(k, 0, k.n_blocks, grid=2)
        _close(out, env[step.output])
        seen.append((k.num_stages, k.consts.get("TMA_STORE")))
        return 10.0 - len(seen)

    made = plan_conv.plan_conv_kernel(tuned, plan.graph, xs, share_sm=2, time_ms=fake_time)
    assert made is not None
    k, info = made
    assert len(seen) >= 3 and len(k.meta["fit_ms"]) == len(seen)
    assert (k.num_stages, k.consts.get("TMA_STORE")) == seen[-1]
    assert any(not store for _, store in seen) and any(store for _, store in seen)  # the pointer-store choice is among them
