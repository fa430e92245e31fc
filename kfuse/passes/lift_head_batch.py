"""Lift attention written over a merged ``(B*H, S, D)`` batch back to ``(B, H, S, D)``.

Older Hugging Face attention (BLOOM, XGLM, the BART family) folds batch and heads into one dim and uses
3-D ``bmm``/``baddbmm``: ``reshape(q, (B*H, Sq, D)) @ reshape(k, (B*H, Sk, D))^T``, then a split to
``(B, H, Sq, Sk)`` for the mask, a merge back for the softmax or the second ``bmm``. ``fuse_attention``
matches the 4-D chain only, so these stayed three or four kernels a layer with the scores in memory.

Five rewrites, applied until none applies, each turning one 3-D op into a 4-D one (so it ends):

* ``matmul(merge(A), merge(B))`` -> ``merge(matmul(A, B))``, where ``merge(X)`` is a reshape of a 4-D ``X``
  that folds its first two dims;
* ``permute(merge(X), (0, 2, 1))`` -> ``merge(permute(X, (0, 1, 3, 2)))``: K^T, which the matmul then sees
  as a merge (DeBERTa also scales it before the ``bmm``);
* ``select(reshape(P, (T, B*H, S, D)), 0, i)`` -> ``merge(select(P, 0, i))``: Q, K and V unbound from one
  stacked merge (ViTDet, SAM), which makes each a merge the other rewrites see;
* ``permute(reshape(P [S, B, H*D], [S, B*H, D]), (1, 0, 2))`` -> ``merge(permute(reshape(P, [S, B, H, D]),
  (1, 2, 0, 3)))`` (and K^T, ``(1, 2, 0)``): ``F.multi_head_attention_forward``'s heads with separate projections
  (WavLM), the same view written as a merge;
* ``e(merge(X), others)`` -> ``merge(e(X, others'))`` for an elementwise op or a softmax over a dim past the
  first: ``others`` of rank 3 with ``B*H`` rows (another merge too) are split to ``(B, H, ...)``; an operand
  with one row, or of lower rank, broadcasts as it did.

Then ``algebraic_simplify`` cancels the split-of-merge pairs this leaves. The rewritten node keeps its name
(as a reshape of the new 4-D node), so the rest of the graph is unchanged.
"""

from __future__ import annotations

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce, rewrite_then_simplify

_ROW_OPS = ("softmax", "log_softmax")


def _merged_source(graph: Graph, name: str, producer: dict[str, Node]) -> str | None:
    """``X`` when ``name`` is ``reshape(X)`` folding the first two dims of a 4-D ``X``."""
    r = producer.get(name)
    if r is None or r.op != "reshape":
        return None
    x, out = graph.type_of(r.inputs[0]), graph.type_of(name)
    if not (isinstance(x, TensorType) and isinstance(out, TensorType) and x.rank == 4 and out.rank == 3):
        return None
    return r.inputs[0] if out.shape == (x.shape[0] * x.shape[1], *x.shape[2:]) else None


def _shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    t = graph.type_of(name)
    return t.shape if isinstance(t, TensorType) else None


def _rewrite_once(graph: Graph) -> Graph | None:
    producer = graph.node_map()
    for node in graph.nodes:
        if not isinstance(node.type, TensorType) or node.ttype.rank != 3:
            continue
        if node.op == "matmul":
            # K^T as permute(merge(K)) was lifted to merge(permute(K)) already: the permute comes first
            a = _merged_source(graph, node.inputs[0], producer)
            b = _merged_source(graph, node.inputs[1], producer)
            if a is None or b is None or graph.type_of(a).shape[:2] != graph.type_of(b).shape[:2]:
                continue
            return _lift(graph, node, {node.inputs[0]: (a, None), node.inputs[1]: (b, None)})
        if node.op == "select" and node.attrs["dim"] == 0:  # ViTDet / SAM: q, k, v = reshape(qkv, (3, B*H, S, D)).unbind(0)
            src = _merged_stack(graph, node.inputs[0], producer)
            if src is not None:
                return _select_then_merge(graph, node, src)
            continue
        if node.op == "permute" and tuple(node.attrs["dims"]) in _SEQ_FIRST_HEADS:
            split = _seq_first_split(graph, node, producer)
            if split is not None:
                return _as_merge(graph, node, *split)
        if node.op == "permute" and tuple(node.attrs["dims"]) == (0, 2, 1):  # K^T of a merge (DeBERTa scales it next)
            x = _merged_source(graph, node.inputs[0], producer)
            if x is not None:
                return _lift(graph, node, {node.inputs[0]: (x, (0, 1, 3, 2))})
            continue
        if ops.is_elementwise(node.op) or (node.op in _ROW_OPS and node.attrs["dim"] % 3 != 0):
            main = [i for i in node.inputs if _shape(graph, i) == node.ttype.shape and _merged_source(graph, i, producer)]
            if not main:  # another merged operand is split like any (B*H, ...) one, then simplifies away
                continue
            x = _merged_source(graph, main[0], producer)
            bh = node.ttype.shape[0]
            heads = graph.type_of(x).shape[:2]
            plan: dict[str, tuple[str, tuple[int, ...] | None] | None] = {main[0]: (x, None)}
            for i in node.inputs:
                t = graph.type_of(i)
                if i in plan or not isinstance(t, TensorType) or t.rank < 3 or t.shape[0] == 1:
                    continue
                if t.rank > 3 or t.shape[0] != bh:
                    break
                plan[i] = None  # split (B*H, ...) -> (B, H, ...)
            else:
                return _lift(graph, node, plan, heads)
    return None


# F.multi_head_attention_forward's heads: view(S, B*H, D).transpose(0, 1) -> [B*H, S, D], K^T -> [B*H, D, S]
_SEQ_FIRST_HEADS = {(1, 0, 2): (1, 2, 0, 3), (1, 2, 0): (1, 2, 3, 0)}


def _seq_first_split(graph: Graph, node: Node, producer: dict[str, Node]) -> tuple[str, tuple[int, int, int, int]] | None:
    """``(P, (S, B, H, D))`` when ``node`` is ``permute(reshape(P [S, B, H*D] -> [S, B*H, D]), dims)``."""
    r = producer.get(node.inputs[0])
    if r is None or r.op != "reshape":
        return None
    p = graph.type_of(r.inputs[0])
    if not isinstance(p, TensorType) or p.rank != 3 or r.ttype.rank != 3:
        return None
    s, b, e = p.shape
    s2, bh, d = r.ttype.shape
    if s2 != s or b < 1 or bh % b or d == 0 or (bh // b) * d != e:
        return None
    return r.inputs[0], (s, b, bh // b, d)


def _as_merge(graph: Graph, node: Node, src: str, sbhd: tuple[int, int, int, int]) -> Graph:
    """``node`` (a sequence-first head split, see ``_SEQ_FIRST_HEADS``) written as the merge of a 4-D view:
    ``reshape(permute(reshape(P, [S, B, H, D]), dims4), node's shape)``, the same values, which the rewrites lift."""
    b = GraphBuilder.from_graph(graph)
    for n in graph.nodes:
        if n.name != node.name:
            b.add_node(n)
            continue
        x4 = b.op("reshape", [src], {"shape": sbhd})
        y4 = b.op("permute", [x4], {"dims": _SEQ_FIRST_HEADS[tuple(n.attrs["dims"])]})
        b.op("reshape", [y4], {"shape": n.ttype.shape}, name=n.name)
    return dce(b.build(graph.outputs))


def _merged_stack(graph: Graph, name: str, producer: dict[str, Node]) -> str | None:
    """``P`` when ``name`` is ``reshape(P)`` folding dims 1 and 2 of a 5-D ``P`` ``(T, B, H, S, D)``."""
    r = producer.get(name)
    if r is None or r.op != "reshape":
        return None
    p, out = graph.type_of(r.inputs[0]), graph.type_of(name)
    if not (isinstance(p, TensorType) and isinstance(out, TensorType) and p.rank == 5 and out.rank == 4):
        return None
    return r.inputs[0] if out.shape == (p.shape[0], p.shape[1] * p.shape[2], *p.shape[3:]) else None


def _select_then_merge(graph: Graph, node: Node, stack: str) -> Graph:
    """``select(merge(P), 0, i)`` -> ``merge(select(P, 0, i))``: the (B, H, S, D) slice, then the fold."""
    b = GraphBuilder.from_graph(graph)
    for n in graph.nodes:
        if n.name != node.name:
            b.add_node(n)
            continue
        part = b.op("select", [stack], dict(n.attrs))
        b.op("reshape", [part], {"shape": node.ttype.shape}, name=node.name)
    return dce(b.build(graph.outputs))


def _lift(graph: Graph, node: Node, plan: dict, heads: tuple[int, ...] = ()) -> Graph:
    """``node`` redone on 4-D operands (``plan``: input -> (4-D source, permute or None), or None to split
    that input's first dim into ``heads``), then merged back under ``node``'s name."""
    b = GraphBuilder.from_graph(graph)
    for n in graph.nodes:
        if n.name != node.name:
            b.add_node(n)
            continue
        ins = []
        for i in n.inputs:
            how = plan[i] if i in plan else (i, None)
            if how is None:
                t = graph.type_of(i)
                ins.append(b.op("reshape", [i], {"shape": (*heads, *t.shape[1:])}))
                continue
            src, perm = how
            ins.append(b.op("permute", [src], {"dims": perm}) if perm else src)
        attrs = dict(n.attrs)
        if n.op in _ROW_OPS:
            attrs["dim"] = n.attrs["dim"] % 3 + 1
        lifted = ins[0] if n.op == "permute" else b.op(n.op, ins, attrs)  # a permute is lifted by its plan
        b.op("reshape", [lifted], {"shape": node.ttype.shape}, name=node.name)
    return dce(b.build(graph.outputs))


def lift_head_batch(graph: Graph, max_rewrites: int = 10_000) -> Graph:
    """Apply the rewrites until none applies, then cancel the reshape pairs they leave."""
    return rewrite_then_simplify(graph, _rewrite_once, max_rewrites)
