"""Operator-level profile: rows per step, FLOP counts, shares, and the PNG chart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.passes.fuse_pointwise import fuse_pointwise
from kfuse.runtime.executor import lower
from kfuse.runtime.profile import node_flops, plot_profile, print_profile, profile_plan, profile_summary


def _plan(device: str) -> tuple:
    b = GraphBuilder("prof")
    x = b.add_input("x", TensorType((6, 8), torch.float32))
    w = b.add_constant(torch.randn(8, 5))
    y = b.op("matmul", [x, w])
    z = b.op("softmax", [b.op("relu", [y])], {"dim": 1})
    g = fuse_pointwise(b.build([z]))
    backend = "triton" if device == "cuda" else "triton-interpreter"
    return g, lower(g, torch.device(device), backend)


def test_profile_rows(device: str, tmp_path: Path) -> None:
    g, plan = _plan(device)
    rows = profile_plan(plan, [torch.randn(6, 8, device=device)], warmup=1, rep=3)
    assert len(rows) == len(plan.steps)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    mm = next(r for r in rows if "matmul" in r["ops"])
    assert mm["flops"] == 2 * 6 * 5 * 8 and mm["bytes"] == (6 * 8 + 8 * 5 + 6 * 5) * 4
    pw = next(r for r in rows if r["template"] == "pointwise")
    assert pw["flops"] == 0 and pw["bound"] == "memory" and pw["floor_ms"] > 0
    # on the GPU a step's time is its graph replay less the launch's share: a step shorter than the
    # launch's spread reads 0 (a view, a tiny pointwise), the matmul does not
    assert mm["time_ms"] > 0
    for r in rows:
        assert r["time_ms"] >= 0 and r["of_floor"] >= 0
    s = profile_summary(rows)
    assert s["launches"] == len(rows) and s["total_ms"] > 0
    png = plot_profile(rows, tmp_path / "p" / "profile.png")
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"
    print_profile(rows)


def test_flops_of_conv_and_attention() -> None:
    b = GraphBuilder("fl")
    x = b.add_input("x", TensorType((2, 3, 9, 9), torch.float32))
    w = b.add_constant(torch.randn(4, 3, 3, 3))
    c = b.op("conv2d", [x, w], {"padding": (1, 1)})
    q = b.add_input("q", TensorType((2, 2, 7, 4), torch.float32))
    a = b.op("sdpa", [q, q, q])
    g = b.build([c, a])
    nodes = g.node_map()
    assert node_flops(nodes[c], g) == 2 * (2 * 4 * 9 * 9) * 27
    assert node_flops(nodes[a], g) == 4 * 4 * 7 * 7 * 4


def test_interleaved_timing_rotates_the_order_and_takes_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every side is timed once a round, in an order rotated every round (a GPU that slows under
    load then slows all sides alike), and its median is returned: a slow side stays slower."""
    from kfuse.bench import harness

    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    monkeypatch.setattr(harness, "time_ms", lambda fn, warmup=0, rep=1: (fn(), {"a": 1.0, "b": 3.0, "c": 2.0}[order[-1]])[1])
    # the plain-call path: on a GPU the sides would be captured into CUDA graphs first (the capture
    # calls each fake once, out of the rotation this test checks)
    monkeypatch.setattr(harness.torch.cuda, "is_available", lambda: False)
    got = harness.interleaved_ms(fns, rounds=3)
    assert got == {"a": 1.0, "b": 3.0, "c": 2.0}
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_paired_ratio_band_calls_a_tie_where_the_rounds_disagree() -> None:
    """The round-by-round ratio of two interleaved sides: a side faster in every round is a win (-1),
    slower in every round a loss (+1), and one whose rounds straddle parity a tie (0), whatever the
    drift that moves both sides together round to round; failed timings are left out of the pairs."""
    from kfuse.bench.harness import paired_ratio_band

    drift = [1.0, 1.3, 0.9, 1.1, 1.2, 1.0, 0.95, 1.05, 1.15]  # the clock, shared by both sides of a round
    base = [10.0 * d for d in drift]
    win = paired_ratio_band([0.97 * x for x in base], base)
    assert win is not None and win["verdict"] == -1 and abs(win["median"] - 0.97) < 1e-9 and win["rounds"] == 9
    loss = paired_ratio_band([1.02 * x for x in base], base)
    assert loss is not None and loss["verdict"] == 1
    wobble = [0.98, 1.03, 0.99, 1.02, 0.97, 1.01, 1.04, 0.99, 1.0]
    tie = paired_ratio_band([w * x for w, x in zip(wobble, base, strict=True)], base)
    assert tie is not None and tie["verdict"] == 0 and tie["q1"] < 1.0 < tie["q3"]
    assert paired_ratio_band([None, 1.0], [1.0, None]) is None
    assert paired_ratio_band([None, 2.0, 3.0], [1.0, 1.0, 1.0])["rounds"] == 2


def test_interleaved_rounds_keep_each_rounds_time_and_its_failures() -> None:
    """``interleaved_rounds``: one entry a round for every side (None where that timing failed), so two
    sides' timings of one round can be paired; the medians leave the failures out."""
    from kfuse.bench import harness

    t = {"a": iter([1.0, None, 3.0]), "b": iter([2.0, 2.0, 2.0])}
    got = harness.interleaved_rounds(["a", "b"], lambda s: next(t[s]), 3)
    assert got == {"a": [1.0, None, 3.0], "b": [2.0, 2.0, 2.0]}
    t = {"a": iter([1.0, None, 3.0]), "b": iter([None, None, None])}
    assert harness.interleaved_medians(["a", "b"], lambda s: next(t[s]), 3) == {"a": 2.0}
