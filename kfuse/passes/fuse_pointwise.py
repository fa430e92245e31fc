"""Memory-bound fusion: maximal regions of elementwise ops, broadcasts and one single-axis
reduction become one ``pointwise`` node run by a generated Triton kernel (kernels/pointwise.py).

This pass runs last among the fusion stages, so any elementwise op still in the graph is
free: epilogues, attention, norms and fallbacks were claimed before and are not candidates
(they are not elementwise/reduction ops of this pass's list).

Grouping is greedy in graph order. A region has a *domain* (the full shape) and optionally
a reduction axis (adjacent dims). Each value in it is *full* (the domain's shape), *rowk*
(reduced, axis dims kept as 1) or *rown* (reduced, axis dims dropped). A node joins the
region of one of its producers when its shape fits one of those frames and joining does not
make a cycle between regions (checked on the graph with regions contracted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, ValueType
from kfuse.kernels.pointwise import Arg, PointwiseProgram, PStep, pow_supported
from kfuse.kernels.pointwise import reference as program_reference
from kfuse.passes.layout import runs_nhwc

REDUCTIONS = ("softmax", "log_softmax", "sum", "mean", "amax", "var", "adaptive_avg_pool2d")
# The generated reduction gives each row one program. T5's fp16 guard, any(isinf(h)) over a whole (B, S, D)
# tensor, was one program reducing 3.1M values, 24 times a call: T5-encoder B32 S128 1.18 -> 6.79 ms on the
# H200 (session 38) once the guard was imported natively. Rows this few and long stay PyTorch's.
FEW_ROWS, FEW_ROWS_MIN_LENGTH = 128, 1 << 16


# ---------------------------------------------------------------------------------------
# the fused op
# ---------------------------------------------------------------------------------------
def prepare_inputs(xs: list[torch.Tensor], a: Mapping[str, Any]) -> list[torch.Tensor]:
    """Put each operand in the region's frame (views only: broadcast, then insert axis dims)."""
    out = []
    for x, (bshape, vshape) in zip(xs, a["in_views"], strict=True):
        x = torch.broadcast_to(x, bshape)
        if vshape is not None:
            x = x.reshape(vshape)
        out.append(x)
    return out


def _pointwise_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> Any:
    outs = program_reference(a["program"], prepare_inputs(xs, a), a["domain"], a["axis"], [t.dtype for t in a["out_types"]])
    outs = [o.reshape(t.shape) for o, t in zip(outs, a["out_types"], strict=True)]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _out_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    ts = tuple(a["out_types"])
    return ts[0] if len(ts) == 1 else ts


ops.register("pointwise", ops.FUSED, infer=_out_type)(_pointwise_ref)


# ---------------------------------------------------------------------------------------
# candidates
# ---------------------------------------------------------------------------------------
def _scalar_literal(g: Graph, name: str) -> float | int | bool | None:
    t = g.constants.get(name)
    if t is None or t.dim() != 0:
        return None
    return ops.scalar_value(t)


def _ok_dtype(dt: torch.dtype) -> bool:
    # the generated kernels compute in fp32: float64 chains stay on PyTorch's ops, in float64
    return (dt.is_floating_point and dt != torch.float64) or dt == torch.bool


def _tensor_inputs_ok(node: Node, g: Graph) -> bool:
    for i in node.inputs:
        t = g.type_of(i)
        if not isinstance(t, TensorType):
            return False
        if not _ok_dtype(t.dtype) and _scalar_literal(g, i) is None:
            return False
    return True


def _is_elementwise_candidate(node: Node, g: Graph) -> bool:
    if not ops.is_elementwise(node.op) or not isinstance(node.type, TensorType):
        return False
    if node.op == "pow":
        if len(node.inputs) != 2 or not pow_supported(_scalar_literal(g, node.inputs[1])):
            return False
    elif ops.get(node.op).triton is None:
        return False
    return _ok_dtype(node.ttype.dtype) and node.ttype.numel > 0 and _tensor_inputs_ok(node, g)


def reduction_dims(node: Node, g: Graph) -> tuple[tuple[int, ...], bool] | None:
    """(adjacent reduced dims, keepdim) if ``node`` is a reduction this pass can generate."""
    if node.op not in REDUCTIONS or not isinstance(node.type, TensorType) or len(node.inputs) != 1:
        return None
    x = g.type_of(node.inputs[0])
    if not isinstance(x, TensorType) or not _ok_dtype(x.dtype) or x.dtype == torch.bool or x.numel == 0 or not _ok_dtype(node.ttype.dtype):
        return None
    if not node.ttype.dtype.is_floating_point:
        return None
    r = x.rank
    if node.op in ("softmax", "log_softmax"):
        dims, keep = (node.attrs["dim"] % r if r else 0,), True
        if r == 0:
            return None
    elif node.op == "adaptive_avg_pool2d":
        if tuple(node.attrs.get("output_size", ())) != (1, 1) or r != 4:
            return None
        dims, keep = (2, 3), True
    else:
        d = node.attrs.get("dims")
        dims = tuple(range(r)) if d is None else tuple(sorted(int(x) % r for x in d)) if r else ()
        keep = bool(node.attrs.get("keepdim", False))
        if node.op == "var":
            length = math.prod(x.shape[i] for i in dims)
            if length - node.attrs.get("correction", 1) <= 0:
                return None
    if not dims or list(dims) != list(range(dims[0], dims[-1] + 1)):
        return None
    length = math.prod(x.shape[i] for i in dims)
    if length >= FEW_ROWS_MIN_LENGTH and x.numel // length < FEW_ROWS:
        return None  # a few long rows: one program a row leaves the GPU idle; PyTorch's split reduction runs it
    return dims, keep


# ---------------------------------------------------------------------------------------
# regions
# ---------------------------------------------------------------------------------------
@dataclass
class Region:
    domain: tuple[int, ...]
    axis: tuple[int, ...] = ()
    members: list[Node] = field(default_factory=list)
    kind: dict[str, str] = field(default_factory=dict)  # member -> "full" | "rowk" | "rown"

    def keep_shape(self) -> tuple[int, ...]:
        return tuple(1 if d in self.axis else s for d, s in enumerate(self.domain))

    def drop_shape(self) -> tuple[int, ...]:
        return tuple(s for d, s in enumerate(self.domain) if d not in self.axis)


def _frame_for(node: Node, region: Region, inner: list[str]) -> str | None:
    """The frame ``node`` (elementwise) would have in ``region``, or None if it does not fit."""
    shape = node.ttype.shape
    kinds = [region.kind[i] for i in inner]
    if shape == region.domain and all(k in ("full", "rowk") for k in kinds):
        return "full"
    if region.axis and shape == region.keep_shape() and all(k == "rowk" for k in kinds):
        return "rowk"
    if region.axis and shape == region.drop_shape() and all(k == "rown" for k in kinds):
        return "rown"
    return None


class _Grouper:
    def __init__(self, g: Graph, global_pool: bool = True) -> None:
        self.g = g
        self.users = g.users()
        self.order = {n.name: i for i, n in enumerate(g.nodes)}
        self.region_of: dict[str, int] = {}
        self.regions: list[Region] = []
        # an NHWC graph's global average pools run kfuse.kernels.global_pool (coalesced along the channels), not
        # the generated reduction, whose rows would read pixels C elements apart
        self.nhwc = global_pool and runs_nhwc(g)

    def reaches(self, rid: int, target: str) -> bool:
        """Is ``target`` reachable from region ``rid`` with regions contracted to one node?"""
        limit = self.order.get(target, -1)
        seen_regions = {rid}
        stack = [m.name for m in self.regions[rid].members]
        seen: set[str] = set(stack)
        while stack:
            v = stack.pop()
            for u in self.users.get(v, []):
                if u.name == target:
                    return True
                if u.name in seen or self.order[u.name] > limit:
                    continue
                seen.add(u.name)
                stack.append(u.name)
                r = self.region_of.get(u.name)
                if r is not None and r not in seen_regions:
                    seen_regions.add(r)
                    for m in self.regions[r].members:
                        if m.name not in seen:
                            seen.add(m.name)
                            stack.append(m.name)
        return False

    def merge_would_cycle(self, r1: int, r2: int) -> bool:
        """Would one region made of ``r1`` and ``r2`` depend on itself through another node?"""
        inside = {m.name for m in self.regions[r1].members} | {m.name for m in self.regions[r2].members}
        stack = [u.name for m in list(self.regions[r1].members) + list(self.regions[r2].members)
                 for u in self.users.get(m.name, []) if u.name not in inside]  # fmt: skip
        seen: set[str] = set(stack)
        seen_regions = {r1, r2}
        while stack:
            v = stack.pop()
            r = self.region_of.get(v)
            nxt = [u.name for u in self.users.get(v, [])]
            if r is not None and r not in seen_regions:
                seen_regions.add(r)
                nxt += [m.name for m in self.regions[r].members]
            for u in nxt:
                if u in inside:
                    return True
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
        return False

    def merge(self, r1: int, r2: int) -> None:
        a, b = self.regions[r1], self.regions[r2]
        for m in b.members:
            self.add(r1, m, b.kind[m.name])
        a.axis = a.axis or b.axis
        a.members.sort(key=lambda n: self.order[n.name])
        b.members = []
        b.kind = {}

    def compatible(self, r1: int, r2: int) -> bool:
        a, b = self.regions[r1], self.regions[r2]
        return a.domain == b.domain and (not a.axis or not b.axis or a.axis == b.axis) and bool(b.members)

    def can_join(self, rid: int, node: Node) -> bool:
        members = {m.name for m in self.regions[rid].members}
        return not any(i not in members and i in self.order and self.reaches(rid, i) for i in node.inputs)

    def add(self, rid: int, node: Node, kind: str) -> None:
        self.regions[rid].members.append(node)
        self.regions[rid].kind[node.name] = kind
        self.region_of[node.name] = rid

    def new(self, node: Node, domain: tuple[int, ...], axis: tuple[int, ...], kind: str) -> None:
        self.regions.append(Region(domain, axis))
        self.add(len(self.regions) - 1, node, kind)

    def producer_regions(self, node: Node) -> list[int]:
        out: list[int] = []
        for i in node.inputs:
            r = self.region_of.get(i)
            if r is not None and r not in out:
                out.append(r)
        return out

    def visit(self, node: Node) -> None:
        if node.op == "adaptive_avg_pool2d" and self.nhwc:
            return
        red = reduction_dims(node, self.g)
        if red is not None:
            dims, keep = red
            kind = "full" if node.op in ("softmax", "log_softmax") else "rowk" if keep else "rown"
            x = node.inputs[0]
            rid = self.region_of.get(x)
            if rid is not None:
                reg = self.regions[rid]
                if reg.kind[x] == "full" and (not reg.axis or reg.axis == dims) and self.can_join(rid, node):
                    reg.axis = dims
                    self.add(rid, node, kind)
                    return
            xt = self.g.type_of(x)
            assert isinstance(xt, TensorType)
            self.new(node, xt.shape, dims, kind)
            return
        if not _is_elementwise_candidate(node, self.g):
            return
        producers = self.producer_regions(node)
        for rid in producers:  # horizontal merge: one kernel for sibling chains that meet here
            for r2 in producers:
                if r2 != rid and self.compatible(rid, r2) and not self.merge_would_cycle(rid, r2):
                    self.merge(rid, r2)
            break
        for rid in self.producer_regions(node):
            reg = self.regions[rid]
            inner = [i for i in node.inputs if self.region_of.get(i) == rid]
            kind = _frame_for(node, reg, inner)
            if kind is not None and self.can_join(rid, node):
                self.add(rid, node, kind)
                return
        self.new(node, node.ttype.shape, (), "full")


# ---------------------------------------------------------------------------------------
# programs
# ---------------------------------------------------------------------------------------
def _pad_shape(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


class _ProgramBuilder:
    def __init__(self, g: Graph, reg: Region) -> None:
        self.g, self.reg = g, reg
        self.steps: list[PStep] = []
        self.value: dict[str, int] = {}  # member -> register
        self.inputs: list[str] = []
        self.in_views: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = []
        self.input_row: list[bool] = []
        self.input_float: list[bool] = []
        self._in_index: dict[tuple[str, str], int] = {}

    def emit(self, op: str, args: list[Arg], row: bool, dtype: torch.dtype = torch.float32, attrs: tuple = ()) -> Arg:
        self.steps.append(PStep(op, tuple(args), attrs, dtype, row))
        return Arg("reg", len(self.steps) - 1)

    def operand(self, name: str, frame: str) -> Arg:
        if name in self.value:
            return Arg("reg", self.value[name])
        lit = _scalar_literal(self.g, name)
        if lit is not None:
            return Arg("lit", value=lit)
        key = (name, frame)
        if key not in self._in_index:
            t = self.g.type_of(name)
            assert isinstance(t, TensorType)
            reg = self.reg
            if frame == "full":
                view: tuple[tuple[int, ...], tuple[int, ...] | None] = (reg.domain, None)
                padded = _pad_shape(t.shape, len(reg.domain))
                row = bool(reg.axis) and all(padded[a] == 1 for a in reg.axis)
            elif frame == "rowk":
                view, row = (reg.keep_shape(), None), True
            else:
                view, row = (reg.drop_shape(), reg.keep_shape()), True
            self._in_index[key] = len(self.inputs)
            self.inputs.append(name)
            self.in_views.append(view)
            self.input_row.append(row)
            self.input_float.append(t.dtype.is_floating_point)
        return Arg("in", self._in_index[key])

    def member(self, node: Node) -> None:
        kind = self.reg.kind[node.name]
        row = kind != "full"
        if node.op not in REDUCTIONS:
            args = [self.operand(i, kind) for i in node.inputs]
            attrs = tuple((k, v) for k, v in node.attrs.items())
            self.value[node.name] = self.emit(node.op, args, row, node.ttype.dtype, attrs).index
            return
        x = self.operand(node.inputs[0], "full")
        length = math.prod(self.reg.domain[a] for a in self.reg.axis)
        dt = node.ttype.dtype
        if node.op in ("softmax", "log_softmax"):
            m = self.emit("rmax", [x], True)
            d = self.emit("sub", [x, m], False)
            e = self.emit("exp", [d], False)
            s = self.emit("rsum", [e], True)
            if node.op == "softmax":
                out = self.emit("div", [e, s], False, dt)
            else:
                out = self.emit("sub", [d, self.emit("log", [s], True)], False, dt)
        elif node.op == "sum":
            out = self.emit("rsum", [x], True, dt)
        elif node.op == "amax":
            out = self.emit("rmax", [x], True, dt)
        elif node.op in ("mean", "adaptive_avg_pool2d"):
            out = self.emit("mul", [self.emit("rsum", [x], True), Arg("lit", value=1.0 / length)], True, dt)
        else:  # var: two passes (mean, then squared deviations) for accuracy
            mu = self.emit("mul", [self.emit("rsum", [x], True), Arg("lit", value=1.0 / length)], True)
            d = self.emit("sub", [x, mu], False)
            q = self.emit("rsum", [self.emit("mul", [d, d], False)], True)
            out = self.emit("mul", [q, Arg("lit", value=1.0 / (length - node.attrs.get("correction", 1)))], True, dt)
        self.value[node.name] = out.index


def _fused_node(g: Graph, reg: Region, outputs: list[Node], name: str) -> Node:
    pb = _ProgramBuilder(g, reg)
    for m in reg.members:
        pb.member(m)
    prog = PointwiseProgram(
        tuple(pb.input_row),
        tuple(pb.steps),
        tuple(pb.value[o.name] for o in outputs),
        bool(reg.axis),
        tuple(pb.input_float),
    )
    out_types = tuple(o.ttype for o in outputs)
    attrs = {
        "program": prog,
        "domain": reg.domain,
        "axis": reg.axis,
        "in_views": tuple(pb.in_views),
        "out_types": out_types,
        "out_names": tuple(o.name for o in outputs),
        "fused_ops": tuple(m.op for m in reg.members),
    }
    ty: ValueType = out_types[0] if len(out_types) == 1 else out_types
    return Node(name, "pointwise", tuple(pb.inputs), ty, attrs)


def fuse_pointwise(graph: Graph, global_pool: bool = True) -> Graph:
    """Replace each region of elementwise ops (+ one single-axis reduction) with a ``pointwise`` node;
    ``global_pool``: an NHWC graph's global average pools stay for ``kfuse.kernels.global_pool``."""
    gr = _Grouper(graph, global_pool)
    for node in graph.nodes:
        gr.visit(node)
    graph_outputs = set(graph.outputs)
    replaced: dict[str, list[Node]] = {}  # first member -> nodes that replace the region
    removed: set[str] = set()
    b = GraphBuilder.from_graph(graph)
    taken_names = {n.name for n in graph.nodes} | set(graph.input_names) | set(graph.constants)
    for reg in gr.regions:
        names = {m.name for m in reg.members}
        outs = [m for m in reg.members if m.name in graph_outputs or any(u.name not in names for u in gr.users.get(m.name, []))]
        if not outs:
            continue
        if len(outs) == 1:
            new = [_fused_node(graph, reg, outs, outs[0].name)]
        else:
            fname = b.fresh("pointwise")
            while fname in taken_names:
                fname = b.fresh("pointwise")
            taken_names.add(fname)
            fused = _fused_node(graph, reg, outs, fname)
            new = [fused] + [Node(o.name, "getitem", (fname,), o.type, {"index": k}) for k, o in enumerate(outs)]
        replaced[reg.members[0].name] = new
        removed |= names
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.name in replaced:
            nodes.extend(replaced[node.name])
        elif node.name not in removed:
            nodes.append(node)
    for n in _toposort(nodes, graph):
        b.add_node(n)
    return b.build(graph.outputs)


def _toposort(nodes: list[Node], graph: Graph) -> list[Node]:
    """Stable topological order (regions can move later than their first member)."""
    defined = set(graph.input_names) | set(graph.constants)
    produced = {n.name for n in nodes}
    waiting: dict[str, list[int]] = {}
    missing = []
    for i, n in enumerate(nodes):
        deps = {x for x in n.inputs if x in produced and x not in defined}
        deps.discard(n.name)
        missing.append(len(deps))
        for d in deps:
            waiting.setdefault(d, []).append(i)
    import heapq

    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    out: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(nodes[i])
        for j in waiting.get(nodes[i].name, []):
            missing[j] -= 1
            if missing[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != len(nodes):
        raise RuntimeError("fuse_pointwise produced a cyclic graph (a bug in region grouping)")
    return out


# ---------------------------------------------------------------------------------------
# lowering: how the runtime launches a ``pointwise`` node
# ---------------------------------------------------------------------------------------
class PointwiseLaunch:
    """Step function of a ``pointwise`` node. ``fn(xs, out)`` writes a single output into a
    planned buffer (the memory planner's ``out=`` protocol); ``inplace_inputs`` lists the
    operands whose storage the output may reuse (elementwise, same shape and element size)."""

    accepts_out = True

    def __init__(self, node: Node, graph: Graph) -> None:
        a = node.attrs
        self.attrs = a
        self.prog: PointwiseProgram = a["program"]
        self.domain, self.axis = tuple(a["domain"]), tuple(a["axis"])
        self.out_types: tuple[TensorType, ...] = tuple(a["out_types"])
        self.single = len(self.out_types) == 1
        keep = tuple(1 if d in self.axis else s for d, s in enumerate(self.domain))
        self.frames = [keep if self.prog.steps[r].row else self.domain for r in self.prog.outputs]
        inplace = []
        if self.single and not self.axis:
            for j, i in enumerate(node.inputs):
                t = graph.type_of(i)
                if isinstance(t, TensorType) and t.shape == self.domain and t.dtype.itemsize == self.out_types[0].dtype.itemsize:
                    inplace.append(j)
        self.inplace_inputs = tuple(inplace)
        # concat_in_place: an elementwise result straight into a cat's slice (the kernel takes any output strides)
        self.writes_strided_out = self.single and not self.axis and tuple(self.out_types[0].shape) == self.domain

    def __call__(self, xs: list[torch.Tensor], out: torch.Tensor | None = None) -> Any:
        from kfuse.kernels.pointwise import run_program

        outs = None if out is None else [out.view(self.frames[0])]
        res = run_program(self.prog, prepare_inputs(xs, self.attrs), self.domain, self.axis, [t.dtype for t in self.out_types], outs)
        res = [r.reshape(t.shape) for r, t in zip(res, self.out_types, strict=True)]
        return res[0] if self.single else tuple(res)


def _lower_pointwise(node: Node, graph: Graph, backend: str) -> Any:
    from kfuse.runtime.executor import KernelInfo, Step

    if backend == "torch":
        return None
    prog: PointwiseProgram = node.attrs["program"]
    mode = f"reduce{list(node.attrs['axis'])}" if node.attrs["axis"] else "elementwise"
    info = KernelInfo(node.name, "pointwise", tuple(node.attrs["fused_ops"]), f"{mode} over {list(node.attrs['domain'])}", prog.describe())
    return Step(node.name, node.inputs, PointwiseLaunch(node, graph), info)


def _register_lowering() -> None:
    from kfuse.runtime.executor import lowering

    lowering("pointwise")(_lower_pointwise)


_register_lowering()
