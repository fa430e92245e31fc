"""Facts about a compiled sm_90 cubin, for the offline SASS tests of the TMA kernels."""

from __future__ import annotations

import os
import subprocess
import tempfile

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
