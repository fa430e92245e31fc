"""Measured choice between lowering candidates of one node (template vs library, fused vs not).

Every candidate runs on inputs of the node's types (graph constants as they are, activations
random; integer inputs such as masks all ones) and is timed from CUDA-graph replays, i.e. GPU
time without Python launch overhead, as inside the compiled model's plan. A candidate that fails
to run is never chosen. Results are cached per problem in the process and, on a GPU, in the
tuning database (``choices`` table, keyed by GPU, Triton/kfuse versions, problem and candidate
list), so a later compile in a new process does not measure again. ``KFUSE_CHOICE_DB=0`` turns the
database off.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Hashable
from typing import Any

import torch

from kfuse.runtime import cuda_fault

_CACHE: dict[Hashable, tuple[str, dict[str, float]]] = {}


def library_mode(options: Any) -> str:
    """ "auto" | "never" | "always": the compile option ``gemm_library`` (kfuse kernel vs vendor
    library per node), overridden by ``$KFUSE_GEMM_LIBRARY``."""
    mode = getattr(options, "gemm_library", "auto") if options is not None else "auto"
    return os.environ.get("KFUSE_GEMM_LIBRARY", mode)


def constant_view(graph: Any, name: str, device: Any) -> torch.Tensor | None:
    """``name``'s value where it is a constant, or a transposing ``permute`` of one (an nn.Linear weight read as
    ``[K, N]``): the tensor the plan will pass, strides included, so a candidate is timed on the layout it will
    read (a random ``[K, N]`` stand-in is row-major where the weight is K-contiguous); else None."""
    c = graph.constants.get(name)
    if c is not None:
        return c.to(device)
    producer = next((n for n in graph.nodes if n.name == name), None)
    if producer is not None and producer.op == "permute" and producer.inputs[0] in graph.constants:
        return graph.constants[producer.inputs[0]].to(device).permute(*producer.attrs["dims"])
    return None


def example_inputs(node: Any, graph: Any, device: str = "cuda") -> list[torch.Tensor]:
    """Inputs of the node's types on ``device``: constants (and transposed views of them) as they are, the rest
    random (ones for integer inputs), channels-last where the type says so."""
    xs = []
    for name in node.inputs:
        c = constant_view(graph, name, device)
        if c is not None:
            xs.append(c)
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
    inputs: list[torch.Tensor] | Callable[[], list[torch.Tensor]] | None = None, reference: str | None = None,
) -> tuple[str, dict[str, float]]:  # fmt: skip
    """(name of the fastest candidate, ms per candidate); ``key`` names the problem for the cache;
    ``inputs``: representative inputs where random ones are not (e.g. prefix sums), or a function making them
    (called on a cache miss only: a hit times nothing and needs none). ``reference``: a candidate whose output every
    other one must match (``unfused.wrong_result``) before it is timed; one that does not is never chosen."""
    from kfuse.bench.harness import gpu_time_ms
    from kfuse.runtime.unfused import wrong_result

    full_key = (key, tuple(candidates))
    db = _persistent_db()
    problem = hashlib.sha1(repr(key).encode()).hexdigest()
    names = ",".join(candidates)
    if full_key not in _CACHE and db is not None:
        try:
            hit = db.get_choice(_gpu_name(), problem, names)
        except Exception:  # noqa: BLE001 - a database problem never fails a compile
            hit = None
        if hit is not None and hit[0] in candidates:
            _CACHE[full_key] = hit
    if full_key not in _CACHE:
        xs = inputs() if callable(inputs) else inputs if inputs is not None else example_inputs(node, graph)
        times: dict[str, float] = {}
        faulted = _faulted(db, problem, names)
        compile_together([fn for name, fn in candidates.items() if name not in faulted], xs)
        ref = None
        for name, fn in candidates.items():
            if name in faulted:  # it faulted the GPU in an earlier process: never run again
                times[name] = float("inf")
                continue
            try:
                if reference is not None and name != reference:
                    if ref is None:
                        ref = candidates[reference](xs).clone()
                    if wrong_result(fn(xs), ref) is not None:  # a kernel computing something else never runs the plan
                        times[name] = float("inf")
                        continue
                times[name] = gpu_time_ms(lambda fn=fn: fn(xs))
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run loses, unless it faulted the GPU
                try:
                    cuda_fault.check(e, f"candidate {name!r} of {getattr(node, 'name', node)} ({getattr(node, 'op', '?')})")
                except cuda_fault.CudaFault:
                    _remember_fault(db, problem, names, faulted | {name})
                    raise
                times[name] = float("inf")
        _CACHE[full_key] = (min(times, key=lambda k: times[k]), times)
        if db is not None and any(t != float("inf") for t in times.values()):  # never store a failure
            try:
                db.put_choice(_gpu_name(), problem, names, *_CACHE[full_key])
            except Exception:  # noqa: BLE001
                pass
    return _CACHE[full_key]


def compile_together(fns: list[Callable[[list[torch.Tensor]], Any]], xs: list[torch.Tensor], wait: bool = False) -> None:
    """Compile the candidates' Triton kernels at once on the compile workers (``parallel_compile``), so that a timing
    loop finds them in Triton's cache instead of compiling them one after the other on this thread (the decode step's
    skinny-GEMM races took a cold compile from 10.5 to 36 s, session 48). ``wait=False``: only where the pool is
    already up (a compile starts it), so that a small race outside a compile does not wait ~10 s for workers."""
    if len(fns) < 2 or not _on_gpu(xs):
        return
    from kfuse.runtime import parallel_compile

    parallel_compile.precompile([functools.partial(fn, xs) for fn in fns], wait=wait)


def _on_gpu(xs: list[torch.Tensor]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in xs)


def _faulted(db: Any, problem: str, names: str) -> set[str]:
    """Candidates of this problem that faulted the GPU in an earlier process (``_remember_fault``)."""
    if db is None:
        return set()
    try:
        hit = db.get_choice(_gpu_name(), problem, FAULTED + names)
    except Exception:  # noqa: BLE001 - a database problem never fails a compile
        return set()
    return set(hit[0].split(",")) if hit is not None and hit[0] else set()


def _remember_fault(db: Any, problem: str, names: str, faulted: set[str]) -> None:
    """Store the candidates that faulted, so the compile the user retries in a new process skips them
    (as the tuner records a config that lost the context as failed)."""
    if db is None:
        return
    try:
        db.put_choice(_gpu_name(), problem, FAULTED + names, ",".join(sorted(faulted)), {})
    except Exception:  # noqa: BLE001
        pass


FAULTED = "faulted:"  # the choices table's candidates column for a problem's faulted candidates
_DB: list[Any] = []


def _persistent_db() -> Any:
    """The tuning database for choices (GPU only; None when off or unusable)."""
    if os.environ.get("KFUSE_CHOICE_DB", "1") == "0" or not torch.cuda.is_available():
        return None
    if not _DB:
        try:
            from kfuse.tune.database import TuningDB

            _DB.append(TuningDB())
        except Exception:  # noqa: BLE001 - no database: measure every time
            _DB.append(None)
    return _DB[0]


def _gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


# attributes that describe a node without changing what it computes: the tuner's config, and the
# notes passes leave for the report (a b2b "not fused" reason names its node, so with it in the key
# every one of BERT-base's twelve identical FFN1 GEMMs was timed again and the noise chose
# cuBLASLt for some and kfuse's kernel for others; session 33)
NOT_THE_PROBLEM = frozenset({"config", "b2b", "note"})


def problem_key(node: Any, graph: Any, *extra: Hashable) -> tuple:
    """Input shapes/dtypes and the node's attributes (minus the config and report notes,
    ``NOT_THE_PROBLEM``) as a cache key: identical layers share one measured choice."""
    types = [graph.type_of(i) for i in node.inputs]
    attrs = tuple(sorted((k, str(v)) for k, v in node.attrs.items() if k not in NOT_THE_PROBLEM))
    return (node.op, tuple((tuple(t.shape), str(t.dtype)) for t in types), attrs, *extra)
