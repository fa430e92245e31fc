"""``benchmarks/ship_records.py``: compiles the listed models into an empty database and exports it under the GPU's
file name (CPU: the wiring, nothing measured)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_ship_records_exports_an_importable_file_named_for_the_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ship_records.py"), "--out", str(tmp_path), "--smoke",
                        "--models", "mlp-tiny:4,no-such-model:1"], capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mlp-tiny:4" in r.stdout and "compiled and tuned" in r.stdout
    assert "no-such-model:1" in r.stdout and "FAILED KeyError" in r.stdout  # one bad model does not stop the others
    f = tmp_path / "nvidia-h200.json"  # on the CPU the tuner's hardware is the H200 table entry
    data = json.loads(f.read_text())
    assert data["kfuse_tuning_records"] == 1 and data["records"] == []  # nothing measured without a GPU

    from kfuse.tune.database import TuningDB

    assert TuningDB(":memory:").import_(f) == 0
