"""Horizontal GEMM merge (kfuse.passes.merge_gemm): a branch without a bias gets zeros in the merged bias."""

from __future__ import annotations

import torch

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.merge_gemm import merge_gemms

BASE = Options(fuse_attention=False, fuse_epilogue=False, fuse_pointwise=False, varlen=False, layout="nchw")


class _QKV(torch.nn.Module):
    """Swin-V2's projections: query and value with a bias, key without."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(c, c), torch.nn.Linear(c, c, bias=False), torch.nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.q(x)) * self.k(x) + self.v(x)


def test_a_branch_without_a_bias_adds_zeros_so_one_add_serves_all() -> None:
    torch.manual_seed(0)
    model = _QKV(24).eval()
    x = torch.randn(2, 7, 24)
    g = optimize(import_module(model, (x,), {}).graph, BASE).graph
    merged = merge_gemms(g)
    counts = merged.op_counts()
    assert counts["matmul"] == 1 and counts["add"] == 2  # the merged bias add and the model's own + v
    bias = next(c for n, c in merged.constants.items() if n.startswith("b_merged"))
    assert bias.shape == (72,) and torch.equal(bias[24:48], torch.zeros(24))
    torch.testing.assert_close(reference_run(merged, [x])[0], reference_run(g, [x])[0])
    cm = kfuse.compile(model, (x,), check=False)
    epilogues = [k for k in cm.report["kernels"] if k["template"] == "gemm_epilogue"]
    assert len(epilogues) == 1 and "add" in epilogues[0]["ops"]
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)


class _ParallelBlock(torch.nn.Module):
    """GPT-J's / Phi's parallel block: Q, K, V and the MLP's fc_in read one LayerNorm output; fc_in's value goes
    into a GELU (``act``), or into a SiLU / GELU times another projection (a gated MLP, SwiGLU / GeGLU: gate and
    up stay mergeable)."""

    def __init__(self, c: int, act: str) -> None:
        super().__init__()
        self.act = act
        self.q, self.k, self.v = (torch.nn.Linear(c, c, bias=False) for _ in range(3))
        self.fc_in, self.up = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, 3 * c)
        self.norm = torch.nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2), -1) @ self.v(h)
        if self.act == "gelu":
            mlp = torch.nn.functional.gelu(self.fc_in(h), approximate="tanh")
        elif self.act == "geglu":
            mlp = torch.nn.functional.gelu(self.fc_in(h), approximate="tanh") * self.up(h)
        else:
            mlp = torch.nn.functional.silu(self.fc_in(h)) * self.up(h)
        return att + mlp[..., : x.shape[-1]]


def test_a_gemm_into_a_gelu_keeps_its_own_epilogue() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 5, 16)
    for act, merge_activated, widths in [("gelu", False, [48]), ("gelu", True, [96]), ("silu", False, [144]), ("geglu", False, [144])]:
        model = _ParallelBlock(16, act).eval()
        g = optimize(import_module(model, (x,), {}).graph, BASE).graph
        merged = merge_gemms(g, merge_activated=merge_activated)
        got = sorted(merged.type_of(n.name).shape[-1] for n in merged.nodes if n.op == "matmul" and n.inputs[1].startswith("w_merged"))
        assert got == widths, (act, merge_activated, got)
        torch.testing.assert_close(reference_run(merged, [x])[0], reference_run(g, [x])[0])
    cm = kfuse.compile(_ParallelBlock(16, "gelu").eval(), (x,), check=False)
    assert not any(k["template"] == "pointwise" and "gelu_tanh" in k["ops"] for k in cm.report["kernels"]), cm.report["kernels"]
