"""Gated-MLP recognition: a GEMM over ``[W_gate | W_up]`` whose two column halves feed only
``act(gate) * up`` becomes one ``gated_gemm`` node (``kfuse.kernels.gated_gemm``).

It runs after pointwise fusion and tuning, on what they leave: a ``gemm_epilogue`` with no epilogue
(the merged gate/up projection of ``merge_gemm``), two last-dim slices of it (views), and a
``pointwise`` kernel whose program is exactly ``act(in_g) * in_u``, the gate either half. The node keeps those four
nodes (``unfused``), so the lowering can time them against the fused kernel and run whichever is
faster. The GEMM's weight must be a constant ``[K, 2I]`` and nothing else may read the GEMM or
the slices.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.kernels import gated_gemm  # noqa: F401 - registers the op and its lowering
from kfuse.kernels.gated_gemm import ACTIVATIONS
from kfuse.passes.simplify import substitute


def _only_users(users: dict[str, list[Node]], graph: Graph, name: str, n: int) -> bool:
    return len(users.get(name, [])) == n and name not in graph.outputs


def _gate_program(p: Node) -> tuple[str, int, int] | None:
    """(activation, gate input index, up input index) if ``p``'s program is ``act(in_g) * in_u``."""
    prog = p.attrs.get("program")
    if prog is None or prog.reduces or len(prog.steps) != 2 or len(prog.outputs) != 1 or prog.outputs[0] != 1:
        return None
    act, mul = prog.steps
    if act.op not in ACTIVATIONS or act.attrs or len(act.args) != 1 or act.args[0].kind != "in":
        return None
    if mul.op != "mul" or len(mul.args) != 2:
        return None
    kinds = {(x.kind, x.index) for x in mul.args}
    up = [x.index for x in mul.args if x.kind == "in"]
    if ("reg", 0) not in kinds or len(up) != 1 or up[0] == act.args[0].index:
        return None
    return act.op, act.args[0].index, up[0]


def _half_slice(s: Node | None, graph: Graph, start: int, end: int) -> bool:
    if s is None or s.op != "slice" or s.attrs.get("step", 1) not in (1, None):
        return False
    t = graph.type_of(s.inputs[0])
    if not isinstance(t, TensorType) or s.attrs["dim"] % t.rank != t.rank - 1:
        return False
    e = s.attrs.get("end")
    e = t.shape[-1] if e is None or e > t.shape[-1] else e
    return (s.attrs.get("start") or 0) == start and e == end


def _match(p: Node, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> Node | None:
    form = _gate_program(p)
    if form is None or len(p.inputs) != 2 or any(v is not None for _, v in p.attrs.get("in_views", ())):
        return None
    act, gi, ui = form
    sg, su = nodes.get(p.inputs[gi]), nodes.get(p.inputs[ui])
    if sg is None or su is None or sg.inputs[0] != su.inputs[0]:
        return None
    gemm = nodes.get(sg.inputs[0])
    if gemm is None or gemm.op != "gemm_epilogue" or len(gemm.inputs) != 2 or gemm.attrs["epilogue"].steps:
        return None
    w = graph.constants.get(gemm.inputs[1])
    out = p.attrs["out_types"][0]
    if w is None or w.dim() != 2 or w.shape[1] % 2 or not isinstance(out, TensorType):
        return None
    half = w.shape[1] // 2
    gate_first = _half_slice(sg, graph, 0, half) and _half_slice(su, graph, half, 2 * half)
    gate_second = _half_slice(sg, graph, half, 2 * half) and _half_slice(su, graph, 0, half)
    if not (gate_first or gate_second) or out.shape[-1] != half:
        return None
    if not (_only_users(users, graph, gemm.name, 2) and _only_users(users, graph, sg.name, 1) and _only_users(users, graph, su.name, 1)):
        return None
    attrs = {
        "act": act,
        "gate_first": gate_first,
        "out_type": out,
        "unfused": (gemm, sg, su, p),
        "input_names": tuple(gemm.inputs),
        "fused_ops": (*gemm.attrs.get("fused_ops", ("matmul",)), "slice", "slice", *p.attrs.get("fused_ops", (act, "mul"))),
        # the merged GEMM's work (both halves), which the profile's FLOP count cannot read off the halved output
        "flops": 2.0 * out.numel * w.shape[0] * 2,
    }
    return Node(p.name, "gated_gemm", tuple(gemm.inputs), out, attrs)


def fuse_gated_mlp(graph: Graph) -> Graph:
    """Replace each gated MLP projection (merged GEMM + slices + ``act(gate) * up``) with ``gated_gemm``."""
    nodes = graph.node_map()
    users = graph.users()
    found = {n.name: m for n in graph.nodes if n.op == "pointwise" and (m := _match(n, nodes, users, graph)) is not None}
    return substitute(graph, found)
