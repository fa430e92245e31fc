"""ONNX frontend: import a ``ModelProto`` / ``.onnx`` file into the kfuse IR.

Initializers become graph constants; the other graph inputs are the graph's inputs, with
static shapes (a symbolic dimension takes its size from the example inputs). Nodes whose
operands are all known at import time (shape arithmetic, ``Constant``) are evaluated once by
ONNX's reference evaluator and become constants, so ``Shape -> Gather -> Concat -> Reshape``
chains end as a static reshape. Every other node goes through the converter table in
:mod:`kfuse.frontend.onnx_ops`; a node without a converter becomes a ``fallback`` node that
runs that single node with ``onnx.reference.ReferenceEvaluator`` and is listed in the report.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from onnx import helper
from torch.utils import _pytree as pytree

from kfuse.frontend.onnx_ops import CONVERTERS, ONNX_TO_TORCH, OnnxCtx, Unsupported
from kfuse.frontend.torch_export import FrontendError, Imported
from kfuse.ir.graph import GraphBuilder, TensorType, ValueType

OnnxSource = onnx.ModelProto | str | os.PathLike | bytes

# nodes never evaluated at import time even when their operands are known
_NON_DETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
_FOLD_LIMIT = 1 << 24  # elements: larger import-time results stay in the graph


class OnnxLoadError(FrontendError):
    """The ONNX model could not be loaded or does not pass the checker."""


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
def load_model(model: OnnxSource) -> tuple[onnx.ModelProto, str]:
    """Load and check ``model``; returns the proto and a display name."""
    if isinstance(model, onnx.ModelProto):
        proto, name, where = model, model.graph.name or "onnx_model", "the ONNX model"
    elif isinstance(model, bytes):
        where = "the given bytes"
        try:
            proto = onnx.load_from_string(model)
        except Exception as e:
            raise OnnxLoadError(f"{where} are not a valid ONNX model: {type(e).__name__}: {e}") from e
        name = proto.graph.name or "onnx_model"
    else:
        path = Path(os.fspath(model))
        where = str(path)
        if not path.is_file():
            raise OnnxLoadError(f"no such ONNX file: {path}")
        try:
            proto = onnx.load(str(path))
        except Exception as e:
            raise OnnxLoadError(f"{path} is not a valid ONNX model: {type(e).__name__}: {e}") from e
        name = path.stem
    if len(proto.graph.node) == 0 and len(proto.graph.output) == 0:
        # protobuf parses many random byte strings as an empty message
        raise OnnxLoadError(f"{where} is not a valid ONNX model: it has no graph")
    try:
        # a path lets the checker read external data and models over 2 GiB
        onnx.checker.check_model(os.fspath(model) if isinstance(model, str | os.PathLike) else proto)
    except Exception as e:
        raise OnnxLoadError(f"{where} fails the ONNX checker: {e}") from e
    return proto, name


def _default_opset(proto: onnx.ModelProto) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return onnx.defs.onnx_opset_version()


def _runtime_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def _match_inputs(proto: onnx.ModelProto, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Map ONNX input name -> example tensor and -> flat index in ``((args), {kwargs})``."""
    inputs = _runtime_inputs(proto)
    names = [i.name for i in inputs]
    if len(args) > len(names):
        raise FrontendError(f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), got {len(args)} positional inputs")
    feeds: dict[str, torch.Tensor] = {}
    index: dict[str, int] = {}
    for i, (n, a) in enumerate(zip(names, args, strict=False)):
        feeds[n], index[n] = a, i
    for j, (k, v) in enumerate(kwargs.items()):
        if k not in names:
            raise FrontendError(f"the ONNX model has no input named {k!r} (inputs: {', '.join(names)})")
        if k in feeds:
            raise FrontendError(f"ONNX input {k!r} given both positionally and by name")
        feeds[k], index[k] = v, len(args) + j
    missing = [n for n in names if n not in feeds]
    if missing:
        raise FrontendError(
            f"the ONNX model takes {len(names)} inputs ({', '.join(names)}), got {len(feeds)}; missing: {', '.join(missing)}"
        )
    for n, v in feeds.items():
        if not isinstance(v, torch.Tensor):
            raise FrontendError(f"ONNX input {n!r} must be a torch.Tensor, got {type(v).__name__}")
    return feeds, index


def _input_type(vi: onnx.ValueInfoProto, example: torch.Tensor | None) -> TensorType:
    tt = vi.type.tensor_type
    dtype = ONNX_TO_TORCH.get(tt.elem_type)
    if dtype is None:
        elem = onnx.TensorProto.DataType.Name(tt.elem_type)
        raise FrontendError(f"ONNX input {vi.name!r} has element type {elem}, which kfuse does not take")
    if example is not None:
        if example.dtype != dtype:
            raise FrontendError(f"ONNX input {vi.name!r} is {dtype} in the model, got a {example.dtype} tensor")
        if tt.HasField("shape"):
            dims = tt.shape.dim
            if len(dims) != example.dim():
                raise FrontendError(f"ONNX input {vi.name!r} has rank {len(dims)}, got shape {tuple(example.shape)}")
            for i, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value != example.shape[i]:
                    raise FrontendError(f"ONNX input {vi.name!r} has dim {i} = {d.dim_value}, got shape {tuple(example.shape)}")
        return TensorType(tuple(int(s) for s in example.shape), dtype)
    if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        raise FrontendError(f"ONNX input {vi.name!r} has a symbolic shape; pass example inputs to fix it")
    return TensorType(tuple(int(d.dim_value) for d in tt.shape.dim), dtype)


def _with_static_inputs(proto: onnx.ModelProto, types: dict[str, TensorType]) -> onnx.ModelProto:
    """A copy of ``proto`` with concrete input shapes and inferred intermediate shapes."""
    m = copy.deepcopy(proto)
    for vi in m.graph.input:
        t = types.get(vi.name)
        if t is None:
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for s in t.shape:
            shape.dim.add().dim_value = s
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # shape inference is an aid here, not a requirement
        return m


def _known_types(proto: onnx.ModelProto) -> dict[str, ValueType]:
    out: dict[str, ValueType] = {}
    for vi in list(proto.graph.value_info) + list(proto.graph.output):
        tt = vi.type.tensor_type
        dt = ONNX_TO_TORCH.get(tt.elem_type)
        if dt is None or not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
            continue
        out[vi.name] = TensorType(tuple(int(d.dim_value) for d in tt.shape.dim), dt)
    return out


# ---------------------------------------------------------------------------------------
# numpy <-> torch and single-node evaluation
# ---------------------------------------------------------------------------------------
def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def to_torch(a: Any, device: torch.device | None = None) -> torch.Tensor:
    t = torch.from_numpy(np.array(a, copy=True))
    return t if device is None else t.to(device)


def _reference_fixes() -> list[type]:
    """Ops whose implementation in ``onnx.reference`` is wrong for shapes real models use."""
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):  # onnx's np.choose path breaks on > 64 choices (BERT's token types)
        op_domain = ""

        def _run(self, data: np.ndarray, indices: np.ndarray, axis: int = 0) -> tuple[np.ndarray]:
            idx = np.where(indices < 0, indices + data.shape[axis], indices)
            return (np.take_along_axis(data, idx.astype(np.int64), axis=axis),)

    class _SoftmaxBase(OpRun):  # onnx applies the opset-13 rule to every version
        op_domain = ""
        log = False

        def _run(self, x: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
            opset = int(self.run_params.get("opsets", {}).get("", 13))
            attrs = {a.name: a.i for a in self.onnx_node.attribute}
            ax = int(attrs.get("axis", -1 if opset >= 13 else 1))
            ax = ax + x.ndim if ax < 0 else ax
            shape = x.shape
            # before opset 13 the input is coerced to 2-D at ``axis`` and normalised over all trailing dims
            y = x.reshape(int(np.prod(shape[:ax])), -1) if opset < 13 else x
            red = 1 if opset < 13 else ax
            t = y - y.max(axis=red, keepdims=True)
            out = t - np.log(np.exp(t).sum(axis=red, keepdims=True)) if self.log else np.exp(t) / np.exp(t).sum(axis=red, keepdims=True)
            return (out.reshape(shape).astype(x.dtype),)

    class Softmax(_SoftmaxBase):
        log = False

    class LogSoftmax(_SoftmaxBase):
        log = True

    from onnx.reference.ops._op_common_pool import CommonPool
    from onnx.reference.ops.op_max_pool import MaxPool as _OnnxMaxPool

    class MaxPool(_OnnxMaxPool):  # onnx's stride-1 path reads pads as (top, bottom, left, right)
        op_domain = ""

        def _run(self, x: np.ndarray, **kw: Any) -> tuple[np.ndarray, ...]:
            if len([o for o in self.onnx_node.output if o]) > 1 or kw.get("storage_order") or x.dtype.kind != "f":
                return super()._run(x, **kw)
            return (_torch_pool(x, "MAX", 0, **kw),)

    class AveragePool(CommonPool):
        op_domain = ""

        def _run(self, x: np.ndarray, count_include_pad: int | None = None, **kw: Any) -> tuple[np.ndarray, ...]:
            if any(d != 1 for d in (kw.get("dilations") or [])) or x.dtype.kind != "f":
                return CommonPool._run(self, "AVG", count_include_pad, x, **kw)
            return (_torch_pool(x, "AVG", int(count_include_pad or 0), **kw),)

    return [GatherElements, Softmax, LogSoftmax, MaxPool, AveragePool]


def _torch_pool(
    x: np.ndarray,
    mode: str,
    count_include_pad: int,
    auto_pad: str | None = None,
    ceil_mode: int | None = None,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    storage_order: int | None = None,
) -> np.ndarray:
    """ONNX MaxPool / AveragePool (spec output sizes and pads layout) through torch on explicitly padded input."""
    import torch.nn.functional as F

    assert kernel_shape is not None
    nd = len(kernel_shape)
    sp = x.shape[2:]
    strides = list(strides or [1] * nd)
    dil = list(dilations or [1] * nd)
    pads = list(pads or [0] * (2 * nd))
    auto = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
    begin, end, extra = [], [], []
    for i in range(nd):
        eff = (kernel_shape[i] - 1) * dil[i] + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-sp[i] // strides[i])
            total = max((out - 1) * strides[i] + eff - sp[i], 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            b, e = lo, total - lo
        else:
            b, e = (0, 0) if auto == "VALID" else (int(pads[i]), int(pads[i + nd]))
            span = sp[i] + b + e - eff
            out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            if ceil_mode and (out - 1) * strides[i] >= sp[i] + b:
                out -= 1  # a window may not start in the end padding
        begin.append(b)
        end.append(e)
        extra.append(max((out - 1) * strides[i] + eff - (sp[i] + b + e), 0))
    t = torch.from_numpy(np.ascontiguousarray(x)).double()

    def pad(v: torch.Tensor, value: float, extra_value: float) -> torch.Tensor:
        spec = [p for i in reversed(range(nd)) for p in (begin[i], end[i])]
        v = F.pad(v, spec, value=value)
        return F.pad(v, [p for i in reversed(range(nd)) for p in (0, extra[i])], value=extra_value)

    if mode == "MAX":
        pool = getattr(F, f"max_pool{nd}d")
        y = pool(pad(t, -math.inf, -math.inf), list(kernel_shape), strides, 0, dil)
    else:
        pool = getattr(F, f"avg_pool{nd}d")
        total = pool(pad(t, 0.0, 0.0), list(kernel_shape), strides, 0)
        ones = torch.ones((1, 1, *sp), dtype=torch.float64)
        count = pool(pad(ones, float(count_include_pad), 0.0), list(kernel_shape), strides, 0)
        y = total / count
    return y.numpy().astype(x.dtype)


def reference_evaluator(proto: Any, **kw: Any) -> Any:
    """``onnx.reference.ReferenceEvaluator`` with kfuse's fixes."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(proto, new_ops=_reference_fixes(), **kw)


class _NodeRunner:
    """Runs one ONNX node with the reference evaluator (built once, on first use)."""

    def __init__(self, node: onnx.NodeProto, in_names: list[str], out_names: list[str], proto: onnx.ModelProto) -> None:
        self.node, self.in_names, self.out_names = node, in_names, out_names
        self.opsets = {o.domain: int(o.version) for o in proto.opset_import}
        self.functions = list(proto.functions)
        self._ev: Any = None

    def evaluator(self) -> Any:
        if self._ev is None:
            g = helper.make_graph(
                [self.node],
                f"kfuse_{self.node.op_type}",
                [helper.make_empty_tensor_value_info(n) for n in self.in_names],
                [helper.make_empty_tensor_value_info(n) for n in self.out_names],
            )
            self._ev = reference_evaluator(g, opsets=self.opsets, functions=self.functions or None)
        return self._ev

    def run_numpy(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.evaluator().run(None, dict(zip(self.in_names, arrays, strict=True))))

    # pickling and deep copies of a graph keep the node, not the evaluator
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ev": None}


class _FallbackFn:
    """The ``fn`` of a fallback node: torch in, single ONNX node on numpy, torch out."""

    def __init__(self, runner: _NodeRunner, target: str, out_type: ValueType) -> None:
        self.runner, self.target, self.out_type = runner, target, out_type
        self.__name__ = target

    def __call__(self, xs: list[torch.Tensor]) -> Any:
        device = xs[0].device if xs else None
        if any(x.device.type == "meta" for x in xs):  # type inference: shapes are known already
            return _meta_like(self.out_type)
        outs = [to_torch(o, device) for o in self.runner.run_numpy([to_numpy(x) for x in xs])]
        types = self.out_type if isinstance(self.out_type, tuple) else (self.out_type,)
        for o, t in zip(outs, types, strict=True):
            if tuple(o.shape) != t.shape:
                raise RuntimeError(
                    f"{self.target} produced shape {tuple(o.shape)}, compiled for {t.shape}: its output shape depends on "
                    "input values and was fixed from the example inputs"
                )
        return tuple(outs) if isinstance(self.out_type, tuple) else outs[0]


def _meta_like(t: ValueType) -> Any:
    if isinstance(t, tuple):
        return tuple(_meta_like(x) for x in t)
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


# ---------------------------------------------------------------------------------------
# import
# ---------------------------------------------------------------------------------------
def _clean(name: str) -> str:
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "v"
    return s if not s[0].isdigit() else "v" + s


class _Importer:
    def __init__(self, proto: onnx.ModelProto, inferred: onnx.ModelProto, name: str, feeds: dict[str, torch.Tensor]) -> None:
        self.proto, self.inferred = proto, inferred
        self.opset = _default_opset(proto)
        self.b = GraphBuilder(_clean(name))
        self.env: dict[str, str] = {}  # ONNX value -> kfuse value
        self.consts: dict[str, torch.Tensor] = {}  # ONNX value -> tensor known at import time
        self.types = _known_types(inferred)
        self.feeds = feeds
        self.fallbacks: list[str] = []
        self._probe: dict[str, np.ndarray] | None = None
        self.used: set[str] = {o.name for o in proto.graph.output}
        for n in proto.graph.node:
            self.used.update(i for i in n.input if i)

    # ---- values --------------------------------------------------------------------------
    def value(self, onnx_name: str) -> str:
        """The kfuse value of an ONNX value, adding known constants to the graph on first use."""
        if onnx_name in self.env:
            return self.env[onnx_name]
        if onnx_name in self.consts:
            taken = self.b.has(_clean(onnx_name))
            name = self.b.add_constant(self.consts[onnx_name], None if taken else _clean(onnx_name))
            self.env[onnx_name] = name
            return name
        raise FrontendError(f"ONNX value {onnx_name!r} is used before it is defined")

    def type_of(self, onnx_name: str) -> TensorType | None:
        if onnx_name in self.consts:
            return TensorType.of(self.consts[onnx_name])
        if onnx_name in self.env:
            t = self.b.type_of(self.env[onnx_name])
            return t if isinstance(t, TensorType) else None
        return None

    # ---- graph ---------------------------------------------------------------------------
    def run(self, input_types: dict[str, TensorType]) -> list[str]:
        g = self.proto.graph
        for init in g.initializer:
            self.consts[init.name] = to_torch(onnx.numpy_helper.to_array(init))
        for vi in _runtime_inputs(self.proto):
            taken = self.b.has(_clean(vi.name))
            self.env[vi.name] = self.b.add_input(self.b.fresh(_clean(vi.name)) if taken else _clean(vi.name), input_types[vi.name])
        for node in g.node:
            self.convert(node)
        return [self.value(o.name) for o in g.output]

    def convert(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx"):
            self.fallback(node)
            return
        if node.op_type in ("Shape", "Size") and node.input[0] not in self.consts:
            t = self.type_of(node.input[0])
            if t is not None:
                self.consts[node.output[0]] = self._shape_value(node, t)
                return
        if self._foldable(node):
            try:
                self.fold(node)
                return
            except Exception:  # e.g. a type numpy lacks: leave it in the graph
                pass
        conv = CONVERTERS.get(node.op_type)
        if conv is not None:
            ctx = OnnxCtx(
                self.b,
                node,
                self.opset,
                [self.value(i) if i else None for i in node.input],
                [self.consts.get(i) if i else None for i in node.input],
                {k for k, o in enumerate(node.output) if o and o in self.used},
            )
            try:
                outs = conv(ctx)
            except (Unsupported, ValueError, RuntimeError, TypeError, IndexError):
                # an unhandled variant (or one kfuse's type rules reject): run the node through ONNX.
                # Nodes the converter already appended are unused and removed by DCE.
                outs = None
            if outs is not None:
                outs = [outs] if isinstance(outs, str) else outs
                for o, v in zip(node.output, outs, strict=False):
                    if o and v is not None:
                        self.env[o] = v
                if all(not o or o not in self.used or o in self.env for o in node.output):
                    return
        self.fallback(node)

    def _shape_value(self, node: onnx.NodeProto, t: TensorType) -> torch.Tensor:
        if node.op_type == "Size":
            return torch.tensor(t.numel, dtype=torch.int64)
        r = t.rank
        start, end = 0, r
        for a in node.attribute:
            if a.name == "start":
                start = int(a.i)
            elif a.name == "end":
                end = int(a.i)
        start = min(max(start + r if start < 0 else start, 0), r)
        end = min(max(end + r if end < 0 else end, 0), r)
        return torch.tensor(t.shape[start:end], dtype=torch.int64)

    def _foldable(self, node: onnx.NodeProto) -> bool:
        if node.op_type in _NON_DETERMINISTIC or any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
            return False
        if not all((not i) or i in self.consts for i in node.input):
            return False
        out_t = self.types.get(node.output[0]) if node.output else None
        return not (isinstance(out_t, TensorType) and out_t.numel > _FOLD_LIMIT)

    def fold(self, node: onnx.NodeProto) -> None:
        ins = [i for i in node.input if i]
        outs = [o for o in node.output if o]
        runner = _NodeRunner(node, ins, outs, self.proto)
        results = runner.run_numpy([to_numpy(self.consts[i]) for i in ins])
        for o, r in zip(outs, results, strict=True):
            self.consts[o] = to_torch(r)

    def fallback(self, node: onnx.NodeProto) -> None:
        ins = [i for i in node.input if i]
        outs = [o for o in node.output if o]
        types = [self._out_type(node, o) for o in outs]
        out_type: ValueType = types[0] if len(types) == 1 else tuple(types)
        target = f"onnx::{node.op_type}" if node.domain in ("", "ai.onnx") else f"onnx::{node.domain}.{node.op_type}"
        fn = _FallbackFn(_NodeRunner(node, ins, outs, self.proto), target, out_type)
        self.fallbacks.append(target)
        attrs = {"fn": fn, "target": target, "out_type": out_type}
        name = self.b.op("fallback", [self.value(i) for i in ins], attrs, name=self.b.fresh("fallback"))
        if len(outs) == 1:
            self.env[outs[0]] = name
        else:
            for k, o in enumerate(outs):
                self.env[o] = self.b.op("getitem", [name], {"index": k})

    def _out_type(self, node: onnx.NodeProto, out: str) -> TensorType:
        t = self.types.get(out)
        if isinstance(t, TensorType):
            return t
        # shape inference could not fix it (data-dependent or unknown op): run the model once on the examples
        arr = self.probe().get(out)
        if arr is None:
            raise FrontendError(f"cannot determine the static shape of {out!r} (output of ONNX {node.op_type} node {node.name!r})")
        dt = ONNX_TO_TORCH.get(helper.np_dtype_to_tensor_dtype(arr.dtype))
        if dt is None:
            raise FrontendError(f"ONNX {node.op_type} node {node.name!r} produces {arr.dtype}, which kfuse does not take")
        return TensorType(tuple(int(s) for s in arr.shape), dt)

    def probe(self) -> dict[str, np.ndarray]:
        """Every intermediate value of the model on the example inputs (computed once)."""
        if self._probe is None:
            if not self.feeds:
                raise FrontendError("the ONNX model needs example inputs to fix the shapes of some values")
            m = copy.deepcopy(self.proto)
            names = [o for n in m.graph.node for o in n.output if o]
            have = {o.name for o in m.graph.output}
            m.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
            ev = reference_evaluator(m)
            res = ev.run(None, {k: to_numpy(v) for k, v in self.feeds.items()})
            self._probe = {o.name: np.asarray(r) for o, r in zip(m.graph.output, res, strict=True)}
        return self._probe


def import_onnx(
    model: OnnxSource,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    name: str | None = None,
) -> Imported:
    """Import an ONNX model. ``args``/``kwargs`` are example inputs matched to the ONNX graph
    inputs by position or by name; they fix symbolic dimensions and may be left out when every
    input shape is static."""
    proto, default_name = load_model(model)
    kwargs = dict(kwargs or {})
    feeds: dict[str, torch.Tensor] = {}
    index: dict[str, int] = {}
    if args or kwargs:
        feeds, index = _match_inputs(proto, args, kwargs)
    runtime = _runtime_inputs(proto)
    input_types = {vi.name: _input_type(vi, feeds.get(vi.name)) for vi in runtime}
    inferred = _with_static_inputs(proto, input_types)
    imp = _Importer(proto, inferred, name or default_name, feeds)
    outputs = imp.run(input_types)
    graph = imp.b.build(outputs)
    # without examples, the inputs are taken positionally in ONNX order
    example = (tuple(args), dict(kwargs)) if (args or kwargs) else (tuple(range(len(runtime))), {})
    in_spec = pytree.tree_flatten(example)[1]
    out_spec = pytree.tree_flatten(tuple(range(len(outputs))))[1]
    flat_index = tuple(index[vi.name] for vi in runtime) if index else tuple(range(len(runtime)))
    return Imported(graph, in_spec, out_spec, flat_index, tuple(imp.fallbacks))


# ---------------------------------------------------------------------------------------
# kfuse.compile entry
# ---------------------------------------------------------------------------------------
class OnnxReference:
    """Runs the whole model with ONNX's reference evaluator; returns a tuple of torch tensors."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self.names = [i.name for i in _runtime_inputs(proto)]
        self.evaluator = reference_evaluator(proto)

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        feeds, _ = _match_inputs(self.proto, args, kwargs)
        device = next(iter(feeds.values())).device if feeds else None
        outs = self.evaluator.run(None, {k: to_numpy(v) for k, v in feeds.items()})
        return tuple(to_torch(o, device) for o in outs)


def onnx_compiled_model(model: OnnxSource, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Any:
    """``kfuse.compile`` for an ONNX model: import per input-shape signature, check against
    ONNX's reference evaluator."""
    from kfuse.runtime.compiled_model import CompiledModel

    proto, name = load_model(model)
    _match_inputs(proto, args, kwargs)  # a wrong number of inputs fails here, with names

    def importer(a: tuple[Any, ...], k: dict[str, Any]) -> Imported:
        return import_onnx(proto, a, k, name=name)

    return CompiledModel(importer, OnnxReference(proto), args, kwargs, options, name)


def random_inputs_for(
    model: OnnxSource, batch: int | None = None, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, ...]:
    """Random example inputs of the model's declared input types (for the CLI).

    A symbolic leading dim takes ``batch`` (default 1); any other symbolic dim is an error that
    names the input. Floating inputs are cast to ``dtype`` only when the model declares that type;
    integer inputs are drawn in [0, 8) (token ids, indices)."""
    proto, _ = load_model(model)
    out = []
    for vi in _runtime_inputs(proto):
        tt = vi.type.tensor_type
        dt = ONNX_TO_TORCH.get(tt.elem_type)
        if dt is None:
            raise FrontendError(f"ONNX input {vi.name!r} has element type {onnx.TensorProto.DataType.Name(tt.elem_type)}")
        shape = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif i == 0:
                shape.append(batch or 1)
            else:
                raise FrontendError(
                    f"ONNX input {vi.name!r} has a symbolic dim {i} ({d.dim_param or '?'}); kfuse compile needs static shapes"
                )
        if dt.is_floating_point:
            out.append(torch.randn(shape, dtype=dt, device=device))
        elif dt == torch.bool:
            out.append(torch.rand(shape, device=device) > 0.5)
        else:
            out.append(torch.randint(0, 8, shape, dtype=dt, device=device))
    return tuple(out)
