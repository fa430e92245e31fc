"""Generated kernel modules load safely from many compile threads at once (the b2b decision and
the tuner compile candidates in a thread pool). Two threads of one process once wrote the same
temporary file and the loser's rename failed with FileNotFoundError (H200 sweep, session 6)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kfuse.kernels import codegen


def test_threads_loading_one_new_module_all_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
    source = f"VALUE = {threading.get_ident()}\n"
    barrier = threading.Barrier(8)

    def load(_: int) -> int:
        barrier.wait()  # all threads race on the same module
        return codegen.load_generated("race", "k", source).VALUE

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(load, range(8)))
    assert got == [threading.get_ident()] * 8
    assert [p.name for p in (tmp_path / "kernels").iterdir() if p.suffix == ".tmp"] == []
    assert len(list((tmp_path / "kernels").glob("kfuse_gen_race_k_*.py"))) == 1
