"""Accepted schedules, keyed by the sha256 of the original cubin (~/.cache/kfuse/sass or $KFUSE_CACHE_DIR)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    root = os.environ.get("KFUSE_CACHE_DIR")
    base = Path(root) / "sass" if root else Path.home() / ".cache" / "kfuse" / "sass"
    base.mkdir(parents=True, exist_ok=True)
    return base


def lookup(cubin_sha: str) -> tuple[bytes, dict[str, Any]] | None:
    d = cache_dir()
    b, m = d / f"{cubin_sha}.cubin", d / f"{cubin_sha}.json"
    if b.exists() and m.exists():
        try:
            return b.read_bytes(), json.loads(m.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # a corrupt entry is ignored, the search runs again
    return None


def store(cubin_sha: str, tuned: bytes, info: dict[str, Any]) -> Path:
    d = cache_dir()
    tmp = d / f"{cubin_sha}.cubin.tmp"
    tmp.write_bytes(tuned)
    tmp.replace(d / f"{cubin_sha}.cubin")
    (d / f"{cubin_sha}.json").write_text(json.dumps(info, indent=1))
    return d / f"{cubin_sha}.cubin"
