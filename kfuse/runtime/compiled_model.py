"""``CompiledModel``: callable like the original model, one compiled variant per input-shape
signature, with the compile report."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import Imported
from kfuse.runtime import parallel_compile
from kfuse.runtime.cuda_graph import CudaGraphRunner
from kfuse.runtime.device import first_device, on_device
from kfuse.runtime.executor import Plan, execute, lower, precompile_plan
from kfuse.runtime.output_copy import copies_needed
from kfuse.runtime.piecewise_graph import PiecewiseGraphRunner
from kfuse.runtime.state_writes import protect, write_in_place, written_positions


class PhaseClock:
    """Wall time of a compile's phases, in the order they ran (``report["compile_phases_s"]``): which part
    of a slow compile to look at. A phase that did nothing reads 0.0 and is left out."""

    def __init__(self) -> None:
        self._s: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    def start(self, name: str) -> None:
        self.stop()
        self._open = (name, time.perf_counter())

    def stop(self) -> None:
        if self._open is not None:
            name, t = self._open
            self._s[name] = self._s.get(name, 0.0) + time.perf_counter() - t
            self._open = None

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def seconds(self) -> dict[str, float]:
        self.stop()
        return {k: round(v, 3) for k, v in self._s.items() if v >= 5e-4}


class KfuseInputError(TypeError):
    """A call's inputs do not match what the model was compiled for."""


@dataclass
class Variant:
    """The compiled form for one input-shape signature."""

    imported: Imported
    stages: list[tuple[str, Any]]
    plan: Plan
    runner: CudaGraphRunner | PiecewiseGraphRunner | None
    compile_s: float
    report: dict[str, Any] = field(default_factory=dict)
    profile: list[dict[str, Any]] | None = None
    copy_outputs: bool = True
    # per output, whether a call copies it: False where the output structure's rebuild copies it anyway
    # (``kfuse.runtime.output_copy.copies_needed``; Hugging Face's DynamicCache)
    call_copies: tuple[bool, ...] | None = None

    def run(self, flat_inputs: list[Any], rebuilt: bool = False) -> list[torch.Tensor]:
        """The plan's flat outputs; ``rebuilt``: the caller unflattens them into the model's output structure
        at once (``CompiledModel.__call__``), so outputs that rebuild copies are not copied here too."""
        xs = self.imported.graph_inputs(flat_inputs)
        if self.runner is not None:
            which = self.call_copies if rebuilt and self.copy_outputs and self.call_copies is not None else self.copy_outputs
            return self.runner(xs, clone_outputs=which)
        return execute(self.plan, xs)


def _b2b_section(plan: Plan) -> dict[str, Any]:
    """Back-to-back fusion: which chains fused, with which residence, and why others did not."""
    from kfuse.passes.fuse_b2b import b2b_report

    return b2b_report(plan)


def _signature(flat: list[Any]) -> tuple[Any, ...]:
    # the device with its index: inputs on cuda:1 must not replay a plan built for cuda:0
    return tuple((x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else ("py", repr(x)) for x in flat)


def _input_paths(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    leaves, _ = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    names = []
    for path, _ in leaves:
        key = pytree.keystr(path)
        if key.startswith("[0]"):
            key = "args" + key[3:]
        elif key.startswith("[1]"):
            key = "kwargs" + key[3:]
        names.append(key)
    return names


# relative error past which the check warns: an order of magnitude above what TF32 / fp16 / bf16
# arithmetic gives on the zoo's models
# float64 models run in float64 throughout (pointwise chains stay on PyTorch's ops), so far less slack
_CHECK_TOLERANCE = {torch.float32: 1e-2, torch.float64: 1e-6, torch.float16: 5e-2, torch.bfloat16: 1e-1}


class CompiledModel:
    """The result of ``kfuse.compile``. Call it like the model."""

    def __init__(
        self,
        importer: Callable[[tuple[Any, ...], dict[str, Any]], Imported],
        reference: Callable[..., Any] | None,
        example_args: tuple[Any, ...],
        example_kwargs: dict[str, Any],
        options: Options,
        name: str,
    ) -> None:
        self._importer = importer
        self._reference = reference
        self.options = options
        self.name = name
        self.variants: dict[tuple[Any, ...], Variant] = {}
        self.eager_calls = 0  # calls past Options.max_shapes, run as PyTorch
        self._kw_order = list(example_kwargs)  # calls may name the keyword arguments in any order
        flat, self._in_spec = pytree.tree_flatten((tuple(example_args), dict(example_kwargs)))
        self._paths = _input_paths(example_args, example_kwargs)
        self._ranks = [(x.dim(), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else None for x in flat]
        # compiled for tensors as positional arguments only: such calls skip pytree (its tree walk was
        # half of the call wrapper's ~40 us, which a small model's one-kernel graph replay cannot hide)
        self._positional = not example_kwargs and len(example_args) == len(flat) and all(isinstance(x, torch.Tensor) for x in flat)
        self._compile(tuple(example_args), dict(example_kwargs), flat)

    # ---- compiling -----------------------------------------------------------------------
    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> Variant:
        # everything below (tuning, measured choices, capture, the check) on the inputs' GPU, also where another is current
        # (where a call runs: its first tensor input's device; the plan's constants are moved there)
        device = first_device(flat)
        with on_device(device):
            return self._compile_on(args, kwargs, flat, device)

    def _compile_on(self, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any], device: torch.device) -> Variant:
        t0 = time.perf_counter()
        phases = PhaseClock()
        if device.type == "cuda":  # compile workers start now and import while the model is traced
            parallel_compile.start_pool()
        with phases("import"):
            imported = self._importer(args, kwargs)
        # tuned on the device the plan runs on: the graph's constants need not be there (ONNX initializers are CPU tensors)
        with phases("graph_passes"):  # includes tuning (the pipeline's "tune" stage)
            opt = optimize(imported.graph, self.options, device=device)
        with phases("lower"):  # measured choices: b2b and gated-MLP fused-vs-unfused, library vs template
            plan = lower(opt.graph, device, self.options.backend, options=self.options)
            state_report = self._state_writes(plan, imported, pair=self.options.pair_cache_writes)
        plan.use_memory_plan = self.options.memory_plan
        # every run below is the compiler's own (first compiles, timing, capture warm-up): on clones of the inputs
        # forward writes, so compiling does not change the caller's state; the call after it does, once
        xs = protect(imported.graph_inputs(flat), written_positions(plan))
        with phases("first_run_compile"):
            precompiled = precompile_plan(plan, xs) if plan.backend == "triton" and device.type == "cuda" else None
        if self.options.b2b_recheck and plan.backend == "triton" and device.type == "cuda":
            from kfuse.runtime.b2b_recheck import recheck_b2b

            with torch.no_grad(), phases("b2b_recheck"):  # close fused-vs-unfused decisions timed again on the whole plan
                recheck_b2b(plan, xs)
        pdl_choice = None
        if self.options.pdl == "auto" and plan.pdl and device.type == "cuda":
            from kfuse.runtime.pdl_choice import choose_pdl

            with torch.no_grad(), phases("pdl_choice"):  # on or off, whichever runs the whole plan faster
                pdl_choice = choose_pdl(plan, xs, precompile=precompile_plan if precompiled is not None else None)
        alternatives = None
        if self.options.recheck_alternatives and plan.pdl and plan.backend == "triton" and device.type == "cuda":
            from kfuse.runtime.plan_alternatives import recheck

            with torch.no_grad(), phases("alternatives_recheck"):  # close race runners-up timed again in the plan, under PDL
                alternatives = recheck(plan, xs)
        # before the CUDA graph is captured: a tuned cubin replaces the kernel the graph would record
        with phases("sass"):
            sass_report = self._sass(plan, xs, device) if self.options.sass else None
        runner = None
        cuda_graph_note = "off"
        if self.options.cuda_graphs and device.type == "cuda":
            with phases("cuda_graph"):  # the first run (every kernel's first launch) and the capture
                host_sync = any(s.host_sync for s in plan.steps)
                if host_sync and plan.input_writes:
                    runner = None
                    ok = "not captured (a step reads a value on the host, and forward writes its inputs)"
                elif host_sync:
                    runner = PiecewiseGraphRunner(plan, xs)
                    n_sync = runner.stats()["host_sync_steps"]
                    ok = f"captured piecewise: {runner.graphs} graphs around {n_sync} host-sync step(s)"
                else:
                    runner = CudaGraphRunner(plan, xs, bound=written_positions(plan))
                    ok = "captured"
            cuda_graph_note = ok if runner is None or runner.captured else f"not captured ({runner.reason})"
            if runner is not None and not runner.captured:
                runner = None
        variant = Variant(imported, opt.stages, plan, runner, time.perf_counter() - t0, copy_outputs=self.options.copy_outputs)
        if runner is not None:
            variant.call_copies = copies_needed(runner.static_outputs, imported.out_spec)
        variant.report = self._make_report(variant, cuda_graph_note)
        if self.options.check and self._reference is not None:
            with phases("check"):
                variant.report.update(self._check(variant, args, kwargs, flat))
        variant.report["compile_phases_s"] = phases.seconds()
        if alternatives:
            variant.report["alternatives_recheck"] = alternatives
        if precompiled is not None and precompiled.requests:
            variant.report["parallel_compile"] = precompiled.summary()
        if plan.memory is not None:
            variant.report["memory"] = plan.memory.report()
        if plan.concat_groups:
            from kfuse.runtime.concat_in_place import report as concat_report

            variant.report["concat_in_place"] = concat_report(plan.graph, plan.concat_groups)
        if self.options.tune != "none":
            from kfuse.tune import tuner

            if tuner.LAST:
                variant.report["tune"] = getattr(tuner.LAST[0], "stats", None)
        if sass_report is not None:
            variant.report["sass"] = sass_report
        if state_report:
            variant.report["state_writes"] = state_report
        if pdl_choice is not None:
            variant.report["pdl_choice"] = pdl_choice
        if self.options.profile:
            from kfuse.runtime.profile import profile_plan, profile_summary

            variant.profile = profile_plan(plan, xs)
            variant.report["profile_summary"] = profile_summary(variant.profile)
        self.variants[_signature(flat)] = variant
        if self.options.explain:
            from kfuse.report import print_explain

            print_explain(self, variant)
        return variant

    @staticmethod
    def _state_writes(plan: Plan, imported: Imported, pair: bool = True) -> list[dict[str, Any]]:
        """The inputs and buffers forward writes: the plan writes them back, in place where it can
        (``kfuse.runtime.state_writes``); one report entry per written input."""
        if not imported.input_writes:
            return []
        n_out = len(plan.graph.outputs)
        if any(o >= n_out for o, _ in imported.input_writes):  # a pass dropped an output: writing back would be wrong
            raise RuntimeError(f"kfuse: the optimised graph has {n_out} outputs, fewer than the written inputs need")
        plan.input_writes = imported.input_writes
        return write_in_place(plan, pair=pair)

    def _sass(self, plan: Any, xs: list[Any], device: torch.device) -> dict[str, Any]:
        """SASS schedule tuning of the plan's hottest Triton kernels (``kfuse.runtime.sass_plan``)."""
        if device.type != "cuda" or not torch.cuda.is_available():
            reason = "not applied: SASS tuning times and verifies candidate schedules on a CUDA GPU"
            warnings.warn(f"kfuse: sass=True {reason}", stacklevel=4)
            return {"applied": False, "reason": reason, "kernels": [], "skipped": []}
        from kfuse.runtime.sass_plan import tune_plan

        o = self.options
        return tune_plan(plan, xs, kernels=o.sass_kernels, samples=o.sass_samples, iterations=o.sass_iterations,
                         log=print if o.explain else None)  # fmt: skip

    def _make_report(self, v: Variant, cuda_graph_note: str) -> dict[str, Any]:
        counts = v.plan.graph.op_counts()
        return {
            "model": self.name,
            "backend": v.plan.backend,
            "compile_s": round(v.compile_s, 3),
            "cuda_graph": cuda_graph_note,
            "pdl": v.plan.pdl,
            "inputs": [{"name": n, "type": str(t)} for n, t in v.plan.graph.inputs],
            "stages": [{"name": n, "nodes": len(g.nodes), "constants": len(g.constants)} for n, g in v.stages],
            "op_counts": counts,
            "kernels": [k.as_dict() for k in v.plan.kernels],
            "fallback": sorted(set(v.imported.fallbacks) & {k.ops[0] for k in v.plan.kernels if k.template == "fallback"}),
            "fallback_at_import": sorted(set(v.imported.fallbacks)),
            "b2b": _b2b_section(v.plan),
        }

    def _check(self, v: Variant, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> dict[str, Any]:
        xs = v.imported.graph_inputs(flat)
        written = [xs[i] for i in written_positions(v.plan)]
        before = [t.clone() for t in written]
        with torch.no_grad():
            ref = self._reference(*args, **kwargs)
            if written:  # an output may be a written input itself (a counter forward returns): kept as it is now
                ref = pytree.tree_map(lambda r: r.clone() if isinstance(r, torch.Tensor) else r, ref)
            ref_state = [t.clone() for t in written]  # what forward wrote, to check kfuse writes the same
            for t, b in zip(written, before, strict=True):
                t.copy_(b)
            out = v.run(flat)
            out = list(out) + [t.clone() for t in written]
            for t, b in zip(written, before, strict=True):  # the call after the compile writes, not the compile
                t.copy_(b)
        ref_flat = [r for r in pytree.tree_leaves(ref) if isinstance(r, torch.Tensor)]
        from kfuse.runtime.varlen import zero_padded_reference  # padding-free outputs are zero at padded positions

        ref_flat = zero_padded_reference(v.plan.graph, xs, ref_flat) + ref_state
        if len(out) != len(ref_flat):
            raise RuntimeError(f"kfuse returned {len(out)} outputs where PyTorch returns {len(ref_flat)}")
        abs_err, rel_err = 0.0, 0.0
        for o, r in zip(out, ref_flat, strict=True):
            if o.shape != r.shape:
                raise RuntimeError(f"kfuse output shape {tuple(o.shape)} differs from PyTorch's {tuple(r.shape)}")
            if o.dtype != r.dtype:
                raise RuntimeError(f"kfuse output dtype {o.dtype} differs from PyTorch's {r.dtype}")
            if not o.is_floating_point():
                wrong = float((o != r).sum())
                abs_err = max(abs_err, wrong)  # integer outputs: the count of elements that differ
                rel_err = float("inf") if wrong else rel_err  # they must match exactly
                continue
            d = (o.double() - r.double()).abs().max().item() if o.numel() else 0.0
            scale = r.double().abs().max().item() if r.numel() else 0.0
            abs_err = max(abs_err, d)
            rel_err = max(rel_err, d / max(scale, 1e-12))
        # far past rounding (TF32 GEMMs, fp16 accumulation orders): say so, not only in the report
        tol = max((_CHECK_TOLERANCE.get(r.dtype, 0.0) for r in ref_flat), default=0.0)
        if tol and rel_err > tol:
            warnings.warn(
                f"kfuse: {self.name} differs from PyTorch on the example inputs: max_rel_err {rel_err:.2e} > {tol:g} "
                "(report['max_rel_err']); please report it with the model",
                stacklevel=4,
            )
        return {"max_abs_err": abs_err, "max_rel_err": rel_err}

    # ---- calling -------------------------------------------------------------------------
    def _validate(self, flat: list[Any]) -> None:
        if len(flat) != len(self._ranks):
            raise KfuseInputError(f"{self.name}: expected {len(self._ranks)} inputs ({', '.join(self._paths)}), got {len(flat)}")
        for path, x, want in zip(self._paths, flat, self._ranks, strict=True):
            if want is None:
                continue
            if not isinstance(x, torch.Tensor):
                raise KfuseInputError(f"{self.name}: input {path} must be a tensor, got {type(x).__name__}")
            rank, dtype, dev = want
            if x.dtype != dtype:
                raise KfuseInputError(f"{self.name}: input {path} has dtype {x.dtype}, compiled for {dtype}")
            if x.device.type != dev:
                raise KfuseInputError(f"{self.name}: input {path} is on {x.device}, compiled for {dev}")
            if x.dim() != rank:
                raise KfuseInputError(f"{self.name}: input {path} has rank {x.dim()} (shape {tuple(x.shape)}), compiled for rank {rank}")

    def _variant_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Variant, list[Any]]:
        """The variant for a call's inputs (compiled on a new shape signature) and the flat inputs, checked
        against what the model was compiled for."""
        if self._positional and not kwargs and len(args) == len(self._ranks) and all(type(a) is torch.Tensor for a in args):
            flat = list(args)  # the example's structure: nothing for pytree to find
        else:
            if set(kwargs) != set(self._kw_order):
                raise KfuseInputError(f"{self.name}: called with keyword arguments {sorted(kwargs)}, compiled for {sorted(self._kw_order)}")
            kwargs = {k: kwargs[k] for k in self._kw_order}  # the compile-time order: pytree specs are order-sensitive
            flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
            if spec != self._in_spec:
                raise KfuseInputError(f"{self.name}: called with inputs structured as {spec}, compiled for {self._in_spec}")
        variant = self.variants.get(_signature(flat))
        if variant is None:  # a known signature was checked when it was compiled: a decode step's 47 inputs cost ~40 us a call
            self._validate(flat)
        if variant is None and len(self.variants) >= self.options.max_shapes and self._reference is not None:
            return None, flat  # past the shape limit: PyTorch runs this call (``__call__``)
        if variant is None:  # a new shape signature: compile once more and cache
            variant = self._compile(tuple(args), dict(kwargs), flat)
        return variant, flat

    def _past_shape_limit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.eager_calls:
            warnings.warn(
                f"kfuse: {self.name} was called with more than {self.options.max_shapes} input shapes; kfuse compiles "
                f"{self.options.max_shapes} (Options.max_shapes) and runs further ones as PyTorch. Each shape "
                "is a compile: a generation loop should use a static KV cache (cache_implementation='static')",
                stacklevel=3,
            )
        self.eager_calls += 1
        with torch.no_grad():
            return self._reference(*args, **kwargs)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        variant, flat = self._variant_for(args, kwargs)
        if variant is None:
            return self._past_shape_limit(args, kwargs)
        with on_device(first_device(flat)):  # kfuse's kernels and graph replays on the inputs' GPU
            out = variant.run(flat, rebuilt=True)
        spec = variant.imported.out_spec
        return out[0] if spec.is_leaf() else pytree.tree_unflatten(out, spec)

    def step_errors(self, *args: Any, **kwargs: Any) -> tuple[list[Any], float]:
        """Each plan step's own error on these inputs against PyTorch's ops for the same graph, and the output's
        error (``kfuse.runtime.step_errors``): a wrong kernel stands out as itself, error a deep net amplifies
        as small step errors under a larger output error."""
        from kfuse.runtime.step_errors import step_errors

        variant, flat = self._variant_for(args, kwargs)
        if variant is None:
            raise KfuseInputError(f"{self.name}: no compiled variant for these shapes (past Options.max_shapes)")
        with on_device(first_device(flat)):
            xs = protect(variant.imported.graph_inputs(flat), written_positions(variant.plan))  # a diagnosis writes no state
            return step_errors(variant.plan, xs)

    # ---- reporting -----------------------------------------------------------------------
    @property
    def report(self) -> dict[str, Any]:
        """The report of the most recently compiled variant."""
        return self.variant.report

    @property
    def variant(self) -> Variant:
        """The most recently compiled variant."""
        return list(self.variants.values())[-1]

    @property
    def plan(self) -> Plan:
        return self.variant.plan

    def save_report(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.report, f, indent=2, default=str)
