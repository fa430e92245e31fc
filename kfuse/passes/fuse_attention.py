"""Attention recognition: ``scaled_dot_product_attention`` and the explicit
matmul -> scale -> (+mask) -> softmax -> matmul chain become one ``fused_attention`` node.

The mask keeps its meaning (``attention_mask.classify`` evaluates the subgraph that builds it):
an all-allowed mask disappears, a causal one becomes the ``causal`` flag, a key-padding mask
computed from a ``[B, S]`` input becomes ``mask_kind="padding"`` reading that input directly
(the mask builder becomes dead code), and anything else stays a dense mask, with a note that
the report shows.

When Q, K and V are head-split views of ``[B, S, H*D]`` projections
(``permute(reshape(x, [B, S, H, D]), (0, 2, 1, 3))``) the node takes the projections (layout
``bshd``); when the output is merged back the same way, it returns ``[B, S, H*D]`` (``out_layout``
``bshd``, also for ``bhsd`` inputs such as rotary-embedded Q and K), or ``[S, B, H*D]`` when it is merged back
sequence first (``sbhd``: ``nn.MultiheadAttention`` with ``batch_first=False``). The kernel reads and writes
through strides, so no transpose is ever materialised.

Grouped-query attention (Llama, Mistral): K and V repeated to Q's heads by
``reshape(expand(reshape(x, [B, Hkv, 1, S, D]), [B, Hkv, G, S, D]), [B, H, S, D])`` (HF's
``repeat_kv``) are taken unrepeated, with ``kv_group = G``: the kernel reads kv head h // G, so the
repeated copies of K and V are never made. K and V with one head that broadcasts to Q's (multi-query
attention as Falcon writes it, no repeat) are read the same way, with ``kv_group = H``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.attention_mask import MaskInfo, classify
from kfuse.passes.simplify import dce, substitute
from kfuse.runtime import transformer_ops  # noqa: F401 - registers the fused ops and lowerings

_HEADS_FIRST = (0, 2, 1, 3)
_SEQ_FIRST = (2, 0, 1, 3)  # [B, H, S, D] -> [S, B, H, D]


@dataclass
class _Match:
    q: str
    k: str
    v: str
    k_transposed: bool  # k is K^T ([B, H, D, Sk]) in the explicit form
    mask: str | None
    scale: float | None
    causal: bool
    last: Node
    fused: list[str]
    mask2: str | None = None  # a second additive mask, summed with ``mask`` into one dense mask
    mask_allows: bool = False  # ``mask`` is a bool "may attend" mask (from a masked where), not added
    allowed_extra: str | None = None  # a "may attend" mask under the additive ``mask``: one of them must mean nothing
    q_scale: str | None = None  # a constant per-head scale of the scores, applied to Q before the kernel


def _single_user(users: dict[str, list[Node]], name: str, graph: Graph) -> Node | None:
    us = users.get(name, [])
    return us[0] if len(us) == 1 and name not in graph.outputs else None


def _scalar(graph: Graph, name: str) -> float | None:
    t = graph.constants.get(name)
    if t is None or t.numel() != 1:
        return None
    v = ops.scalar_value(t)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _match_sdpa(node: Node) -> _Match:
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    fused = [*node.attrs.get("folded", ()), "sdpa"]  # the query's scale, folded in by _fold_query_scale
    return _Match(q, k, v, False, mask, node.attrs.get("scale"), bool(node.attrs.get("is_causal", False)), node, fused)


def _fill_where(graph: Graph, node: Node | None) -> tuple[str, str, bool] | None:
    """(condition, scores, fills where True) of ``where(c, very negative, scores)`` (``masked_fill``) or
    ``where(c, scores, very negative)``: the two ways a mask ``where`` is written over the scores."""
    if node is None or node.op != "where" or len(node.inputs) != 3:
        return None
    for scores, fill, where_true in ((2, 1, True), (1, 2, False)):
        value = _scalar(graph, node.inputs[fill])
        if value is not None and value <= -1e4:
            return node.inputs[0], node.inputs[scores], where_true
    return None


def _causal_where(graph: Graph, node: Node | None) -> str | None:
    """The scores input of a causal-mask ``where``, or None: ``where(tril, scores, very negative)`` (GPT-Neo: a
    slice of a registered ``tril`` buffer) or ``where(triu(1), very negative, scores)`` (``masked_fill``: MPT),
    with a constant square condition that is the same causal pattern in every leading slice."""
    parsed = _fill_where(graph, node)
    if parsed is None or node is None or not isinstance(node.type, TensorType):
        return None
    cond_name, scores, where_true = parsed
    cond = graph.constants.get(cond_name)
    if cond is None or cond.dtype != torch.bool or cond.dim() < 2 or cond.shape[-1] != cond.shape[-2]:
        return None
    n = cond.shape[-1]
    if node.ttype.shape[-2:] != (n, n):
        return None
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    return scores if bool((cond.reshape(-1, n, n).cpu() == (~keep if where_true else keep)).all()) else None


def _per_head(graph: Graph, node: Node) -> bool:
    """``node`` multiplies the ``[B, H, Sq, Sk]`` scores by a constant that varies over the heads only."""
    c = graph.constants.get(node.inputs[1])
    t = graph.type_of(node.inputs[0])
    if c is None or c.dim() < 3 or c.dim() > 4 or not isinstance(t, TensorType) or t.rank != 4:
        return False
    shape = (1,) * (4 - c.dim()) + tuple(c.shape)
    return shape[0] == 1 and shape[1] == t.shape[1] and shape[2:] == (1, 1)


def _masked_where(graph: Graph, node: Node, nodes: dict[str, Node]) -> tuple[str | None, str] | None:
    """(allowed, scores) of ``where(~allowed, very negative, scores)`` or ``where(allowed, scores, very
    negative)``: the condition read as a bool "may attend" mask, the way SDPA reads one. A constant condition
    that never masks (DeBERTa called without a padding mask) gives ``allowed`` None; a causal one is
    ``_causal_where``'s (matched first); another constant ``allowed`` (GPT-Neo's local window) is the mask."""
    parsed = _fill_where(graph, node)
    cond = graph.type_of(node.inputs[0]) if parsed is not None else None
    if parsed is None or not isinstance(cond, TensorType) or cond.dtype != torch.bool:
        return None
    cond_name, scores, fills_where_true = parsed
    if scores in graph.constants:  # where(allowed, 0, min) builds an additive mask: it is not the scores
        return None
    const = graph.constants.get(cond_name)
    if const is not None:
        never = not bool(const.any()) if fills_where_true else bool(const.all())
        if never:
            return None, scores
        # a constant pattern that is not causal (GPT-Neo's local window): itself the "may attend" mask
        return None if fills_where_true else (cond_name, scores)
    if not fills_where_true:
        return cond_name, scores
    neg = nodes.get(cond_name)
    return (neg.inputs[0], scores) if neg is not None and neg.op == "logical_not" else None


def _match_explicit(pv: Node, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> _Match | None:
    """``pv = matmul(softmax(scale * (q @ kT) [+ mask]), v)`` with optional casts around the softmax, and a
    causal ``where`` (``_causal_where``) under the softmax, the mask add or the scale."""
    if pv.op != "matmul" or not isinstance(pv.type, TensorType) or pv.ttype.rank != 4:
        return None
    fused = ["matmul"]
    p = nodes.get(pv.inputs[0])
    if p is not None and p.op == "cast" and _single_user(users, p.name, graph):
        fused.append("cast")
        p = nodes.get(p.inputs[0])
    if p is None or p.op != "softmax" or p.attrs["dim"] != 3 or not _single_user(users, p.name, graph):
        return None
    fused.append("softmax")
    s = nodes.get(p.inputs[0])
    if s is not None and s.op == "cast" and _single_user(users, s.name, graph):
        fused.append("cast")
        s = nodes.get(s.inputs[0])
    if s is not None and s.op == "maximum" and _single_user(users, s.name, graph):
        floor = _scalar(graph, s.inputs[1])
        if floor is not None and floor <= -1e4:  # XGLM's max(scores, finfo.min): it only turns -inf into a finite floor
            fused.append("maximum")
            s = nodes.get(s.inputs[0])
    causal = False

    def peel_causal(n: Node | None) -> Node | None:
        """Past a causal where (at most one), noting it; ``n`` itself otherwise."""
        nonlocal causal
        scores = None if causal else _causal_where(graph, n)
        if n is None or scores is None or not _single_user(users, n.name, graph):
            return n
        causal = True
        fused.append("where")
        return nodes.get(scores)

    s = peel_causal(s)  # MPT: masked_fill over the biased scores, right under the softmax
    mask = mask2 = None
    masked = _masked_where(graph, s, nodes) if s is not None and _single_user(users, s.name, graph) else None
    allowed = None
    if masked is not None:  # DeBERTa: masked_fill(scores, ~mask, finfo.min), the mask from the input
        fused.append("where")
        allowed, scores = masked
        mask, s = allowed, nodes.get(scores)

    def split_add(n: Node) -> tuple[Node, str] | None:
        """(scores, mask) of ``scores + mask`` in either order."""
        a, b = (nodes.get(i) for i in n.inputs)

        def scores_like(x: Node | None) -> bool:
            return x is not None and (x.op in ("mul", "div", "matmul") or bool(_causal_where(graph, x) or _masked_where(graph, x, nodes)))

        if scores_like(a):
            return a, n.inputs[1]
        if scores_like(b):
            return b, n.inputs[0]
        return None

    if masked is None and s is not None and s.op == "add" and _single_user(users, s.name, graph):
        found = split_add(s)
        if found is None:  # (scores + m1) + m2: BLOOM's ALiBi bias, then its causal / padding mask
            inner = [(nodes.get(i), j) for i, j in zip(s.inputs, reversed(s.inputs), strict=True)]
            inner = [(n, j) for n, j in inner if n is not None and n.op == "add" and _single_user(users, n.name, graph)]
            found = split_add(inner[0][0]) if inner else None
            if found is None:
                return None
            mask2 = inner[0][1]
            fused.append("add")
        s, mask = found
        fused.append("add")
    s = peel_causal(s)  # GPT-Neo: the where under HF's additive padding mask
    allowed_extra = None
    if masked is None and mask2 is None and s is not None and _single_user(users, s.name, graph):
        under = _masked_where(graph, s, nodes)  # GPT-Neo's local layers: the window where under the padding mask
        if under is not None:
            fused.append("where")
            allowed_extra, scores = under
            s = nodes.get(scores)
    scale = 1.0
    q_scale = None
    if s is not None and s.op == "mul" and _single_user(users, s.name, graph) and _per_head(graph, s):
        q_scale = s.inputs[1]  # Swin-V2's learned per-head logit scale: multiplies Q's rows instead
        fused.append("mul")
        s = nodes.get(s.inputs[0])
    if s is not None and s.op in ("mul", "div") and _single_user(users, s.name, graph):
        c = _scalar(graph, s.inputs[1])
        if c is None or c == 0:
            return None
        scale = c if s.op == "mul" else 1.0 / c
        fused.append(s.op)
        s = nodes.get(s.inputs[0])
        s = peel_causal(s)  # GPT-J (older transformers): the where under the scale
    if s is None or s.op != "matmul" or not _single_user(users, s.name, graph):
        return None
    fused.append("matmul")
    q, kt = s.inputs
    k_scaled = nodes.get(kt)
    if k_scaled is not None and k_scaled.op in ("mul", "div") and _single_user(users, kt, graph):
        c = _scalar(graph, k_scaled.inputs[1])  # DeBERTa scales K^T, not the scores
        if c is not None and c != 0:
            scale *= c if k_scaled.op == "mul" else 1.0 / c
            fused.append(k_scaled.op)
            kt = k_scaled.inputs[0]
    k_transposed = True
    narrow = _upcast_qk(q, kt, pv.inputs[1], nodes, users, graph)
    if narrow is not None:  # GPT-Neo: Q and K cast up to fp32 for the scores; the kernel accumulates in fp32 anyway
        q, kt, k_transposed = *narrow, False
        fused += ["cast", "cast", "permute"]
    q_scaled = nodes.get(q)
    if q_scaled is not None and q_scaled.op in ("mul", "div") and _single_user(users, q, graph) and q_scale is None:
        c = _scalar(graph, q_scaled.inputs[1])  # ViTDet / SAM scale Q, not the scores
        if c is not None and c != 0:
            scale *= c if q_scaled.op == "mul" else 1.0 / c
            fused.append(q_scaled.op)
            q = q_scaled.inputs[0]
    qt, ktt = graph.type_of(q), graph.type_of(kt)
    if not (isinstance(qt, TensorType) and isinstance(ktt, TensorType) and qt.rank == 4 and ktt.rank == 4):
        return None
    if mask is None and allowed_extra is not None:  # the window where alone: it is the mask
        mask, allowed, allowed_extra = allowed_extra, allowed_extra, None
    return _Match(q, kt, pv.inputs[1], k_transposed, mask, scale, causal, pv, list(reversed(fused)), mask2, allowed is not None,
                  allowed_extra, q_scale)  # fmt: skip


def _upcast_qk(q: str, kt: str, v: str, nodes: dict[str, Node], users: dict[str, list[Node]], graph: Graph) -> tuple[str, str] | None:
    """(Q, K) in V's dtype, K untransposed, when ``q`` is ``cast(Q, fp32)`` and ``kt`` is ``cast(K, fp32)^T``
    with Q, K and V fp16 or bf16 (GPT-Neo scores in fp32). Products of fp16 values are exact in fp32, so the
    kernel's fp32 accumulation of the narrow operands computes the same scores."""
    vt = graph.type_of(v)
    perm = nodes.get(kt)
    if not isinstance(vt, TensorType) or vt.dtype not in (torch.float16, torch.bfloat16):
        return None
    if perm is None or perm.op != "permute" or tuple(perm.attrs["dims"]) != (0, 1, 3, 2) or not _single_user(users, kt, graph):
        return None

    def source(name: str) -> str | None:
        n = nodes.get(name)
        if n is None or n.op != "cast" or not _single_user(users, name, graph) or n.ttype.dtype != torch.float32:
            return None
        src = graph.type_of(n.inputs[0])
        return n.inputs[0] if isinstance(src, TensorType) and src.dtype == vt.dtype else None

    q16, k16 = source(q), source(perm.inputs[0])
    return (q16, k16) if q16 is not None and k16 is not None else None


def _shapes_match(graph: Graph, m: _Match) -> bool:
    """Q, K and V are ``[B, H, S, D]`` with the same batch, heads and head dim (K^T ``[B, H, D, Sk]``
    in the explicit form), and K and V have the same length: what the kernel computes. K and V with
    one head broadcast to Q's (multi-query attention: Falcon) are read with ``kv_group = H``. A
    broadcast batch dim, or a value head dim other than Q's, stays unfused. (Grouped-query K and V
    are matched here repeated to Q's heads; ``_ungrouped`` takes them apart afterwards; SDPA's
    ``enable_gqa`` takes them with H / G heads as they are.)"""
    ts = [graph.type_of(n) for n in (m.q, m.k, m.v)]
    if not all(isinstance(t, TensorType) and t.rank == 4 for t in ts):
        return False
    qt, kt, vt = (t.shape for t in ts)  # type: ignore[union-attr]
    k_len, k_dim = (kt[3], kt[2]) if m.k_transposed else (kt[2], kt[3])
    gqa = m.last.op == "sdpa" and m.last.attrs.get("enable_gqa") and kt[1] > 0 and qt[1] % kt[1] == 0  # SDPA's enable_gqa
    heads_ok = kt[1] == vt[1] and (kt[1] in (qt[1], 1) or bool(gqa))
    return qt[0] == kt[0] == vt[0] and heads_ok and k_dim == qt[3] == vt[3] and k_len == vt[2]


def _bool_additive_mask(graph: Graph, m: _Match) -> bool:
    """A bool mask added to the scores (explicit form) adds 0/1; the kernel would read it as "True = attend"."""
    if not m.k_transposed or m.mask is None or m.mask_allows:
        return False
    t = graph.type_of(m.mask)
    return isinstance(t, TensorType) and t.dtype == torch.bool


def _bshd_source(name: str, nodes: dict[str, Node], graph: Graph, dims: tuple[int, ...] = _HEADS_FIRST) -> str | None:
    """``x`` if ``name`` is ``permute(reshape(x [B, S, H*D] -> [B, S, H, D]), dims)``."""
    p = nodes.get(name)
    if p is None or p.op != "permute" or tuple(p.attrs["dims"]) != dims:
        return None
    r = nodes.get(p.inputs[0])
    if r is None or r.op != "reshape":
        return None
    src_t, r_t = graph.type_of(r.inputs[0]), r.ttype
    if not isinstance(src_t, TensorType) or src_t.rank != 3 or r_t.rank != 4:
        return None
    if src_t.shape[:2] != r_t.shape[:2] or src_t.shape[2] != r_t.shape[2] * r_t.shape[3]:
        return None
    return r.inputs[0]


def _gqa_source(name: str, nodes: dict[str, Node], graph: Graph) -> tuple[str, int] | None:
    """``(x, G)`` if ``name`` is x [B, Hkv, S, D] repeated G times per head:
    ``reshape(expand(reshape(x, [B, Hkv, 1, S, D]), [B, Hkv, G, S, D]), [B, Hkv * G, S, D])``."""
    r2 = nodes.get(name)
    e = nodes.get(r2.inputs[0]) if r2 is not None and r2.op == "reshape" else None
    r1 = nodes.get(e.inputs[0]) if e is not None and e.op == "expand" else None
    if r1 is None or r1.op != "reshape":
        return None
    x_t = graph.type_of(r1.inputs[0])
    if not isinstance(x_t, TensorType) or x_t.rank != 4:
        return None
    b, hkv, s, d = x_t.shape
    g = e.ttype.shape[2] if e.ttype.rank == 5 else 0
    if r1.ttype.shape != (b, hkv, 1, s, d) or e.ttype.shape != (b, hkv, g, s, d) or r2.ttype.shape != (b, hkv * g, s, d) or g < 2:
        return None
    return r1.inputs[0], g


def _ungrouped(m: _Match, nodes: dict[str, Node], graph: Graph) -> tuple[str, str, int]:
    """K and V without HF's ``repeat_kv`` (and the group size), when both are repeated alike."""
    if m.k_transposed:
        return m.k, m.v, 1
    gk, gv = _gqa_source(m.k, nodes, graph), _gqa_source(m.v, nodes, graph)
    if gk is None or gv is None or gk[1] != gv[1]:
        return m.k, m.v, 1
    return gk[0], gv[0], gk[1]


def _merged_output(last: Node, users: dict[str, list[Node]], graph: Graph) -> tuple[Node, str] | None:
    """The reshape that merges the heads back, and the layout it gives: ``reshape(permute(o, (0, 2, 1, 3)),
    [B, S, H*D] or [B*S, H*D])`` ("bshd"), or sequence first, ``reshape(permute(o, (2, 0, 1, 3)), [S, B, H*D] or
    [S*B, H*D])`` ("sbhd", ``nn.MultiheadAttention``)."""
    p = _single_user(users, last.name, graph)
    if p is None or p.op != "permute" or tuple(p.attrs["dims"]) not in (_HEADS_FIRST, _SEQ_FIRST):
        return None
    r = _single_user(users, p.name, graph)
    if r is None or r.op != "reshape":
        return None
    s0, s1, h, d = p.ttype.shape
    if r.ttype.shape not in ((s0, s1, h * d), (s0 * s1, h * d)):
        return None
    return r, "bshd" if tuple(p.attrs["dims"]) == _HEADS_FIRST else "sbhd"


def _scale_before_mask(graph: Graph) -> Graph:
    """``softmax((q @ kT + mask) * c)`` -> ``softmax(q @ kT * c + mask * c)``: CodeGen scales the scores after
    adding its mask, and the kernel adds the mask to scaled scores. Only for ``0 < |c| <= 1``, where the scaled
    mask cannot overflow (a ``finfo.min`` mask stays finite); a mask that several layers share is scaled once."""
    nodes, users = graph.node_map(), graph.users()
    emit: dict[str, list[Node]] = {}  # node name -> the nodes that take its place
    scaled_masks: dict[tuple[str, str, str], str] = {}
    for mul in graph.nodes:
        if mul.op not in ("mul", "div") or not isinstance(mul.type, TensorType) or mul.ttype.rank != 4:
            continue
        c = _scalar(graph, mul.inputs[1])
        if c is None or c == 0 or not abs(c if mul.op == "mul" else 1.0 / c) <= 1.0:
            continue
        reader = _single_user(users, mul.name, graph)
        if reader is not None and reader.op == "cast":
            reader = _single_user(users, reader.name, graph)
        add = nodes.get(mul.inputs[0])
        if reader is None or reader.op != "softmax" or add is None or add.op != "add" or not _single_user(users, add.name, graph):
            continue
        a, b = (nodes.get(i) for i in add.inputs)
        pos = 0 if a is not None and a.op == "matmul" else 1 if b is not None and b.op == "matmul" else None
        if pos is None:
            continue
        scores, mask = add.inputs[pos], add.inputs[1 - pos]
        key = (mask, mul.op, mul.inputs[1])
        new: list[Node] = []
        if key not in scaled_masks:
            scaled_masks[key] = f"{mul.name}_mask"
            mt = graph.type_of(mask)
            assert isinstance(mt, TensorType)
            new.append(
                Node(scaled_masks[key], mul.op, (mask, mul.inputs[1]), ops.infer_type(mul.op, [mt, graph.type_of(mul.inputs[1])], {}))
            )
        st = graph.type_of(scores)
        assert isinstance(st, TensorType)
        scaled = Node(f"{mul.name}_scores", mul.op, (scores, mul.inputs[1]), ops.infer_type(mul.op, [st, graph.type_of(mul.inputs[1])], {}))
        emit[mul.name] = [*new, scaled, Node(mul.name, "add", (scaled.name, scaled_masks[key]), mul.ttype)]
    if not emit:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        for n in emit.get(node.name, [node]):
            b.add_node(n)
    return dce(b.build(graph.outputs))


def _fold_query_scale(graph: Graph) -> Graph:
    """``sdpa(view(q * c), ...)`` -> ``sdpa(view(q), ..., scale=scale * c)``: OPT, BART, Whisper and BioGPT scale
    the query projection's output by ``head_dim ** -0.5`` and call SDPA with ``scale=1``; the multiply was a
    pointwise kernel of its own in every layer. Through reshapes and permutes that nothing else reads."""
    nodes, users = graph.node_map(), graph.users()
    new: dict[str, Node] = {}
    for sdpa in graph.nodes:
        if sdpa.op != "sdpa" or not isinstance(sdpa.type, TensorType):
            continue
        last, cur = sdpa, nodes.get(sdpa.inputs[0])  # walk up Q's views to the multiply
        while cur is not None and cur.op in ("reshape", "permute") and _single_user(users, cur.name, graph):
            last, cur = cur, nodes.get(cur.inputs[0])
        if cur is None or cur.op not in ("mul", "div") or not _single_user(users, cur.name, graph):
            continue
        c = _scalar(graph, cur.inputs[1])
        qt = graph.type_of(sdpa.inputs[0])
        if c is None or c == 0 or not isinstance(qt, TensorType) or graph.type_of(cur.inputs[0]) != cur.type:
            continue
        scale = sdpa.attrs.get("scale")
        scale = (1.0 / math.sqrt(qt.shape[-1]) if scale is None else float(scale)) * (c if cur.op == "mul" else 1.0 / c)
        q_ins = (cur.inputs[0], *last.inputs[1:])
        if last is not sdpa:  # the first view reads the unscaled projection
            new[last.name] = Node(last.name, last.op, q_ins, last.type, last.attrs)
        attrs = {**sdpa.attrs, "scale": scale, "folded": (*sdpa.attrs.get("folded", ()), cur.op)}
        new[sdpa.name] = Node(sdpa.name, "sdpa", q_ins if last is sdpa else sdpa.inputs, sdpa.type, attrs)
    return substitute(graph, new)


def fuse_attention(graph: Graph) -> Graph:
    """Replace every recognised attention with a ``fused_attention`` node."""
    graph = _fold_query_scale(_scale_before_mask(graph))
    nodes = graph.node_map()
    users = graph.users()
    replace: dict[str, list[tuple[str, str, tuple[str, ...], dict]]] = {}  # node name -> new nodes to emit there
    removed: set[str] = set()
    for node in graph.nodes:
        m = _match_sdpa(node) if node.op == "sdpa" else _match_explicit(node, nodes, users, graph) if node.op == "matmul" else None
        if m is None or not _shapes_match(graph, m) or _bool_additive_mask(graph, m):
            continue
        qt = graph.type_of(m.q)
        kt = graph.type_of(m.k)
        assert isinstance(qt, TensorType) and isinstance(kt, TensorType)
        vt = graph.type_of(m.v)
        if not isinstance(vt, TensorType) or not qt.dtype == kt.dtype == vt.dtype:  # the kernel reads one dtype
            continue
        b, h, sq, d = qt.shape
        sk = kt.shape[3] if m.k_transposed else kt.shape[2]
        classified = _classify_masks(graph, m, qt, sk)
        if classified is None:
            continue
        info, summed = classified
        scale = float(m.scale) if m.scale is not None else 1.0 / math.sqrt(d)
        k_dims = (0, 2, 3, 1) if m.k_transposed else _HEADS_FIRST
        k, v, group = _ungrouped(m, nodes, graph)
        if group == 1 and kt.shape[1] == 1:  # one K / V head broadcast to every query head (multi-query)
            group = h
        elif group == 1 and kt.shape[1] != h:  # SDPA's enable_gqa: K and V with H / G heads as they are
            group = h // kt.shape[1]
        # a Q scaled before the kernel (q_scale) is a new [B, H, S, D] value, not a view of the projection
        q_src = _bshd_source(m.q, nodes, graph) if m.q_scale is None else None
        srcs = (q_src, _bshd_source(k, nodes, graph, k_dims), _bshd_source(v, nodes, graph))
        merged_layout = _merged_output(m.last, users, graph)
        merged, merged_as = merged_layout if merged_layout is not None else (None, "bhsd")
        attrs = {
            "heads": h,
            "head_dim": d,
            "scale": scale,
            "causal": bool(m.causal or info.causal),
            "mask_kind": info.kind,
            "note": info.note,
            "fused_ops": tuple(m.fused),
        }
        if group > 1:
            attrs["kv_group"] = group
        mask_in = _mask_input(m, info)
        emit: list[tuple[str, str, tuple[str, ...], dict]] = []
        if m.q_scale is not None:  # (s_h q) . k = s_h (q . k): the per-head scale goes on Q, in Q's dtype
            sc, q_scaled = f"{m.last.name}_qscale", f"{m.last.name}_q"
            emit += [(sc, "cast", (m.q_scale,), {"dtype": qt.dtype}), (q_scaled, "mul", (m.q, sc), {})]
            m.q = q_scaled
        if summed and _both_float(graph, m.mask, m.mask2):  # the kernel adds both: no summed mask in memory
            mask_in = (m.mask, m.mask2)
            attrs["mask2"] = True
            attrs["note"] = "two additive masks"
        elif summed:
            mask_in = (f"{m.last.name}_mask",)
            emit.append((mask_in[0], "add", (m.mask, m.mask2), {}))
        if all(srcs):
            attrs["layout"] = "bshd"
            ins = tuple(s for s in srcs if s is not None) + mask_in
        else:
            attrs["layout"] = "bhsd"
            k_in = k
            if m.k_transposed:
                k_in = f"{m.last.name}_k"
                emit.append((k_in, "permute", (k,), {"dims": (0, 1, 3, 2)}))
            ins = (m.q, k_in, v) + mask_in
        if merged is not None:
            # the output merged back to [B, S, H*D] (or [S, B, H*D]): written there by the kernel
            attrs["out_layout"] = merged_as
            if merged.ttype.shape == ((b, sq, h * d) if merged_as == "bshd" else (sq, b, h * d)):
                emit.append((merged.name, "fused_attention", ins, attrs))
            else:
                tmp = f"{m.last.name}_merged"
                emit.append((tmp, "fused_attention", ins, attrs))
                emit.append((merged.name, "reshape", (tmp,), {"shape": merged.ttype.shape}))
            replace[merged.name] = emit
            removed.update({m.last.name, merged.inputs[0]})
        else:
            attrs["out_layout"] = "bhsd"
            emit.append((m.last.name, "fused_attention", ins, attrs))
            replace[m.last.name] = emit
    if not replace:
        return graph
    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        if node.name in replace:
            for name, op, ins, attrs in replace[node.name]:
                if op == "fused_attention":
                    t = _fused_type(b, ins, attrs)
                    attrs = dict(attrs, out_type=t)
                else:
                    t = _infer(b, op, ins, attrs)
                b.add_node(Node(name, op, ins, t, attrs))
        elif node.name not in removed:
            b.add_node(node)
    return dce(b.build(graph.outputs))


def _both_float(graph: Graph, a: str | None, b: str | None) -> bool:
    ts = [graph.type_of(x) for x in (a, b) if x is not None]
    return len(ts) == 2 and all(isinstance(t, TensorType) and t.rank <= 4 and t.dtype.is_floating_point for t in ts)


def _classify_masks(graph: Graph, m: _Match, qt: TensorType, sk: int) -> tuple[MaskInfo, bool] | None:
    """The mask's meaning, and whether two masks must be summed into one dense mask before the kernel. With two
    (BLOOM: ALiBi, then the causal / padding mask), one that means nothing but causality (the causal mask
    when no padding mask is passed) becomes the causal flag and the other is the mask (``m.mask`` is made
    that one); only two real masks are summed. None: a bool and an additive mask that both mean something
    (not fused)."""
    info = classify(graph, m.mask, qt, sk, additive=m.k_transposed and not m.mask_allows)
    other = m.allowed_extra if m.allowed_extra is not None else m.mask2
    if other is None:
        return info, False
    info2 = classify(graph, other, qt, sk, additive=m.allowed_extra is None and m.k_transposed)
    if info2.kind == "none":  # the other mask means nothing but (maybe) causality
        return replace(info, causal=info.causal or info2.causal), False
    if info.kind == "none":  # the other one is the mask
        m.mask, m.mask_allows = other, m.allowed_extra is not None
        return replace(info2, causal=info.causal or info2.causal), False
    if m.allowed_extra is not None:  # a bool and an additive mask that both mean something: not fused
        return None
    return MaskInfo("dense", note="two additive masks summed"), True  # the sum holds any causal part


def _mask_input(m: _Match, info: MaskInfo) -> tuple[str, ...]:
    if info.kind == "padding" and info.source is not None:
        return (info.source,)
    if info.kind == "dense" and m.mask is not None:
        return (m.mask,)
    return ()


def _infer(b: GraphBuilder, op: str, ins: tuple[str, ...], attrs: dict) -> TensorType:
    t = ops.infer_type(op, [b.type_of(i) for i in ins], attrs)
    assert isinstance(t, TensorType)
    return t


def _fused_type(b: GraphBuilder, ins: tuple[str, ...], attrs: dict) -> TensorType:
    q, v = b.type_of(ins[0]), b.type_of(ins[2])
    k = b.type_of(ins[1])
    assert isinstance(q, TensorType) and isinstance(v, TensorType) and isinstance(k, TensorType)
    b_, sq = (q.shape[0], q.shape[1]) if attrs["layout"] == "bshd" else (q.shape[0], q.shape[2])
    if attrs["out_layout"] == "bshd":
        return TensorType((b_, sq, attrs["heads"] * attrs["head_dim"]), q.dtype)
    if attrs["out_layout"] == "sbhd":
        return TensorType((sq, b_, attrs["heads"] * attrs["head_dim"]), q.dtype)
    return TensorType((b_, attrs["heads"], sq, attrs["head_dim"]), q.dtype)
