"""Constant folding. Weights are constants, so everything computed from weights alone is
computed once at compile time: transposed weight matrices, casts, batch-norm parameters
(folded into the preceding convolution), position ids, and so on."""

from __future__ import annotations

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node
from kfuse.passes.simplify import dce

# a folded tensor may not grow past this many elements (an expand of a scalar would)
MAX_GROWTH_ELEMENTS = 1 << 16
# ... unless it is computed, not broadcast: weight-only math (Swin-V2's relative-position MLP over a constant
# coordinate table, 225 x 512; a window mask from two region tables, 64 x 49 x 49) folds up to this size, so
# it is not recomputed every call. An expand (or a PyTorch fallback, which may repeat) keeps the limit above.
MAX_COMPUTED_ELEMENTS = 1 << 20
_BROADCASTS = ("expand", "fallback")
# ... but a fallback that gathers a constant table by a constant index computes its result (torchvision's Swin-V2
# picks its relative-position bias, [225, H] -> [4096, H], by an index buffer): it folds like computed math
_GATHERS = ("aten.index.Tensor", "aten.index_select", "aten.gather")
_IMPURE = ("rand", "empty", "bernoulli", "normal", "uniform", "dropout")


def _foldable(node: Node, b: GraphBuilder) -> bool:
    if not all(i in b.constants for i in node.inputs):
        return False
    if isinstance(node.type, tuple):
        return False
    if node.op == "fallback" and any(s in node.attrs["target"] for s in _IMPURE):
        return False
    largest_input = max((b.constants[i].numel() for i in node.inputs), default=0)
    if node.ttype.numel <= max(largest_input, MAX_GROWTH_ELEMENTS):
        return True
    gathers = node.op == "fallback" and any(node.attrs["target"].startswith(t) for t in _GATHERS)
    return (node.op not in _BROADCASTS or gathers) and node.ttype.numel <= MAX_COMPUTED_ELEMENTS


def _on_one_device(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs on one device. A model on the GPU has its weights (and the constants of ops evaluated at
    import, such as ``arange(device=cuda)``) there, while kfuse's own scalar constants are made on the
    CPU: T5's ``min(relative_position, full_like(...))`` met both. Fold where the model's tensors are."""
    dev = next((x.device for x in xs if x.device.type != "cpu"), None)
    return xs if dev is None else [x.to(dev) for x in xs]


def constant_value(graph: Graph, name: str) -> torch.Tensor | None:
    """``name``'s value when it depends on constants only, evaluated without ``constant_fold``'s growth limit
    (a pass that needs the value itself: Swin-V2's 64 x 49 x 49 window mask is built from two small
    constants, 2.3x the larger); None where an input or an impure op feeds it."""
    if name in graph.constants:
        return graph.constants[name]
    nodes = graph.node_map()
    order: list[Node] = []
    seen: set[str] = set()
    stack = [name]
    while stack:
        v = stack.pop()
        if v in seen or v in graph.constants:
            continue
        seen.add(v)
        node = nodes.get(v)
        if node is None or isinstance(node.type, tuple):  # a graph input, or a multi-output op
            return None
        if node.op == "fallback" and any(t in node.attrs["target"] for t in _IMPURE):
            return None
        order.append(node)
        stack.extend(node.inputs)
    values = dict(graph.constants)
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    for node in sorted(order, key=lambda n: position[n.name]):
        values[node.name] = ops.run_reference(node.op, _on_one_device([values[i] for i in node.inputs]), node.attrs)
    return values[name]


def constant_fold(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants, with its reference implementation."""
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if _foldable(node, b):
            value = ops.run_reference(node.op, _on_one_device([b.constants[i] for i in node.inputs]), node.attrs)
            b.add_constant(value.contiguous(), name=node.name)
        else:
            b.add_node(node)
    return dce(b.build(graph.outputs))


def fold_batch_norm(graph: Graph) -> Graph:
    """conv2d(x, W, b) -> batch_norm(...) with constant parameters becomes one conv2d with
    rescaled weights and a new bias. A batch norm that follows no conv becomes mul + add with
    folded constants, which the epilogue and pointwise fusers can absorb."""
    users = graph.users()
    nodes = graph.node_map()
    b = GraphBuilder.from_graph(graph)
    replaced: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op != "batch_norm" or not all(i in graph.constants for i in node.inputs[1:]):
            b.add_node(node)
            continue
        x = node.inputs[0]
        w, beta, mean, var = (graph.constants[i].double() for i in node.inputs[1:])
        scale = w / torch.sqrt(var + node.attrs.get("eps", 1e-5))
        shift = beta - mean * scale
        conv = replaced.get(x) or nodes.get(x)
        if (
            conv is not None
            and conv.op == "conv2d"
            and len(users.get(x, [])) == 1
            and x not in graph.outputs
            and conv.inputs[1] in b.constants
            and (len(conv.inputs) < 3 or conv.inputs[2] in b.constants)
        ):
            cw = b.constants[conv.inputs[1]]
            cb = b.constants[conv.inputs[2]].double() if len(conv.inputs) > 2 else torch.zeros_like(scale)
            new_w = (cw.double() * scale.reshape(-1, 1, 1, 1)).to(cw.dtype)
            new_b = (cb * scale + shift).to(cw.dtype)
            wn = b.add_constant(new_w.contiguous(), name=b.fresh("w_bn"))
            bn = b.add_constant(new_b.contiguous(), name=b.fresh("b_bn"))
            # the conv node was already added; replace it in place with the folded one
            idx = next(i for i, n in enumerate(b.nodes) if n.name == conv.name)
            folded = Node(conv.name, "conv2d", (conv.inputs[0], wn, bn), conv.type, conv.attrs)
            b.nodes[idx] = folded
            replaced[x] = folded
            b.add_node(Node(node.name, "identity", (x,), node.type))
            continue
        dt = node.ttype.dtype
        shape = (-1,) + (1,) * (node.ttype.rank - 2)
        s = b.add_constant(scale.to(dt).reshape(shape).contiguous(), name=b.fresh("bn_scale"))
        t = b.add_constant(shift.to(dt).reshape(shape).contiguous(), name=b.fresh("bn_shift"))
        y = b.op("mul", [x, s])
        b.add_node(Node(node.name, "add", (y, t), node.type))
    return dce(b.build(graph.outputs))
