"""Graph clean-up passes: dead code elimination, common subexpression elimination and
algebraic simplification. Each is a pure function Graph -> Graph."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.ir.ops import infer_type, is_elementwise, scalar_value


def dce(graph: Graph) -> Graph:
    """Drop nodes and constants that no output depends on."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if node.name in live:
            kept.append(node)
            live.update(node.inputs)
    consts = {k: v for k, v in graph.constants.items() if k in live}
    return graph.replace(nodes=tuple(reversed(kept)), constants=consts)


def substitute(graph: Graph, new: dict[str, Node]) -> Graph:
    """``graph`` with each node named in ``new`` replaced, in its place, by the node given for it
    (a fused node keeps the name of the value it produces); then what nothing reads is dropped."""
    if not new:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        b.add_node(new.get(node.name, node))
    return dce(b.build(graph.outputs))


def cse(graph: Graph) -> Graph:
    """Merge nodes with the same op, inputs and attributes; merge equal scalar constants."""
    rename: dict[str, str] = {}
    seen_scalars: dict[tuple, str] = {}
    consts: dict[str, torch.Tensor] = {}
    for name, t in graph.constants.items():
        v = scalar_value(t) if t.dim() == 0 else None
        if v is not None:
            # repr keeps -0.0 apart from 0.0 (equal as numbers, not under division: 1/-0.0 is -inf)
            key = (repr(v) if isinstance(v, float) else v, t.dtype, str(t.device))
            if key in seen_scalars:
                rename[name] = seen_scalars[key]
                continue
            seen_scalars[key] = name
        consts[name] = t
    seen: dict[tuple, str] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(rename.get(i, i) for i in node.inputs)
        node = Node(node.name, node.op, inputs, node.type, node.attrs)
        if node.op == "fallback":  # opaque: may be impure
            nodes.append(node)
            continue
        key = node.key()
        if key in seen:
            rename[node.name] = seen[key]
            continue
        seen[key] = node.name
        nodes.append(node)
    outputs = tuple(rename.get(o, o) for o in graph.outputs)
    return graph.replace(nodes=tuple(nodes), constants=consts, outputs=outputs)


Rewrite = Callable[[Node, GraphBuilder], str | None]


def _const_scalar(b: GraphBuilder, name: str) -> float | int | bool | None:
    t = b.constants.get(name)
    if t is None or t.numel() != 1:
        return None
    return scalar_value(t)


def _same_type(b: GraphBuilder, node: Node, name: str) -> bool:
    t = b.type_of(name)
    return isinstance(t, TensorType) and t.shape == node.ttype.shape and t.dtype == node.ttype.dtype


def _identity_rewrite(node: Node, b: GraphBuilder) -> str | None:
    """x*1, 1*x, x+0, 0+x, x-0, x/1 become x when that changes no type."""
    if node.op not in ("mul", "add", "sub", "div") or len(node.inputs) != 2:
        return None
    x, y = node.inputs
    unit = 1 if node.op in ("mul", "div") else 0
    if _const_scalar(b, y) == unit and _same_type(b, node, x):
        return x
    if node.op in ("mul", "add") and _const_scalar(b, x) == unit and _same_type(b, node, y):
        return y
    return None


def _strength_rewrite(node: Node, b: GraphBuilder) -> str | None:
    """x / c becomes x * (1/c); x ** 2 becomes x * x; x ** 0.5 becomes sqrt(x)."""
    if node.op == "div" and node.ttype.dtype.is_floating_point:
        c = _const_scalar(b, node.inputs[1])
        if isinstance(c, float | int) and not isinstance(c, bool) and c != 0 and b.constants[node.inputs[1]].dim() == 0:
            # 1/c is computed in double and stored at no less than the division's own precision, so a float32
            # divisor in a float64 division does not round the reciprocal to float32
            cdt = b.constants[node.inputs[1]].dtype
            rdt = torch.promote_types(cdt if cdt.is_floating_point else node.ttype.dtype, node.ttype.dtype)
            recip = b.scalar(1.0 / float(c), dtype=rdt)
            out = b.op("mul", [node.inputs[0], recip])
            return out if b.type_of(out) == node.type else None
    if node.op == "pow":
        c = _const_scalar(b, node.inputs[1])
        if c == 2 and _same_type(b, node, node.inputs[0]):
            return b.op("mul", [node.inputs[0], node.inputs[0]])
        if c == 0.5 and _same_type(b, node, node.inputs[0]):
            return b.op("sqrt", [node.inputs[0]])
    return None


def _shape_rewrite(node: Node, b: GraphBuilder) -> str | None:
    """Collapse permute/reshape chains, drop no-op reshapes, permutes and casts."""
    if node.op == "identity":
        return node.inputs[0]
    if node.op in ("reshape", "permute", "cast", "expand", "contiguous") and _same_type(b, node, node.inputs[0]):
        if node.op != "permute" or tuple(node.attrs["dims"]) == tuple(range(node.ttype.rank)):
            if node.op != "contiguous":
                return node.inputs[0]
    producer = _producer(b, node.inputs[0]) if node.inputs else None
    if producer is None:
        return None
    if node.op == "reshape" and producer.op == "reshape":  # a split of a merge (lift_head_batch) is no reshape at all
        src = producer.inputs[0]
        return src if _same_type(b, node, src) else b.op("reshape", [src], {"shape": node.attrs["shape"]})
    if node.op == "permute" and producer.op == "permute":
        inner, outer = producer.attrs["dims"], node.attrs["dims"]
        dims = tuple(inner[d] for d in outer)
        if dims == tuple(range(len(dims))):
            return producer.inputs[0]
        return b.op("permute", [producer.inputs[0]], {"dims": dims})
    if node.op == "cast" and producer.op == "cast":
        src = b.type_of(producer.inputs[0])
        mid = producer.ttype.dtype
        # a round trip through a wider type is exact: cast(cast(x, wide), back) == x
        if isinstance(src, TensorType) and src.dtype == node.ttype.dtype and _wider(mid, src.dtype):
            return producer.inputs[0]
    return None


def _wider(a: torch.dtype, b: torch.dtype) -> bool:
    order = [torch.float16, torch.float32, torch.float64]
    return a in order and b in order and order.index(a) >= order.index(b) or (a == torch.float32 and b == torch.bfloat16)


def _producer(b: GraphBuilder, name: str) -> Node | None:
    for node in reversed(b.nodes):
        if node.name == name:
            return node
    return None


def _split_const(b: GraphBuilder, node: Node | None, op: str) -> tuple[str, float] | None:
    """``node`` = op(v, c) or op(c, v) with a scalar constant c: (v, c)."""
    if node is None or node.op != op or len(node.inputs) != 2:
        return None
    for v, c in (node.inputs, node.inputs[::-1]):
        k = _const_scalar(b, c)
        if isinstance(k, float | int) and not isinstance(k, bool):
            return v, float(k)
    return None


def _is_cube_of(b: GraphBuilder, name: str, x: str) -> bool:
    p = _producer(b, name)
    if p is None:
        return False
    if p.op == "pow":
        return p.inputs[0] == x and _const_scalar(b, p.inputs[1]) == 3
    if p.op == "mul":  # x * x * x in either association
        a, c = p.inputs
        sq = lambda n: (q := _producer(b, n)) is not None and q.op == "mul" and q.inputs == (x, x)  # noqa: E731
        return (a == x and sq(c)) or (c == x and sq(a))
    return False


def _gelu_tanh_rewrite(node: Node, b: GraphBuilder) -> str | None:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))) (GPT-2's ``gelu_new``, written out
    op by op) becomes one ``gelu_tanh``: an epilogue step cuBLASLt and the templates fuse."""
    if node.op != "mul" or len(node.inputs) != 2 or not node.ttype.dtype.is_floating_point:
        return None
    for half_x, one_plus in (node.inputs, node.inputs[::-1]):
        hx = _split_const(b, _producer(b, half_x), "mul")
        g = _split_const(b, _producer(b, one_plus), "add")
        if hx is None or g is None or abs(hx[1] - 0.5) > 1e-6 or abs(g[1] - 1.0) > 1e-6:
            continue
        x = hx[0]
        t = _producer(b, g[0])
        if t is None or t.op != "tanh":
            continue
        e = _split_const(b, _producer(b, t.inputs[0]), "mul")
        if e is None or abs(e[1] - math.sqrt(2 / math.pi)) > 1e-4:
            continue
        d = _producer(b, e[0])
        if d is None or d.op != "add" or x not in d.inputs:
            continue
        other = d.inputs[1] if d.inputs[0] == x else d.inputs[0]
        c = _split_const(b, _producer(b, other), "mul")
        if c is None or abs(c[1] - 0.044715) > 1e-6 or not _is_cube_of(b, c[0], x):
            continue
        if not _same_type(b, node, x):
            continue
        return b.op("gelu_tanh", [x])
    return None


def _expand_operand_rewrite(node: Node, b: GraphBuilder) -> str | None:
    """``e(x, expand(y))`` becomes ``e(x, y)`` for an elementwise ``e`` whose result keeps its type: the op
    broadcasts ``y`` itself (expand aligns dims the same way). An explicit expand between a reduction
    and its elementwise reader (``F.normalize``: ``x / norm.clamp_min(eps).expand_as(x)``) is a node the
    memory-bound fusion cannot take, so the divide ran as a second kernel over the whole tensor."""
    if not is_elementwise(node.op) or not isinstance(node.type, TensorType):
        return None
    inputs = []
    for i in node.inputs:
        p = _producer(b, i)
        inputs.append(p.inputs[0] if p is not None and p.op == "expand" else i)
    if tuple(inputs) == node.inputs:
        return None
    try:
        t = infer_type(node.op, [b.type_of(i) for i in inputs], node.attrs)
    except (ValueError, RuntimeError):
        return None
    return b.op(node.op, inputs, node.attrs) if t == node.type else None


RULES: list[Rewrite] = [_identity_rewrite, _strength_rewrite, _shape_rewrite, _gelu_tanh_rewrite, _expand_operand_rewrite]


def algebraic_simplify(graph: Graph, rules: list[Rewrite] | None = None) -> Graph:
    """Apply rewrite rules once per node, in order; rewritten values are renamed downstream."""
    rules = RULES if rules is None else rules
    b = GraphBuilder.from_graph(graph)
    rename: dict[str, str] = {}
    for node in graph.nodes:
        node = Node(node.name, node.op, tuple(rename.get(i, i) for i in node.inputs), node.type, node.attrs)
        replacement = None
        for rule in rules:
            replacement = rule(node, b)
            if replacement is not None:
                break
        if replacement is None:
            b.add_node(node)
        else:
            rename[node.name] = replacement
    outputs = [rename.get(o, o) for o in graph.outputs]
    return dce(b.build(outputs))


def rewrite_then_simplify(graph: Graph, rewrite_once: Callable[[Graph], Graph | None], max_rewrites: int = 10_000) -> Graph:
    """Apply ``rewrite_once`` until it returns None, then, if anything changed, ``algebraic_simplify`` (the rewrites
    of ``lift_head_batch`` and ``fold_batch_dims`` leave reshape pairs that cancel)."""
    changed = False
    for _ in range(max_rewrites):
        new = rewrite_once(graph)
        if new is None:
            break
        graph, changed = new, True
    return algebraic_simplify(graph) if changed else graph
