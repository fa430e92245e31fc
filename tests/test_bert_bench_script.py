"""benchmarks/bert_bench.py drives its cases in fresh processes with --isolate (CPU smoke sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.interpreter
@pytest.mark.timeout(300)
def test_isolated_case_runs_in_its_own_process(tmp_path: Path) -> None:
    # --smoke is the script's CPU run (the model on the CPU, the interpreter): no GPU visible to it on a GPU
    # machine either, where the compile's tuner would measure on the GPU (its default device)
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    script = str(ROOT / "benchmarks/bert_bench.py")
    argv = [sys.executable, script, "--smoke", "--isolate", "--cases", "B2_S16_avg0.6", "--out", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = json.loads((tmp_path / "bert_varlen.json").read_text())
    assert len(recs) == 1 and "error" not in recs[0], recs
    assert recs[0]["isolated"] is True and recs[0]["case"] == "B2_S16_avg0.6" and recs[0]["kfuse_ms"] > 0
    assert recs[0]["max_rel_err"] < 1e-4 and recs[0]["padded_positions_zero"]  # the isolated run's result is right
    assert not (tmp_path / "bert_base.json").exists()  # a --cases run leaves the other file alone
