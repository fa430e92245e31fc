"""torch.export and torch.compile(backend="kfuse") on every embedded model: kfuse equals PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kfuse
import kfuse.models as zoo
from kfuse.bench.harness import max_rel_err

TINY = ["mlp-tiny", "resnet-tiny", "bert-tiny", "gpt2-tiny", "llama-tiny", "vit-tiny", "mixer-tiny", "repvgg-tiny"]
LARGE = ["bert-base", "gpt2-small", "vit-b16", "resnet50", "nerf-mlp"]
TOL = {torch.float32: 1e-4, torch.float16: 2e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def fp32_convs(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 convolutions computed in fp32 on a GPU too: cuDNN runs them in TF32 by default
    (``torch.backends.cudnn.allow_tf32``), in the PyTorch reference and in the cuDNN candidates kfuse
    may keep, which is past TOL[float32] on the conv models."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def build(name: str, dtype: torch.dtype = torch.float32, **kw: object) -> tuple:
    size = {"batch": 2, "seq": 12} if name in TINY else {"batch": 1, "seq": 8}
    if name == "nerf-mlp":
        size = {"batch": 64}
    seed = kw.pop("seed", None)
    size.update(kw)  # type: ignore[arg-type]
    seed = torch.randint(0, 1000, ()).item() if seed is None else seed
    return zoo.build(name, dtype=dtype, seed=seed, device=DEVICE, **size)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", TINY)
def test_export_frontend_tiny_models(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # kfuse's own kernels on a GPU too, where the lowering would time GEMMs against cuBLAS and b2b chains
    # against their unfused GEMMs and may keep either (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    monkeypatch.setenv("KFUSE_B2B_DECIDE", "rule")
    model, args, kwargs = build(name)
    compiled = kfuse.compile(model, args, kwargs)
    # fresh inputs of the same shape, not the example ones
    _, args2, kwargs2 = build(name)
    with torch.no_grad():
        assert max_rel_err(compiled(*args2, **kwargs2), model(*args2, **kwargs2)) < TOL[torch.float32]
    rep = compiled.report
    assert rep["fallback"] == [] and rep["max_rel_err"] < TOL[torch.float32]
    if name not in ("resnet-tiny", "repvgg-tiny"):
        assert any(k["template"] in ("gemm_epilogue", "b2b_chain") for k in rep["kernels"]), "no GEMM was fused"


@pytest.mark.parametrize("name", ["mlp-tiny", "bert-tiny"])
def test_export_frontend_fp16(name: str) -> None:
    model, args, kwargs = build(name, dtype=torch.float16)
    compiled = kfuse.compile(model, args, kwargs)
    assert compiled.report["max_rel_err"] < TOL[torch.float16]


@pytest.mark.parametrize("name", LARGE)
def test_export_frontend_large_models_graph_level(name: str) -> None:
    """Import + passes on the full-size models; kernels run as PyTorch to keep the CPU test fast (and the
    test about the graph, not the kernels)."""
    model, args, kwargs = build(name)
    compiled = kfuse.compile(model, args, kwargs, backend="torch")
    assert compiled.report["max_rel_err"] < TOL[torch.float32]
    assert compiled.report["fallback"] == []


@pytest.mark.parametrize("name", ["mlp-tiny", "resnet-tiny", "bert-tiny", "gpt2-tiny", "llama-tiny", "vit-tiny"])
def test_dynamo_backend(name: str) -> None:
    torch._dynamo.reset()
    seed = int(torch.randint(0, 1000, ()))
    model, args, kwargs = build(name, seed=seed)
    fast = torch.compile(model, backend="kfuse")
    # a second call with other values of the same shape: the caller's inputs must not be frozen
    # into the graph as weights are (Hugging Face forwards take *args, so their inputs reach
    # Dynamo as args[0], not as a named local; kfuse once froze them and returned stale outputs)
    _, args2, kwargs2 = build(name, seed=seed + 1)
    with torch.no_grad():
        assert max_rel_err(fast(*args, **kwargs), model(*args, **kwargs)) < TOL[torch.float32]
        assert max_rel_err(fast(*args2, **kwargs2), model(*args2, **kwargs2)) < TOL[torch.float32]


def test_dynamo_backend_with_changing_sequence_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second length makes Dynamo retrace with a dynamic dim (SymInt inputs); kfuse compiles
    each concrete length once and stays right on all of them, the first one included."""
    from kfuse.runtime import compiled_model

    compiles: list[str] = []
    original = compiled_model.CompiledModel._compile

    def counted(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        compiles.append(self.name)
        return original(self, *a, **k)

    monkeypatch.setattr(compiled_model.CompiledModel, "_compile", counted)
    torch._dynamo.reset()
    model, _, _ = build("bert-tiny", seed=1)
    fast = torch.compile(model, backend="kfuse")
    with torch.no_grad():
        for s in (9, 12, 15, 12, 9, 15):
            _, args, _ = build("bert-tiny", seq=s, seed=s)
            assert max_rel_err(fast(*args), model(*args)) < TOL[torch.float32]
    # 9 (the static first trace), then 12 and 15 on the dynamic trace; the repeats compile nothing
    # (a repeat of 9 may reach the dynamic trace once: at most 4)
    assert 3 <= len(compiles) <= 4


def test_exported_program_input() -> None:
    model, args, kwargs = build("mlp-tiny")
    ep = torch.export.export(model, args, kwargs)
    compiled = kfuse.compile(ep, args, kwargs)
    fresh = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)  # not the traced values
    with torch.no_grad():
        assert max_rel_err(compiled(*fresh), model(*fresh)) < 1e-5


class WithUnsupportedOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.lin(x).relu()
        return {"cum": torch.cumprod(h, dim=1), "sorted": torch.sort(h, dim=-1).values}  # neither is a kfuse op


def test_unsupported_op_falls_back_and_is_reported() -> None:
    model = WithUnsupportedOp().to(DEVICE).eval()
    x = torch.randn(5, 8, device=DEVICE)
    compiled = kfuse.compile(model, (x,))
    x = torch.randn(5, 8, device=DEVICE)  # fresh values: nothing may be frozen from the example
    out = compiled(x)
    assert set(out) == {"cum", "sorted"}
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(out["cum"], ref["cum"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["sorted"], ref["sorted"], rtol=1e-5, atol=1e-5)
    fallback = compiled.report["fallback"]
    assert any("cumprod" in f for f in fallback) and any("sort" in f for f in fallback)
    assert any(k["template"] == "fallback" for k in compiled.report["kernels"])


class InPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        return y + 1


def test_in_place_ops_are_renamed() -> None:
    from kfuse.frontend.mutation import renames_are_exact
    from kfuse.frontend.torch_export import export_module

    x = torch.randn(3, 4, device=DEVICE)
    assert renames_are_exact(export_module(InPlace(), (x,)).graph_module)
    compiled = kfuse.compile(InPlace(), (x,))
    x2 = torch.randn(3, 4, device=DEVICE)
    torch.testing.assert_close(compiled(x2), InPlace()(x2))
