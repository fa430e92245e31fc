"""The PyTorch baselines' settings (kfuse/bench/harness.py): cuDNN times its algorithms while the
baselines run and the process's own setting comes back afterwards, also when a baseline fails."""

from __future__ import annotations

import pytest
import torch

from kfuse.bench.harness import cudnn_autotuned, pytorch_baselines


@pytest.mark.parametrize("before", [False, True])
def test_cudnn_autotuned_sets_and_restores(before: bool) -> None:
    torch.backends.cudnn.benchmark = before
    with pytest.raises(RuntimeError), cudnn_autotuned():
        assert torch.backends.cudnn.benchmark is True
        raise RuntimeError("a baseline failed")
    assert torch.backends.cudnn.benchmark is before
    torch.backends.cudnn.benchmark = False


def test_baselines_run_with_cudnn_autotuned() -> None:
    seen: list[bool] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.backends.cudnn.benchmark)
        return torch.relu(x)

    times, outs, _ = pytorch_baselines(model, (torch.randn(4, 4),), which=("eager", "nonsense"), warmup=1, rep=2, log=lambda s: None)
    assert set(times) == {"eager"} and seen and all(seen)  # the unknown baseline is reported, not fatal
    assert torch.backends.cudnn.benchmark is False


def test_a_transformers_model_without_the_patch_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from kfuse.bench import harness

    monkeypatch.setattr(harness, "hf_masks_skipped_when_absent", lambda: contextlib.nullcontext([]))
    model = type("BertModel", (torch.nn.Module,), {"__module__": "transformers.models.bert", "forward": lambda self, x: x + 1})()
    lines: list[str] = []
    harness.pytorch_baselines(model, (torch.randn(2),), which=("eager",), warmup=1, rep=1, log=lines.append)
    assert any("FP32 math" in line for line in lines)
    lines.clear()
    harness.pytorch_baselines(torch.nn.ReLU(), (torch.randn(2),), which=("eager",), warmup=1, rep=1, log=lines.append)
    assert not any("warning" in line for line in lines)  # not a transformers model: nothing to warn about


def test_compile_baselines_ask_torch_compile_for_their_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile, compile_cudagraphs and max_autotune: one torch.compile each, in its mode; the outputs
    kept are copies (a CUDA-graph replay reuses its output memory)."""
    modes: list[object] = []
    shared = torch.zeros(3)

    def fake_compile(fn, mode=None):  # noqa: ANN001, ANN202 - stands in for torch.compile
        modes.append(mode)

        def run(*a):  # noqa: ANN002, ANN202
            shared.copy_(fn(*a))
            return shared  # the same memory every call, as a graph replay's output

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    times, outs, _ = pytorch_baselines(
        lambda x: x * 2, (torch.ones(3),), which=("compile", "compile_cudagraphs", "max_autotune"), warmup=1, rep=1, log=lambda s: None
    )
    assert modes == [None, "reduce-overhead", "max-autotune"] and set(times) == {"compile", "compile_cudagraphs", "max_autotune"}
    shared.fill_(-1.0)
    assert all(torch.equal(o, torch.full((3,), 2.0)) for o in outs.values())
