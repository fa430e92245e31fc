"""Facts about a compiled sm_90 cubin, for the offline SASS tests of the TMA kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import pytest
import triton


def sass_facts(cubin: bytes) -> dict[str, int]:
    """Registers, stack and local memory (spills) from cuobjdump's resource usage, and the counts
    of the SASS instructions that matter here (TMA loads / stores, wgmma, local loads / stores,
    ldmatrix). Skips the test when the triton wheel has no cuobjdump."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip("the triton wheel has no cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    facts = {k: int(v) for k, v in (kv.split(":") for kv in line.split() if kv.split(":")[0] in ("REG", "STACK", "LOCAL"))}
    for op in ("UTMALDG.4D", "UTMASTG.4D", "HGMMA", "STL", "LDL", "LDSM"):
        facts[op] = sass.count(op + " ") + sass.count(op + ".")
    return facts


def run_offline_script(script: str, args: Any, timeout: int = 300) -> Any:
    """Run an offline sm_90 compile script in a fresh process (no interpreter: a compile after the
    interpreter has run can fail), with ``args`` as its one JSON argument and this folder importable
    (``cubin_facts``); its last stdout line is JSON. Skips the test when the triton wheel has no
    cuobjdump."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0 and "cuobjdump" in r.stderr and ("No such file" in r.stderr or "has no cuobjdump" in r.stderr):
        pytest.skip("the triton wheel has no cuobjdump")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
