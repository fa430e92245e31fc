"""``kfuse.compile``: the Python entry point."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from kfuse.compiler import Options
from kfuse.frontend.torch_export import ExportError, Imported, import_module
from kfuse.runtime.compiled_model import CompiledModel


def compile(  # noqa: A001 - mirrors torch.compile
    model: Any,
    example_inputs: tuple[Any, ...] | list[Any] | torch.Tensor = (),
    example_kwargs: dict[str, Any] | None = None,
    *,
    explain: bool = False,
    options: Options | None = None,
    **option_overrides: Any,
) -> CompiledModel:
    """Compile ``model`` (a ``torch.nn.Module``, an ``ExportedProgram``, an ONNX ``ModelProto``
    or a path to an ``.onnx`` file) for the example inputs.

    Returns a ``CompiledModel`` that is called like the model. ``explain=True`` prints the graph
    after each stage and the kernel plan; ``compiled.report`` holds the same as a dict. An ``nn.Module`` that
    torch.export cannot take is compiled through Dynamo instead (a ``DynamoCompiledModel``, its report says why),
    unless ``frontend="export"``.
    """
    opts = replace(options or Options(), explain=explain, **option_overrides)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args, kwargs = tuple(example_inputs), dict(example_kwargs or {})
    if opts.output_layout == "auto":
        opts = replace(opts, output_layout="channels_last" if any(_channels_last(a) for a in args) else "nchw")

    if _is_onnx(model):
        from kfuse.frontend.onnx import onnx_compiled_model

        return onnx_compiled_model(model, args, kwargs, opts)

    if isinstance(model, torch.export.ExportedProgram):
        from kfuse.frontend.torch_export import from_exported_program

        ep = model
        if not args and not kwargs:
            # the program's own example inputs (recorded by torch.export) unless others are given
            args, kwargs = getattr(ep, "example_inputs", None) or ((), {})
        if sum(s.kind.name == "USER_INPUT" for s in ep.graph_signature.input_specs) and not (args or kwargs):
            raise TypeError("kfuse.compile(exported_program): the program records no example inputs; pass them (kfuse.compile(ep, (x,)))")

        def import_ep(a: tuple[Any, ...], k: dict[str, Any]) -> Imported:
            return from_exported_program(ep, "exported_program")

        return CompiledModel(import_ep, ep.module(), args, kwargs, opts, "exported_program")

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"kfuse.compile takes an nn.Module, an ExportedProgram or an ONNX model, got {type(model).__name__}")
    name = type(model).__name__

    def import_mod(a: tuple[Any, ...], k: dict[str, Any]) -> Imported:
        return import_module(model, a, k, name)

    if opts.frontend not in ("auto", "export"):
        raise ValueError(f'frontend must be "auto" or "export", got {opts.frontend!r}')
    try:
        return CompiledModel(import_mod, model, args, kwargs, opts, name)
    except ExportError as e:
        if opts.frontend != "auto":
            raise
        from kfuse.frontend.dynamo import DynamoCompiledModel

        return DynamoCompiledModel(model, args, kwargs, opts, reason=str(e))


def _channels_last(x: Any) -> bool:
    """A 4-D tensor stored channels-last (and not also contiguous, as 1x1 maps or C=1 are)."""
    return isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _is_onnx(model: Any) -> bool:
    if isinstance(model, str | bytes) or hasattr(model, "__fspath__"):
        return True
    return type(model).__name__ == "ModelProto"
