"""The sync-free kernel compiled for sm_90 on the CPU: memory-ordering instructions and no tf32.

Compiling needs a real (non-interpreted) @triton.jit, so it runs in a subprocess without
TRITON_INTERPRET. Guards two GPU-only failure modes the interpreter cannot show: Triton
rewriting sum(a[:, :, None] * b[None]) into a tf32 ``tl.dot`` (fp32 errors ~1e-3), and the
acquire/release protocol (volatile polling, fence.acq_rel, release exchange) going missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from kfuse.sparse.sptrsv import _syncfree_kernel
out = {}
for dt in ("fp32", "fp64"):
    sig = {k: "*i32" for k in ["rowptr", "cols", "perm", "lev", "done_ptr", "ticket_ptr"]}
    sig.update({k: f"*{dt}" for k in ["vals", "diag", "b_ptr", "x_ptr", "xp_ptr"]})
    sig.update({k: "i32" for k in ["n", "nrhs", "stride_b", "stride_x", "epoch", "ticket_base"]})
    sig.update({k: "constexpr" for k in ["R", "W", "KP", "HW_FENCE"]})
    src = triton.compiler.ASTSource(_syncfree_kernel, sig, constexprs={"R": 32, "W": 2, "KP": 16, "HW_FENCE": True})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    keys = ("mma", "tf32", "fence.acq_rel.gpu", "ld.volatile.global")
    keys += ("atom.global.gpu.release.exch", "atom.global.gpu.acq_rel.add")
    out[dt] = {k: (k in ptx) for k in keys}
print(json.dumps(out))
"""


def test_kernel_ptx_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    flags = json.loads(res.stdout.strip().splitlines()[-1])
    for dt, f in flags.items():
        assert not f["mma"] and not f["tf32"], f"{dt}: the in-tile sweep became a tensor-core dot"
        assert f["fence.acq_rel.gpu"] and f["ld.volatile.global"], f"{dt}: acquire side missing"
        assert f["atom.global.gpu.release.exch"] and f["atom.global.gpu.acq_rel.add"], f"{dt}: release/ticket atomics missing"
