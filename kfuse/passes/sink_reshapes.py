"""Operator sinking: move reshapes that only regroup the leading dims out of GEMM chains.

Imported models often flatten tokens around a linear layer (GPT-2's Conv1D is
``view(-1, K) -> addmm -> view(B, S, N)``), which puts a reshape between the GEMM and the
elementwise ops that follow it (bias, GELU, residual add) and stops epilogue fusion. Two
rewrites, applied to a fixpoint:

* ``reshape(e(x, c...))`` -> ``e(reshape(x), c...)`` for an elementwise ``e`` whose only user is
  the reshape, when the reshape keeps the last dim and every other operand ``c`` broadcasts
  along the last dim only (a scalar or a bias vector);
* ``reshape(matmul(reshape(X), W))`` -> ``matmul(X, W)`` when ``W`` is 2-D and the outer reshape
  restores ``X``'s leading dims (the GEMM template folds leading dims into M itself), and
  ``reshape(matmul(X, W))`` -> ``matmul(reshape(X), W)`` otherwise (the reshape moves to the input).

A third rewrite moves the other way, in one case only: ``e(squeeze(conv2d(...)))`` -> ``squeeze(e(conv2d(...)))``
for a unary elementwise ``e`` after a conv1d imported as a conv2d over a trailing unit dim (the squeeze
changes the last dim, so the first rewrite never moves it back).

Otherwise reshapes only ever move towards the producers, so the fixpoint is reached.

The rewritten node keeps the reshape's name, so the rest of the graph is unchanged.
"""

from __future__ import annotations

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce


def _tt(graph_types: dict[str, object], name: str) -> TensorType | None:
    t = graph_types.get(name)
    return t if isinstance(t, TensorType) else None


def _last_dim_broadcast(t: TensorType, last: int) -> bool:
    """A scalar, or a tensor whose only non-1 dim is the last one (and equals ``last``)."""
    if t.rank == 0:
        return True
    return t.shape[-1] in (1, last) and all(s == 1 for s in t.shape[:-1])


def _rewrite_once(graph: Graph) -> Graph | None:
    types: dict[str, object] = {n: t for n, t in graph.inputs}
    types.update({n: TensorType.of(c) for n, c in graph.constants.items()})
    types.update({n.name: n.type for n in graph.nodes})
    users = graph.users()
    producer = graph.node_map()
    outputs = set(graph.outputs)
    for r in graph.nodes:
        if r.op != "reshape":
            continue
        src = producer.get(r.inputs[0])
        if src is None or len(users.get(src.name, [])) != 1 or src.name in outputs:
            continue
        out_t = r.ttype
        src_t = src.ttype if isinstance(src.type, TensorType) else None
        if src_t is None or src_t.shape[-1:] != out_t.shape[-1:] or out_t.rank == 0:
            continue
        if ops.is_elementwise(src.op):
            main = [i for i in src.inputs if (t := _tt(types, i)) is not None and t.shape == src_t.shape]
            if len(main) != 1:
                continue
            others = [i for i in src.inputs if i != main[0]]
            # an operand of higher rank than the reshape's output (e.g. a [1, 1, N] bias under a
            # 2-D reshape) would broadcast the dropped leading dims back in
            ok = [(t := _tt(types, i)) is not None and t.rank <= out_t.rank and _last_dim_broadcast(t, out_t.shape[-1]) for i in others]
            if not all(ok):
                continue
            new = _replace(graph, r, src, main[0])
            if new is not None:
                return new
            continue
        if src.op == "matmul":
            a, w = (producer.get(src.inputs[0]), _tt(types, src.inputs[1]))
            if w is None or w.rank != 2:
                continue
            if a is not None and a.op == "reshape":
                x_t = _tt(types, a.inputs[0])
                if x_t is not None and x_t.rank >= 2 and x_t.shape[:-1] == out_t.shape[:-1] and x_t.shape[-1] == w.shape[0]:
                    return _replace_matmul(graph, r, src, a.inputs[0])
            # (a reshape input that the output does not restore gets the reshape on top, which the simplify composes:
            # nn.MultiheadAttention's [S*B, E] heads merged back, then its [S, B, E] out-projection)
            # reshape(matmul(X, W)) -> matmul(reshape(X), W): the reshape moves to the GEMM's input,
            # so it never sits between the GEMM and its epilogue (reshapes only ever move upwards)
            return _replace_matmul(graph, r, src, src.inputs[0], tuple(out_t.shape[:-1]) + (w.shape[0],))
    for e in graph.nodes:
        r = producer.get(e.inputs[0]) if e.inputs else None
        if r is None or r.op != "reshape" or not ops.is_elementwise(e.op) or len(users.get(r.name, [])) != 1 or r.name in outputs:
            continue
        conv = producer.get(r.inputs[0])
        if conv is None or conv.op != "conv2d" or len(users.get(conv.name, [])) != 1 or conv.name in outputs:
            continue
        conv_t = conv.ttype
        squeezed = conv_t.shape[: r.ttype.rank] == r.ttype.shape and all(d == 1 for d in conv_t.shape[r.ttype.rank :])
        others = [_tt(types, i) for i in e.inputs[1:]]
        if squeezed and conv_t.shape[-1:] != r.ttype.shape[-1:] and all(t is not None and t.rank == 0 for t in others):
            return _sink_squeeze(graph, e, conv)
    return None


def _sink_squeeze(graph: Graph, e: Node, conv: Node) -> Graph:
    """``e(squeeze(conv), scalars)`` -> ``squeeze(e(conv, scalars))``: a conv1d runs as a conv2d over a trailing
    unit dim (Whisper's and wav2vec2's front ends), and the squeeze back stood between the conv and its GELU,
    stopping the epilogue fusion. The squeeze keeps ``e``'s name."""
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name == e.name:
            inner = b.op(e.op, [conv.name, *e.inputs[1:]], dict(e.attrs))
            b.add_node(Node(e.name, "reshape", (inner,), e.type, {"shape": tuple(e.ttype.shape)}))
            continue
        b.add_node(node)
    return dce(b.build(graph.outputs))


def _replace(graph: Graph, r: Node, e: Node, main: str) -> Graph | None:
    """reshape(e(main, others)) -> e(reshape(main), others), named like the old reshape; None when
    the moved node would not have the reshape's type."""
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name == e.name:
            moved = b.op("reshape", [main], {"shape": r.attrs["shape"]})
            new_inputs = tuple(moved if i == main else i for i in e.inputs)
            types = [b.type_of(i) for i in new_inputs]
            new_t = ops.infer_type(e.op, types, e.attrs)
            if not isinstance(new_t, TensorType) or (new_t.shape, new_t.dtype) != (r.ttype.shape, r.ttype.dtype):
                return None
            pending = Node(r.name, e.op, new_inputs, new_t, e.attrs)
            continue
        if node.name == r.name:
            b.add_node(pending)
            continue
        b.add_node(node)
    return dce(b.build(graph.outputs))


def _replace_matmul(graph: Graph, r: Node, mm: Node, x: str, reshape_to: tuple[int, ...] | None = None) -> Graph:
    """``r = reshape(matmul(..., W))`` becomes ``r = matmul(x, W)``, with ``x`` first reshaped to
    ``reshape_to`` when given."""
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name == mm.name:
            continue
        if node.name == r.name:
            a = b.op("reshape", [x], {"shape": reshape_to}) if reshape_to is not None else x
            b.op("matmul", [a, mm.inputs[1]], {}, name=r.name)
            continue
        b.add_node(node)
    return dce(b.build(graph.outputs))


def sink_reshapes(graph: Graph, max_rewrites: int = 10_000) -> Graph:
    """Apply the rewrites until none applies."""
    for _ in range(max_rewrites):
        new = _rewrite_once(graph)
        if new is None:
            return graph
        graph = new
    return graph
