"""The tuner against bad or stale data: earlier records the rules reject today or outside the
requested space, records of another kfuse version or of a newer kfuse, database files that are
corrupt past their first page, locked, unopenable or foreign, exports with broken records, and
a GPU whose context a failing config poisoned."""

import json
import math
import sqlite3
import warnings

import pytest
import torch
from typer.testing import CliRunner

from kfuse.kernels.gemm import GemmConfig
from kfuse.tune import profiler as profiler_mod
from kfuse.tune.cli import app
from kfuse.tune.database import Record, TuningDB
from kfuse.tune.hardware import DEFAULT
from kfuse.tune.profiler import CudaContextLost, Profiler
from kfuse.tune.space import GemmProblem, hard_reject, is_valid, problem_from_dict, valid_configs
from kfuse.tune.tuner import Tuner

BIG = GemmProblem(4096, 4096, 4096)
# allowed by an older kfuse's rules; today warp specialisation with 128-row tiles is rejected (it deadlocks)
REJECTED = GemmConfig(128, 128, 64, 8, 4, 3, persistent=True, tma=True, warp_specialize=True)


class Counting:
    def __init__(self):
        self.calls = []

    def __call__(self, cfg, problem):
        self.calls.append(cfg)
        return 1.0 + 0.001 * len(self.calls)


def tuner(db, measure=None):
    return Tuner("fast", db=db, hw=DEFAULT, measure=measure or Counting(), device="cpu", progress=False, check=False)


def ok_record(db, problem, cfg, time_ms, kfuse_version=None, status="ok", error=""):
    return Record(DEFAULT.key(), problem.template, problem.signature(), json.dumps(problem.as_dict()), cfg.as_dict(), time_ms, status,
                  error, db.triton_version, kfuse_version or db.kfuse_version)  # fmt: skip


# ---- 1: earlier records ---------------------------------------------------------------------
def test_earlier_ok_record_rejected_by_todays_rules_is_never_chosen():
    assert hard_reject(REJECTED, BIG, DEFAULT) is not None
    db = TuningDB(":memory:")
    db.add_records([ok_record(db, BIG, REJECTED, 0.01)])  # the fastest time there is
    t = tuner(db)
    cfg = t.choose([(BIG, None)])[BIG.signature()]
    assert cfg is not None and cfg != REJECTED and is_valid(cfg, BIG, DEFAULT)
    assert t.lookup(BIG) == cfg  # stored as tuned: a later compile takes it from the database
    again = Counting()
    t2 = tuner(db, again)
    assert t2.choose([(BIG, None)])[BIG.signature()] == cfg
    assert again.calls == [] and t2.stats.from_db == 1


def test_earlier_ok_record_outside_the_space_is_not_chosen():
    p = GemmProblem(2048, 2048, 2048)
    valid = valid_configs(p, DEFAULT)
    outside, sub = valid[0], valid[1:5]
    db = TuningDB(":memory:")
    db.add(DEFAULT.key(), "gemm", p.signature(), json.dumps(p.as_dict()), outside.as_dict(), 0.001)
    res = tuner(db).tune(p, space=sub)
    assert res.best in sub


def test_records_of_another_kfuse_version_do_not_count_as_measured():
    db = TuningDB(":memory:")
    good = GemmConfig(128, 128, 64, 8, 8, 3)
    assert is_valid(good, BIG, DEFAULT)
    db.add_records([ok_record(db, BIG, good, 0.5, kfuse_version="0.0.1-old"),
                    ok_record(db, BIG, good, None, kfuse_version="0.0.1-old", status="done", error="mode=fast")])  # fmt: skip
    assert db.measured(DEFAULT.key(), "gemm", BIG.signature()) == []
    assert db.best(DEFAULT.key(), "gemm", BIG.signature()) is None
    assert tuner(db).lookup(BIG) is None
    assert len(db.records(DEFAULT.key(), "gemm")) == 2  # still training data for the cost model


def test_problem_from_dict_drops_unknown_keys():
    d = dict(BIG.as_dict(), swizzle=2)
    assert problem_from_dict(d) == BIG


def test_newer_kfuse_record_does_not_break_tuning():
    db = TuningDB(":memory:")
    other = GemmProblem(512, 512, 512)
    pj = dict(other.as_dict(), swizzle=2)  # a newer kfuse's problem field
    db.add_records([Record(DEFAULT.key(), "gemm", other.signature() + " sw2", json.dumps(pj), GemmConfig().as_dict(), None, "done",
                           "mode=fast", db.triton_version, "9.9.9")])  # fmt: skip
    p = GemmProblem(1024, 1024, 1024)
    cfg = tuner(db).choose([(p, None)])[p.signature()]
    assert cfg is not None and is_valid(cfg, p, DEFAULT)


# ---- 2: database files ----------------------------------------------------------------------
def _filled(path, n=300):
    db = TuningDB(path)
    p = GemmProblem(256, 256, 256)
    db.add_records([Record("g", "gemm", f"s{i}", json.dumps(p.as_dict()), {"block_m": 64, "pad": "x" * 200}, 1.0) for i in range(n)])
    db.close()


def test_corruption_past_the_first_page_is_found_at_open(tmp_path):
    path = tmp_path / "t.sqlite"
    _filled(path)
    data = bytearray(path.read_bytes())
    page = len(data) // 4096 // 2
    data[page * 4096 : page * 4096 + 8] = b"\xff" * 8  # a b-tree page header in the middle of the file
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        db = TuningDB(path)
    assert db.set_aside is not None and db.set_aside.exists()
    assert any("unusable" in str(x.message) for x in w)
    assert db.stats()["records"] == 0


def test_unreadable_records_mean_no_data_not_a_failed_compile(tmp_path):
    path = tmp_path / "t.sqlite"
    db = TuningDB(path)
    c = db.conn
    # text that is not UTF-8 (a torn write): quick_check passes, reading the row fails
    c.execute("INSERT INTO records (gpu, triton_version, kfuse_version, template, problem, problem_json, config_json, time_ms, status,"
              " error, created) VALUES (?, ?, ?, 'gemm', ?, CAST(X'7B22FFFE' AS TEXT), '{}', 1.0, 'ok', '', 0)",
              (DEFAULT.key(), db.triton_version, db.kfuse_version, BIG.signature()))  # fmt: skip
    c.commit()
    t = tuner(db)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = t.choose([(BIG, None)])[BIG.signature()]
    assert cfg is not None and is_valid(cfg, BIG, DEFAULT)
    assert any("tuning without it" in str(x.message) for x in w)


def test_a_database_that_cannot_be_written_does_not_fail_the_compile(monkeypatch):
    db = TuningDB(":memory:")

    def readonly(*a, **k):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(db, "add", readonly)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cfg = tuner(db).choose([(BIG, None)])[BIG.signature()]
    assert cfg is not None and any("cannot write" in str(x.message) for x in w)


def _short_busy_timeout(monkeypatch):
    orig = TuningDB._connect

    def fast(self):
        c = orig(self)
        c.execute("PRAGMA busy_timeout = 50")
        return c

    monkeypatch.setattr(TuningDB, "_connect", fast)


def test_locked_database_is_not_moved_aside(tmp_path, monkeypatch):
    path = tmp_path / "tune.sqlite"
    db = TuningDB(path)
    db.add("gpu", "gemm", "sig", "{}", {"block_m": 64}, 1.0)
    db.close()
    _short_busy_timeout(monkeypatch)
    other = sqlite3.connect(path)
    other.execute("BEGIN EXCLUSIVE")  # another process mid-transaction
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            TuningDB(path)
        # the compile-time tuner goes on without the database
        monkeypatch.setenv("KFUSE_TUNE_DB", str(path))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t = Tuner("fast", hw=DEFAULT, measure=Counting(), device="cpu", progress=False, check=False)
            p = GemmProblem(1024, 1024, 1024)
            assert t.choose([(p, None)])[p.signature()] is not None
        assert any("tuning without it" in str(x.message) for x in w)
    finally:
        other.rollback()
        other.close()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["tune.sqlite"]
    assert TuningDB(path).stats()["records"] == 1


def test_unopenable_path_is_not_moved_aside(tmp_path):
    path = tmp_path / "adir"
    path.mkdir()
    (path / "keep").write_text("x")
    with pytest.raises(sqlite3.OperationalError):
        TuningDB(path)
    assert path.is_dir() and (path / "keep").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["adir"]


def _foreign(path):
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE notes (body TEXT)")
    c.execute("INSERT INTO notes VALUES ('mine')")
    c.commit()
    c.close()


def _tables(path):
    c = sqlite3.connect(path)
    try:
        return sorted(r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        c.close()


@pytest.mark.parametrize("cmd", [["stats"], ["stats", "--json"], ["export", "OUT"]])
def test_stats_and_export_never_change_a_foreign_file(tmp_path, cmd):
    path = tmp_path / "foreign.sqlite"
    _foreign(path)
    before = path.read_bytes()
    args = [str(tmp_path / "x.json") if a == "OUT" else a for a in cmd] + ["--db", str(path)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert "not a kfuse tuning database" in out.output
    assert _tables(path) == ["notes"] and path.read_bytes() == before


def test_stats_of_a_missing_file_creates_nothing(tmp_path):
    path = tmp_path / "none.sqlite"
    out = CliRunner().invoke(app, ["stats", "--db", str(path)])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit) and not path.exists()


def test_readonly_open_reads_a_kfuse_database(tmp_path):
    path = tmp_path / "t.sqlite"
    _filled(path, 3)
    db = TuningDB(path, readonly=True)
    assert db.stats()["records"] == 3
    with pytest.raises(sqlite3.OperationalError):
        db.add("g", "gemm", "s", "{}", {}, 1.0)


# ---- 4: imports -----------------------------------------------------------------------------
def _export(tmp_path, recs):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"kfuse_tuning_records": 1, "records": recs}))
    return p


def _rec(**kw):
    d = {"gpu": "g", "template": "gemm", "problem": "s", "problem_json": {"template": "gemm", "m": 1, "n": 1, "k": 1},
         "config": {"block_m": 64}, "time_ms": 0.5, "status": "ok"}  # fmt: skip
    d.update(kw)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def test_import_of_a_record_missing_a_key_is_a_clean_error(tmp_path):
    src = _export(tmp_path, [_rec(), _rec(gpu=_DROP)])
    db = tmp_path / "t.sqlite"
    out = CliRunner().invoke(app, ["import", str(src), "--db", str(db)])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit)
    assert "not a kfuse tuning export" in out.output
    assert TuningDB(db).stats()["records"] == 0  # all or nothing


@pytest.mark.parametrize("t", [0.0, -1.0, math.nan, math.inf, None, "fast"])
def test_ok_records_need_a_positive_finite_time(tmp_path, t):
    db = TuningDB(":memory:")
    with pytest.raises(ValueError):
        db.add_records([Record("g", "gemm", "s", "{}", {"block_m": 64}, t, "ok")])
    assert db.stats()["records"] == 0
    with pytest.raises(ValueError, match="not a kfuse tuning export"):
        db.import_(_export(tmp_path, [_rec(time_ms=t)]))  # JSON's NaN / Infinity read back as floats
    assert db.stats()["records"] == 0
    db.add_records([Record("g", "gemm", "s", "{}", {"block_m": 64}, None, "failed", "boom")])  # failures carry no time
    assert db.stats()["records"] == 1


# ---- 3: a GPU context lost to a failing config ----------------------------------------------
class _StickyRunner:
    """Every run raises as after an illegal memory access; the device claims to be a GPU."""

    n_sets = 2
    device = torch.device("cuda")

    def compile(self, cfg):
        pass

    def poison(self, i):
        pass

    def run(self, cfg, i):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def check(self, out, i):
        return None


@pytest.mark.parametrize("context_lost", [True, False])
def test_sticky_cuda_error_stops_tuning_without_recording_the_rest(monkeypatch, context_lost):
    def synchronize(device=None):
        if context_lost:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(profiler_mod.torch.cuda, "synchronize", synchronize)
    cfgs = valid_configs(BIG, DEFAULT)[:3]
    recorded = []
    prof = Profiler()
    if context_lost:
        with pytest.raises(CudaContextLost, match="CUDA context was lost"):
            prof.profile(BIG, cfgs, _StickyRunner(), recorded.append)
        assert [m.config for m in recorded] == cfgs[:1] and recorded[0].status == "failed"  # the culprit only
    else:  # an ordinary failure: recorded, and the next config measured
        out = prof.profile(BIG, cfgs, _StickyRunner(), recorded.append)
        assert [m.status for m in out] == ["failed"] * 3 and len(recorded) == 3


def test_the_best_of_a_sub_space_is_not_stored_as_the_tuned_config(tmp_path) -> None:
    """``tune(p, space=...)`` (the exhaustive comparison) measures a sub-space; a later compile must
    not take its best as the problem's tuned config."""
    from kfuse.kernels.gemm import GemmConfig
    from kfuse.tune.database import TuningDB
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.space import GemmProblem
    from kfuse.tune.tuner import Tuner

    p = GemmProblem(24, 40, 32, dtype="fp32", n_extras=1)
    sub = [GemmConfig(16, 32, 32, 1, 4, 2)]
    db = TuningDB(tmp_path / "t.sqlite")
    t = Tuner("fast", db=db, hw=DEFAULT, measure=lambda cfg, prob: 1.0, progress=False, check=False)
    assert t.tune(p, space=sub).best == sub[0]
    assert t.lookup(p) is None  # measured, but not "done"
    assert len(db.measured(DEFAULT.key(), "gemm", p.signature())) == 1
