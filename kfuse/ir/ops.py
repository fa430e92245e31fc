"""The op registry: every kfuse op has a type rule and a PyTorch reference implementation.

The reference implementation is the oracle for tests and the implementation the runtime
uses for ops that no kfuse kernel covers. Type rules run the reference on ``meta`` tensors
unless an op gives an explicit rule (elementwise ops do: broadcasting plus torch's type
promotion), so a rule can never disagree with the reference.

Elementwise ops also carry a Triton expression template (``triton``) used by the epilogue
and pointwise code generators: ``{0}``, ``{1}`` are the operands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.ir.graph import TensorType, ValueType

Reference = Callable[[list[torch.Tensor], Mapping[str, Any]], Any]
TypeRule = Callable[[list[ValueType], Mapping[str, Any]], ValueType]

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
GEMM = "gemm"
CONV = "conv"
SHAPE = "shape"
OTHER = "other"
FUSED = "fused"


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    reference: Reference
    infer: TypeRule | None = None
    triton: str | None = None  # elementwise only: Triton expression template
    arity: int | None = None


REGISTRY: dict[str, OpDef] = {}


def register(
    name: str, kind: str, *, infer: TypeRule | None = None, triton: str | None = None, arity: int | None = None
) -> Callable[[Reference], Reference]:
    def deco(fn: Reference) -> Reference:
        REGISTRY[name] = OpDef(name, kind, fn, infer, triton, arity)
        return fn

    return deco


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown kfuse op {name!r}") from None


def is_elementwise(op: str) -> bool:
    d = REGISTRY.get(op)
    return d is not None and d.kind == ELEMENTWISE


def run_reference(op: str, inputs: list[torch.Tensor], attrs: Mapping[str, Any]) -> Any:
    return get(op).reference(inputs, attrs)


def infer_type(op: str, types: Sequence[ValueType], attrs: Mapping[str, Any]) -> ValueType:
    d = get(op)
    if d.arity is not None and len(types) != d.arity:
        raise ValueError(f"op {op} takes {d.arity} inputs, got {len(types)}")
    if d.infer is not None:
        return d.infer(list(types), attrs)
    return _infer_by_meta(d, list(types), attrs)


def _meta(t: ValueType) -> Any:
    if isinstance(t, tuple):
        return tuple(_meta(x) for x in t)
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _to_type(v: Any) -> ValueType:
    if isinstance(v, torch.Tensor):
        return TensorType(tuple(int(s) for s in v.shape), v.dtype)
    if isinstance(v, list | tuple):
        return tuple(_to_type(x) for x in v)  # type: ignore[return-value]
    raise TypeError(f"op returned {type(v).__name__}, expected a tensor")


def _infer_by_meta(d: OpDef, types: list[ValueType], attrs: Mapping[str, Any]) -> ValueType:
    try:
        out = d.reference([_meta(t) for t in types], attrs)
    except Exception as e:  # the message names the op and the operand types
        raise ValueError(f"op {d.name} does not accept inputs {[str(t) for t in types]} with {dict(attrs)}: {e}") from e
    return _to_type(out)


# ---------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------
def _broadcast(types: list[ValueType], attrs: Mapping[str, Any], result_dtype: torch.dtype | None = None) -> TensorType:
    tts = [t for t in types if isinstance(t, TensorType)]
    shape = tuple(torch.broadcast_shapes(*[t.shape for t in tts]))
    dtype = result_dtype if result_dtype is not None else _promote(tts)
    layout = next((t.layout for t in tts if t.shape == shape), "contiguous")
    return TensorType(shape, dtype, layout)


def _promote(tts: list[TensorType]) -> torch.dtype:
    """torch's type promotion: 0-d operands do not promote dimensioned ones of the same kind."""
    out = torch.empty((1,) * tts[0].rank, dtype=tts[0].dtype, device="meta")
    for t in tts[1:]:
        other = torch.empty((1,) * t.rank, dtype=t.dtype, device="meta")
        dt = torch.result_type(out, other)
        out = torch.empty((1,) * max(out.dim(), t.rank), dtype=dt, device="meta")
    return out.dtype


def _unary_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    t = types[0]
    assert isinstance(t, TensorType)
    return t if t.dtype.is_floating_point else t.with_dtype(torch.get_default_dtype())


def _same_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    t = types[0]
    assert isinstance(t, TensorType)
    return t


def _bool_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    return _broadcast(types, attrs, torch.bool)


def _binary_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    return _broadcast(types, attrs)


def _where_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    out = _broadcast(types, attrs)
    return TensorType(out.shape, _promote([t for t in types[1:] if isinstance(t, TensorType)]), out.layout)


def _cast_rule(types: list[ValueType], attrs: Mapping[str, Any]) -> TensorType:
    t = types[0]
    assert isinstance(t, TensorType)
    return t.with_dtype(attrs["dtype"])


def _unary(name: str, fn: Callable[[torch.Tensor], torch.Tensor], triton: str, rule: TypeRule = _unary_rule) -> None:
    register(name, ELEMENTWISE, infer=rule, triton=triton, arity=1)(lambda xs, a: fn(xs[0]))


def _sigmoid_of(z: str) -> str:
    """sigmoid(z) = 1 / (1 + exp(-z)) with the fast (2-ulp) division: tl.sigmoid's IEEE division is
    a ~10-instruction sequence with a slow path."""
    return f"tl.fdiv(1.0, 1.0 + tl.exp(-({z})))"


# max/min that return NaN where an operand is NaN, as PyTorch's relu, clamp, maximum and minimum do
# (PTX max.NaN); Triton's default may return the other operand
_NAN = "propagate_nan=tl.PropagateNan.ALL"

_unary("relu", torch.relu, "tl.maximum({0}, 0.0, " + _NAN + ")", _same_rule)
_unary("sigmoid", torch.sigmoid, _sigmoid_of("{0}"))
_unary("tanh", torch.tanh, f"(2.0 * {_sigmoid_of('2.0 * {0}')} - 1.0)")
_unary("silu", F.silu, "tl.fdiv({0}, 1.0 + tl.exp(-{0}))")
_unary(
    "hardswish",
    F.hardswish,
    f"({{0}} * tl.minimum(tl.maximum({{0}} + 3.0, 0.0, {_NAN}), 6.0, {_NAN}) / 6.0)",
)
_unary(
    "hardsigmoid",
    F.hardsigmoid,
    f"(tl.minimum(tl.maximum({{0}} + 3.0, 0.0, {_NAN}), 6.0, {_NAN}) / 6.0)",
)
_unary("neg", torch.neg, "(-{0})", _same_rule)
_unary("abs", torch.abs, "tl.abs({0})", _same_rule)
_unary("exp", torch.exp, "tl.exp({0})")
_unary("log", torch.log, "tl.log({0})")
_unary("sqrt", torch.sqrt, "tl.sqrt({0})")
_unary("rsqrt", torch.rsqrt, "tl.rsqrt({0})")
_unary("erf", torch.erf, "tl.erf({0})")
# libdevice's sin / cos (full range reduction): rotary angles reach position x frequency ~ 1e4 rad, where
# sin.approx loses every digit
_unary("sin", torch.sin, "tl.sin({0})")
_unary("cos", torch.cos, "tl.cos({0})")
_unary("reciprocal", torch.reciprocal, "(1.0 / {0})")
_unary("identity", lambda x: x, "{0}", _same_rule)


# Exact GELU = x * Phi(x), with erfc from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7) on
# MUFU.RCP / MUFU.EX2: ~28 SASS instructions a value on sm_90 where tl.erf (libdevice) took ~62
# and made 128x256 GEMM tiles spill (docs/perf-notes.md, session 7). The repeated t and erfc
# subexpressions are computed once: Triton's compiler CSEs them.
_AS_T = "tl.fdiv(1.0, 1.0 + 0.3275911 * tl.abs(X * 0.7071067811865476))"
_AS_ERFC = (
    f"({_AS_T} * (0.254829592 + {_AS_T} * (-0.284496736 + {_AS_T} * (1.421413741 + {_AS_T} * (-1.453152027 + {_AS_T} * 1.061405429))))"
    " * tl.exp(-0.5 * X * X))"
)
GELU_ERF = f"(X * tl.where(X >= 0.0, 1.0 - 0.5 * {_AS_ERFC}, 0.5 * {_AS_ERFC}))".replace("X", "{0}")
GELU_TANH = f"({{0}} * {_sigmoid_of('1.5957691216057308 * ({0} + 0.044715 * {0} * {0} * {0})')})"


@register("gelu", ELEMENTWISE, infer=_unary_rule, arity=1, triton=GELU_ERF)
def _gelu(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.gelu(xs[0], approximate="none")


# tanh-form GELU = x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3))
@register("gelu_tanh", ELEMENTWISE, infer=_unary_rule, arity=1, triton=GELU_TANH)
def _gelu_tanh(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.gelu(xs[0], approximate="tanh")


@register("leaky_relu", ELEMENTWISE, infer=_same_rule, arity=1, triton="tl.where({0} >= 0.0, {0}, {0} * {slope})")
def _leaky_relu(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.leaky_relu(xs[0], a.get("slope", 0.01))


@register(
    "clamp",
    ELEMENTWISE,
    infer=_same_rule,
    arity=1,
    triton=f"tl.minimum(tl.maximum({{0}}, {{lo}}, {_NAN}), {{hi}}, {_NAN})",
)
def _clamp(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.clamp(xs[0], a.get("lo"), a.get("hi"))


@register("cast", ELEMENTWISE, infer=_cast_rule, arity=1, triton="{0}")
def _cast(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].to(a["dtype"])


def _binary(name: str, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], triton: str, rule: TypeRule = _binary_rule) -> None:
    register(name, ELEMENTWISE, infer=rule, triton=triton, arity=2)(lambda xs, a: fn(xs[0], xs[1]))


_binary("add", torch.add, "({0} + {1})")
_binary("sub", torch.sub, "({0} - {1})")
_binary("mul", torch.mul, "({0} * {1})")
_binary("div", torch.div, "({0} / {1})", lambda ts, a: _div_rule(ts))
_binary("maximum", torch.maximum, f"tl.maximum({{0}}, {{1}}, {_NAN})")
_binary("minimum", torch.minimum, f"tl.minimum({{0}}, {{1}}, {_NAN})")
_binary("pow", torch.pow, "tl.exp({1} * tl.log({0}))")
_binary("eq", torch.eq, "({0} == {1})", _bool_rule)
_binary("ne", torch.ne, "({0} != {1})", _bool_rule)
_binary("lt", torch.lt, "({0} < {1})", _bool_rule)
_binary("le", torch.le, "({0} <= {1})", _bool_rule)
_binary("gt", torch.gt, "({0} > {1})", _bool_rule)
_binary("ge", torch.ge, "({0} >= {1})", _bool_rule)
_binary("logical_and", torch.logical_and, "({0} & {1})", _bool_rule)
_binary("logical_or", torch.logical_or, "({0} | {1})", _bool_rule)


def _div_rule(types: list[ValueType]) -> TensorType:
    out = _broadcast(types, {})
    return out if out.dtype.is_floating_point else out.with_dtype(torch.get_default_dtype())


@register("logical_not", ELEMENTWISE, infer=_same_rule, arity=1, triton="({0} == 0)")
def _lnot(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.logical_not(xs[0])


@register("where", ELEMENTWISE, infer=_where_rule, arity=3, triton="tl.where({0}, {1}, {2})")
def _where(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.where(xs[0], xs[1], xs[2])


# ---------------------------------------------------------------------------------------
# GEMM and convolution
# ---------------------------------------------------------------------------------------
@register("matmul", GEMM, arity=2)
def _matmul(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.matmul(xs[0], xs[1])


CONV_ACTIVATIONS = ("clamp", "silu", "gelu", "hardswish", "hardsigmoid")  # what a conv node's ``act`` attribute may name


def apply_activation(y: torch.Tensor, act: tuple[Any, ...] | None) -> torch.Tensor:
    """A conv's absorbed activation (``passes.fuse_conv_activation``): None, ("clamp", lo, hi), ("silu",), ("gelu",),
    ("hardswish",), ("hardsigmoid",)."""
    if act is None:
        return y
    if act[0] == "clamp":
        return torch.clamp(y, act[1], act[2])
    if act[0] == "silu":
        return F.silu(y)
    if act[0] == "gelu":
        return F.gelu(y)
    if act[0] == "hardswish":
        return F.hardswish(y)
    if act[0] == "hardsigmoid":
        return F.hardsigmoid(y)
    raise ValueError(f"unknown conv activation {act!r}")


@register("conv2d", CONV)
def _conv2d(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    bias = xs[2] if len(xs) > 2 else None
    x = xs[0]
    end = a.get("pad_end")  # padding past the bottom / right beyond ``padding`` (a folded asymmetric pad)
    if end is not None and any(end):
        x = F.pad(x, (0, end[1], 0, end[0]))
    y = F.conv2d(x, xs[1], bias, a.get("stride", (1, 1)), a.get("padding", (0, 0)), a.get("dilation", (1, 1)), a.get("groups", 1))
    return apply_activation(y, a.get("act"))


@register("batch_norm", OTHER, arity=5)
def _batch_norm(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    x, w, b, mean, var = xs
    return F.batch_norm(x, mean, var, w, b, training=False, eps=a.get("eps", 1e-5))


# ---------------------------------------------------------------------------------------
# normalisation, softmax, attention, embedding
# ---------------------------------------------------------------------------------------
@register("softmax", REDUCTION, infer=_same_rule, arity=1)
def _softmax(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.softmax(xs[0], a["dim"])


@register("log_softmax", REDUCTION, infer=_same_rule, arity=1)
def _log_softmax(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.log_softmax(xs[0], a["dim"])


@register("layer_norm", REDUCTION)
def _layer_norm(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return F.layer_norm(xs[0], tuple(a["normalized_shape"]), w, b, a.get("eps", 1e-5))


@register("rms_norm", REDUCTION)
def _rms_norm(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    w = xs[1] if len(xs) > 1 else None
    return F.rms_norm(xs[0], tuple(a["normalized_shape"]), w, a.get("eps"))


@register("sdpa", OTHER)
def _sdpa(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) > 3 else None
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=a.get("is_causal", False), scale=a.get("scale"), enable_gqa=a.get("enable_gqa", False)
    )


@register("embedding", OTHER, arity=2)
def _embedding(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    weight, idx = xs
    return F.embedding(idx, weight)


@register("cumsum", OTHER, arity=1)
def _cumsum(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    # RoBERTa / MPNet position ids: cumsum of the non-padding mask; PyTorch runs it in the plan
    return torch.cumsum(xs[0], a["dim"], dtype=a.get("dtype"))


@register("gather", OTHER, arity=2)
def _gather(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.gather(xs[0], a["dim"], xs[1])


# ---------------------------------------------------------------------------------------
# reductions and pooling
# ---------------------------------------------------------------------------------------
@register("sum", REDUCTION, arity=1)
def _sum(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    dims = a.get("dims")
    if dims is None:
        return torch.sum(xs[0], dtype=a.get("dtype"))
    return torch.sum(xs[0], tuple(dims), keepdim=a.get("keepdim", False), dtype=a.get("dtype"))


@register("mean", REDUCTION, arity=1)
def _mean(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    dims = a.get("dims")
    if dims is None:
        return torch.mean(xs[0], dtype=a.get("dtype"))
    return torch.mean(xs[0], tuple(dims), keepdim=a.get("keepdim", False), dtype=a.get("dtype"))


@register("amax", REDUCTION, arity=1)
def _amax(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.amax(xs[0], tuple(a["dims"]), keepdim=a.get("keepdim", False))


@register("var", REDUCTION, arity=1)
def _var(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.var(xs[0], tuple(a["dims"]), correction=a.get("correction", 1), keepdim=a.get("keepdim", False))


@register("max_pool2d", REDUCTION, arity=1)
def _max_pool2d(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.max_pool2d(
        xs[0], a["kernel_size"], a.get("stride") or a["kernel_size"], a.get("padding", 0), a.get("dilation", 1), a.get("ceil_mode", False)
    )


@register("avg_pool2d", REDUCTION, arity=1)
def _avg_pool2d(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.avg_pool2d(
        xs[0],
        a["kernel_size"],
        a.get("stride") or a["kernel_size"],
        a.get("padding", 0),
        a.get("ceil_mode", False),
        a.get("count_include_pad", True),
        a.get("divisor_override"),
    )


@register("group_norm", OTHER, arity=3)
def _group_norm(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    """``F.group_norm`` with weight and bias (inputs x, weight, bias), then SiLU where ``act`` is "silu"
    (``kfuse.passes.group_norm``; the kernel in ``kfuse.kernels.group_norm``)."""
    y = F.group_norm(xs[0], a["groups"], xs[1], xs[2], a.get("eps", 1e-5))
    return F.silu(y) if a.get("act") == "silu" else y


@register("upsample2d", OTHER, arity=1)
def _upsample2d(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    """``F.interpolate`` on 4-D input, bilinear or nearest, as PyTorch's own op (the scale factor the caller gave,
    if any, sets the coordinate step, as it does in eager)."""
    sh, sw = a.get("scale_factors", (None, None))
    if a.get("nearest_divide"):  # ONNX's floor(dst / scale) pick (kfuse.kernels.resize.upsample2d)
        x = xs[0]
        rows, cols = (_nearest_divided(n_in, n_out, s, x.device) for n_in, n_out, s in zip(x.shape[2:], a["size"], (sh, sw), strict=True))
        return x[:, :, rows[:, None], cols[None, :]]
    if a["mode"] == "bilinear":
        return torch.ops.aten.upsample_bilinear2d(xs[0], list(a["size"]), bool(a.get("align_corners", False)), sh, sw)
    return torch.ops.aten.upsample_nearest2d(xs[0], list(a["size"]), sh, sw)


def _nearest_divided(n_in: int, n_out: int, scale: float | None, device: torch.device) -> torch.Tensor:
    step = torch.tensor(scale if scale else n_out / n_in, dtype=torch.float32)
    return torch.clamp(torch.floor(torch.arange(n_out, dtype=torch.float32) / step).long(), max=n_in - 1).to(device)


@register("adaptive_avg_pool2d", REDUCTION, arity=1)
def _adaptive_avg_pool2d(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return F.adaptive_avg_pool2d(xs[0], a["output_size"])


# ---------------------------------------------------------------------------------------
# data movement
# ---------------------------------------------------------------------------------------
@register("reshape", SHAPE, arity=1)
def _reshape(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].reshape(a["shape"])


@register("permute", SHAPE, arity=1)
def _permute(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].permute(a["dims"])


@register("expand", SHAPE, arity=1)
def _expand(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].expand(a["shape"])


@register("slice", SHAPE, arity=1)
def _slice(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    dim = a["dim"]
    idx = [slice(None)] * xs[0].dim()
    idx[dim] = slice(a.get("start"), a.get("end"), a.get("step", 1))
    return xs[0][tuple(idx)]


@register("select", SHAPE, arity=1)
def _select(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].select(a["dim"], a["index"])


@register("cat", SHAPE)
def _cat(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return torch.cat(xs, a.get("dim", 0))


@register("contiguous", SHAPE, arity=1)
def _contiguous(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    fmt = torch.channels_last if a.get("layout") == "channels_last" else torch.contiguous_format
    return xs[0].contiguous(memory_format=fmt)


def _gather_rows_type(types: Sequence[ValueType], a: Mapping[str, Any]) -> ValueType:
    x = types[0]
    assert isinstance(x, TensorType)
    return x.with_shape(a["shape"])


@register("gather_rows", OTHER, arity=2, infer=_gather_rows_type)
def _gather_rows(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    """Rows of ``x`` over its last dim, ``index`` (1-D int) picking them: a row-only reordering
    (``kfuse.passes.gather_rows``) as one op."""
    x, index = xs
    return x.reshape(-1, x.shape[-1]).index_select(0, index).reshape(a["shape"])


@register("pad", OTHER, arity=1)
def _pad(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    """Constant padding, ``F.pad``'s order: (left, right) of the last dim, then of the one before, ..."""
    return F.pad(xs[0], a["pads"], value=a.get("value", 0.0))


@register("getitem", OTHER, arity=1, infer=lambda ts, a: ts[0][a["index"]])  # type: ignore[index]
def _getitem(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0][a["index"]]


# ---------------------------------------------------------------------------------------
# fallback: an op kfuse does not know, run by whoever imported it
# ---------------------------------------------------------------------------------------
@register("fallback", OTHER, infer=lambda ts, a: a["out_type"])
def _fallback(xs: list[torch.Tensor], a: Mapping[str, Any]) -> Any:
    return a["fn"](xs)


def scalar_value(t: torch.Tensor) -> float | int | bool | None:
    """The Python value of a one-element constant, else None."""
    if t.numel() != 1 or t.device.type == "meta":
        return None
    return t.reshape(()).item()
