"""Row-only data movement (Swin's roll + window partition and its reverse) becomes one row gather, folded
into the LayerNorm in front of it (kfuse.passes.gather_rows)."""

from __future__ import annotations

import pytest
import torch

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.gather_rows import gather_rows


class _ShiftedWindows(torch.nn.Module):
    """HF Swin's token path around a window attention, the attention replaced by a per-window linear:
    LayerNorm, roll, partition into windows, a projection, the reverse partition, roll back, residual."""

    def __init__(self, c: int, h: int, w: int, window: int, shift: int) -> None:
        super().__init__()
        self.h, self.w, self.win, self.shift = h, w, window, shift
        self.norm = torch.nn.LayerNorm(c)
        self.proj = torch.nn.Linear(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        h, w, k, s = self.h, self.w, self.win, self.shift
        y = self.norm(x).view(b, h, w, c)
        if s:
            y = torch.roll(y, shifts=(-s, -s), dims=(1, 2))
        y = y.view(b, h // k, k, w // k, k, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, k * k, c)
        y = self.proj(y)
        y = y.view(b, h // k, w // k, k, k, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, c)
        if s:
            y = torch.roll(y, shifts=(s, s), dims=(1, 2))
        return x + y.view(b, h * w, c)


def _ops(cm) -> list[str]:
    """The ops PyTorch runs (a gather lists the moves it replaced among its own ops)."""
    return [op for k in cm.report["kernels"] if k["template"] == "torch" for op in k["ops"]]


@pytest.mark.parametrize("b,c,h,k,s", [(2, 24, 10, 5, 2), (1, 16, 8, 4, 0), (3, 40, 6, 3, 1)])
def test_partition_and_roll_become_gathers(b: int, c: int, h: int, k: int, s: int) -> None:
    torch.manual_seed(b + c + s)
    model = _ShiftedWindows(c, h, h, k, s).eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(b, h * h, c)
    cm = kfuse.compile(model, (x,), check=False)
    templates = [kk["template"] for kk in cm.report["kernels"]]
    if s == 0:
        # no roll: the per-window projection acts on rows alone, so the partition moves below it
        # (hoist_row_views.sink_row_permutes) and cancels against the reverse; nothing is gathered at all
        assert [t for t in templates if t != "torch"] == ["fused_norm", "gemm_epilogue"] and not _ops(cm), cm.report["kernels"]
    else:
        assert "cat" not in _ops(cm) and templates.count("gather_rows") == 1
        norms = [kk for kk in cm.report["kernels"] if kk["template"] == "fused_norm"]
        assert len(norms) == 1 and "gather_rows" in norms[0]["ops"]  # the partition folded into the norm
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)
    off = kfuse.compile(model, (x,), options=Options(gather_rows=False), check=False)
    assert "gather_rows" not in [kk["template"] for kk in off.report["kernels"]]
    assert ("cat" in _ops(off)) == bool(s)


def test_the_pass_keeps_the_graph_s_values() -> None:
    torch.manual_seed(0)
    model = _ShiftedWindows(16, 8, 8, 4, 2)
    x = torch.randn(2, 64, 16)
    g = optimize(import_module(model, (x,), {}).graph, Options(gather_rows=False, fuse_attention=False, fuse_pointwise=False)).graph
    gathered = gather_rows(g)
    assert sum(n.op == "gather_rows" for n in gathered.nodes) == 2 and not any(n.op == "cat" for n in gathered.nodes)
    torch.testing.assert_close(reference_run(gathered, [x])[0], reference_run(g, [x])[0])


class _NotRows(torch.nn.Module):
    """Data movement that is not a row reordering (the feature dim transposed), and one that is a view."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.transpose(1, 2).contiguous() * 2.0
        v = x.view(x.shape[0], 1, x.shape[1], 1, x.shape[2]).permute(0, 3, 2, 1, 4).reshape(x.shape) + 1.0
        return t, v


def test_other_data_movement_is_left_alone() -> None:
    x = torch.randn(2, 12, 16)
    g = import_module(_NotRows(), (x,), {}).graph
    assert gather_rows(g) is g
    # rows of 4 features: the index would cost as many bytes as the data
    g2 = import_module(_ShiftedWindows(4, 4, 3, 1, 1), (torch.randn(1, 12, 4),), {}).graph
    assert not any(n.op == "gather_rows" for n in gather_rows(g2).nodes)


class _PostNormWindows(_ShiftedWindows):
    """Swin-V2's order: the window path first, its LayerNorm after the reverse partition, then the residual."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        h, w, k, s = self.h, self.w, self.win, self.shift
        y = torch.roll(x.view(b, h, w, c), shifts=(-s, -s), dims=(1, 2))
        y = self.proj(y.view(b, h // k, k, w // k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, k * k, c))
        y = y.view(b, h // k, w // k, k, k, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        y = torch.roll(y, shifts=(s, s), dims=(1, 2)).reshape(b, h * w, c)
        return x + self.norm(y)


def test_a_gather_read_by_a_norm_folds_into_it() -> None:
    torch.manual_seed(5)
    model = _PostNormWindows(24, 10, 10, 5, 2).eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 100, 24)
    cm = kfuse.compile(model, (x,), check=False)
    norms = [kk for kk in cm.report["kernels"] if kk["template"] == "fused_norm"]
    assert len(norms) == 1 and norms[0]["ops"][0] == "gather_rows"  # the reverse partition, read by the norm
    assert [kk["template"] for kk in cm.report["kernels"]].count("gather_rows") == 1  # the forward one, standalone
    assert "cat" not in _ops(cm)
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)


class _PatchMerging(torch.nn.Module):
    """HF Swin's patch merging: four strided slices of (B, H, W, C) side by side, a LayerNorm over 4C, a linear."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4 * c)
        self.reduce = torch.nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]
        x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]
        y = torch.cat([x0, x1, x2, x3], -1).view(x.shape[0], -1, 4 * x.shape[-1])
        return self.reduce(self.norm(y))


def test_patch_merging_gathers_four_rows_an_output_row() -> None:
    torch.manual_seed(7)
    model = _PatchMerging(12).eval()
    x = torch.randn(2, 6, 10, 12)
    cm = kfuse.compile(model, (x,), check=False)
    assert [kk["template"] for kk in cm.report["kernels"]].count("gather_rows") == 1 and "cat" not in _ops(cm)
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)


def test_a_post_norm_residual_joins_the_norm() -> None:
    """Swin-V2's ``x + LayerNorm(...)``: the residual add is the norm kernel's last step (``post_add``)."""
    torch.manual_seed(9)
    model = _PostNormWindows(24, 10, 10, 5, 2).eval()
    x = torch.randn(2, 100, 24)
    cm = kfuse.compile(model, (x,), check=False)
    norms = [kk for kk in cm.report["kernels"] if kk["template"] == "fused_norm"]
    assert len(norms) == 1 and norms[0]["ops"] == ["gather_rows", "layer_norm", "add"]
    assert not [kk for kk in cm.report["kernels"] if kk["template"] == "pointwise"]
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)
    off = kfuse.compile(model, (x,), check=False, fuse_attention=False)  # the stage runs with the attention fusions
    assert [kk["template"] for kk in off.report["kernels"]].count("pointwise") == 1
