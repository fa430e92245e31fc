"""Rotary position embedding recognition: ``x * cos + rotate_half(x) * sin`` becomes one
``rotary`` node (the ``kfuse.kernels.rotary`` kernel).

``rotate_half(x)`` is ``cat([neg(slice(x, D/2:D)), slice(x, 0:D/2)], dim=-1)``, as Hugging Face
writes it for Llama, Mistral, Qwen and GPT-NeoX. Left to the pointwise pass, the negation, the
concatenation (a copy) and the multiply-add are three launches per Q and per K in every layer.
The two products may come in either order and with their operands either way round; the slices,
negation, concatenation and products must have no other users (``x`` itself may).

The interleaved form (GPT-J, CodeGen, Cohere, Helium, RoFormer) rotates pairs of neighbouring columns:
``rotate_every_two(x) = stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)``, imported as two step-2 slices,
the negation, two unsqueezing reshapes, a cat on the new last dim and the flattening reshape. It becomes a
``rotary`` node with ``interleaved=True``: five copies of Q and K a layer before, one kernel after.

Partial rotary (GPT-NeoX, Phi, GPT-J): ``cat([rotary(t[..., :r]), t[..., r:]], -1)`` becomes one ``rotary`` node on
``t`` with ``rotary_dims=r``, which copies the last ``D - r`` columns as it writes: the concatenation was a
second launch reading and writing the whole of Q and K again.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.passes.simplify import substitute
from kfuse.runtime import transformer_ops  # noqa: F401 - registers the rotary op and its lowering

_FUSED_OPS = ("slice", "slice", "neg", "cat", "mul", "mul", "add")
_FUSED_OPS_INTERLEAVED = ("slice", "slice", "neg", "reshape", "reshape", "cat", "reshape", "mul", "mul", "add")


def _only_user(users: dict[str, list[Node]], graph: Graph, name: str) -> bool:
    return len(users.get(name, [])) == 1 and name not in graph.outputs


def _last_dim_slice(n: Node | None, graph: Graph, step: int = 1) -> tuple[str, int, int] | None:
    """(source, start, end) of a slice over the last dim with this step."""
    if n is None or n.op != "slice" or (n.attrs.get("step") or 1) != step:
        return None
    src_t = graph.type_of(n.inputs[0])
    if not isinstance(src_t, TensorType) or n.attrs["dim"] % src_t.rank != src_t.rank - 1:
        return None
    d = src_t.shape[-1]
    start, end = n.attrs.get("start") or 0, n.attrs.get("end")
    end = d if end is None or end > d else end
    start, end = (start + d if start < 0 else start), (end + d if end < 0 else end)
    return n.inputs[0], start, end


def _rotate_half_source(name: str, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> tuple[str, list[str]] | None:
    """(x, the nodes it is made of) if ``name`` is ``rotate_half(x)`` and nothing else reads them."""
    cat = nodes.get(name)
    if cat is None or cat.op != "cat" or len(cat.inputs) != 2 or not _only_user(users, graph, name):
        return None
    t = cat.ttype
    if cat.attrs.get("dim", 0) % t.rank != t.rank - 1 or t.shape[-1] % 2:
        return None
    neg, lo = nodes.get(cat.inputs[0]), nodes.get(cat.inputs[1])
    if neg is None or neg.op != "neg" or not _only_user(users, graph, neg.name):
        return None
    hi_s, lo_s = _last_dim_slice(nodes.get(neg.inputs[0]), graph), _last_dim_slice(lo, graph)
    if hi_s is None or lo_s is None or hi_s[0] != lo_s[0]:
        return None
    x, half = hi_s[0], t.shape[-1] // 2
    x_t = graph.type_of(x)
    if not isinstance(x_t, TensorType) or x_t.shape != t.shape or hi_s[1:] != (half, 2 * half) or lo_s[1:] != (0, half):
        return None
    if not (_only_user(users, graph, neg.inputs[0]) and _only_user(users, graph, cat.inputs[1])):
        return None
    return x, [cat.name, neg.name, neg.inputs[0], cat.inputs[1]]


def _rotate_every_two_source(name: str, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> tuple[str, list[str]] | None:
    """(x, the nodes it is made of) if ``name`` is ``stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)``
    (a reshape of a last-dim cat of two unsqueezed halves) and nothing else reads them."""
    flat = nodes.get(name)
    if flat is None or flat.op != "reshape" or not _only_user(users, graph, name):
        return None
    cat = nodes.get(flat.inputs[0])
    t = flat.ttype
    if cat is None or cat.op != "cat" or len(cat.inputs) != 2 or not _only_user(users, graph, cat.name) or t.shape[-1] % 2:
        return None
    half = t.shape[-1] // 2
    if cat.ttype.shape != (*t.shape[:-1], half, 2) or cat.attrs.get("dim", 0) % cat.ttype.rank != t.rank:
        return None
    unsq = [nodes.get(i) for i in cat.inputs]
    if any(
        u is None or u.op != "reshape" or u.ttype.shape != (*t.shape[:-1], half, 1) or not _only_user(users, graph, u.name) for u in unsq
    ):
        return None
    neg, even = nodes.get(unsq[0].inputs[0]), nodes.get(unsq[1].inputs[0])
    if neg is None or neg.op != "neg" or not _only_user(users, graph, neg.name):
        return None
    odd_s, even_s = _last_dim_slice(nodes.get(neg.inputs[0]), graph, 2), _last_dim_slice(even, graph, 2)
    if odd_s is None or even_s is None or odd_s[0] != even_s[0] or odd_s[1] != 1 or even_s[1] != 0:
        return None
    x = odd_s[0]
    x_t = graph.type_of(x)
    if not isinstance(x_t, TensorType) or x_t.shape != t.shape:  # the step-2 slices cover the whole last dim
        return None
    if not (_only_user(users, graph, neg.inputs[0]) and _only_user(users, graph, even.name)):
        return None
    return x, [flat.name, cat.name, *cat.inputs, neg.name, neg.inputs[0], even.name]


def _match(
    add: Node, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph
) -> tuple[tuple[str, str, str], list[str], bool] | None:
    """((x, cos, sin), fused node names, interleaved) for ``add(mul(x, cos), mul(rotate(x), sin))``, ``rotate``
    being ``rotate_half`` or (interleaved) ``rotate_every_two``."""
    if add.op != "add" or len(add.inputs) != 2 or not add.ttype.dtype.is_floating_point:
        return None
    muls = [nodes.get(i) for i in add.inputs]
    if any(m is None or m.op != "mul" or not _only_user(users, graph, m.name) for m in muls):
        return None
    for rot_mul, x_mul in (muls, muls[::-1]):
        for r_pos in (0, 1):
            rot = _rotate_half_source(rot_mul.inputs[r_pos], nodes, users, graph)
            interleaved = rot is None
            if interleaved:
                rot = _rotate_every_two_source(rot_mul.inputs[r_pos], nodes, users, graph)
            if rot is None:
                continue
            x, parts = rot
            if x not in x_mul.inputs:
                continue
            cos = x_mul.inputs[1 - x_mul.inputs.index(x)]
            sin = rot_mul.inputs[1 - r_pos]
            x_t = graph.type_of(x)
            # the kernel writes x's shape: x must not be broadcast by cos/sin
            if not isinstance(x_t, TensorType) or x_t.shape != add.ttype.shape:
                return None
            if not all(_broadcasts(graph, t, add.ttype) for t in (cos, sin)):
                return None
            return (x, cos, sin), [add.name, rot_mul.name, x_mul.name, *parts], interleaved
    return None


def _broadcasts(graph: Graph, name: str, out: TensorType) -> bool:
    t = graph.type_of(name)
    if not isinstance(t, TensorType) or t.rank > out.rank or not t.dtype.is_floating_point:
        return False
    shape = (1,) * (out.rank - t.rank) + t.shape
    return shape[-1] == out.shape[-1] and all(a in (1, b) for a, b in zip(shape, out.shape, strict=True))


def fuse_rotary(graph: Graph) -> Graph:
    """Replace every recognised rotary embedding with a ``rotary`` node."""
    nodes = graph.node_map()
    users = graph.users()
    found: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op != "add" or not isinstance(node.type, TensorType) or node.ttype.rank > 4:
            continue
        m = _match(node, nodes, users, graph)
        if m is None:
            continue
        attrs: dict = {"fused_ops": _FUSED_OPS_INTERLEAVED if m[2] else _FUSED_OPS}
        if m[2]:
            attrs["interleaved"] = True
        found[node.name] = Node(node.name, "rotary", m[0], node.ttype, attrs)
    return _absorb_pass_through(substitute(graph, found))


def _absorb_pass_through(graph: Graph) -> Graph:
    """``cat([rotary(slice(t, :r)), slice(t, r:)], -1)`` -> ``rotary(t, cos, sin, rotary_dims=r)``."""
    nodes = graph.node_map()
    users = graph.users()
    found: dict[str, Node] = {}
    for cat in graph.nodes:
        if cat.op != "cat" or len(cat.inputs) != 2 or not isinstance(cat.type, TensorType):
            continue
        if cat.attrs.get("dim", 0) % cat.ttype.rank != cat.ttype.rank - 1:
            continue
        rot = nodes.get(cat.inputs[0])
        if rot is None or rot.op != "rotary" or "rotary_dims" in rot.attrs or not _only_user(users, graph, rot.name):
            continue
        lo, hi = _last_dim_slice(nodes.get(rot.inputs[0]), graph), _last_dim_slice(nodes.get(cat.inputs[1]), graph)
        if lo is None or hi is None or lo[0] != hi[0]:
            continue
        t = graph.type_of(lo[0])
        r = rot.ttype.shape[-1]
        if not isinstance(t, TensorType) or lo[1:] != (0, r) or hi[1:] != (r, t.shape[-1]) or t.shape != cat.ttype.shape:
            continue
        if rot.ttype.dtype != cat.ttype.dtype or t.dtype != cat.ttype.dtype:
            continue
        attrs = {**rot.attrs, "fused_ops": (*rot.attrs["fused_ops"], "slice", "slice", "cat"), "rotary_dims": r}
        found[cat.name] = Node(cat.name, "rotary", [lo[0], *rot.inputs[1:]], cat.ttype, attrs)
    return substitute(graph, found)
