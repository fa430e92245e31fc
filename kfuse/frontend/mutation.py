"""In-place ops in an exported graph: kept as renames where that is exact, functionalised where not.

The importer turns ``y.relu_()`` into ``relu(y)`` and lets later readers of ``y`` read the result
(the IR is SSA). That is exact only when nothing else aliases ``y``. An in-place op on a view
(``y[:, 0].zero_()``) must change ``y`` too, and a view taken of ``y`` before ``y.mul_(2)`` must see
the new values: renaming gets both wrong, silently. Such graphs go through ``torch.export``'s
functionalisation (``run_decompositions({})``), which writes them as ``select_scatter`` /
``slice_scatter`` / copies. A forward that writes a caller's input or one of its buffers (a static KV
cache, a step counter) keeps doing so: the functionalised graph computes the new value, and the
runtime writes it back (``kfuse.runtime.state_writes``; in place where the new value is an
``index_copy`` / ``index_put`` of the old one). A forward that writes a parameter is refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind


class FunctionalisationError(RuntimeError):
    """torch.export could not functionalise the graph's in-place writes to views (Dynamo's frontend can)."""


class StatefulModelError(RuntimeError):
    """The model writes to its parameters in forward."""


def _schema(node: torch.fx.Node) -> Any:
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


# in-place by schema, but they change autograd metadata, not values (``torch.tensor`` constants made
# in forward are exported as ``lift_fresh_copy`` + ``detach_``)
_METADATA_ONLY = ("detach_", "requires_grad_")


def writes_first_argument(node: torch.fx.Node) -> bool:
    """An in-place op that writes values (its schema writes its first argument: ``add_``,
    ``copy_``, ``index_put_``)."""
    s = _schema(node)
    if s is None or not s.arguments or s.name.split("::")[-1] in _METADATA_ONLY:
        return False
    info = s.arguments[0].alias_info
    return info is not None and info.is_write


def is_view(node: torch.fx.Node) -> bool:
    """A view op: returns an alias of an input without writing it (``slice``, ``select``, ``view``)."""
    s = _schema(node)
    if s is None or writes_first_argument(node):
        return False
    return any(r.alias_info is not None for r in s.returns)


def renames_are_exact(gm: torch.fx.GraphModule) -> bool:
    """Whether every in-place op of ``gm`` can be imported as a rename: it writes a tensor that a
    non-view op computed in this graph (possibly through earlier in-place ops), and no view of that
    tensor is ever taken."""
    for node in gm.graph.nodes:
        if not writes_first_argument(node):
            continue
        chain = [node]
        base = node.args[0]
        while isinstance(base, torch.fx.Node) and writes_first_argument(base):
            chain.append(base)
            base = base.args[0]
        if not isinstance(base, torch.fx.Node) or base.op != "call_function" or is_view(base):
            return False  # a graph input, a weight, or a view of something else
        chain.append(base)
        if any(is_view(u) for c in chain for u in c.users):
            return False
    return True


def functional_program(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` itself when its in-place ops are exact renames, else its functionalised form, whose
    output specs name the inputs and buffers forward writes; ``StatefulModelError`` when it writes
    a parameter."""
    if renames_are_exact(ep.graph_module):
        return ep
    try:
        fn = ep.run_decompositions({})
    except Exception as e:  # noqa: BLE001 - a rename would be wrong here, so no import without it
        raise FunctionalisationError(
            f"the graph writes tensors that have views (in-place ops on slices), and torch.export could not "
            f"functionalise it ({type(e).__name__}: {str(e)[:200]}); write those ops out of place, or compile the model "
            'with torch.compile(model, backend="kfuse"), whose Dynamo frontend takes it (e.g. Mixtral-style MoE routing)'
        ) from e
    written = [f"parameter {spec.target}" for spec in fn.graph_signature.output_specs if spec.kind == OutputKind.PARAMETER_MUTATION]
    if written:
        raise StatefulModelError(
            f"forward writes in place to {', '.join(written)}: kfuse freezes parameters as constants; "
            "keep state the forward updates (a KV cache, a counter) in a buffer or pass it as an input"
        )
    return fn
