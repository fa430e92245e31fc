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

# the prefetch kernel: (dtype, flags code 0/1/2 = tile/row/value, acquire, st_release, R, W, num_warps)
FAST_CONFIGS = [
    ("fp64", 0, False, False, 32, 4, 2),
    ("fp64", 0, True, False, 16, 2, 1),
    ("fp32", 0, True, True, 8, 4, 1),
    ("fp64", 1, True, False, 16, 2, 1),
    ("fp64", 2, False, False, 16, 2, 1),
    ("fp32", 2, False, False, 32, 4, 2),
]

FAST_SCRIPT = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from kfuse.sparse.kernels import _syncfree_fast_kernel
out = []
for dt, flags, acq, strel, r, w, warps in json.loads(sys.argv[1]):
    sig = {k: "*i32" for k in ["rowptr", "cols", "perm", "lev", "done_ptr", "ticket_ptr", "tdep_ptr", "tdeps"]}
    sig.update({k: f"*{dt}" for k in ["vals", "diag", "b_ptr", "x_ptr", "xp_ptr"]})
    sig.update({k: "i32" for k in ["n", "nrhs", "stride_b", "stride_x", "epoch", "ticket_base", "n_tiles"]})
    sig["SENTINEL"] = "i64" if dt == "fp64" else "i32"
    cx = {"R": r, "W": w, "KP": 1, "HW_FENCE": True, "FLAGS": flags, "DW": 32, "BACKOFF_NS": 0, "ACQUIRE": acq,
          "ST_RELEASE": strel, "PERSISTENT": True}
    sig.update({k: "constexpr" for k in cx})
    src = triton.compiler.ASTSource(_syncfree_fast_kernel, sig, constexprs=cx)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    keys = ("mma", "tf32", "fence.acq_rel.gpu", "ld.acquire.gpu.global.b32", "ld.volatile.global", "st.release.gpu.global.b32",
            "atom.global.gpu.release.exch", "atom.global.gpu.relaxed.add", "atom.global.gpu.acq_rel.add", "nanosleep.u32",
            "atom.global.gpu.relaxed.exch")
    out.append({k: (k in ptx) for k in keys} | {"bar.sync": ptx.count("bar.sync")})
print(json.dumps(out))
"""

SCRIPT = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from kfuse.sparse.kernels import _syncfree_kernel
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


def _compile(script: str, configs: list) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", script, json.dumps(configs)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fast_kernel_ptx_for_sm90() -> None:
    """Acquire polls replace the fence; value flags have neither fence nor release; tickets are relaxed."""
    for cfg, f in zip(FAST_CONFIGS, _compile(FAST_SCRIPT, FAST_CONFIGS), strict=True):
        _, flags, acq, strel, _, _, warps = cfg
        assert not f["mma"] and not f["tf32"], f"{cfg}: the in-tile sweep became a tensor-core dot"
        assert f["atom.global.gpu.relaxed.add"] and not f["atom.global.gpu.acq_rel.add"], f"{cfg}: ticket atomic not relaxed"
        assert f["ld.acquire.gpu.global.b32"] == acq and f["fence.acq_rel.gpu"] == (flags != 2 and not acq), cfg
        assert f["st.release.gpu.global.b32"] == strel, cfg
        assert f["atom.global.gpu.release.exch"] == (flags != 2 and not strel), f"{cfg}: release exchange"
        assert f["atom.global.gpu.relaxed.exch"] == (flags == 2), f"{cfg}: value-flag store"
        if flags == 2:
            assert f["ld.volatile.global"], f"{cfg}: value flags poll x with volatile loads"
        assert not f["nanosleep.u32"], cfg
        if warps == 1:  # one warp: a few cheap barriers, not the ~40 of the [32, 4] two-warp tile
            assert f["bar.sync"] <= 10, (cfg, f["bar.sync"])


def test_kernel_ptx_for_sm90() -> None:
    results = _compile(SCRIPT, CONFIGS)
    for cfg, f in zip(CONFIGS, results, strict=True):
        assert not f["mma"] and not f["tf32"], f"{cfg}: the in-tile sweep became a tensor-core dot"
        assert f["fence.acq_rel.gpu"] and f["ld.volatile.global"], f"{cfg}: acquire side missing"
        assert f["atom.global.gpu.release.exch"] and f["atom.global.gpu.acq_rel.add"], f"{cfg}: release/ticket atomics missing"
        assert f["nanosleep.u32"] == (cfg[1] > 0), f"{cfg}: poll backoff (nanosleep) present={f['nanosleep.u32']}"


# the mixed-tiling kernel: (dtype, R, W, WL, KP, num_warps, persistent)
MIXED_CONFIGS = [
    ("fp64", 8, 16, 256, 1, 4, True),
    ("fp32", 8, 16, 256, 1, 8, True),
    ("fp64", 8, 16, 256, 1, 2, False),
    ("fp64", 4, 16, 128, 16, 4, True),
]

MIXED_SCRIPT = r"""
import json, sys, triton
from triton.backends.compiler import GPUTarget
from kfuse.sparse.kernels import _syncfree_mixed_kernel
out = []
for dt, r, w, wl, kp, warps, pers in json.loads(sys.argv[1]):
    sig = {k: "*i32" for k in ["rowptr", "cols", "perm", "lev", "ticket_ptr", "tile_ptr"]}
    sig.update({k: f"*{dt}" for k in ["vals", "diag", "b_ptr", "x_ptr", "xp_ptr"]})
    sig.update({k: "i32" for k in ["nrhs", "stride_b", "stride_x", "ticket_base", "n_tiles", "LONG_MIN"]})
    sig["SENTINEL"] = "i64" if dt == "fp64" else "i32"
    cx = {"R": r, "W": w, "WL": wl, "KP": kp, "HW_FENCE": True, "BACKOFF_NS": 0, "PERSISTENT": pers}
    sig.update({k: "constexpr" for k in cx})
    src = triton.compiler.ASTSource(_syncfree_mixed_kernel, sig, constexprs=cx)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    keys = ("mma", "tf32", "fence.acq_rel.gpu", "ld.volatile.global", "atom.global.gpu.release.exch", "atom.global.gpu.relaxed.add",
            "atom.global.gpu.acq_rel.add", "nanosleep.u32", "atom.global.gpu.relaxed.exch")
    out.append({k: (k in ptx) for k in keys} | {"bar.sync": ptx.count("bar.sync"), "ticket_adds": ptx.count("atom.global.gpu.relaxed.add")})
print(json.dumps(out))
"""


def test_mixed_kernel_ptx_for_sm90() -> None:
    """Mixed tiling: value flags in both tile kinds (volatile polls, relaxed exchange), no fence, relaxed tickets, no tf32."""
    for cfg, f in zip(MIXED_CONFIGS, _compile(MIXED_SCRIPT, MIXED_CONFIGS), strict=True):
        pers = cfg[-1]
        assert not f["mma"] and not f["tf32"], f"{cfg}: the in-tile sweep became a tensor-core dot"
        assert f["ld.volatile.global"] and f["atom.global.gpu.relaxed.exch"], f"{cfg}: value-flag poll/publication missing"
        assert not f["fence.acq_rel.gpu"] and not f["atom.global.gpu.release.exch"], f"{cfg}: value flags need no fence or release"
        assert f["atom.global.gpu.relaxed.add"] and not f["atom.global.gpu.acq_rel.add"], f"{cfg}: ticket atomic not relaxed"
        assert f["ticket_adds"] == (2 if pers else 1), (cfg, f["ticket_adds"])  # first ticket + the loop's next ticket
        assert not f["nanosleep.u32"], cfg


def test_per_launch_integers_are_not_specialised() -> None:
    """``epoch`` and ``ticket_base`` change every launch: no recompiles for their divisibility."""
    import subprocess
    import sys

    code = (
        "import kfuse.sparse.kernels as K;"
        "print([sorted(getattr(K, k).do_not_specialize) for k in ('_syncfree_kernel', '_syncfree_fast_kernel', '_syncfree_mixed_kernel')])"
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[['epoch', 'ticket_base'], ['epoch', 'ticket_base'], ['ticket_base']]"
