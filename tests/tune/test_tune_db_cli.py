"""``kfuse tune-db`` commands (the Typer app the lead mounts)."""

import json

from typer.testing import CliRunner

from kfuse.kernels.gemm import GemmConfig
from kfuse.tune.cli import app
from kfuse.tune.database import TuningDB
from kfuse.tune.space import GemmProblem


def test_stats_export_import_clear(tmp_path):
    p = GemmProblem(64, 64, 64)
    db_path = tmp_path / "t.sqlite"
    db = TuningDB(db_path)
    db.add("gpu0", "gemm", p.signature(), json.dumps(p.as_dict()), GemmConfig().as_dict(), 0.1)
    r = CliRunner()
    out = r.invoke(app, ["stats", "--db", str(db_path), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["records"] == 1
    assert r.invoke(app, ["export", str(tmp_path / "x.json"), "--db", str(db_path)]).exit_code == 0
    other = tmp_path / "o.sqlite"
    out = r.invoke(app, ["import", str(tmp_path / "x.json"), "--db", str(other)])
    assert out.exit_code == 0 and "imported 1" in out.output
    out = r.invoke(app, ["clear", "--db", str(other), "--yes"])
    assert out.exit_code == 0 and "deleted 1" in out.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = r.invoke(app, ["import", str(bad), "--db", str(other)])
    assert out.exit_code == 1
