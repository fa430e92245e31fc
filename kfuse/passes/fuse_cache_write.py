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
"""

from __future__ import annotations

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
    return substitute(graph, new)
