"""`kfuse sparse solve`: one matrix analysed, tuned on request, solved and checked (interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import scipy.io
import scipy.sparse as sp
from typer.testing import CliRunner

from kfuse.cli import app
from kfuse.sparse.matrices import make

runner = CliRunner()


def _text(r) -> str:  # noqa: ANN001 - a click Result
    """The output with rich's box drawing and line wrapping taken out."""
    return " ".join(r.output.replace("│", " ").split())


def test_solve_generated_matrix_with_tuning_and_json(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = runner.invoke(app, ["sparse", "solve", "--gen", "powerlaw:300", "--tune", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "regime long" in r.output and "tuned " in r.output and "max rel err" in r.output
    rec = json.loads(out.read_text())
    assert rec["matrix"] == "powerlaw_300" and rec["max_rel_err"] < 1e-10 and len(rec["tuned"]) == 4
    assert rec["plan"]["sync"] in {k.split("@")[0] for k in rec["tuned"]}  # the plan runs a tuned candidate


def test_solve_upper_matrix_from_files(tmp_path: Path) -> None:
    upper = make("laplacian2d", 7, seed=3).T.tocsr()
    npz, mtx = tmp_path / "u.npz", tmp_path / "u.mtx"
    sp.save_npz(npz, upper)
    scipy.io.mmwrite(str(mtx), upper)
    for path in (npz, mtx):
        r = runner.invoke(app, ["sparse", "solve", str(path), "--upper", "--dtype", "fp32"])
        assert r.exit_code == 0, r.output
        assert f"{path.stem}: 49 rows" in r.output


def test_solve_errors_are_clear(tmp_path: Path) -> None:
    r = runner.invoke(app, ["sparse", "solve"])
    assert r.exit_code != 0 and "one of them" in _text(r)
    r = runner.invoke(app, ["sparse", "solve", "--gen", "spiral:10"])
    assert r.exit_code != 0 and "KIND:SIZE" in _text(r)
    r = runner.invoke(app, ["sparse", "solve", str(tmp_path / "missing.npz")])
    assert r.exit_code != 0 and "does not exist" in _text(r)
    (tmp_path / "m.txt").write_text("1")
    r = runner.invoke(app, ["sparse", "solve", str(tmp_path / "m.txt")])
    assert r.exit_code != 0 and ".npz" in _text(r)
    lower = make("laplacian2d", 5, seed=1)
    sp.save_npz(tmp_path / "l.npz", lower)
    r = runner.invoke(app, ["sparse", "solve", str(tmp_path / "l.npz"), "--upper"])  # wrong triangle
    assert r.exit_code == 2 and "lower=" in _text(r)
