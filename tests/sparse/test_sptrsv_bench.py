"""The SpTRSV benchmark driver (kfuse.sparse.bench): smoke sweep and one record per regime, on the bench's
device (the interpreter on the CPU; on a GPU the compiled kernels, with CUDA graphs)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kfuse.sparse import bench
from kfuse.sparse.bench import Case, format_table, plot, run_case, smoke, write_json
from kfuse.sparse.sptrsv import analyze


def test_smoke_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """The smoke sweep used to ask for CUDA; it now runs on the bench's device (the CPU included)."""
    assert bench._device().type == device
    monkeypatch.setitem(bench.SMOKE_CASES, device, [("chain", 20), ("laplacian3d", 4)])  # the cases of that device
    res = smoke(log=lambda s: None)
    assert len(res) == 16 and all(r["ok"] for r in res), [r for r in res if not r["ok"]]
    assert {(r["kind"], r["regime"]) for r in res} == {("chain", "narrow"), ("laplacian3d", "short")}


def _once(fn: Callable[[], Any], **_: Any) -> float:
    """One call, wall clock: the interpreter's times mean nothing, only the driver is tested."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


@pytest.mark.timeout(300)
def test_run_case_records_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(bench, "time_cuda", _once)
    # on a GPU analyze() would tune the choice with the real timer: the heuristic's choice is what is pinned here
    monkeypatch.setattr(bench, "analyze", functools.partial(analyze, tune=False))
    recs = [run_case(c, "test", log=lambda s: None) for c in (Case("laplacian2d", 12), Case("chain", 60), Case("powerlaw", 400))]
    got = {r["case"]: (r["regime"], r["sync"], "{rows_per_program}x{lanes_per_row}w{num_warps}".format(**r["tiling"])) for r in recs}
    assert got["laplacian2d_12"] == ("short", "persistent-valueflag-prefetch-ppsm8", "8x4w1")
    assert got["chain_60"] == ("narrow", "grid-rowflag", "32x2w1")
    assert got["powerlaw_400"][:2] == ("long", "persistent-valueflag-prefetch-ppsm2")
    for r in recs:
        assert r["max_rel_err"] < 1e-12 and r["kfuse_rel_err_after_timing"] < 1e-12 and r["levelset_rel_err"] < 1e-12
        assert r["kfuse_eager_ms"] > 0 and r["speedup_vs_levelset"] > 0 and r["tuned"] == {}
        if device == "cuda":  # the solve captured as a CUDA graph too: kfuse_ms is the better of both
            assert "kfuse_graph_error" not in r and r["kfuse_graph_ms"] > 0 and r["kfuse_graph_rel_err"] < 1e-12, r
            assert r["kfuse_ms"] == min(r["kfuse_eager_ms"], r["kfuse_graph_ms"])
        else:  # no graph on the CPU
            assert r["kfuse_graph_ms"] is None and r["kfuse_ms"] == r["kfuse_eager_ms"]
    write_json(recs, tmp_path / "sptrsv.json")
    plot(recs, tmp_path / "sptrsv_levels.png")
    assert (tmp_path / "sptrsv_levels.png").stat().st_size > 0
    assert "laplacian2d_12" in format_table(recs)
