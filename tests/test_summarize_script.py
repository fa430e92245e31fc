"""benchmarks/summarize.py: the round-by-round plot of issue 3's record (kfuse / gemm_only quartiles)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _summarize():  # noqa: ANN202 - the script as a module
    spec = importlib.util.spec_from_file_location("kfuse_summarize", ROOT / "benchmarks/summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_rounds_plot_draws_records_with_a_band_and_skips_others(tmp_path: Path) -> None:
    mod = _summarize()
    band = lambda med, v: {"median": med, "q1": med - 0.01, "q3": med + 0.01, "rounds": 9, "verdict": v}  # noqa: E731
    recs = [{"case": "a", mod.ROUNDS_KEY: band(0.96, -1)}, {"case": "b", mod.ROUNDS_KEY: band(1.0, 0)},
            {"case": "c", mod.ROUNDS_KEY: band(1.03, 1)}, {"case": "no band"}]  # fmt: skip
    path = mod.rounds_plot_for("gemm_epilogue", recs, tmp_path)
    assert path is not None and path.name == "summary_gemm_epilogue_rounds.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert mod.rounds_plot_for("x", [{"case": "a"}, {"case": "b"}], tmp_path) is None  # no band: no plot
    assert mod.rounds_plot_for("x", recs[:1], tmp_path) is None  # one case: no plot
