"""LayerNorm / RMSNorm fusion: ``layer_norm(x + a1 + a2 ...)`` becomes one ``fused_norm`` node
(the ``kfuse.kernels.norm`` template), absorbing a tree of single-use adds in front of it: bias,
residual, position and token-type embeddings. Addends may be broadcast over leading dims only
(``[1, S, N]`` against ``[B, S, N]``). Runs after epilogue fusion: a GEMM's bias and residual are
then already in its epilogue and the norm reads the GEMM output once.

Every ``layer_norm``/``rms_norm`` over the last dim becomes a ``fused_norm`` (with no addends if
none fit), so all of them run on the template.
"""

from __future__ import annotations

from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.kernels.norm import MAX_ADDENDS
from kfuse.passes.simplify import substitute
from kfuse.runtime import transformer_ops  # noqa: F401 - registers fused_norm and its lowering


def _leading_broadcast(t: TensorType, out: TensorType) -> bool:
    shape = (1,) * (out.rank - t.rank) + t.shape
    if len(shape) != out.rank or shape[-1] != out.shape[-1]:
        return False
    i = 0
    while i < out.rank - 1 and shape[i] == 1 and out.shape[i] != 1:
        i += 1
    return shape[i:] == out.shape[i:]


def _add_leaves(
    root: str, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph, out: TensorType
) -> tuple[list[str], list[str]]:
    """Leaves of the single-use add tree computing ``root`` (root itself if it is no such add), and the adds."""
    leaves: list[str] = []
    adds: list[str] = []

    def visit(v: str, is_root: bool) -> None:
        n = nodes.get(v)
        single = is_root or (len(users.get(v, [])) == 1 and v not in graph.outputs)
        if n is not None and n.op == "add" and single and n.ttype.shape == out.shape and n.ttype.dtype.is_floating_point:
            adds.append(v)
            for i in n.inputs:
                visit(i, False)
        else:
            leaves.append(v)

    visit(root, True)
    return leaves, adds


# The template holds a row in registers (BLOCK_N = the next power of two): 16384 fp32 values are 64 a thread
# at 8 warps; a longer row (a norm over a whole image's C x H x W) would spill, and stays PyTorch's.
MAX_FEATURES = 16384


def fuse_norms(graph: Graph) -> Graph:
    """Replace each last-dim ``layer_norm``/``rms_norm`` (and the adds feeding it) with ``fused_norm``."""
    nodes = graph.node_map()
    users = graph.users()
    new: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op not in ("layer_norm", "rms_norm") or not isinstance(node.type, TensorType):
            continue
        out = node.ttype
        if tuple(node.attrs["normalized_shape"]) != (out.shape[-1],) or out.shape[-1] > MAX_FEATURES:
            continue
        x = node.inputs[0]
        ins_root = users.get(x, [])
        leaves, adds = [x], []
        if len(ins_root) == 1 and x not in graph.outputs:
            leaves, adds = _add_leaves(x, nodes, users, graph, out)
        full = [v for v in leaves if _type(graph, v).shape == out.shape and _type(graph, v).dtype.is_floating_point]
        ok = (
            len(leaves) <= MAX_ADDENDS + 1
            and full
            and all(_type(graph, v).dtype.is_floating_point and _leading_broadcast(_type(graph, v), out) for v in leaves)
        )
        if not ok:
            leaves, adds = [x], []
        first = full[0] if ok else x
        addends = [v for v in leaves if v != first] if ok else []
        if len(addends) != len(leaves) - 1:  # the same value twice: keep duplicates as addends
            addends = list(leaves)
            addends.remove(first)
        w = node.inputs[1] if len(node.inputs) > 1 else None
        bias = node.inputs[2] if len(node.inputs) > 2 and node.op == "layer_norm" else None
        attrs = {
            "rms": node.op == "rms_norm",
            "eps": node.attrs.get("eps", 1e-5 if node.op == "layer_norm" else None),
            "n_add": len(addends),
            "has_weight": w is not None,
            "has_bias": bias is not None,
            "out_type": out,
            "fused_ops": tuple(["add"] * len(adds) + [node.op]),
        }
        ins = (first, *addends) + tuple(i for i in (w, bias) if i is not None)
        new[node.name] = Node(node.name, "fused_norm", ins, out, attrs)
    return substitute(graph, new)


def _type(graph: Graph, v: str) -> TensorType:
    t = graph.type_of(v)
    assert isinstance(t, TensorType)
    return t


def fuse_norm_residuals(graph: Graph) -> Graph:
    """``add(fused_norm(...), r)`` becomes one ``fused_norm`` that adds ``r`` to its output (``post_add``), when
    the add is the norm's only reader and ``r`` has the output's type: a post-norm residual (Swin-V2's
    ``x + LayerNorm(attention(x))`` and ``x + LayerNorm(mlp(x))``), which otherwise ran as its own kernel
    over a value the norm had just written."""
    nodes = graph.node_map()
    users = graph.users()
    new: dict[str, Node] = {}
    for add in graph.nodes:
        if add.op != "add" or len(add.inputs) != 2 or not isinstance(add.type, TensorType):
            continue
        for v, r in (add.inputs, add.inputs[::-1]):
            n = nodes.get(v)
            if n is None or n.op != "fused_norm" or n.attrs.get("post_add") or v == r:
                continue
            if len(users.get(v, [])) != 1 or v in graph.outputs or n.ttype != add.ttype or graph.type_of(r) != add.ttype:
                continue
            tail = (n.inputs[-1],) if n.attrs.get("row_index") else ()  # the row index stays last
            body = n.inputs[:-1] if tail else n.inputs
            attrs = {**n.attrs, "post_add": True, "fused_ops": (*n.attrs.get("fused_ops", ()), "add")}
            new[add.name] = Node(add.name, "fused_norm", (*body, r, *tail), add.type, attrs)
            break  # the norm, read by the add alone, is dropped with it
    return substitute(graph, new)
