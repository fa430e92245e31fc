"""Fresh copies of a CUDA graph's static outputs, which the next replay overwrites.

A call on a small model is host-bound (OPT-125m B1 S512: 0.20 ms of GPU work, 0.39-0.50 ms a call on the H200's
host in session 44), and each output's ``clone`` costs the host an allocation and a copy launch. Two savings:

* the copies go out in one ``torch._foreach_copy_`` (one multi-tensor launch for outputs of one dtype) instead of
  one launch each;
* an output that the output structure's own rebuild copies anyway needs no copy here. Hugging Face's
  ``DynamicCache`` (transformers 5.x) rebuilds each layer's keys and values with ``torch.cat`` onto an empty
  tensor, a new tensor, so a decoder's 2 x layers cache outputs were copied twice.
  ``copies_needed`` checks that on the real outputs, once per compiled variant, and only under cache
  containers: a structure that keeps the graph's tensor still gets its copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

# output containers whose unflatten builds new tensors from the leaves (``torch.cat`` onto an empty cache)
COPYING_CONTAINERS = frozenset({"DynamicCache"})


def fresh_copies(static: Sequence[torch.Tensor], which: bool | Sequence[bool] = True) -> list[torch.Tensor]:
    """``static`` with each output marked in ``which`` (all when True, none when False) replaced by a copy of the
    same strides; the copies in one multi-tensor launch where PyTorch can."""
    if which is False:
        return list(static)
    mask = [True] * len(static) if which is True else list(which)
    if len(mask) != len(static):
        raise ValueError(f"fresh_copies: {len(mask)} flags for {len(static)} outputs")
    out = list(static)
    idx = [i for i, m in enumerate(mask) if m]
    if not idx:
        return out
    srcs = [static[i] for i in idx]
    dsts = [torch.empty_like(s) for s in srcs]  # preserve_format: a dense output keeps its strides, as clone does
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dsts, srcs)
    else:  # pragma: no cover - every supported torch has it
        for d, s in zip(dsts, srcs, strict=True):
            d.copy_(s)
    for i, d in zip(idx, dsts, strict=True):
        out[i] = d
    return out


def _children(spec: pytree.TreeSpec) -> list[pytree.TreeSpec]:
    if hasattr(spec, "child") and hasattr(spec, "num_children"):
        return [spec.child(i) for i in range(spec.num_children)]
    return list(spec.children_specs)  # torch versions before TreeSpec.child


def _leaves_under_copying_containers(spec: pytree.TreeSpec) -> set[int]:
    """Leaf indices (in flattening order) that sit anywhere under a ``COPYING_CONTAINERS`` node."""
    found: set[int] = set()

    def walk(s: pytree.TreeSpec, first: int, inside: bool) -> int:
        if s.is_leaf():
            if inside:
                found.add(first)
            return first + 1
        inside = inside or getattr(s.type, "__name__", "") in COPYING_CONTAINERS
        for c in _children(s):
            first = walk(c, first, inside)
        return first

    walk(spec, 0, False)
    return found


def copies_needed(static: Sequence[Any], spec: pytree.TreeSpec) -> tuple[bool, ...]:
    """Per output, whether the caller must get a copy: False only for a tensor under a copying container whose
    storage no leaf of the rebuilt structure shares (checked by rebuilding it from ``static`` once)."""
    need = [isinstance(t, torch.Tensor) for t in static]
    candidates = [i for i in _leaves_under_copying_containers(spec) if i < len(static) and need[i]]
    if not candidates:
        return tuple(need)
    try:
        rebuilt = pytree.tree_leaves(pytree.tree_unflatten(list(static), spec))
    except Exception:  # a structure that cannot be rebuilt here keeps every copy
        return tuple(need)
    held = {t.untyped_storage().data_ptr() for t in rebuilt if isinstance(t, torch.Tensor)}
    for i in candidates:
        if static[i].untyped_storage().data_ptr() not in held:
            need[i] = False
    return tuple(need)
