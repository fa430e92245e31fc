"""Generated pointwise/reduction kernels against the reference executor (Triton interpreter on CPU)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_pointwise import PointwiseLaunch, fuse_pointwise
from kfuse.runtime.executor import execute, lower

UNARY = ["relu", "sigmoid", "tanh", "silu", "gelu", "gelu_tanh", "neg", "abs", "exp_small", "hardswish", "erf", "sqrt_abs", "sin", "cos"]
BINARY = ["add", "sub", "mul", "div_safe", "maximum", "minimum"]


def _backend(device: str) -> str:
    return "triton" if device == "cuda" else "triton-interpreter"


def _poisoned_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    """torch.empty that fills floats with NaN and bytes (the executor's arena) with 0xFF, NaN in every
    float view: an element a kernel leaves unwritten shows up as NaN."""
    t = _REAL_EMPTY(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.uint8:
        t.fill_(255)
    return t


_REAL_EMPTY = torch.empty


def _run_fused(g: Graph, xs: list[torch.Tensor], device: str) -> list[torch.Tensor]:
    fused = fuse_pointwise(g)
    assert fused.op_counts().get("pointwise", 0) >= 1, str(fused)
    plan = lower(fused, torch.device(device), _backend(device))
    assert any(s.info.template == "pointwise" for s in plan.steps)
    # the generated kernels allocate their results with torch.empty: poison those allocations
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty", _poisoned_empty)
        return execute(plan, xs)


def _check(g: Graph, xs: list[torch.Tensor], device: str, tol: float) -> None:
    ref = reference_run(g, [x.double() if x.is_floating_point() else x for x in xs])
    out = _run_fused(g, xs, device)
    for k, (o, r) in enumerate(zip(out, ref, strict=True)):
        assert o.shape == r.shape and o.dtype == g.type_of(g.outputs[k]).dtype
        assert not torch.isnan(o).any() or torch.isnan(r).any()
        torch.testing.assert_close(o.double(), r.double().to(o.device), rtol=tol, atol=tol)


def _unary(b: GraphBuilder, op: str, v: str) -> str:
    if op == "exp_small":
        return b.op("exp", [b.op("tanh", [v])])
    if op == "sqrt_abs":
        return b.op("sqrt", [b.op("abs", [v])])
    return b.op(op, [v])


def _binary(b: GraphBuilder, op: str, x: str, y: str) -> str:
    if op == "div_safe":  # keep the divisor away from zero
        return b.op("div", [x, b.op("add", [b.op("abs", [y]), b.scalar(1.0)])])
    return b.op(op, [x, y])


def random_graph(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype, reduce: str | None, axis: int) -> Graph:
    """A random chain of elementwise ops over broadcasting inputs, with an optional reduction."""
    b = GraphBuilder("rand")
    x = b.add_input("x", TensorType(shape, dtype))
    bias_shape = shape[-1:]
    y = b.add_input("bias", TensorType(bias_shape, dtype))
    vals = [x]
    for _ in range(rng.randint(2, 5)):
        if rng.random() < 0.5:
            vals.append(_unary(b, rng.choice(UNARY), rng.choice(vals)))
        else:
            other = rng.choice(vals + [y, b.scalar(rng.choice([0.5, -2.0, 3.0]))])
            vals.append(_binary(b, rng.choice(BINARY), rng.choice(vals), other))
    cur = vals[-1]
    outs = [cur]
    if reduce is not None:
        if reduce in ("softmax", "log_softmax"):
            r = b.op(reduce, [cur], {"dim": axis})
        elif reduce == "var":
            r = b.op("var", [cur], {"dims": (axis,), "keepdim": True, "correction": 1 if shape[axis] > 1 else 0})
        else:
            r = b.op(reduce, [cur], {"dims": (axis,), "keepdim": True})
        after = b.op(rng.choice(["mul", "add", "sub"]), [r, cur]) if rng.random() < 0.7 else b.op("sigmoid", [r])
        outs = [after] if rng.random() < 0.5 else [after, r]
    return b.build(outs)


def _inputs(g: Graph, device: str) -> list[torch.Tensor]:
    return [torch.randn(t.shape, dtype=t.dtype).to(device) for _, t in g.inputs]


@pytest.mark.parametrize("seed", range(8))
def test_random_elementwise_chains(seed: int, device: str) -> None:
    rng = random.Random(seed)
    shape = rng.choice([(5,), (3, 7), (2, 3, 33), (4, 1, 5), (1,)])
    dtype = rng.choice([torch.float32, torch.float16])
    g = random_graph(rng, shape, dtype, None, 0)
    _check(g, _inputs(g, device), device, 2e-2 if dtype == torch.float16 else 1e-4)


@pytest.mark.parametrize("seed", range(8))
def test_random_reduction_chains(seed: int, device: str) -> None:
    rng = random.Random(100 + seed)
    shape = rng.choice([(3, 7), (2, 5, 9), (4, 3)])
    axis = rng.randrange(len(shape))
    reduce = rng.choice(["softmax", "log_softmax", "sum", "mean", "amax", "var"])
    dtype = rng.choice([torch.float32, torch.float16])
    g = random_graph(rng, shape, dtype, reduce, axis)
    _check(g, _inputs(g, device), device, 3e-2 if dtype == torch.float16 else 2e-4)


@pytest.mark.parametrize("length", [1, 3, 1000, 4097])
@pytest.mark.parametrize("op", ["softmax", "sum", "mean", "amax", "var"])
def test_reduction_lengths(length: int, op: str, device: str) -> None:
    b = GraphBuilder("red")
    x = b.add_input("x", TensorType((3, length), torch.float32))
    s = b.op("mul", [x, b.scalar(0.5)])
    if op == "softmax":
        r = b.op("softmax", [s], {"dim": 1})
    else:
        attrs = {"dims": (1,), "keepdim": False}
        if op == "var":
            attrs["correction"] = 1 if length > 1 else 0
        r = b.op(op, [s], attrs)
    g = b.build([r])
    _check(g, _inputs(g, device), device, 1e-4)


def test_reduction_middle_axis_and_row_consumers(device: str) -> None:
    b = GraphBuilder("mid")
    x = b.add_input("x", TensorType((2, 1000, 3), torch.float32))
    w = b.add_input("w", TensorType((2, 1, 3), torch.float32))
    m = b.op("mean", [x], {"dims": (1,), "keepdim": True})
    d = b.op("sub", [x, m])
    v = b.op("mean", [b.op("mul", [d, d])], {"dims": (1,), "keepdim": True})
    y = b.op("mul", [b.op("mul", [d, b.op("rsqrt", [b.op("add", [v, b.scalar(1e-5)])])]), w])
    g = b.build([y])
    _check(g, _inputs(g, device), device, 1e-4)


def test_broadcasting_and_permuted_inputs(device: str) -> None:
    b = GraphBuilder("bcast")
    x = b.add_input("x", TensorType((5, 4, 6), torch.float32))
    col = b.add_input("col", TensorType((4, 1), torch.float32))
    s = b.add_input("s", TensorType((), torch.float32))
    xp = b.op("permute", [x], {"dims": (2, 0, 1)})  # (6, 5, 4): a strided view into the kernel
    y = b.op("add", [b.op("mul", [xp, b.op("reshape", [col], {"shape": (4,)})]), s])
    z = b.op("where", [b.op("gt", [y, b.scalar(0.0)]), y, b.op("mul", [y, b.scalar(0.1)])])
    g = b.build([z])
    _check(g, _inputs(g, device), device, 1e-5)


def test_full_reduction_over_size_one_dims_of_a_strided_view(device: str) -> None:
    """``x.transpose(1, 2).sum()`` of a [1, 1, 2, 8] map (a decode step's rotated key, read elsewhere): the reduced
    axis has size-1 parts whose strides say nothing, and the [1, 1, 1, 1] result's broadcast strides are
    (1, 0, 1, 0); before session 46 that raised "outputs are contiguous"."""
    b = GraphBuilder("sum_all")
    x = b.add_input("x", TensorType((1, 1, 2, 8), torch.float32))
    k = b.op("mul", [b.op("permute", [x], {"dims": (0, 2, 1, 3)}), b.scalar(2.0)])
    g = b.build([b.op("sum", [k], {"dims": (0, 1, 2, 3), "keepdim": True})])
    _check(g, _inputs(g, device), device, 1e-5)


def test_global_average_pool_channels_last(device: str) -> None:
    b = GraphBuilder("gap")
    x = b.add_input("x", TensorType((2, 6, 5, 7), torch.float16))
    p = b.op("adaptive_avg_pool2d", [b.op("relu", [x])], {"output_size": (1, 1)})
    g = b.build([p])
    xs = [torch.randn(2, 6, 5, 7, dtype=torch.float16).to(device).contiguous(memory_format=torch.channels_last)]
    _check(g, xs, device, 1e-2)


def test_multi_output_region_and_bool(device: str) -> None:
    b = GraphBuilder("multi")
    x = b.add_input("x", TensorType((3, 9), torch.float32))
    a = b.op("sigmoid", [x])
    m = b.op("gt", [a, b.scalar(0.5)])
    y = b.op("where", [m, a, b.op("neg", [a])])
    g = b.build([y, a, m])
    fused = fuse_pointwise(g)
    assert fused.op_counts()["pointwise"] == 1
    _check(g, _inputs(g, device), device, 1e-5)


def test_out_buffer_poisoned_and_inplace_info(device: str) -> None:
    b = GraphBuilder("out")
    x = b.add_input("x", TensorType((4, 33), torch.float32))
    y = b.op("gelu", [b.op("add", [x, b.scalar(1.0)])])
    g = b.build([y])
    fused = fuse_pointwise(g)
    node = fused.nodes[-1]
    launch = PointwiseLaunch(node, fused)
    assert launch.accepts_out and launch.inplace_inputs == (0,)
    xs = _inputs(g, device)
    buf = torch.full((4, 33), float("nan"), device=device)
    out = launch(xs, out=buf)
    assert out.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(out, reference_run(g, xs)[0], rtol=1e-5, atol=1e-5)


def test_leaves_int_and_unsupported_pow(device: str) -> None:
    b = GraphBuilder("skip")
    i = b.add_input("i", TensorType((4,), torch.int64))
    x = b.add_input("x", TensorType((4,), torch.float32))
    j = b.op("add", [i, b.scalar(1)])
    p = b.op("pow", [x, b.scalar(2.5)])
    g = b.build([j, p])
    fused = fuse_pointwise(g)
    assert "pointwise" not in fused.op_counts()


def test_no_cycle_between_regions(device: str) -> None:
    """a -> (outside op) -> b must not put a and b in one kernel around the outside op."""
    b = GraphBuilder("cyc")
    x = b.add_input("x", TensorType((4, 8), torch.float32))
    a = b.op("relu", [x])
    outside = b.op("layer_norm", [a], {"normalized_shape": (8,)})
    c = b.op("add", [a, outside])
    g = b.build([c])
    fused = fuse_pointwise(g)
    fused.verify()
    _check(g, _inputs(g, device), device, 1e-5)


_SM90_SCRIPT = r"""
import re, torch, triton
from triton.backends.compiler import GPUTarget
from kfuse.kernels.pointwise import Arg, PointwiseProgram, PStep, Variant, _kernel
soft = PointwiseProgram((False,), (PStep("rmax", (Arg("in", 0),), row=True), PStep("sub", (Arg("in", 0), Arg("reg", 0))),
    PStep("exp", (Arg("reg", 1),)), PStep("rsum", (Arg("reg", 2),), row=True), PStep("div", (Arg("reg", 2), Arg("reg", 3)))), (4, 3), True)
ew = PointwiseProgram((False, False), (PStep("add", (Arg("in", 0), Arg("in", 1))), PStep("gelu", (Arg("reg", 0),))), (1,))
cases = [(soft, Variant("row", 1, (True,) * 3, False), ("BLOCK_R", "BLOCK_C"), (4, 1024)),
         (soft, Variant("loop", 2, (False, True, True), True), ("BLOCK_R", "BLOCK_C"), (1, 2048)),
         (ew, Variant("ew", 2, (True, False, True), False), ("BLOCK",), (1024,))]
for prog, var, cn, cv in cases:
    fn = _kernel(prog, var)
    consts = dict(zip(cn, cv), PDL=False)
    sig = {}
    for n in fn.arg_names:
        if n in consts or n.startswith("cs") or (n.startswith("st") and n.endswith("_1")):
            sig[n] = "constexpr"
            consts.setdefault(n, 1)  # what the JIT does with a stride of 1
        elif n.startswith(("in", "out")):
            sig[n] = "*fp16"
        else:
            sig[n] = "i64" if var.idx64 else "i32"
    aligned = [k for k, v in sig.items() if v.startswith("*") or k in ("N", "L", "R") or k.startswith("rs")]
    hint = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in aligned}
    k = triton.compile(triton.compiler.ASTSource(fn, sig, constexprs=consts, attrs=hint), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    print(var.mode, sorted(set(re.findall(r"(?:ld|st)\.global[.a-z0-9]*", k.asm["ptx"]))))
"""


def test_generated_kernels_compile_for_sm90(tmp_path) -> None:
    """The generated sources compile for an H100/H200 without a GPU; dense operands vectorise."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["KFUSE_CACHE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", _SM90_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert set(lines) == {"row", "loop", "ew"}
    assert "v4" in lines["row"] and "v4" in lines["ew"]


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 1e4), (torch.float16, 8.0)])
def test_sin_and_cos_hold_at_rotary_angles(dtype: torch.dtype, scale: float, device: str) -> None:
    """Rotary tables are sin / cos of position x frequency, up to ~1e4 rad at long contexts: the kernel's
    sin / cos must reduce the range in full (an approximate sine is wrong by O(1) there). Odd shape."""
    b = GraphBuilder()
    x = b.add_input("x", TensorType((37, 53), dtype))
    s, c = b.op("sin", [x]), b.op("cos", [x])
    g = b.build([b.op("add", [b.op("mul", [s, s]), b.op("mul", [c, b.scalar(0.5)])]), s])
    xs = [(torch.rand(37, 53) * 2 - 1).mul(scale).to(dtype).to(device)]
    _check(g, xs, device, 1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("length", [7, 4097])  # one block, and the chunked loop over blocks
def test_amax_keeps_a_nan_as_torch_does(length: int, device: str) -> None:
    # torch.amax (and max over a dim, imported as amax) returns NaN for a row holding one; Triton's tl.max
    # drops it on the GPU, so the kernels reduce with a NaN-propagating maximum
    b = GraphBuilder("amax_nan")
    x = b.add_input("x", TensorType((3, length), torch.float32))
    g = b.build([b.op("amax", [b.op("mul", [x, b.scalar(2.0)])], {"dims": (1,), "keepdim": False})])
    xs = [torch.randn(3, length, device=device)]
    xs[0][1, length // 2] = float("nan")
    got = _run_fused(g, xs, device)[0]
    want = (xs[0] * 2).amax(1)
    assert torch.isnan(got[1]) and not torch.isnan(got[[0, 2]]).any()
    torch.testing.assert_close(got, want, equal_nan=True)


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def test_result_strides_follow_channels_last_operands() -> None:
    from kfuse.kernels.pointwise import result_strides

    dom = (2, 5, 3, 7)
    x, bias = torch.randn(dom), torch.randn(1, 5, 1, 1)
    assert result_strides([x, bias], dom) is None
    assert result_strides([bias, _cl(x)], dom) == (3 * 7 * 5, 1, 7 * 5, 5)
    assert result_strides([_cl(x)], (2, 5, 3)) is None  # not 4-D: row-major
    # written into an operand's own bytes: that operand's strides, whatever the others are
    assert result_strides([_cl(x), x], dom, given=x.view(-1).view(dom)) is None
    assert result_strides([x, _cl(x)], dom, given=torch.empty(dom)) == (3 * 7 * 5, 1, 7 * 5, 5)


def _bn_relu_graph(shape: tuple[int, ...]) -> Graph:
    b = GraphBuilder("bn_relu")
    x = b.add_input("x", TensorType(shape, torch.float32))
    s = b.add_input("s", TensorType((1, shape[1], 1, 1), torch.float32))
    y = b.op("relu", [b.op("add", [b.op("mul", [x, s]), s])])
    return b.build([y])


def test_elementwise_result_is_channels_last_on_channels_last_input(device: str) -> None:
    shape = (2, 5, 3, 7)  # channels and pixels not multiples of any tile
    g = _bn_relu_graph(shape)
    xs = [_cl(torch.randn(shape).to(device)), torch.randn(1, shape[1], 1, 1).to(device)]
    out = _run_fused(g, xs, device)[0]
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    torch.testing.assert_close(out, reference_run(g, xs)[0], rtol=1e-5, atol=1e-5)


def test_planned_out_buffer_takes_the_channels_last_layout(device: str) -> None:
    shape = (2, 5, 3, 7)
    fused = fuse_pointwise(_bn_relu_graph(shape))
    launch = PointwiseLaunch(fused.nodes[-1], fused)
    xs = [_cl(torch.randn(shape).to(device)), torch.randn(1, shape[1], 1, 1).to(device)]
    buf = torch.full(shape, float("nan"), device=device)  # the planner's arena view: row-major bytes
    out = launch(xs, out=buf)
    assert out.data_ptr() == buf.data_ptr() and out.stride() == (3 * 7 * 5, 1, 7 * 5, 5)
    torch.testing.assert_close(out, reference_run(_bn_relu_graph(shape), xs)[0], rtol=1e-5, atol=1e-5)


def test_in_place_into_a_row_major_operand_keeps_its_layout(device: str) -> None:
    """x (row-major) is overwritten by relu(x + y) while y is channels-last: the result must take x's strides, or
    an element would be written where another one has not been read yet."""
    shape = (2, 6, 5, 3)
    b = GraphBuilder("mixed")
    x = b.add_input("x", TensorType(shape, torch.float32))
    y = b.add_input("y", TensorType(shape, torch.float32))
    g = b.build([b.op("relu", [b.op("add", [x, y])])])
    fused = fuse_pointwise(g)
    launch = PointwiseLaunch(fused.nodes[-1], fused)
    assert 0 in launch.inplace_inputs
    xv, yv = torch.randn(shape).to(device), _cl(torch.randn(shape).to(device))
    want = reference_run(g, [xv.clone(), yv])[0]
    out = launch([xv, yv], out=xv)
    assert out.data_ptr() == xv.data_ptr() and out.is_contiguous()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_elementwise_result_straight_into_a_channel_slice(device: str) -> None:
    """concat_in_place's direct write: the kernel takes the slice's own strides; the channels beside it stay."""
    shape = (2, 5, 3, 7)
    fused = fuse_pointwise(_bn_relu_graph(shape))
    launch = PointwiseLaunch(fused.nodes[-1], fused)
    assert launch.writes_strided_out
    xs = [_cl(torch.randn(shape).to(device)), torch.randn(1, shape[1], 1, 1).to(device)]
    buf = _cl(torch.full((2, 12, 3, 7), float("nan"), device=device))
    out = launch(xs, out=buf[:, 3:8])
    assert out.data_ptr() == buf[:, 3:8].data_ptr()
    torch.testing.assert_close(buf[:, 3:8], reference_run(_bn_relu_graph(shape), xs)[0], rtol=1e-5, atol=1e-5)
    assert torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 8:]).all()
