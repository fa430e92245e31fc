"""A KV cache's update as one ``cache_write`` node: ``cache.index_copy(2, pos, rotary(k))`` and
``cache.index_copy(2, pos, v)``, as Hugging Face's ``StaticCache`` writes a decode step's keys and values.

Imported, each update is a PyTorch ``index_copy`` (a fallback), and the key's rotary embedding is a kernel
of its own before it: per layer and token three launches (rotary, two copies) that move a few KB. The
``cache_write`` node writes the rows at the index itself, and for the key it applies the rotary
embedding on the way (``kfuse.kernels.rotary.write_rows``): two launches, both kfuse kernels, so they
take part in programmatic dependent launch. Its value is the new cache; where the cache is an input the
forward writes, ``kfuse.runtime.state_writes`` runs it in place, so nothing but the new rows moves.

Matched: a ``fallback`` of ``aten.index_copy`` along dim 2 of a 4-D cache that is a graph input, with a
1-D integer index and a source of the cache's batch, heads, head dim and dtype. The rotary node is folded
in when the update is its only reader.

The positions themselves: transformers' static cache computes them per layer as ``arange(T) + length`` (an
int64 add, a PyTorch launch of its own a layer). Where the index is such an ``add`` of a ``[T]`` integer
tensor and a one-element integer one, and cache writes are its only readers, the writes take both operands and
add them as they read the index (``index_offset``): the add is gone.
"""

from __future__ import annotations

import torch

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.passes.simplify import substitute
from kfuse.runtime import transformer_ops  # noqa: F401 - registers the cache_write op and its lowering


def _index_copy_dim2(node: Node, graph: Graph) -> tuple[str, str, str] | None:
    """(cache, index, source) of ``index_copy(cache, 2, index, source)`` on a 4-D cache input, else None."""
    if node.op != "fallback" or node.attrs.get("target") != "aten.index_copy.default":
        return None
    call = node.attrs.get("fn")
    args = getattr(call, "args", None)
    if not args or len(args) != 4 or getattr(call, "kwargs", None) or call.first_operand() != 0 or len(node.inputs) != 3:
        return None
    cache, index, src = node.inputs
    ct, it, st = (graph.type_of(n) for n in (cache, index, src))
    if not all(isinstance(t, TensorType) for t in (ct, it, st)) or cache not in graph.input_names:
        return None
    assert isinstance(ct, TensorType) and isinstance(it, TensorType) and isinstance(st, TensorType)
    if ct.rank != 4 or args[1] not in (2, -2) or it.rank != 1 or it.dtype.is_floating_point or it.dtype.is_complex:
        return None
    if st.rank != 4 or st.shape[:2] != ct.shape[:2] or st.shape[3] != ct.shape[3] or st.shape[2] != it.shape[0]:
        return None
    if st.dtype != ct.dtype or ct.shape[3] % 2:  # index_copy takes one dtype; the kernel copies column pairs
        return None
    return cache, index, src


def fuse_cache_write(graph: Graph) -> Graph:
    """Replace each matched cache update with a ``cache_write`` node (see the module doc)."""
    nodes = graph.node_map()
    users = graph.users()
    new: dict[str, Node] = {}
    for node in graph.nodes:
        m = _index_copy_dim2(node, graph)
        if m is None:
            continue
        cache, index, src = m
        producer = nodes.get(src)
        rot = producer is not None and producer.op == "rotary" and len(users.get(src, [])) == 1 and src not in graph.outputs
        if rot:
            assert producer is not None
            attrs = {k: producer.attrs[k] for k in ("rotary_dims", "interleaved") if k in producer.attrs}
            attrs["fused_ops"] = (*producer.attrs.get("fused_ops", ("rotary",)), "index_copy")
            new[node.name] = Node(node.name, "cache_write", (cache, index, *producer.inputs), node.type, attrs)
        else:
            new[node.name] = Node(node.name, "cache_write", (cache, index, src), node.type, {"fused_ops": ("index_copy",)})
    return substitute(graph, _fold_index_offsets(graph, new))


def _base_plus_offset(graph: Graph, node: Node | None) -> tuple[str, str] | None:
    """(base, offset) of an integer ``add(base, offset)`` whose base has the result's ``[T]`` shape and whose offset
    is one element, else None."""
    if node is None or node.op != "add" or len(node.inputs) != 2 or node.attrs.get("alpha", 1) != 1:
        return None
    out = node.type
    types = [graph.type_of(i) for i in node.inputs]
    if not isinstance(out, TensorType) or out.rank != 1 or out.dtype not in (torch.int32, torch.int64):
        return None
    for base, off, bt, ot in ((*node.inputs, *types), (node.inputs[1], node.inputs[0], types[1], types[0])):
        if isinstance(bt, TensorType) and isinstance(ot, TensorType) and bt.shape == out.shape and bt.dtype == out.dtype:
            if ot.numel == 1 and ot.dtype in (torch.int32, torch.int64):
                return base, off
    return None


def _fold_index_offsets(graph: Graph, new: dict[str, Node]) -> dict[str, Node]:
    """The cache writes in ``new`` with their index's ``base + offset`` read in the kernel (see the module doc),
    where the writes are the add's only readers and it is no output."""
    nodes, users = graph.node_map(), graph.users()
    readers: dict[str, list[str]] = {}
    for w in new.values():
        readers.setdefault(w.inputs[1], []).append(w.name)
    out = dict(new)
    for index, writes in readers.items():
        m = _base_plus_offset(graph, nodes.get(index))
        if m is None or index in graph.outputs or {u.name for u in users.get(index, [])} != set(writes):
            continue
        base, off = m
        for name in writes:
            w = new[name]
            ins = (w.inputs[0], base, *w.inputs[2:], off)
            attrs = {**w.attrs, "index_offset": True, "fused_ops": ("add", *w.attrs["fused_ops"])}
            out[name] = Node(name, "cache_write", ins, w.type, attrs)
    return out
