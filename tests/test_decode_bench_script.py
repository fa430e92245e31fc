"""benchmarks/decode_bench.py at its CPU smoke size: the decode step compiled by kfuse through torch.compile,
every state write in place, its logits and the cache slot it wrote checked against eager in the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")


@pytest.mark.interpreter
@pytest.mark.timeout(600)
def test_smoke_run_checks_the_decode_step(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, str(ROOT / "benchmarks/decode_bench.py"), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "decode_smoke.json").read_text())
    assert rec["kfuse_ms"] > 0 and rec["max_rel_err"] < 1e-4 and rec["cache_err"]["kfuse"] < 1e-4
    plan = rec["kfuse_plan"]
    assert plan["kernels_by_template"].get("decode_attention") == 2  # llama-tiny's two layers
    assert plan["state_writes"] and all(w["how"] == "in place" for w in plan["state_writes"])
    assert rec["generate_tokens_equal_to_eager"]["kfuse"] == 1.0
    from kfuse.bench.decode import ABLATIONS

    assert set(rec["ablation_ms"]) == set(ABLATIONS)  # the A/B variants ran beside kfuse
    assert rec["logits_err"]["kfuse_no_cache_write"] < 1e-4
