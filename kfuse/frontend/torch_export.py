"""PyTorch frontend: ``torch.export`` a module (or take an ExportedProgram) and import it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils import _pytree as pytree

from kfuse.frontend.fx_import import HostValueError, import_fx
from kfuse.frontend.mutation import FunctionalisationError, StatefulModelError, functional_program
from kfuse.ir.graph import Graph, TensorType


@dataclass(frozen=True)
class Imported:
    """An imported graph plus what is needed to call it like the original model."""

    graph: Graph
    in_spec: Any  # pytree spec of (args, kwargs)
    out_spec: Any  # pytree spec of the model's output
    # graph input i is flat user input flat_input_index[i]; a negative entry -1 - j is ``state[j]``
    flat_input_index: tuple[int, ...]
    fallbacks: tuple[str, ...]
    # buffers forward writes (a KV cache, a counter): the module's own tensors, graph inputs that every call
    # passes, so the writes land in the module as eager PyTorch's do
    state: tuple[torch.Tensor, ...] = ()
    # (graph output position, graph input position): forward writes that output's value into that input
    # (a caller's tensor or a state buffer); ``kfuse.runtime.state_writes``
    input_writes: tuple[tuple[int, int], ...] = ()

    def graph_inputs(self, flat: list[Any]) -> list[Any]:
        """The graph's inputs for one call's flat inputs: the caller's tensors and the state buffers."""
        return [flat[i] if i >= 0 else self.state[-1 - i] for i in self.flat_input_index]


class FrontendError(RuntimeError):
    """The model could not be imported; the message says what and where."""


class ExportError(FrontendError):
    """torch.export could not trace or functionalise the model. Dynamo's frontend, which splits the graph where
    it must, may take it: ``kfuse.compile`` falls back to it (``Options.frontend="auto"``)."""


def export_module(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> ExportedProgram:
    """``torch.export`` for inference: under ``no_grad``, so that a ``torch.no_grad()`` region in
    the model (Hugging Face rotary embeddings) is traced inline instead of as a
    ``wrap_with_set_grad_enabled`` sub-graph. A Hugging Face ``DynamicCache`` in the output (decoder
    models return their KV cache by default) is made exportable with transformers' own pytree
    registration, on the first failure that names it, and the export is tried once more."""
    try:
        return _export(model, args, kwargs)
    except Exception as e:
        if _register_hf_cache(e):
            try:
                return _export(model, args, kwargs)
            except Exception as e2:
                e = e2
        raise ExportError(
            f"torch.export failed for {type(model).__name__}: {type(e).__name__}: {e}\n"
            'torch.compile(model, backend="kfuse") compiles through Dynamo instead, which splits the graph where it must'
        ) from e


def _export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> ExportedProgram:
    with torch.no_grad(), _attributes_kept(model):
        return torch.export.export(model, tuple(args), kwargs or {}, strict=False)


@contextmanager
def _attributes_kept(model: torch.nn.Module) -> Iterator[None]:
    """Every module's plain attributes as they were before tracing. A forward that caches tensors in attributes
    (YOLOv8's ``Detect`` keeps its anchors and the input shape they are for) would otherwise keep the tracer's fake
    tensors, and the next eager call (kfuse's own check against PyTorch, or the user's) would compute with them."""
    saved = [(m, {k: v for k, v in vars(m).items() if not k.startswith("_")}) for m in model.modules()]
    try:
        yield
    finally:
        for m, attrs in saved:
            for k in [k for k in vars(m) if not k.startswith("_") and k not in attrs]:
                delattr(m, k)
            for k, v in attrs.items():
                if vars(m).get(k, v) is not v:
                    setattr(m, k, v)


def _register_hf_cache(error: Exception) -> bool:
    """Register ``transformers.DynamicCache`` as a pytree node if ``error`` is torch.export's
    complaint about it; True when that was the problem and it is now registered."""
    if "DynamicCache" not in str(error) or "not a known type" not in str(error):
        return False
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:  # pragma: no cover - a transformers without the helper
        return False
    register_dynamic_cache_export_support()
    return True


def from_exported_program(ep: ExportedProgram, name: str = "model") -> Imported:
    """Import an ExportedProgram; parameters, buffers and constants become graph constants. In-place
    ops that a rename cannot express (on views, or with views of the written tensor) are
    functionalised first (``kfuse.frontend.mutation``). A buffer that forward writes stays a graph
    input bound to the module's tensor, and each written input or buffer is an ``input_writes`` entry;
    a forward that writes a parameter is refused."""
    try:
        ep = functional_program(ep)
    except FunctionalisationError as e:
        raise ExportError(f"{name}: {e}") from None
    except StatefulModelError as e:
        raise FrontendError(f"{name}: {e}") from None
    sig = ep.graph_signature
    # buffer -> its placeholder's name (filled in below)
    written_buffers = {spec.target: "" for spec in sig.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    values: dict[str, torch.Tensor | TensorType] = {}
    source: dict[str, int] = {}  # placeholder name -> flat user input index, or -1 - j for state[j]
    state: list[torch.Tensor] = []
    user_index = 0
    for spec in sig.input_specs:
        arg_name = getattr(spec.arg, "name", None)
        if arg_name is None:
            continue
        if spec.kind == InputKind.USER_INPUT:
            source[arg_name] = user_index
            user_index += 1
        elif spec.kind == InputKind.BUFFER and spec.target in written_buffers:
            written_buffers[spec.target] = arg_name
            source[arg_name] = -1 - len(state)
            t = ep.state_dict.get(spec.target)  # the module's tensor itself: writes must reach it
            state.append(t if t is not None else ep.constants[spec.target])  # non-persistent buffers are constants
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants[spec.target]
            values[arg_name] = t
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            values[arg_name] = ep.constants[spec.target]
    flat_index: list[int] = []
    position: dict[str, int] = {}  # graph input position, by the user input's or buffer's name in the signature
    for node in ep.graph_module.graph.nodes:  # graph inputs are added in placeholder order
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in source and isinstance(val, torch.Tensor):
            values[node.name] = TensorType(tuple(int(s) for s in val.shape), val.dtype)
            position[node.name] = len(flat_index)
            flat_index.append(source[node.name])
    writes = []
    for k, spec in enumerate(sig.output_specs):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            writes.append((k, position[spec.target]))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            writes.append((k, position[written_buffers[spec.target]]))
    imported = import_fx(ep.graph_module, values, name)
    graph = imported.builder.build(imported.outputs)
    return Imported(
        graph, ep.call_spec.in_spec, ep.call_spec.out_spec, tuple(flat_index), tuple(imported.fallbacks), tuple(state), tuple(writes)
    )


def import_module(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, name: str | None = None) -> Imported:
    """Export ``model`` on the example inputs and import it."""
    ep = export_module(model, args, kwargs)
    try:
        return from_exported_program(ep, name or type(model).__name__)
    except HostValueError as e:  # .item() of a computed tensor: Dynamo breaks the graph there
        raise ExportError(f"{name or type(model).__name__}: {e}") from None
    except GuardOnDataDependentSymNode as e:  # a shape that depends on values (nonzero, MoE routing): no static plan
        raise ExportError(
            f"{name or type(model).__name__}: a tensor's shape depends on the data ({str(e).splitlines()[0][:200]}); "
            'torch.compile(model, backend="kfuse") compiles the static parts through Dynamo'
        ) from None


def flatten_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    return pytree.tree_flatten((tuple(args), dict(kwargs)))
