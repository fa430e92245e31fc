"""Best-effort (BE) kernels: kfuse's own Parboil/Rodinia-style workloads, each PTB-capable.

Every module defines a ``@triton.jit`` block function and ``make(small, device) -> Workload``.
``small=True`` gives interpreter-sized problems for tests; ``small=False`` sizes each kernel to a
few hundred microseconds to a millisecond on an H200.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kfuse.colocate.ptb import BlockKernel

NAMES = ("sgemm", "stencil7", "lbm", "mriq", "cutcp", "histogram", "hotspot", "pathfinder")
ALIASES = {"stencil": "stencil7", "mri-q": "mriq", "hist": "histogram"}

# CUDA-core (non tensor-core) fp32 FMA peak of an H200 SXM: 132 SMs x 128 FP32 lanes x 2 x 1.98 GHz
FP32_PEAK_FLOPS = 67e12
PEAK_BYTES = 4.3e12  # same copy bandwidth as the harness


@dataclass
class Workload:
    name: str
    kernel: BlockKernel
    reference: Callable[[], torch.Tensor]  # the oracle, from the inputs
    output: Callable[[], torch.Tensor]
    reset: Callable[[], None]  # poison / zero the outputs before a launch
    nominal_class: str  # what the kernel is expected to be: "compute" | "memory" | "neutral"
    tol: float = 1e-5  # max |out - ref| / max |ref|
    # whether running a block range twice leaves the output as once (the GPU backend re-times a launch
    # whose window the GPU may have idled in by running it again); atomics accumulate: not idempotent
    idempotent: bool = True


def resolve(name: str) -> str:
    n = ALIASES.get(name, name)
    if n not in NAMES:
        raise ValueError(f"unknown BE workload {name!r}; known: {', '.join(NAMES)}")
    return n


def make(name: str, small: bool = False, device: str | torch.device = "cpu", seed: int = 0) -> Workload:
    """Build workload ``name`` with fresh random inputs on ``device``. ``small``: the tests' odd-sized
    problem with the interpreter's small blocks on either device, so that it splits into several
    blocks on a GPU too (the GPU's blocks would leave most small problems one block)."""
    mod = importlib.import_module(f"kfuse.colocate.workloads.{resolve(name)}")
    g = torch.Generator().manual_seed(seed)
    return mod.make(small, torch.device(device), g)


def classify(flops_per_s: float, bytes_per_s: float) -> tuple[str, float, float]:
    """Aker's rule on measured utilisation: memory if bandwidth > 50% of peak, compute if FP32 core
    utilisation > 50% (and memory < 50%), neutral otherwise. Returns (class, compute util, memory util)."""
    cu, mu = flops_per_s / FP32_PEAK_FLOPS, bytes_per_s / PEAK_BYTES
    if mu > 0.5:
        return "memory", cu, mu
    if cu > 0.5:
        return "compute", cu, mu
    return "neutral", cu, mu


def nan_fill(t: torch.Tensor) -> None:
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-(2**30))


def error(w: Workload) -> float:
    """max |output - reference| / max |reference| (inf when the output has NaNs)."""
    out, ref = w.output().double(), w.reference().double().to(w.output().device)
    if out.shape != ref.shape:
        raise ValueError(f"{w.name}: output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if torch.isnan(out).any():
        return float("inf")
    return (out - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
