"""Attention over more than one batch dim brought to the ``[B, H, S, D]`` form ``fuse_attention`` matches.

MaxViT (``einsum("BGHID,BGHJD->BGHIJ")``: batch, window grid, heads) and Hiera (``[B, heads, windows, N, D]``)
compute attention over five dims; ``fuse_attention`` reads four, so their scores went through memory and the
softmax ran as its own kernel. Every dim before the last three is a batch dim here, so folding them into one changes
nothing but the shape. Four rewrites, applied until none applies, each turning one rank-r (r >= 5) op into a
rank-4 one between ``fold`` (a reshape merging the leading r - 3 dims) and ``unfold`` (its inverse):

* ``matmul(a, b)`` with equal batch dims (no broadcast), when its value reaches a softmax through elementwise ops
  (the scores) -> ``unfold(matmul(fold(a), fold(b)))``;
* ``sdpa(q, k, v)`` over rank-r Q, K, V with equal batch dims and no mask -> ``unfold(sdpa(fold(q), ...))``;
* ``e(unfold(y), others)`` for an elementwise op or a softmax over one of the last three dims: the others folded
  alike (equal batch dims), left as they are (rank 3 or less: they broadcast over the last dims either way),
  stripped of leading 1s, or expanded first where they broadcast over some batch dims only (a per-window mask:
  the folded dim cannot broadcast it) -> ``unfold(e(y, others'))``;
* ``matmul(unfold(p), v)`` -> ``unfold(matmul(p, fold(v)))`` (the probabilities times V).

``algebraic_simplify`` then cancels each ``fold(unfold(y))`` pair. A rewritten node keeps its name (as the
unfold of the new 4-D node), so the rest of the graph is unchanged.
"""

from __future__ import annotations

import math

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce, rewrite_then_simplify

_ROW_OPS = ("softmax", "log_softmax")


def _folded(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (math.prod(shape[:-3]), *shape[-3:])


def _tt(graph: Graph, name: str) -> TensorType | None:
    t = graph.type_of(name)
    return t if isinstance(t, TensorType) else None


def _unfolded(graph: Graph, name: str, producer: dict[str, Node]) -> str | None:
    """``y`` when ``name`` is ``reshape(y)`` unfolding a 4-D ``y``'s first dim into two or more batch dims."""
    r = producer.get(name)
    if r is None or r.op != "reshape":
        return None
    y, out = _tt(graph, r.inputs[0]), _tt(graph, name)
    if y is None or out is None or y.rank != 4 or out.rank < 5 or _folded(out.shape) != y.shape:
        return None
    return r.inputs[0]


def _reaches_softmax(graph: Graph, name: str, users: dict[str, list[Node]]) -> bool:
    """``name`` flows into a softmax through single-reader elementwise ops (attention scores)."""
    for _ in range(8):
        us = users.get(name, [])
        if len(us) != 1 or name in graph.outputs:
            return False
        if us[0].op in _ROW_OPS:
            return True
        if not ops.is_elementwise(us[0].op):
            return False
        name = us[0].name
    return False


def _rewrite_once(graph: Graph) -> Graph | None:
    producer = graph.node_map()
    users = graph.users()
    for node in graph.nodes:
        out = node.type
        if not isinstance(out, TensorType) or out.rank < 5:
            continue
        lead = out.shape[:-3]
        if node.op == "matmul":
            a, b = _tt(graph, node.inputs[0]), _tt(graph, node.inputs[1])
            if a is None or b is None or a.rank != out.rank or b.rank != out.rank or a.shape[:-3] != lead or b.shape[:-3] != lead:
                continue
            p = _unfolded(graph, node.inputs[0], producer)
            if p is not None:  # probabilities times V
                return _fold(graph, node, {node.inputs[0]: p, node.inputs[1]: "fold"})
            if _reaches_softmax(graph, node.name, users):
                return _fold(graph, node, {node.inputs[0]: "fold", node.inputs[1]: "fold"})
            continue
        if node.op == "sdpa":
            qkv = [_tt(graph, i) for i in node.inputs]
            if len(node.inputs) == 3 and all(t is not None and t.rank == out.rank and t.shape[:-3] == lead for t in qkv):
                return _fold(graph, node, dict.fromkeys(node.inputs, "fold"))
            continue
        row = node.op in _ROW_OPS and node.attrs["dim"] % out.rank >= out.rank - 3
        if not (ops.is_elementwise(node.op) or row):
            continue
        main = [i for i in node.inputs if _unfolded(graph, i, producer) is not None]
        if not main:
            continue
        plan: dict[str, str | None] = {}
        for i in node.inputs:
            t = _tt(graph, i)
            if t is None:
                break
            y = _unfolded(graph, i, producer)
            if y is not None:
                plan[i] = y
            elif t.rank <= 3:
                plan[i] = None  # broadcasts over the last dims in either form
            elif t.rank == out.rank and t.shape[:-3] == lead:
                plan[i] = "fold"
            elif all(n == 1 for n in t.shape[:-3]):
                plan[i] = "strip"
            elif t.rank == out.rank and all(n in (1, m) for n, m in zip(t.shape[:-3], lead, strict=True)):
                plan[i] = "expand"  # a per-window mask broadcast over the batch: B copies, read by the kernel
            else:
                break
        else:
            return _fold(graph, node, plan)
    return None


def _fold(graph: Graph, node: Node, plan: dict[str, str | None]) -> Graph:
    """``node`` redone on 4-D operands, unfolded back under its name. ``plan``: input -> the 4-D value it unfolds,
    ``"fold"`` (reshape it), ``"strip"`` (drop its leading 1s), ``"expand"`` (to the batch dims, then fold) or None
    (as it is)."""
    producer, users = graph.node_map(), graph.users()
    b = GraphBuilder.from_graph(graph)
    for n in graph.nodes:
        if n.name != node.name:
            b.add_node(n)
            continue
        ins = []
        for i in n.inputs:
            how = plan.get(i)
            t = graph.type_of(i)
            assert isinstance(t, TensorType)
            scaled = _scaled(graph, i, producer, users) if how == "fold" else None
            if scaled is not None:  # q * c: folded under the scale, so the attention matcher still sees it on Q
                x, c = scaled
                ins.append(b.op(producer[i].op, [b.op("reshape", [x], {"shape": _folded(t.shape)}), c], dict(producer[i].attrs)))
            elif how == "fold":
                ins.append(b.op("reshape", [i], {"shape": _folded(t.shape)}))
            elif how == "expand":
                full = (*n.ttype.shape[:-3], *t.shape[-3:])
                ins.append(b.op("reshape", [b.op("expand", [i], {"shape": full})], {"shape": _folded(full)}))
            elif how == "strip":
                ins.append(b.op("reshape", [i], {"shape": t.shape[-3:]}))
            elif how is None:
                ins.append(i)
            else:
                ins.append(how)
        attrs = dict(n.attrs)
        if n.op in _ROW_OPS:
            attrs["dim"] = n.attrs["dim"] % n.ttype.rank - (n.ttype.rank - 4)
        inner = b.op(n.op, ins, attrs)
        b.op("reshape", [inner], {"shape": n.ttype.shape}, name=n.name)
    return dce(b.build(graph.outputs))


def _scaled(graph: Graph, name: str, producer: dict[str, Node], users: dict[str, list[Node]]) -> tuple[str, str] | None:
    """``(x, c)`` when ``name`` is ``x * c`` or ``x / c`` for a 0-d ``c``, read by one node."""
    m = producer.get(name)
    if m is None or m.op not in ("mul", "div") or len(users.get(name, [])) != 1 or name in graph.outputs:
        return None
    x, c = _tt(graph, m.inputs[0]), _tt(graph, m.inputs[1])
    if x is None or c is None or c.rank != 0 or x.shape != m.ttype.shape:
        return None
    return m.inputs[0], m.inputs[1]


def fold_batch_dims(graph: Graph, max_rewrites: int = 10_000) -> Graph:
    """Apply the rewrites until none applies, then cancel the reshape pairs they leave."""
    return rewrite_then_simplify(graph, _rewrite_once, max_rewrites)
