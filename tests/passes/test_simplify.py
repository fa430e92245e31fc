"""Clean-up passes: structure before/after, numerics unchanged through the reference executor."""

from __future__ import annotations

import torch

from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.ir.graph import Graph
from kfuse.passes.fold import constant_fold, fold_batch_norm
from kfuse.passes.simplify import algebraic_simplify, cse, dce

X = TensorType((4, 6), torch.float32)


def same_numerics(before: Graph, after: Graph, inputs: list[torch.Tensor]) -> None:
    for a, b in zip(reference_run(before, inputs), reference_run(after, inputs), strict=True):
        # folding reassociates fp32 arithmetic (e.g. BN scale into conv weights): a few ulps
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_dce_removes_unused_nodes_and_constants() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    c = b.add_constant(torch.randn(6))
    dead = b.op("mul", [x, c])
    b.op("exp", [dead])
    y = b.op("relu", [x])
    g = b.build([y])
    out = dce(g)
    assert out.op_counts() == {"relu": 1} and not out.constants
    same_numerics(g, out, [torch.randn(4, 6)])


def test_cse_merges_identical_nodes_and_scalars() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    a1 = b.op("mul", [x, b.scalar(2.0)])
    a2 = b.op("mul", [x, b.scalar(2.0)])
    y = b.op("add", [b.op("exp", [a1]), b.op("exp", [a2])])
    g = b.build([y])
    out = dce(cse(g))
    assert out.op_counts() == {"mul": 1, "exp": 1, "add": 1}
    assert len(out.constants) == 1
    same_numerics(g, out, [torch.randn(4, 6)])


def test_cse_keeps_fallback_nodes_apart() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    attrs = {"fn": lambda xs: torch.rand_like(xs[0]), "target": "aten.rand_like", "out_type": X}
    f1 = b.op("fallback", [x], attrs)
    f2 = b.op("fallback", [x], attrs)
    g = b.build([b.op("add", [f1, f2])])
    assert cse(g).op_counts()["fallback"] == 2


def test_algebraic_identities() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    y = b.op("mul", [x, b.scalar(1.0)])
    y = b.op("add", [y, b.scalar(0.0)])
    y = b.op("div", [y, b.scalar(1.0)])
    y = b.op("sub", [y, b.scalar(0)])
    y = b.op("permute", [b.op("permute", [y], {"dims": (1, 0)})], {"dims": (1, 0)})
    y = b.op("reshape", [b.op("reshape", [y], {"shape": (24,)})], {"shape": (2, 12)})
    y = b.op("cast", [y], {"dtype": torch.float32})
    g = b.build([y])
    out = algebraic_simplify(g)
    assert out.op_counts() == {"reshape": 1}, str(out)
    same_numerics(g, out, [torch.randn(4, 6)])


def test_identity_not_removed_when_it_broadcasts_or_changes_dtype() -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((6,), torch.float16))
    y = b.op("mul", [x, b.add_constant(torch.ones(4, 6, dtype=torch.float16))])  # broadcasts
    z = b.op("add", [x, b.add_constant(torch.tensor(0.0, dtype=torch.float64))])  # 0-d: keeps fp16
    g = b.build([y, z])
    out = algebraic_simplify(g)
    assert out.op_counts() == {"mul": 1}
    same_numerics(g, out, [torch.randn(6).half()])


def test_strength_reduction() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    y = b.op("div", [x, b.scalar(4.0)])
    z = b.op("pow", [y, b.scalar(2.0)])
    w = b.op("pow", [b.op("abs", [z]), b.scalar(0.5)])
    g = b.build([w])
    out = algebraic_simplify(g)
    assert "div" not in out.op_counts() and "pow" not in out.op_counts()
    assert out.op_counts()["sqrt"] == 1
    same_numerics(g, out, [torch.randn(4, 6)])


def test_constant_fold_pretransposes_weights_and_evaluates_weight_only_math() -> None:
    b = GraphBuilder()
    x = b.add_input("x", X)
    w = torch.randn(5, 6)
    wt = b.op("permute", [b.add_constant(w)], {"dims": (1, 0)})
    scale = b.op("mul", [b.add_constant(torch.randn(5)), b.scalar(3.0)])
    y = b.op("add", [b.op("matmul", [x, wt]), scale])
    g = b.build([y])
    out = constant_fold(g)
    assert out.op_counts() == {"matmul": 1, "add": 1}
    folded = [c for c in out.constants.values() if c.shape == (6, 5)]
    assert folded and folded[0].is_contiguous()
    same_numerics(g, out, [torch.randn(4, 6)])


def test_constant_fold_meets_model_constants_on_another_device() -> None:
    # T5 on the GPU: min(relative_position (from arange(device=cuda)), full_like(..., 15)), where kfuse's
    # scalar is a CPU constant; "meta" stands in for the GPU (mixing it with a CPU tensor raises alike)
    b = GraphBuilder()
    x = b.add_input("x", TensorType((3, 3), torch.float32))
    pos = b.add_constant(torch.empty(3, 3, device="meta"))
    full = b.op("expand", [b.scalar(15.0)], {"shape": (3, 3)})
    g = b.build([b.op("add", [x, b.op("minimum", [pos, full])])])
    out = constant_fold(g)
    assert out.op_counts() == {"add": 1}
    assert [c.device.type for c in out.constants.values()] == ["meta"]


def test_constant_fold_does_not_materialise_large_broadcasts() -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((512, 512), torch.float32))
    big = b.op("expand", [b.scalar(1.5)], {"shape": (512, 512)})
    g = b.build([b.op("add", [x, big])])
    assert "expand" in constant_fold(g).op_counts()


def test_constant_fold_computes_weight_only_math_past_the_broadcast_limit() -> None:
    """Swin-V2's relative-position MLP: a 225 x 512 hidden layer over a constant table folds (it is computed,
    not broadcast), an expand of the same size does not, and nothing past MAX_COMPUTED_ELEMENTS folds."""
    from kfuse.passes.fold import MAX_COMPUTED_ELEMENTS, MAX_GROWTH_ELEMENTS

    b = GraphBuilder()
    x = b.add_input("x", TensorType((225, 512), torch.float32))
    table, w = torch.randn(225, 2), torch.randn(2, 512)
    hidden = b.op("relu", [b.op("matmul", [b.add_constant(table), b.add_constant(w)])])
    wide = b.op("expand", [b.add_constant(torch.randn(1, 512))], {"shape": (225, 512)})
    huge = b.op("matmul", [b.add_constant(torch.randn(1100, 2)), b.add_constant(torch.randn(2, 1000))])
    g = b.build([b.op("add", [b.op("add", [x, hidden]), wide]), huge])
    assert 225 * 512 > MAX_GROWTH_ELEMENTS and 1100 * 1000 > MAX_COMPUTED_ELEMENTS
    out = constant_fold(g)
    assert out.op_counts() == {"expand": 1, "add": 2, "matmul": 1}, out.op_counts()
    torch.testing.assert_close(next(c for c in out.constants.values() if c.shape == (225, 512)), torch.relu(table @ w))


def test_constant_fold_gathers_a_constant_table_past_the_broadcast_limit() -> None:
    """torchvision's Swin-V2 picks its relative-position bias from a computed [225, H] table by a constant index
    ([4096, H]): a fallback gather of constants folds like computed math; a fallback of another kind does not."""
    from kfuse.passes.fold import MAX_GROWTH_ELEMENTS

    table, index = torch.randn(225, 24), torch.randint(0, 225, (4096,))
    b = GraphBuilder()
    x = b.add_input("x", TensorType((4096, 24), torch.float32))
    ins = [b.add_constant(table), b.add_constant(index)]
    out_t = TensorType((4096, 24), torch.float32)
    picked = b.op("fallback", ins, {"fn": lambda xs: xs[0][xs[1]], "target": "aten.index.Tensor", "out_type": out_t})
    tiled = b.op("fallback", [ins[0]], {"fn": lambda xs: xs[0].repeat(19, 1), "target": "aten.repeat.default",
                                        "out_type": TensorType((4275, 24), torch.float32)})  # fmt: skip
    g = b.build([b.op("add", [x, picked]), tiled])
    assert 4096 * 24 > MAX_GROWTH_ELEMENTS
    out = constant_fold(g)
    assert out.op_counts() == {"add": 1, "fallback": 1}, out.op_counts()
    torch.testing.assert_close(next(c for c in out.constants.values() if c.shape == (4096, 24)), table[index])


def _conv_bn_graph(with_conv_bias: bool) -> tuple[Graph, torch.Tensor]:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, 3, 8, 8), torch.float32))
    ins = [x, b.add_constant(torch.randn(4, 3, 3, 3))] + ([b.add_constant(torch.randn(4))] if with_conv_bias else [])
    c = b.op("conv2d", ins, {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1})
    params = [torch.rand(4) + 0.5, torch.randn(4), torch.randn(4), torch.rand(4) + 0.5]
    y = b.op("batch_norm", [c] + [b.add_constant(p) for p in params], {"eps": 1e-5})
    return b.build([b.op("relu", [y])]), torch.randn(2, 3, 8, 8)


def test_batch_norm_folds_into_conv() -> None:
    for bias in (True, False):
        g, x = _conv_bn_graph(bias)
        out = algebraic_simplify(fold_batch_norm(g))
        assert out.op_counts() == {"conv2d": 1, "relu": 1}, str(out)
        same_numerics(g, out, [x])


def test_batch_norm_without_conv_becomes_scale_shift() -> None:
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, 4, 5, 5), torch.float32))
    params = [torch.rand(4) + 0.5, torch.randn(4), torch.randn(4), torch.rand(4) + 0.5]
    g = b.build([b.op("batch_norm", [x] + [b.add_constant(p) for p in params], {"eps": 1e-3})])
    out = fold_batch_norm(g)
    assert out.op_counts() == {"mul": 1, "add": 1}
    same_numerics(g, out, [torch.randn(2, 4, 5, 5)])


def test_fresh_names_never_collide_with_nodes_copied_later() -> None:
    """A rewrite's new node must not take the name of a node the pass copies afterwards."""
    b = GraphBuilder()
    x = b.add_input("x", X)
    r1 = b.op("reshape", [x], {"shape": (24,)}, name="first")
    r2 = b.op("reshape", [r1], {"shape": (2, 12)}, name="second")
    # the next nodes are named like the fresh names a rewrite would pick
    later = [b.op("exp", [r2], name=f"reshape_{i}") for i in range(1, 40)]
    g = b.build(later)
    out = algebraic_simplify(g)
    out.verify()
    same_numerics(g, out, [torch.randn(4, 6)])


def _gelu_new_graph(coef: float = 0.044715, cube: str = "pow"):
    import math

    b = GraphBuilder()
    x = b.add_input("x", TensorType((3, 16), torch.float32))
    half = b.op("mul", [b.scalar(0.5), x])
    x3 = b.op("pow", [x, b.scalar(3.0)]) if cube == "pow" else b.op("mul", [b.op("mul", [x, x]), x])
    inner = b.op("add", [x, b.op("mul", [x3, b.scalar(coef)])])
    t = b.op("tanh", [b.op("mul", [inner, b.scalar(math.sqrt(2 / math.pi))])])
    return b.build([b.op("mul", [half, b.op("add", [t, b.scalar(1.0)])])])


def test_gelu_new_becomes_gelu_tanh() -> None:
    for cube in ("pow", "mul"):
        g = _gelu_new_graph(cube=cube)
        s = algebraic_simplify(g)
        assert s.op_counts() == {"gelu_tanh": 1}, s.op_counts()
        x = torch.randn(3, 16) * 3
        torch.testing.assert_close(reference_run(s, [x])[0], reference_run(g, [x])[0], rtol=1e-5, atol=1e-5)


def test_near_miss_is_not_gelu_tanh() -> None:
    s = algebraic_simplify(_gelu_new_graph(coef=0.05))
    assert "gelu_tanh" not in s.op_counts()
