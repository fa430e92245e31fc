"""Whole-plan CUDA graphs: capture the plan once per input-shape signature, replay on call.

Inputs are copied into static buffers before replay; outputs are the graph's static output
tensors, cloned (by default) so a later call cannot overwrite what the caller holds. The plan's
memory arena (kfuse.passes.memory_plan) is allocated by the warm-up runs, before capture, so
the captured kernels read and write fixed addresses.

Capture is an optimisation, never a failure: if it is impossible (CPU tensors, an op that
synchronises or reads a value to the host during capture, ...) the runner records why
(``reason``), leaves the device usable and runs the plan eagerly. A call whose inputs do not
match the captured signature also runs eagerly, and is counted.

Inputs the plan writes (``bound``: a static KV cache, a counter; ``kfuse.runtime.state_writes``) are not
copied: the graph reads and writes the caller's tensor itself. A graph is captured for each set of their
addresses (the first call with a new cache captures once more, without running anything), and the last
few are kept (``MAX_BOUND_GRAPHS``): a decoder's generation loop passes the same cache every step.

Everything CUDA-specific goes through ``cuda`` (``torch.cuda`` by default), so the bookkeeping
is testable on a CPU with a mock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kfuse.runtime.executor import Plan, execute
from kfuse.runtime.output_copy import fresh_copies

# graphs kept per runner for inputs it writes in place, one per set of their addresses (least recently used dropped)
MAX_BOUND_GRAPHS = 4

Signature = tuple[tuple[tuple[int, ...], torch.dtype, str, tuple[int, ...]], ...]


def signature(inputs: Sequence[torch.Tensor]) -> Signature:
    """Shape, dtype, device (with its index) and strides of each input: what a capture is valid for."""
    return tuple((x.shape, x.dtype, x.device, x.stride()) for x in inputs)  # compared every call: no string building


def save_rng(cuda: Any) -> list[tuple[Any, Any]]:
    """Copies of the CUDA generators' states, taken before a capture (see ``restore_rng``)."""
    if cuda is not torch.cuda or not torch.cuda.is_initialized():
        return []
    gens = [g for g in torch.cuda.default_generators if hasattr(g, "clone_state") and hasattr(g, "graphsafe_set_state")]
    return [(g, g.clone_state()) for g in gens]


def restore_rng(saved: list[tuple[Any, Any]]) -> None:
    """A capture that fails leaves each CUDA generator marked as capturing (its epilogue never ran),
    and every later ``torch.randn`` on the GPU then fails with "Offset increment outside graph
    capture". Putting back the copies taken before the capture clears that."""
    for g, state in saved:
        g.graphsafe_set_state(state)


def recover_after_failed_capture(cuda: Any, rng: list[tuple[Any, Any]]) -> str:
    """Leave the device usable after a failed capture: synchronise, put the RNG states back.
    Returns what went wrong doing so ("" if nothing), to append to the capture's reason; errors
    here are secondary to the capture failure, so they are reported, not raised."""
    notes = ""
    try:
        cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a sticky error is reported, not raised
        notes += f"; synchronize after the failed capture: {why(e)}"
    try:
        restore_rng(rng)
    except Exception as e:  # noqa: BLE001
        notes += f"; restoring the CUDA RNG state: {why(e)}"
    return notes


def own_cublas_workspace(cuda: Any) -> None:
    """Drop PyTorch's cached cuBLAS / cuBLASLt workspaces just before a capture, so the GEMMs the
    graph captures get a workspace allocated during the capture, in the graph's own memory pool.

    PyTorch caches one workspace per (cuBLAS handle, stream), and a capture reuses whatever is
    cached for its stream: a block that an earlier capture on the same stream (the tuner's timing
    graphs) allocated in its pool. Whoever clears that cache later frees the block;
    ``torch.compile(mode="reduce-overhead")`` does so around each of its captures. The graph's GEMMs
    then write into memory that is no longer theirs (session 26: Llama-1b B8 S512 failed with "unspecified
    launch failure" on kfuse's first replay after a reduce-overhead baseline). A block in the graph's
    own pool stays reserved while the graph exists, even once the cache lets it go. torch.compile's
    CUDA-graph trees clear the cache for the same reason."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None) if cuda is torch.cuda else getattr(cuda, "clear_cublas_workspaces", None)
    if clear is not None:
        clear()


def why(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:300]}"


class CudaGraphRunner:
    """Runs ``plan`` through one captured CUDA graph (or eagerly, with ``reason`` saying why)."""

    def __init__(
        self,
        plan: Plan,
        example_inputs: Sequence[torch.Tensor],
        warmup: int = 2,
        cuda: Any = None,
        pool: Any = None,
        bound: Sequence[int] = (),
    ) -> None:
        self.plan = plan
        self.bound = tuple(bound)  # input positions the plan writes: bound by address, never copied
        self._bound_graphs: dict[tuple[int, ...], tuple[Any, list[torch.Tensor]]] = {}
        self._warmup_key: tuple[int, ...] | None = None
        self.cuda = cuda if cuda is not None else torch.cuda
        self.graph: Any = None
        self.static_inputs: list[torch.Tensor] = []
        self.static_outputs: list[torch.Tensor] = []
        self.signature = signature(example_inputs)
        self.reason = ""
        self.captures = 0
        self.replays = 0
        self.eager_calls = 0
        reason = self._precheck(example_inputs)
        if reason:
            self.reason = reason
            return
        self.static_inputs = [x.clone() for x in example_inputs]
        rng = save_rng(self.cuda)
        try:
            self._capture(warmup, pool)
        except Exception as e:  # capture is an optimisation: report and run eagerly
            self.graph = None
            self.static_outputs = []
            self.reason = why(e) + recover_after_failed_capture(self.cuda, rng)

    # ---- capture -------------------------------------------------------------------------
    def _precheck(self, inputs: Sequence[torch.Tensor]) -> str:
        if not self.cuda.is_available():
            return "no CUDA device"
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                return f"input {i} is a {type(x).__name__}, not a tensor"
            if x.device.type != "cuda" and self.cuda is torch.cuda:
                return f"input {i} is on {x.device}, not on the GPU"
        if self.plan.backend not in ("triton", "torch"):
            return f"backend {self.plan.backend} does not run on the GPU"
        return ""

    def _capture(self, warmup: int, pool: Any) -> None:
        cuda = self.cuda
        stream = cuda.Stream()
        stream.wait_stream(cuda.current_stream())
        with cuda.stream(stream):  # compiles Triton kernels, builds the arena, fills caches
            for _ in range(max(1, warmup)):
                execute(self.plan, self.static_inputs)
        cuda.current_stream().wait_stream(stream)
        cuda.synchronize()
        g = cuda.CUDAGraph()
        own_cublas_workspace(cuda)
        # on the warm-up stream: torch.cuda.graph's default capture stream is one per process, made on whichever
        # device was current at the first capture, and capturing on it makes that device current
        with cuda.graph(g, pool=pool, stream=stream):
            outs = execute(self.plan, self.static_inputs)
        self.static_outputs = list(outs)
        self.graph = g
        self.captures += 1
        if self.bound:  # captured on clones of the written inputs: dropped at the first capture for the caller's
            self._warmup_key = self._addresses(self.static_inputs)
            self._bound_graphs[self._warmup_key] = (g, self.static_outputs)

    def _addresses(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        return tuple(inputs[i].data_ptr() for i in self.bound)

    def _bound_graph(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, list[torch.Tensor]] | None:
        """The graph that reads and writes these written inputs where they are; captured now for new addresses
        (no warm-up: every kernel ran in the first capture's, and capturing runs nothing, so the caller's
        state is not touched until the replay). None, with ``reason`` saying why, if that capture fails."""
        key = self._addresses(inputs)
        entry = self._bound_graphs.pop(key, None)
        if entry is None:
            if len(self._bound_graphs) >= MAX_BOUND_GRAPHS:
                self._bound_graphs.pop(next(iter(self._bound_graphs)))
            rng = save_rng(self.cuda)
            try:
                entry = self._capture_bound(inputs)
            except Exception as e:  # as for the first capture: the call runs eagerly, and the runner says why
                self.reason = "capture for new addresses of written inputs: " + why(e) + recover_after_failed_capture(self.cuda, rng)
                return None
            if self._bound_graphs.pop(self._warmup_key, None) is not None:
                # the clones (a whole KV cache) and their graph go; this graph is the runner's graph from now on
                for i in self.bound:
                    self.static_inputs[i] = inputs[i]
                self.graph, self.static_outputs = entry
        self._bound_graphs[key] = entry  # most recently used last
        return entry

    def _capture_bound(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
        static = list(self.static_inputs)
        for i in self.bound:
            static[i] = inputs[i]
        g = self.cuda.CUDAGraph()
        stream = self.cuda.Stream()
        stream.wait_stream(self.cuda.current_stream())
        with self.cuda.graph(g, stream=stream):
            outs = execute(self.plan, static)
        self.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        return g, list(outs)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    # ---- calling -------------------------------------------------------------------------
    def __call__(self, inputs: Sequence[torch.Tensor], clone_outputs: bool | Sequence[bool] = True) -> list[torch.Tensor]:
        if self.graph is None or signature(inputs) != self.signature:
            self.eager_calls += 1
            return execute(self.plan, inputs)
        entry = (self.graph, self.static_outputs) if not self.bound else self._bound_graph(inputs)
        if entry is None:
            self.eager_calls += 1
            return execute(self.plan, inputs)
        graph, outs = entry
        for k, (dst, src) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if dst.data_ptr() != src.data_ptr() and k not in self.bound:
                dst.copy_(src)
        graph.replay()
        self.replays += 1
        return fresh_copies(outs, clone_outputs)  # the next replay overwrites them

    def stats(self) -> dict[str, Any]:
        return {
            "captured": self.captured,
            "reason": self.reason,
            "captures": self.captures,
            "replays": self.replays,
            "eager_calls": self.eager_calls,
            "bound_graphs": len(self._bound_graphs),
        }
