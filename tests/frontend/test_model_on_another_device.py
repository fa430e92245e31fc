"""Import and graph passes of models whose weights live on another device than kfuse's own constants.

kfuse makes its scalars and folded helper tensors on the CPU. A model on the GPU brings weights, and constants
that ops evaluated at import make (``arange(device=cuda)``), on the GPU. Session 39: T5 failed to compile on
the H200 with a device mismatch that no CPU test could see. Here "meta" stands in for the GPU: like CUDA it
takes a 0-d CPU tensor as a scalar and rejects any other CPU tensor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo_sweep  # noqa: E402


# architectures whose passes mix kfuse's CPU constants with the model's: T5's relative-position buckets,
# OPT's and RoBERTa's position ids from the mask, BLOOM's ALiBi, a conv net's folded batch norm (not here:
# models whose passes read a constant's values, which a meta tensor does not have, e.g. DeBERTa's masks)
@pytest.mark.parametrize("arch", ["t5-encoder", "opt", "roberta", "bloom", "resnet"])
def test_passes_run_with_the_model_on_another_device(arch: str) -> None:
    model, a, kw = zoo_sweep.build(arch, True, "meta", torch.float16)
    imported = import_module(model, a, kw, arch)
    graph = optimize(imported.graph, Options(tune="none"), device=torch.device("cpu")).graph
    assert graph.nodes and any(t.device.type == "meta" for t in graph.constants.values())
