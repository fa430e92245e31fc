"""Accepted schedules (~/.cache/kfuse/sass or $KFUSE_CACHE_DIR).

An entry is keyed by everything its acceptance depended on (``entry_key``): the sha256 of the original
cubin, the kernel's name, the set of movable opcodes the search used, a hash of the verification
problem (arguments, grid, samples per launch, seed) and the legality model's version (``LEGALITY_VERSION``:
a schedule found by a model since made stricter is searched again, not reused). Its metadata records the number of random input
sets the schedule passed; ``kfuse.sass.api`` only reuses an entry that passed at least as many as the
caller asks for, and parses the cached cubin before installing it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .schedule import LEGALITY_VERSION


def cache_dir() -> Path:
    root = os.environ.get("KFUSE_CACHE_DIR")
    base = Path(root) / "sass" if root else Path.home() / ".cache" / "kfuse" / "sass"
    base.mkdir(parents=True, exist_ok=True)
    return base


def entry_key(cubin_sha: str, kernel: str, movable: Iterable[str], verify_hash: str) -> str:
    """The file stem of the entry for this (original cubin, kernel, movable set, verification problem, legality model)."""
    blob = json.dumps([cubin_sha, kernel, sorted(movable), verify_hash, LEGALITY_VERSION])
    return f"{cubin_sha[:16]}-{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


def lookup(key: str) -> tuple[bytes, dict[str, Any]] | None:
    """The cached (cubin bytes, metadata) under ``key``, unchecked: the caller validates both."""
    d = cache_dir()
    b, m = d / f"{key}.cubin", d / f"{key}.json"
    if b.exists() and m.exists():
        try:
            info = json.loads(m.read_text())
            return (b.read_bytes(), info) if isinstance(info, dict) else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # a corrupt entry is ignored, the search runs again
    return None


def store(key: str, tuned: bytes, info: dict[str, Any]) -> Path:
    d = cache_dir()
    info = {**info, "tuned_sha256": hashlib.sha256(tuned).hexdigest()}
    for suffix, data in ((".cubin", tuned), (".json", json.dumps(info, indent=1).encode())):
        tmp = d / f"{key}{suffix}.tmp"
        tmp.write_bytes(data)
        tmp.replace(d / f"{key}{suffix}")
    return d / f"{key}.cubin"
