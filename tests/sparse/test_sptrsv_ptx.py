"""The sync-free kernel compiled for sm_90 on the CPU: memory-ordering instructions and no tf32.

Compiling needs a real (non-interpreted) @triton.jit, so it runs in a subprocess without
TRITON_INTERPRET. Guards GPU-only failure modes the interpreter cannot show: Triton
rewriting sum(a[:, :, None] * b[None]) into a tf32 ``tl.dot`` (fp32 errors ~1e-3), the
acquire/release protocol (volatile polling, fence.acq_rel, release exchange) going missing,
and the poll backoff (``nanosleep``) being dropped or appearing when it is off. Every
synchronisation variant (per-row or per-tile flags, grid or persistent) is compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# (dtype, backoff_ns, tile_flags, persistent): the legacy kernel in both dtypes, then the variants
CONFIGS = [
    ("fp32", 0, False, False),
    ("fp64", 0, False, False),
    ("fp64", 64, True, True),
    ("fp32", 64, False, True),
    ("fp64", 0, True, False),
]

SCRIPT = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from kfuse.sparse.sptrsv import _syncfree_kernel
out = []
for dt, ns, tile, pers in json.loads(sys.argv[1]):
    sig = {k: "*i32" for k in ["rowptr", "cols", "perm", "lev", "done_ptr", "ticket_ptr", "tdep_ptr", "tdeps"]}
    sig.update({k: f"*{dt}" for k in ["vals", "diag", "b_ptr", "x_ptr", "xp_ptr"]})
    sig.update({k: "i32" for k in ["n", "nrhs", "stride_b", "stride_x", "epoch", "ticket_base", "n_tiles"]})
    cx = {"R": 32, "W": 2, "KP": 16, "HW_FENCE": True, "TILE_FLAGS": tile, "DW": 32, "BACKOFF_NS": ns, "PERSISTENT": pers}
    sig.update({k: "constexpr" for k in cx})
    src = triton.compiler.ASTSource(_syncfree_kernel, sig, constexprs=cx)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    keys = ("mma", "tf32", "fence.acq_rel.gpu", "ld.volatile.global", "nanosleep.u32")
    keys += ("atom.global.gpu.release.exch", "atom.global.gpu.acq_rel.add")
    out.append({k: (k in ptx) for k in keys})
print(json.dumps(out))
"""


def test_kernel_ptx_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CONFIGS)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads(res.stdout.strip().splitlines()[-1])
    for cfg, f in zip(CONFIGS, results, strict=True):
        assert not f["mma"] and not f["tf32"], f"{cfg}: the in-tile sweep became a tensor-core dot"
        assert f["fence.acq_rel.gpu"] and f["ld.volatile.global"], f"{cfg}: acquire side missing"
        assert f["atom.global.gpu.release.exch"] and f["atom.global.gpu.acq_rel.add"], f"{cfg}: release/ticket atomics missing"
        assert f["nanosleep.u32"] == (cfg[1] > 0), f"{cfg}: poll backoff (nanosleep) present={f['nanosleep.u32']}"
