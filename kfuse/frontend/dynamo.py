"""``torch.compile(model, backend="kfuse")``: Dynamo hands us FX graphs; we export each to ATen,
import it with the module's parameters and buffers frozen as constants, and compile it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kfuse.compiler import Options
from kfuse.frontend.torch_export import Imported, export_module, from_exported_program


def _is_weight(node: torch.fx.Node, example: Any) -> bool:
    """Dynamo lifts parameters and buffers as graph inputs: frozen as constants, unlike what the
    caller passes. The caller's tensors are those Dynamo guards as locals of the frame: a
    ``LocalSource`` or one reached from it (``GetItemSource(LocalSource('args'))`` when forward
    takes ``*args``, as Hugging Face models' wrapped forwards do). A module's parameters and
    buffers are guarded as module sources, a global tensor as a global."""
    if isinstance(example, torch.nn.Parameter):
        return True
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    if src is None:
        return False
    guard = getattr(src, "guard_source", None)
    guard = guard() if callable(guard) else guard  # a method in older torch, a property in newer
    if guard is None:  # pragma: no cover - a source kind without a guard source
        return type(src).__name__ != "LocalSource"
    return guard.name != "LOCAL"


class _WeightsFrozen(torch.nn.Module):
    """Wraps a Dynamo GraphModule so weights are attributes, not inputs."""

    def __init__(self, gm: torch.fx.GraphModule, weights: dict[int, torch.Tensor], n_inputs: int) -> None:
        super().__init__()
        self.gm = gm
        self.n_inputs = n_inputs
        self.weight_slots = sorted(weights)
        for i, t in weights.items():
            self.register_buffer(f"w{i}", t.detach(), persistent=False)

    def forward(self, *user_inputs: Any) -> Any:
        it = iter(user_inputs)
        args = [getattr(self, f"w{i}") if i in self.weight_slots else next(it) for i in range(self.n_inputs)]
        return self.gm(*args)


def kfuse_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    from kfuse.runtime.compiled_model import CompiledModel

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weights = {
        i: x for i, (n, x) in enumerate(zip(placeholders, example_inputs, strict=True)) if isinstance(x, torch.Tensor) and _is_weight(n, x)
    }
    user_idx = [i for i in range(len(example_inputs)) if i not in weights]
    wrapper = _WeightsFrozen(gm, weights, len(example_inputs))
    user_examples = tuple(example_inputs[i] for i in user_idx)

    def importer(a: tuple[Any, ...], k: dict[str, Any]) -> Imported:
        ep = export_module(wrapper, a)
        return from_exported_program(ep, "dynamo_graph")

    options = Options(**kwargs.get("options", {})) if "options" in kwargs else Options()
    compiled = CompiledModel(importer, wrapper, user_examples, {}, options, "dynamo_graph")

    def run(*all_inputs: Any) -> Any:
        return compiled(*[all_inputs[i] for i in user_idx])

    run.kfuse_compiled = compiled  # type: ignore[attr-defined]
    return run


def register() -> None:
    """Register ``"kfuse"`` with Dynamo (also done by the package's entry point)."""
    from torch._dynamo import list_backends, register_backend

    if "kfuse" not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=kfuse_backend, name="kfuse")
