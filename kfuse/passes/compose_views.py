"""Compose chains of view ops, so a chain whose eager form copies becomes one that does not.

``nn.MultiheadAttention`` (``F.multi_head_attention_forward``: torchvision's ViT, ``nn.TransformerEncoderLayer``,
WavLM) splits its packed ``[S, B, 3E]`` projection into heads with ``unflatten``, ``transpose``, ``select`` and
``view(S, B*H, D).transpose(0, 1)``. The ``view`` merges B with H, two dims whose strides are not one product apart,
so PyTorch copies Q, K and V there, and the attention reads the copies. Yet the chain as a whole only picks
elements of the projection at fixed strides: ``q[b, h, s, d] = proj[s, b, h*D + d]``.

The pass follows each chain of ``reshape``, ``permute``, ``select``, ``slice`` and ``expand`` back to the value it
views, composes it into one layout (every dim a list of ``(size, stride)`` parts, as CuTe's nested layouts), and
when the composite is one strided view of the base, writes it as ``reshape`` (the base's memory as it is) ->
``select`` (the fixed parts) -> ``permute`` -> ``reshape`` (merge parts a dim holds together). It rewrites a chain
only where the new one copies less than the old (the chain's own PyTorch run counts the copies, on meta tensors), or
as often but only in its last step where the old one copied earlier: WavLM's ``F.multi_head_attention_forward``
keeps Q as ``[B*H, S, D]``, and with the copy last it is the merge of a 4-D view that ``lift_head_batch`` lifts.
The new chain ends in a node of the old end's name, so its readers are unchanged; the old one is left to ``dce``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.passes.simplify import dce

VIEW_OPS = ("reshape", "permute", "select", "slice", "expand")

Part = tuple[int, int]  # (size, stride) in elements of the base's contiguous memory
Step = tuple[str, dict]  # (op, attrs) of one view op, as the IR writes it


class NotAView(Exception):
    """The chain is not one strided view of its base (or uses a form this model does not follow)."""


@dataclass
class Layout:
    """A view of a contiguous base: ``dims[i]`` lists dim i's parts, outermost first; no part has size 1."""

    dims: list[list[Part]]
    offset: int = 0

    @staticmethod
    def contiguous(shape: tuple[int, ...]) -> Layout:
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        return Layout([[(n, s)] if n != 1 else [] for n, s in zip(shape, strides, strict=True)])

    @staticmethod
    def of(base_shape: tuple[int, ...], steps: list[tuple[str, dict, tuple[int, ...]]]) -> Layout:
        """The layout ``steps`` (op, attrs, output shape) give a contiguous base; ``NotAView`` where they do not."""
        layout = Layout.contiguous(base_shape)
        for op, attrs, shape in steps:
            layout = layout.apply(op, attrs, shape)
        return layout

    def shape(self) -> tuple[int, ...]:
        return tuple(math.prod(n for n, _ in d) for d in self.dims)

    def apply(self, op: str, attrs: dict, out_shape: tuple[int, ...]) -> Layout:
        if op == "permute":
            return Layout([self.dims[i] for i in attrs["dims"]], self.offset)
        if op == "select":
            return self._select(attrs["dim"] % len(self.dims), attrs["index"])
        if op == "slice":
            return self._slice(attrs, out_shape)
        if op == "expand":
            lead = len(out_shape) - len(self.dims)
            dims: list[list[Part]] = [[(n, 0)] if n != 1 else [] for n in out_shape[:lead]]
            for d, n in zip(self.dims, out_shape[lead:], strict=True):
                size = math.prod(m for m, _ in d)
                dims.append(d if size == n else [(n, 0)])
            return Layout(dims, self.offset)
        if op == "reshape":
            return self._reshape(out_shape)
        raise NotAView(op)

    def _select(self, dim: int, index: int) -> Layout:
        parts = self.dims[dim]
        size = math.prod(n for n, _ in parts)
        i = index % size if size else 0
        offset = self.offset
        for n, s in reversed(parts):
            offset += (i % n) * s
            i //= n
        return Layout(self.dims[:dim] + self.dims[dim + 1 :], offset)

    def _slice(self, attrs: dict, out_shape: tuple[int, ...]) -> Layout:
        dim = attrs["dim"] % len(self.dims)
        parts = _merged(self.dims[dim])
        size = math.prod(n for n, _ in parts)
        start = attrs.get("start") or 0
        start = max(0, min(size, start + size if start < 0 else start))
        step = attrs.get("step", 1) or 1
        length = out_shape[dim]
        dims = list(self.dims)
        if length == size and step == 1:
            return self
        if not parts:  # a size-1 dim sliced to itself
            return self
        if len(parts) == 1:
            n, s = parts[0]
            dims[dim] = [(length, s * step)] if length != 1 else []
            return Layout(dims, self.offset + start * s)
        inner = math.prod(n for n, _ in parts[1:])
        if step != 1 or start % inner or length % inner:
            raise NotAView("slice across parts")
        n0, s0 = parts[0]
        dims[dim] = ([(length // inner, s0)] if length // inner != 1 else []) + parts[1:]
        return Layout(dims, self.offset + (start // inner) * s0)

    def _reshape(self, out_shape: tuple[int, ...]) -> Layout:
        seq = _merged([p for d in self.dims for p in d])  # a reshape sees one sequence: parts one stride apart are one
        seq.reverse()  # popped from the end: outermost first
        dims: list[list[Part]] = []
        for n in out_shape:
            parts: list[Part] = []
            left = n
            while left > 1:
                if not seq:
                    raise NotAView("reshape sizes")
                m, s = seq.pop()
                if m <= left:
                    if left % m:
                        raise NotAView("reshape sizes")
                    parts.append((m, s))
                    left //= m
                else:
                    if m % left:
                        raise NotAView("reshape sizes")
                    parts.append((left, s * (m // left)))
                    seq.append((m // left, s))
                    left = 1
            dims.append(parts)
        if seq:
            raise NotAView("reshape sizes")
        return Layout(dims, self.offset)


def _merged(parts: list[Part]) -> list[Part]:
    """Adjacent parts that are one stride apart, as one."""
    out: list[Part] = []
    for n, s in parts:
        if out and out[-1][1] == n * s:
            m, _ = out.pop()
            out.append((m * n, s))
        else:
            out.append((n, s))
    return out


def canonical_steps(base_shape: tuple[int, ...], layout: Layout) -> list[Step]:
    """``reshape -> select... -> permute -> reshape`` of a contiguous ``base_shape`` giving ``layout`` (steps
    that change nothing are left out). Raises ``NotAView`` where no such chain exists (overlapping or broadcast parts)."""
    total = math.prod(base_shape)
    dims = [_merged(d) for d in layout.dims]
    parts = [p for d in dims for p in d]
    if any(s == 0 for _, s in parts) or total == 0:
        raise NotAView("broadcast or empty")
    cuts = {1, total} | {s for _, s in parts} | {s * n for n, s in parts}
    bounds = sorted(cuts)
    if bounds[-1] != total or any(b % a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise NotAView("parts do not tile the base")
    factor_of = {b: i for i, b in enumerate(bounds[:-1])}  # stride -> factor index (innermost = 0)
    sizes = [b // a for a, b in zip(bounds, bounds[1:], strict=False)]
    owner: dict[int, int] = {}
    for k, (n, s) in enumerate(parts):
        f = factor_of[s]
        if sizes[f] != n or f in owner:  # a part spanning two factors, or two parts on one: they overlap
            raise NotAView("overlapping parts")
        owner[f] = k
    # the offset, digit by digit in the factors' mixed radix: the free factors' digits are the selects
    index, rest = [0] * len(sizes), layout.offset
    for f, n in enumerate(sizes):
        index[f], rest = rest % n, rest // n
    if rest or any(index[f] for f in owner):
        raise NotAView("offset inside a viewed part")
    steps: list[Step] = []
    factors = list(range(len(sizes)))[::-1]  # outermost first
    shape = tuple(sizes[f] for f in factors)
    if shape != tuple(base_shape):
        steps.append(("reshape", {"shape": shape}))
    kept = list(factors)
    for pos in reversed(range(len(factors))):  # from the innermost, so earlier positions stay put
        f = factors[pos]
        if f not in owner:
            steps.append(("select", {"dim": pos, "index": index[f]}))
            kept.remove(f)
    order = [kept.index(factor_of[s]) for _, s in parts]
    if order != list(range(len(order))):
        steps.append(("permute", {"dims": tuple(order)}))
    if tuple(sizes[factor_of[s]] for _, s in parts) != layout.shape() or len(parts) != len(layout.dims):
        steps.append(("reshape", {"shape": layout.shape()}))
    return steps


def copies(base_shape: tuple[int, ...], steps: list[tuple[str, dict, tuple[int, ...]]]) -> int:
    """How many of ``steps`` (op, attrs, output shape) copy when PyTorch runs them on a contiguous base."""
    x = torch.empty(base_shape, device="meta")
    n = 0
    for op, attrs, shape in steps:
        if op == "reshape":
            try:
                x = x.view(shape)
            except RuntimeError:
                n += 1
                x = torch.empty(shape, device="meta")
        elif op == "permute":
            x = x.permute(attrs["dims"])
        elif op == "select":
            x = x.select(attrs["dim"], attrs["index"])
        elif op == "slice":
            idx = [slice(None)] * x.dim()
            idx[attrs["dim"]] = slice(attrs.get("start"), attrs.get("end"), attrs.get("step", 1))
            x = x[tuple(idx)]
        elif op == "expand":
            x = x.expand(shape)
    return n


def _copies_last(base_shape: tuple[int, ...], steps: list[tuple[str, dict, tuple[int, ...]]]) -> bool:
    """The chain's one copy is its last step: everything before it is a view of the base, so a matcher sees the
    merge it ends with (``reshape(X, [B*H, S, D])`` of a 4-D ``X``: ``lift_head_batch``'s form)."""
    return copies(base_shape, steps) == 1 and copies(base_shape, steps[:-1]) == 0


def view_chain(end: Node, producer: dict[str, Node]) -> tuple[str, list[Node]]:
    """The base ``end`` views and the view ops from it to ``end``, first op first."""
    chain = [end]
    while True:
        p = producer.get(chain[-1].inputs[0])
        if p is None or p.op not in VIEW_OPS:
            return chain[-1].inputs[0], chain[::-1]
        chain.append(p)


def _shape_of(graph: Graph | GraphBuilder, name: str) -> tuple[int, ...] | None:
    t = graph.type_of(name)
    return t.shape if isinstance(t, TensorType) else None


def compose_views(graph: Graph) -> Graph:
    """Rewrite every view chain read by a non-view op whose composite copies less as one canonical chain."""
    producer = graph.node_map()
    users = graph.users()
    plans: dict[str, tuple[str, list[Step]]] = {}
    for node in graph.nodes:
        if node.op not in VIEW_OPS or not isinstance(node.type, TensorType):
            continue
        readers = users.get(node.name, [])
        if node.name not in graph.outputs and all(u.op in VIEW_OPS for u in readers):
            continue  # the middle of a longer chain: its end is rewritten
        base, chain = view_chain(node, producer)
        base_shape = _shape_of(graph, base)
        if base_shape is None or len(chain) < 2:
            continue
        old = [(n.op, dict(n.attrs), n.ttype.shape) for n in chain]
        if copies(base_shape, old) == 0:
            continue
        try:
            steps = canonical_steps(base_shape, Layout.of(base_shape, old))
        except NotAView:
            continue
        new = with_shapes(base_shape, steps)
        before, after = copies(base_shape, old), copies(base_shape, new)
        if after < before or (after == before and _copies_last(base_shape, new) and not _copies_last(base_shape, old)):
            plans[node.name] = (base, steps)
    if not plans:
        return graph
    b = GraphBuilder.from_graph(graph)
    made: dict[tuple, str] = {}  # (input, op, attrs) -> node, so Q, K and V share their first reshape
    for node in graph.nodes:
        if node.name not in plans:
            b.add_node(node)
            continue
        base, steps = plans[node.name]
        emit_steps(b, base, steps, node.ttype.shape, node.name, made)
    return dce(b.build(graph.outputs))


def emit_steps(
    b: GraphBuilder, base: str, steps: list[Step], shape: tuple[int, ...], name: str | None, made: dict[tuple, str] | None = None
) -> str:
    """Append ``steps`` on ``base``; the last node is called ``name`` (a fresh name when None). ``made`` shares
    nodes already emitted for the same input and step."""
    made = {} if made is None else made
    if not steps:  # the chain is its base: an identity view of it
        return b.op("reshape", [base], {"shape": shape}, name=name)
    cur = base
    for i, (op, attrs) in enumerate(steps):
        if i == len(steps) - 1:
            return b.op(op, [cur], attrs, name=name)
        key = (cur, op, tuple(sorted(attrs.items())))
        if key not in made:
            made[key] = b.op(op, [cur], attrs)
        cur = made[key]
    return cur


def with_shapes(base_shape: tuple[int, ...], steps: list[Step]) -> list[tuple[str, dict, tuple[int, ...]]]:
    x = torch.empty(base_shape, device="meta")
    out = []
    for op, attrs in steps:
        if op == "reshape":
            x = x.reshape(attrs["shape"])
        elif op == "select":
            x = x.select(attrs["dim"], attrs["index"])
        elif op == "permute":
            x = x.permute(attrs["dims"])
        out.append((op, attrs, tuple(x.shape)))
    return out
