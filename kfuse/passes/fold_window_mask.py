"""Fold a shifted-window attention mask added through a 5-D view into one 4-D constant mask.

Swin-V2 (Hugging Face) adds the shifted-window mask to the ``(B*nW, H, N, N)`` scores by viewing them
as ``(B, nW, H, N, N)``, adding the ``(1, nW, 1, N, N)`` mask (and a second one beside it) and viewing
the sum back::

    reshape(add(add(reshape(s, (B, nW, H, N, N)), m1), m2), (B*nW, H, N, N))

``fuse_attention`` matches 4-D chains only, so those layers kept their scores in memory. When every
``m`` is computed from constants alone (``fold.constant_value``: a mask past ``constant_fold``'s size
limits is still a chain of ops on constants here), the chain is ``s + M``
with ``M = (m1 + m2)`` broadcast to ``(B, nW, Hm, N, N)`` and merged to ``(B*nW, Hm, N, N)`` (``Hm`` is 1
unless a mask varies over heads): this pass writes that, ``M`` one new constant, which the attention
kernel reads as its dense mask. The mask then costs ``B*nW*N*N`` elements (Swin-V2-T B32, stage 1: 2,048
windows of 49 x 49, 9.8 MB in fp16) for a plan that is compiled for one batch size anyway.
"""

from __future__ import annotations

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.fold import constant_value
from kfuse.passes.simplify import dce


def _single_user(users: dict[str, list[Node]], name: str, graph: Graph) -> bool:
    return len(users.get(name, [])) == 1 and name not in graph.outputs


def _window_split(graph: Graph, node: Node, producer: dict[str, Node]) -> str | None:
    """``s`` when ``node`` is ``reshape(s)`` splitting the first dim of a 4-D ``s`` in two."""
    if node.op != "reshape":
        return None
    s = graph.type_of(node.inputs[0])
    out = node.ttype
    if not (isinstance(s, TensorType) and s.rank == 4 and out.rank == 5):
        return None
    return node.inputs[0] if out.shape[0] * out.shape[1] == s.shape[0] and out.shape[2:] == s.shape[1:] else None


def _match(
    graph: Graph, merge: Node, producer: dict[str, Node], users: dict[str, list[Node]]
) -> tuple[str, list[torch.Tensor], list[str]] | None:
    """(scores, the masks' values, the nodes the rewrite removes) for ``merge = reshape(add*(split(s), m...))``
    with every ``m`` computed from constants alone."""
    if merge.op != "reshape" or merge.ttype.rank != 4:
        return None
    masks: list[torch.Tensor] = []
    removed = [merge.name]
    cur = producer.get(merge.inputs[0])
    while cur is not None and cur.op == "add" and cur.ttype.rank == 5 and _single_user(users, cur.name, graph):
        removed.append(cur.name)
        a, b = cur.inputs
        for mask, rest in ((b, a), (a, b)):
            value = constant_value(graph, mask)  # None on the scores' side, which an input feeds
            if value is not None:
                masks.append(value)
                cur = producer.get(rest)
                break
        else:
            return None
    if not masks or cur is None or not _single_user(users, cur.name, graph):
        return None
    s = _window_split(graph, cur, producer)
    if s is None or graph.type_of(s).shape != merge.ttype.shape:
        return None
    removed.append(cur.name)
    return s, masks, removed


def fold_window_mask(graph: Graph) -> Graph:
    """Rewrite every constant 5-D window-mask add (module docstring) as one 4-D add."""
    producer = graph.node_map()
    users = graph.users()
    rewrites: dict[str, tuple[str, torch.Tensor]] = {}
    dead: set[str] = set()
    for node in graph.nodes:
        found = _match(graph, node, producer, users)
        if found is None:
            continue
        s, masks, removed = found
        five = graph.type_of(producer[removed[-1]].name).shape  # (B, nW, H, N, N)
        total = masks[0]
        for m in masks[1:]:
            total = total + m
        if total.dim() > 5:
            continue
        total = total.reshape((1,) * (5 - total.dim()) + tuple(total.shape))
        heads = five[2] if total.shape[2] != 1 else 1
        mask = total.expand(five[0], five[1], heads, five[3], five[4]).reshape(five[0] * five[1], heads, five[3], five[4])
        rewrites[node.name] = (s, mask.to(node.ttype.dtype).contiguous())
        dead.update(removed[1:])
    if not rewrites:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in rewrites:
            s, mask = rewrites[node.name]
            m = b.add_constant(mask, name=b.fresh(f"{node.name}_window_mask"))
            b.add_node(Node(node.name, "add", (s, m), node.type, {}))
        elif node.name not in dead:
            b.add_node(node)
    return dce(b.build(graph.outputs))
