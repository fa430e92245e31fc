"""Static memory planning: liveness-based buffer reuse in one arena, in place where safe.

Steps whose function accepts an ``out=`` buffer (``fn.accepts_out``; called ``fn(xs, out)``)
get their output in a planned slice of one device arena; every other step allocates as
before. Values are grouped into *buffers*; a buffer lives from the step that writes it to the
last step that reads any value that may alias it:

- views (reshape, permute, slice, getitem, ...) and any op that may return its input (casts
  to the same dtype, ``contiguous``, fallbacks) may alias their inputs;
- GEMM/conv/fused kernels, reductions and elementwise ops write fresh tensors.

A buffer that may reach a graph output is not planned (outputs must survive the next call).
In place: an elementwise kernel (``fn.inplace_inputs``) may write into the buffer of an
operand of the same shape and element size whose last use is that step. Offsets come from a
greedy best fit over buffers sorted by size, so two buffers share bytes only when their
lifetimes do not overlap. ``check_plan`` verifies exactly that (the property tests use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, TensorType

if TYPE_CHECKING:
    from kfuse.runtime.executor import Plan

ALIGN = 256
_FRESH_KINDS = (ops.GEMM, ops.CONV, ops.FUSED, ops.REDUCTION)
_MAY_ALIAS_ELEMENTWISE = ("identity", "cast")


@dataclass
class Buffer:
    nbytes: int
    start: int  # step that writes it first
    end: int  # last step that reads it (through any alias)
    values: list[str] = field(default_factory=list)
    offset: int = -1


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    value_buffer: dict[str, int]  # planned value -> buffer index
    arena_bytes: int
    inplace: list[tuple[str, str]]  # (output, operand whose storage it reuses)
    peak_bytes: int  # arena + the largest set of live unplanned tensors (estimate)
    peak_bytes_unplanned: int  # the same graph with no planning (estimate, allocator-style)
    dead_after: list[list[int]] = field(default_factory=list)  # buffers whose lifetime ends at step i

    def report(self) -> dict[str, Any]:
        return {
            "planned_values": len(self.value_buffer),
            "buffers": len(self.buffers),
            "arena_mb": round(self.arena_bytes / 2**20, 3),
            "inplace": len(self.inplace),
            "peak_activation_mb": round(self.peak_bytes / 2**20, 3),
            "peak_activation_mb_unplanned": round(self.peak_bytes_unplanned / 2**20, 3),
        }


def _nbytes(t: TensorType) -> int:
    return t.numel * t.dtype.itemsize


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def may_alias(graph: Graph, name: str) -> bool:
    """Can the value ``name`` share storage with one of its node's inputs?"""
    node = graph.node_map().get(name)
    if node is None:
        return False
    d = ops.REGISTRY.get(node.op)
    if d is None:
        return True
    if d.kind == ops.ELEMENTWISE:
        return node.op in _MAY_ALIAS_ELEMENTWISE
    return d.kind not in _FRESH_KINDS


def plan_memory(plan: Plan) -> MemoryPlan:
    """Assign arena offsets to the outputs of steps that accept ``out=`` buffers."""
    graph = plan.graph
    nodes = graph.node_map()
    steps = plan.steps
    n = len(steps)
    end_of_time = n
    last_use: dict[str, int] = {}
    for i, s in enumerate(steps):
        for v in s.inputs:
            last_use[v] = i
    for o in graph.outputs:
        last_use[o] = end_of_time

    fresh_alias = {s.output: may_alias(graph, s.output) for s in steps}
    candidates: dict[str, TensorType] = {}
    for s in steps:
        t = nodes[s.output].type if s.output in nodes else None
        if getattr(s.fn, "accepts_out", False) and isinstance(t, TensorType) and t.numel > 0:
            candidates[s.output] = t

    # roots: the planned values whose storage each value may share
    def roots_of(planned: set[str]) -> dict[str, set[str]]:
        roots: dict[str, set[str]] = {}
        for s in steps:
            if s.output in planned:
                roots[s.output] = {s.output}
            elif fresh_alias.get(s.output, True):
                r: set[str] = set()
                for v in s.inputs:
                    r |= roots.get(v, set())
                roots[s.output] = r
            else:
                roots[s.output] = set()
        return roots

    planned = set(candidates)
    while True:  # a planned value that may reach a graph output is not planned
        roots = roots_of(planned)
        escaping = {r for o in graph.outputs for r in roots.get(o, set())}
        if not escaping:
            break
        planned -= escaping
    end: dict[str, int] = {}
    for v, rs in roots.items():
        for r in rs:
            end[r] = max(end.get(r, -1), last_use.get(v, -1))
    step_of = {s.output: i for i, s in enumerate(steps)}

    buffers: list[Buffer] = []
    value_buffer: dict[str, int] = {}
    inplace: list[tuple[str, str]] = []
    for i, s in enumerate(steps):
        v = s.output
        if v not in planned:
            continue
        t = candidates[v]
        size = _align(_nbytes(t))
        stop = max(end.get(v, i), i)
        reused, reused_from = None, ""
        for j in getattr(s.fn, "inplace_inputs", ()):
            u = s.inputs[j]
            b = value_buffer.get(u)
            if b is None or buffers[b].end != i or buffers[b].nbytes != size:
                continue
            if any(u in roots.get(w, set()) for w in s.inputs if w != u):  # the operand is also read through a view
                continue
            reused, reused_from = b, u
            break
        if reused is not None:
            buffers[reused].end = stop
            buffers[reused].values.append(v)
            value_buffer[v] = reused
            inplace.append((v, reused_from))
            continue
        buffers.append(Buffer(size, i, stop, [v]))
        value_buffer[v] = len(buffers) - 1

    arena = _assign_offsets(buffers)
    dead_after: list[list[int]] = [[] for _ in range(n)]
    for k, b in enumerate(buffers):
        if b.end < n:
            dead_after[b.end].append(k)
    peak = arena + _peak_unplanned(graph, steps, set(value_buffer), fresh_alias, last_use, step_of)
    unplanned = estimate_peak(graph)
    return MemoryPlan(buffers, value_buffer, arena, inplace, peak, unplanned, dead_after)


def _assign_offsets(buffers: list[Buffer]) -> int:
    """Greedy best fit: biggest first, lowest offset free for the buffer's whole lifetime."""
    placed: list[Buffer] = []
    top = 0
    for b in sorted(buffers, key=lambda x: (-x.nbytes, x.start)):
        busy = sorted((p.offset, p.offset + p.nbytes) for p in placed if not (p.end < b.start or b.end < p.start))
        off = 0
        for lo, hi in busy:
            if off + b.nbytes <= lo:
                break
            off = max(off, hi)
        b.offset = off
        placed.append(b)
        top = max(top, off + b.nbytes)
    return top


def _peak_unplanned(graph: Graph, steps: list[Any], planned: set[str], fresh_alias: dict[str, bool],
                    last_use: dict[str, int], step_of: dict[str, int]) -> int:  # fmt: skip
    """Largest total of live fresh tensors the caching allocator holds besides the arena."""
    nodes = graph.node_map()
    live = 0
    peak = 0
    ends: dict[int, int] = {}
    for i, s in enumerate(steps):
        t = nodes[s.output].type if s.output in nodes else None
        if s.output not in planned and not fresh_alias.get(s.output, True) and isinstance(t, TensorType):
            nb = _nbytes(t)
            live += nb
            stop = last_use.get(s.output, i)
            ends[stop] = ends.get(stop, 0) + nb
        peak = max(peak, live)
        live -= ends.pop(i, 0)
    return peak


def estimate_peak(graph: Graph) -> int:
    """Peak bytes of fresh intermediate tensors when each is freed after its last use
    (what eager PyTorch's allocator holds, ignoring fragmentation); views cost nothing."""
    nodes = graph.nodes
    last: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            last[v] = i
    for o in graph.outputs:
        last[o] = len(nodes)
    # a view keeps its base alive: extend the base's lifetime to the view's
    base: dict[str, str] = {}
    for node in nodes:
        if may_alias(graph, node.name) and node.inputs:
            base[node.name] = base.get(node.inputs[0], node.inputs[0])
    for v, b in base.items():
        last[b] = max(last.get(b, -1), last.get(v, -1))
    live = peak = 0
    ends: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node.name not in base and isinstance(node.type, TensorType):
            nb = _nbytes(node.type)
            live += nb
            stop = last.get(node.name, i)
            ends[stop] = ends.get(stop, 0) + nb
        peak = max(peak, live)
        live -= ends.pop(i, 0)
    return peak


def check_plan(mp: MemoryPlan) -> None:
    """Raise AssertionError if two buffers with overlapping lifetimes share any byte."""
    for a_i, a in enumerate(mp.buffers):
        assert a.offset >= 0 and a.offset % ALIGN == 0 and a.offset + a.nbytes <= mp.arena_bytes
        for b in mp.buffers[a_i + 1 :]:
            lifetimes_overlap = not (a.end < b.start or b.end < a.start)
            bytes_overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            assert not (lifetimes_overlap and bytes_overlap), f"buffers {a.values} and {b.values} share storage while both live"


def arena_view(arena: torch.Tensor, buf: Buffer, ttype: TensorType) -> torch.Tensor:
    """The planned tensor: ``ttype``'s shape and dtype over the buffer's bytes."""
    raw = arena[buf.offset : buf.offset + _nbytes(ttype)]
    return raw.view(ttype.dtype).view(ttype.shape)
