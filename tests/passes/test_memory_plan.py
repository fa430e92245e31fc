"""Static memory planning: no two live values share storage; numerics unchanged."""

from __future__ import annotations

import random

import pytest
import torch

from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_pointwise import fuse_pointwise
from kfuse.passes.memory_plan import check_plan, estimate_peak, plan_memory
from kfuse.runtime.executor import execute, lower


def _backend(device: str) -> str:
    return "triton" if device == "cuda" else "triton-interpreter"


def random_graph(rng: random.Random) -> Graph:
    """Elementwise kernels separated by ops the fusion pass leaves alone (norms, softmax views),
    with views of intermediates, values read far later, and outputs that are views."""
    b = GraphBuilder("mem")
    x = b.add_input("x", TensorType((4, 6), torch.float32))
    vals = [x]
    outs: list[str] = []
    for _ in range(rng.randint(8, 16)):
        src = rng.choice(vals[-3:] + vals[:1])
        r = rng.random()
        if r < 0.25:
            v = b.op(rng.choice(["relu", "sigmoid", "tanh", "neg"]), [src])
        elif r < 0.45:
            v = b.op(rng.choice(["add", "mul", "sub"]), [src, rng.choice(vals)])
        elif r < 0.75:  # a fresh tensor from a non-fused op: breaks regions apart
            v = b.op("layer_norm", [src], {"normalized_shape": (6,)})
        elif r < 0.9:  # a view that keeps its base alive
            t = b.op("permute", [src], {"dims": (1, 0)})
            base = b.op("contiguous", [t]) if rng.random() < 0.5 else src
            v = b.op("reshape", [base], {"shape": (4, 6)})
        else:
            v = b.op("exp", [b.op("reshape", [src], {"shape": (24,)})])
            v = b.op("reshape", [v], {"shape": (4, 6)})
        vals.append(v)
        if rng.random() < 0.15:
            outs.append(b.op("reshape", [v], {"shape": (6, 4)}))  # an output that is a view
    outs.append(vals[-1])
    return b.build(list(dict.fromkeys(outs)))


@pytest.mark.parametrize("seed", range(12))
def test_no_shared_storage_and_same_numerics(seed: int, device: str) -> None:
    rng = random.Random(seed)
    g = random_graph(rng)
    fused = fuse_pointwise(g)
    plan = lower(fused, torch.device(device), _backend(device))
    mp = plan_memory(plan)
    check_plan(mp)
    # outputs (and their views) are never planned: they must survive the next call
    assert not set(mp.value_buffer) & set(fused.outputs)
    x = torch.randn(4, 6, device=device)
    ref = reference_run(g, [x])
    for _ in range(2):  # the second call reuses the arena
        out = execute(plan, [x], poison_dead=True)
        for o, r in zip(out, ref, strict=True):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    if plan.out_buffers:
        ptrs = {t.data_ptr() for t in plan.out_buffers.values()}
        assert all(plan.arena.data_ptr() <= p < plan.arena.data_ptr() + plan.arena.numel() for p in ptrs)


def test_reuse_and_inplace_on_a_chain(device: str) -> None:
    b = GraphBuilder("chain")
    x = b.add_input("x", TensorType((8, 16), torch.float32))
    v = x
    for _ in range(4):  # each relu+add pair is cut off from the next by a norm
        v = b.op("relu", [b.op("layer_norm", [v], {"normalized_shape": (16,)})])
        v = b.op("add", [v, b.scalar(1.0)])
    g = b.build([b.op("layer_norm", [v], {"normalized_shape": (16,)})])
    plan = lower(fuse_pointwise(g), torch.device(device), _backend(device))
    mp = plan_memory(plan)
    check_plan(mp)
    one = 8 * 16 * 4
    assert len(mp.value_buffer) == 4 and mp.arena_bytes <= 2 * 512  # four kernels, one or two slots reused
    assert mp.peak_bytes <= mp.peak_bytes_unplanned + mp.arena_bytes
    assert estimate_peak(g) >= 2 * one
    x_in = torch.randn(8, 16, device=device)
    torch.testing.assert_close(execute(plan, [x_in], poison_dead=True)[0], reference_run(g, [x_in])[0], rtol=1e-5, atol=1e-5)


def test_inplace_when_operand_dies(device: str) -> None:
    b = GraphBuilder("inplace")
    x = b.add_input("x", TensorType((5, 7), torch.float32))
    a = b.op("sigmoid", [b.op("layer_norm", [x], {"normalized_shape": (7,)})])
    n = b.op("layer_norm", [a], {"normalized_shape": (7,)})
    c = b.op("mul", [b.op("tanh", [n]), a])  # reads `a` for the last time: may write over it
    g = b.build([b.op("layer_norm", [c], {"normalized_shape": (7,)})])
    plan = lower(fuse_pointwise(g), torch.device(device), _backend(device))
    mp = plan_memory(plan)
    check_plan(mp)
    assert mp.inplace, mp
    x_in = torch.randn(5, 7, device=device)
    torch.testing.assert_close(execute(plan, [x_in], poison_dead=True)[0], reference_run(g, [x_in])[0], rtol=1e-5, atol=1e-5)


def test_disabled_plan_allocates(device: str) -> None:
    b = GraphBuilder("off")
    x = b.add_input("x", TensorType((3, 3), torch.float32))
    g = b.build([b.op("layer_norm", [b.op("relu", [x])], {"normalized_shape": (3,)})])
    plan = lower(fuse_pointwise(g), torch.device(device), _backend(device))
    plan.use_memory_plan = False
    x_in = torch.randn(3, 3, device=device)
    torch.testing.assert_close(execute(plan, [x_in])[0], reference_run(g, [x_in])[0])
    assert plan.arena is None and plan.memory is None
