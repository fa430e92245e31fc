"""The kfuse graph IR: typed tensors, single-output nodes, and an immutable graph.

A value is referred to by name. A name is a graph input, a constant (weights, folded
tensors) or a node. Nodes are kept in topological order. Graphs are frozen: passes build
new graphs with :class:`GraphBuilder` instead of mutating.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch


@dataclass(frozen=True)
class TensorType:
    """Static type of a tensor value: shape, element type and memory layout."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"  # "contiguous" or "channels_last"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def with_shape(self, shape: Iterable[int]) -> TensorType:
        return TensorType(tuple(int(s) for s in shape), self.dtype, self.layout)

    def with_dtype(self, dtype: torch.dtype) -> TensorType:
        return TensorType(self.shape, dtype, self.layout)

    def __str__(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        suffix = "" if self.layout == "contiguous" else f", {self.layout}"
        return f"{dt}[{','.join(map(str, self.shape))}{suffix}]"

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        return TensorType(tuple(t.shape), t.dtype)


ValueType = TensorType | tuple[TensorType, ...]


def freeze_attrs(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(attrs or {}))


@dataclass(frozen=True)
class Node:
    """One operation. ``op`` names an entry of the op registry (kfuse.ir.ops)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    type: ValueType
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    @property
    def ttype(self) -> TensorType:
        assert isinstance(self.type, TensorType), f"{self.name} has a tuple type"
        return self.type

    def key(self) -> tuple[Any, ...]:
        """Structural identity (op, inputs, attributes) used by CSE."""
        return (self.op, self.inputs, tuple(sorted((k, _hashable(v)) for k, v in self.attrs.items())))


def _hashable(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict | MappingProxyType):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    try:
        hash(v)
    except TypeError:
        return repr(v)
    return v


@dataclass(frozen=True)
class Graph:
    """A dataflow graph with named inputs, constant tensors and ordered nodes."""

    inputs: tuple[tuple[str, TensorType], ...]
    constants: Mapping[str, torch.Tensor]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    name: str = "graph"

    # ---- lookups -------------------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.inputs)

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def type_of(self, name: str) -> ValueType:
        for n, t in self.inputs:
            if n == name:
                return t
        if name in self.constants:
            return TensorType.of(self.constants[name])
        for node in self.nodes:
            if node.name == name:
                return node.type
        raise KeyError(f"value {name!r} is not defined in graph {self.name!r}")

    def users(self) -> dict[str, list[Node]]:
        """Map from value name to the nodes that read it (outputs are not nodes)."""
        out: dict[str, list[Node]] = {}
        for node in self.nodes:
            for i in node.inputs:
                out.setdefault(i, []).append(node)
        return out

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def replace(self, **kw: Any) -> Graph:
        fields = {
            "inputs": self.inputs,
            "constants": self.constants,
            "nodes": self.nodes,
            "outputs": self.outputs,
            "name": self.name,
        }
        fields.update(kw)
        return Graph(**fields)

    def verify(self) -> None:
        """Check that every input is defined before use; raise ValueError otherwise."""
        defined = set(self.input_names) | set(self.constants)
        for node in self.nodes:
            for i in node.inputs:
                if i not in defined:
                    raise ValueError(f"node {node.name} ({node.op}) reads undefined value {i!r}")
            if node.name in defined:
                raise ValueError(f"value {node.name!r} defined twice")
            defined.add(node.name)
        for o in self.outputs:
            if o not in defined:
                raise ValueError(f"graph output {o!r} is not defined")

    # ---- printing ------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.name}("]
        for n, t in self.inputs:
            lines.append(f"    %{n}: {t},")
        lines.append(f") {{  # {len(self.constants)} constants, {len(self.nodes)} nodes")
        for node in self.nodes:
            args = ", ".join(f"%{i}" for i in node.inputs)
            attrs = ", ".join(f"{k}={_short(v)}" for k, v in node.attrs.items() if k not in _HIDDEN_ATTRS)
            if attrs:
                args = f"{args}; {attrs}" if args else attrs
            ty = node.type if isinstance(node.type, TensorType) else "(" + ", ".join(map(str, node.type)) + ")"
            lines.append(f"  %{node.name}: {ty} = {node.op}({args})")
        lines.append(f"  return {', '.join('%' + o for o in self.outputs)}")
        lines.append("}")
        return "\n".join(lines)


_HIDDEN_ATTRS = {"out_type", "fn", "fused_ops"}


def _short(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple) and len(v) > 8:
        return f"({', '.join(map(_short, v[:8]))}, ...)"
    if hasattr(v, "describe"):
        return v.describe()
    s = repr(v) if not callable(v) else getattr(v, "__name__", repr(v))
    return s if len(s) < 60 else s[:57] + "..."


class GraphBuilder:
    """Builds a new Graph node by node, inferring types with the op registry."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.inputs: list[tuple[str, TensorType]] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.nodes: list[Node] = []
        self.outputs: list[str] = []
        self._types: dict[str, ValueType] = {}
        self._counter = 0
        self._const_ids: dict[int, str] = {}
        self._reserved: set[str] = set()  # names of nodes a pass will still copy in

    @staticmethod
    def from_graph(graph: Graph, keep_nodes: bool = False) -> GraphBuilder:
        """A builder that already holds ``graph``'s inputs and constants (and nodes if asked)."""
        b = GraphBuilder(graph.name)
        b._reserved = {node.name for node in graph.nodes}
        for n, t in graph.inputs:
            b.add_input(n, t)
        for n, c in graph.constants.items():
            b.add_constant(c, n)
        if keep_nodes:
            for node in graph.nodes:
                b.add_node(node)
        b._counter = len(graph.nodes) + len(graph.constants) + len(graph.inputs)
        return b

    def fresh(self, hint: str) -> str:
        hint = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "v"
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._types and name not in self._reserved:
                return name

    def type_of(self, name: str) -> ValueType:
        return self._types[name]

    def has(self, name: str) -> bool:
        return name in self._types

    def add_input(self, name: str, ttype: TensorType) -> str:
        self.inputs.append((name, ttype))
        self._types[name] = ttype
        return name

    def add_constant(self, tensor: torch.Tensor, name: str | None = None) -> str:
        """Register a constant tensor; the same tensor object is registered once."""
        key = id(tensor)
        if name is None and key in self._const_ids:
            return self._const_ids[key]
        name = name or self.fresh("c")
        self.constants[name] = tensor
        self._types[name] = TensorType.of(tensor)
        self._const_ids[key] = name
        return name

    def scalar(self, value: float | int | bool, dtype: torch.dtype | None = None, like: str | None = None) -> str:
        """A 0-d constant. Python scalars become 0-d tensors so every operand is a value.

        Without ``dtype``, a float scalar combined with the floating value ``like`` takes a dtype that keeps both
        torch's result dtype and the scalar's precision: float64 beside float64 (a float32 constant would round
        0.1 or 1/3 to 1e-8 relative error), float32 beside float32 and beside dimensioned float16/bfloat16 (a 0-d
        operand does not promote those, and eager keeps the scalar in float32 too), and ``like``'s own dtype
        beside a 0-d float16/bfloat16 value, where a float32 constant would promote the result to float32.
        """
        if dtype is None:
            dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float32
            if dtype == torch.float32 and like is not None:
                t = self._types[like]
                if isinstance(t, TensorType) and t.dtype.is_floating_point:
                    if t.dtype == torch.float64 or (t.rank == 0 and t.dtype.itemsize < 4):
                        dtype = t.dtype
        return self.add_constant(torch.tensor(value, dtype=dtype))

    def add_node(self, node: Node) -> str:
        if node.name in self._types:
            raise ValueError(f"value {node.name!r} is already defined in graph {self.name!r}")
        for i in node.inputs:
            if i not in self._types:
                raise ValueError(f"node {node.name} ({node.op}) reads undefined value {i!r}")
        self.nodes.append(node)
        self._types[node.name] = node.type
        return node.name

    def op(self, op: str, inputs: Iterable[str], attrs: Mapping[str, Any] | None = None, name: str | None = None) -> str:
        """Append ``op(inputs; attrs)``, inferring its type; return the new value's name."""
        from kfuse.ir.ops import infer_type

        inputs = tuple(inputs)
        attrs = freeze_attrs(attrs)
        missing = [i for i in inputs if i not in self._types]
        if missing:  # the same error add_node gives, before the type lookup would raise a bare KeyError
            raise ValueError(f"{op} reads undefined value {missing[0]!r}")
        types = [self._types[i] for i in inputs]
        ttype = infer_type(op, types, attrs)
        return self.add_node(Node(name or self.fresh(op), op, inputs, ttype, attrs))

    def build(self, outputs: Iterable[str] | None = None) -> Graph:
        outs = tuple(outputs) if outputs is not None else tuple(self.outputs)
        g = Graph(tuple(self.inputs), MappingProxyType(dict(self.constants)), tuple(self.nodes), outs, self.name)
        g.verify()
        return g
