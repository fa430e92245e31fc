"""Move a permute of the leading dims above the GEMM rows it reorders, into the copy that made the GEMM's input.

``nn.MultiheadAttention`` with ``batch_first=True`` computes in ``[S, B, E]`` and transposes back at the end:

    o = reshape(permute(attention, (2, 0, 1, 3)), [S, B, E])     # a copy: the heads merged, rows in (s, b) order
    y = permute(matmul(o, W) + bias, (1, 0, 2))                  # [B, S, E], read by the residual add

The output projection and its bias act on each row alone, so reordering rows after them is reordering them
before: ``permute(e(matmul(A, W), c), p) = e(matmul(permute(A, p), W), c)`` for a permute ``p`` that keeps the
last dim, an elementwise ``e`` whose other operands broadcast along the last dim only, and a 2-D ``W``. Moved up,
the permute joins the view chain that made ``A``, and ``compose_views``' algebra writes the two as one chain:
here ``reshape(permute(attention, (0, 2, 1, 3)), [B, S, E])``, the form ``fuse_attention`` writes from the kernel
(``out_layout="bshd"``). The GEMM's rows are then in the residual's order and its epilogue takes the add.

``sink_row_permutes`` is the mirror on the input side: a transpose before the GEMM moves below it and its row ops
when every view chain reading the result then composes into a copy-free view (``nn.MultiheadAttention``'s
in-projection then runs on batch-first rows, and Q, K and V are head views of ``[B, S, 3E]``).

The hoist applies only where ``A``'s chain already copies and the joined chain copies no more, so the permute costs
nothing where it lands (a permute of a plain value would only move a copy from the output to the input), and only
where the permuted rows go (through views) into an elementwise op: a LayerNorm reading them folds the reorder into
its row loads already (Swin-V2's post-norm), and the hoist would add a gather kernel there.
"""

from __future__ import annotations

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.compose_views import VIEW_OPS, Layout, NotAView, canonical_steps, copies, emit_steps, view_chain, with_shapes
from kfuse.passes.simplify import dce


def _row_broadcast(t: TensorType, rank: int) -> bool:
    """A scalar or a vector over the last dim: the same for every row, whatever their order."""
    return t.rank <= rank and all(n == 1 for n in t.shape[:-1])


def _row_permute(p: Node) -> tuple[int, ...] | None:
    """The dims of ``p`` when it reorders rows only: a permute of rank 3 or more that keeps the last dim in place."""
    if p.op != "permute" or not isinstance(p.type, TensorType) or p.ttype.rank < 3:
        return None
    dims = tuple(p.attrs["dims"])
    return dims if dims[-1] == len(dims) - 1 and dims != tuple(range(len(dims))) else None


def _row_gemm(n: Node, rank: int, graph: Graph) -> bool:
    """A matmul by a 2-D weight: each output row depends on its own input row alone."""
    if n.op != "matmul" or not isinstance(n.type, TensorType) or n.ttype.rank != rank:
        return False
    w = graph.type_of(n.inputs[1])
    return isinstance(w, TensorType) and w.rank == 2


def _row_op(e: Node, main: str, graph: Graph) -> bool:
    """An elementwise op on ``main`` (read once, same shape) whose other operands are the same for every row."""
    t = graph.type_of(main)
    if not ops.is_elementwise(e.op) or not isinstance(e.type, TensorType) or not isinstance(t, TensorType):
        return False
    if e.ttype.shape != t.shape or e.inputs.count(main) != 1:
        return False
    rest = [graph.type_of(i) for i in e.inputs if i != main]
    return all(isinstance(r, TensorType) and _row_broadcast(r, e.ttype.rank) for r in rest)


def _row_chain(
    p: Node, producer: dict[str, Node], users: dict[str, list[Node]], graph: Graph
) -> tuple[Node, list[tuple[Node, str]]] | None:
    """The GEMM and the row-wise elementwise ops between it and the permute ``p`` (each with its full-size
    operand, the GEMM's first), or None."""
    shape = p.ttype.shape
    cur, chain = p.inputs[0], []
    while True:
        n = producer.get(cur)
        if n is None or cur in graph.outputs or len(users.get(cur, [])) != 1 or not isinstance(n.type, TensorType):
            return None
        if n.op == "matmul":
            return (n, chain[::-1]) if _row_gemm(n, len(shape), graph) else None
        full = [i for i in n.inputs if isinstance(t := graph.type_of(i), TensorType) and t.shape == n.ttype.shape]
        if len(full) != 1 or not _row_op(n, full[0], graph):
            return None
        chain.append((n, full[0]))
        cur = full[0]


def _read_by_elementwise(p: Node, users: dict[str, list[Node]], graph: Graph) -> bool:
    """Through views, the permute's value reaches an elementwise op (the residual add the GEMM's epilogue can then
    take). A LayerNorm reading it takes the reorder as a row gather for free (Swin-V2's post-norm), so there the
    permute stays."""
    name = p.name
    for _ in range(8):
        us = users.get(name, [])
        if len(us) != 1 or name in graph.outputs:
            return False
        if ops.is_elementwise(us[0].op):
            return True
        if us[0].op not in VIEW_OPS:
            return False
        name = us[0].name
    return False


def _view_ends(name: str, users: dict[str, list[Node]], graph: Graph, path: list[Node]) -> list[list[Node]] | None:
    """Every chain of view ops from ``name`` to a value something else reads (or None where a non-view op reads
    ``name`` itself)."""
    out: list[list[Node]] = []
    for u in users.get(name, []):
        if u.op not in VIEW_OPS:
            if not path:
                return None
            out.append(path)
            continue
        more = _view_ends(u.name, users, graph, [*path, u])
        if more is None:
            return None
        out += more
    if path and name in graph.outputs:
        out.append(path)
    return out


def _sinkable(p: Node, producer: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> tuple[Node, list[Node]] | None:
    """The GEMM reading the permute ``p`` and the row-wise ops after it, when the rows can be reordered after them
    instead: every view chain reading the last of them is then one view of the unpermuted result."""
    us = users.get(p.name, [])
    if len(us) != 1 or p.name in graph.outputs or us[0].inputs[0] != p.name or not _row_gemm(us[0], p.ttype.rank, graph):
        return None
    mm = us[0]
    rows: list[Node] = []
    end = mm
    while end.name not in graph.outputs and len(users.get(end.name, [])) == 1 and _row_op(users[end.name][0], end.name, graph):
        end = users[end.name][0]
        rows.append(end)
    chains = _view_ends(end.name, users, graph, [])
    if not chains or end.name in graph.outputs:
        return None
    dims = tuple(p.attrs["dims"])
    x = graph.type_of(p.inputs[0])
    assert isinstance(x, TensorType)
    base = (*x.shape[:-1], end.ttype.shape[-1])
    gained = False
    for chain in chains:
        old = [(n.op, dict(n.attrs), n.ttype.shape) for n in chain]
        try:
            steps = canonical_steps(base, Layout.of(base, [("permute", {"dims": dims}, end.ttype.shape), *old]))
        except NotAView:
            return None
        if copies(base, with_shapes(base, steps)):
            return None
        gained |= copies(end.ttype.shape, old) > 0
    return (mm, rows) if gained else None


def sink_row_permutes(graph: Graph) -> Graph:
    """The mirror of the hoist, on the GEMM's input side: ``e(matmul(permute(x, p), W), c)`` read only by view chains
    -> ``permute(e(matmul(x, W), c), p)``, where the chains then compose into copy-free views of the GEMM's output
    (``nn.MultiheadAttention`` transposes ``[B, S, E]`` to ``[S, B, E]`` before its in-projection: moved after it,
    Q, K and V are head views of a batch-first ``[B, S, 3E]``, the layout the TMA attention kernel reads)."""
    producer, users = graph.node_map(), graph.users()
    plans: dict[str, tuple[Node, Node, list[Node]]] = {}  # the last row op (or GEMM) -> (permute, GEMM, row ops)
    for p in graph.nodes:
        if _row_permute(p) is None:
            continue
        found = _sinkable(p, producer, users, graph)
        if found is not None:
            mm, rows = found
            plans[(rows[-1] if rows else mm).name] = (p, mm, rows)
    if not plans:
        return graph
    drop = {n.name for _, mm, rows in plans.values() for n in (mm, *rows)}
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in plans:
            p, mm, rows = plans[node.name]
            cur = b.op("matmul", [p.inputs[0], mm.inputs[1]], dict(mm.attrs))
            prev = mm.name
            for r in rows:
                cur, prev = b.op(r.op, [cur if i == prev else i for i in r.inputs], dict(r.attrs)), r.name
            b.op("permute", [cur], {"dims": tuple(p.attrs["dims"])}, name=node.name)
        elif node.name not in drop:
            b.add_node(node)
    return dce(b.build(graph.outputs))


def hoist_row_views(graph: Graph) -> Graph:
    """Apply the rewrite to every permute it fits (one sweep; each permute moves at most once), after
    ``sink_row_permutes`` on the input side."""
    graph = sink_row_permutes(graph)
    producer = graph.node_map()
    users = graph.users()
    plans: dict[str, tuple[Node, list[tuple[Node, str]], str, list]] = {}  # permute -> (GEMM, row ops, base, steps)
    for p in graph.nodes:
        dims = _row_permute(p)
        if dims is None or not _read_by_elementwise(p, users, graph):
            continue
        found = _row_chain(p, producer, users, graph)
        if found is None:
            continue
        mm, row_ops = found
        a = producer.get(mm.inputs[0])
        if a is None or a.op not in VIEW_OPS:
            continue
        base, chain = view_chain(a, producer)
        base_t = graph.type_of(base)
        if not isinstance(base_t, TensorType):
            continue
        old = [(n.op, dict(n.attrs), n.ttype.shape) for n in chain]
        a_shape = a.ttype.shape
        moved = tuple(a_shape[d] for d in dims[:-1]) + (a_shape[-1],)
        try:
            steps = canonical_steps(base_t.shape, Layout.of(base_t.shape, [*old, ("permute", {"dims": dims}, moved)]))
        except NotAView:
            continue
        before = copies(base_t.shape, old)
        if before == 0 or copies(base_t.shape, with_shapes(base_t.shape, steps)) > before:
            continue
        plans[p.name] = (mm, row_ops, base, steps)
    if not plans:
        return graph
    drop = {n.name for mm, row_ops, _, _ in plans.values() for n in (mm, *(r for r, _ in row_ops))}
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in drop:
            continue
        if node.name not in plans:
            b.add_node(node)
            continue
        mm, row_ops, base, steps = plans[node.name]
        a = graph.type_of(mm.inputs[0])
        assert isinstance(a, TensorType)
        dims = tuple(node.attrs["dims"])
        a_moved = tuple(a.shape[d] for d in dims[:-1]) + (a.shape[-1],)
        cur = emit_steps(b, base, steps, a_moved, None)
        cur = b.op("matmul", [cur, mm.inputs[1]], dict(mm.attrs), name=None if row_ops else node.name)
        for i, (r, full) in enumerate(row_ops):
            ins = [cur if x == full else x for x in r.inputs]
            cur = b.op(r.op, ins, dict(r.attrs), name=node.name if i == len(row_ops) - 1 else None)
    return dce(b.build(graph.outputs))
