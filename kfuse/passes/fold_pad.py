"""Zero padding in front of a convolution becomes the convolution's own padding.

Models ported from TensorFlow pad explicitly before every conv (Hugging Face's MobileNet-V2 and its
``tf_padding``): ``conv2d(pad(x, (l, r, t, b)), padding=0)``. As a separate op the pad is a full copy of the
activation in PyTorch, and it keeps the conv from reading the producer's output directly. Where the pad is
zero, touches only the two spatial dims and is symmetric (l == r, t == b), the conv does the same work with
``padding + (t, l)`` and its masked loads supply the zeros. Asymmetric pads (TF "same" at stride 2 pads one
more on the bottom and right) stay as they are: kfuse's conv kernels take one padding per dimension.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, freeze_attrs
from kfuse.passes.simplify import dce


def _symmetric_spatial(pad: Node, rank: int) -> tuple[int, int] | None:
    """(rows, columns) of a zero pad of only the last two dims of a 4-D value, equal on both sides; else None."""
    pads = tuple(pad.attrs["pads"])
    if rank != 4 or float(pad.attrs.get("value", 0.0)) != 0.0 or len(pads) > 4:
        return None
    left, right, top, bottom = (pads + (0, 0, 0, 0))[:4]
    if left != right or top != bottom:
        return None
    return top, left


def fold_pad(graph: Graph) -> Graph:
    """Absorb each symmetric zero pad whose only reader is a conv's input into that conv's padding."""
    producer = graph.node_map()
    users = graph.users()
    outputs = set(graph.outputs)
    new: dict[str, Node] = {}
    for conv in graph.nodes:
        if conv.op != "conv2d":
            continue
        pad = producer.get(conv.inputs[0])
        if pad is None or pad.op != "pad" or pad.name in outputs or len(users.get(pad.name, [])) != 1:
            continue
        extra = _symmetric_spatial(pad, len(graph.type_of(pad.inputs[0]).shape))  # type: ignore[union-attr]
        if extra is None:
            continue
        ph, pw = conv.attrs.get("padding", (0, 0))
        attrs = freeze_attrs(dict(conv.attrs, padding=(ph + extra[0], pw + extra[1])))
        new[conv.name] = Node(conv.name, conv.op, (pad.inputs[0], *conv.inputs[1:]), conv.type, attrs)
    if not new:
        return graph
    return dce(graph.replace(nodes=tuple(new.get(n.name, n) for n in graph.nodes)))
