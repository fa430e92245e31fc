"""Nested concatenations as views of one buffer (``kfuse.runtime.concat_in_place``): DenseNet-style blocks give the
same values with and without it, with poisoned allocations, the cats become views, and nothing that assumes a
dense input gets a slice."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.runtime.concat_in_place import ViewCat, one_view
from kfuse.runtime.executor import plan_values


class _Layer(nn.Module):
    def __init__(self, c: int, growth: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        self.conv = nn.Conv2d(c, growth, 3, padding=1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return self.conv(torch.relu(self.bn(torch.cat(feats, 1))))


class _DenseBlock(nn.Module):
    """torchvision's dense block, small: each layer reads the cat of the block's input and every feature so far."""

    def __init__(self, c0: int = 6, growth: int = 5, layers: int = 4, head: str = "mean") -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c0, 3, padding=1)
        self.layers = nn.ModuleList(_Layer(c0 + k * growth, growth) for k in range(layers))
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [torch.relu(self.stem(x))]
        for layer in self.layers:
            feats.append(layer(feats))
        y = torch.cat(feats, 1)
        return y.mean((2, 3)) if self.head == "mean" else y


def _model(**kw: Any) -> nn.Module:
    torch.manual_seed(0)
    m = _DenseBlock(**kw).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    return m


_REAL_EMPTY = torch.empty


def _poisoned_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    t = _REAL_EMPTY(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


def test_dense_block_cats_become_views_of_one_buffer(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")  # on a GPU: the template (a cuDNN conv's output is copied instead)
    m, x = _model(), torch.randn(2, 3, 7, 9, device=device)  # 7 x 9 pixels, 6 + 4 x 5 channels: no tile multiple
    m = m.to(device)
    cm = kfuse.compile(m, (x,))
    # every member is a conv written straight into its slice: nothing is copied
    assert cm.report["concat_in_place"] == {"groups": 1, "view_cats": 4, "members": 5, "members_in_place": 5,
                                            "copy_mb_before": pytest.approx(0.071, abs=1e-3), "copy_mb_after": 0.0}  # fmt: skip
    kinds = [k["template"] for k in cm.report["kernels"]]
    assert kinds.count("view") == 4 and not [k for k in cm.report["kernels"] if k["template"] == "torch" and k["ops"] == ["cat"]]
    with pytest.MonkeyPatch.context() as mp:  # a slice no member wrote would read NaN
        mp.setattr(torch, "empty", _poisoned_empty)
        x2 = torch.randn(2, 3, 7, 9, device=device)
        out = cm(x2)
    with torch.no_grad():
        torch.testing.assert_close(out, m(x2), rtol=1e-4, atol=1e-4)
    # the cats are views: each layer's input shares the widest cat's storage
    plan = cm.plan
    vals = plan_values(plan, [x.contiguous()])
    views = [s.output for s in plan.steps if s.info.template == "view"]
    storages = {vals[v].untyped_storage().data_ptr() for v in views}
    assert len(storages) == 1


def test_off_keeps_plain_cats_and_the_same_values(device: str) -> None:
    m, x = _model().to(device), torch.randn(2, 3, 7, 9, device=device)
    on, off = kfuse.compile(m, (x,)), kfuse.compile(m, (x,), concat_in_place=False)
    assert "concat_in_place" not in off.report
    assert sum(k["ops"] == ["cat"] and k["template"] == "torch" for k in off.report["kernels"]) == 4
    torch.testing.assert_close(on(x), off(x), rtol=1e-5, atol=1e-5)


def test_cat_as_output_survives_the_next_call() -> None:
    """Each run allocates its own buffer: a returned view of the last run is not overwritten by the next."""
    m = _model(head="none")
    x1, x2 = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 5, 6)
    cm = kfuse.compile(m, (x1,), backend="torch")
    assert cm.report["concat_in_place"]["view_cats"] >= 3
    y1 = cm(x1)
    cm(x2)
    with torch.no_grad():
        torch.testing.assert_close(y1, m(x1), rtol=1e-5, atol=1e-5)


def test_step_errors_run_each_step_on_values_of_its_own() -> None:
    """A tool runs a view cat on PyTorch's values, which are not slices of one buffer: it gets torch.cat."""
    m, x = _model(), torch.randn(2, 3, 7, 9)
    cm = kfuse.compile(m, (x,), backend="torch")
    rows, whole = cm.step_errors(x)
    assert any(r.template == "view" for r in rows)
    assert max(r.rel_err for r in rows) < 1e-5 and whole < 1e-5


def test_one_view_only_for_consecutive_slices_of_one_storage() -> None:
    buf = torch.randn(2, 9, 4, 5).contiguous(memory_format=torch.channels_last)
    a, b, c = buf[:, :2], buf[:, 2:6], buf[:, 6:]
    v = one_view([a, b, c], 1)
    assert v is not None and v.data_ptr() == buf.data_ptr() and torch.equal(v, buf)
    assert torch.equal(one_view([b, c], 1), torch.cat([b, c], 1))
    assert one_view([a, c], 1) is None  # a gap
    assert one_view([b, a], 1) is None  # out of order
    whole = torch.randn(10, 3)
    assert one_view([whole[:4], whole[4:].clone()], 0) is None  # another storage
    assert one_view([buf[:, :2], buf[:1, 2:4]], 1) is None  # another batch extent
    # two separate tensors that happen to lie back to back are not one storage
    raw = torch.randn(8)
    p, q = raw[:4].clone(), raw[4:].clone()
    assert one_view([p, q], 0) is None
    cat = ViewCat(1)
    xs = [torch.randn(2, 3, 4, 5), torch.randn(2, 1, 4, 5)]
    torch.testing.assert_close(cat(xs), torch.cat(xs, 1))


class _Pair(nn.Module):
    """One cat of two convs (Inception's blocks cat four)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), torch.relu(self.b(x))], 1).sum((2, 3))


class _Shuffle(nn.Module):
    """ShuffleNet-V2's unit: half the channels pass through (a slice, copied), the other half through a conv (in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=1)
        return torch.cat([x1, torch.relu(self.conv(x2))], 1).amax((2, 3))


class _PoolRead(nn.Module):
    """Nested cats whose inner cat feeds the max-pool kernel, which wants dense NHWC: that cat stays a copy."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        b = self.b(a)
        p = nn.functional.max_pool2d(torch.cat([a, b], 1), 3, 1, 1)
        return torch.cat([a, b, self.c(p)], 1).sum((2, 3))


def _compiled_right(m: nn.Module, x: torch.Tensor, backend: str | None = None) -> kfuse.CompiledModel:
    m = m.eval().to(x.device)
    cm = kfuse.compile(m, (x,), backend=backend)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "empty", _poisoned_empty)
        out = cm(x)
    with torch.no_grad():
        torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
    return cm


def test_a_cat_of_kernels_is_computed_in_place(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    x = torch.randn(2, 3, 5, 6, device=device)
    rep = _compiled_right(_Pair(), x).report["concat_in_place"]
    assert rep["view_cats"] == 1 and rep["members_in_place"] == 2 and rep["copy_mb_after"] == 0.0


def test_a_cat_that_would_only_copy_is_left_alone() -> None:
    """With PyTorch's ops every member would be copied: one copy per member for one cat saves nothing."""
    cm = _compiled_right(_Pair(), torch.randn(2, 3, 5, 6), backend="torch")
    assert "concat_in_place" not in cm.report


def test_a_slice_member_is_copied_and_the_conv_member_written_in_place(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    rep = _compiled_right(_Shuffle(), torch.randn(2, 8, 5, 7, device=device)).report["concat_in_place"]
    assert rep["members"] == 2 and rep["members_in_place"] == 1
    assert 0 < rep["copy_mb_after"] < rep["copy_mb_before"]


def test_a_cat_read_by_a_dense_only_kernel_stays_a_copy(device: str) -> None:
    from kfuse.runtime.concat_in_place import STRIDED_READERS

    cm = _compiled_right(_PoolRead(), torch.randn(2, 3, 5, 6, device=device))
    kernels = cm.report["kernels"]
    pool = next(k["template"] for k in kernels if k["ops"] == ["max_pool2d"])  # on a GPU PyTorch's pool may win its race
    inner = "view" if pool in STRIDED_READERS else "torch"
    assert [k["template"] for k in kernels if k["ops"] == ["cat"]] == [inner, "view"], kernels


def test_a_swapped_step_function_still_writes_its_slice() -> None:
    """The b2b re-check installs one side of a decision as a step's function: a member keeps its slot writer."""
    from kfuse.runtime.b2b_recheck import _install
    from kfuse.runtime.concat_in_place import SlotWriter

    m, x = _model(), torch.randn(2, 3, 7, 9)
    cm = kfuse.compile(m, (x,))
    step = next(s for s in cm.plan.steps if isinstance(s.fn, SlotWriter))
    inner = step.fn.fn
    _install(step, (lambda xs: inner(xs), step.info, {}))  # a side that allocates its own output: copied into the slice
    assert isinstance(step.fn, SlotWriter)
    vals = plan_values(cm.plan, [x.contiguous(memory_format=torch.channels_last)])
    views = [s.output for s in cm.plan.steps if s.info.template == "view"]
    assert len({vals[v].untyped_storage().data_ptr() for v in views}) == 1
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_fp16_dense_block_on_the_gpu() -> None:
    """fp16 with the conv-vs-cuDNN race on: 16-byte aligned slices (16 + k x 8 channels), so the TMA conv may load
    the view cats and store into the buffer, and whichever kernel wins each conv, the values hold."""
    m = _model(c0=16, growth=8, layers=4).cuda().half()
    x = torch.randn(4, 3, 20, 24, device="cuda", dtype=torch.float16)
    cm = kfuse.compile(m, (x,))
    assert cm.report["concat_in_place"]["view_cats"] == 4
    x2 = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(cm(x2), m(x2), rtol=2e-2, atol=2e-2)


def test_the_summary_counts_views_as_no_launch_and_says_what_they_save() -> None:
    from kfuse.report import summary_lines

    m, x = _model(), torch.randn(2, 3, 7, 9)
    cm = kfuse.compile(m, (x,), backend="torch")
    lines = summary_lines(cm.report)
    views = sum(k["template"] == "view" for k in cm.report["kernels"])
    assert views == 4 and f"{len(cm.report['kernels']) - views} launches" in lines[0]
    line = next(s for s in lines if s.startswith("concatenations:"))
    assert "4 cat(s) are views of 1 buffer(s)" in line and "MB ->" in line


class _CatOfCats(nn.Module):
    """Inception-v3's E block: the block's cat reads two cats of branch convs."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(3, c, k, padding=k // 2) for c, k in ((4, 1), (3, 3), (5, 1), (2, 3), (6, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d, e = (torch.relu(conv(x)) for conv in self.convs)
        return torch.cat([a, torch.cat([b, c], 1), torch.cat([d, e], 1)], 1).sum((2, 3))


def test_a_cat_of_cats_is_one_buffer(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    cm = _compiled_right(_CatOfCats(), torch.randn(2, 3, 5, 7, device=device))
    rep = cm.report["concat_in_place"]
    assert rep["groups"] == 1 and rep["view_cats"] == 3 and rep["members"] == 5 and rep["members_in_place"] == 5
    views = {k["name"]: k["config"] for k in cm.report["kernels"] if k["template"] == "view"}
    assert {v.split(")")[0] for v in views.values()} == {"[0, 20", "[4, 12", "[12, 20"}
