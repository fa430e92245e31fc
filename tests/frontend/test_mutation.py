"""In-place ops: exact as renames where nothing aliases the written tensor; functionalised where a
view is written or a view of the written tensor is read. Forward's writes to its inputs and buffers:
tests/runtime/test_state_writes.py."""

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.bench.harness import max_rel_err
from kfuse.frontend.mutation import renames_are_exact
from kfuse.frontend.torch_export import export_module


class _WritesViews(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 0].zero_()
        y[1:, 1:3].mul_(10)
        return y + 1


class _ReadsAViewAfterAWrite(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        v = y[:, :2]
        y.mul_(3)
        return v + 1, y


class _InplaceRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h.relu_()
        h += x
        return h


class _TensorConstant(nn.Module):
    """``torch.tensor`` in forward: exported as lift_fresh_copy + detach_ (in-place by schema, but
    metadata only), then viewed; as Mistral's sliding-window mask builder does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.tensor([1.0, 2.0, 3.0, 4.0])
        return x * c[None, :] + c.view(1, 4)


def _flat(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]  # type: ignore[list-item]


@pytest.mark.parametrize(
    "cls,exact", [(_WritesViews, False), (_ReadsAViewAfterAWrite, False), (_InplaceRelu, True), (_TensorConstant, True)]
)
def test_compiled_result_equals_eager(cls, exact):
    # before session 22, _WritesViews came out wrong by 25 (the written views never reached y)
    model = cls().eval()
    x = torch.randn(3, 4)
    assert renames_are_exact(export_module(model, (x,)).graph_module) == exact
    compiled = kfuse.compile(model, (x,))
    x2 = torch.randn(3, 4)
    with torch.no_grad():
        for got, ref in zip(_flat(compiled(x2.clone())), _flat(model(x2.clone())), strict=True):
            assert max_rel_err(got, ref) < 1e-6
    assert compiled.report["max_rel_err"] < 1e-6


def test_a_wrong_compile_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the functionalisation switched off (the importer as it was), the view write is lost:
    the compile's own check against PyTorch must say so, not only in the report."""
    import kfuse.frontend.torch_export as te

    monkeypatch.setattr(te, "functional_program", lambda ep: ep)
    with pytest.warns(UserWarning, match="differs from PyTorch"):
        compiled = kfuse.compile(_WritesViews().eval(), (torch.randn(3, 4),))
    assert compiled.report["max_rel_err"] > 0.1
