"""The compile-time check against PyTorch (``CompiledModel._check``) cannot be fooled by a plan that
returns too few outputs or a wrong integer output."""

from __future__ import annotations

import math

import pytest
import torch

import kfuse
from kfuse.runtime.compiled_model import Variant


class TwoOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x) * 2.0
        return y, torch.argmax(y, dim=-1)


def _compile(monkeypatch: pytest.MonkeyPatch, tamper: object) -> dict:
    real = Variant.run
    monkeypatch.setattr(Variant, "run", lambda self, flat: tamper(real(self, flat)))  # type: ignore[operator]
    torch.manual_seed(0)
    return kfuse.compile(TwoOutputs().eval(), (torch.randn(5, 7),)).report


def test_the_untampered_plan_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    rep = _compile(monkeypatch, lambda outs: outs)
    assert rep["max_rel_err"] < 1e-6 and rep["max_abs_err"] == 0.0


def test_a_missing_output_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="returned 1 outputs where PyTorch returns 2"):
        _compile(monkeypatch, lambda outs: outs[:1])


def test_a_wrong_integer_output_is_infinitely_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    def shift_argmax(outs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [outs[0], (outs[1] + 1) % 7]

    with pytest.warns(UserWarning, match="differs from PyTorch"):
        rep = _compile(monkeypatch, shift_argmax)
    assert math.isinf(rep["max_rel_err"]) and rep["max_abs_err"] == 5.0  # all five rows differ
