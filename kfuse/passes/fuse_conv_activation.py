"""A depthwise conv takes the activation after it (MobileNet's ReLU6, EfficientNet's SiLU, SegFormer's GELU,
MobileNet-V3's hardswish).

The implicit-GEMM convs get their activations from the epilogue fusion; depthwise convs (``groups == C``)
have no epilogue template, so ``conv -> clamp`` was two kernels, the second a full read and write of the
activation. The depthwise kernel applies a clamp (ReLU, ReLU6), a SiLU or an exact GELU before its store; this pass gives
the conv node the activation (``act`` attribute, which its reference and PyTorch fallback apply too) and
drops the activation node. The conv node takes the activation's name, so the rest of the graph is unchanged.
"""

from __future__ import annotations

from typing import Any

from kfuse.ir.graph import Graph, Node, TensorType, freeze_attrs
from kfuse.kernels.depthwise import is_depthwise
from kfuse.passes.simplify import dce


def _activation(node: Node) -> tuple[Any, ...] | None:
    if node.op == "relu":
        return ("clamp", 0.0, None)
    if node.op == "clamp":
        return ("clamp", node.attrs.get("lo"), node.attrs.get("hi"))
    if node.op in ("silu", "gelu", "hardswish", "hardsigmoid"):
        return (node.op,)
    return None


def _is_depthwise(conv: Node, graph: Graph) -> bool:
    w, x = graph.type_of(conv.inputs[1]), graph.type_of(conv.inputs[0])
    if not (isinstance(w, TensorType) and isinstance(x, TensorType)) or x.rank != 4:
        return False
    return is_depthwise(w.shape, x.shape[1], conv.attrs.get("groups", 1))


def _conv_behind_views(act_node: Node, producer: dict[str, Node], users: dict[str, list[Node]], outputs: set[str]) -> list[Node]:
    """[conv, view, ...] from the activation's input back to a conv through at most two single-reader
    reshapes / permutes (SegFormer: ``dwconv -> flatten(2) -> GELU``); [] when there is none."""
    chain: list[Node] = []
    node = producer.get(act_node.inputs[0])
    while node is not None and node.op in _VIEWS and len(chain) < 2:
        chain.append(node)
        node = producer.get(node.inputs[0])
    if node is None or node.op != "conv2d":
        return []
    chain.append(node)
    if any(n.name in outputs or len(users.get(n.name, [])) != 1 for n in chain):
        return []
    return chain[::-1]


_VIEWS = ("reshape", "permute")


def fuse_conv_activation(graph: Graph) -> Graph:
    """Each depthwise conv whose only reader is a clamp / ReLU / SiLU / GELU (or a view of it that only the
    activation reads) takes the activation over; the last view then takes the activation's name."""
    users = graph.users()
    producer = graph.node_map()
    outputs = set(graph.outputs)
    replace: dict[str, Node] = {}
    drop: set[str] = set()
    for act_node in graph.nodes:
        act = _activation(act_node)
        chain = _conv_behind_views(act_node, producer, users, outputs) if act is not None else []
        if not chain or "act" in chain[0].attrs or not _is_depthwise(chain[0], graph):
            continue
        conv, views = chain[0], chain[1:]
        last = views[-1] if views else conv
        if (act_node.ttype.shape, act_node.ttype.dtype) != (last.ttype.shape, last.ttype.dtype):
            continue
        attrs = freeze_attrs(dict(conv.attrs, act=act))
        if not views:  # the conv moves to the activation's place (its inputs are all defined before it)
            replace[act_node.name] = Node(act_node.name, "conv2d", conv.inputs, conv.type, attrs)
            drop.add(conv.name)
            continue
        replace[conv.name] = Node(conv.name, "conv2d", conv.inputs, conv.type, attrs)
        replace[last.name] = Node(act_node.name, last.op, last.inputs, act_node.type, last.attrs)
        drop.add(act_node.name)
    if not replace:
        return graph
    nodes = tuple(replace.get(n.name, n) for n in graph.nodes if n.name not in drop)
    return dce(graph.replace(nodes=nodes))
