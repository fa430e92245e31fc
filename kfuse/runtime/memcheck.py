"""Out-of-bounds checker for kernels run in Triton's interpreter (``TRITON_INTERPRET=1``): a CPU memcheck.

On the GPU an access past a tensor's storage is an illegal address only when it leaves the caching
allocator's block, so a kernel can write out of bounds at one shape and fault at another; in the interpreter
it reads or writes the neighbouring host memory silently. Inside ``memcheck()`` every interpreted launch
records the storages of its tensor arguments, and every load, store and atomic checks that each address its
mask enables lies inside one of them (whole element); the first that does not raises ``OutOfBounds`` naming
the kernel, the access and how far outside the nearest argument it fell (also kept in the log, in case a
caller catches it). A view's neighbours in its own storage count as inside: the check is per storage.

    with memcheck() as log:
        compiled(*args)
    print(log.launches, log.accesses)

Session 36: written to find the illegal address that ConvNeXt-T and Swin-T hit on the H200 from the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np


class OutOfBounds(RuntimeError):
    """A kernel run in the interpreter touched memory outside every tensor argument's storage."""


@dataclasses.dataclass
class MemcheckLog:
    """What the checker saw: interpreted launches, checked accesses (enabled lanes), the kernels by name."""

    launches: int = 0
    accesses: int = 0
    kernels: set[str] = dataclasses.field(default_factory=set)
    violations: list[str] = dataclasses.field(default_factory=list)  # kept even if a caller swallows the error


@dataclasses.dataclass
class _Launch:
    kernel: str
    lo: np.ndarray  # storage starts, sorted
    hi: np.ndarray  # storage ends (exclusive), same order
    names: list[str]


def _storage_ranges(kernel: str, arg_names: list[str], args: list[Any]) -> _Launch:
    spans: list[tuple[int, int, str]] = []

    def add(name: str, a: Any) -> None:
        if isinstance(a, tuple | list):
            for i, x in enumerate(a):
                add(f"{name}[{i}]", x)
        elif hasattr(a, "untyped_storage"):
            st = a.untyped_storage()
            spans.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))
        elif hasattr(a, "base") and hasattr(a.base, "untyped_storage"):  # a tensor descriptor
            add(name, a.base)

    for name, a in zip(arg_names, args, strict=False):
        add(name, a)
    spans.sort()
    return _Launch(kernel, np.array([s[0] for s in spans], np.uint64), np.array([s[1] for s in spans], np.uint64),
                   [s[2] for s in spans])  # fmt: skip


def _check(launch: _Launch | None, log: MemcheckLog, op: str, ptrs: Any, mask: Any, itemsize: int) -> None:
    if launch is None:
        return
    addr = np.asarray(ptrs.data).astype(np.uint64)
    if mask is not None:
        addr = addr[np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)]
    addr = addr.ravel()
    log.accesses += addr.size
    if addr.size == 0:
        return
    i = np.searchsorted(launch.lo, addr, side="right").astype(np.int64) - 1
    inside = i >= 0
    ok = np.zeros(addr.shape, bool)
    ok[inside] = addr[inside] + np.uint64(itemsize) <= launch.hi[i[inside]]
    if ok.all():
        return
    bad = int(addr[~ok][0])
    lanes = int((~ok).sum())
    # the argument the address is nearest to, by distance to either end
    dist = [lo - bad if bad < lo else bad + itemsize - hi for lo, hi in zip(map(int, launch.lo), map(int, launch.hi), strict=True)]
    j = min(range(len(dist)), key=dist.__getitem__)
    lo, hi = int(launch.lo[j]), int(launch.hi[j])
    where = f"{bad - hi + itemsize} bytes past the end" if bad >= lo else f"{lo - bad} bytes before the start"
    msg = f"{launch.kernel}: {op} of {lanes} lane(s) outside every argument; the first is {where} of '{launch.names[j]}' ({hi - lo} bytes)"
    log.violations.append(msg)
    raise OutOfBounds(msg)


@contextlib.contextmanager
def memcheck() -> Iterator[MemcheckLog]:
    """Check every interpreted kernel launch inside the block for out-of-bounds memory accesses."""
    from triton.runtime import interpreter as itp

    log = MemcheckLog()
    current: list[_Launch | None] = [None]
    builder = itp.InterpreterBuilder
    saved = {n: getattr(builder, n) for n in ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")}
    saved_init = itp.GridExecutor._init_args_hst

    def init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = saved_init(self, args_dev, kwargs)
        name = getattr(self.fn, "__name__", "kernel")
        names = list(self.arg_names[: len(args_hst)]) + list(kwargs_hst)
        current[0] = _storage_ranges(name, names, [*args_hst, *kwargs_hst.values()])
        log.launches += 1
        log.kernels.add(name)
        return args_hst, kwargs_hst

    def load(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any, **kw: Any) -> Any:
        _check(current[0], log, "load", ptrs, mask, _itemsize(ptrs))
        return saved["create_masked_load"](self, ptrs, mask, other, *rest, **kw)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        _check(current[0], log, "store", ptrs, mask, _itemsize(ptrs))
        return saved["create_masked_store"](self, ptrs, value, mask, *rest, **kw)

    def atomic_rmw(self: Any, op: Any, ptr: Any, val: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        _check(current[0], log, "atomic", ptr, mask, _itemsize(ptr))
        return saved["create_atomic_rmw"](self, op, ptr, val, mask, *rest, **kw)

    def atomic_cas(self: Any, ptr: Any, cmp: Any, val: Any, *rest: Any, **kw: Any) -> Any:
        _check(current[0], log, "atomic_cas", ptr, None, _itemsize(ptr))
        return saved["create_atomic_cas"](self, ptr, cmp, val, *rest, **kw)

    builder.create_masked_load, builder.create_masked_store = load, store
    builder.create_atomic_rmw, builder.create_atomic_cas = atomic_rmw, atomic_cas
    itp.GridExecutor._init_args_hst = init_args
    try:
        yield log
    finally:
        for n, f in saved.items():
            setattr(builder, n, f)
        itp.GridExecutor._init_args_hst = saved_init


def _itemsize(ptrs: Any) -> int:
    from triton.runtime.interpreter import _get_np_dtype

    return int(np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize)
