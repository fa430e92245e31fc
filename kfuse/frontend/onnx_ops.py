"""ONNX op -> kfuse IR converters.

A converter gets an :class:`OnnxCtx` for one ONNX node and returns one kfuse value name per
ONNX output (``None`` for outputs it does not produce). It raises :class:`Unsupported` for a
variant it does not handle; the importer then turns the node into a ``fallback`` node run by
ONNX's reference evaluator, so an unusual attribute never makes a result silently wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from onnx import TensorProto

from kfuse.ir.graph import GraphBuilder, TensorType

# ONNX element type <-> torch dtype (the types kfuse runs; others fall back or are refused)
ONNX_TO_TORCH: dict[int, torch.dtype] = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.INT8: torch.int8,
    TensorProto.INT16: torch.int16,
    TensorProto.INT32: torch.int32,
    TensorProto.INT64: torch.int64,
    TensorProto.UINT8: torch.uint8,
    TensorProto.BOOL: torch.bool,
}
TORCH_TO_ONNX: dict[torch.dtype, int] = {v: k for k, v in ONNX_TO_TORCH.items()}


class Unsupported(Exception):
    """A converter does not handle this variant of the op: the node falls back."""


@dataclass
class OnnxCtx:
    """What a converter sees: the ONNX node, its operands as kfuse values, and the builder."""

    b: GraphBuilder
    node: onnx.NodeProto
    opset: int
    inputs: list[str | None]  # kfuse value per ONNX input ("" -> None)
    consts: list[torch.Tensor | None]  # the value of each input when known at import time
    used_outputs: set[int] = field(default_factory=set)  # ONNX outputs read later (or graph outputs)

    # ---- operands ----------------------------------------------------------------------
    def x(self, i: int) -> str:
        v = self.inputs[i] if i < len(self.inputs) else None
        if v is None:
            raise Unsupported(f"input {i} missing")
        return v

    def opt(self, i: int) -> str | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def const(self, i: int) -> torch.Tensor | None:
        return self.consts[i] if i < len(self.consts) else None

    def const_ints(self, i: int) -> list[int] | None:
        """A constant integer input as a list (``None`` when absent); non-constant -> Unsupported."""
        if self.opt(i) is None:
            return None
        t = self.const(i)
        if t is None:
            raise Unsupported(f"input {i} is not a constant")
        return [int(v) for v in t.reshape(-1).tolist()]

    def const_scalar(self, i: int) -> float | int | bool | None:
        if self.opt(i) is None:
            return None
        t = self.const(i)
        if t is None or t.numel() != 1:
            raise Unsupported(f"input {i} is not a constant scalar")
        return t.reshape(()).item()

    def ttype(self, name: str) -> TensorType:
        t = self.b.type_of(name)
        assert isinstance(t, TensorType)
        return t

    def attr(self, key: str, default: Any = None) -> Any:
        for a in self.node.attribute:
            if a.name == key:
                v = onnx.helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    return v.decode()
                if isinstance(v, list) and v and isinstance(v[0], bytes):
                    return [s.decode() for s in v]
                return v
        return default

    # ---- building ----------------------------------------------------------------------
    def op(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.b.op(op, inputs, attrs, name=self.b.fresh(op))

    def scalar(self, value: float | int | bool, like: str) -> str:
        """A 0-d constant with ``like``'s dtype (ONNX operands always share a dtype)."""
        return self.b.add_constant(torch.tensor(value, dtype=self.ttype(like).dtype))

    def only_first_output(self) -> None:
        if any(i > 0 for i in self.used_outputs):
            raise Unsupported("secondary outputs are used")


Converter = Callable[[OnnxCtx], list[str | None] | str]
CONVERTERS: dict[str, Converter] = {}


def converts(*op_types: str) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for t in op_types:
            CONVERTERS[t] = fn
        return fn

    return deco


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _reshape(c: OnnxCtx, x: str, shape: Sequence[int]) -> str:
    shape = tuple(int(s) for s in shape)
    return x if c.ttype(x).shape == shape else c.op("reshape", [x], shape=shape)


# ---------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------
def _unary(op: str) -> Converter:
    def conv(c: OnnxCtx) -> str:
        x = c.x(0)
        if not c.ttype(x).dtype.is_floating_point and op not in ("neg", "abs", "relu"):
            raise Unsupported("integer operand")  # kfuse would promote to float; ONNX keeps the type
        return c.op(op, [x])

    return conv


for _t, _op in [
    ("Relu", "relu"),
    ("Sigmoid", "sigmoid"),
    ("Tanh", "tanh"),
    ("HardSwish", "hardswish"),
    ("Erf", "erf"),
    ("Sqrt", "sqrt"),
    ("Reciprocal", "reciprocal"),
    ("Exp", "exp"),
    ("Sin", "sin"),
    ("Cos", "cos"),
    ("Log", "log"),
    ("Neg", "neg"),
    ("Abs", "abs"),
]:
    CONVERTERS[_t] = _unary(_op)


@converts("Identity")
def _identity(c: OnnxCtx) -> str:
    return c.x(0)


@converts("Dropout")
def _dropout(c: OnnxCtx) -> str:
    c.only_first_output()  # the mask output has no inference meaning we reproduce
    if c.opt(2) is not None and c.const_scalar(2):
        raise Unsupported("training_mode=1")
    return c.x(0)


@converts("Gelu")
def _gelu(c: OnnxCtx) -> str:
    approx = c.attr("approximate", "none")
    return c.op("gelu_tanh" if approx == "tanh" else "gelu", [c.x(0)])


@converts("LeakyRelu")
def _leaky(c: OnnxCtx) -> str:
    return c.op("leaky_relu", [c.x(0)], slope=float(c.attr("alpha", 0.01)))


@converts("HardSigmoid")
def _hardsigmoid(c: OnnxCtx) -> str:
    x = c.x(0)
    alpha, beta = float(c.attr("alpha", 0.2)), float(c.attr("beta", 0.5))
    if math.isclose(alpha, 1 / 6, rel_tol=1e-6) and math.isclose(beta, 0.5, rel_tol=1e-6):
        return c.op("hardsigmoid", [x])
    y = c.op("add", [c.op("mul", [x, c.scalar(alpha, x)]), c.scalar(beta, x)])
    return c.op("clamp", [y], lo=0.0, hi=1.0)


@converts("Clip")
def _clip(c: OnnxCtx) -> str:
    x = c.x(0)
    if c.opset < 11:
        return c.op("clamp", [x], lo=float(c.attr("min", -3.4028234663852886e38)), hi=float(c.attr("max", 3.4028234663852886e38)))
    lo, hi = c.opt(1), c.opt(2)
    lo_c, hi_c = c.const(1), c.const(2)
    if lo is not None and hi is not None and lo_c is not None and hi_c is not None:
        return c.op("clamp", [x], lo=lo_c.item(), hi=hi_c.item())
    # one-sided or tensor bounds: maximum/minimum (no open-ended clamp for the code generators)
    y = x
    if lo is not None:
        y = c.op("maximum", [y, lo])
    if hi is not None:
        y = c.op("minimum", [y, hi])
    return y


def _binary(op: str, int_ok: bool = True) -> Converter:
    def conv(c: OnnxCtx) -> str:
        x, y = c.x(0), c.x(1)
        if not int_ok and not c.ttype(x).dtype.is_floating_point:
            raise Unsupported("integer operands")
        return c.op(op, [x, y])

    return conv


for _t, _op, _int_ok in [
    ("Add", "add", True),
    ("Sub", "sub", True),
    ("Mul", "mul", True),
    ("Div", "div", False),  # ONNX integer division truncates; torch.div would return floats
    ("Equal", "eq", True),
    ("Less", "lt", True),
    ("LessOrEqual", "le", True),
    ("Greater", "gt", True),
    ("GreaterOrEqual", "ge", True),
    ("And", "logical_and", True),
    ("Or", "logical_or", True),
]:
    CONVERTERS[_t] = _binary(_op, _int_ok)


@converts("Max", "Min")
def _max_min(c: OnnxCtx) -> str:
    op = "maximum" if c.node.op_type == "Max" else "minimum"
    xs = [v for v in c.inputs if v is not None]
    y = xs[0]
    for v in xs[1:]:
        y = c.op(op, [y, v])
    return y


@converts("Pow")
def _pow(c: OnnxCtx) -> str:
    x, e = c.x(0), c.x(1)
    if not c.ttype(x).dtype.is_floating_point:
        raise Unsupported("integer base")
    if c.ttype(e).dtype != c.ttype(x).dtype:  # ONNX: the result has the base's type
        e = c.op("cast", [e], dtype=c.ttype(x).dtype)
    return c.op("pow", [x, e])


@converts("IsNaN")
def _isnan(c: OnnxCtx) -> str:
    x = c.x(0)
    if not c.ttype(x).dtype.is_floating_point:
        raise Unsupported("integer operand")
    return c.op("ne", [x, x])  # NaN is the only value unequal to itself


@converts("Not")
def _not(c: OnnxCtx) -> str:
    return c.op("logical_not", [c.x(0)])


@converts("Where")
def _where(c: OnnxCtx) -> str:
    return c.op("where", [c.x(0), c.x(1), c.x(2)])


@converts("Cast")
def _cast(c: OnnxCtx) -> str:
    to = ONNX_TO_TORCH.get(int(c.attr("to")))
    if to is None:
        raise Unsupported("unsupported target type")
    x = c.x(0)
    if c.ttype(x).dtype.is_floating_point and not to.is_floating_point and to != torch.bool:
        raise Unsupported("float -> int cast")  # ONNX's rounding/saturation rules differ by version
    return x if c.ttype(x).dtype == to else c.op("cast", [x], dtype=to)


@converts("CastLike")
def _cast_like(c: OnnxCtx) -> str:
    x, to = c.x(0), c.ttype(c.x(1)).dtype
    if c.ttype(x).dtype.is_floating_point and not to.is_floating_point and to != torch.bool:
        raise Unsupported("float -> int cast")
    return x if c.ttype(x).dtype == to else c.op("cast", [x], dtype=to)


# ---------------------------------------------------------------------------------------
# GEMM, convolution, normalisation
# ---------------------------------------------------------------------------------------
@converts("MatMul")
def _matmul(c: OnnxCtx) -> str:
    x, w = c.x(0), c.x(1)
    if not c.ttype(x).dtype.is_floating_point:
        raise Unsupported("integer matmul")
    return c.op("matmul", [x, w])


@converts("Gemm")
def _gemm(c: OnnxCtx) -> str:
    a, b = c.x(0), c.x(1)
    if c.attr("transA", 0):
        a = c.op("permute", [a], dims=(1, 0))
    if c.attr("transB", 0):
        b = c.op("permute", [b], dims=(1, 0))
    alpha, beta = float(c.attr("alpha", 1.0)), float(c.attr("beta", 1.0))
    y = c.op("matmul", [a, b])
    if alpha != 1.0:
        y = c.op("mul", [y, c.scalar(alpha, y)])
    bias = c.opt(2)
    if bias is not None and beta != 0.0:
        if beta != 1.0:
            bias = c.op("mul", [bias, c.scalar(beta, bias)])
        y = c.op("add", [y, bias])
    return y


def _sym_pads(c: OnnxCtx, nd: int) -> tuple[int, ...]:
    """Symmetric padding per spatial dim from ``pads``/``auto_pad``; anything else falls back."""
    auto = c.attr("auto_pad", "NOTSET")
    if auto == "VALID":
        return (0,) * nd
    if auto not in ("NOTSET", ""):
        raise Unsupported(f"auto_pad={auto}")
    pads = list(c.attr("pads", [0] * (2 * nd)))
    if pads[:nd] != pads[nd:]:
        raise Unsupported("asymmetric pads")
    return tuple(int(p) for p in pads[:nd])


@converts("Conv")
def _conv(c: OnnxCtx) -> str:
    x, w = c.x(0), c.x(1)
    if c.ttype(x).rank != 4:
        raise Unsupported("only 2-D convolution")
    ks = c.attr("kernel_shape")
    if ks is not None and tuple(ks) != c.ttype(w).shape[2:]:
        raise Unsupported("kernel_shape differs from the weight")
    pads = _sym_pads(c, 2)
    strides = tuple(c.attr("strides", [1, 1]))
    dil = tuple(c.attr("dilations", [1, 1]))
    ins = [x, w] + ([c.x(2)] if c.opt(2) is not None else [])
    return c.op("conv2d", ins, stride=strides, padding=pads, dilation=dil, groups=int(c.attr("group", 1)))


@converts("BatchNormalization")
def _bn(c: OnnxCtx) -> str:
    c.only_first_output()
    if c.attr("training_mode", 0):
        raise Unsupported("training_mode=1")
    if c.ttype(c.x(0)).rank < 2:
        raise Unsupported("rank < 2")
    x, s, bias, mean, var = (c.x(i) for i in range(5))
    return c.op("batch_norm", [x, s, bias, mean, var], eps=float(c.attr("epsilon", 1e-5)))


@converts("LayerNormalization")
def _layer_norm(c: OnnxCtx) -> str:
    c.only_first_output()
    x = c.x(0)
    t = c.ttype(x)
    axis = _axis(int(c.attr("axis", -1)), t.rank)
    norm_shape = t.shape[axis:]
    ins = [x]
    for i in (1, 2):
        v = c.opt(i)
        if v is None:
            continue
        if c.ttype(v).shape != norm_shape:
            v = _reshape(c, v, norm_shape) if c.ttype(v).numel == math.prod(norm_shape) else c.op("expand", [v], shape=norm_shape)
        ins.append(v)
    if len(ins) == 2 and c.opt(1) is None:
        raise Unsupported("bias without scale")
    return c.op("layer_norm", ins, normalized_shape=tuple(norm_shape), eps=float(c.attr("epsilon", 1e-5)))


@converts("Softmax", "LogSoftmax")
def _softmax(c: OnnxCtx) -> str:
    x = c.x(0)
    r = c.ttype(x).rank
    op = "softmax" if c.node.op_type == "Softmax" else "log_softmax"
    axis = _axis(int(c.attr("axis", -1 if c.opset >= 13 else 1)), r)
    if c.opset < 13 and axis != r - 1:
        # before opset 13 the input is flattened to 2-D at ``axis``: softmax over all trailing dims
        shape = c.ttype(x).shape
        flat = _reshape(c, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
        return _reshape(c, c.op(op, [flat], dim=1), shape)
    return c.op(op, [x], dim=axis)


# ---------------------------------------------------------------------------------------
# data movement
# ---------------------------------------------------------------------------------------
@converts("Reshape")
def _reshape_op(c: OnnxCtx) -> str:
    x = c.x(0)
    shape = c.const_ints(1)
    assert shape is not None
    src = c.ttype(x).shape
    allow_zero = bool(c.attr("allowzero", 0))
    out = [src[i] if (s == 0 and not allow_zero) else s for i, s in enumerate(shape)]
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        out[out.index(-1)] = c.ttype(x).numel // known if known else 0
    return _reshape(c, x, out)


@converts("Transpose")
def _transpose(c: OnnxCtx) -> str:
    x = c.x(0)
    r = c.ttype(x).rank
    perm = tuple(int(p) for p in c.attr("perm", list(range(r))[::-1]))
    return x if perm == tuple(range(r)) else c.op("permute", [x], dims=perm)


@converts("Flatten")
def _flatten(c: OnnxCtx) -> str:
    x = c.x(0)
    shape = c.ttype(x).shape
    axis = _axis(int(c.attr("axis", 1)), len(shape))
    return _reshape(c, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


def _axes(c: OnnxCtx, attr_before: int) -> list[int] | None:
    """``axes`` from the attribute (opset < attr_before) or the second input."""
    if c.opset < attr_before:
        v = c.attr("axes")
        return None if v is None else [int(a) for a in v]
    return c.const_ints(1)


@converts("Squeeze")
def _squeeze(c: OnnxCtx) -> str:
    x = c.x(0)
    shape = c.ttype(x).shape
    axes = _axes(c, 13)
    if axes is None:
        keep = [s for s in shape if s != 1]
    else:
        drop = {_axis(a, len(shape)) for a in axes}
        keep = [s for i, s in enumerate(shape) if i not in drop]
    return _reshape(c, x, keep)


@converts("Unsqueeze")
def _unsqueeze(c: OnnxCtx) -> str:
    x = c.x(0)
    axes = _axes(c, 13)
    if axes is None:
        raise Unsupported("no axes")
    shape = list(c.ttype(x).shape)
    r = len(shape) + len(axes)
    for a in sorted(_axis(a, r) for a in axes):
        shape.insert(a, 1)
    return _reshape(c, x, shape)


@converts("Slice")
def _slice(c: OnnxCtx) -> str:
    x = c.x(0)
    t = c.ttype(x)
    if c.opset < 10:
        starts, ends, axes, steps = c.attr("starts"), c.attr("ends"), c.attr("axes"), None
    else:
        starts, ends, axes, steps = c.const_ints(1), c.const_ints(2), c.const_ints(3), c.const_ints(4)
    assert starts is not None and ends is not None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    y = x
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        if st <= 0:
            raise Unsupported("non-positive step")
        dim = _axis(int(a), t.rank)
        n = t.shape[dim]
        s_i, e_i, _ = slice(int(s), int(e), int(st)).indices(n)  # ONNX clamps like Python slicing
        if s_i == 0 and e_i >= n and st == 1:
            continue
        y = c.op("slice", [y], dim=dim, start=s_i, end=max(e_i, s_i), step=int(st))
    return y


@converts("Concat")
def _concat(c: OnnxCtx) -> str:
    xs = [v for v in c.inputs if v is not None]
    r = c.ttype(xs[0]).rank
    axis = _axis(int(c.attr("axis")), r)
    xs = [v for v in xs if c.ttype(v).shape[axis] > 0] or xs[:1]
    return xs[0] if len(xs) == 1 else c.op("cat", xs, dim=axis)


@converts("Split")
def _split(c: OnnxCtx) -> list[str | None]:
    x = c.x(0)
    t = c.ttype(x)
    axis = _axis(int(c.attr("axis", 0)), t.rank)
    n = t.shape[axis]
    sizes = c.attr("split") if c.opset < 13 else c.const_ints(1)
    nout = len(c.node.output)
    if sizes is None:
        chunk = -(-n // nout) if c.attr("num_outputs") is not None else n // nout
        sizes = [min(chunk, n - i * chunk) for i in range(nout)]
    out: list[str | None] = []
    start = 0
    for s in sizes:
        out.append(c.op("slice", [x], dim=axis, start=start, end=start + int(s), step=1))
        start += int(s)
    return out


@converts("GatherElements")
def _gather_elements(c: OnnxCtx) -> str:
    t = c.ttype(c.x(0))
    if t.rank != c.ttype(c.x(1)).rank:
        raise Unsupported("GatherElements of different ranks")
    # ONNX allows negative indices; torch.gather does not
    idx = c.x(1)
    size = c.op("add", [idx, c.scalar(t.shape[_axis(int(c.attr("axis", 0)), t.rank)], idx)])
    idx = c.op("where", [c.op("lt", [idx, c.scalar(0, idx)]), size, idx])
    return c.op("gather", [c.x(0), idx], dim=_axis(int(c.attr("axis", 0)), t.rank))


@converts("CumSum")
def _cumsum(c: OnnxCtx) -> str:
    axis = c.const_scalar(1)
    if axis is None or c.attr("exclusive", 0) or c.attr("reverse", 0):
        raise Unsupported("CumSum with a run-time axis, exclusive or reverse")
    t = c.ttype(c.x(0))
    return c.op("cumsum", [c.x(0)], dim=_axis(int(axis), max(t.rank, 1)), dtype=t.dtype)


@converts("Gather")
def _gather(c: OnnxCtx) -> str:
    data, idx = c.x(0), c.x(1)
    t = c.ttype(data)
    axis = _axis(int(c.attr("axis", 0)), t.rank)
    idx_c = c.const(1)
    if idx_c is not None and idx_c.dim() == 0:
        i = int(idx_c.item())
        return c.op("select", [data], dim=axis, index=i + t.shape[axis] if i < 0 else i)
    if c.const(0) is not None and axis == 0 and t.rank == 2 and idx_c is None:
        # ONNX counts negative indices from the end; the embedding op reads rows >= 0 only
        wrapped = c.op("add", [idx, c.scalar(t.shape[0], idx)])
        idx = c.op("where", [c.op("lt", [idx, c.scalar(0, idx)]), wrapped, idx])
        return c.op("embedding", [data, idx])
    raise Unsupported("general gather")


@converts("Expand")
def _expand(c: OnnxCtx) -> str:
    x = c.x(0)
    shape = c.const_ints(1)
    assert shape is not None
    src = c.ttype(x).shape
    out = tuple(torch.broadcast_shapes(src, tuple(shape)))  # ONNX Expand broadcasts both ways
    return x if out == src else c.op("expand", [x], shape=out)


# ---------------------------------------------------------------------------------------
# pooling and reductions
# ---------------------------------------------------------------------------------------
def _pool_attrs(c: OnnxCtx) -> dict[str, Any]:
    if c.ttype(c.x(0)).rank != 4:
        raise Unsupported("only 2-D pooling")
    ks = tuple(int(k) for k in c.attr("kernel_shape"))
    return {
        "kernel_size": ks,
        "stride": tuple(int(s) for s in c.attr("strides", [1, 1])),
        "padding": _sym_pads(c, 2),
        "ceil_mode": bool(c.attr("ceil_mode", 0)),
    }


@converts("MaxPool")
def _max_pool(c: OnnxCtx) -> str:
    c.only_first_output()
    a = _pool_attrs(c)
    if c.attr("storage_order", 0):
        raise Unsupported("storage_order")
    return c.op("max_pool2d", [c.x(0)], dilation=tuple(int(d) for d in c.attr("dilations", [1, 1])), **a)


@converts("AveragePool")
def _avg_pool(c: OnnxCtx) -> str:
    a = _pool_attrs(c)
    if tuple(c.attr("dilations", [1, 1])) != (1, 1):
        raise Unsupported("dilated average pool")
    if a["ceil_mode"]:
        raise Unsupported("ceil_mode")  # torch and ONNX count the ragged last window differently
    return c.op("avg_pool2d", [c.x(0)], count_include_pad=bool(c.attr("count_include_pad", 0)), divisor_override=None, **a)


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: OnnxCtx) -> str:
    x = c.x(0)
    r = c.ttype(x).rank
    dims = tuple(range(2, r))
    if c.node.op_type == "GlobalMaxPool":
        return c.op("amax", [x], dims=dims, keepdim=True)
    if r == 4:
        return c.op("adaptive_avg_pool2d", [x], output_size=(1, 1))
    return c.op("mean", [x], dims=dims, keepdim=True, dtype=None)


def _reduce(op: str, axes_input_from: int) -> Converter:
    def conv(c: OnnxCtx) -> str:
        x = c.x(0)
        r = c.ttype(x).rank
        if op != "amax" and not c.ttype(x).dtype.is_floating_point:
            raise Unsupported("integer reduction")
        axes = _axes(c, axes_input_from)
        if not axes:
            if c.attr("noop_with_empty_axes", 0):
                return x
            axes = list(range(r))
        dims = tuple(sorted(_axis(a, r) for a in axes))
        keep = bool(c.attr("keepdims", 1))
        if op == "amax":
            return c.op("amax", [x], dims=dims, keepdim=keep)
        return c.op(op, [x], dims=dims, keepdim=keep, dtype=None)

    return conv


CONVERTERS["ReduceMean"] = _reduce("mean", 18)
CONVERTERS["ReduceSum"] = _reduce("sum", 13)
CONVERTERS["ReduceMax"] = _reduce("amax", 18)


@converts("Resize")
def _resize(c: OnnxCtx) -> str:
    """``Resize`` on the last two dims of a 4-D tensor, where PyTorch's ``upsample2d`` computes the same: linear with
    ``half_pixel`` (``pytorch_half_pixel`` where no output dim is 1) or ``align_corners``, and nearest with
    ``asymmetric`` coordinates and ``nearest_mode="floor"`` (what ``torch.onnx.export`` writes for both). Cubic,
    antialiasing, ``tf_crop_and_resize``, other rounding modes and ``axes`` fall back."""
    x = c.x(0)
    xt = c.ttype(x)
    mode = c.attr("mode", "nearest")
    coords = c.attr("coordinate_transformation_mode", "half_pixel")
    if xt.rank != 4 or c.attr("antialias", 0) or c.attr("axes") is not None or c.attr("exclude_outside", 0):
        raise Unsupported("Resize: not a plain 4-D resize")
    if c.attr("keep_aspect_ratio_policy", "stretch") != "stretch":  # sizes adjusted to one scale: not followed here
        raise Unsupported("Resize: keep_aspect_ratio_policy")
    scales = c.const(2) if c.opt(2) is not None else None
    sizes = c.const_ints(3) if c.opt(3) is not None else None
    if scales is not None and scales.numel() == 0:
        scales = None
    if (scales is None) == (sizes is None):
        raise Unsupported("Resize: needs constant scales or sizes")
    n, ch, h, w = xt.shape
    if sizes is not None:
        if list(sizes[:2]) != [n, ch]:
            raise Unsupported("Resize: batch or channels resized")
        size, factors = (int(sizes[2]), int(sizes[3])), (None, None)
    else:
        s = [float(v) for v in scales.reshape(-1).tolist()]
        if s[:2] != [1.0, 1.0]:
            raise Unsupported("Resize: batch or channels scaled")
        size, factors = (int(math.floor(h * s[2])), int(math.floor(w * s[3]))), (s[2], s[3])
    if mode == "linear" and (coords == "half_pixel" or (coords == "pytorch_half_pixel" and min(size) > 1)):
        return c.op("upsample2d", [x], mode="bilinear", size=size, align_corners=False, scale_factors=factors)
    if mode == "linear" and coords == "align_corners":
        return c.op("upsample2d", [x], mode="bilinear", size=size, align_corners=True, scale_factors=(None, None))
    if mode == "nearest" and coords == "asymmetric" and c.attr("nearest_mode", "round_prefer_floor") == "floor":
        return c.op("upsample2d", [x], mode="nearest", size=size, align_corners=False, scale_factors=factors, nearest_divide=True)
    raise Unsupported(f"Resize: mode {mode!r} with {coords!r} coordinates")


@converts("Einsum")
def _einsum_onnx(c: OnnxCtx) -> str:
    """``Einsum`` as permutes, sums and one batched matmul (``kfuse.frontend.einsum``)."""
    from kfuse.frontend import einsum

    operands = [c.x(i) for i in range(len(c.inputs))]
    try:
        steps = einsum.plan(c.attr("equation"), [c.ttype(x).shape for x in operands])
    except einsum.EinsumUnsupported as e:
        raise Unsupported(str(e)) from e
    return einsum.emit(steps, operands, c.op) or c.op("reshape", [operands[0]], shape=c.ttype(operands[0]).shape)
