"""Tuning records kfuse ships for the GPUs they were measured on, so a first compile there starts from them instead
of an empty database (issue 3: "kfuse may ship records for common shapes on H100/H200 so a first compile there needs
no tuning").

A file per GPU, ``kfuse/tune/records/<gpu slug>.json``, in ``kfuse tune-db export``'s format, made on that GPU by
``benchmarks/ship_records.py``. The tuner seeds its database from the file of its GPU once (a meta entry remembers the
file's hash, so a changed file is imported again and a cleared database is not refilled behind the user's back until
the file changes). Records of other Triton / kfuse versions are imported as they are and, as any foreign-version record,
never looked up. ``KFUSE_SHIPPED_RECORDS=0`` turns the seeding off.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from kfuse.tune.database import TuningDB

RECORDS_DIR = Path(__file__).parent / "records"


def slug(gpu: str) -> str:
    """A file name for a GPU name: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")


def shipped_file(gpu: str, directory: Path | None = None) -> Path | None:
    """The shipped records of ``gpu``, if kfuse has them."""
    f = (directory or RECORDS_DIR) / f"{slug(gpu)}.json"
    return f if f.is_file() else None


def seed(db: TuningDB, gpu: str, directory: Path | None = None) -> int:
    """Import the shipped records of ``gpu`` into ``db`` unless this file was imported before; how many were added."""
    if os.environ.get("KFUSE_SHIPPED_RECORDS", "1") == "0":
        return 0
    f = shipped_file(gpu, directory)
    if f is None:
        return 0
    digest = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    key = f"shipped:{slug(gpu)}"
    if db.get_meta(key) == digest:
        return 0
    n = db.import_(f)
    db.set_meta(key, digest)
    return n
