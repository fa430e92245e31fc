"""A depthwise conv takes the activation after it (MobileNet's ReLU6, EfficientNet's SiLU).

The implicit-GEMM convs get their activations from the epilogue fusion; depthwise convs (``groups == C``)
have no epilogue template, so ``conv -> clamp`` was two kernels, the second a full read and write of the
activation. The depthwise kernel applies a clamp (ReLU, ReLU6) or a SiLU before its store; this pass gives
the conv node the activation (``act`` attribute, which its reference and PyTorch fallback apply too) and
drops the activation node. The conv node takes the activation's name, so the rest of the graph is unchanged.
"""

from __future__ import annotations

from typing import Any

from kfuse.ir.graph import Graph, Node, TensorType, freeze_attrs
from kfuse.passes.simplify import dce


def _activation(node: Node) -> tuple[Any, ...] | None:
    if node.op == "relu":
        return ("clamp", 0.0, None)
    if node.op == "clamp":
        return ("clamp", node.attrs.get("lo"), node.attrs.get("hi"))
    if node.op == "silu":
        return ("silu",)
    return None


def _is_depthwise(conv: Node, graph: Graph) -> bool:
    w = graph.type_of(conv.inputs[1])
    x = graph.type_of(conv.inputs[0])
    if not (isinstance(w, TensorType) and isinstance(x, TensorType)) or w.rank != 4 or x.rank != 4:
        return False
    c = x.shape[1]
    return conv.attrs.get("groups", 1) == c and w.shape[0] == c and w.shape[1] == 1


def fuse_conv_activation(graph: Graph) -> Graph:
    """Each depthwise conv whose only reader is a clamp / ReLU / SiLU takes it over."""
    users = graph.users()
    producer = graph.node_map()
    outputs = set(graph.outputs)
    new: dict[str, Node] = {}
    for act_node in graph.nodes:
        act = _activation(act_node)
        conv = producer.get(act_node.inputs[0]) if act is not None else None
        if conv is None or conv.op != "conv2d" or "act" in conv.attrs or conv.name in outputs:
            continue
        if len(users.get(conv.name, [])) != 1 or not _is_depthwise(conv, graph):
            continue
        if (act_node.ttype.shape, act_node.ttype.dtype) != (conv.ttype.shape, conv.ttype.dtype):
            continue
        attrs = freeze_attrs(dict(conv.attrs, act=act))
        new[act_node.name] = Node(act_node.name, "conv2d", conv.inputs, conv.type, attrs)
    if not new:
        return graph
    moved = {n.inputs[0] for n in graph.nodes if n.name in new}
    # the conv moves to the activation's place (its inputs are defined before the conv, so before it too)
    nodes = tuple(new.get(n.name, n) for n in graph.nodes if n.name not in moved)
    return dce(graph.replace(nodes=nodes))
