"""Operator sinking: move a permute that every full-size operand of an elementwise op shares below it.

Models written for NCHW that run their channel MLPs in NHWC (ConvNeXt:
``x.permute(0, 2, 3, 1) -> LayerNorm -> Linear -> GELU -> Linear -> * gamma -> .permute(0, 3, 1, 2)``, then
``input + x``) put a permute between the last GEMM and the residual add. The add then runs as its own
kernel and writes a new NCHW-contiguous tensor, which the next block reads through a permute again (the
depthwise conv with a channel stride of H*W, the LayerNorm after a copy). The rewrite

    e(permute(a, p), permute(b, p), c...)  ->  permute(e(a, b, c'...), p)

keeps the values in the layout their producers wrote, lets the epilogue of ``a``'s GEMM take the add,
and cancels against the next block's ``permute(., p^-1)`` (``algebraic_simplify`` composes permutes).
``c`` is a broadcast operand (a scalar, or a tensor with size-1 dims wherever the output is larger), given
to ``e`` as ``permute(c, p^-1)`` (after a reshape to the output's rank when it has fewer dims).

It applies only where every operand of the output's full size is a permute by the same ``p``, or, for
``p = (0, 3, 1, 2)``, a channels-last value (a conv's output), whose ``permute(., (0, 2, 3, 1))`` is its
memory as it is: no full-size tensor is read through a permute it did not have; at least one operand must be a
real permute (a channels-last value alone is left as it is), and one permute moved must be read by the
elementwise op alone (when all stay for other readers, the move would only part the op from them). The new permute
keeps the elementwise node's name, so the rest of the graph is unchanged. One sweep in graph order; no node is rewritten twice.
"""

from __future__ import annotations

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce

_TO_NCHW = (0, 3, 1, 2)


def _inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(p)
    for i, d in enumerate(p):
        inv[d] = i
    return tuple(inv)


def _sinkable(e: Node, b: GraphBuilder, producer: dict[str, Node], readers: dict[str, set[str]]) -> tuple[int, ...] | None:
    """The permute ``p`` shared by every full-size operand of ``e``, or None when the rewrite does not apply."""
    if not ops.is_elementwise(e.op) or not isinstance(e.type, TensorType) or e.ttype.rank < 2:
        return None
    shape = e.ttype.shape
    perm: tuple[int, ...] | None = None
    moved = False  # at least one real permute moves; a channels-last operand alone is left as it is
    # and one of them is read by ``e`` alone: when every one stays for other readers (an elementwise kernel
    # reads a permute through strides for free), moving ``e`` out of their frame only parts it from them
    # (Swin-V2's q * q, its sum over the head dim and q / norm: one row kernel in the permuted frame)
    private = False
    for i in e.inputs:
        t = b.type_of(i)
        if not isinstance(t, TensorType):
            return None
        if t.shape != shape:
            if t.rank > len(shape):
                return None
            continue  # a broadcast operand: permuted along with the output
        p = producer.get(i)
        if p is not None and p.op == "permute":
            dims, moved = tuple(p.attrs["dims"]), True
            private = private or not (readers.get(i, set()) - {e.name})
        elif t.layout == "channels_last" and t.rank == 4:
            dims = _TO_NCHW  # NHWC in memory: viewed through permute(., (0, 2, 3, 1)) it is contiguous
        else:
            return None
        if perm is not None and dims != perm:
            return None
        perm = dims
    return perm if moved and private else None


def _permuted(b: GraphBuilder, i: str, dims: tuple[int, ...], producer: dict[str, Node]) -> str:
    """``permute(i, dims)``, composed with ``i``'s own permute (the source itself when they cancel)."""
    p = producer.get(i)
    if p is not None and p.op == "permute":
        dims, i = tuple(p.attrs["dims"][d] for d in dims), p.inputs[0]
    if dims == tuple(range(len(dims))):
        return i
    return b.op("permute", [i], {"dims": dims})


def _sink(b: GraphBuilder, e: Node, perm: tuple[int, ...], graph: Graph, producer: dict[str, Node]) -> None:
    """Append ``permute(e'(...), perm)`` under ``e``'s name."""
    inv = _inverse(perm)
    rank = len(perm)
    inputs = []
    for i in e.inputs:
        t = b.type_of(i)
        assert isinstance(t, TensorType)
        if t.shape == e.ttype.shape:
            inputs.append(_permuted(b, i, inv, producer))
        elif t.numel == 1:  # broadcasts the same way whatever the layout
            inputs.append(i)
        elif i in graph.constants:  # a weight (layer scale, bias): permuted once, here
            c = b.constants[i].reshape((1,) * (rank - t.rank) + tuple(t.shape))
            inputs.append(b.add_constant(c.permute(inv).contiguous()))
        else:
            full = i if t.rank == rank else b.op("reshape", [i], {"shape": (1,) * (rank - t.rank) + tuple(t.shape)})
            inputs.append(_permuted(b, full, inv, producer))
    inner = b.op(e.op, inputs, e.attrs, name=b.fresh(e.op))
    b.op("permute", [inner], {"dims": perm}, name=e.name)


def sink_permutes(graph: Graph) -> Graph:
    """One sweep in graph order: a rewritten node's permute is seen by the elementwise ops after it, so a
    chain of them is handled in the same sweep, and no node is rewritten twice."""
    b = GraphBuilder.from_graph(graph)
    producer: dict[str, Node] = {}
    readers = {v: {n.name for n in ns} for v, ns in graph.users().items()}
    for o in graph.outputs:  # a graph output is read from outside
        readers.setdefault(o, set()).add("<output>")
    changed, seen = False, 0
    for node in graph.nodes:
        perm = _sinkable(node, b, producer, readers)
        if perm is None:
            b.add_node(node)
        else:
            _sink(b, node, perm, graph, producer)
            changed = True
        producer.update((n.name, n) for n in b.nodes[seen:])
        seen = len(b.nodes)
    return dce(b.build(graph.outputs)) if changed else graph
