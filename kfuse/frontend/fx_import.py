"""Import an ATen-level FX graph (from torch.export or Dynamo) into the kfuse IR.

Each ATen op maps to kfuse ops through a converter. An ATen op without a converter becomes a
``fallback`` node that calls the original op: the import never fails because of it, and the
compile report lists it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from kfuse.ir.graph import GraphBuilder, TensorType, ValueType
from kfuse.kernels.codegen import as_pair

aten = torch.ops.aten

Converter = Callable[["Ctx", tuple[Any, ...], dict[str, Any]], Any]
CONVERTERS: dict[Any, Converter] = {}


def converts(*packets: Any) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for p in packets:
            CONVERTERS[p] = fn
        return fn

    return deco


class HostValueError(NotImplementedError):
    """The exported graph reads a computed value on the host (``.item()``): one static kfuse graph cannot hold it."""


@dataclass
class Ctx:
    """What a converter sees: the builder and the node being converted."""

    b: GraphBuilder
    node: torch.fx.Node
    fallbacks: list[str] = field(default_factory=list)

    def ttype(self, name: str) -> TensorType:
        t = self.b.type_of(name)
        assert isinstance(t, TensorType)
        return t

    def op(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.b.op(op, inputs, attrs, name=self.b.fresh(op))

    def value(self, x: Any, like: str | None = None) -> str:
        """A graph value for ``x``: a value name stays, a Python number becomes a 0-d constant."""
        if isinstance(x, str):
            return x
        if isinstance(x, bool | int | float):
            like = like if isinstance(like, str) else None
            if like is not None and not isinstance(x, float) and self.ttype(like).dtype.is_floating_point:
                x = float(x)
            return self.b.scalar(x, like=like)
        if isinstance(x, torch.Tensor):
            return self.b.add_constant(x)
        raise TypeError(f"cannot use {type(x).__name__} as a tensor operand")


def _fx_type(val: Any) -> ValueType | None:
    if isinstance(val, torch.Tensor):
        return TensorType(tuple(int(s) for s in val.shape), val.dtype)
    if isinstance(val, list | tuple):
        parts = [_fx_type(v) for v in val]
        if all(isinstance(p, TensorType) for p in parts):
            return tuple(parts)  # type: ignore[return-value]
    return None


class _Slot:
    def __init__(self, i: int) -> None:
        self.i = i


class FallbackCall:
    """A fallback node's call: ``target`` with the node's literal arguments and its tensor operands (``_Slot``s
    into the step's inputs). ``call_as`` runs another overload on the same arguments: the runtime runs a
    functional ``index_copy`` that forward writes back into its input as ``index_copy_``
    (``kfuse.runtime.state_writes``)."""

    def __init__(self, target: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.target = target
        self.args = args
        self.kwargs = kwargs

    def first_operand(self) -> int | None:
        """Which step input is the call's first positional argument (None if that is not a tensor operand)."""
        return self.args[0].i if self.args and isinstance(self.args[0], _Slot) else None

    def __call__(self, xs: list[torch.Tensor]) -> Any:
        return self.call_as(self.target, xs)

    def call_as(self, target: Any, xs: list[torch.Tensor]) -> Any:
        def put(a: Any) -> Any:
            if isinstance(a, _Slot):
                return xs[a.i]
            if isinstance(a, list | tuple):
                return type(a)(put(x) for x in a)
            if isinstance(a, torch.device) and xs:
                return xs[0].device
            return a

        kw = {k: put(v) for k, v in self.kwargs.items()}
        if "device" in kw and xs:
            kw["device"] = xs[0].device
        return target(*put(self.args), **kw)


def _make_fallback(ctx: Ctx, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, Any]) -> Any:
    """A node that runs ``target`` through PyTorch with the node's tensor operands. ``args`` and ``kwargs`` are
    the FX node's own: an operand is an FX node (its kfuse value in ``env``), anything else a literal, strings
    included (``aten.pad``'s ``mode="constant"`` is not a value name)."""
    names: list[str] = []

    def slot(v: Any) -> Any:
        if isinstance(v, str):  # a kfuse value name
            names.append(v)
            return _Slot(len(names) - 1)
        if isinstance(v, list | tuple):
            return type(v)(slot(x) for x in v)
        return v

    def lift(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return slot(env[a.name])
        if isinstance(a, list | tuple):
            return type(a)(lift(x) for x in a)
        return a

    fn = FallbackCall(target, lift(args), {k: lift(v) for k, v in kwargs.items()})
    out_type = _fx_type(ctx.node.meta.get("val"))
    if out_type is None:
        raise HostValueError(
            f"op {target} returns a non-tensor value (a value read on the host inside forward, e.g. .item()), which one "
            'kfuse graph cannot hold; torch.compile(model, backend="kfuse") breaks the graph there and compiles the rest'
        )
    op_name = str(target)
    ctx.fallbacks.append(op_name)
    name = ctx.b.op("fallback", names, {"fn": fn, "target": op_name, "out_type": out_type}, name=ctx.b.fresh("fallback"))
    if isinstance(out_type, tuple):
        return [ctx.b.op("getitem", [name], {"index": i}) for i in range(len(out_type))]
    return name


@dataclass(frozen=True)
class ImportedGraph:
    builder: GraphBuilder
    outputs: list[str]
    fallbacks: list[str]


def import_fx(
    gm: torch.fx.GraphModule,
    placeholder_values: dict[str, torch.Tensor | TensorType],
    name: str = "graph",
) -> ImportedGraph:
    """Convert ``gm`` into kfuse IR.

    ``placeholder_values`` maps each placeholder name to a constant tensor (weights) or to the
    TensorType of a runtime input. Inputs keep their placeholder names.
    """
    b = GraphBuilder(name)
    fallbacks: list[str] = []

    def bind(node: torch.fx.Node) -> Any:
        v = placeholder_values.get(node.name)
        if isinstance(v, torch.Tensor):
            return b.add_constant(v.detach(), name=_clean(node.name))
        if isinstance(v, TensorType):
            return b.add_input(node.name, v)
        return node.meta.get("val")  # a non-tensor input, specialised by export

    outputs: list[str] = []
    for o, v in _import_nodes(gm, b, fallbacks, bind):
        if not isinstance(v, str):  # Dynamo keeps Python values out of its graphs: kfuse.compile goes that way
            raise HostValueError(f"graph output {o} is not a tensor (the model returns a Python value)")
        outputs.append(v)
    return ImportedGraph(b, outputs, fallbacks)


def _import_nodes(
    gm: torch.fx.GraphModule, b: GraphBuilder, fallbacks: list[str], bind: Callable[[torch.fx.Node], Any], prefix: str = ""
) -> list[tuple[Any, Any]]:
    """Convert the nodes of ``gm`` into ``b`` (``bind`` gives each placeholder's value); returns
    the (FX output, kfuse value) pairs of its output node. ``prefix`` names the constants of an
    inlined sub-graph apart from the outer graph's."""
    env: dict[str, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = bind(node)
        elif node.op == "get_attr":
            obj = _get_attr(gm, node.target)
            # a sub-graph of a higher-order op stays a module, inlined where the op is called
            is_graph = isinstance(obj, torch.fx.GraphModule)
            env[node.name] = obj if is_graph else b.add_constant(obj.detach(), name=_clean(prefix + node.name))
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: env[n.name])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n.name])
            target = node.target
            if target is operator.getitem:
                env[node.name] = args[0][args[1]]
                continue
            inlined = _inline_region(target, args, b, fallbacks, prefix + node.name + "_")
            if inlined is not None:
                env[node.name] = inlined
                continue
            ctx = Ctx(b, node, fallbacks)
            packet = getattr(target, "overloadpacket", target)
            conv = CONVERTERS.get(packet)
            inplace = conv is None and _functional_of(packet) is not None
            if inplace:
                # x.relu_() etc.: convert as the functional op, then let later readers of x
                # see the result (the IR is SSA; the mutation becomes a rename)
                conv = CONVERTERS.get(_functional_of(packet))
            if conv is not None:
                try:
                    env[node.name] = conv(ctx, tuple(args), dict(kwargs))
                    if inplace and isinstance(node.args[0], torch.fx.Node):
                        env[node.args[0].name] = env[node.name]
                    continue
                except _Unsupported:
                    pass
            if _is_metadata_only(target):
                env[node.name] = None
                continue
            env[node.name] = _make_fallback(ctx, target, tuple(node.args), dict(node.kwargs), env)
        elif node.op == "output":
            flat = node.args[0]
            flat = flat if isinstance(flat, list | tuple) else (flat,)
            return [(o, env[o.name] if isinstance(o, torch.fx.Node) else o) for o in flat]
        else:
            raise NotImplementedError(f"FX node kind {node.op} ({node.target}) is not supported")
    raise NotImplementedError(f"FX graph {type(gm).__name__} has no output node")


def _inline_region(target: Any, args: Sequence[Any], b: GraphBuilder, fallbacks: list[str], prefix: str) -> list[Any] | None:
    """The outputs of a grad-mode or autocast region (higher-order ops ``wrap_with_set_grad_enabled``
    and ``wrap_with_autocast``, which ``torch.export`` makes of ``torch.no_grad()`` / ``torch.autocast``
    blocks), its sub-graph imported inline; None for any other op. Grad mode means nothing to an
    inference graph. A disabled autocast region is plain code; an enabled one would change dtypes
    that the sub-graph does not show, so it is refused with the way out."""
    name = getattr(target, "__name__", str(target))
    if name == "wrap_with_set_grad_enabled":
        sub, operands = args[1], args[2:]
    elif name == "wrap_with_autocast":
        if args[2]:
            raise NotImplementedError(
                f"an enabled torch.autocast region ({args[0]}, {args[1]}) in the exported graph: kfuse compiles in the "
                "model's own dtypes; convert the model (model.half()) instead of autocasting it"
            )
        sub, operands = args[4], args[5:]
    else:
        return None
    placeholders = iter(operands)
    return [v for _, v in _import_nodes(sub, b, fallbacks, lambda _node: next(placeholders), prefix)]


def _functional_of(packet: Any) -> Any:
    """aten.relu_ -> aten.relu (the functional twin of an in-place op), else None."""
    name = getattr(packet, "__name__", "")
    if not name.endswith("_") or name.startswith("_"):
        return None
    return getattr(aten, name[:-1], None)


def _clean(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _get_attr(gm: torch.nn.Module, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _is_metadata_only(target: Any) -> bool:
    name = str(target)
    return any(s in name for s in ("_assert_tensor_metadata", "sym_constrain_range", "_assert_scalar", "sym_size"))


class _Unsupported(Exception):
    """Raised by a converter for a variant it does not handle: the op falls back."""


# ---------------------------------------------------------------------------------------
# converters
# ---------------------------------------------------------------------------------------
def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


@converts(aten.linear)
def _linear(c: Ctx, a: tuple, k: dict) -> str:
    x, w = a[0], a[1]
    bias = a[2] if len(a) > 2 else k.get("bias")
    wt = c.op("permute", [w], dims=(1, 0))
    y = c.op("matmul", [x, wt])
    return c.op("add", [y, bias]) if bias is not None else y


@converts(aten.matmul, aten.mm, aten.bmm)
def _matmul(c: Ctx, a: tuple, k: dict) -> str:
    return c.op("matmul", [a[0], a[1]])


@converts(aten.addmm, aten.baddbmm)
def _addmm(c: Ctx, a: tuple, k: dict) -> str:
    """beta * input + alpha * (x @ w); baddbmm batched (BLOOM's attention scores with the ALiBi bias). With
    beta = 0 PyTorch ignores the input, NaNs included."""
    bias, x, w = a[:3]
    beta, alpha = k.get("beta", 1), k.get("alpha", 1)
    y = c.op("matmul", [x, w])
    if alpha != 1:
        y = c.op("mul", [y, c.value(alpha, y)])
    if beta == 0:
        return y  # the input only broadcasts to the product's shape
    if beta != 1:
        bias = c.op("mul", [bias, c.value(beta, bias)])
    return c.op("add", [y, bias])


@converts(aten.t)
def _t(c: Ctx, a: tuple, k: dict) -> str:
    return c.op("permute", [a[0]], dims=(1, 0)) if c.ttype(a[0]).rank == 2 else a[0]


@converts(aten.conv2d)
def _conv2d(c: Ctx, a: tuple, k: dict) -> str:
    x, w = a[0], a[1]
    bias = a[2] if len(a) > 2 else k.get("bias")
    stride, padding, dilation, groups = (list(a[3:]) + [None] * 4)[:4]
    attrs = {
        "stride": as_pair(k.get("stride") if stride is None else stride, 1),
        "dilation": as_pair(k.get("dilation") if dilation is None else dilation, 1),
        "groups": int(groups if groups is not None else k.get("groups", 1)),
    }
    padding = k.get("padding") if padding is None else padding
    if isinstance(padding, str):  # aten.conv2d.padding (EfficientNet's depthwise convs)
        padding = _string_padding(padding, tuple(c.ttype(w).shape[2:]), attrs["dilation"], attrs["stride"])
    attrs["padding"] = as_pair(padding, 0)
    ins = [x, w] + ([bias] if bias is not None else [])
    return c.op("conv2d", ins, **attrs)


def _one(v: Any, default: int) -> int:
    """A 1-D conv's stride / padding / dilation: an int or a one-element list."""
    if v is None:
        return default
    return int(v[0]) if isinstance(v, list | tuple) else int(v)


@converts(aten.conv1d)
def _conv1d(c: Ctx, a: tuple, k: dict) -> str:
    """A 1-D conv as a 2-D one over (N, C, L, 1) with a (K, 1) kernel: ConvBERT's separable convs, audio
    models' feature extractors (PyTorch fallbacks before session 38). The reshapes are views; the weight's
    folds into a constant."""
    x, w = a[0], a[1]
    bias = a[2] if len(a) > 2 else k.get("bias")
    stride, padding, dilation, groups = (list(a[3:]) + [None] * 4)[:4]
    s, d = _one(k.get("stride") if stride is None else stride, 1), _one(k.get("dilation") if dilation is None else dilation, 1)
    g = int(groups if groups is not None else k.get("groups", 1))
    padding = k.get("padding") if padding is None else padding
    return _conv1d_as_2d(c, x, w, bias, s, padding, d, g)


def _conv1d_as_2d(c: Ctx, x: str, w: str, bias: str | None, stride: int, padding: Any, dilation: int, groups: int) -> str:
    xt, wt = c.ttype(x), c.ttype(w)
    if xt.rank != 3 or wt.rank != 3:
        raise _Unsupported()
    if isinstance(padding, str):
        p = _string_padding(padding, (wt.shape[2], 1), (dilation, 1), (stride, 1))[0]
    else:
        p = _one(padding, 0)
    x4 = c.op("reshape", [x], shape=(*xt.shape, 1))
    w4 = c.op("reshape", [w], shape=(*wt.shape, 1))
    ins = [x4, w4] + ([bias] if bias is not None else [])
    y = c.op("conv2d", ins, stride=(stride, 1), padding=(p, 0), dilation=(dilation, 1), groups=groups)
    yt = c.ttype(y)
    return c.op("reshape", [y], shape=yt.shape[:3])


def _string_padding(mode: str, kernel: tuple[int, ...], dilation: tuple[int, int], stride: tuple[int, int]) -> tuple[int, int]:
    """``padding="valid"`` / ``"same"`` as kfuse's symmetric padding. PyTorch's "same" (stride 1 only) pads
    ``d * (k - 1)`` in all, the odd element on the right; where that total is odd the padding is
    asymmetric, which kfuse's conv does not take: the op stays in PyTorch."""
    if mode == "valid":
        return (0, 0)
    if mode != "same" or stride != (1, 1) or len(kernel) != 2:
        raise _Unsupported()
    total = [d * (kk - 1) for d, kk in zip(dilation, kernel, strict=True)]
    if any(t % 2 for t in total):
        raise _Unsupported()
    return (total[0] // 2, total[1] // 2)


@converts(aten.pad)
def _pad(c: Ctx, a: tuple, k: dict) -> str:
    """Constant padding is a ``pad`` node (a zero-width one is no node: HF's TF-style "same" padding pads every
    1x1 conv by nothing), which a conv after it can absorb (``passes.fold_pad``); reflect / replicate /
    circular padding stays in PyTorch."""
    mode = a[2] if len(a) > 2 else k.get("mode", "constant")
    if mode != "constant":
        raise _Unsupported()
    return _constant_pad(c, a[0], a[1], a[3] if len(a) > 3 else k.get("value"))


@converts(aten.constant_pad_nd)
def _constant_pad_nd(c: Ctx, a: tuple, k: dict) -> str:
    return _constant_pad(c, a[0], a[1], a[2] if len(a) > 2 else k.get("value", 0.0))


def _constant_pad(c: Ctx, x: str, pads_in: Any, value: Any) -> str:
    pads = tuple(int(p) for p in pads_in)
    if any(p < 0 for p in pads) or len(pads) % 2 or len(pads) // 2 > c.ttype(x).rank:  # negative: a crop
        raise _Unsupported()
    if not any(pads):
        return x
    return c.op("pad", [x], pads=pads, value=float(value if value is not None else 0.0))


@converts(aten.convolution)
def _convolution(c: Ctx, a: tuple, k: dict) -> str:
    x, w, bias, stride, padding, dilation, transposed, _out_pad, groups = a[:9]
    if not transposed and c.ttype(x).rank == 3:
        return _conv1d_as_2d(c, x, w, bias, _one(stride, 1), padding, _one(dilation, 1), int(groups))
    if transposed or c.ttype(x).rank != 4:
        raise _Unsupported()
    ins = [x, w] + ([bias] if bias is not None else [])
    return c.op("conv2d", ins, stride=as_pair(stride, 1), padding=as_pair(padding, 0), dilation=as_pair(dilation, 1), groups=int(groups))


@converts(aten.batch_norm)
def _batch_norm(c: Ctx, a: tuple, k: dict) -> str:
    x, w, bias, mean, var, training, _mom, eps = a[:8]
    if training or mean is None:
        raise _Unsupported()
    return _bn(c, x, w, bias, mean, var, eps)


@converts(aten._native_batch_norm_legit_no_training)
def _bn_legit(c: Ctx, a: tuple, k: dict) -> list:
    x, w, bias, mean, var, _mom, eps = a[:7]
    return [_bn(c, x, w, bias, mean, var, eps), None, None]


def _bn(c: Ctx, x: str, w: str | None, bias: str | None, mean: str, var: str, eps: float) -> str:
    ch = c.ttype(x).shape[1]
    dt = c.ttype(mean).dtype
    w = w if w is not None else c.b.add_constant(torch.ones(ch, dtype=dt))
    bias = bias if bias is not None else c.b.add_constant(torch.zeros(ch, dtype=dt))
    return c.op("batch_norm", [x, w, bias, mean, var], eps=float(eps))


def _unary_conv(op: str) -> Converter:
    return lambda c, a, k: c.op(op, [a[0]])


for _packet, _op in [
    (aten.relu, "relu"),
    (aten.sigmoid, "sigmoid"),
    (aten.tanh, "tanh"),
    (aten.silu, "silu"),
    (aten.hardswish, "hardswish"),
    (aten.hardsigmoid, "hardsigmoid"),
    (aten.neg, "neg"),
    (aten.abs, "abs"),
    (aten.exp, "exp"),
    (aten.log, "log"),
    (aten.sqrt, "sqrt"),
    (aten.rsqrt, "rsqrt"),
    (aten.erf, "erf"),
    (aten.sin, "sin"),
    (aten.cos, "cos"),
    (aten.reciprocal, "reciprocal"),
    (aten.logical_not, "logical_not"),
]:
    CONVERTERS[_packet] = _unary_conv(_op)


@converts(aten.gelu)
def _gelu(c: Ctx, a: tuple, k: dict) -> str:
    approx = k.get("approximate", a[1] if len(a) > 1 else "none")
    return c.op("gelu_tanh" if approx == "tanh" else "gelu", [a[0]])


@converts(aten.leaky_relu)
def _leaky(c: Ctx, a: tuple, k: dict) -> str:
    return c.op("leaky_relu", [a[0]], slope=float(a[1] if len(a) > 1 else k.get("negative_slope", 0.01)))


@converts(aten.clamp, aten.hardtanh, aten.clip)
def _clamp(c: Ctx, a: tuple, k: dict) -> str:
    lo = a[1] if len(a) > 1 else k.get("min", -1.0 if "hardtanh" in str(c.node.target) else None)
    hi = a[2] if len(a) > 2 else k.get("max", 1.0 if "hardtanh" in str(c.node.target) else None)
    if isinstance(lo, str) or isinstance(hi, str):  # clamp.Tensor (T5's fp16 overflow guard): max, then min
        y = a[0] if lo is None else c.op("maximum", [a[0], c.value(lo, a[0])])
        return y if hi is None else c.op("minimum", [y, c.value(hi, a[0])])
    return c.op("clamp", [a[0]], lo=lo, hi=hi)


@converts(aten.isinf)
def _isinf(c: Ctx, a: tuple, k: dict) -> str:
    """|x| == inf (NaN is not infinite, as in PyTorch); one of T5's fp16 guard ops, a fallback before session 37."""
    return c.op("eq", [c.op("abs", [a[0]]), c.value(float("inf"), a[0])])


@converts(aten.any)
def _any(c: Ctx, a: tuple, k: dict) -> str:
    """any(x) = max(x != 0) over the dims, as a float reduction (kfuse's reductions take numbers, not bools)."""
    x = a[0]
    dims = _reduced_dims(c.ttype(x).rank, a[1] if len(a) > 1 else k.get("dim"))
    keepdim = bool(a[2] if len(a) > 2 else k.get("keepdim", False))
    xt = c.ttype(x).dtype
    flag = xt if xt.is_floating_point else torch.float32  # 0/1 is exact in any float type: fp16 halves the bytes
    nz = c.op("cast", [c.op("ne", [x, c.value(0, x)])], dtype=flag)
    m = c.op("amax", [nz], dims=dims, keepdim=keepdim)
    return c.op("ne", [m, c.value(0.0, m)])


def _indices_unused(c: Ctx) -> bool:
    """The node returns (values, indices) and nothing reads the indices."""
    return all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in c.node.users)


@converts(aten.max, aten.min)
def _max_min(c: Ctx, a: tuple, k: dict) -> Any:
    """``max.other`` / ``min.other`` (two tensors: XGLM's attention-mask floor, T5's position buckets) as
    maximum / minimum; ``max(x, dim)`` whose indices nothing reads (Hiera's query pooling) as ``amax``, and
    ``min(x, dim)`` as ``-amax(-x)``. The other reducing overloads stay PyTorch's."""
    is_max = "max" in str(c.node.target)
    if len(a) >= 2 and isinstance(a[1], int) and not isinstance(a[1], bool) and _indices_unused(c):
        keepdim = bool(a[2] if len(a) > 2 else k.get("keepdim", False))
        dims = _reduced_dims(c.ttype(a[0]).rank, a[1])
        if is_max:
            return [c.op("amax", [a[0]], dims=dims, keepdim=keepdim), None]
        return [c.op("neg", [c.op("amax", [c.op("neg", [a[0]])], dims=dims, keepdim=keepdim)]), None]
    if len(a) != 2 or not isinstance(a[1], str) or k:
        raise _Unsupported()
    return c.op("maximum" if is_max else "minimum", [a[0], a[1]])


@converts(aten.full_like)
def _full_like(c: Ctx, a: tuple, k: dict) -> str:
    """A constant of ``x``'s shape (T5's relative position buckets)."""
    xt = c.ttype(a[0])
    return _filled(c, xt.shape, a[1] if len(a) > 1 else k.get("fill_value"), k.get("dtype") or xt.dtype, k)


@converts(aten.item, aten._local_scalar_dense)
def _item(c: Ctx, a: tuple, k: dict) -> Any:
    """``t.item()`` of a constant (a buffer: YOLOv8's anchor strides, ``new_full(..., self.stride[i])``): its value,
    read once at import, as the Python number every reader then gets. Of a computed tensor it stays unsupported (a
    host read kfuse's static plan cannot hold; ``kfuse.compile`` then compiles through Dynamo)."""
    from kfuse.passes.fold import constant_value

    t = constant_value(c.b.build([a[0]]), a[0]) if isinstance(a[0], str) else None
    if t is None or t.numel() != 1 or t.device.type == "meta":
        raise _Unsupported()
    return t.reshape(()).item()


@converts(aten.new_zeros, aten.new_ones, aten.new_full)
def _new_filled(c: Ctx, a: tuple, k: dict) -> str:
    """``x.new_zeros(size)`` and its kin: a constant of x's dtype, not of its values (torchvision's Swin builds its
    shifted-window mask in one, then writes region ids into slices of it: all of it folds)."""
    target = str(c.node.target)
    size = a[1] if len(a) > 1 else k.get("size")
    value = 0 if "new_zeros" in target else 1 if "new_ones" in target else a[2] if len(a) > 2 else k.get("fill_value")
    return _filled(c, tuple(int(n) for n in size), value, k.get("dtype") or c.ttype(a[0]).dtype, k)


@converts(aten.full)
def _full(c: Ctx, a: tuple, k: dict) -> str:
    """``torch.full(size, value)``: XGLM's ``finfo.min`` floor (a 0-d full) and causal-mask fill, made on the
    model's device at import before."""
    val = c.node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise _Unsupported()
    return _filled(c, tuple(int(s) for s in a[0]), a[1] if len(a) > 1 else k.get("fill_value"), val.dtype, k)


def _filled(c: Ctx, shape: tuple[int, ...], value: Any, dtype: torch.dtype, k: dict) -> str:
    """A 0-d constant, expanded to ``shape``: it folds and fuses like any scalar, so the chain after it can fold
    when its other inputs are constants too."""
    if not isinstance(value, bool | int | float) or k.get("layout") not in (None, torch.strided):
        raise _Unsupported()
    scalar = c.b.scalar(value, dtype=dtype)
    return c.op("expand", [scalar], shape=tuple(shape)) if shape else scalar


@converts(aten.clamp_min, aten.clamp_max)
def _clamp_one_side(c: Ctx, a: tuple, k: dict) -> str:
    """``clamp_min`` / ``clamp_max`` (F.normalize's eps floor) as a clamp, or maximum / minimum for a tensor bound."""
    lo = "min" in str(c.node.target)
    bound = a[1] if len(a) > 1 else k.get("min" if lo else "max")
    if not isinstance(bound, str | int | float):
        raise _Unsupported()
    return _clamp(c, (a[0], bound, None) if lo else (a[0], None, bound), {})


@converts(aten.index)
def _index(c: Ctx, a: tuple, k: dict) -> str:
    """``x[..., idx, ...]`` with one constant index of consecutive ascending positions along one dim: a slice
    (Falcon's ``qkv[..., [-2], :]`` key / value split: a fallback in the middle of its attention before
    session 38). Any other advanced indexing stays PyTorch's."""
    x, idx = a[0], list(a[1])
    t = c.ttype(x)
    where = [i for i, v in enumerate(idx) if v is not None]
    if len(where) != 1 or not isinstance(idx[where[0]], str) or idx[where[0]] not in c.b.constants:
        raise _Unsupported()
    dim, pos = where[0], c.b.constants[idx[where[0]]]
    if pos.dim() != 1 or pos.numel() == 0 or pos.dtype not in (torch.int64, torch.int32) or dim >= t.rank:
        raise _Unsupported()
    pos = [int(v) % t.shape[dim] if -t.shape[dim] <= int(v) < t.shape[dim] else None for v in pos.tolist()]
    if None in pos or pos != list(range(pos[0], pos[0] + len(pos))):
        raise _Unsupported()
    return c.op("slice", [x], dim=dim, start=pos[0], end=pos[0] + len(pos), step=1)


@converts(aten.square)
def _square(c: Ctx, a: tuple, k: dict) -> str:
    """x * x (Persimmon's and Nemotron's layer norms)."""
    return c.op("mul", [a[0], a[0]])


@converts(aten.relu6)
def _relu6(c: Ctx, a: tuple, k: dict) -> str:
    """torchvision's MobileNet-V2 (``nn.ReLU6``): a fallback before session 37."""
    return c.op("clamp", [a[0]], lo=0.0, hi=6.0)


def _binary_conv(op: str, swap: bool = False) -> Converter:
    def conv(c: Ctx, a: tuple, k: dict) -> str:
        x, y = a[0], a[1]
        # add/sub/rsub.Scalar take alpha positionally (rsub.Scalar(x, 2.0, 3) is how export records it)
        alpha = a[2] if len(a) > 2 and op in ("add", "sub") else k.get("alpha", 1)
        if not isinstance(x, str):
            x = c.value(x, y)
        y = c.value(y, x)
        if k.get("rounding_mode") is not None:
            raise _Unsupported()
        if alpha != 1:  # alpha scales the subtrahend: x - alpha*y, and for rsub y - alpha*x
            if swap:
                x = c.op("mul", [x, c.value(alpha, x)])
            else:
                y = c.op("mul", [y, c.value(alpha, y)])
        return c.op(op, [y, x] if swap else [x, y])

    return conv


for _packet, _op in [
    (aten.add, "add"),
    (aten.sub, "sub"),
    (aten.mul, "mul"),
    (aten.div, "div"),
    (aten.maximum, "maximum"),
    (aten.minimum, "minimum"),
    (aten.pow, "pow"),
    (aten.eq, "eq"),
    (aten.ne, "ne"),
    (aten.lt, "lt"),
    (aten.le, "le"),
    (aten.gt, "gt"),
    (aten.ge, "ge"),
    (aten.multiply, "mul"),  # the long names: export keeps them as written (ConvBERT's torch.multiply)
    (aten.subtract, "sub"),
    (aten.divide, "div"),
    (aten.true_divide, "div"),
    (aten.greater, "gt"),
    (aten.greater_equal, "ge"),
    (aten.less, "lt"),
    (aten.less_equal, "le"),
    (aten.not_equal, "ne"),
    (aten.logical_and, "logical_and"),
    (aten.logical_or, "logical_or"),
    (aten.bitwise_and, "logical_and"),
    (aten.bitwise_or, "logical_or"),
    (aten.__and__, "logical_and"),
    (aten.__or__, "logical_or"),
]:
    CONVERTERS[_packet] = _binary_conv(_op)
CONVERTERS[aten.rsub] = _binary_conv("sub", swap=True)


@converts(aten.bitwise_not)
def _bitwise_not(c: Ctx, a: tuple, k: dict) -> str:
    if c.ttype(a[0]).dtype != torch.bool:
        raise _Unsupported()
    return c.op("logical_not", [a[0]])


@converts(aten.where)
def _where(c: Ctx, a: tuple, k: dict) -> str:
    if len(a) != 3:
        raise _Unsupported()
    cond, x, y = a
    x = c.value(x, y if isinstance(y, str) else None)
    y = c.value(y, x)
    return c.op("where", [cond, x, y])


@converts(aten.masked_fill)
def _masked_fill(c: Ctx, a: tuple, k: dict) -> str:
    x, mask, val = a
    val = c.value(val, x) if not isinstance(val, str) else val
    if c.ttype(val).dtype != c.ttype(x).dtype:
        val = c.op("cast", [val], dtype=c.ttype(x).dtype)
    return c.op("where", [mask, val, x])


@converts(aten.to, aten._to_copy, aten.type_as)
def _to(c: Ctx, a: tuple, k: dict) -> str:
    x = a[0]
    dtype = k.get("dtype")
    if c.node.target == aten.type_as.default:
        dtype = c.ttype(a[1]).dtype
    for extra in a[1:]:
        if isinstance(extra, torch.dtype):
            dtype = extra
    if dtype is None or dtype == c.ttype(x).dtype:
        return x
    return c.op("cast", [x], dtype=dtype)


def _softmax_input(c: Ctx, a: tuple, k: dict) -> str:
    """softmax's input, cast first to the requested dtype (``dtype=``, or ``_softmax``'s ``half_to_float``)."""
    x = a[0]
    extra = a[2] if len(a) > 2 else k.get("dtype", k.get("half_to_float"))
    if isinstance(extra, torch.dtype):
        dtype = extra
    elif extra is True and c.ttype(x).dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    else:
        dtype = None
    if dtype is not None and dtype != c.ttype(x).dtype:
        x = c.op("cast", [x], dtype=dtype)
    return x


@converts(aten.softmax, aten._softmax)
def _softmax(c: Ctx, a: tuple, k: dict) -> str:
    x = _softmax_input(c, a, k)
    return c.op("softmax", [x], dim=_dim(a[1], c.ttype(x).rank))


@converts(aten.log_softmax, aten._log_softmax)
def _log_softmax(c: Ctx, a: tuple, k: dict) -> str:
    x = _softmax_input(c, a, k)
    return c.op("log_softmax", [x], dim=_dim(a[1], c.ttype(x).rank))


@converts(aten.layer_norm)
def _layer_norm(c: Ctx, a: tuple, k: dict) -> str:
    x, shape = a[0], a[1]
    w = a[2] if len(a) > 2 else k.get("weight")
    bias = a[3] if len(a) > 3 else k.get("bias")
    eps = a[4] if len(a) > 4 else k.get("eps", 1e-5)
    if w is None and bias is not None:
        raise _Unsupported()
    ins = [x] + ([w] if w is not None else []) + ([bias] if bias is not None else [])
    return c.op("layer_norm", ins, normalized_shape=tuple(shape), eps=float(eps))


@converts(aten.native_layer_norm)
def _native_layer_norm(c: Ctx, a: tuple, k: dict) -> list:
    x, shape, w, bias, eps = a[:5]
    if w is None or bias is None:
        raise _Unsupported()
    return [c.op("layer_norm", [x, w, bias], normalized_shape=tuple(shape), eps=float(eps)), None, None]


@converts(aten.group_norm)
def _group_norm(c: Ctx, a: tuple, k: dict) -> str:
    arg = lambda i, name, default=None: a[i] if len(a) > i else k.get(name, default)  # noqa: E731
    return _group_norm_of(c, a[0], int(arg(1, "num_groups")), arg(2, "weight"), arg(3, "bias"), float(arg(4, "eps", 1e-5)))


@converts(aten.native_group_norm)
def _native_group_norm(c: Ctx, a: tuple, k: dict) -> list:
    x, w, bias, _n, _c, _hw, groups, eps = a[:8]
    return [_group_norm_of(c, x, int(groups), w, bias, float(eps)), None, None]


def _group_norm_of(c: Ctx, x: str, groups: int, w: str | None, bias: str | None, eps: float) -> str:
    """GroupNorm with its affine as one ``group_norm`` op (``kfuse.kernels.group_norm``: diffusion U-Nets and VAEs,
    MobileViT-V2, ConvBERT); without weight or bias, or on [N, C], a layer norm over each (sample, group) row of
    ``C / G * H * W`` values, then the per-channel affine (``kfuse.passes.group_norm.decompose`` writes the same)."""
    t = c.ttype(x)
    if t.rank < 2 or t.shape[1] % groups:
        raise _Unsupported()
    if t.rank >= 3 and w is not None and bias is not None:  # one op (two kernels); ``Options.group_norm=False`` decomposes it
        return c.op("group_norm", [x, w, bias], groups=groups, eps=eps)
    n, ch = t.shape[0], t.shape[1]
    length = ch // groups * math.prod(t.shape[2:])
    y = c.op("reshape", [x], shape=(n, groups, length))
    y = c.op("layer_norm", [y], normalized_shape=(length,), eps=eps)
    y = c.op("reshape", [y], shape=tuple(t.shape))
    per_channel = (ch,) + (1,) * (t.rank - 2)
    if w is not None:
        y = c.op("mul", [y, c.op("reshape", [w], shape=per_channel)])
    if bias is not None:
        y = c.op("add", [y, c.op("reshape", [bias], shape=per_channel)])
    return y


def _patches_tile(kernel: Any, dilation: Any, padding: Any, stride: Any) -> tuple[int, int] | None:
    """(kh, kw) when unfold / fold cut the image into non-overlapping patches (kernel = stride, no padding or
    dilation): then they are a reshape and a permute, not a gather. Rows and columns past the last whole
    patch are dropped by unfold and come back as zeros from fold (MobileViT-V2's 7 x 7 maps, 2 x 2 patches)."""
    k, d, p, st = as_pair(kernel, 1), as_pair(dilation, 1), as_pair(padding, 0), as_pair(stride, 1)
    if k != st or d != (1, 1) or p != (0, 0):
        return None
    return k


@converts(aten.im2col)
def _im2col(c: Ctx, a: tuple, k: dict) -> str:
    """F.unfold into non-overlapping patches (MobileViT-V2): (N, C, H, W) -> (N, C*kh*kw, H/kh * W/kw)."""
    t = c.ttype(a[0])
    tile = _patches_tile(*a[1:5]) if t.rank == 4 and len(a) >= 5 else None
    if tile is None or t.shape[2] < tile[0] or t.shape[3] < tile[1]:
        raise _Unsupported()
    (n, ch, h, w), (kh, kw) = t.shape, tile
    ph, pw = h // kh, w // kw
    x = a[0]
    for dim, whole, size in ((2, ph * kh, h), (3, pw * kw, w)):
        if whole < size:  # the rows / columns no whole patch covers are not read
            x = c.op("slice", [x], dim=dim, start=0, end=whole, step=1)
    y = c.op("reshape", [x], shape=(n, ch, ph, kh, pw, kw))
    y = c.op("permute", [y], dims=(0, 1, 3, 5, 2, 4))
    return c.op("reshape", [y], shape=(n, ch * kh * kw, ph * pw))


@converts(aten.col2im)
def _col2im(c: Ctx, a: tuple, k: dict) -> str:
    """F.fold of non-overlapping patches, the inverse of ``_im2col``: nothing overlaps, so nothing is summed,
    and what no patch covers is zero."""
    t = c.ttype(a[0])
    size = as_pair(a[1], 1) if len(a) >= 6 else None
    tile = _patches_tile(*a[2:6]) if t.rank == 3 and size is not None else None
    if tile is None:
        raise _Unsupported()
    (n, ckk, blocks), (h, w), (kh, kw) = t.shape, size, tile
    ph, pw = h // kh, w // kw
    if ckk % (kh * kw) or blocks != ph * pw or ph == 0 or pw == 0:
        raise _Unsupported()
    y = c.op("reshape", [a[0]], shape=(n, ckk // (kh * kw), kh, kw, ph, pw))
    y = c.op("permute", [y], dims=(0, 1, 4, 2, 5, 3))
    y = c.op("reshape", [y], shape=(n, ckk // (kh * kw), ph * kh, pw * kw))
    return _constant_pad(c, y, (0, w - pw * kw, 0, h - ph * kh), 0.0)


@converts(aten.rms_norm)
def _rms_norm(c: Ctx, a: tuple, k: dict) -> str:
    x, shape = a[0], a[1]
    w = a[2] if len(a) > 2 else k.get("weight")
    eps = a[3] if len(a) > 3 else k.get("eps")
    return c.op("rms_norm", [x] + ([w] if w is not None else []), normalized_shape=tuple(shape), eps=eps)


@converts(aten.scaled_dot_product_attention)
def _sdpa(c: Ctx, a: tuple, k: dict) -> str:
    q, kk, v = a[:3]
    mask = a[3] if len(a) > 3 else k.get("attn_mask")
    dropout = a[4] if len(a) > 4 else k.get("dropout_p", 0.0)
    causal = a[5] if len(a) > 5 else k.get("is_causal", False)
    scale = a[6] if len(a) > 6 else k.get("scale")
    gqa = a[7] if len(a) > 7 else k.get("enable_gqa", False)
    if dropout:
        raise _Unsupported()
    ins = [q, kk, v] + ([mask] if mask is not None else [])
    if gqa:  # K and V with H / G heads, each read by G query heads (PyTorch >= 2.5 models)
        return c.op("sdpa", ins, is_causal=bool(causal), scale=scale, enable_gqa=True)
    return c.op("sdpa", ins, is_causal=bool(causal), scale=scale)


@converts(aten.cumsum)
def _cumsum(c: Ctx, a: tuple, k: dict) -> str:
    t = c.ttype(a[0])
    dtype = a[2] if len(a) > 2 else k.get("dtype")
    return c.op("cumsum", [a[0]], dim=_dim(a[1] if len(a) > 1 else k["dim"], max(t.rank, 1)), dtype=dtype)


@converts(aten.gather)
def _gather(c: Ctx, a: tuple, k: dict) -> str:
    if (a[3] if len(a) > 3 else k.get("sparse_grad", False)) or c.ttype(a[0]).rank != c.ttype(a[2]).rank:
        raise _Unsupported()
    return c.op("gather", [a[0], a[2]], dim=_dim(a[1], c.ttype(a[0]).rank))


@converts(aten.embedding)
def _embedding(c: Ctx, a: tuple, k: dict) -> str:
    return c.op("embedding", [a[0], a[1]])


@converts(aten.view, aten.reshape, aten._unsafe_view)
def _reshape(c: Ctx, a: tuple, k: dict) -> str:
    x = a[0]
    shape = list(a[1])
    numel = c.ttype(x).numel
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = numel // known if known else 0
    return _reshape_to(c, x, tuple(int(s) for s in shape))


@converts(aten.reshape_as, aten.view_as)
def _reshape_as(c: Ctx, a: tuple, k: dict) -> str:
    return _reshape_to(c, a[0], tuple(c.ttype(a[1]).shape))


def _reshape_to(c: Ctx, x: str, shape: tuple[int, ...]) -> str:
    if c.ttype(x).shape == shape:
        return x
    return c.op("reshape", [x], shape=shape)


@converts(aten.flatten)
def _flatten(c: Ctx, a: tuple, k: dict) -> str:
    shape = c.ttype(a[0]).shape
    r = len(shape)
    start = _dim(a[1] if len(a) > 1 else k.get("start_dim", 0), r) if r else 0
    end = _dim(a[2] if len(a) > 2 else k.get("end_dim", -1), r) if r else 0
    mid = 1
    for s in shape[start : end + 1]:
        mid *= s
    return _reshape_to(c, a[0], tuple(shape[:start]) + (mid,) + tuple(shape[end + 1 :]))


@converts(aten.unsqueeze)
def _unsqueeze(c: Ctx, a: tuple, k: dict) -> str:
    shape = list(c.ttype(a[0]).shape)
    d = _dim(a[1], len(shape) + 1)
    shape.insert(d, 1)
    return _reshape_to(c, a[0], tuple(shape))


@converts(aten.squeeze)
def _squeeze(c: Ctx, a: tuple, k: dict) -> str:
    shape = c.ttype(a[0]).shape
    dims = a[1] if len(a) > 1 else None
    if dims is None:
        keep = [s for s in shape if s != 1]
    else:
        dims = [dims] if isinstance(dims, int) else list(dims)
        dims = {_dim(d, len(shape)) for d in dims}
        keep = [s for i, s in enumerate(shape) if not (i in dims and s == 1)]
    return _reshape_to(c, a[0], tuple(keep))


@converts(aten.permute)
def _permute(c: Ctx, a: tuple, k: dict) -> str:
    r = c.ttype(a[0]).rank
    dims = tuple(_dim(d, r) for d in a[1])
    return a[0] if dims == tuple(range(r)) else c.op("permute", [a[0]], dims=dims)


@converts(aten.upsample_bilinear2d, aten.upsample_nearest2d)
def _upsample(c: Ctx, a: tuple, k: dict) -> str:
    """``F.interpolate(x, size or scale_factor, mode="bilinear" | "nearest")`` on a 4-D tensor: the output size from
    the traced value; the scale factors (``.vec``'s last argument, or the default overload's ``scales_h/w``) kept,
    as they set PyTorch's coordinate step."""
    val = c.node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        raise _Unsupported()
    bilinear = "bilinear" in str(c.node.target)
    rest = list(a[2:]) if len(a) > 2 else []
    align = bool(rest.pop(0) if bilinear and rest else k.get("align_corners", False)) if bilinear else False
    if ".vec" in str(c.node.target):
        scales = rest[0] if rest else k.get("scale_factors")
        sh, sw = (float(scales[0]), float(scales[1])) if scales else (None, None)
    else:
        sh = rest[0] if rest else k.get("scales_h")
        sw = rest[1] if len(rest) > 1 else k.get("scales_w")
    size = (int(val.shape[2]), int(val.shape[3]))
    return c.op("upsample2d", [a[0]], mode="bilinear" if bilinear else "nearest", size=size, align_corners=align, scale_factors=(sh, sw))


@converts(aten.einsum)
def _einsum(c: Ctx, a: tuple, k: dict) -> str:
    """``torch.einsum`` as permutes, sums and one batched matmul (``kfuse.frontend.einsum``)."""
    from kfuse.frontend import einsum

    operands = list(a[1])
    try:
        steps = einsum.plan(a[0], [c.ttype(x).shape for x in operands])
    except einsum.EinsumUnsupported as e:
        raise _Unsupported() from e
    return einsum.emit(steps, operands, c.op) or operands[0]


@converts(aten.transpose, aten.swapaxes, aten.swapdims)
def _transpose(c: Ctx, a: tuple, k: dict) -> str:
    r = c.ttype(a[0]).rank
    d0, d1 = _dim(a[1], r), _dim(a[2], r)
    if d0 == d1:
        return a[0]
    dims = list(range(r))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return c.op("permute", [a[0]], dims=tuple(dims))


@converts(aten.expand_as)
def _expand_as(c: Ctx, a: tuple, k: dict) -> str:
    return _expand(c, (a[0], c.ttype(a[1]).shape), {})


@converts(aten.unflatten)
def _unflatten(c: Ctx, a: tuple, k: dict) -> str:
    """``x.unflatten(dim, sizes)`` (SigLIP's attention heads) as a reshape."""
    t = c.ttype(a[0])
    dim = _dim(a[1], t.rank)
    return _reshape(c, (a[0], [*t.shape[:dim], *a[2], *t.shape[dim + 1 :]]), {})  # a -1 size is inferred there


@converts(aten.expand)
def _expand(c: Ctx, a: tuple, k: dict) -> str:
    src = c.ttype(a[0]).shape
    size = list(a[1])
    off = len(size) - len(src)
    shape = tuple(src[i - off] if s == -1 else int(s) for i, s in enumerate(size))
    return a[0] if shape == src else c.op("expand", [a[0]], shape=shape)


@converts(aten.repeat)
def _repeat(c: Ctx, a: tuple, k: dict) -> str:
    """``x.repeat(reps)`` (SwiftFormer's global query) as a reshape that gives each repeated dim a size-1 dim
    in front, an expand of those to the repeat counts, and a reshape that merges each pair."""
    reps = [int(r) for r in a[1]]
    src = (1,) * (len(reps) - c.ttype(a[0]).rank) + tuple(c.ttype(a[0]).shape)
    if all(r == 1 for r in reps):
        return _reshape_to(c, a[0], src)
    pairs = [(1, n) for n in src]
    y = _reshape_to(c, a[0], tuple(v for p in pairs for v in p))
    y = c.op("expand", [y], shape=tuple(v for r, n in zip(reps, src, strict=True) for v in (r, n)))
    return _reshape_to(c, y, tuple(r * n for r, n in zip(reps, src, strict=True)))


@converts(aten.tile)
def _tile(c: Ctx, a: tuple, k: dict) -> str:
    """``x.tile(reps)``: ``repeat`` with the counts padded by leading ones to x's rank."""
    reps = [int(r) for r in a[1]]
    return _repeat(c, (a[0], [1] * (c.ttype(a[0]).rank - len(reps)) + reps), {})


@converts(aten.meshgrid)
def _meshgrid(c: Ctx, a: tuple, k: dict) -> list:
    """``torch.meshgrid`` (DINOv3's patch coordinates): each 1-D input reshaped onto its own dim of the
    grid and expanded over the others; ``indexing="xy"`` swaps the first two dims."""
    xs = list(a[0])
    indexing = a[1] if len(a) > 1 else k.get("indexing", "ij")
    sizes = [c.ttype(x).numel for x in xs]
    where = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:
        where[0], where[1] = 1, 0
    grid = [0] * len(xs)
    for i, d in enumerate(where):
        grid[d] = sizes[i]
    out = []
    for i, x in enumerate(xs):
        shape = [1] * len(xs)
        shape[where[i]] = sizes[i]
        y = _reshape_to(c, x, tuple(shape))
        out.append(y if tuple(shape) == tuple(grid) else c.op("expand", [y], shape=tuple(grid)))
    return out


@converts(aten.slice)
def _slice(c: Ctx, a: tuple, k: dict) -> str:
    t = c.ttype(a[0])
    dim = _dim(a[1] if len(a) > 1 else 0, t.rank)
    start = a[2] if len(a) > 2 else None
    end = a[3] if len(a) > 3 else None
    step = a[4] if len(a) > 4 else 1
    n = t.shape[dim]
    start_i, end_i, _ = slice(start, end, step).indices(n)
    if start_i == 0 and end_i >= n and step == 1:
        return a[0]
    return c.op("slice", [a[0]], dim=dim, start=start_i, end=end_i, step=int(step))


@converts(aten.select)
def _select(c: Ctx, a: tuple, k: dict) -> str:
    t = c.ttype(a[0])
    dim = _dim(a[1], t.rank)
    idx = a[2] + t.shape[dim] if a[2] < 0 else a[2]
    return c.op("select", [a[0]], dim=dim, index=int(idx))


@converts(aten.cat, aten.concat)
def _cat(c: Ctx, a: tuple, k: dict) -> str:
    # empty inputs add nothing (a partial rotary whose pass-through part is empty, PyTorch's legacy 1-D (0,)
    # tensors); kept when all are empty, or when one would change the promoted dtype
    dtypes = {c.ttype(x).dtype for x in a[0]}
    xs = [x for x in a[0] if c.ttype(x).numel > 0 or (c.ttype(x).rank > 1 and len(dtypes) > 1)] or list(a[0][:1])
    dim = a[1] if len(a) > 1 else k.get("dim", 0)
    if len(xs) == 1:
        return xs[0]
    return c.op("cat", xs, dim=_dim(dim, c.ttype(xs[0]).rank))


@converts(aten.stack)
def _stack(c: Ctx, a: tuple, k: dict) -> str:
    """torch.stack as a cat of unsqueezed inputs (GPT-J's and RoFormer's interleaved rotary stack the rotated
    halves on a new last dim, then flatten it)."""
    xs = list(a[0])
    rank = c.ttype(xs[0]).rank + 1
    dim = _dim(a[1] if len(a) > 1 else k.get("dim", 0), rank)
    parts = []
    for x in xs:
        shape = list(c.ttype(x).shape)
        shape.insert(dim, 1)
        parts.append(_reshape_to(c, x, tuple(shape)))
    return parts[0] if len(parts) == 1 else c.op("cat", parts, dim=dim)


@converts(aten.roll)
def _roll(c: Ctx, a: tuple, k: dict) -> str:
    """torch.roll along given dims (Swin's shifted windows): per dim, the last ``shift`` entries, then the
    rest, as two slices and a cat. A roll of the flattened tensor (no dims) stays PyTorch's."""
    shifts, dims = a[1], a[2] if len(a) > 2 else k.get("dims", ())
    shifts = [int(shifts)] if isinstance(shifts, int) else [int(v) for v in shifts]
    dims = [int(dims)] if isinstance(dims, int) else [int(v) for v in dims]
    if not dims or len(dims) != len(shifts):
        raise _Unsupported()
    y = a[0]
    for shift, d in zip(shifts, dims, strict=True):
        t = c.ttype(y)
        dim = _dim(d, t.rank)
        n = t.shape[dim]
        s = shift % n if n else 0
        if s:
            tail = c.op("slice", [y], dim=dim, start=n - s, end=n, step=1)
            head = c.op("slice", [y], dim=dim, start=0, end=n - s, step=1)
            y = c.op("cat", [tail, head], dim=dim)
    return y


@converts(aten.split, aten.split_with_sizes)
def _split(c: Ctx, a: tuple, k: dict) -> list:
    x, sizes = a[0], a[1]
    t = c.ttype(x)
    dim = _dim(a[2] if len(a) > 2 else k.get("dim", 0), t.rank)
    n = t.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    out, start = [], 0
    for s in sizes:
        out.append(c.op("slice", [x], dim=dim, start=start, end=start + s, step=1))
        start += s
    return out


@converts(aten.chunk)
def _chunk(c: Ctx, a: tuple, k: dict) -> list:
    t = c.ttype(a[0])
    dim = _dim(a[2] if len(a) > 2 else 0, t.rank)
    size = -(-t.shape[dim] // a[1])
    return _split(c, (a[0], size, dim), {})


@converts(aten.unbind)
def _unbind(c: Ctx, a: tuple, k: dict) -> list:
    t = c.ttype(a[0])
    dim = _dim(a[1] if len(a) > 1 else 0, t.rank)
    return [c.op("select", [a[0]], dim=dim, index=i) for i in range(t.shape[dim])]


@converts(aten.contiguous, aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy, aten.dropout, aten.feature_dropout)
def _identity(c: Ctx, a: tuple, k: dict) -> str:
    if c.node.target in (aten.dropout.default, aten.feature_dropout.default) and (a[2] if len(a) > 2 else k.get("train")):
        raise _Unsupported()
    return a[0]


@converts(aten.mean)
def _mean(c: Ctx, a: tuple, k: dict) -> str:
    return _reduce(c, "mean", a, k)


@converts(aten.sum)
def _sum(c: Ctx, a: tuple, k: dict) -> str:
    return _reduce(c, "sum", a, k)


def _reduced_dims(rank: int, dims: Any) -> tuple[int, ...]:
    """A reduction's ``dim`` argument as non-negative dims: None or empty means all of them."""
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return tuple(range(rank))
    return tuple(_dim(d, rank) for d in ((dims,) if isinstance(dims, int) else dims))


def _reduce(c: Ctx, op: str, a: tuple, k: dict) -> str:
    x = a[0]
    dims = a[1] if len(a) > 1 and not isinstance(a[1], torch.dtype) else k.get("dim")
    keepdim = a[2] if len(a) > 2 else k.get("keepdim", False)
    return c.op(op, [x], dims=_reduced_dims(c.ttype(x).rank, dims), keepdim=bool(keepdim), dtype=k.get("dtype"))


@converts(aten.amax)
def _amax(c: Ctx, a: tuple, k: dict) -> str:
    dims = _reduced_dims(c.ttype(a[0]).rank, a[1] if len(a) > 1 else k.get("dim"))
    return c.op("amax", [a[0]], dims=dims, keepdim=bool(a[2] if len(a) > 2 else k.get("keepdim", False)))


@converts(aten.max_pool2d, aten.max_pool2d_with_indices)
def _max_pool(c: Ctx, a: tuple, k: dict) -> Any:
    ks = as_pair(a[1], 1)
    stride = as_pair(a[2], 1) if len(a) > 2 and a[2] else ks
    pad = as_pair(a[3], 0) if len(a) > 3 else (0, 0)
    dil = as_pair(a[4], 1) if len(a) > 4 else (1, 1)
    ceil = bool(a[5]) if len(a) > 5 else False
    y = c.op("max_pool2d", [a[0]], kernel_size=ks, stride=stride, padding=pad, dilation=dil, ceil_mode=ceil)
    if c.node.target == aten.max_pool2d_with_indices.default:
        if not _indices_unused(c):
            raise _Unsupported()
        return [y, None]
    return y


@converts(aten.avg_pool2d)
def _avg_pool(c: Ctx, a: tuple, k: dict) -> str:
    ks = as_pair(a[1], 1)
    stride = as_pair(a[2], 1) if len(a) > 2 and a[2] else ks
    pad = as_pair(a[3], 0) if len(a) > 3 else (0, 0)
    ceil = bool(a[4]) if len(a) > 4 else False
    cip = bool(a[5]) if len(a) > 5 else True
    div = a[6] if len(a) > 6 else None
    return c.op(
        "avg_pool2d", [a[0]], kernel_size=ks, stride=stride, padding=pad, ceil_mode=ceil, count_include_pad=cip, divisor_override=div
    )


@converts(aten.adaptive_avg_pool1d)
def _adaptive_avg_1d(c: Ctx, a: tuple, k: dict) -> str:
    """The global 1-D pool (FocalNet's and Swin-V2's poolers, over the tokens) as a mean; other sizes stay PyTorch's."""
    if _one(a[1], 0) != 1:
        raise _Unsupported()
    return c.op("mean", [a[0]], dims=(c.ttype(a[0]).rank - 1,), keepdim=True, dtype=None)


@converts(aten.linalg_vector_norm)
def _vector_norm(c: Ctx, a: tuple, k: dict) -> str:
    """The 2-norm (``F.normalize``: Swin-V2's cosine attention) as sqrt(sum(x * x)); other orders stay PyTorch's."""
    order = a[1] if len(a) > 1 else k.get("ord", 2)
    if order != 2 or k.get("dtype") is not None or not c.ttype(a[0]).dtype.is_floating_point:
        raise _Unsupported()
    dims = _reduced_dims(c.ttype(a[0]).rank, a[2] if len(a) > 2 else k.get("dim"))
    keepdim = bool(a[3] if len(a) > 3 else k.get("keepdim", False))
    sq = c.op("sum", [c.op("mul", [a[0], a[0]])], dims=dims, keepdim=keepdim, dtype=None)
    return c.op("sqrt", [sq])


@converts(aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d)
def _adaptive_avg(c: Ctx, a: tuple, k: dict) -> str:
    return c.op("adaptive_avg_pool2d", [a[0]], output_size=as_pair(a[1], 1))
