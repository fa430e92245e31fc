"""Measured choice between lowering candidates of one node (template vs library, fused vs not).

Every candidate runs on inputs of the node's types (graph constants as they are, activations
random; integer inputs such as masks all ones) and is timed from CUDA-graph replays, i.e. GPU
time without Python launch overhead, as inside the compiled model's plan. Results are cached per
problem; a candidate that fails to run is never chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

_CACHE: dict[Hashable, tuple[str, dict[str, float]]] = {}


def example_inputs(node: Any, graph: Any, device: str = "cuda") -> list[torch.Tensor]:
    xs = []
    for name in node.inputs:
        if name in graph.constants:
            xs.append(graph.constants[name].to(device))
            continue
        t = graph.type_of(name)
        if t.dtype.is_floating_point:
            x = torch.randn(t.shape, device=device).to(t.dtype)
        else:
            x = torch.ones(t.shape, device=device, dtype=t.dtype)
        if getattr(t, "layout", None) == "channels_last" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        xs.append(x)
    return xs


def choose(
    node: Any, graph: Any, candidates: dict[str, Callable[[list[torch.Tensor]], Any]], key: Hashable,
    inputs: list[torch.Tensor] | None = None,
) -> tuple[str, dict[str, float]]:  # fmt: skip
    """(name of the fastest candidate, ms per candidate); ``key`` names the problem for the cache;
    ``inputs``: representative inputs where random ones are not (e.g. prefix sums)."""
    from kfuse.bench.harness import gpu_time_ms

    full_key = (key, tuple(candidates))
    if full_key not in _CACHE:
        xs = inputs if inputs is not None else example_inputs(node, graph)
        times: dict[str, float] = {}
        for name, fn in candidates.items():
            try:
                times[name] = gpu_time_ms(lambda fn=fn: fn(xs))
            except Exception:  # noqa: BLE001 - a candidate that cannot run loses
                times[name] = float("inf")
        _CACHE[full_key] = (min(times, key=lambda k: times[k]), times)
    return _CACHE[full_key]


def problem_key(node: Any, graph: Any, *extra: Hashable) -> tuple:
    """Input shapes/dtypes and the node's attributes (minus the tuner's config) as a cache key."""
    types = [graph.type_of(i) for i in node.inputs]
    attrs = tuple(sorted((k, str(v)) for k, v in node.attrs.items() if k != "config"))
    return (node.op, tuple((tuple(t.shape), str(t.dtype)) for t in types), attrs, *extra)
