"""Per-channel transforms of a conv's input into the conv's input loads: ``conv(relu?(x * s + t))`` with ``s`` and
``t`` of shape (N or 1, C, 1, 1) becomes one ``conv_epilogue`` with ``in_scale`` (and ``in_shift``, ``in_act``),
whose kernel transforms each input element it loads (tables of N x C values that stay in cache).

- Squeeze-excitation (RegNet-Y, EfficientNet, MobileNet-V3): every block ends with ``x * sigmoid(fc(pool(x)))``
  feeding the block's 1x1 projection. Left alone the multiply is a kernel of its own that reads and writes the
  whole activation (EfficientNet-B0's second stage at batch 32: 77 MB each way). The product is rounded to ``x``'s
  dtype before the conv, as the separate multiply's output was, so the result is bit-comparable.
- A batch norm and ReLU before a conv (DenseNet's pre-activation layers: BN, ReLU, 1x1 conv on the cat of all
  earlier features): folded to ``x * s + t`` with constant tables, they were a pointwise kernel reading and
  writing the cat's whole width each layer (as many bytes as the cats themselves). The transform is computed in
  fp32 and rounded once, as that kernel did; taps outside the map stay zero, since the conv pads the normalised
  map.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.kernels.conv import conv_operand_count
from kfuse.passes.simplify import substitute


def _per_channel(graph: Graph, t: str, out: TensorType) -> bool:
    """``t`` is a table of one value per (image or all, channel) of ``out`` (N, C, H, W): (N|1, C, 1, 1) or (C, 1, 1)."""
    tt = graph.type_of(t)
    if not isinstance(tt, TensorType) or tt.dtype != out.dtype:
        return False
    c = out.shape[1]
    if tt.rank == 3:
        return tt.shape == (c, 1, 1)
    return tt.rank == 4 and tt.shape[1:] == (c, 1, 1) and tt.shape[0] in (1, out.shape[0])


def _split(graph: Graph, node: Node) -> tuple[str, str] | None:
    """(x, table) of a binary ``node`` whose one operand is the full map and the other a per-channel table."""
    out = node.ttype
    for x, t in (node.inputs, node.inputs[::-1]):
        x_t = graph.type_of(x)
        if isinstance(x_t, TensorType) and x_t.shape == out.shape and x_t.dtype == out.dtype and _per_channel(graph, t, out):
            return x, t
    return None


def _prologue(
    graph: Graph, conv: Node, nodes: dict[str, Node], users: dict[str, list[Node]]
) -> tuple[str, str, str | None, str | None] | None:
    """(x, scale, shift, act) where the conv's input is ``act?(x * scale + shift?)``, each value read only by the next."""

    def private(v: str) -> Node | None:  # the node making v, when the chain alone reads v
        n = nodes.get(v)
        if n is None or len(users.get(v, [])) != 1 or v in graph.outputs or not isinstance(n.type, TensorType) or n.ttype.rank != 4:
            return None
        return n

    node = private(conv.inputs[0])
    act = shift = None
    if node is not None and node.op == "relu":
        act, node = "relu", private(node.inputs[0])
    if node is not None and node.op == "add" and act is not None:  # (a shift with no ReLU after it is left alone)
        found = _split(graph, node)
        if found is None:
            return None
        y, shift = found
        node = private(y)
    found = _split(graph, node) if node is not None and node.op == "mul" else None
    if found is None:
        return None
    return found[0], found[1], shift, act


def fuse_input_scale(graph: Graph) -> Graph:
    """Give each ``conv_epilogue`` whose input is ``relu?(x * s + t)`` with per-channel tables the transform."""
    new: dict[str, Node] = {}
    nodes, users = graph.node_map(), graph.users()
    for conv in graph.nodes:
        if conv.op != "conv_epilogue" or conv.attrs.get("in_scale"):
            continue
        found = _prologue(graph, conv, nodes, users)
        if found is None:
            continue
        x, s, t, act = found
        n_conv = conv_operand_count(conv.attrs)
        tables = (s,) if t is None else (s, t)
        ins = (x, *conv.inputs[1:n_conv], *tables, *conv.inputs[n_conv:])  # x, weight, (bias), scale, (shift), epilogue operands
        fused = ("mul", *(("add",) if t is not None else ()), *((act,) if act else ()))
        attrs = {**conv.attrs, "in_scale": True, "fused_ops": (*fused, *conv.attrs.get("fused_ops", ("conv2d",)))}
        if t is not None:
            attrs["in_shift"] = True
        if act is not None:
            attrs["in_act"] = act
        new[conv.name] = Node(conv.name, conv.op, ins, conv.type, attrs)
    return substitute(graph, new)
