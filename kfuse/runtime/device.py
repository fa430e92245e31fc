"""The tensors' GPU as the current CUDA device.

Triton launches a kernel on the current CUDA device (``driver.active.get_current_device()``), whatever
device its tensors are on, and ``torch.cuda`` creates streams, events and graphs there, synchronises
it and reads its properties by default. Work on ``cuda:1`` started while ``cuda:0`` is current would
run kfuse's kernels on the wrong GPU, so the entry points (a compiled model's compile and calls, a
sparse plan's solves) make their tensors' device current while they run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

CPU = torch.device("cpu")


def first_device(values: Iterable[Any], default: torch.device | None = CPU) -> torch.device | None:
    """The device of the first tensor among ``values`` (where work on them runs); ``default`` if none is a tensor."""
    return next((v.device for v in values if isinstance(v, torch.Tensor)), default)


def on_device(device: torch.device | str | None) -> contextlib.AbstractContextManager[Any]:
    """``device`` as the current CUDA device inside the block; nothing for a CPU device or None."""
    dev = torch.device(device) if device is not None else None
    # nothing to switch (the common case, one GPU): no device exchange on every call of a compiled model
    if dev is None or dev.type != "cuda" or dev.index is None or dev.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(dev)
