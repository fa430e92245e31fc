"""RMSNorm written out in elementwise ops becomes one ``rms_norm`` node.

Hugging Face's decoders (Llama, Mistral, Qwen2, ...) do not call ``torch.nn.functional.rms_norm``;
they write it out, and an exported graph holds the pieces::

    xf = x.to(float32)                      # fp16/bf16 models only
    r  = rsqrt(mean(xf * xf, -1, keepdim=True) + eps)
    y  = w * (xf * r).to(x.dtype)           # the weight optional (a constant 1 + w is folded to one)

Left so, the generic pointwise kernel computes it, and nothing downstream knows it is a norm. As one ``rms_norm``
node it runs on the norm template (``fuse_norm``) and, in a decode step, folds into the GEMMs that read it
(``fold_row_norm``). The norm template rounds once, after the weight; the written-out form rounds before it:
the two differ by at most one unit in the last place of the output's dtype. Not matched: a 16-bit model that
multiplies by the weight in fp32 before the cast back (Gemma), and constants of more than the weight's one dim.
"""

from __future__ import annotations

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.passes.simplify import substitute


def _users_are(users: dict[str, list[Node]], graph: Graph, v: str, expected: set[str]) -> bool:
    """``v`` is read by exactly the nodes named in ``expected`` (each any number of times) and is no output."""
    return v not in graph.outputs and {n.name for n in users.get(v, [])} == expected


def _constant_scalar(graph: Graph, v: str) -> float | None:
    """A 0-d floating constant's value (a one-element tensor of higher rank could broadcast the result up a rank)."""
    t = graph.constants.get(v)
    if t is None or t.dim() != 0 or not t.dtype.is_floating_point:
        return None
    value = ops.scalar_value(t)
    return float(value) if value is not None else None


def _weight(graph: Graph, v: str, n: int, dtype: torch.dtype) -> bool:
    """``v`` is a constant weight vector ``[n]`` in the output's dtype (``rms_norm``'s weight has the normalised shape)."""
    t = graph.constants.get(v)
    return t is not None and t.dtype == dtype and tuple(t.shape) == (n,)


def _match(out: Node, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> tuple[Node, set[str]] | None:
    """The ``rms_norm`` node computing ``out``'s value and the names of the nodes it replaces, or None."""
    if not isinstance(out.type, TensorType) or not out.ttype.dtype.is_floating_point or out.ttype.rank < 1:
        return None
    width, out_dtype = out.ttype.shape[-1], out.ttype.dtype
    chain: list[Node] = []  # the nodes after the first, each to be read only by the next
    node, w = out, None
    if node.op == "mul" and len(node.inputs) == 2:  # the weight, either side
        for i in (0, 1):
            if _weight(graph, node.inputs[i], width, out_dtype) and node.inputs[1 - i] in nodes:
                w, node = node.inputs[i], nodes[node.inputs[1 - i]]
                chain.append(out)
                break
    down = None
    if node.op == "cast" and node.inputs[0] in nodes:
        down, node = node, nodes[node.inputs[0]]
        chain.append(down)
    if node.op != "mul" or len(node.inputs) != 2:
        return None
    scaled = node
    chain.append(scaled)
    for xf, r in (scaled.inputs, scaled.inputs[::-1]):
        rsqrt = nodes.get(r)
        if rsqrt is None or rsqrt.op != "rsqrt":
            continue
        add = nodes.get(rsqrt.inputs[0])
        if add is None or add.op != "add" or len(add.inputs) != 2:
            continue
        for mean_v, eps_v in (add.inputs, add.inputs[::-1]):
            mean, eps = nodes.get(mean_v), _constant_scalar(graph, eps_v)
            if mean is None or eps is None or mean.op != "mean" or not mean.attrs.get("keepdim") or mean.attrs.get("dtype"):
                continue
            sq = nodes.get(mean.inputs[0])
            t = graph.type_of(xf)
            if sq is None or not isinstance(t, TensorType) or tuple(mean.attrs.get("dims") or ()) not in ((t.rank - 1,), (-1,)):
                continue
            squares = (sq.op == "mul" and tuple(sq.inputs) == (xf, xf)) or (
                sq.op == "pow" and sq.inputs[0] == xf and _constant_scalar(graph, sq.inputs[1]) == 2.0
            )
            if not squares or t.shape[-1] != width or t.dtype != torch.float32:
                continue
            # every intermediate read once, by the next step; the (up-cast) input by the square and the scaling only
            steps = [(sq, mean), (mean, add), (add, rsqrt), (rsqrt, scaled)] + list(zip(chain[::-1][:-1], chain[::-1][1:], strict=True))
            if not all(_users_are(users, graph, a.name, {b.name}) for a, b in steps):
                continue
            x = xf
            up = nodes.get(xf)
            if up is not None and up.op == "cast":  # a 16-bit model's up-cast: the norm reads the 16-bit value
                if not _users_are(users, graph, xf, {sq.name, scaled.name}):
                    continue  # the fp32 copy is read elsewhere too: it stays
                x = up.inputs[0]
            else:
                up = None
            x_t = graph.type_of(x)
            if not isinstance(x_t, TensorType) or x_t.dtype != out_dtype:
                continue  # a norm computed in fp32 and kept so, or a 16-bit chain without the cast back: not this form
            if (x_t.dtype == torch.float32) != (down is None):
                continue
            attrs = {"normalized_shape": (width,), "eps": eps}
            covered = {n.name for n in (sq, mean, add, rsqrt, *chain)} | ({xf} if up is not None else set())
            return Node(out.name, "rms_norm", (x, w) if w is not None else (x,), out.type, attrs), covered
    return None


def recognize_rms_norm(graph: Graph) -> Graph:
    """Replace each written-out RMSNorm (see the module's docstring) with one ``rms_norm`` node."""
    nodes = graph.node_map()
    users = graph.users()
    new: dict[str, Node] = {}
    taken: set[str] = set()
    for node in reversed(graph.nodes):  # the last node of a norm first: its weight's multiply, not the scaling
        if node.op not in ("mul", "cast") or node.name in taken:
            continue
        found = _match(node, nodes, users, graph)
        if found is not None:
            new[node.name], covered = found
            taken |= covered
    return substitute(graph, new)
