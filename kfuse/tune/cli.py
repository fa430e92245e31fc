"""``kfuse tune-db``: look after the tuning database (stats, export, import, clear)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import typer

from kfuse.tune.database import TuningDB

app = typer.Typer(help="The tuning record database (SQLite): stats, export, import, clear.", no_args_is_help=True)

_DB = typer.Option(None, "--db", help="database file (default: $KFUSE_TUNE_DB or ~/.cache/kfuse/tune.sqlite)")


def _open(db: Path | None, readonly: bool = False) -> TuningDB:
    """The database; ``readonly`` (stats, export) opens it with SQLite's ``mode=ro``, so that
    nothing is created in a file that is not a kfuse database. Errors exit cleanly."""
    try:
        return TuningDB(db, readonly=readonly)
    except (ValueError, sqlite3.Error, OSError) as e:
        typer.echo(f"error: {e}" if isinstance(e, ValueError) else f"error: cannot open the tuning database: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def stats(db: Path | None = _DB, as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Records per GPU and template, and by status."""
    try:
        d = _open(db, readonly=True).stats()
    except sqlite3.Error as e:
        typer.echo(f"error: cannot read the tuning database: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(d, indent=1))
        return
    typer.echo(f"{d['path']}: {d['records']} records {d['by_status']}")
    for g in d["groups"]:
        typer.echo(f"  {g['gpu']:28s} {g['template']:6s} {g['problems']:5d} problems {g['records']:7d} records {g['ok']:7d} ok")
    for gpu, digest in d.get("shipped", {}).items():
        typer.echo(f"  seeded from kfuse's shipped records for {gpu} (file {digest})")


@app.command("export")
def export_(path: Path, db: Path | None = _DB) -> None:
    """Write every record to a JSON file."""
    try:
        n = _open(db, readonly=True).export(path)
    except (sqlite3.Error, OSError, ValueError) as e:
        typer.echo(f"error: cannot export the tuning database: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"exported {n} records to {path}")


@app.command("import")
def import_(path: Path, db: Path | None = _DB) -> None:
    """Add the records of an exported JSON file."""
    tdb = _open(db)
    try:
        n = tdb.import_(path)
    except (ValueError, sqlite3.Error) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"imported {n} records from {path}")


@app.command()
def clear(db: Path | None = _DB, gpu: str | None = typer.Option(None, help="only this GPU's records"),
          yes: bool = typer.Option(False, "--yes", "-y", help="do not ask")) -> None:  # fmt: skip
    """Delete records (all, or one GPU's)."""
    if not yes and not typer.confirm(f"delete {'all' if gpu is None else gpu} tuning records?"):
        raise typer.Exit(1)
    n = _open(db).clear(gpu)
    typer.echo(f"deleted {n} records")
