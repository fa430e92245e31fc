"""Padding-free mode (ByteTransformer): run every token-wise op on the valid tokens only.

kfuse learns the lengths from the attention-mask input that ``fuse_attention`` proved to be a
key-padding mask (``mask_kind="padding"``): at run time the valid-token offsets are prefix sums of
that mask, computed on the GPU inside the compiled plan (``kfuse.runtime.varlen``).

The pass finds the **token-wise region**: nodes whose values have leading token dims ``[B, S]``
(or one merged ``B*S`` dim, as GPT-2's Conv1D reshapes make) and that treat every token on its
own: elementwise ops, GEMMs (plain or with epilogue), norms, embeddings, reshapes and slices that
keep the token dims, and padding-masked attention, which becomes ``varlen_attention`` over
``cu_seqlens``. The region grows forward from the token-shaped graph inputs (``input_ids``), so
embeddings run on valid tokens too. It is replaced by one ``varlen_region`` node that packs its
inputs, runs the packed subgraph and unpacks its outputs (zeros at padded positions); whatever
reads those outputs (a pooler's ``select``) runs unchanged on the padded layout.

Where eager PyTorch has (meaningless but defined) values at padded positions, the region's outputs
have zeros, so an op outside the region that reads padded positions (unmasked mean pooling
``h.mean(1)``, last-token pooling ``h[:, -1]``) would change the model's result. In automatic mode
(``Options.varlen=None``) the rewrite is therefore made only when every value leaving the region is a
graph output (padded positions of returned hidden states are zero: the documented behaviour) or is
read outside only at sequence position 0 (``h[:, 0]``, ``h[:, :1]``: CLS pooling, BERT's pooler; with
right padding, position 0 of every non-empty sequence is valid). Otherwise the graph stays as it is
and the padding-masked attention's ``note`` says why (``compiled.report["kernels"]``, ``explain``).
``varlen=True`` rewrites anyway (the caller accepts zeros at padded positions) and the region's
report entry carries the same warning.

Outputs at valid positions equal the padded model's: every region op is row-independent except
attention, and a key-padding mask lets a valid query see exactly the valid keys of its sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from kfuse.compiler import Options
from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType, freeze_attrs
from kfuse.passes.simplify import dce
from kfuse.runtime import transformer_ops  # noqa: F401 - registers the fused ops
from kfuse.runtime.executor import KernelInfo, Step, lower, lowering
from kfuse.runtime.varlen import BucketedRunner, Region
from kfuse.runtime.varlen import reference as region_reference


def _region_type(types: list[Any], a: Any) -> Any:
    return a["out_type"]


ops.register("varlen_region", ops.FUSED, infer=_region_type)(region_reference)

_TOKENWISE = {"matmul", "gemm_epilogue", "fused_norm", "layer_norm", "rms_norm", "embedding", "reshape", "slice", "fused_attention"}


class _Analysis:
    def __init__(self, graph: Graph, mask: str, batch: int, seq: int) -> None:
        self.g, self.mask, self.B, self.S = graph, mask, batch, seq
        self.layout: dict[str, str] = {}  # region value -> "bs" | "flat"

    def ttype(self, v: str) -> TensorType | None:
        t = self.g.type_of(v)
        return t if isinstance(t, TensorType) else None

    def out_layout(self, t: TensorType, allow_flat: bool) -> str | None:
        if t.rank >= 2 and t.shape[:2] == (self.B, self.S):
            return "bs"
        if allow_flat and t.rank >= 1 and t.shape[0] == self.B * self.S:
            return "flat"
        return None

    def packable(self, t: TensorType, lay: str) -> bool:
        """An outside value that can be gathered per token into a value of layout ``lay``."""
        if lay != "bs" or t.rank < 2:
            return False
        return t.shape[0] in (1, self.B) and t.shape[1] in (1, self.S) and (t.shape[0], t.shape[1]) != (1, 1)

    def param(self, v: str, out: TensorType, lay: str) -> bool:
        """A value that is the same for every token (broadcast over the token dims)."""
        t = self.ttype(v)
        if t is None:
            return False
        token_dims = 2 if lay == "bs" else 1
        lead = out.rank - t.rank
        if lead >= token_dims:
            return True
        return all(t.shape[i] == 1 for i in range(token_dims - lead)) and v in self.g.constants

    def external_ok(self, v: str, out: TensorType, lay: str) -> str | None:
        """How an outside operand of a region node enters: "param", "pack" or None (cannot)."""
        if self.param(v, out, lay):
            return "param"
        t = self.ttype(v)
        if t is not None and t.rank == out.rank and self.packable(t, lay):
            return "pack"
        return None

    def tokenwise(self, node: Node) -> str | None:
        """The layout of ``node``'s value if it can run on packed tokens, else None."""
        if not isinstance(node.type, TensorType):
            return None
        out = node.ttype
        ins_in = [i in self.layout for i in node.inputs]
        if not any(ins_in):
            return None
        first_lay = self.layout.get(node.inputs[0])
        op = node.op
        if op == "reshape":
            lay = self.out_layout(out, allow_flat=True)
            src = self.ttype(node.inputs[0])
            if first_lay is None or lay is None or src is None:
                return None
            per_in = src.numel // (self.B * self.S)
            per_out = out.numel // (self.B * self.S)
            return lay if per_in == per_out else None
        if op == "slice":
            dim = node.attrs["dim"]
            return first_lay if first_lay is not None and dim >= (2 if first_lay == "bs" else 1) else None
        if op == "fused_attention":
            a = node.attrs
            if a["mask_kind"] != "padding" or not _packed_heads(a) or node.inputs[3] != self.mask:
                return None
            return "bs" if all(self.layout.get(i) == "bs" for i in node.inputs[:3]) else None
        if op == "embedding":
            lay = self.layout.get(node.inputs[1])
            return lay if lay is not None and node.inputs[0] not in self.layout and self.out_layout(out, True) == lay else None
        if op not in _TOKENWISE and not ops.is_elementwise(op):
            return None
        if node.attrs.get("row_index"):  # rows reordered (a gather folded into a norm): not token by token
            return None
        lay = self.out_layout(out, allow_flat=(first_lay == "flat"))
        if lay is None:
            return None
        fixed = {"matmul": 1, "gemm_epilogue": 1}.get(op, 0)
        for j, i in enumerate(node.inputs):
            if j == 0 and op in ("matmul", "gemm_epilogue", "fused_norm", "layer_norm", "rms_norm"):
                if self.layout.get(i) != lay:
                    return None
                continue
            if j == fixed and fixed:  # the weight: the same for every token
                t = self.ttype(i)
                if i in self.layout or t is None or t.rank != 2:
                    return None
                continue
            if i in self.layout:
                t = self.ttype(i)
                if self.layout[i] != lay or t is None or t.shape != out.shape:
                    return None
            elif self.external_ok(i, out, lay) is None:
                return None
        return lay


def _packed_heads(a: dict) -> bool:
    """Attention that reads [B, S, H*D] projections and writes [B, S, H*D], with as many kv heads as
    query heads: the form the padding-free kernel takes (on packed [T, H*D] rows)."""
    return a["layout"] == "bshd" and a.get("out_layout", "bshd") == "bshd" and a.get("kv_group", 1) == 1


def _find_mask(graph: Graph) -> tuple[str, int, int] | None:
    for node in graph.nodes:
        if node.op == "fused_attention" and node.attrs["mask_kind"] == "padding" and _packed_heads(node.attrs):
            m = node.inputs[3]
            t = graph.type_of(m)
            if isinstance(t, TensorType) and m in graph.input_names and t.rank == 2 and t.shape[1] > 1:
                return m, t.shape[0], t.shape[1]
    return None


def _grow(graph: Graph, an: _Analysis) -> list[Node]:
    for n, t in graph.inputs:
        if n != an.mask and t.rank >= 2 and t.shape[:2] == (an.B, an.S):
            an.layout[n] = "bs"
    members = []
    for node in graph.nodes:
        lay = an.tokenwise(node)
        if lay is not None:
            an.layout[node.name] = lay
            members.append(node)
    return members


def _prune_cycles(graph: Graph, members: list[Node]) -> list[Node]:
    """Drop region nodes that read (through outside nodes) a value computed in the region."""
    while True:
        names = {m.name for m in members}
        tainted: set[str] = set()  # outside values downstream of the region
        for node in graph.nodes:
            if node.name in names:
                continue
            if any(i in names or i in tainted for i in node.inputs):
                tainted.add(node.name)
        bad = {m.name for m in members if any(i in tainted for i in m.inputs)}
        if not bad:
            return members
        # drop the bad nodes and every region node downstream of them
        drop = set(bad)
        for m in members:
            if any(i in drop for i in m.inputs):
                drop.add(m.name)
        members = [m for m in members if m.name not in drop]


def varlen_pass(options: Options) -> Callable[[Graph], Graph]:
    def run(graph: Graph) -> Graph:
        if options.varlen is False:
            return graph
        return make_varlen(graph, strict=options.varlen is None)

    return run


def _reads_position_0(node: Node, lay: str) -> bool:
    """``node`` (outside the region) reads only sequence position 0 of its ``bs``-layout operand."""
    if lay != "bs":
        return False
    a = node.attrs
    if node.op == "select":
        return a["dim"] == 1 and a["index"] == 0
    if node.op == "slice":
        return a["dim"] == 1 and (a.get("start") or 0) == 0 and a.get("end") is not None and a["end"] <= 1
    return False


def _padding_reader(users: dict[str, list[Node]], an: _Analysis, names: set[str], region_outputs: list[str]) -> str | None:
    """Why the region's zeros at padded positions would change the model's result, or None when
    every value leaving the region is a graph output or is read outside only at position 0."""
    for v in region_outputs:
        for u in users.get(v, []):
            if u.name not in names and not _reads_position_0(u, an.layout[v]):
                return f"{u.op} ({u.name}) reads padded positions of {v}"
    return None


def _with_note(node: Node, note: str) -> Node:
    old = node.attrs.get("note", "")
    return replace(node, attrs=freeze_attrs({**node.attrs, "note": f"{old}; {note}" if old else note}))


def make_varlen(graph: Graph, strict: bool = True) -> Graph:
    """Wrap the token-wise region around padding-masked attention in a ``varlen_region`` node.

    ``strict`` (automatic mode): leave the graph as it is, with a note on the padding-masked
    attention, when an op outside the region reads padded positions of a region output."""
    found = _find_mask(graph)
    if found is None:
        return graph
    mask, batch, seq = found
    an = _Analysis(graph, mask, batch, seq)
    members = _prune_cycles(graph, _grow(graph, an))
    if not any(m.op == "fused_attention" for m in members):
        return graph
    names = {m.name for m in members}
    users = graph.users()
    region_outputs = [m.name for m in members if m.name in graph.outputs or any(u.name not in names for u in users.get(m.name, []))]
    why = _padding_reader(users, an, names, region_outputs)
    note = f"padding-free mode not applied: {why}" if why else ""
    if why and strict:
        attn = {m.name for m in members if m.op == "fused_attention"}
        return graph.replace(nodes=tuple(_with_note(n, note) if n.name in attn else n for n in graph.nodes))
    if why:
        note = f"padding-free mode forced (varlen=True): {why}, which are zero here"
    # outer operands of the region and how each enters
    externals: list[str] = []
    modes: list[str] = []
    for m in members:
        for j, i in enumerate(m.inputs):
            if i in names or i in externals or (m.op == "fused_attention" and j == 3):
                continue
            mode = _entry_mode(an, m, j, i)
            if mode == "const":  # the same for every token: a constant of the packed subgraph
                continue
            externals.append(i)
            modes.append(mode)
    sub = _build_subgraph(graph, an, members, externals, modes, region_outputs)
    region = Region(
        sub,
        batch,
        seq,
        tuple(modes),
        tuple(an.layout.get(e) == "flat" for e in externals),
        tuple(_tt(graph, v) for v in region_outputs),
        tuple(an.layout[v] == "flat" for v in region_outputs),
    )
    out_type = tuple(_tt(graph, v) for v in region_outputs)
    region_name = f"varlen_region_{members[0].name}"
    attrs: dict[str, Any] = {"region": region, "out_type": out_type}
    if note:
        attrs["note"] = note
    region_node = Node(region_name, "varlen_region", (mask, *externals), out_type, attrs)
    getitems = [Node(v, "getitem", (region_name,), _tt(graph, v), {"index": j}) for j, v in enumerate(region_outputs)]
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    first = min(order[m.name] for m in members)
    rest = [n for n in graph.nodes if n.name not in names]
    new_nodes = _topo([region_node] + getitems + rest, graph, {region_name: first - 0.5, **{g.name: first - 0.4 for g in getitems}}, order)
    b = GraphBuilder.from_graph(graph)
    for n in new_nodes:
        b.add_node(n)
    return dce(b.build(graph.outputs))


def _entry_mode(an: _Analysis, m: Node, j: int, i: str) -> str:
    """How operand ``j`` (``i``, outside the region) of region node ``m`` enters the packed subgraph."""
    if i in an.layout:  # a token-shaped graph input (input_ids)
        return "pack"
    weight = (m.op in ("matmul", "gemm_epilogue") and j == 1) or (m.op == "embedding" and j == 0)
    mode = "param" if weight else an.external_ok(i, m.ttype, an.layout[m.name])
    assert mode is not None, f"varlen: operand {i} of {m.name} cannot enter the region"
    return "const" if mode == "param" and i in an.g.constants else mode


def _tt(graph: Graph, v: str) -> TensorType:
    t = graph.type_of(v)
    assert isinstance(t, TensorType)
    return t


def _topo(nodes: list[Node], graph: Graph, extra_pos: dict[str, float], order: dict[str, int]) -> list[Node]:
    """Topological order, ties broken by original position."""
    import heapq

    defined = set(graph.input_names) | set(graph.constants)
    pos = {n.name: extra_pos.get(n.name, order.get(n.name, 0)) for n in nodes}
    by_name = {n.name: n for n in nodes}
    deps = {n.name: {i for i in n.inputs if i not in defined and i in by_name} for n in nodes}
    rdeps: dict[str, list[str]] = {}
    for n, ds in deps.items():
        for d in ds:
            rdeps.setdefault(d, []).append(n)
    ready = [(pos[n], n) for n, ds in deps.items() if not ds]
    heapq.heapify(ready)
    out = []
    while ready:
        _, n = heapq.heappop(ready)
        out.append(by_name[n])
        for r in rdeps.get(n, []):
            deps[r].discard(n)
            if not deps[r]:
                heapq.heappush(ready, (pos[r], r))
    if len(out) != len(nodes):
        raise ValueError("varlen: the region rewrite made a cycle")
    return out


def _packed_type(t: TensorType, lay: str, cap: int) -> TensorType:
    rest = t.shape[2:] if lay == "bs" else t.shape[1:]
    return TensorType((cap, *rest), t.dtype)


def _build_subgraph(graph: Graph, an: _Analysis, members: list[Node], externals: list[str], modes: list[str], outputs: list[str]) -> Graph:
    cap = an.B * an.S
    b = GraphBuilder(f"{graph.name}_packed")
    for e, m in zip(externals, modes, strict=True):
        t = _tt(graph, e)
        if m == "pack":
            lay = an.layout.get(e, "bs")
            b.add_input(e, _packed_type(t.with_shape((an.B, an.S, *t.shape[2:])) if lay == "bs" else t, lay, cap))
        else:
            b.add_input(e, t)
    cu = b.add_input("cu_seqlens", TensorType((an.B + 1,), torch.int32))
    stripped: dict[tuple[str, int], str] = {}

    def operand(i: str, rank: int) -> str:
        """A constant operand, with leading ones stripped so it broadcasts against packed values."""
        if b.has(i):
            if i in b.constants and b.constants[i].dim() > rank:
                key = (i, rank)
                if key not in stripped:
                    c = b.constants[i]
                    stripped[key] = b.add_constant(c.reshape(c.shape[c.dim() - rank :]), name=b.fresh(i))
                return stripped[key]
            return i
        c = graph.constants[i]
        b.add_constant(c, i)
        return operand(i, rank)

    for m in members:
        lay = an.layout[m.name]
        pt = _packed_type(m.ttype, lay, cap)
        a = dict(m.attrs)
        if m.op == "fused_attention":
            q, k, v = m.inputs[:3]
            attrs = {
                "heads": a["heads"],
                "head_dim": a["head_dim"],
                "scale": a["scale"],
                "causal": a["causal"],
                "max_seqlen": an.S,
                "out_type": pt,
                "fused_ops": a.get("fused_ops", ("sdpa",)),
            }
            b.add_node(Node(m.name, "varlen_attention", (q, k, v, cu), pt, attrs))
            continue
        if m.op == "reshape":
            a["shape"] = (-1, *pt.shape[1:])
        elif m.op == "slice":
            a["dim"] = a["dim"] - (1 if lay == "bs" else 0)
        if "out_type" in a:
            a["out_type"] = pt
        ins = tuple(operand(i, pt.rank) for i in m.inputs)
        b.add_node(Node(m.name, m.op, ins, pt, a))
    return b.build(outputs)


@lowering("varlen_region")
def _lower_region(node: Node, graph: Graph, backend: str) -> Step:
    region: Region = node.attrs["region"]
    state: dict[str, Any] = {}

    def run(xs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        runner = state.get("runner")
        if runner is None:
            plan = lower(region.graph, xs[0].device, backend)
            from kfuse.runtime.executor import execute

            runner = state["runner"] = BucketedRunner(region, lambda ins: execute(plan, ins), use_graphs=backend == "triton")
            state["plan"] = plan
        return runner(xs)

    run.region_state = state  # type: ignore[attr-defined]  # the runner and packed plan, for diagnostics
    desc = region.describe() + (f"; note: {node.attrs['note']}" if node.attrs.get("note") else "")
    info = KernelInfo(node.name, "varlen_region", tuple(sorted(region.graph.op_counts())), desc)
    return Step(node.name, node.inputs, run, info, host_sync=True)
