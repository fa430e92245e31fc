"""Padding-free execution: pack the valid tokens, run a packed subgraph, unpack with zero padding.

The ``varlen_region`` op (made by ``kfuse.passes.varlen``) holds a subgraph whose token-wise values
are ``[T, ...]`` (T valid tokens, rows in batch-major order). At run time:

1. ``valid = mask != 0``; ``lens`` and ``cu_seqlens`` (prefix sums) are computed on the GPU; T is
   read on the host (the one sync: it sizes the tensors, or picks the bucket). Eagerly the row
   indices of valid tokens come from ``nonzero`` (``token_index``); in a bucket's graph from
   prefix sums and a scatter (``device_token_index``);
2. token-shaped inputs are gathered to ``[T, ...]`` (inputs broadcast over batch, like position
   embeddings ``[1, S, H]``, are gathered through the broadcast, never materialised);
3. the packed subgraph runs (on the GPU: one CUDA graph per bucket of T, captured on first use,
   so the ~100 launches of a BERT encoder cost one replay; the bucket's graph also holds steps 1,
   2 and 4, computed without a host sync, so only reading T stays on the host);
4. outputs are scattered back to ``[B, S, ...]`` with zeros at padded positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.ir.graph import Graph, TensorType
from kfuse.runtime.cuda_graph import own_cublas_workspace

BUCKET = 64  # T is rounded up to a multiple of this for CUDA-graph reuse


@dataclass(frozen=True)
class Region:
    """The packed subgraph and how its inputs and outputs relate to the padded layout.

    ``modes[i]`` says how outer input ``i + 1`` (input 0 is the mask) enters the subgraph:
    ``"pack"`` (gather valid tokens; leading dims ``[B|1, S|1]`` or ``[B*S]``), ``"param"`` (as is).
    ``outputs[j]`` is the padded type of subgraph output ``j`` and ``flat[j]`` whether its token
    dims are one merged ``B*S`` dim."""

    graph: Graph
    batch: int
    seq: int
    modes: tuple[str, ...]
    in_flat: tuple[bool, ...]
    outputs: tuple[TensorType, ...]
    flat: tuple[bool, ...]

    def describe(self) -> str:
        counts = self.graph.op_counts()
        top = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:5])
        return f"packed subgraph [B={self.batch}, S={self.seq}]: {len(self.graph.nodes)} nodes ({top})"


def token_index(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(row indices of valid tokens in the flattened [B*S], cu_seqlens int32 [B+1], T)."""
    valid = mask != 0
    lens = valid.sum(1, dtype=torch.int32)
    cu = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(lens, 0, out=cu[1:])
    idx = torch.nonzero(valid.reshape(-1)).squeeze(1)  # the host sync: T is its length
    return idx, cu, int(idx.shape[0])


def pack(x: torch.Tensor, idx: torch.Tensor, batch: int, seq: int, flat: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """Gather the rows ``idx`` (indices into the flattened ``B*S`` tokens) of ``x``."""
    if flat:
        rows = x
    elif x.shape[0] == batch and x.shape[1] == seq:
        rows = x.reshape((batch * seq,) + tuple(x.shape[2:]))
    else:  # broadcast over batch or sequence: index through the broadcast
        b_i = idx // seq if x.shape[0] != 1 else torch.zeros_like(idx)
        s_i = idx % seq if x.shape[1] != 1 else torch.zeros_like(idx)
        g = x[b_i, s_i]
        if out is not None:
            out[: g.shape[0]].copy_(g)
            return out
        return g
    if out is not None:
        torch.index_select(rows, 0, idx, out=out[: idx.shape[0]])
        return out
    return torch.index_select(rows, 0, idx)


def unpack(y: torch.Tensor, idx: torch.Tensor, t: TensorType, flat: bool, n_valid: int) -> torch.Tensor:
    """Scatter the first ``n_valid`` rows of ``y`` to a zero tensor of the padded type ``t``."""
    rest = tuple(t.shape[1:]) if flat else tuple(t.shape[2:])
    n_rows = t.shape[0] if flat else t.shape[0] * t.shape[1]
    out = torch.zeros((n_rows,) + rest, dtype=y.dtype, device=y.device)
    out.index_copy_(0, idx, y[:n_valid])
    return out.reshape(t.shape)


SubRunner = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def run_region(region: Region, xs: Sequence[torch.Tensor], sub: SubRunner) -> tuple[torch.Tensor, ...]:
    """Pack, run ``sub`` on the packed inputs (+ cu_seqlens last), unpack."""
    mask, ext = xs[0], xs[1:]
    idx, cu, n = token_index(mask)
    packed = [
        pack(x, idx, region.batch, region.seq, f) if m == "pack" else x for x, m, f in zip(ext, region.modes, region.in_flat, strict=True)
    ]
    outs = sub(packed + [cu])
    return tuple(unpack(y, idx, t, f, n) for y, t, f in zip(outs, region.outputs, region.flat, strict=True))


def reference(xs: list[torch.Tensor], attrs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    from kfuse.ir.interpret import reference_run

    region: Region = attrs["region"]
    return run_region(region, xs, lambda ins: reference_run(region.graph, ins))


def device_token_index(mask: torch.Tensor, tb: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token indices for a bucket of ``tb >= T`` rows, computed without a host sync (so it can sit
    inside a CUDA graph): ``gather`` [tb] (row ``i < T`` = the i-th valid token; rows past T read
    some token, finite and ignored), ``scatter`` [tb] (the same, but rows past T point at the dummy
    row ``B*S``, so they never land on a real position), ``cu_seqlens`` int32 [B+1]."""
    valid = mask != 0
    lens = valid.sum(1, dtype=torch.int32)
    cu = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    torch.cumsum(lens, 0, out=cu[1:])
    flat = valid.reshape(-1)
    n_rows = flat.shape[0]
    slot = torch.where(flat, torch.cumsum(flat, 0) - 1, tb)  # valid token -> its packed row; padding -> slot tb
    slots = torch.full((tb + 1,), n_rows, dtype=torch.long, device=mask.device)
    slots.scatter_(0, slot.clamp(max=tb), torch.arange(n_rows, device=mask.device))
    scatter = slots[:tb]
    return scatter.clamp(max=n_rows - 1), scatter, cu


def scatter_unpack(y: torch.Tensor, scatter: torch.Tensor, t: TensorType, flat: bool) -> torch.Tensor:
    """``unpack`` for a bucket: rows of ``y`` go to ``scatter`` positions of a zero tensor with one
    dummy row at the end (where the rows past T land), returned without it."""
    rest = tuple(t.shape[1:]) if flat else tuple(t.shape[2:])
    n_rows = t.shape[0] if flat else t.shape[0] * t.shape[1]
    out = torch.zeros((n_rows + 1,) + rest, dtype=y.dtype, device=y.device)
    out.index_copy_(0, scatter, y[: scatter.shape[0]])
    return out[:n_rows].reshape(t.shape)


@dataclass
class _Bucket:
    """One bucket's graph and every tensor it reads or writes outside its own memory pool: the
    graph holds raw addresses, so a buffer it writes that nothing else keeps alive would go back to
    the caching allocator and each replay would write into whoever got that memory next (this is
    what crashed session 3's first in-graph version at S=512: ``packed`` was a local of
    ``_capture``)."""

    inputs: list[torch.Tensor]  # static copies of the region's inputs (mask first)
    packed: list[torch.Tensor | None]  # the packed inputs the graph writes, allocated before capture
    graph: torch.cuda.CUDAGraph | None
    outputs: list[torch.Tensor] = field(default_factory=list)


class BucketedRunner:
    """Runs a packed plan; on the GPU one CUDA graph per bucket of T (captured on first use).

    The only host work per call is reading T (one reduction and a sync) to pick the bucket; the
    token indices, the packing, the packed plan and the unpacking are all inside the bucket's graph
    (``device_token_index``, ``scatter_unpack``)."""

    def __init__(self, region: Region, run_plan: SubRunner, use_graphs: bool) -> None:
        self.region = region
        self.run_plan = run_plan
        self.use_graphs = use_graphs
        self.buckets: dict[int, _Bucket] = {}
        self.static_inputs: list[torch.Tensor] = []  # what every bucket's graph reads (mask first)
        self.note = ""

    def __call__(self, xs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # T is only known after a host sync, which a whole-plan capture cannot contain
            raise RuntimeError("varlen region: token count needs a host sync; it replays its own per-bucket CUDA graphs")
        if not self.use_graphs or not xs[0].is_cuda:
            return run_region(self.region, xs, self.run_plan)
        # every bucket's graph reads the same static copies of the (padded-shape) inputs: they are
        # refreshed in one launch before the sync, so after it only the graph launch is left
        if self.static_inputs:
            _refresh(self.static_inputs, xs)
        n = int(torch.count_nonzero(xs[0]))  # the one host sync: T picks the bucket
        tb = max(BUCKET, -(-n // BUCKET) * BUCKET)
        bucket = self.buckets.get(tb)
        if bucket is None:
            bucket = self._capture(tb, xs)
        if bucket.graph is None:
            return run_region(self.region, xs, self.run_plan)
        bucket.graph.replay()
        return tuple(o.clone() for o in bucket.outputs)  # the next replay overwrites the static outputs

    def _body(self, tb: int, xs: list[torch.Tensor], packed: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Index, pack, run, unpack: everything one bucket's graph holds."""
        r = self.region
        gather, scatter, cu = device_token_index(xs[0], tb)
        ins: list[torch.Tensor] = []
        for x, m, f, dst in zip(xs[1:], r.modes, r.in_flat, packed, strict=True):
            ins.append(pack(x, gather, r.batch, r.seq, f, out=dst) if m == "pack" else x)
        outs = self.run_plan(ins + [cu])
        return [scatter_unpack(y, scatter, t, f) for y, t, f in zip(outs, r.outputs, r.flat, strict=True)]

    def _capture(self, tb: int, xs: Sequence[torch.Tensor]) -> _Bucket:
        r = self.region
        if not self.static_inputs:
            self.static_inputs = [x.clone() for x in xs]
        inputs = self.static_inputs
        packed: list[torch.Tensor | None] = []
        for (_, t), x, m in zip(r.graph.inputs[:-1], xs[1:], r.modes, strict=True):
            packed.append(torch.empty((tb,) + tuple(t.shape[1:]), dtype=t.dtype, device=x.device) if m == "pack" else None)
        bucket = _Bucket(inputs, packed, None)
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # compiles and tunes the kernels, builds the packed plan's arena
                    self._body(tb, bucket.inputs, bucket.packed)
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            own_cublas_workspace(torch.cuda)
            with torch.cuda.graph(g, stream=stream):  # this device's stream (the process-wide default may be another GPU's)
                bucket.outputs = self._body(tb, bucket.inputs, bucket.packed)
            bucket.graph = g
        except Exception as e:  # capture is an optimisation: run eagerly
            self.note = f"bucket graph not captured ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            torch.cuda.synchronize()
        self.buckets[tb] = bucket
        return bucket


def _refresh(dst: list[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """Copy ``src`` into ``dst`` (one multi-tensor launch), skipping tensors that are already there."""
    pairs = [(d, x) for d, x in zip(dst, src, strict=True) if d.data_ptr() != x.data_ptr()]
    if pairs:
        torch._foreach_copy_([d for d, _ in pairs], [x for _, x in pairs])


def zero_padded_reference(graph: Graph, inputs: Sequence[torch.Tensor], refs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The reference outputs as padding-free mode defines them: graph outputs that a
    ``varlen_region`` unpacks are zero at padded positions (valid positions are unchanged)."""
    regions = [n for n in graph.nodes if n.op == "varlen_region"]
    if not regions:
        return refs
    by_input = dict(zip(graph.input_names, inputs, strict=False))
    from_region: dict[str, tuple[torch.Tensor, Region, int]] = {}
    for node in graph.nodes:
        if node.op == "getitem" and node.inputs[0] in {r.name for r in regions}:
            r = next(x for x in regions if x.name == node.inputs[0])
            from_region[node.name] = (by_input[r.inputs[0]], r.attrs["region"], node.attrs["index"])
    out = list(refs)
    for j, name in enumerate(graph.outputs):
        if name not in from_region or j >= len(out):
            continue
        mask, region, k = from_region[name]
        valid = (mask != 0).reshape(-1) if region.flat[k] else (mask != 0)
        ref = out[j]
        keep = valid.reshape(valid.shape + (1,) * (ref.dim() - valid.dim())).to(ref.device)
        out[j] = torch.where(keep, ref, torch.zeros((), dtype=ref.dtype, device=ref.device))
    return out
