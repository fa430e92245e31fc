"""A decode step's RMSNorm folded into the GEMMs that read it.

In a decoder layer at batch 1-16 each RMSNorm is its own launch over a few rows, between two GEMMs: a 1.1B
Llama's decode step runs 44 of them (plus the final one), a few microseconds each, when the step's floor is
the weights' bytes over the bandwidth (~0.49 ms on the H200). The norm is a row scale and a column scale::

    rms_norm(x, w) @ W  =  rsqrt(mean(x^2) + eps)[:, None] * (x @ (w[:, None] * W))

so the column scale ``w`` folds into the constant weight (``W' = diag(w) W``, made here once) and the row scale
is a per-row factor of the GEMM's output. A ``gemm_epilogue`` or ``gated_gemm`` reading the norm then reads the
norm's input ``x`` and the folded weight, and carries ``row_rms = eps``: kfuse's skinny GEMM computes the rows'
scale itself, from the ``x`` it reads anyway (``kernels/skinny_gemm.py``); its other candidates (the tiled
template, cuBLAS, the unfused gated pair) run the weightless norm kernel first, so the lowering's measured race
still decides, and no candidate is lost.

The fold applies where every reader of the norm can take it (so the norm's launch disappears): an RMSNorm
without addends or bias, a constant weight vector, few rows (``skinny_gemm.MAX_ROWS``), and readers that are
GEMMs with the norm as their A operand and a constant weight (``[K, N]``, or a transposed ``[N, K]`` view of
one) that nothing else reads, so folding copies no weight another node still needs (a vocabulary projection
tied to the embedding keeps its norm).

The folded weight is stored ``[N, K]`` and read through a transposing view, whatever the layout it came in:
``merge_gemm``'s merged QKV and gate/up weights are row-major ``[K, N]``, and a few-row GEMM streams its weight
in K slices, which read whole 128-byte runs of a column when K is contiguous. Session 49 (H100, the gated
gate/up form with the row scale at M = 1): 19.4 us with K contiguous, 25.7 row-major.
"""

from __future__ import annotations

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.kernels.skinny_gemm import MAX_ROWS
from kfuse.passes.simplify import dce

_READERS = ("gemm_epilogue", "gated_gemm")


def _foldable_norm(n: Node, graph: Graph) -> bool:
    a = n.attrs
    if n.op != "fused_norm" or not a.get("rms") or a.get("n_add") or a.get("has_bias") or not a.get("has_weight"):
        return False
    if a.get("post_add") or a.get("row_index") or len(n.inputs) != 2 or n.name in graph.outputs:
        return False
    w = graph.constants.get(n.inputs[1])
    t = n.type
    return w is not None and w.dim() == 1 and isinstance(t, TensorType) and t.rank >= 1 and t.numel // max(1, t.shape[-1]) <= MAX_ROWS


def _weight(b: str, graph: Graph, nodes: dict[str, Node], users: dict[str, list[Node]]) -> tuple[str, Node | None] | None:
    """(the constant holding the weight ``b``, the transposing permute between them or None), where one node alone
    reads the weight; else None."""
    if b in graph.constants:
        const, perm = b, None
    else:
        perm = nodes.get(b)
        if perm is None or perm.op != "permute" or tuple(perm.attrs.get("dims", ())) != (1, 0) or perm.inputs[0] not in graph.constants:
            return None
        if len(users.get(b, [])) != 1 or b in graph.outputs:
            return None
        const = perm.inputs[0]
    t = graph.constants[const]
    if t.dim() != 2 or const in graph.outputs or len(users.get(const, [])) != 1:
        return None
    return const, perm


def _reader_weight(
    u: Node, norm: str, width: int, graph: Graph, nodes: dict[str, Node], users: dict[str, list[Node]]
) -> tuple[str, Node | None] | None:  # fmt: skip
    """``_weight`` of a reader that can take the fold (a GEMM reading the norm as A, a 2-D ``[width, N]`` weight);
    None for any other reader."""
    if u.op not in _READERS or u.inputs[0] != norm or norm in u.inputs[1:] or u.attrs.get("row_rms") is not None:
        return None
    if u.op == "gated_gemm" and len(u.inputs) != 2:
        return None
    b_t = graph.type_of(u.inputs[1])
    if not (isinstance(b_t, TensorType) and b_t.rank == 2 and b_t.shape[0] == width):
        return None
    return _weight(u.inputs[1], graph, nodes, users)


def _eps(n: Node, graph: Graph) -> float:
    """The norm's eps; without one (``nn.RMSNorm``'s default), ``torch.finfo`` of its input's dtype, as F.rms_norm uses."""
    eps = n.attrs.get("eps")
    if eps is not None:
        return float(eps)
    t = graph.type_of(n.inputs[0])
    assert isinstance(t, TensorType)
    return float(torch.finfo(t.dtype).eps)


def _scaled(const: torch.Tensor, w: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``diag(w) W`` for ``W = const`` (``[K, N]``) or ``const.T`` (``const`` ``[N, K]``), in fp32, rounded once."""
    wf = w.to(const.device, torch.float32)
    scaled = const.float() * (wf[None, :] if transposed else wf[:, None])
    return scaled.to(const.dtype)


def fold_row_norm(graph: Graph) -> Graph:
    """Fold each few-row RMSNorm whose readers all allow it into those readers (see the module's docstring)."""
    nodes = graph.node_map()
    users = graph.users()
    # reader name -> (the norm it reads, eps, the reader's weight constant, the transposing permute or None)
    plans: dict[str, tuple[Node, float, str, Node | None]] = {}
    for n in graph.nodes:
        if not _foldable_norm(n, graph):
            continue
        readers = users.get(n.name, [])
        weights = [_reader_weight(u, n.name, n.ttype.shape[-1], graph, nodes, users) for u in readers]
        if readers and all(w is not None for w in weights):
            for u, (const, perm) in zip(readers, weights, strict=True):  # type: ignore[misc]
                plans[u.name] = (n, _eps(n, graph), const, perm)
    if not plans:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name not in plans:
            b.add_node(node)
            continue
        norm, eps, const, perm = plans[node.name]
        x, w_name = norm.inputs
        scaled = _scaled(graph.constants[const], graph.constants[w_name], perm is not None)
        if perm is None:  # a row-major [K, N] (merge_gemm's QKV, gate/up): stored [N, K] and read through a transposing view
            perm = Node(b.fresh(f"{const}_rms_folded_T"), "permute", ("",), graph.type_of(const), {"dims": (1, 0)})
            scaled = scaled.t().contiguous()
        folded = b.add_constant(scaled, b.fresh(f"{const}_rms_folded"))
        # the transposed view: the kernels read [K, N] through its strides, each column's K values contiguous
        weight = b.add_node(Node(b.fresh(perm.name), "permute", (folded,), perm.type, perm.attrs))
        attrs = {**node.attrs, "row_rms": eps, "fused_ops": (*norm.attrs.get("fused_ops", ("rms_norm",)), *node.attrs.get("fused_ops", ()))}
        if node.op == "gated_gemm":  # its unfused side: the weightless norm, then the GEMM on the folded weight
            attrs |= _unfused_with_norm(node, norm, x, weight)
        b.add_node(Node(node.name, node.op, (x, weight, *node.inputs[2:]), node.type, attrs))
    return dce(b.build(graph.outputs))


def _unfused_with_norm(node: Node, norm: Node, x: str, weight: str) -> dict:
    """A gated node's ``unfused`` chain and ``input_names`` after the fold: the norm (its weight now in the GEMM's)
    computes the value the merged GEMM reads, from the node's new first input."""
    gemm, *rest = node.attrs["unfused"]
    weightless = Node(norm.name, "fused_norm", (x,), norm.type, {**norm.attrs, "has_weight": False})
    gemm = Node(gemm.name, gemm.op, (norm.name, weight, *gemm.inputs[2:]), gemm.type, gemm.attrs)
    return {"unfused": (weightless, gemm, *rest), "input_names": (x, weight)}
