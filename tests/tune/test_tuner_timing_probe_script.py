"""The tuner-timing experiment script runs end to end on the CPU (interpreter, tiny shapes): it
tunes each shape twice from empty databases (L2 flush on and off), times the choices and the rule
ranking's first config, and checks every output against eager PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.interpreter
def test_tuner_timing_probe_smoke(tmp_path: Path) -> None:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # --smoke is the script's CPU run (device "cpu", the interpreter): no GPU visible to it on a GPU machine
    # either, where it would take its GPU paths with CPU tensors (tune.hardware.query("cpu"), CUDA-graph timing)
    env = dict(os.environ, PYTHONPATH=path, KFUSE_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    script = ROOT / "benchmarks" / "experiments" / "tuner_timing_probe.py"
    cmd = [sys.executable, str(script), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "tuner_timing_probe.json").read_text())
    assert len(data["records"]) == 2 and "20 calls" in data["timing"]
    for rec in data["records"]:
        assert set(rec["configs"]) == {"rules_first", "tuner_flush1", "tuner_flush0"}
        for v in rec["configs"].values():
            assert "error" not in v, v
            assert v["max_rel_err"] < 1e-3, v
            assert v["ms"] > 0
