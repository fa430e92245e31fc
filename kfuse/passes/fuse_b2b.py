"""Back-to-back fusion: chains of ``gemm_epilogue`` (``conv_epilogue``) nodes become one
``b2b_chain`` node run by the persistent template of ``kfuse.kernels.b2b`` (Bolt's persistent
kernel fusion). Runs after ``fuse_epilogue``, so each stage already carries its epilogue.

A link ``P -> C`` (C reads P's result as its A operand / input image) joins a chain when:

* P's result has no other reader and is not a graph output (the intermediate never needs to
  exist in global memory),
* both weights are constant 2-D matrices (GEMM) / 4-D filters (conv), in the intermediate's dtype,
* threadblock residence holds: P's width N0 <= ``MAX_RESIDENT`` (256), or the chain is two
  GEMMs whose intermediate can be made and consumed in column chunks (``b2b_chunked_kernel``:
  K0 and N1 <= 256, 16-byte rows; any N0), and then it stops at two stages,
* conv chains: C is a 1x1 convolution with stride 1, no padding, groups 1 (P may be any KxK).

Chains grow link by link (MLPs of 3+ layers fuse as far as every intermediate is resident).
Every candidate link that does not fuse gets the reason in the producer's ``b2b`` attribute,
and ``b2b_report`` collects fused chains and reasons for ``compiled.report["b2b"]``.

Whether the fused kernel is actually used is decided at lowering (``kfuse.kernels.b2b.lower_b2b_chain``, registered on import):
on a GPU, fused and unfused are both measured and the faster is kept; elsewhere, fused by rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, ValueType
from kfuse.kernels.b2b import MAX_RESIDENT, Chain, Stage, chunked_eligible
from kfuse.kernels.codegen import as_pair
from kfuse.kernels.conv import conv_operand_count

STAGE_OPS = ("gemm_epilogue", "conv_epilogue")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _b2b_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    """Run the original stage nodes one after the other (the oracle and the torch path)."""
    env = dict(zip(a["input_names"], xs, strict=True))
    out = None
    for n in a["unfused"]:
        out = ops.run_reference(n.op, [env[i] for i in n.inputs], n.attrs)
        env[n.name] = out
    return out


def _out_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    return a["out_type"]


ops.register("b2b_chain", ops.FUSED, infer=_out_type)(_b2b_ref)


def _stage_reason(node: Node, g: Graph, first: bool) -> str | None:
    """Why ``node`` cannot be a stage of a chain (None: it can)."""
    if "epilogue" not in node.attrs:
        return f"{node.name} has no epilogue program"
    w = g.constants.get(node.inputs[1])
    if w is None:
        return f"weight {node.inputs[1]} of {node.name} is not a constant"
    out_t = node.type
    if not isinstance(out_t, TensorType) or out_t.dtype not in _DTYPES:
        return f"{node.name}: output type {out_t} not supported"
    if node.op == "gemm_epilogue":
        if w.dim() != 2:
            return f"{node.name} is a batched GEMM (weight rank {w.dim()})"
    else:
        if w.dim() != 4 or int(node.attrs.get("groups", 1)) != 1:
            return f"{node.name} is a grouped convolution"
        if node.attrs.get("in_scale"):
            return f"{node.name} transforms its input loads (squeeze-excitation scale or norm + ReLU)"
        if any(node.attrs.get("pad_end") or ()):
            return f"{node.name} pads more at the bottom / right than at the top / left"
        if not first:
            kh, kw = w.shape[2], w.shape[3]
            if (kh, kw) != (1, 1):
                return f"second conv {node.name} is {kh}x{kw} (only 1x1 convs can consume a resident tile)"
            if as_pair(node.attrs.get("stride"), 1) != (1, 1):
                return f"second conv {node.name} has stride {as_pair(node.attrs.get('stride'), 1)}"
            if as_pair(node.attrs.get("padding"), 0) != (0, 0):
                return f"second conv {node.name} is padded {as_pair(node.attrs.get('padding'), 0)}"
    return None


def _wide_reason(p: Node, c: Node, g: Graph, first_link: bool) -> str | None:
    """Why an intermediate wider than ``MAX_RESIDENT`` cannot be made and consumed in column
    chunks (``b2b_chunked_kernel``), or None when it can: a two-stage GEMM chain (the link is
    the chain's first, and the chain ends with it) with K0 and N1 in one tile and 16-byte rows."""
    width = _width(p)
    why = f"N0={width} of {p.name} > {MAX_RESIDENT}: no threadblock residence"
    if p.op != "gemm_epilogue":
        return why + " (chunked residence: GEMM chains only)"
    if not first_link:
        return why + " (chunked residence: only a chain's first link)"
    k0 = int(g.constants[p.inputs[1]].shape[0])
    n1 = int(c.ttype.shape[-1])
    chunk_why = chunked_eligible(False, [int(width), n1], k0, p.ttype.dtype.itemsize)
    return None if chunk_why is None else f"{why}, and {chunk_why}"


def _link_reason(p: Node, c: Node, g: Graph, users: dict[str, list[Node]], first_link: bool = True) -> str | None:
    """Why the link ``p -> c`` does not fuse (None: it does). ``first_link``: ``p`` starts the chain."""
    if p.op != c.op:
        return f"{p.op} -> {c.op}: mixed GEMM/conv chain"
    readers = users.get(p.name, [])
    if p.name in g.outputs:
        return f"intermediate {p.name} is a graph output"
    n_reads = sum(i == p.name for r in readers for i in r.inputs)
    if n_reads != 1:
        return f"intermediate {p.name} is used {n_reads} times"
    why = _stage_reason(c, g, first=False)
    if why:
        return why
    if _width(p) > MAX_RESIDENT:
        why = _wide_reason(p, c, g, first_link)
        if why:
            return why
    wc = g.constants[c.inputs[1]]
    if wc.dtype != p.ttype.dtype:
        return f"weight of {c.name} is {wc.dtype}, intermediate {p.name} is {p.ttype.dtype}"
    return None


def _width(n: Node) -> int:
    return int(n.ttype.shape[1] if n.op == "conv_epilogue" else n.ttype.shape[-1])


def _n_conv_inputs(n: Node) -> int:
    if n.op == "conv_epilogue":
        return conv_operand_count(n.attrs)
    return 2


def _fuse(chain: list[Node], g: Graph) -> Node:
    conv = chain[0].op == "conv_epilogue"
    stages = tuple(Stage(n.attrs["epilogue"], n.ttype.dtype, conv and bool(n.attrs.get("has_bias"))) for n in chain)
    inputs: list[str] = []
    for n in chain:
        inputs += [i for k, i in enumerate(n.inputs) if not (k == 0 and n is not chain[0])]
    last = chain[-1]
    widths = [_width(n) for n in chain]
    attrs: dict[str, Any] = {
        "chain": Chain(stages, conv),
        "out_type": last.type,
        "fused_ops": tuple(op for n in chain for op in n.attrs.get("fused_ops", (n.op,))),
        "unfused": tuple(chain),
        "input_names": tuple(inputs),
        "widths": tuple(widths),
        "b2b": f"fused {len(chain)} stages ({' -> '.join(n.name for n in chain)}), widths {'/'.join(map(str, widths))}",
    }
    if conv:
        for k in ("stride", "padding", "dilation"):
            if k in chain[0].attrs:
                attrs[k] = chain[0].attrs[k]
    return Node(last.name, "b2b_chain", tuple(inputs), last.type, attrs)


def _with_reason(n: Node, reason: str) -> Node:
    attrs = dict(n.attrs)
    attrs["b2b"] = "not fused: " + reason
    return Node(n.name, n.op, n.inputs, n.type, attrs)


def fuse_b2b(graph: Graph) -> Graph:
    """Replace each eligible chain of epilogue-GEMMs (convs) by one ``b2b_chain`` node."""
    users = graph.users()
    consumers: dict[str, list[Node]] = {}  # stage node -> stage nodes reading it as operand 0
    for n in graph.nodes:
        if n.op in STAGE_OPS and n.inputs:
            consumers.setdefault(n.inputs[0], []).append(n)
    taken: set[str] = set()
    reasons: dict[str, str] = {}
    chains: list[list[Node]] = []
    for node in graph.nodes:
        if node.op not in STAGE_OPS or node.name in taken:
            continue
        if node.name not in consumers:
            continue  # nothing reads it as a stage input: not a candidate
        first_why = _stage_reason(node, graph, first=True)
        if first_why:
            reasons[node.name] = first_why
            continue
        chain = [node]
        while True:
            nxt = [c for c in consumers.get(chain[-1].name, []) if c.name not in taken]
            if not nxt:
                break
            if len(nxt) > 1:
                reasons[chain[-1].name] = f"intermediate {chain[-1].name} is used {len(users.get(chain[-1].name, []))} times"
                break
            why = _link_reason(chain[-1], nxt[0], graph, users, first_link=len(chain) == 1)
            if why:
                reasons[chain[-1].name] = why
                break
            chain.append(nxt[0])
            if _width(chain[0]) > MAX_RESIDENT:  # chunked residence: a two-stage chain
                if nxt[0].name in consumers:
                    reasons[nxt[0].name] = f"{chain[0].name}'s intermediate is chunked (> {MAX_RESIDENT} wide): two stages only"
                break
        if len(chain) >= 2:
            chains.append(chain)
            taken.update(n.name for n in chain)
    if not chains and not reasons:
        return graph
    fused_at = {}
    for ch in chains:
        f = _fuse(ch, graph)
        if ch[-1].name in reasons:  # the chain stopped here: say why it did not grow further
            attrs = dict(f.attrs)
            attrs["b2b_stopped"] = reasons.pop(ch[-1].name)
            f = Node(f.name, f.op, f.inputs, f.type, attrs)
        fused_at[ch[-1].name] = f
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in fused_at:
            b.add_node(fused_at[node.name])
        elif node.name in taken:
            continue
        elif node.name in reasons:
            b.add_node(_with_reason(node, reasons[node.name]))
        else:
            b.add_node(node)
    return b.build(graph.outputs)


def b2b_report(plan: Any) -> dict[str, Any]:
    """The report's ``b2b`` section: fused chains (with the lowering's decision and residence)
    and the candidate links that were not fused, with the reason."""
    steps = {s.output: s for s in plan.steps}
    fused, not_fused = [], []
    for n in plan.graph.nodes:
        if n.op == "b2b_chain":
            step = steps.get(n.name)
            d = dict(getattr(step, "b2b", None) or {})
            entry = {"node": n.name, "stages": [s.name for s in n.attrs["unfused"]], "widths": list(n.attrs["widths"]), **d}
            if "b2b_stopped" in n.attrs:
                entry["stopped"] = n.attrs["b2b_stopped"]
            fused.append(entry)
        elif isinstance(n.attrs.get("b2b"), str):
            not_fused.append({"node": n.name, "reason": n.attrs["b2b"].removeprefix("not fused: ")})
    return {"fused": fused, "not_fused": not_fused}
