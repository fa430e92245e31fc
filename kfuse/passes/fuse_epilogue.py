"""Epilogue fusion: a GEMM or a conv2d followed by elementwise ops (bias, activation,
residual, scale, casts) becomes one ``gemm_epilogue`` / ``conv_epilogue`` node whose kernel
applies the chain to the accumulator tile before the single store to global memory (Bolt's
epilogue fusion). Grouped convolutions are anchors too (the template runs one GEMM a group); depthwise
ones (one input channel a group) are not: they stay ``conv2d`` for the depthwise kernel or PyTorch.

A region grows from the GEMM over elementwise consumers whose output has the GEMM's output
shape and whose other operands do not depend on the region (no cycles). The region is cut to
the longest prefix (in graph order) whose values escape only through one node: that node's
value is the fused node's output and keeps its name, so the rest of the graph is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import kfuse.kernels.conv as _conv_kernels  # noqa: F401 - registers the conv lowerings
import kfuse.kernels.gemm as _gemm_kernels  # noqa: F401 - the GEMM lowering lives there
from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, ValueType
from kfuse.kernels.conv import ConvParams, conv_operand_count, plain_operand_count, scaled_first, supported
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand, apply_reference, pow_matches_torch
from kfuse.passes.simplify import dce

_CONV_ATTRS = ("stride", "padding", "dilation", "groups", "pad_end")


def _gemm_epilogue_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    x = xs[0]
    if a.get("row_rms") is not None:  # a folded RMSNorm (passes/fold_row_norm): A is the norm's input, scaled first
        x = row_rms_scaled(x, a["row_rms"])
    acc = torch.matmul(x, xs[1])
    return apply_reference(acc, xs[2:], a["epilogue"]).to(a["out_type"].dtype)


def row_rms_scaled(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` times each row's ``rsqrt(mean(x^2) + eps)``, in fp32, rounded to ``x``'s dtype: the norm without its
    weight, which ``fold_row_norm`` moved into the GEMM's."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _out_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    return a["out_type"]


def _conv_epilogue_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    n_conv = conv_operand_count(a)
    if a.get("in_scale"):  # relu?(x * s + t) read by the conv (kfuse.passes.fuse_input_scale)
        xs, n_conv = scaled_first(xs, a), plain_operand_count(a)
    acc = ops.run_reference("conv2d", xs[:n_conv], a)
    return apply_reference(acc, xs[n_conv:], a["epilogue"]).to(a["out_type"].dtype)


ops.register("gemm_epilogue", ops.FUSED, infer=_out_type)(_gemm_epilogue_ref)
ops.register("conv_epilogue", ops.FUSED, infer=_out_type)(_conv_epilogue_ref)


def _is_gemm_anchor(node: Node, g: Graph) -> bool:
    if node.op == "conv2d":
        x, w = (g.type_of(i) for i in node.inputs[:2])
        if not (isinstance(x, TensorType) and x.rank == 4 and isinstance(w, TensorType) and w.rank == 4):
            return False
        # grouped convs have the template (one GEMM a group); depthwise ones (one input channel a group) do not
        return supported(tuple(w.shape), ConvParams.of(node.attrs)) is None
    if node.op != "matmul":
        return False
    a, b = (g.type_of(i) for i in node.inputs)
    return isinstance(a, TensorType) and isinstance(b, TensorType) and b.rank >= 2 and a.rank >= 2


def _descendants(start: str, users: dict[str, list[Node]]) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        v = stack.pop()
        for u in users.get(v, []):
            if u.name not in seen:
                seen.add(u.name)
                stack.append(u.name)
    return seen


def _scalar_literal(g: Graph, name: str) -> float | int | bool | None:
    t = g.constants.get(name)
    if t is None or t.dim() != 0:
        return None
    return ops.scalar_value(t)


def _pow_exact(u: Node, g: Graph) -> bool:
    """pow fuses only where the epilogue renders it as torch computes it (``pow_matches_torch``)."""
    t = g.constants.get(u.inputs[1]) if len(u.inputs) == 2 else None
    return t is not None and t.dim() == 0 and pow_matches_torch(ops.scalar_value(t))


def _grow_region(anchor: Node, g: Graph, users: dict[str, list[Node]], order: dict[str, int], taken: set[str]) -> list[Node]:
    shape = anchor.ttype.shape
    downstream = _descendants(anchor.name, users)
    region = {anchor.name}
    members: list[Node] = []
    frontier = sorted(users.get(anchor.name, []), key=lambda n: order[n.name])
    while frontier:
        u = frontier.pop(0)
        if u.name in region or u.name in taken or not ops.is_elementwise(u.op) or ops.get(u.op).triton is None:
            continue
        if u.op == "pow" and not _pow_exact(u, g):
            continue
        if not isinstance(u.type, TensorType) or u.ttype.shape != shape:
            continue
        externals = [i for i in u.inputs if i not in region]
        if any(i in downstream for i in externals):
            continue  # the operand is computed from the region: fusing would make a cycle
        region.add(u.name)
        members.append(u)
        frontier.extend(x for x in users.get(u.name, []) if x.name not in region)
        frontier.sort(key=lambda n: order[n.name])
    members.sort(key=lambda n: order[n.name])
    # longest prefix whose values escape only through its last member
    outputs = set(g.outputs)
    best: list[Node] = []
    for k in range(1, len(members) + 1):
        prefix = members[:k]
        names = {anchor.name} | {m.name for m in prefix}
        escaping = {v for v in names if v in outputs or any(x.name not in names for x in users.get(v, []))}
        if escaping == {prefix[-1].name} or (not escaping and k == len(members)):
            best = prefix
    return best


def fuse_epilogues(graph: Graph) -> Graph:
    """Replace each GEMM (conv2d) + elementwise-chain region with a ``gemm_epilogue``
    (``conv_epilogue``) node."""
    users = graph.users()
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    fused_into: dict[str, Node] = {}  # name of the region's last node -> fused node
    removed: set[str] = set()
    taken: set[str] = set()
    for node in graph.nodes:
        if not _is_gemm_anchor(node, graph) or node.name in taken:
            continue
        members = _grow_region(node, graph, users, order, taken)
        regs = {node.name: 0}
        extras: list[str] = []
        steps: list[EpilogueStep] = []
        for m in members:
            args = []
            for i in m.inputs:
                if i in regs:
                    args.append(Operand("reg", regs[i]))
                elif (lit := _scalar_literal(graph, i)) is not None:
                    args.append(Operand("lit", value=lit))
                else:
                    if i not in extras:
                        extras.append(i)
                    args.append(Operand("in", extras.index(i)))
            attrs = tuple((k, v) for k, v in m.attrs.items())
            steps.append(EpilogueStep(m.op, tuple(args), attrs, m.ttype.dtype))
            regs[m.name] = len(steps)
        last = members[-1] if members else node
        epi = Epilogue(tuple(steps), len(extras))
        out_type = last.type
        if node.op == "conv2d" and isinstance(out_type, TensorType):  # the kernel writes the conv's layout
            out_type = TensorType(out_type.shape, out_type.dtype, node.ttype.layout)
        attrs: dict[str, Any] = {"epilogue": epi, "out_type": out_type, "fused_ops": tuple([node.op] + [m.op for m in members])}
        if node.op == "conv2d":
            attrs.update({k: node.attrs[k] for k in _CONV_ATTRS if k in node.attrs})
            attrs["has_bias"] = len(node.inputs) > 2
        kind = "conv_epilogue" if node.op == "conv2d" else "gemm_epilogue"
        fused = Node(last.name, kind, tuple(node.inputs) + tuple(extras), out_type, attrs)
        fused_into[last.name] = fused
        removed.update({node.name} | {m.name for m in members})
        taken.update(removed)
    b = GraphBuilder.from_graph(graph)
    pending = dict(fused_into)
    for node in graph.nodes:
        if node.name in pending:
            b.add_node(pending.pop(node.name))
        elif node.name not in removed:
            b.add_node(node)
    return dce(b.build(graph.outputs))
