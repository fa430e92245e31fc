"""Concatenations without copies: each input is made in (or copied once into) its slice of one buffer, and every
``cat`` whose inputs are consecutive slices of that buffer becomes a view of it.

DenseNet's dense layer k reads ``torch.cat`` of the block's input and all k - 1 features made so far, so a block of
L layers copies O(L^2) maps: DenseNet-121 at B32 224 px fp16 moves ~1.24 GB through its 58 cats. Inception's
blocks cat four branch convs, ShuffleNet-V2's a slice and a branch conv, a UNet's decoder a feature and a skip.

The plan keeps its steps, inputs and outputs; only some step functions change:

- a *slot writer* wraps the step that makes a member. A kernel that takes ``out=`` of any strides
  (``writes_strided_out``: the conv template, elementwise kernels) computes the member in its slice of the
  group's buffer; any other step runs as before and its result is copied into the slice. Either way the slice
  is the member's value from then on. The first member of each run allocates the buffer;
- a *view cat* checks at run time that its inputs are consecutive slices of one storage along its dim and
  returns the covering view; anything else (a tool that runs one step on values of its own) gets
  ``torch.cat``. So a wrong grouping costs a copy, never a wrong value.

A group is kept where it moves fewer bytes: the members that are copied must weigh less than the cats that
become views. A member, and a view cat that is not the widest (a strided channel prefix of the buffer), must be
read only by cats and by steps that take any strides (``STRIDED_READERS``), so no kernel that assumes a dense
input gets a slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kfuse.ir.graph import Graph, Node, TensorType

if TYPE_CHECKING:
    from kfuse.runtime.executor import Step

# templates whose steps take inputs of any strides: PyTorch's ops, generated pointwise kernels, views, and the conv
# template (pointer loads with the input's strides; its TMA descriptor is built from them and refused when unaligned)
# with its cuDNN candidates
STRIDED_READERS = ("pointwise", "torch", "fallback", "view", "conv_epilogue", "cudnn+epilogue")


@dataclass
class ConcatGroup:
    """One buffer: the widest cat's output, with each member's slice ``[start, start + length)`` along ``dim``."""

    root: str
    dim: int
    slots: dict[str, tuple[int, int]]
    views: list[str] = field(default_factory=list)  # the cats that read the buffer as a view (the root included)
    direct: list[str] = field(default_factory=list)  # members computed in their slice (the others are copied there)
    first: str = ""  # the member made first in the plan: it allocates the buffer of each run
    last: str = ""  # the member made last: the group lets go of the buffer after it
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    buffer: torch.Tensor | None = None

    def take(self, like: torch.Tensor, first: bool) -> torch.Tensor:
        """The run's buffer, on ``like``'s device and in its memory format: a new one for the first member (or when a
        tool runs a member on its own)."""
        b = self.buffer
        if first or b is None or b.device != like.device:
            fmt = torch.channels_last if like.dim() == 4 and _channels_last(like) else torch.contiguous_format
            b = torch.empty(self.shape, dtype=self.dtype, device=like.device, memory_format=fmt)
            self.buffer = b
        return b


def _channels_last(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


class SlotWriter:
    """A member's step: the original function, then a copy of its result into the member's slice."""

    def __init__(self, fn: Any, group: ConcatGroup, name: str) -> None:
        self.fn, self.group, self.name = fn, group, name
        self.start, self.length = group.slots[name]

    def __call__(self, xs: list[torch.Tensor]) -> torch.Tensor:
        g = self.group
        like = self.like(xs) if writes_direct(self.fn) else None
        if like is not None:
            buf = g.take(like, first=self.name == g.first)
            slot = buf.narrow(g.dim, self.start, self.length)
            y = self.fn(xs, out=slot)
            if y.data_ptr() != slot.data_ptr():  # a kernel that allocated after all
                slot.copy_(y)
        else:
            y = self.fn(xs)
            buf = g.take(y, first=self.name == g.first)
            slot = buf.narrow(g.dim, self.start, self.length)
            slot.copy_(y)
        if self.name == g.last:  # the views hold the buffer from here; the group does not keep it past the run
            g.buffer = None
        return slot

    @staticmethod
    def like(xs: list[torch.Tensor]) -> torch.Tensor | None:
        """What the buffer is laid out like before the member exists: a channels-last input if there is one (the conv
        template and elementwise kernels write channels-last where their input is), else the first tensor (None: no
        tensor input, so the member is made first and copied)."""
        ts = [t for t in xs if isinstance(t, torch.Tensor)]
        return next((t for t in ts if t.dim() == 4 and _channels_last(t)), ts[0] if ts else None)


def writes_direct(fn: Any) -> bool:
    """Whether a step function takes ``out=`` of any strides (``writes_strided_out``: the conv template, elementwise
    kernels), so a member is computed in its slice with no copy."""
    return bool(getattr(fn, "writes_strided_out", False))


def one_view(xs: list[torch.Tensor], dim: int) -> torch.Tensor | None:
    """The view of ``cat(xs, dim)`` where ``xs`` are consecutive slices of one storage along ``dim``, else None."""
    x0 = xs[0]
    if not isinstance(x0, torch.Tensor) or x0.numel() == 0:
        return None
    storage, stride = x0.untyped_storage().data_ptr(), x0.stride()
    step = stride[dim] * x0.element_size()
    ptr, total = x0.data_ptr(), 0
    for x in xs:
        if (
            not isinstance(x, torch.Tensor)
            or x.dtype != x0.dtype
            or x.stride() != stride
            or x.shape[:dim] != x0.shape[:dim]
            or x.shape[dim + 1 :] != x0.shape[dim + 1 :]
            or x.untyped_storage().data_ptr() != storage
            or x.data_ptr() != ptr + total * step
        ):
            return None
        total += x.shape[dim]
    shape = list(x0.shape)
    shape[dim] = total
    return x0.as_strided(shape, stride, x0.storage_offset())


class ViewCat:
    """A cat whose inputs are slices of one buffer: the covering view, or ``torch.cat`` when they are not."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def __call__(self, xs: list[torch.Tensor]) -> torch.Tensor:
        v = one_view(xs, self.dim)
        return v if v is not None else torch.cat(xs, self.dim)


def _nbytes(graph: Graph, v: str) -> int:
    t = graph.type_of(v)
    return t.numel * t.dtype.itemsize if isinstance(t, TensorType) else 0


def _cat_dim(graph: Graph, node: Node) -> int | None:
    """The dim a ``cat`` node joins along, where it can share a buffer (2+ distinct inputs of its dtype and rank)."""
    t = node.type
    if not isinstance(t, TensorType) or len(node.inputs) < 2 or len(set(node.inputs)) != len(node.inputs):
        return None
    for v in node.inputs:
        ti = graph.type_of(v)
        if not isinstance(ti, TensorType) or ti.dtype != t.dtype or len(ti.shape) != len(t.shape):
            return None
    dim = node.attrs.get("dim", 0)
    return dim % len(t.shape)


def plan_groups(graph: Graph, steps: list[Step]) -> list[ConcatGroup]:
    """The buffers to share: widest cats first; a cat whose inputs are a run of one group's consecutive slices
    is a view of it, one with only new members roots a group, any other stays a copy."""
    nodes = graph.node_map()
    cats = [i for i, s in enumerate(steps) if s.output in nodes and nodes[s.output].op == "cat"]
    if not cats:
        return []
    made_by = {s.output: i for i, s in enumerate(steps)}
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for v in s.inputs:
            readers.setdefault(v, []).append(i)
    outputs = set(graph.outputs)
    cat_outputs = {steps[i].output for i in cats}

    def strided_ok(v: str) -> bool:  # a non-dense slice may go to every reader of v
        return v not in outputs and all(
            steps[r].info.template in STRIDED_READERS or steps[r].output in cat_outputs for r in readers.get(v, [])
        )

    def member_ok(v: str) -> bool:  # made by a step (its value becomes a slice)
        return v in made_by and strided_ok(v)

    where: dict[str, ConcatGroup] = {}

    def leaves(v: str, dim: int) -> tuple[list[str], list[str]]:
        """(the maps, the inner cats) of ``v`` along ``dim``: a cat of cats (Inception's E blocks) is flattened, its
        inner cats becoming views of the same buffer, where they may hand a strided slice to their readers."""
        if v in cat_outputs and v not in where and _cat_dim(graph, nodes[v]) == dim and strided_ok(v):
            maps, inner = [], [v]
            for u in nodes[v].inputs:
                m, i = leaves(u, dim)
                maps, inner = maps + m, inner + i
            return maps, inner
        return [v], []

    def flat(name: str, dim: int) -> tuple[list[str], list[str]]:
        maps, inner = [], []
        for v in steps[made_by[name]].inputs:
            m, i = leaves(v, dim)
            maps, inner = maps + m, inner + i
        if len(set(maps)) != len(maps):  # a map twice (cat([x, cat([x, y])])): no flattening
            return list(steps[made_by[name]].inputs), []
        return maps, inner

    dims = {steps[i].output: _cat_dim(graph, nodes[steps[i].output]) for i in cats}
    width = {c: len(flat(c, d)[0]) if d is not None else 0 for c, d in dims.items()}
    groups: list[ConcatGroup] = []
    viewed: set[str] = set()
    for i in sorted(cats, key=lambda i: (-width[steps[i].output], -i)):
        name = steps[i].output
        dim = dims[name]
        if dim is None or name in viewed:
            continue
        ins = steps[i].inputs
        owners = {id(where[v]) if v in where else None for v in ins}
        if owners == {None}:
            maps, inner = flat(name, dim)
            if all(v not in where and member_ok(v) for v in maps):
                sizes = [graph.type_of(v).shape[dim] for v in maps]  # type: ignore[union-attr]
                starts = [sum(sizes[:k]) for k in range(len(sizes))]
                g = ConcatGroup(name, dim, {v: (s, n) for v, s, n in zip(maps, starts, sizes, strict=True)}, [name, *inner])
                g.shape, g.dtype = tuple(graph.type_of(name).shape), graph.type_of(name).dtype  # type: ignore[union-attr]
                groups.append(g)
                viewed.update(g.views)
                for v in maps:
                    where[v] = g
            continue
        if len(owners) != 1 or None in owners:
            continue
        g = where[ins[0]]
        runs = [g.slots[v] for v in ins]
        consecutive = all(runs[k][0] + runs[k][1] == runs[k + 1][0] for k in range(len(runs) - 1))
        if g.dim == dim and consecutive and strided_ok(name):
            g.views.append(name)
            viewed.add(name)

    def saves(g: ConcatGroup) -> bool:  # the cats' copies against the members that are copied, not computed in place
        copied = [v for v in g.slots if not writes_direct(steps[made_by[v]].fn)]
        return sum(_nbytes(graph, v) for v in copied) < sum(_nbytes(graph, c) for c in g.views)

    kept = [g for g in groups if saves(g)]
    for g in kept:
        order = sorted(g.slots, key=lambda v: made_by[v])
        g.first, g.last = order[0], order[-1]
        g.direct = [v for v in order if writes_direct(steps[made_by[v]].fn)]
    return kept


def place_concats(graph: Graph, steps: list[Step]) -> list[ConcatGroup]:
    """Make the groups' members write into their slices and their cats views. The steps are changed in place (their
    function and report entry), so what other stages attached to a step (a b2b decision and its sides) stays."""
    from kfuse.runtime.executor import KernelInfo

    groups = plan_groups(graph, steps)
    nodes = graph.node_map()
    member = {v: g for g in groups for v in g.slots}
    view = {c: g for g in groups for c in g.views}
    for s in steps:
        if s.output in member:
            g = member[s.output]
            lo, n = g.slots[s.output]
            note = f"{'written straight' if s.output in g.direct else 'copied'} into [{lo}, {lo + n}) of {g.root}"
            epilogue = f"{s.info.epilogue}; {note}" if s.info.epilogue else note
            s.info = KernelInfo(s.info.name, s.info.template, s.info.ops, s.info.config, epilogue)
            s.fn = SlotWriter(s.fn, g, s.output)
        elif s.output in view:
            g = view[s.output]
            lo = _first_slot(nodes, g, s.output)
            hi = lo + graph.type_of(s.output).shape[g.dim]  # type: ignore[union-attr]
            s.info = KernelInfo(s.info.name, "view", ("cat",), f"[{lo}, {hi}) of {g.root}'s buffer along dim {g.dim}")
            s.fn = ViewCat(g.dim)
    return groups


def _first_slot(nodes: dict[str, Node], g: ConcatGroup, cat: str) -> int:
    """Where a view cat starts in its group's buffer: its first input's slice, through inner cats."""
    v = cat
    while v not in g.slots:
        v = nodes[v].inputs[0]
    return g.slots[v][0]


def rewrap(current: Any, fn: Any) -> Any:
    """``fn`` in place of a step's function, keeping a member's slot writer around it (the b2b re-check swaps sides)."""
    return SlotWriter(fn, current.group, current.name) if isinstance(current, SlotWriter) else fn


def report(graph: Graph, groups: list[ConcatGroup]) -> dict[str, Any]:
    """What the groups save a call: bytes the cats would have copied (read + written) against the members' copies."""

    before = sum(2 * _nbytes(graph, c) for g in groups for c in g.views)
    after = sum(2 * _nbytes(graph, v) for g in groups for v in g.slots if v not in g.direct)
    return {"groups": len(groups), "view_cats": sum(len(g.views) for g in groups), "members": sum(len(g.slots) for g in groups),
            "members_in_place": sum(len(g.direct) for g in groups),
            "copy_mb_before": round(before / 2**20, 3), "copy_mb_after": round(after / 2**20, 3)}  # fmt: skip
