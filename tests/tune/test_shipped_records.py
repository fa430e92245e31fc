"""Shipped tuning records (``kfuse.tune.shipped``): the file kfuse ships for a GPU seeds the tuner's database once, on
that GPU, so a first compile there looks its problems up instead of tuning them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from kfuse.kernels.gemm import GemmConfig
from kfuse.tune import shipped
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT
from kfuse.tune.space import GemmProblem
from kfuse.tune.tuner import Tuner

P = GemmProblem(4096, 3072, 768)


def _ship(directory: Path, gpu: str, block_m: int = 128) -> Path:
    """A shipped file as ``kfuse tune-db export`` writes it: a measured config and the tuner's ``done`` marker."""
    db = TuningDB(directory / f"maker{block_m}.sqlite")
    pj = json.dumps(P.as_dict())
    db.add(gpu, "gemm", P.signature(), pj, GemmConfig(block_m).as_dict(), 0.05)
    db.add(gpu, "gemm", P.signature(), pj, GemmConfig(block_m).as_dict(), 0.05, "done", "mode=fast")
    f = directory / f"{shipped.slug(gpu)}.json"
    db.export(f)
    db.close()
    return f


def _tuner(db: TuningDB, device: str = "cuda") -> Tuner:
    # device "cuda" without a GPU: the tuner is only built and asked for a lookup here, nothing runs
    return Tuner("fast", db=db, hw=DEFAULT, measure=lambda c, p: 1.0, device=device, progress=False, check=False)


def test_slug_names_the_file_after_the_gpu() -> None:
    assert shipped.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert shipped.slug("NVIDIA H200") == "nvidia-h200"


def test_the_gpus_shipped_records_seed_the_database_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_SHIPPED_RECORDS", "1")  # the test suite turns the seeding off (tests/conftest.py)
    monkeypatch.setattr(shipped, "RECORDS_DIR", tmp_path)
    f = _ship(tmp_path, DEFAULT.key())
    db = TuningDB(tmp_path / "user.sqlite")
    t = _tuner(db)
    assert t.shipped == 2 and t.stats.shipped == 2 and "2 records seeded from kfuse's shipped records" in t.stats.line("fast")
    assert t.lookup(P) == GemmConfig(128)  # a first compile finds the problem tuned
    assert set(db.stats()["shipped"]) == {shipped.slug(DEFAULT.key())}  # `kfuse tune-db stats` says so
    assert _tuner(db).shipped == 0  # imported once: the same file is not imported again
    db.clear()
    assert _tuner(db).shipped == 0 and db.stats()["records"] == 0  # a cleared database stays cleared
    _ship(tmp_path, DEFAULT.key(), block_m=64)  # a new kfuse with other records: imported again
    assert f.is_file() and _tuner(db).shipped == 2


def test_no_seeding_off_the_gpu_or_when_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipped, "RECORDS_DIR", tmp_path)
    _ship(tmp_path, DEFAULT.key())
    db = TuningDB(tmp_path / "user.sqlite")
    assert _tuner(db, device="cpu").shipped == 0  # on the CPU the hardware is the table's H200, not a measured GPU
    monkeypatch.setenv("KFUSE_SHIPPED_RECORDS", "0")
    assert _tuner(db).shipped == 0 and db.stats()["records"] == 0
    monkeypatch.setenv("KFUSE_SHIPPED_RECORDS", "1")
    other = TuningDB(tmp_path / "other.sqlite")
    assert Tuner("fast", db=other, hw=DEFAULT.__class__("Some Other GPU", 90, 100, 1), measure=lambda c, p: 1.0, device="cuda",
                 progress=False, check=False).shipped == 0  # fmt: skip


def test_a_bad_shipped_file_warns_and_the_tuner_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_SHIPPED_RECORDS", "1")
    monkeypatch.setattr(shipped, "RECORDS_DIR", tmp_path)
    (tmp_path / f"{shipped.slug(DEFAULT.key())}.json").write_text("{not json")
    db = TuningDB(tmp_path / "user.sqlite")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = _tuner(db)
    assert t.shipped == 0 and any("cannot seed" in str(x.message) for x in w)
    assert t.lookup(P) is None


def test_shipped_files_in_the_package_are_exports_for_a_known_gpu() -> None:
    """Whatever kfuse ships is a readable export whose records are all of the GPU its name says."""
    for f in sorted(shipped.RECORDS_DIR.glob("*.json")):
        db = TuningDB(":memory:")
        n = db.import_(f)
        gpus = {r.gpu for r in db.records(same_versions=False)}
        assert n > 0 and {shipped.slug(g) for g in gpus} == {f.stem}, f


def test_every_shipped_record_is_a_problem_and_config_todays_space_accepts() -> None:
    """A shipped record helps only if today's kfuse finds it: its problem key must be what the problem's signature is
    now, and its config one of today's space that the rules let run the problem on that GPU. A template or rule change
    that orphans the records fails here, not silently in a first compile that then tunes."""
    from kfuse.tune.hardware import lookup
    from kfuse.tune.space import config_from_dict, hard_reject, problem_from_dict

    for f in sorted(shipped.RECORDS_DIR.glob("*.json")):
        recs = json.loads(f.read_text())["records"]
        hw = lookup(recs[0]["gpu"])
        ok = [r for r in recs if r["status"] == "ok"]
        assert ok, f
        for r in ok:
            p = problem_from_dict(r["problem_json"])
            assert p.signature() == r["problem"], (f.name, r["problem"])
            cfg = config_from_dict(r["template"], r["config"])
            assert cfg.as_dict() == {k: v for k, v in r["config"].items() if k in cfg.as_dict()}, (f.name, r["config"])
            assert hard_reject(cfg, p, hw) is None, (f.name, r["problem"], r["config"], hard_reject(cfg, p, hw))
