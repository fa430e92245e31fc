"""Row-only data movement becomes one row gather, folded into the LayerNorm before it where there is one.

Swin's shifted-window attention reorders tokens twice a block: ``roll`` (imported as slices and a cat a
dim), then the window partition (``view``, ``permute``, ``contiguous``), and the reverse after the
output projection. Every step keeps the feature dim whole, so the chain only reorders *rows*; PyTorch
runs it as a copy a step (Swin-T B32 stage 1: five passes over 19 MB where one would do). This pass
finds each maximal chain of reshapes, permutes, slices, cats, selects and contiguous copies from one
value ``S`` to a value ``V``, runs it on ``arange(numel(S))`` to learn where every element of ``V``
comes from, and, when every row of ``V`` is one whole row of ``S``, writes ``V = gather_rows(S, index)``
with the index as a new constant (4 bytes a row). The result's rows may also be whole source rows laid side by
side (Swin's patch merging: four strided slices of ``(B, H, W, C)`` concatenated to ``(B, H/2, W/2, 4C)``):
the gather then picks ``4`` source rows an output row.

When ``S`` is a ``fused_norm`` read by the chain alone, the gather folds into it: the norm kernel
reads source row ``index[r]`` and writes row ``r`` (a row-wise op commutes with a row reordering), so
the partition costs nothing (Swin: the LayerNorm before every window attention). When the chain's one
reader is a norm with no addends, the gather folds into that norm the same way (Swin-V2, whose
LayerNorm follows the reverse partition).

Chains that are views in PyTorch (no element moves) are left alone where they cost nothing: read by
elementwise ops (whose kernels take any strides), or with rows one stride apart. A view whose rows are
not, read by a GEMM or a norm, was a copy inside that step; it becomes the gather.
"""

from __future__ import annotations

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce

MOVES = ("reshape", "permute", "slice", "cat", "select", "contiguous")
MIN_FEATURES = 8  # a gather of narrower rows reads its index as often as its data
MAX_ELEMENTS = 1 << 26  # the index is learned on an int32 arange of S (256 MB at this limit)


def _chain(end: Node, producer: dict[str, Node], users: dict[str, list[Node]], outputs: set[str]) -> list[Node]:
    """The data-movement nodes ``end`` is computed by whose values nothing outside the chain reads."""
    region: dict[str, Node] = {end.name: end}
    stack = list(end.inputs)
    while stack:
        v = stack.pop()
        n = producer.get(v)
        if n is None or n.name in region or n.op not in MOVES or v in outputs:
            continue
        region[n.name] = n
        stack.extend(n.inputs)
    changed = True
    while changed:  # drop nodes read from outside (they stay sources); their producers may follow
        changed = False
        for name in list(region):
            if name != end.name and any(u.name not in region for u in users.get(name, [])):
                del region[name]
                changed = True
        reachable = {end.name}
        stack = [end]
        while stack:
            for i in stack.pop().inputs:
                if i in region and i not in reachable:
                    reachable.add(i)
                    stack.append(region[i])
        if len(reachable) != len(region):
            region = {k: v for k, v in region.items() if k in reachable}
            changed = True
    return list(region.values())


def _row_index(graph: Graph, nodes: list[Node], source: str, rows_read: bool) -> torch.Tensor | None:
    """Source row of each row of the chain's result, or None if it is not a row reordering or costs nothing
    (``rows_read``: a reader needs the result as a matrix of rows, as a GEMM or a norm does)."""
    st = graph.type_of(source)
    end = nodes[-1]
    if not isinstance(st, TensorType) or st.rank < 1 or st.layout != "contiguous" or st.numel > MAX_ELEMENTS:
        return None
    n = st.shape[-1]
    if n < MIN_FEATURES or end.ttype.rank < 1 or end.ttype.shape[-1] % n or end.ttype.numel == 0:
        return None
    src = torch.arange(st.numel, dtype=torch.int32).reshape(st.shape)
    env = {source: src}
    for node in nodes:
        env[node.name] = ops.run_reference(node.op, [env[i] for i in node.inputs], node.attrs)
    y = env[end.name]
    if y.untyped_storage().data_ptr() == src.untyped_storage().data_ptr() and (not rows_read or _rows_view(y, n)):
        return None  # a view its readers take as it is: nothing moves
    y = y.reshape(-1, n)
    first = y[:, 0]
    if bool((first % n != 0).any()) or not torch.equal(y, first[:, None] + torch.arange(n, dtype=torch.int32)):
        return None
    return (first // n).contiguous()


def _reads_rows(graph: Graph, user: Node, value: str) -> bool:
    """``user`` reads ``value`` as a ``[rows, features]`` matrix: a norm's input, or a GEMM's A against
    2-D weights (a batched GEMM keeps its batch strides; attention reads any strides)."""
    if not user.inputs or user.inputs[0] != value:
        return False
    if user.op in ("fused_norm", "layer_norm", "rms_norm"):
        return True
    if user.op in ("matmul", "gemm_epilogue") and len(user.inputs) > 1:
        b = graph.type_of(user.inputs[1])
        return isinstance(b, TensorType) and b.rank == 2
    return False


def _reading_norm(us: list[Node], value: str, outputs: set[str]) -> Node | None:
    """The one reader of ``value`` when it is a norm with no addends that reads it as its input."""
    if len(us) != 1 or value in outputs:
        return None
    n = us[0]
    ok = n.op == "fused_norm" and n.inputs[0] == value and n.attrs["n_add"] == 0 and not n.attrs.get("row_index")
    return n if ok else None


def _rows_view(y: torch.Tensor, n: int) -> bool:
    try:
        y.view(-1, n)
    except RuntimeError:
        return False
    return True


def _foldable_norm(graph: Graph, source: str, chain: set[str], producer: dict[str, Node], users: dict[str, list[Node]]) -> Node | None:
    n = producer.get(source)
    if n is None or n.op != "fused_norm" or n.attrs.get("row_index") or source in graph.outputs:
        return None
    return n if all(u.name in chain for u in users.get(source, [])) else None


def gather_rows(graph: Graph) -> Graph:
    """Replace every row-reordering chain of data movement with ``gather_rows`` (module docstring)."""
    producer = graph.node_map()
    users = graph.users()
    outputs = set(graph.outputs)
    done: set[str] = set()
    rewrites: dict[str, tuple[str, torch.Tensor, Node | None, tuple[str, ...]]] = {}
    readers: dict[str, tuple[str, torch.Tensor, Node]] = {}
    for end in reversed(graph.nodes):
        if end.op not in MOVES or end.name in done or not isinstance(end.type, TensorType):
            continue
        us = users.get(end.name, [])
        if not (end.name in outputs or len(us) != 1 or us[0].op not in MOVES):
            continue  # not a chain's end: its single reader moves data too
        chain = _chain(end, producer, users, outputs)
        names = {n.name for n in chain}
        sources = {i for n in chain for i in n.inputs if i not in names}
        if len(sources) != 1:
            continue
        (source,) = sources
        ordered = [n for n in graph.nodes if n.name in names]
        # a GEMM or norm reshapes a view whose rows are not one stride apart into a copy (the generated
        # elementwise kernels read any strides)
        rows_read = any(_reads_rows(graph, u, end.name) for u in us)
        index = _row_index(graph, ordered, source, rows_read)
        if index is None:
            continue
        done |= names
        moved = tuple(dict.fromkeys(n.op for n in ordered))
        # a norm over the gathered rows commutes with the gather only when they are the source's rows
        whole = end.ttype.shape[-1] == graph.type_of(source).shape[-1]  # type: ignore[union-attr]
        reader = _reading_norm(us, end.name, outputs) if whole else None
        before = _foldable_norm(graph, source, names, producer, users)
        if reader is not None and before is None:
            readers[reader.name] = (source, index, reader)
        else:
            rewrites[end.name] = (source, index, before, moved)
    if not rewrites and not readers:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in readers:  # norm(gather(x)) = gather(norm(x)) for a norm with no addends
            source, index, norm = readers[node.name]
            idx = b.add_constant(index, name=b.fresh(f"{node.name}_rows"))
            attrs = {**norm.attrs, "row_index": True, "fused_ops": ("gather_rows", *norm.attrs.get("fused_ops", ()))}
            b.add_node(Node(node.name, "fused_norm", (source, *norm.inputs[1:], idx), node.type, attrs))
            continue
        if node.name not in rewrites:
            b.add_node(node)
            continue
        source, index, norm, moved = rewrites[node.name]
        idx = b.add_constant(index, name=b.fresh(f"{node.name}_rows"))
        if norm is not None:
            attrs = {
                **norm.attrs,
                "row_index": True,
                "out_type": node.ttype,
                "fused_ops": (*norm.attrs.get("fused_ops", ()), "gather_rows"),
            }
            b.add_node(Node(node.name, "fused_norm", (*norm.inputs, idx), node.type, attrs))
        else:
            b.add_node(Node(node.name, "gather_rows", (source, idx), node.type, {"shape": node.ttype.shape, "fused_ops": moved}))
    return dce(b.build(graph.outputs))
