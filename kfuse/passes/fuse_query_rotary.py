"""A decode step's query rotary embedding, applied by the attention kernel as it reads the query.

After ``fuse_cache_write`` a decode layer still launches the rotary kernel for its query alone: a few KB
(``[B, H, 1, D]``) and a launch, every layer, every token. The split-KV decode kernel
(``kfuse.kernels.decode_attention``) reads each query row once per program, so it rotates it there, with the
same arithmetic as the rotary kernel (fp32, rounded to the query's dtype).

Matched: a ``fused_attention`` node in ``bhsd`` layout that the decode kernel takes (``_decode_shaped``), whose
query is a ``rotary`` node read by nothing else, in the query's dtype. The node gets the rotary node's input as
its query, ``cos`` and ``sin`` as its last two inputs, and ``q_rotary`` (the pairing and rotated width). The
lowering still measures its candidates: the dense kernel and PyTorch's SDPA run the rotary kernel first.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.passes.simplify import substitute
from kfuse.runtime.transformer_ops import _decode_shaped


def fuse_query_rotary(graph: Graph) -> Graph:
    """Fold each matched query rotary into its attention node (see the module doc)."""
    nodes, users = graph.node_map(), graph.users()
    new: dict[str, Node] = {}
    for node in graph.nodes:
        a = node.attrs
        if node.op != "fused_attention" or a.get("q_rotary") or a["layout"] != "bhsd" or not _decode_shaped(node, graph, a):
            continue
        rot = nodes.get(node.inputs[0])
        if rot is None or rot.op != "rotary" or rot.name in graph.outputs or len(users.get(rot.name, [])) != 1:
            continue
        x_t, out_t = graph.type_of(rot.inputs[0]), rot.type
        if not isinstance(x_t, TensorType) or not isinstance(out_t, TensorType) or x_t.dtype != out_t.dtype or x_t.rank != 4:
            continue
        q_rotary = {"rotary_dims": rot.attrs.get("rotary_dims"), "interleaved": bool(rot.attrs.get("interleaved"))}
        fused = (*rot.attrs.get("fused_ops", ("rotary",)), *a.get("fused_ops", ("sdpa",)))
        attrs = {**a, "q_rotary": q_rotary, "fused_ops": fused}
        new[node.name] = Node(node.name, node.op, (rot.inputs[0], *node.inputs[1:], rot.inputs[1], rot.inputs[2]), node.type, attrs)
    return substitute(graph, new)
