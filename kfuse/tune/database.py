"""The tuning record database (SQLite).

A record is one measurement: GPU name + Triton/kfuse versions + template + problem signature
+ config + measured time (or the failure status). Every measurement is kept: they are the
cost model's training data, and the best ``ok`` record of a (GPU, versions, template,
problem) is the tuned config. Each record is committed as it is measured, so an interrupted
tuning run resumes where it stopped.

A file that is not a readable kfuse database (corrupt: ``PRAGMA quick_check`` fails; foreign
schema) is reported, moved aside to ``<name>.bad-<time>`` and replaced by an empty one: a bad
file never fails a compile. A file that cannot be used *now* (locked by another process,
read-only, cannot be opened) is not bad: it is left alone and the error (``sqlite3.Error``) is
raised; the tuner then works without the database. ``readonly=True`` opens the file with SQLite's
``mode=ro`` (``kfuse tune-db stats`` / ``export``): nothing is created or changed in it, and a
file that is not a kfuse database is refused (``ValueError``).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

# SQLite primary result codes that mean "this file is not a (valid) kfuse database": a generic
# SQL error from the schema statements (a foreign table of the same name), corruption, not a
# database at all. Busy / locked / read-only / can't-open / I/O / full are about the moment,
# not the file: such a file is never moved aside.
_BAD_FILE_CODES = {1, 11, 26}  # SQLITE_ERROR, SQLITE_CORRUPT, SQLITE_NOTADB
_RECORD_COLUMNS = {"id", "gpu", "triton_version", "kfuse_version", "template", "problem", "problem_json", "config_json", "time_ms",
                   "status", "error", "created"}  # fmt: skip


def _bad_file(e: BaseException) -> bool:
    """Whether an error opening the database means the file is not a valid kfuse database."""
    if isinstance(e, ValueError):
        return True
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:  # not from SQLite itself (e.g. a text column that is not UTF-8): the content is bad
        return not isinstance(e, sqlite3.OperationalError) or "decode" in str(e)
    return (code & 0xFF) in _BAD_FILE_CODES


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    gpu TEXT NOT NULL,
    triton_version TEXT NOT NULL,
    kfuse_version TEXT NOT NULL,
    template TEXT NOT NULL,
    problem TEXT NOT NULL,          -- signature string (the lookup key)
    problem_json TEXT NOT NULL,     -- the problem's fields, for features / transfer
    config_json TEXT NOT NULL,
    time_ms REAL,                   -- NULL unless status = 'ok'
    status TEXT NOT NULL,           -- ok | failed | wrong | timeout
    error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_lookup ON records (gpu, template, problem);
CREATE TABLE IF NOT EXISTS choices (   -- measured lowering choices (kernel vs library), per problem
    gpu TEXT NOT NULL,
    triton_version TEXT NOT NULL,
    kfuse_version TEXT NOT NULL,
    problem TEXT NOT NULL,          -- hash of the node's problem key
    candidates TEXT NOT NULL,       -- comma list, in the order they were measured
    choice TEXT NOT NULL,
    times_json TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (gpu, triton_version, kfuse_version, problem, candidates)
);
"""


def default_path() -> Path:
    """``$KFUSE_TUNE_DB`` or ``<kfuse cache>/tune.sqlite``."""
    env = os.environ.get("KFUSE_TUNE_DB")
    if env:
        return Path(env)
    from kfuse.kernels.codegen import cache_dir

    return cache_dir() / "tune.sqlite"


def versions() -> tuple[str, str]:
    import triton

    from kfuse import __version__

    return triton.__version__, __version__


@dataclass(frozen=True)
class Record:
    gpu: str
    template: str
    problem: str
    problem_json: str
    config: dict[str, Any]
    time_ms: float | None
    status: str = "ok"
    error: str = ""
    triton_version: str = ""
    kfuse_version: str = ""
    created: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "triton_version": self.triton_version, "kfuse_version": self.kfuse_version,
            "template": self.template, "problem": self.problem, "problem_json": json.loads(self.problem_json),
            "config": self.config, "time_ms": self.time_ms, "status": self.status, "error": self.error, "created": self.created,
        }  # fmt: skip


class TuningDB:
    """A SQLite file of tuning records. ``path=":memory:"`` for a throw-away database."""

    def __init__(self, path: str | Path | None = None, readonly: bool = False) -> None:
        self.path = Path(path) if path is not None and str(path) != ":memory:" else path
        if self.path is None:
            self.path = default_path()
        self.readonly = readonly and self.path != ":memory:"
        self.set_aside: Path | None = None
        self.conn = self._open_readonly() if self.readonly else self._open()
        self.triton_version, self.kfuse_version = versions()

    # ---- opening, with recovery ----------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            return sqlite3.connect(":memory:")
        assert isinstance(self.path, Path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return sqlite3.connect(str(self.path), timeout=30)

    def _open_readonly(self) -> sqlite3.Connection:
        assert isinstance(self.path, Path)
        conn = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
        try:
            _quick_check(conn)
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"meta", "records"} <= tables:
                raise ValueError("no kfuse tuning tables")
            self._check_existing(conn)
        except BaseException as e:
            conn.close()
            if isinstance(e, ValueError | sqlite3.DatabaseError) and _bad_file(e):
                raise ValueError(f"{self.path} is not a kfuse tuning database: {e}") from None
            raise
        return conn

    def _open(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect()
            self._check(conn)
            return conn
        except (sqlite3.DatabaseError, ValueError) as e:
            if conn is not None:
                conn.close()
            if self.path == ":memory:" or not _bad_file(e):
                raise  # locked, read-only, can't open ...: the file may be fine, leave it alone
            assert isinstance(self.path, Path)
            bad = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
            os.replace(self.path, bad)
            self.set_aside = bad
            warnings.warn(f"kfuse tuning database {self.path} is unusable ({e}); moved to {bad}, starting an empty one", stacklevel=3)
            conn = self._connect()
            self._check(conn)
            return conn

    @staticmethod
    def _check(conn: sqlite3.Connection) -> None:
        _quick_check(conn)
        conn.executescript(_SCHEMA)
        TuningDB._check_existing(conn, adopt=True)

    @staticmethod
    def _check_existing(conn: sqlite3.Connection, adopt: bool = False) -> None:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(records)")}
        if not _RECORD_COLUMNS <= cols:
            raise ValueError(f"a records table without the columns {sorted(_RECORD_COLUMNS - cols)}")
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            n = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
            if n:
                raise ValueError("records without a schema version")
            if not adopt:
                raise ValueError("no schema version")
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.commit()
        elif row[0] != str(SCHEMA_VERSION):
            raise ValueError(f"schema version {row[0]}, this kfuse reads {SCHEMA_VERSION}")
        conn.execute("SELECT id, gpu, template, problem, config_json, time_ms, status FROM records LIMIT 1").fetchall()

    def close(self) -> None:
        self.conn.close()

    def _versioned(self) -> str:
        return "triton_version = ? AND kfuse_version = ?"

    # ---- writing -------------------------------------------------------------------------
    def add(self, gpu: str, template: str, problem: str, problem_json: str, config: dict[str, Any],
            time_ms: float | None, status: str = "ok", error: str = "") -> None:  # fmt: skip
        """Store one measurement and commit it at once (resumable tuning)."""
        self.conn.execute(
            "INSERT INTO records (gpu, triton_version, kfuse_version, template, problem, problem_json, config_json, time_ms,"
            " status, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (gpu, self.triton_version, self.kfuse_version, template, problem, problem_json,
             json.dumps(config, sort_keys=True), time_ms if status == "ok" else None, status, error[:500], time.time()),
        )  # fmt: skip
        self.conn.commit()

    def add_records(self, records: Iterable[Record]) -> int:
        """Store records in one transaction (all or none); an ``ok`` record whose time is not a
        positive finite number is refused (``ValueError``)."""
        n = 0
        with self.conn:
            for r in records:
                _validate(r)
                self.conn.execute(
                    "INSERT INTO records (gpu, triton_version, kfuse_version, template, problem, problem_json, config_json, time_ms,"
                    " status, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (r.gpu, r.triton_version or self.triton_version, r.kfuse_version or self.kfuse_version, r.template, r.problem,
                     r.problem_json, json.dumps(r.config, sort_keys=True), r.time_ms if r.status == "ok" else None,
                     r.status, r.error, r.created or time.time()),
                )  # fmt: skip
                n += 1
        return n

    def put_choice(self, gpu: str, problem: str, candidates: str, choice: str, times: dict[str, float]) -> None:
        """Store a measured lowering choice (replacing an older one for the same key)."""
        finite = {k: (v if v != float("inf") else None) for k, v in times.items()}
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO choices VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (gpu, self.triton_version, self.kfuse_version, problem, candidates, choice, json.dumps(finite), time.time()),
            )

    def get_choice(self, gpu: str, problem: str, candidates: str) -> tuple[str, dict[str, float]] | None:
        """The stored choice for this GPU, these versions, problem and candidate list."""
        row = self.conn.execute(
            "SELECT choice, times_json FROM choices WHERE gpu = ? AND triton_version = ? AND kfuse_version = ? AND problem = ?"
            " AND candidates = ?",
            (gpu, self.triton_version, self.kfuse_version, problem, candidates),
        ).fetchone()
        if row is None:
            return None
        times = {k: (float("inf") if v is None else float(v)) for k, v in json.loads(row[1]).items()}
        return row[0], times

    def clear(self, gpu: str | None = None) -> int:
        with self.conn:
            self.conn.execute("DELETE FROM choices" + (" WHERE gpu = ?" if gpu else ""), (gpu,) if gpu else ())
            cur = self.conn.execute("DELETE FROM records" + (" WHERE gpu = ?" if gpu else ""), (gpu,) if gpu else ())
        return cur.rowcount

    # ---- reading -------------------------------------------------------------------------
    def _rows(self, where: str, args: tuple[Any, ...]) -> Iterator[Record]:
        q = ("SELECT gpu, template, problem, problem_json, config_json, time_ms, status, error, triton_version, kfuse_version, created"
             " FROM records " + where)  # fmt: skip
        for row in self.conn.execute(q, args):
            yield Record(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6], row[7], row[8], row[9], row[10])

    def records(self, gpu: str | None = None, template: str | None = None, same_versions: bool = True) -> list[Record]:
        conds, args = [], []
        if gpu is not None:
            conds.append("gpu = ?")
            args.append(gpu)
        if template is not None:
            conds.append("template = ?")
            args.append(template)
        if same_versions:
            conds.append("triton_version = ?")
            args.append(self.triton_version)
        where = ("WHERE " + " AND ".join(conds)) if conds else ""
        return list(self._rows(where + " ORDER BY id", tuple(args)))

    def measured(self, gpu: str, template: str, problem: str) -> list[Record]:
        """All records (any status) of one problem with this Triton and this kfuse version (as the
        ``choices`` table: another kfuse's kernels, rules and checks may differ, so its
        measurements and its tuned config do not count here; they stay training data, ``records``)."""
        return list(self._rows("WHERE gpu = ? AND template = ? AND problem = ? AND " + self._versioned() + " ORDER BY id",
                               (gpu, template, problem, self.triton_version, self.kfuse_version)))  # fmt: skip

    def best(self, gpu: str, template: str, problem: str) -> Record | None:
        """The fastest ``ok`` record of a problem (this GPU, these Triton and kfuse versions)."""
        rows = list(self._rows(
            "WHERE gpu = ? AND template = ? AND problem = ? AND " + self._versioned() + " AND status = 'ok' ORDER BY time_ms LIMIT 1",
            (gpu, template, problem, self.triton_version, self.kfuse_version)))  # fmt: skip
        return rows[0] if rows else None

    def stats(self) -> dict[str, Any]:
        c = self.conn
        total = c.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        by = c.execute(
            "SELECT gpu, template, COUNT(*), COUNT(DISTINCT problem), SUM(status = 'ok') FROM records"
            " GROUP BY gpu, template ORDER BY gpu, template"
        ).fetchall()
        status = dict(c.execute("SELECT status, COUNT(*) FROM records GROUP BY status").fetchall())
        return {
            "path": str(self.path),
            "records": total,
            "choices": c.execute("SELECT COUNT(*) FROM choices").fetchone()[0] if self._has_table("choices") else 0,
            "by_status": status,
            "groups": [{"gpu": g, "template": t, "records": n, "problems": p, "ok": ok} for g, t, n, p, ok in by],
            # the shipped record files imported (kfuse.tune.shipped): GPU slug -> the file's hash
            "shipped": {k.removeprefix("shipped:"): v for k, v in c.execute("SELECT key, value FROM meta WHERE key LIKE 'shipped:%'")},
        }

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        self.conn.commit()

    def _has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    # ---- exchange ------------------------------------------------------------------------
    def export(self, path: str | Path) -> int:
        recs = [r.as_dict() for r in self.records(same_versions=False)]
        Path(path).write_text(json.dumps({"kfuse_tuning_records": SCHEMA_VERSION, "records": recs}, indent=1))
        return len(recs)

    def import_(self, path: str | Path) -> int:
        """Add the records of an exported JSON file; returns how many."""
        try:
            data = json.loads(Path(path).read_text())
            recs = data["records"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a kfuse tuning export: {e}") from None
        if not isinstance(recs, list):
            raise ValueError(f"{path} is not a kfuse tuning export: 'records' is not a list")
        out = []
        for i, d in enumerate(recs):
            try:
                r = Record(str(d["gpu"]), str(d["template"]), str(d["problem"]), json.dumps(d["problem_json"]), d["config"],
                           d.get("time_ms"), d.get("status", "ok"), str(d.get("error", "")), str(d.get("triton_version", "")),
                           str(d.get("kfuse_version", "")), float(d.get("created", 0.0)))  # fmt: skip
                _validate(r)
            except (KeyError, ValueError, TypeError, AttributeError) as e:
                raise ValueError(f"{path} is not a kfuse tuning export: record {i}: {type(e).__name__}: {e}") from None
            out.append(r)
        return self.add_records(out)


def _quick_check(conn: sqlite3.Connection) -> None:
    """``PRAGMA quick_check``: the b-trees of the whole file, not only its first page, are sound."""
    rows = conn.execute("PRAGMA quick_check").fetchall()
    if [r[0] for r in rows] != ["ok"]:
        raise ValueError(f"integrity check failed: {'; '.join(str(r[0]) for r in rows[:3])}")


def _validate(r: Record) -> None:
    """Refuse a record that would mislead the tuner: an ``ok`` time that is not a positive finite
    number (a 0 or negative time would always win; NaN compares false with everything)."""
    if not isinstance(r.status, str):
        raise ValueError(f"status {r.status!r} is not a string")
    if r.status == "ok":
        t = r.time_ms
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"an 'ok' record with time_ms {t!r} (a positive finite number is needed)")
    if not isinstance(r.config, dict):
        raise ValueError("config is not a mapping")
