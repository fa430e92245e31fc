"""Layout transformation: convolution graphs run in NHWC (channels-last) end to end.

The implicit-GEMM conv template reads BLOCK_K consecutive channels of one pixel per load, which
is coalesced only in NHWC. The pass converts each 4-D graph input that feeds a convolution to
channels-last **once**, at the graph boundary (a ``to_nhwc`` node), marks every conv's output
as channels-last (the kernels write NHWC, and PyTorch ops between convs keep the memory format),
and converts 4-D graph outputs back to the standard layout, unless ``Options.output_layout`` is
"channels_last" (``kfuse.compile`` sets it when the example input is channels-last, as eager
PyTorch then returns channels-last outputs too). Shapes in the IR stay NCHW; only
``TensorType.layout`` and the physical strides change, so every other pass is unaffected.

Channel padding: a few-channel input (the 3-channel RGB stem) can be zero-padded to a multiple
of 4/8 channels inside the same copy (and the conv weights padded with zeros), which makes
every pixel's channels an aligned vector. It is applied where the template's cost estimate
says it pays (``pad="auto"``), always or never.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, ValueType
from kfuse.passes.simplify import dce


def _to_nhwc_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    x = xs[0]
    pad = a.get("pad_c", 0)
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
    return x.contiguous(memory_format=torch.channels_last)


def _to_nhwc_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    t = types[0]
    assert isinstance(t, TensorType)
    n, c, h, w = t.shape
    return TensorType((n, c + a.get("pad_c", 0), h, w), t.dtype, "channels_last")


ops.register("to_nhwc", ops.SHAPE, infer=_to_nhwc_type, arity=1)(_to_nhwc_ref)


def padding_pays(c: int, conv_nodes: list[Node], graph: Graph, multiple: int = 8) -> int:
    """Channels to add to a ``c``-channel input (0: none), by the tuner's cost estimate of the
    best config with and without padding, summed over the convs that read the input."""
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.space import ConvProblem, estimate_ms, valid_configs

    if c % multiple == 0 or c > 4 * multiple:
        return 0
    pad = -c % multiple
    gain = 0.0
    for node in conv_nodes:
        x, w = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
        assert isinstance(x, TensorType) and isinstance(w, TensorType)
        n, _, h, wd = x.shape
        oc, _, kh, kw = w.shape
        s, p, d = (tuple(node.attrs.get(k, dflt)) for k, dflt in (("stride", (1, 1)), ("padding", (0, 0)), ("dilation", (1, 1))))
        for cc, sign in ((c, 1.0), (c + pad, -1.0)):
            prob = ConvProblem(n, cc, h, wd, oc, kh, kw, s, p, d)  # type: ignore[arg-type]
            cands = valid_configs(prob, DEFAULT)
            gain += sign * min((estimate_ms(cfg, prob, DEFAULT) for cfg in cands), default=float("inf"))
    return pad if gain > 0 else 0


def _pad_weight(w: torch.Tensor, pad: int) -> torch.Tensor:
    return F.pad(w, (0, 0, 0, 0, 0, pad)).contiguous()


def to_nhwc(graph: Graph, pad: str = "auto", multiple: int = 8, keep_outputs: bool = False) -> Graph:
    """Convert conv graphs to channels-last at the boundary (see the module docstring).
    ``pad``: "auto" (where the cost estimate says it pays), "always" or "never".
    ``keep_outputs``: 4-D outputs stay channels-last (no copy back to the standard layout)."""
    convs = [n for n in graph.nodes if n.op == "conv2d"]
    if not convs:
        return graph
    users = graph.users()
    b = GraphBuilder.from_graph(graph)
    rename: dict[str, str] = {}
    padded: dict[str, int] = {}
    for name, t in graph.inputs:
        readers = users.get(name, [])
        if t.rank != 4 or not any(u.op == "conv2d" and u.inputs[0] == name for u in readers):
            continue
        pad_c = 0
        only_convs = all(u.op == "conv2d" and u.inputs[0] == name and u.inputs[1] in graph.constants
                         and u.attrs.get("groups", 1) == 1 for u in readers)  # fmt: skip
        if only_convs and pad != "never":
            if pad == "always":
                pad_c = -t.shape[1] % multiple
            else:
                pad_c = padding_pays(t.shape[1], readers, graph, multiple)
        rename[name] = b.op("to_nhwc", [name], {"pad_c": pad_c} if pad_c else {}, name=b.fresh(f"{name}_nhwc"))
        if pad_c:
            padded[name] = pad_c
    for node in graph.nodes:
        inputs = tuple(rename.get(i, i) for i in node.inputs)
        ntype = node.type
        if node.op == "conv2d":
            if node.inputs[0] in padded:  # zero weights for the zero channels
                wname = b.add_constant(_pad_weight(graph.constants[node.inputs[1]], padded[node.inputs[0]]), name=b.fresh("w_pad"))
                inputs = (inputs[0], wname) + inputs[2:]
            assert isinstance(ntype, TensorType)
            ntype = TensorType(ntype.shape, ntype.dtype, "channels_last")
        b.add_node(Node(node.name, node.op, inputs, ntype, node.attrs))
    outputs = []
    for o in graph.outputs:
        t = b.type_of(o)
        if o in rename:
            outputs.append(o)  # an input returned as is
        elif isinstance(t, TensorType) and t.rank == 4 and not keep_outputs:
            outputs.append(b.op("contiguous", [o], {}, name=b.fresh(f"{o}_nchw")))
        else:
            outputs.append(o)
    return dce(b.build(outputs))


def runs_nhwc(graph: Graph) -> bool:
    """Whether ``to_nhwc`` converted this graph: its 4-D activations are then channels-last at run time (PyTorch's
    ops and kfuse's kernels keep the format) even where a type, set on conv outputs only, does not say so."""
    return any(n.op == "to_nhwc" for n in graph.nodes)


def layout_pass(options: Any = None) -> Any:
    """The pipeline stage for ``Options.layout``: "auto"/"nhwc" convert, "nchw" leaves as is."""
    mode = getattr(options, "layout", "auto")
    keep = getattr(options, "output_layout", "nchw") == "channels_last"

    def stage(graph: Graph) -> Graph:
        return graph if mode == "nchw" else to_nhwc(graph, keep_outputs=keep)

    return stage
