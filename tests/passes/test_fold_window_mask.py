"""Swin-V2's shifted-window mask, added through a 5-D view of the scores, folds into one 4-D constant
mask so the attention fuses (kfuse.passes.fold_window_mask)."""

from __future__ import annotations

import pytest
import torch

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fold_window_mask import fold_window_mask
from kfuse.passes.fuse_attention import fuse_attention

BASE = Options(fuse_attention=False, fuse_epilogue=False, fuse_pointwise=False, varlen=False, layout="nchw")


class _ShiftedWindowAttention(torch.nn.Module):
    """Scores of ``B * nW`` windows, a per-head relative bias, then HF Swin-V2's
    ``view(B, nW, H, N, N) + mask[None, :, None] + extra[None, :, None]`` and ``view(B * nW, H, N, N)``."""

    def __init__(self, windows: int, heads: int, n: int, mask_from_input: bool = False) -> None:
        super().__init__()
        self.windows, self.heads, self.mask_from_input = windows, heads, mask_from_input
        self.bias = torch.nn.Parameter(torch.randn(1, heads, n, n))
        region = torch.randint(0, 3, (windows, n))  # the shifted regions a token of each window belongs to
        self.register_buffer("mask", torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0))
        self.register_buffer("extra", torch.randn(windows, n, n) * 0.1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        bw, h, n, _ = q.shape
        s = (q @ k.transpose(-1, -2)) * 0.25 + self.bias
        s = s.view(bw // self.windows, self.windows, h, n, n)
        s = s + (m if self.mask_from_input else self.mask)[None, :, None] + self.extra[None, :, None]
        return torch.softmax(s.view(bw, h, n, n), dim=-1) @ v


def _fused(g):
    return [n for n in g.nodes if n.op == "fused_attention"]


@pytest.mark.parametrize("batch,windows,n", [(2, 4, 16), (3, 5, 9)])
def test_the_window_mask_folds_and_the_attention_fuses(batch: int, windows: int, n: int) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch * windows, 3, n, 8) for _ in range(3))
    model = _ShiftedWindowAttention(windows, 3, n)
    g = optimize(import_module(model, (q, k, v), {}).graph, BASE).graph
    assert not _fused(fuse_attention(g))  # the 5-D view hides the chain
    folded = fold_window_mask(g)
    assert all(n.ttype.rank <= 4 for n in folded.nodes if n.op == "add")
    for a, b in zip(reference_run(g, [q, k, v]), reference_run(folded, [q, k, v]), strict=True):
        torch.testing.assert_close(a, b)
    assert len(_fused(fuse_attention(folded))) == 1
    cm = kfuse.compile(model, (q, k, v), check=False)
    assert [kk["template"] for kk in cm.report["kernels"]].count("fused_attention") == 1
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=1e-5, rtol=1e-4)


def test_a_mask_from_an_input_is_left_alone() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 2, 16, 8) for _ in range(3))
    m = torch.randn(4, 16, 16)
    model = _ShiftedWindowAttention(4, 2, 16, mask_from_input=True)
    g = optimize(import_module(model, (q, k, v, m), {}).graph, BASE).graph
    assert fold_window_mask(g) is g
    cm = kfuse.compile(model, (q, k, v, m), check=False)
    torch.testing.assert_close(cm(q, k, v, m), model(q, k, v, m), atol=1e-5, rtol=1e-4)


class _BuiltWindowMask(_ShiftedWindowAttention):
    """Swin-V2's stage-1 mask built in the graph from a small region table (``where(r_i - r_j != 0)``): the
    pass evaluates it itself (``fold.constant_value``), whether or not constant folding got to it first."""

    def __init__(self, windows: int, heads: int, n: int) -> None:
        super().__init__(windows, heads, n)
        self.register_buffer("region", torch.randint(0, 4, (windows, n)).float())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        diff = self.region[:, None, :] - self.region[:, :, None]
        mask = torch.where(diff != 0, -100.0, 0.0)
        bw, h, n, _ = q.shape
        s = ((q @ k.transpose(-1, -2)) * 0.25 + self.bias).view(bw // self.windows, self.windows, h, n, n)
        return torch.softmax((s + mask[None, :, None]).view(bw, h, n, n), dim=-1) @ v


def test_a_mask_computed_from_constants_folds_too() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(32, 1, 49, 8) for _ in range(3))
    model = _BuiltWindowMask(32, 1, 49)
    g = import_module(model, (q, k, v), {}).graph  # as imported: the mask is a chain of ops on constants
    assert any(n.op == "where" for n in g.nodes)
    folded = fold_window_mask(g)
    assert not any(n.op == "where" for n in folded.nodes) and all(n.ttype.rank <= 4 for n in folded.nodes if n.op == "add")
    torch.testing.assert_close(reference_run(folded, [q, k, v])[0], reference_run(g, [q, k, v])[0])
    cm = kfuse.compile(model, (q, k, v), check=False)
    assert [kk["template"] for kk in cm.report["kernels"]].count("fused_attention") == 1
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=1e-5, rtol=1e-4)
