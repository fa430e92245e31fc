"""The interpreter's out-of-bounds checker: silent on in-bounds kernels, names the first bad access otherwise."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kfuse.runtime.memcheck import OutOfBounds, memcheck


@triton.jit
def _double(x, y, n, EXTRA: tl.constexpr, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n + EXTRA  # EXTRA > 0: the mask lets lanes past the end through
    tl.store(y + o, tl.load(x + o, mask=m, other=0.0) * 2, mask=m)


@triton.jit
def _scatter_add(x, y, idx, n, B: tl.constexpr):
    o = tl.arange(0, B)
    m = o < n
    tl.atomic_add(y + tl.load(idx + o, mask=m, other=0), tl.load(x + o, mask=m, other=0.0), mask=m)


def test_in_bounds_kernel_passes_and_is_counted() -> None:
    x, y = torch.randn(131), torch.full((131,), float("nan"))
    with memcheck() as log:
        _double[(3,)](x, y, 131, 0, B=64)
    assert torch.equal(y, 2 * x)
    assert log.launches == 1 and log.kernels == {"_double"}
    assert log.accesses == 2 * 131 and not log.violations


def test_one_lane_past_the_end_is_named() -> None:
    x, y = torch.randn(100), torch.empty(100)
    with pytest.raises(Exception, match="4 bytes past the end of 'x'") as info, memcheck() as log:
        _double[(1,)](x, y, 100, 1, B=128)
    assert isinstance(info.value, OutOfBounds) or "OutOfBounds" in str(info.value)
    assert len(log.violations) == 1 and "_double: load of 1 lane" in log.violations[0]


def test_bad_atomic_index_is_caught_and_kept_in_the_log() -> None:
    x, y = torch.randn(8), torch.zeros(8)
    idx = torch.tensor([0, 1, 2, 3, 4, 5, 6, -3], dtype=torch.int32)  # the last one lands before y
    with memcheck() as log:
        try:
            _scatter_add[(1,)](x, y, idx, 8, B=8)
        except Exception:  # noqa: BLE001 - a caller that swallows it: the log still has it
            pass
    assert log.violations and "atomic" in log.violations[0] and "before the start of 'y'" in log.violations[0]


def test_checker_is_removed_after_the_block() -> None:
    x, y = torch.randn(100), torch.empty(100)
    with memcheck():
        pass
    _double[(1,)](x, y, 100, 0, B=128)  # no checker left behind: the in-bounds call simply runs
    assert torch.equal(y, 2 * x)
