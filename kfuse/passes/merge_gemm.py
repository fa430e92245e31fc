"""Horizontal GEMM merge: GEMMs that read the same activation with constant weights (the Q, K and
V projections) become one GEMM over the concatenated weight ``[K, N1 + N2 + ...]``, built once at
compile time. When a branch adds a constant bias, the biases are concatenated too (zeros for a branch
without one: Swin-V2's key projection has none), so the epilogue fuser later puts one bias add in the
merged GEMM's epilogue.

Each branch's value becomes a ``slice`` of the merged output along the last dim: a strided view,
never a copy (and the attention kernel reads Q, K and V through those strides).
"""

from __future__ import annotations

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce


def _const_weight(node: Node, graph: Graph) -> torch.Tensor | None:
    if node.op != "matmul" or node.inputs[1] not in graph.constants:
        return None
    w = graph.constants[node.inputs[1]]
    a = graph.type_of(node.inputs[0])
    if w.dim() != 2 or not isinstance(a, TensorType) or a.rank < 2:
        return None
    return w


def _const_bias(node: Node, users: dict[str, list[Node]], graph: Graph) -> tuple[Node, torch.Tensor] | None:
    """The single ``add(node, bias[N])`` that follows ``node``, if any."""
    us = users.get(node.name, [])
    if len(us) != 1 or node.name in graph.outputs:
        return None
    add = us[0]
    if add.op != "add" or add.inputs[0] != node.name or add.inputs[1] not in graph.constants:
        return None
    bias = graph.constants[add.inputs[1]]
    if bias.dim() != 1 or bias.shape[0] != node.ttype.shape[-1] or add.ttype != node.ttype:
        return None
    return add, bias


_EPILOGUE_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")


def _feeds_activation(node: Node, users: dict[str, list[Node]], graph: Graph) -> bool:
    """The GEMM's value (after its bias add, if any) is read by one activation alone, which its own GEMM's
    epilogue would take. Not a gated MLP's gate (the activation times another projection: GeGLU's GELU, SwiGLU's
    SiLU), which the gated-GEMM fusion wants merged with its up projection."""
    bias = _const_bias(node, users, graph)
    out = bias[0] if bias is not None else node
    us = users.get(out.name, [])
    if len(us) != 1 or us[0].op not in _EPILOGUE_ACTIVATIONS or out.name in graph.outputs:
        return False
    return not any(u.op == "mul" for u in users.get(us[0].name, []))


def merge_gemms(graph: Graph, min_group: int = 2, merge_activated: bool = False) -> Graph:
    """Merge groups of at least ``min_group`` constant-weight GEMMs that share their input. A GEMM whose value
    goes into a GELU / ReLU / SiLU (not a gated MLP's gate) stays out of the group unless ``merge_activated``:
    GPT-J's and Phi's parallel blocks read one LayerNorm output in Q, K, V and fc_in, and merged, fc_in's GELU
    covers a column range of the merged output that no epilogue takes, so it ran as a pointwise kernel over the
    4x-wide activation."""
    users = graph.users()
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        w = _const_weight(node, graph)
        if w is not None and (merge_activated or not _feeds_activation(node, users, graph)):
            groups.setdefault((node.inputs[0], w.shape[0], w.dtype, w.device), []).append(node)
    plans: dict[str, tuple[list[Node], list[tuple[Node, torch.Tensor] | None]]] = {}
    for members in groups.values():
        if len(members) < min_group:
            continue
        biases = [_const_bias(m, users, graph) for m in members]
        given = [bb[1] for bb in biases if bb is not None]
        if given and len({(t.dtype, t.device) for t in given}) != 1:
            biases = [None] * len(members)  # biases of different types: merge the GEMMs, leave the adds alone
        plans[members[0].name] = (members, biases)
    if not plans:
        return graph
    b = GraphBuilder.from_graph(graph)
    emitted: set[str] = set()
    skip: set[str] = set()
    for node in graph.nodes:
        if node.name in skip:
            continue
        if node.name not in plans:
            if node.name not in emitted:
                b.add_node(node)
            continue
        members, biases = plans[node.name]
        w = torch.cat([graph.constants[m.inputs[1]] for m in members], dim=1).contiguous()
        y = b.op("matmul", [node.inputs[0], b.add_constant(w, b.fresh("w_merged"))], name=b.fresh("matmul_merged"))
        given = [bb[1] for bb in biases if bb is not None]
        if given:  # a branch without a bias (Swin-V2's key) adds zeros, so the epilogue takes all the adds
            like = given[0]
            parts = [bb[1] if bb is not None else like.new_zeros(m.ttype.shape[-1]) for m, bb in zip(members, biases, strict=True)]
            y = b.op("add", [y, b.add_constant(torch.cat(parts).contiguous(), b.fresh("b_merged"))], name=b.fresh("add_merged"))
        rank = node.ttype.rank
        start = 0
        for m, bb in zip(members, biases, strict=True):
            n = m.ttype.shape[-1]
            out = bb[0] if bb is not None else m  # the value the rest of the graph reads
            b.add_node(Node(out.name, "slice", (y,), out.type, {"dim": rank - 1, "start": start, "end": start + n, "step": 1}))
            emitted.add(out.name)
            skip.add(m.name)
            start += n
    return dce(b.build(graph.outputs))
