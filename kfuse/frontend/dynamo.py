"""``torch.compile(model, backend="kfuse")``: Dynamo hands us FX graphs; we export each to ATen,
import it with the module's parameters and buffers frozen as constants, and compile it. ``DynamoCompiledModel``
is ``kfuse.compile``'s result through this path, for a model torch.export cannot take."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kfuse.compiler import Options
from kfuse.frontend.fx_import import HostValueError
from kfuse.frontend.torch_export import FrontendError, Imported, export_module, from_exported_program


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
    """Wraps a Dynamo GraphModule so weights are attributes, not inputs; ``fixed`` binds integer
    inputs (the sizes of a dynamic-shape graph) to the values of one call."""

    def __init__(
        self, gm: torch.fx.GraphModule, weights: dict[int, torch.Tensor], n_inputs: int, fixed: dict[int, int] | None = None
    ) -> None:
        super().__init__()
        self.gm = gm
        self.n_inputs = n_inputs
        self.weight_slots = sorted(weights)
        self.fixed = dict(fixed or {})
        for i, t in weights.items():
            self.register_buffer(f"w{i}", t.detach(), persistent=False)

    def forward(self, *user_inputs: Any) -> Any:
        it = iter(user_inputs)
        args = []
        for i in range(self.n_inputs):
            args.append(getattr(self, f"w{i}") if i in self.weight_slots else self.fixed[i] if i in self.fixed else next(it))
        return self.gm(*args)


def kfuse_backend(
    gm: torch.fx.GraphModule, example_inputs: list[Any], kfuse_options: Options | None = None, **kwargs: Any
) -> Callable[..., Any]:
    """Compile a Dynamo graph with kfuse. A graph traced with static shapes is compiled now, for
    its example inputs. A dynamic-shape graph (Dynamo marks a dim dynamic when a second call
    changes it, and passes the sizes as SymInt inputs) is compiled on each call for that call's
    concrete sizes, once per shape: kfuse's kernels and CUDA graphs are specialised to shapes."""
    from kfuse.runtime.compiled_model import CompiledModel

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weights = {
        i: x for i, (n, x) in enumerate(zip(placeholders, example_inputs, strict=True)) if isinstance(x, torch.Tensor) and _is_weight(n, x)
    }
    user_idx = [i for i in range(len(example_inputs)) if i not in weights]
    options = kfuse_options or (Options(**kwargs["options"]) if "options" in kwargs else Options())

    def compile_for(inputs: list[Any]) -> tuple[CompiledModel, list[int]]:
        """A CompiledModel for ``inputs`` (all graph inputs, concrete), and which of them it takes."""
        fixed = {i: int(inputs[i]) for i in user_idx if not isinstance(inputs[i], torch.Tensor)}
        wrapper = _WeightsFrozen(gm, weights, len(inputs), fixed)
        takes = [i for i in user_idx if i not in fixed]

        def importer(a: tuple[Any, ...], k: dict[str, Any]) -> Imported:
            return from_exported_program(export_module(wrapper, a), "dynamo_graph")

        return CompiledModel(importer, wrapper, tuple(inputs[i] for i in takes), {}, options, "dynamo_graph"), takes

    if not _symbolic(example_inputs):
        try:
            compiled, takes = compile_for(list(example_inputs))
        except (FrontendError, HostValueError) as e:  # this graph runs as PyTorch's; the rest of the model is kfuse's
            return _eager(gm, e)

        def run(*all_inputs: Any) -> Any:
            return compiled(*[all_inputs[i] for i in takes])

        run.kfuse_compiled = compiled  # type: ignore[attr-defined]
        return run

    per_shape: dict[tuple, tuple[CompiledModel, list[int]]] = {}

    def run_dynamic(*all_inputs: Any) -> Any:
        user = (all_inputs[i] for i in user_idx)
        key = tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else int(x) for x in user)
        if key not in per_shape and key not in eager_shapes and len(per_shape) >= options.max_shapes:
            if not any(v == _SHAPE_LIMIT for v in eager_shapes.values()):
                warnings.warn(
                    f"kfuse: a Dynamo graph was called with more than {options.max_shapes} input shapes; kfuse compiles "
                    f"{options.max_shapes} a graph (Options.max_shapes) and runs further ones as PyTorch. Each "
                    "shape is a compile: a generation loop should use a static KV cache (cache_implementation='static')",
                    stacklevel=2,
                )
            eager_shapes[key] = _SHAPE_LIMIT
        if key not in per_shape and key not in eager_shapes:
            try:
                per_shape[key] = compile_for(list(all_inputs))
            except (FrontendError, HostValueError) as e:  # as in the static case: PyTorch runs this graph
                eager_shapes[key] = _eager(gm, e).kfuse_eager  # type: ignore[attr-defined]
                run_dynamic.kfuse_eager = eager_shapes[key]  # type: ignore[attr-defined]
        if key in eager_shapes:
            return gm(*all_inputs)
        compiled, takes = per_shape[key]
        return compiled(*[all_inputs[i] for i in takes])

    eager_shapes: dict[tuple, str] = {}

    run_dynamic.kfuse_per_shape = per_shape  # type: ignore[attr-defined]
    return run_dynamic


_SHAPE_LIMIT = "past Options.max_shapes"


def _eager(gm: torch.fx.GraphModule, error: Exception) -> Callable[..., Any]:
    """A Dynamo graph kfuse cannot take (it returns a Python value; a host read of a computed tensor), run as
    PyTorch runs it; ``kfuse_eager`` says why (``DynamoCompiledModel.report["eager_graphs"]``)."""

    def run(*all_inputs: Any) -> Any:
        return gm(*all_inputs)

    run.kfuse_eager = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"  # type: ignore[attr-defined]
    return run


def _symbolic(inputs: list[Any]) -> bool:
    """Whether Dynamo traced with dynamic shapes: SymInt inputs or tensors with symbolic sizes."""
    for x in inputs:
        if isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape)):
            return True
    return False


def register() -> None:
    """Register ``"kfuse"`` with Dynamo (also done by the package's entry point)."""
    from torch._dynamo import list_backends, register_backend

    if "kfuse" not in list_backends(exclude_tags=()):
        register_backend(compiler_fn=kfuse_backend, name="kfuse")


def _reachable_state(root: Any, depth: int = 6) -> tuple[list[torch.Tensor], list[tuple[Any, str, Any]]]:
    """The tensors reachable from ``root`` through containers and plain objects' attributes (a transformers cache:
    ``cache.layers[i].keys``), and those objects' scalar attributes (``layer.cumulative_length_int``) as
    (object, name, value)."""
    tensors: list[torch.Tensor] = []
    scalars: list[tuple[Any, str, Any]] = []
    seen: set[int] = set()

    def walk(x: Any, d: int) -> None:
        if id(x) in seen or d < 0:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, list | tuple | set):
            for v in x:
                walk(v, d - 1)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, d - 1)
        elif not isinstance(x, torch.nn.Module | type) and not callable(x) and hasattr(x, "__dict__"):
            for k, v in vars(x).items():
                if isinstance(v, bool | int | float):
                    scalars.append((x, k, v))
                else:
                    walk(v, d - 1)

    walk(root, depth)
    return tensors, scalars


@contextlib.contextmanager
def state_restored(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
    """Whatever a call of ``model`` writes in its buffers and in the tensors and plain objects its arguments
    reach, as it was before the call (the call that traces a model for compiling must not advance its state)."""
    tensors, scalars = _reachable_state((args, kwargs))
    reached = {id(t) for t in tensors}
    tensors += [b for b in model.buffers() if id(b) not in reached]
    saved = [t.clone() for t in tensors]
    try:
        yield
    finally:
        for t, v in zip(tensors, saved, strict=True):
            t.copy_(v)
        for obj, name, value in scalars:
            setattr(obj, name, value)


class DynamoCompiledModel:
    """What ``kfuse.compile`` returns for a model torch.export cannot take (``ExportError``): the model under
    ``torch.compile`` with kfuse as the backend, compiled now on the example inputs. Dynamo splits the forward
    where it must (Mixtral's expert routing runs in Python between graphs); each graph it hands over is a
    ``CompiledModel``, checked against PyTorch on its own inputs. ``report`` joins theirs and says why."""

    def __init__(self, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], options: Options, reason: str) -> None:
        self.options, self.name, self.reason = options, type(model).__name__, reason
        self.graphs: list[Callable[..., Any]] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kw: Any) -> Callable[..., Any]:
            run = kfuse_backend(gm, example_inputs, kfuse_options=options)
            self.graphs.append(run)
            return run

        t0 = time.perf_counter()
        self._fn = torch.compile(model, backend=backend)
        # Dynamo traces and kfuse compiles every graph of this call now; the call runs the model, so what it writes
        # (a static KV cache and its length, a buffer) is put back: the user's first call writes it, once
        with torch.no_grad(), state_restored(model, args, kwargs):
            self._fn(*args, **kwargs)
        self.compile_s = time.perf_counter() - t0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def compiled_graphs(self) -> list[Any]:
        """The ``CompiledModel`` of every graph Dynamo handed over (each shape of a dynamic one)."""
        out: list[Any] = []
        for run in self.graphs:
            out += [run.kfuse_compiled] if hasattr(run, "kfuse_compiled") else [c for c, _ in getattr(run, "kfuse_per_shape", {}).values()]
        return out

    @property
    def report(self) -> dict[str, Any]:
        reps = [c.report for c in self.compiled_graphs()]
        kernels = [dict(k, name=f"g{i}.{k['name']}") for i, r in enumerate(reps) for k in r["kernels"]]
        op_counts: dict[str, int] = {}
        for r in reps:
            for op, n in r.get("op_counts", {}).items():
                op_counts[op] = op_counts.get(op, 0) + n
        rep: dict[str, Any] = {
            "model": self.name,
            "frontend": "dynamo",
            "frontend_reason": self.reason.split("\n")[0][:400],
            "graphs": len(reps),
            "backend": reps[0]["backend"] if reps else "-",
            "compile_s": self.compile_s,
            "cuda_graph": ", ".join(f"g{i} {r['cuda_graph']}" for i, r in enumerate(reps)),
            "stages": [{"name": f"dynamo graph g{i}", "nodes": len(r["kernels"])} for i, r in enumerate(reps)],
            "op_counts": op_counts,
            "kernels": kernels,
            "fallback": sorted({f for r in reps for f in r.get("fallback", [])}),
            "per_graph": reps,
        }
        eager = [run.kfuse_eager for run in self.graphs if hasattr(run, "kfuse_eager")]
        if eager:  # graphs left to PyTorch as a whole
            rep["eager_graphs"] = eager
            rep["fallback"] = sorted({*rep["fallback"], "dynamo graph (whole)"})
        writes = [dict(w, graph=f"g{i}") for i, r in enumerate(reps) for w in r.get("state_writes", [])]
        if writes:
            rep["state_writes"] = writes
        errs = [r for r in reps if "max_rel_err" in r]
        if errs:
            rep["max_abs_err"] = max(r["max_abs_err"] for r in errs)
            rep["max_rel_err"] = max(r["max_rel_err"] for r in errs)
        return rep

    def save_report(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.report, f, indent=2, default=str)
