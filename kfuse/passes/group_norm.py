"""The ``group_norm`` op: its SiLU folded in (``fuse_silu``), or written as the layer-norm form (``decompose``).

Diffusion U-Nets and VAEs follow almost every GroupNorm with a SiLU. The kernel (``kfuse.kernels.group_norm``)
applies it before its store, so ``fuse_silu`` gives the norm node an ``act="silu"`` attribute and drops the SiLU
node: one read and one write of the map fewer. ``decompose`` writes each op as the importer did before session 44
(reshape to [N, G, C / G * H * W], layer norm, reshape back, per-channel affine): ``Options.group_norm=False``,
for an A/B against the kernel.
"""

from __future__ import annotations

import math

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, freeze_attrs
from kfuse.passes.simplify import dce


def fuse_silu(graph: Graph) -> Graph:
    """Each ``group_norm`` whose only reader is a SiLU of the same type takes it over, under the SiLU's name."""
    users = graph.users()
    producer = graph.node_map()
    outputs = set(graph.outputs)
    replace: dict[str, Node] = {}
    drop: set[str] = set()
    for node in graph.nodes:
        if node.op != "silu":
            continue
        norm = producer.get(node.inputs[0])
        if norm is None or norm.op != "group_norm" or "act" in norm.attrs or norm.name in outputs:
            continue
        if len(users.get(norm.name, [])) != 1 or norm.type != node.type:
            continue
        replace[node.name] = Node(node.name, "group_norm", norm.inputs, node.type, freeze_attrs(dict(norm.attrs, act="silu")))
        drop.add(norm.name)
    if not replace:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name not in drop:
            b.add_node(replace.get(node.name, node))
    return dce(b.build(list(graph.outputs)))


def decompose(graph: Graph) -> Graph:
    """Every ``group_norm`` as reshape -> layer_norm -> reshape -> mul -> add (-> silu)."""
    if not any(n.op == "group_norm" for n in graph.nodes):
        return graph
    b = GraphBuilder.from_graph(graph)
    rename: dict[str, str] = {}
    for node in graph.nodes:
        inputs = tuple(rename.get(i, i) for i in node.inputs)
        if node.op != "group_norm":
            b.add_node(Node(node.name, node.op, inputs, node.type, node.attrs))
            continue
        x, w, bias = inputs
        t = b.type_of(x)
        assert isinstance(t, TensorType)
        g = int(node.attrs["groups"])
        n, ch = t.shape[0], t.shape[1]
        length = ch // g * math.prod(t.shape[2:])
        per_channel = (ch,) + (1,) * (t.rank - 2)
        y = b.op("reshape", [x], {"shape": (n, g, length)})
        y = b.op("layer_norm", [y], {"normalized_shape": (length,), "eps": float(node.attrs.get("eps", 1e-5))})
        y = b.op("reshape", [y], {"shape": tuple(t.shape)})
        y = b.op("mul", [y, b.op("reshape", [w], {"shape": per_channel})])
        y = b.op("add", [y, b.op("reshape", [bias], {"shape": per_channel})])
        if node.attrs.get("act") == "silu":
            y = b.op("silu", [y])
        rename[node.name] = y
    return dce(b.build([rename.get(o, o) for o in graph.outputs]))
