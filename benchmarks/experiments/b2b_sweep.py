"""Issue 5 exploration on the GPU: a wider config sweep of the fused b2b kernels than the
compile-time decision measures (``candidate_configs``), on the chains that miss their targets:
the conv3x3 -> conv1x1 chains (fused slower than cuDNN) and the 128-wide GEMM chains (M = 1M
above 2x the memory floor). Each config and the PyTorch reference (the unfused pair, cuDNN /
cuBLAS, in one CUDA graph) is timed as 20 back-to-back calls per graph replay (ms per call);
every config's output is checked against the reference in the same run. Prints, per case, the
best configs and the reference; writes all timings as JSON.

    PYTHONPATH=. python benchmarks/experiments/b2b_sweep.py --out $OUT/r   # H200, ~120 s
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from typing import Any

if "--smoke" in sys.argv:  # tiny shapes in the interpreter on the CPU (wiring check)
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from kfuse.bench.harness import floor_ms, graph_ms_per_call, max_rel_err, sweep_configs, write_experiment
from kfuse.kernels import b2b
from kfuse.kernels.b2b.configs import SMEM_LIMIT, chunked_smem_bytes
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

SMOKE = "--smoke" in sys.argv
WIDE_N = "--wide-n" in sys.argv
N_LOOP = "--n-stages" in sys.argv
PERSISTENT = "--persistent" in sys.argv
SHALLOW = "--shallow" in sys.argv
OCCUPANCY = "--occupancy" in sys.argv
RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)
CONV_CASES = [("B64_56x56_64-64-64", 64, 64, 56, 64, 64), ("B64_56x56_64-64-256", 64, 64, 56, 64, 256),
              ("B64_28x28_128-128-128", 64, 128, 28, 128, 128), ("B64_28x28_128-128-512", 64, 128, 28, 128, 512)]  # fmt: skip
GEMM_CASES = [(1 << 20, (128, 128, 128)), (1 << 20, (64, 128, 64)), (262144, (128, 128, 128)), (65536, (64, 64, 64))]


def conv_tma_configs(c0: int, c1: int) -> list[b2b.B2BConfig]:
    """~20-40 per chain of ``b2b_conv_tma_kernel``: pixel tiles of 64-256 rows shaped from 4 rows
    high to 32 (4 x 32 wastes 14% of a 28-wide image where 8 x 16 wastes 31%), 4 / 8 warps, 2-4
    stages, and for outputs wider than 128 last-stage tiles of 128 and 256 columns."""
    res = "register" if c0 <= 128 else "smem"
    bns = [b2b.pad_width(c1)] if c1 <= 128 else [128, 256]
    out = []
    for th, s in itertools.product((4, 8), (3, 4)):
        out.append(b2b.B2BConfig(64, 64, min(bns[0], 128), 4, s, res, tma=True, tile_h=th))
    for th, w, s, bn in itertools.product((4, 8, 16, 32), (4, 8), (3, 4), bns):
        if bn <= 128 or w == 8:
            out.append(b2b.B2BConfig(128, 64, bn, w, s, res, tma=True, tile_h=th))
    for th, s in itertools.product((8, 16), (2, 3)):
        out.append(b2b.B2BConfig(256, 64, min(bns[0], 128), 8, s, res, tma=True, tile_h=th))
    out.append(b2b.B2BConfig(128, 32, min(bns[0], 128), 4, 4, res, tma=True, tile_h=8))
    return out


def conv_multi_image_configs(nb: int, hw: int, c0: int, c1: int) -> list[b2b.B2BConfig]:
    """~14 per chain: the TMA kernel's least-waste tiles of several images (``least_waste_tile``:
    8 x 4 x 4 at 28 x 28, 2 x 8 x 8 at 56 x 56) over BM 64-256, warps, stages, residence."""
    from kfuse.kernels.tma import least_waste_tile

    bns = [b2b.pad_width(c1)] if c1 <= 128 else [128]
    if OCCUPANCY:  # only these (chains up to 128 wide in stage 0)
        # three programs per SM (session 16, offline sm_90 compiles): the intermediate through shared
        # memory, 64-column last tiles and a single-buffered N loop take 158-159 registers and
        # 48-64 KB, where every tiling tried so far needed 192-224 registers or 98 KB (two per SM).
        # At 28 x 28, batch 64, the 392 tiles of 128 pixels then fit one wave of 396 slots instead
        # of 1.48 waves of 264; the current best (register, 3 stages) is timed beside them
        tn, th, _ = least_waste_tile(128, nb, hw, hw)
        occ: list[b2b.B2BConfig] = []
        for bk, s, bn, ns, res in ((64, 3, min(bns[0], 128), 0, "register"), (64, 2, 64, 1, "smem"), (32, 3, 64, 1, "smem"),
                                   (32, 4, 64, 1, "smem"), (64, 2, 64, 2, "smem"), (64, 2, 128, 0, "smem")):  # fmt: skip
            occ.append(b2b.B2BConfig(128, bk, bn, 4, s, res, tma=True, tile_h=th, tile_n=tn, n_stages=ns))
        if c1 > 128:  # the best of the wide-output chain so far (8 warps, two programs per SM)
            occ.append(b2b.B2BConfig(128, 32, 64, 8, 4, "smem", tma=True, tile_h=th, tile_n=tn))
        return occ if c0 <= 128 else []
    out = []
    for bm, w, s, res in itertools.product((64, 128, 256), (4, 8), (2, 3, 4), ("register", "smem")):
        if (bm == 64 and w == 8) or (bm == 256 and (w == 4 or s == 4)) or (bm != 256 and s == 2):
            continue
        if res == "smem" and (c1 <= 128 or w == 4) or (res == "register" and c0 > 128):
            continue
        tn, th, _ = least_waste_tile(bm, nb, hw, hw)
        out += [b2b.B2BConfig(bm, 64, bn, w, s, res, tma=True, tile_h=th, tile_n=tn) for bn in bns]
    if WIDE_N and c1 > 128:  # 256-wide last tiles: half the N loop's trips (smem-bound: 2 stages)
        for bm, w, s, res, bk in itertools.product((64, 128), (4, 8), (2, 3), ("register", "smem"), (32, 64)):
            if (bm == 64 and w == 8) or (res == "smem" and w == 4):
                continue
            tn, th, _ = least_waste_tile(bm, nb, hw, hw)
            out.append(b2b.B2BConfig(bm, bk, 256, w, s, res, tma=True, tile_h=th, tile_n=tn))
    if SHALLOW:  # 128-pixel tiles with 2 buffers (two programs per SM fit) and other channel steps
        tn, th, _ = least_waste_tile(128, nb, hw, hw)
        for bk, s, w, res in ((64, 2, 4, "register"), (64, 2, 8, "smem"), (128, 2, 4, "register"), (128, 2, 8, "register"),
                              (32, 3, 4, "register"), (32, 4, 4, "register"), (32, 2, 4, "register")):  # fmt: skip
            if res == "register" and c0 > 128:
                continue
            out.append(b2b.B2BConfig(128, bk, min(bns[0], 128), w, s, res, tma=True, tile_h=th, tile_n=tn))
    if PERSISTENT:  # b2b_conv_tma_persistent_kernel: the same tiles on a fixed grid of 1-2 programs per SM
        out += [dataclasses.replace(c, persistent=True, programs_per_sm=p) for c in list(out) for p in (1, 2)]
    if N_LOOP and c1 > 128:  # the last stage's N loop less deeply pipelined (fewer weight buffers)
        tn, th, _ = least_waste_tile(128, nb, hw, hw)
        warps_res = ((4, "register"), (8, "smem"), (8, "register"))
        for bk, (w, res), st, bn, ns in itertools.product((32, 64), warps_res, (3, 4), (128, 256), (1, 2)):
            if bn == 256 and w == 4:
                continue
            out.append(b2b.B2BConfig(128, bk, bn, w, st, res, tma=True, tile_h=th, tile_n=tn, n_stages=ns))
    return out


def conv_configs(c1: int) -> list[b2b.B2BConfig]:
    """24 per chain: register residence over BM 64/128, BK 32/64, warps, stages; smem at 2 stages."""
    out = []
    for bm, bk, w, s in itertools.product((64, 128), (32, 64), (4, 8), (2, 3, 4)):
        if bm == 64 and w == 8:
            continue
        out.append(b2b.B2BConfig(bm, bk, min(128, c1), w, s, "register"))
        if s == 2:
            out.append(b2b.B2BConfig(bm, bk, min(128, c1), w, s, "smem"))
    return out


def gemm_configs(widths: tuple[int, int, int]) -> list[b2b.B2BConfig]:
    """~40 per chain: one program per tile (BM 64-256, with and without preload) and the TMA
    persistent kernel (BM 64/128, 2-4 tile stages, 1-2 programs per SM)."""
    k0, n0, n1 = widths
    bk = min(128, max(16, b2b.pad_width(k0)))
    last = min(b2b.pad_width(n1), 128)
    res = "register" if n0 <= 128 else "smem"
    out = []
    if n0 > 128:  # 256-wide intermediates: 128-row tiles with two warpgroups (the 128 x 256 fp32
        # accumulator is 128 registers a thread), K steps of 32-64, the last stage in 64-128 column
        # steps with 2-3 weight buffers (offline sm_90: 230-254 registers, no spills, 112-224 KB)
        for bk, bn, s, ns in itertools.product((32, 64), (64, 128), (2, 3), (0, 2)):
            if ns and ns >= s:
                continue
            out.append(b2b.B2BConfig(128, bk, bn, 8, s, "register", n_stages=ns))
        out += [b2b.B2BConfig(128, 64, 128, 8, 2, "smem"), b2b.B2BConfig(128, 64, 64, 8, 3, "smem")]
        return out
    for bm, w, s in itertools.product((64, 128, 256), (4, 8), (2, 3)):
        if bm == 256 and w == 4 or bm == 64 and w == 8:
            continue
        out.append(b2b.B2BConfig(bm, bk, last, w, s, res))
        if s == 2:
            out.append(b2b.B2BConfig(bm, bk, last, w, s, res, preload=True))
    if k0 <= 128 and n1 <= 128:
        for bm, w, s, per in itertools.product((64, 128), (4, 8), (2, 3, 4), (1, 2)):
            if bm == 64 and w == 8:
                continue
            out.append(b2b.B2BConfig(bm, bk, last, w, s, res, True, tma=True, programs_per_sm=per))
            if s == 2:
                out.append(b2b.B2BConfig(bm, bk, last, w, s, res, True, preload=True, tma=True, programs_per_sm=per))
    return out


def chunked_configs(widths: tuple[int, int, int]) -> list[b2b.B2BConfig]:
    """``b2b_chunked_kernel`` tilings of a two-stage chain with K0, N1 <= 256: 64 / 128-row tiles
    (one or two warpgroups; 128 rows on 4 warps spill), hidden chunks of 32-128 columns, 1-4
    chunk buffers (one: no pipelining within a program, so that two programs fit an SM), one
    program per tile or a persistent grid of 1-2 per SM. Only those whose shared memory (x tile
    + buffers of both weight chunks) fits the H200's 227 KB."""
    k0, n0, n1 = widths
    if b2b.chunked_eligible(False, [n0, n1], k0) is not None:
        return []
    bk, bn = b2b.pad_width(k0), b2b.pad_width(n1)
    out = []
    for bm, bh, s, per in itertools.product((64, 128), (32, 64, 128), (1, 2, 3, 4), (0, 1, 2)):
        smem = chunked_smem_bytes(bm, bk, bh, bn, s)
        if smem > SMEM_LIMIT or (per == 2 and 2 * smem > SMEM_LIMIT) or bh > b2b.pad_width(n0):
            continue
        # 64-row tiles also on two warpgroups (splitting the output's columns) when unbuffered
        for w in (8,) if bm == 128 else ((4, 8) if s == 1 and bh >= 64 else (4,)):
            out.append(b2b.B2BConfig(bm, bk, bn, w, s, "chunked", persistent=per > 0, programs_per_sm=max(per, 1), block_h=bh))
    return out


def _sweep(chain: b2b.Chain, args_of: Any, cfgs: list[b2b.B2BConfig], ref: torch.Tensor, deadline: float) -> dict[str, Any]:
    g = args_of()

    def time_one(cfg: b2b.B2BConfig) -> dict[str, Any]:
        g.out.fill_(float("nan"))
        ms, _ = graph_ms_per_call(lambda: b2b.launch(chain, g, cfg), (), calls=20, rep=15)
        err_v = max_rel_err(g.out, ref)
        if err_v >= 2e-2:
            print(f"  WRONG {cfg.describe()}: max rel err {err_v:.3g}", flush=True)
        return {"ms": ms, "max_rel_err": err_v, "ok": err_v < 2e-2}

    if SMOKE:
        cfgs = [c for c in cfgs if c.block_m == 64][:3]
    # the interpreter compiles nothing ahead
    compile_one = (lambda cfg: b2b.launch(chain, args_of(), cfg, warmup=True)) if torch.cuda.is_available() else None
    return sweep_configs(cfgs, compile_one, time_one, deadline)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--only", default="conv,gemm")
    ap.add_argument("--tma-only", action="store_true", help="conv chains: only the TMA kernel's configs")
    ap.add_argument("--multi-image-only", action="store_true", help="conv chains: only the TMA kernel's tiles of several images")
    ap.add_argument("--wide-n", action="store_true", help="conv chains wider than 128: also 256-wide last tiles")
    ap.add_argument("--n-stages", action="store_true", help="conv chains wider than 128: the N loop with 1-2 weight buffers")
    ap.add_argument("--shallow", action="store_true", help="conv chains: 128-pixel tiles with 2 buffers and 32/128-channel steps")
    ap.add_argument("--occupancy", action="store_true", help="conv chains up to 128 wide: the tilings that fit 3 programs per SM")
    ap.add_argument("--persistent", action="store_true", help="conv chains: also the persistent TMA kernel (1-2 programs per SM)")
    ap.add_argument("--conv-cases", default="", help="comma list of conv case names to keep")
    ap.add_argument("--gemm-cases", default="", help="e.g. 262144:64x128x64,1048576:128x128x128 (default: the built-in four)")
    ap.add_argument("--chunked-only", action="store_true", help="GEMM chains: only b2b_chunked_kernel's configs")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, a few configs, on the CPU")
    a = ap.parse_args()
    dev, dt = ("cpu", torch.float32) if a.smoke else ("cuda", torch.float16)
    global CONV_CASES, GEMM_CASES
    if a.conv_cases:
        CONV_CASES = [c for c in CONV_CASES if c[0] in a.conv_cases.split(",")]
    if a.gemm_cases:
        GEMM_CASES = [(int(m), tuple(int(v) for v in w.split("x"))) for m, w in (c.split(":") for c in a.gemm_cases.split(","))]
    if a.smoke:
        CONV_CASES, GEMM_CASES = [("B2_6x6_8-16-16", 2, 8, 6, 16, 16)], [(50, (32, 32, 32))]
    t_end = time.perf_counter() + a.budget_s
    recs = []
    sections = a.only.split(",")
    torch.manual_seed(0)
    todo: list[tuple[str, Any]] = []
    if "gemm" in sections:
        todo += [("gemm", c) for c in GEMM_CASES]
    if "conv" in sections:
        todo += [("conv", c) for c in CONV_CASES]
    for i, (kind, case) in enumerate(todo):
        deadline = time.perf_counter() + (t_end - time.perf_counter()) / (len(todo) - i)
        if kind == "conv":
            name, nb, cin, hw, c0, c1 = case
            chain = b2b.Chain((b2b.Stage(RELU, dt, True), b2b.Stage(RELU, dt, True)), conv=True)
            x = torch.randn(nb, cin, hw, hw, device=dev, dtype=dt).to(memory_format=torch.channels_last)
            w0 = torch.randn(c0, cin, 3, 3, device=dev, dtype=dt) / (9 * cin) ** 0.5
            w1 = torch.randn(c1, c0, 1, 1, device=dev, dtype=dt) / c0**0.5
            b0, b1 = torch.randn(c0, device=dev, dtype=dt), torch.randn(c1, device=dev, dtype=dt)
            w0c, w1c = w0.to(memory_format=torch.channels_last), w1.to(memory_format=torch.channels_last)

            def ref_fn(x=x, w0c=w0c, w1c=w1c, b0=b0, b1=b1) -> torch.Tensor:
                return F.relu(F.conv2d(F.relu(F.conv2d(x, w0c, b0, padding=1)), w1c, b1))

            packed = [b2b.pack_first(w0, True), b2b.pack_next(w1)]

            def args_of(chain=chain, x=x, w0=w0, w1=w1, b0=b0, b1=b1, packed=packed) -> b2b.B2BArgs:
                return b2b.prepare(chain, x, [w0, w1], [b0, b1], [[], []], packed, b2b.ConvGeom((1, 1), (1, 1)))

            cfgs = conv_multi_image_configs(nb, hw, c0, c1)
            if not a.multi_image_only:
                cfgs += conv_tma_configs(c0, c1) + ([] if a.tma_only else conv_configs(c1))
            pix = nb * hw * hw
            flops, nbytes = 2.0 * pix * (9 * cin * c0 + c0 * c1), 2.0 * pix * (cin + c1)
        else:
            m, (k0, n0, n1) = case
            name = f"M{m}_{k0}x{n0}x{n1}"
            chain = b2b.Chain((b2b.Stage(RELU, dt, True), b2b.Stage(Epilogue(), dt, True)))
            x = torch.randn(m, k0, device=dev, dtype=dt)
            w0 = torch.randn(k0, n0, device=dev, dtype=dt) / k0**0.5
            w1 = torch.randn(n0, n1, device=dev, dtype=dt) / n0**0.5
            b0, b1 = torch.randn(n0, device=dev, dtype=dt), torch.randn(n1, device=dev, dtype=dt)

            def ref_fn(x=x, w0=w0, w1=w1, b0=b0, b1=b1) -> torch.Tensor:
                return torch.addmm(b1, F.relu(torch.addmm(b0, x, w0)), w1)

            def args_of(chain=chain, x=x, w0=w0, w1=w1, b0=b0, b1=b1) -> b2b.B2BArgs:
                return b2b.prepare(chain, x, [w0, w1], [b0, b1], [[], []])

            cfgs = chunked_configs((k0, n0, n1)) + ([] if a.chunked_only else gemm_configs((k0, n0, n1)))
            flops, nbytes = 2.0 * m * (k0 * n0 + n0 * n1), 2.0 * m * (k0 + n1)
        with torch.no_grad():
            ref_ms, ref = graph_ms_per_call(ref_fn, (), calls=20, rep=15)
            ref = ref.clone()
            res = _sweep(chain, args_of, cfgs, ref, deadline)
        ok = {k: v["ms"] for k, v in res.items() if isinstance(v, dict) and v["ok"]}
        best = sorted(ok.items(), key=lambda kv: kv[1])[:5]
        rec = {"case": name, "kind": kind, "reference_ms": ref_ms, "floor_ms": floor_ms(flops, nbytes), "configs": res, "best": best}
        recs.append(rec)
        bad = [k for k, v in res.items() if isinstance(v, dict) and not v["ok"]]
        print(f"[{kind}] {name}: reference {ref_ms:.4f} ms, floor {rec['floor_ms']:.4f}; {len(ok)}/{len(cfgs)} ok, "
              f"{len(bad)} wrong; best {best[:3]}", flush=True)  # fmt: skip
    write_experiment("b2b_sweep", a.out, records=recs)
    print(f"{'case':26s} {'reference':>10s} {'best':>10s} {'ratio':>7s} {'floor':>8s}  best config")
    for r in recs:
        if r["best"]:
            cfg, ms = r["best"][0]
            print(f"{r['case']:26s} {r['reference_ms']:10.4f} {ms:10.4f} {r['reference_ms'] / ms:7.2f} {r['floor_ms']:8.4f}  {cfg}")
        else:
            print(f"{r['case']:26s} {r['reference_ms']:10.4f}  (no config ran)")


if __name__ == "__main__":
    main()
