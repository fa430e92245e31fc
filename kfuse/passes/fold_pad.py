"""Zero padding in front of a convolution becomes the convolution's own padding.

Models ported from TensorFlow pad explicitly before every conv (Hugging Face's MobileNet-V2 and its
``tf_padding``): ``conv2d(pad(x, (l, r, t, b)), padding=0)``. As a separate op the pad is a full copy of the
activation in PyTorch, and it keeps the conv from reading the producer's output directly. Where the pad is
zero and touches only the two spatial dims, the conv does the same work with ``padding + (t, l)`` and its masked
loads supply the zeros. An asymmetric pad (TF "same" at stride 2 pads one more on the bottom and right:
EfficientNet's and MobileNet's stride-2 depthwise convs, EfficientNet's stem) leaves the rest as ``pad_end =
(b - t, r - l)``, which only makes the output a row or column larger: the kernels read past the input's edge
as zeros anyway. Pads that add less at the end than at the start stay as they are.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, freeze_attrs
from kfuse.passes.simplify import dce


def _spatial(pad: Node, rank: int) -> tuple[int, int, int, int] | None:
    """(top, left, bottom - top, right - left) of a zero pad of only the last two dims of a 4-D value that pads
    at least as much at the end as at the start; else None."""
    pads = tuple(pad.attrs["pads"])
    if rank != 4 or float(pad.attrs.get("value", 0.0)) != 0.0 or len(pads) > 4:
        return None
    left, right, top, bottom = (pads + (0, 0, 0, 0))[:4]
    if min(left, top) < 0 or right < left or bottom < top:
        return None
    return top, left, bottom - top, right - left


def fold_pad(graph: Graph) -> Graph:
    """Absorb each zero pad whose only reader is a conv's input into that conv's padding (and ``pad_end``)."""
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
        extra = _spatial(pad, len(graph.type_of(pad.inputs[0]).shape))  # type: ignore[union-attr]
        if extra is None:
            continue
        ph, pw = conv.attrs.get("padding", (0, 0))
        eh, ew = conv.attrs.get("pad_end") or (0, 0)
        attrs = dict(conv.attrs, padding=(ph + extra[0], pw + extra[1]))
        if eh + extra[2] or ew + extra[3]:
            attrs["pad_end"] = (eh + extra[2], ew + extra[3])
        attrs = freeze_attrs(attrs)
        new[conv.name] = Node(conv.name, conv.op, (pad.inputs[0], *conv.inputs[1:]), conv.type, attrs)
    if not new:
        return graph
    return dce(graph.replace(nodes=tuple(new.get(n.name, n) for n in graph.nodes)))
