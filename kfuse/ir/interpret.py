"""The reference executor: runs any graph with the op registry's PyTorch references."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph


def reference_run(graph: Graph, inputs: Sequence[torch.Tensor], device: torch.device | str | None = None) -> list[torch.Tensor]:
    """Execute ``graph`` on ``inputs`` (in ``graph.inputs`` order); the oracle for every test."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"graph {graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    if device is None:
        device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[str, object] = {k: v.to(device) for k, v in graph.constants.items()}
    for (name, _), x in zip(graph.inputs, inputs, strict=True):
        env[name] = x
    for node in graph.nodes:
        env[node.name] = ops.run_reference(node.op, [env[i] for i in node.inputs], node.attrs)  # type: ignore[misc]
    return [env[o] for o in graph.outputs]  # type: ignore[misc]
