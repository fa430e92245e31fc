"""Each step's own error (``kfuse.runtime.step_errors``): small for every kernel of a correct plan, and a kernel
made wrong stands out as itself, not as the errors of the steps after it."""

from __future__ import annotations

import dataclasses
import json

import torch
import torch.nn as nn
from typer.testing import CliRunner

import kfuse
from kfuse.cli import app
from kfuse.runtime.step_errors import step_errors, worst


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y)) + y
        return self.fc(y.mean((2, 3)))


def _compiled() -> tuple[kfuse.CompiledModel, torch.Tensor]:
    torch.manual_seed(0)
    m = _Net().eval()
    with torch.no_grad():
        m.bn.running_mean.normal_(std=0.1)
        m.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 9, 7)
    return kfuse.compile(m, (x,)), x


def test_every_step_of_a_correct_plan_is_close() -> None:
    c, x = _compiled()
    rows, whole = c.step_errors(x)
    assert len(rows) >= 3 and all(r.rel_err < 1e-5 for r in rows), rows
    assert whole < 1e-5
    assert [r.index for r in rows] == sorted(r.index for r in rows)


def test_a_wrong_kernel_stands_out_as_itself() -> None:
    c, x = _compiled()
    plan = c.variant.plan
    i = next(k for k, s in enumerate(plan.steps) if s.info.template == "conv_epilogue")
    good = plan.steps[i].fn
    plan.steps[i] = dataclasses.replace(plan.steps[i], fn=lambda xs: good(xs) * 1.01)  # 1% off
    rows, whole = step_errors(plan, [x])
    top = worst(rows, 1)[0]
    assert top.index == i and 5e-3 < top.rel_err < 2e-2
    assert all(r.rel_err < 1e-5 for r in rows if r.index != i)  # the steps after it run on the reference's values
    assert whole > 1e-3


def test_the_cli_prints_the_worst_steps(tmp_path) -> None:
    path = tmp_path / "rep.json"
    r = CliRunner().invoke(app, ["compile", "mlp-tiny", "--batch", "3", "--step-errors", "2", "--report", str(path)])
    assert r.exit_code == 0, r.output
    assert "largest error of their own" in r.output and "output error" in r.output
    rep = json.loads(path.read_text())
    assert len(rep["step_errors"]["worst"]) == min(2, len(rep["kernels"])) and rep["step_errors"]["output_rel_err"] < 1e-4
