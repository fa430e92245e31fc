"""benchmarks/experiments/sptrsv_variants.py --smoke: the GPU experiment's driver on the CPU.

Runs in a subprocess (the script decides about the interpreter before importing triton) and
checks that every variant of every smoke matrix was timed, correct, and written to the JSON.
The subprocess sees no GPU (``_env``), on a GPU machine too, so that it runs the script's CPU smoke
mode everywhere: with a GPU visible the script takes its GPU path (CUDA tensors, tuning, CUDA-graph
capture of the level-set launches), which fails under TRITON_INTERPRET=1 (every case did on the
H200), and compiling every variant cold may not fit the ``--budget-s`` deadline that the checks
below rely on (a variant past it is recorded as skipped, not ok).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfuse.sparse.variants import EXPERIMENT_DEFAULT


def _env(root: Path) -> dict[str, str]:
    """The script's CPU smoke mode: the interpreter, no CUDA device visible (so torch.cuda.is_available() is False)."""
    pythonpath = str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=pythonpath, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")


@pytest.mark.interpreter
def test_variants_script_smoke(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = _env(root)
    script = root / "benchmarks" / "experiments" / "sptrsv_variants.py"
    cmd = [sys.executable, str(script), "--out", str(tmp_path), "--smoke", "--budget-s", "60"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "sptrsv_variants.json").read_text())
    assert data["meta"]["benchmark"] == "sptrsv_variants" and len(data["records"]) == 3
    assert data["meta"]["gpu"] == "cpu (interpreter)"
    for rec in data["records"]:
        assert rec["levelset_vs_scipy"] < 1e-12 and rec["levelset_residual"] < 1e-12
        heur = "{R}x{W}w{num_warps}".format(**rec["tiling"])
        extra = {f"{nm}@{t}" for nm in ("default-v1", "default") for t in ("16x2w1", "8x4w1") if t != heur}
        assert set(rec["variants"]) == set(EXPERIMENT_DEFAULT) | extra | {"auto"}, sorted(rec["variants"])
        auto = rec["variants"]["auto"]  # analyze()'s own choice, under its own tiling
        assert (auto["tiling"], auto["options"]) == (rec["auto"]["tiling"], rec["auto"]["options"])
        assert rec["variants"]["legacy"]["tiling"] == heur
        for name, v in rec["variants"].items():
            assert v["ok"] and v["ms"] > 0 and v["residual"] < 1e-12, (rec["case"], name, v)
    assert "best " in res.stdout.splitlines()[-1]  # the table is printed last


@pytest.mark.interpreter
def test_variants_script_mixed_smoke(tmp_path: Path) -> None:
    """--mixed --smoke: the mixed-tiling preset on the small heavy-row stand-in, every variant correct."""
    from kfuse.sparse.variants import MIXED_EXPERIMENT, MIXED_EXPERIMENT_TILED

    root = Path(__file__).resolve().parents[2]
    env = _env(root)
    script = root / "benchmarks" / "experiments" / "sptrsv_variants.py"
    cmd = [sys.executable, str(script), "--out", str(tmp_path), "--smoke", "--mixed", "--budget-s", "60"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "sptrsv_variants.json").read_text())
    assert data["meta"]["gpu"] == "cpu (interpreter)"
    (rec,) = data["records"]
    til, tnames = MIXED_EXPERIMENT_TILED
    extra = {f"{nm}@{til}" for nm in tnames} if "{R}x{W}w{num_warps}".format(**rec["tiling"]) != til else set()
    assert rec["case"] == "heavyrows_120" and set(rec["variants"]) == set(MIXED_EXPERIMENT) | extra | {"auto"}
    assert rec["long_rows"]["64"] >= 4 and rec["long_rows"]["16"] >= rec["long_rows"]["32"] >= rec["long_rows"]["64"]
    assert rec["mixed_tiles"]["64"] > rec["tiles"]  # cutting at long rows adds tiles
    for name, v in rec["variants"].items():
        assert v["ok"] and v["ms"] > 0 and v["residual"] < 1e-12, (name, v)
    assert data["meta"]["variants"]["mixed"]["long_row_min"] == 64
