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


class Aliasing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.ones(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.clone(), self.w * 2, x + 1


def test_outputs_never_alias_inputs_constants_or_each_other() -> None:
    """``clone`` imports as identity and ``w * 2`` folds to a constant: the results must still be the
    caller's own tensors (eager's are), or writing into one changes the input or every later call."""
    c = kfuse.compile(Aliasing().eval(), (torch.randn(3),), cuda_graphs=False)
    x = torch.randn(3)
    a, b, d = c(x)
    assert a.data_ptr() != x.data_ptr() and torch.equal(a, x)
    b.add_(100)
    a.add_(100)
    a2, b2, _ = c(x)
    torch.testing.assert_close(b2, torch.full((3,), 2.0))  # the constant was not changed through b
    torch.testing.assert_close(a2, x)  # nor the input through a
    assert len({t.data_ptr() for t in (a2, b2, d)}) == 3


def test_a_different_output_dtype_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="output dtype torch.float64 differs from PyTorch's torch.float32"):
        _compile(monkeypatch, lambda outs: [outs[0].double(), outs[1]])


def test_input_signatures_include_the_device_index() -> None:
    from kfuse.runtime.compiled_model import _signature
    from kfuse.runtime.cuda_graph import signature

    class OnDevice:  # a tensor's metadata on another GPU (no GPU needed)
        def __init__(self, index: int) -> None:
            self.shape, self.dtype, self.device = (2, 3), torch.float16, torch.device("cuda", index)

        def stride(self) -> tuple[int, ...]:
            return (3, 1)

    assert signature([OnDevice(0)]) != signature([OnDevice(1)])  # type: ignore[list-item]
    x = torch.randn(2, 3)
    assert _signature([x]) == _signature([torch.randn(2, 3)]) and "cpu" in str(_signature([x]))


class TwoKeywords(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x * a - b


def test_keyword_arguments_in_any_order() -> None:
    from kfuse.runtime.compiled_model import KfuseInputError

    x, a, b = torch.randn(4), torch.randn(4), torch.randn(4)
    c = kfuse.compile(TwoKeywords(), (x,), {"a": a, "b": b})
    torch.testing.assert_close(c(x, b=b, a=a), x * a - b)  # named the other way round
    with pytest.raises(KfuseInputError, match=r"keyword arguments \['a'\], compiled for \['a', 'b'\]"):
        c(x, a=a)


def test_positional_calls_skip_pytree_and_keep_every_check() -> None:
    """A model compiled for positional tensors is called without pytree (half the wrapper's host
    time, session 28); the checks and the recompile on a new shape stay."""
    import kfuse
    from kfuse.runtime.compiled_model import KfuseInputError

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    compiled = kfuse.compile(model, (x,))
    assert compiled._positional
    with torch.no_grad():
        for m in (3, 5):  # the example's shape, then a new one (a second variant)
            y = torch.randn(m, 8)
            torch.testing.assert_close(compiled(y), model(y), rtol=1e-4, atol=1e-5)
    assert len(compiled.variants) == 2
    with pytest.raises(KfuseInputError, match="dtype"):
        compiled(x.double())
    with pytest.raises(KfuseInputError, match="keyword"):
        compiled(x=x)
    with pytest.raises(KfuseInputError, match="structured as"):
        compiled(x, x)
