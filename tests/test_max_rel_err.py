"""``kfuse.bench.harness.max_rel_err``: NaN, infinities and non-floating outputs cannot hide wrong values."""

from __future__ import annotations

import math

import pytest
import torch

from kfuse.bench.harness import max_rel_err

nan, inf = float("nan"), float("inf")


def t(*v, dtype=torch.float32):  # noqa: ANN001, ANN002, ANN202
    return torch.tensor(v, dtype=dtype)


def test_normal_inputs_unchanged() -> None:
    assert max_rel_err(t(1.0, 2.0), t(1.0, 2.0)) == 0.0
    assert max_rel_err(t(1.0, 2.0), t(1.0, 2.5)) == pytest.approx(0.5 / 2.5)
    assert max_rel_err([t(1.0), {"a": t(3.0, 4.0)}], [t(1.0), {"a": t(3.0, 5.0)}]) == pytest.approx(0.2)
    assert max_rel_err(t(1e-20), t(0.0)) == pytest.approx(1e-20 / 1e-12)  # the 1e-12 floor on the scale
    assert max_rel_err(t(1.0, dtype=torch.float16), t(1.0, dtype=torch.float16)) == 0.0
    assert max_rel_err(torch.empty(0), torch.empty(0)) == 0.0


def test_nan_in_reference_does_not_hide_wrong_values() -> None:
    assert max_rel_err(t(100.0, -7.0, nan, nan), t(1.0, 2.0, nan, 4.0)) == inf  # the audit's case
    got = max_rel_err(t(100.0, -7.0, nan, 4.0), t(1.0, 2.0, nan, 4.0))  # NaNs match: the scale is 4
    assert got == pytest.approx(99.0 / 4.0)
    assert max_rel_err(t(1.0, 2.0, nan), t(1.0, 2.0, nan)) == 0.0
    assert max_rel_err(t(1.0, 2.0, 3.0), t(1.0, 2.0, nan)) == inf  # NaN expected, a number computed
    assert max_rel_err(t(1.0, nan), t(1.0, 2.0)) == inf  # NaN computed, a number expected
    assert max_rel_err(t(nan, nan), t(nan, nan)) == 0.0


def test_infinities_must_match_exactly() -> None:
    assert max_rel_err(t(1.0, inf), t(1.0, inf)) == 0.0
    assert max_rel_err(t(1.0, -inf), t(1.0, inf)) == inf
    assert max_rel_err(t(1.0, 5.0), t(1.0, inf)) == inf
    assert max_rel_err(t(1.0, inf), t(1.0, 5.0)) == inf
    assert max_rel_err(t(1.0, nan), t(1.0, inf)) == inf
    # the scale is the finite reference values: an infinity elsewhere does not make errors vanish
    got = max_rel_err(t(50.0, 2.0, inf), t(1.0, 2.0, inf))
    assert math.isfinite(got) and got == pytest.approx(49.0 / 2.0)


def test_non_floating_leaves_compare_exactly() -> None:
    assert max_rel_err(t(1, 2, 3, dtype=torch.int64), t(7, 8, 9, dtype=torch.int64)) == inf  # the audit's case
    assert max_rel_err(t(1, 2, 3, dtype=torch.int64), t(1, 2, 3, dtype=torch.int64)) == 0.0
    assert max_rel_err(t(True, dtype=torch.bool), t(False, dtype=torch.bool)) == inf
    assert max_rel_err(t(True, dtype=torch.bool), t(True, dtype=torch.bool)) == 0.0
    assert max_rel_err(t(5.0), t(1, dtype=torch.int32)) == inf
    assert max_rel_err(t(1.5), t(1, dtype=torch.int32)) == inf
    assert max_rel_err((t(1.0), t(4, dtype=torch.int32)), (t(1.0), t(5, dtype=torch.int32))) == inf


def test_structure_mismatches_are_infinite() -> None:
    assert max_rel_err(t(1.0, 2.0), t(1.0, 2.0, 3.0)) == inf
    assert max_rel_err([t(1.0)], [t(1.0), t(2.0)]) == inf


def test_complex_leaves() -> None:
    a = torch.tensor([1 + 1j, 2 - 1j])
    assert max_rel_err(a, a.clone()) == 0.0
    assert max_rel_err(a + 1j, a) > 0.1
