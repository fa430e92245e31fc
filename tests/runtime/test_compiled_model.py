"""CompiledModel: output structure, recompilation per shape, clear errors, the report."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse import KfuseInputError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 24)
        self.b = nn.Linear(24, 8)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = torch.nn.functional.gelu(self.a(x)) * scale
        return h, {"out": self.b(h) + h[..., :8]}


def inputs(m: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(m, 16, device=DEVICE), torch.rand(24, device=DEVICE) + 0.5


def test_structure_preserved_and_numerics() -> None:
    model = TwoHeads().to(DEVICE).eval()
    compiled = kfuse.compile(model, inputs())
    x, s = inputs()
    h, d = compiled(x, s)
    rh, rd = model(x, s)
    assert isinstance(d, dict) and set(d) == {"out"}
    torch.testing.assert_close(h, rh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d["out"], rd["out"], rtol=1e-4, atol=1e-5)


def test_new_shape_recompiles_once_and_caches() -> None:
    model = TwoHeads().to(DEVICE).eval()
    compiled = kfuse.compile(model, inputs(5))
    for m in (1, 7, 7, 33):
        x, s = inputs(m)
        torch.testing.assert_close(compiled(x, s)[1]["out"], model(x, s)[1]["out"], rtol=1e-4, atol=1e-5)
    assert len(compiled.variants) == 4  # 5, 1, 7, 33


def test_wrong_inputs_give_clear_errors() -> None:
    compiled = kfuse.compile(TwoHeads().to(DEVICE).eval(), inputs())
    x, s = inputs()
    with pytest.raises(KfuseInputError, match=r"args\[0\].*dtype torch.float16"):
        compiled(x.half(), s)
    with pytest.raises(KfuseInputError, match=r"args\[0\].*rank 3"):
        compiled(x[None], s)
    with pytest.raises(KfuseInputError, match="structured"):
        compiled(x)
    with pytest.raises(KfuseInputError, match="must be a tensor"):
        compiled(x, 3.0)


def test_report_schema_and_explain(capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # kfuse's GEMM kernels on a GPU too, where the lowering would time them against cuBLAS and may keep
    # cuBLAS (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    compiled = kfuse.compile(TwoHeads().to(DEVICE).eval(), inputs(), explain=True)
    printed = capsys.readouterr().out
    assert "after import" in printed and "after fuse_epilogue" in printed and "kernel plan" in printed
    rep = compiled.report
    for key in ("model", "kernels", "fallback", "max_abs_err", "max_rel_err", "stages", "backend"):
        assert key in rep
    gemms = [k for k in rep["kernels"] if k["template"] == "gemm_epilogue"]
    assert len(gemms) == 2
    assert gemms[0]["ops"][:3] == ["matmul", "add", "gelu"]
    path = tmp_path / "r.json"
    compiled.save_report(str(path))
    assert json.loads(path.read_text())["model"] == "TwoHeads"


def test_torch_backend_runs_without_triton_kernels() -> None:
    model = TwoHeads().to(DEVICE).eval()
    compiled = kfuse.compile(model, inputs(), backend="torch")
    assert compiled.report["backend"] == "torch"
    assert all(k["template"] in ("torch", "fallback") for k in compiled.report["kernels"])
    x, s = inputs()  # not the compile-time example
    with torch.no_grad():
        (h, d), (rh, rd) = compiled(x, s), model(x, s)
    torch.testing.assert_close(h, rh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d["out"], rd["out"], rtol=1e-4, atol=1e-5)


def test_sass_option_without_a_gpu_is_reported_not_silently_ignored() -> None:
    # on the CPU on purpose, on a GPU machine too: a model compiled for the CPU has no GPU to tune SASS on
    with pytest.warns(UserWarning, match="sass=True not applied: SASS tuning .* on a CUDA GPU"):
        compiled = kfuse.compile(TwoHeads().eval(), tuple(t.cpu() for t in inputs()), sass=True)
    assert compiled.report["sass"]["applied"] is False
    assert "CUDA GPU" in compiled.report["sass"]["reason"]


def test_report_times_the_compile_phases() -> None:
    from kfuse.report import summary_lines
    from kfuse.runtime.compiled_model import PhaseClock

    compiled = kfuse.compile(TwoHeads().to(DEVICE).eval(), inputs())
    phases = compiled.report["compile_phases_s"]
    assert list(phases)[:2] == ["import", "graph_passes"], phases  # in the order they ran
    assert "check" in phases and all(v > 0 for v in phases.values())
    assert sum(phases.values()) <= compiled.report["compile_s"] + phases["check"] + 0.05
    assert any(line.startswith("compile time by phase: import") for line in summary_lines(compiled.report))

    clock = PhaseClock()  # a phase entered twice adds up; an empty one is left out; start closes the open phase
    for _ in range(2):
        with clock("a"):
            sum(range(200_000))
    clock.start("b")
    clock.start("c")
    assert set(clock.seconds()) == {"a"} and clock.seconds()["a"] > 0


def test_calls_past_the_shape_limit_run_as_pytorch() -> None:
    """Each new shape is a compile; past ``Options.max_shapes`` a call runs the model as PyTorch, with one warning."""
    import warnings

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU()).eval()
    compiled = kfuse.compile(model, (torch.randn(2, 6),), max_shapes=2)
    compiled(torch.randn(3, 6))  # a second shape: compiled
    assert len(compiled.variants) == 2
    with pytest.warns(UserWarning, match="more than 2 input shapes"):
        x = torch.randn(4, 6)
        torch.testing.assert_close(compiled(x), model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        x = torch.randn(5, 6)
        torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled.variants) == 2 and compiled.eager_calls == 2
    torch.testing.assert_close(compiled(torch.ones(3, 6)), model(torch.ones(3, 6)))  # a compiled shape still replays


def test_dynamo_graphs_stop_compiling_new_shapes_at_the_limit() -> None:
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh()).eval()
    fast = torch.compile(model, backend="kfuse", options={"max_shapes": 2})
    with pytest.warns(UserWarning, match="more than 2 input shapes"):
        for rows in range(2, 7):  # the first shape static, then one dynamic graph compiled per shape up to the limit
            x = torch.randn(rows, 6)
            with torch.no_grad():
                torch.testing.assert_close(fast(x), model(x))
