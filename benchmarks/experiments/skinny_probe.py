"""The skinny GEMM against cuBLAS on a decode step's GEMM shapes (M = 1 and 8, fp16), each timed alone in a CUDA
graph of 50 back-to-back calls (no PDL, no launch overhead): us per call and the weight's GB/s, every candidate
checked against torch.mm first. Session 48: the decode plan's GEMMs took ~10-18 us each where the bandwidth says
2.5-14; this says whether the kernel or the plan around it is slow.

    PYTHONPATH=. python benchmarks/experiments/skinny_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import torch

from kfuse.kernels import skinny_gemm as S
from kfuse.kernels.epilogue import Epilogue

SHAPES = {"qkv": (2048, 2560), "o_proj": (2048, 2048), "down": (5632, 2048), "gate_up": (2048, 11264), "lm_head": (2048, 32000)}


def graph_us(fn, calls: int = 50, rep: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--folded-only", action="store_true", help="only the folded-norm comparison")
    args = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    best_at_1: dict[str, list] = {}
    for m in (1, 8) if not args.folded_only else ():
        for name, (k, n) in SHAPES.items():
            gated = name == "gate_up"
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5  # nn.Linear's layout
            b = w.t()
            want = (a @ b).float()
            if gated:
                want = S.reference(a, b, [], Epilogue(), torch.float32, gated="silu")
            mb = n * k * 2 / 1e6
            rec = {"m": m, "gemm": name, "k": k, "n": n, "weight_mb": mb}
            rec["cublas_us"] = graph_us(lambda a=a, b=b: torch.mm(a, b))
            cands = list(S.configs(m, n // 2 if gated else n, k, sms, gated))
            extras = ((32, 64, 4), (128, 64, 4), (128, 256, 8)) if m == 1 else ()
            cands += [c for c in best_at_1.get(name, ()) if c not in cands]
            for bn, bk, w_ in extras:
                for mult in (1, 2):
                    sp = max(1, int(S.splits_for(n // 2 if gated else n, k, bn, bk, sms) * mult))
                    c = S.SkinnyConfig(bn, bk, sp, w_, S.stages_for(bn, bk, 2 if gated else 1, 2))
                    if c not in cands and not (gated and bn * bk > 64 * 128):
                        cands.append(c)
            best = None
            for c in cands:
                try:
                    got = S.skinny_gemm(a, b, [], Epilogue(), torch.float16, c, gated="silu" if gated else None)
                    err = float((got.float() - want).abs().max() / want.abs().max())
                    if err > 2e-2:
                        rec[f"skinny {c.describe()}"] = f"wrong {err:.3g}"
                        continue
                    us = graph_us(lambda c=c: S.skinny_gemm(a, b, [], Epilogue(), torch.float16, c, gated="silu" if gated else None))
                except Exception as e:  # noqa: BLE001
                    rec[f"skinny {c.describe()}"] = f"failed {type(e).__name__}: {str(e)[:80]}"
                    continue
                rec[f"skinny {c.describe()}"] = us
                if best is None or us < best[0]:
                    best = (us, c.describe())
            rec["skinny_best_us"], rec["skinny_best"] = best if best else (None, None)
            if best and m == 1:
                best_at_1[name] = [c for c in cands if c.describe() == best[1]]
            rows.append(rec)
            bw = lambda us: mb / 1e3 / (us * 1e-6) / 1e3 if us else 0  # noqa: E731 - TB/s
            cub, sk = rec["cublas_us"], rec["skinny_best_us"]
            print(f"M={m} {name:8s} {mb:6.1f} MB  cuBLAS {cub:7.2f} us ({bw(cub):.2f} TB/s)", end="", flush=True)
            print(f"  skinny {sk or 0:7.2f} us ({bw(sk):.2f} TB/s) {rec['skinny_best']}", flush=True)
    # the folded RMSNorm: the skinny kernel's one launch against the weightless norm kernel + each other GEMM
    from kfuse.kernels import gated_gemm as G
    from kfuse.kernels.norm import norm

    for m in (1, 8):
        for name in ("qkv", "gate_up"):
            k, n = SHAPES[name]
            gated = name == "gate_up"
            act = "silu" if gated else None
            a = torch.randn(m, k, device="cuda", dtype=torch.float16) * 3
            b = (torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5).t()
            want = S.reference(a, b, [], Epilogue(), torch.float32, row_rms=1e-5, gated=act)
            b_rowmajor = b.contiguous()
            rec = {"m": m, "gemm": name, "folded_norm": True}
            sides = {
                "norm+cublas": lambda a=a, b=b: torch.mm(norm(a, rms=True, eps=1e-5), b),
                "norm+skinny": lambda a=a, b=b, act=act: S.skinny_gemm(
                    norm(a, rms=True, eps=1e-5), b, [], Epilogue(), torch.float16, gated=act
                ),
                "skinny_rms": lambda a=a, b=b, act=act: S.skinny_gemm(a, b, [], Epilogue(), torch.float16, row_rms=1e-5, gated=act),
                # the plan's merged QKV / gate-up weights are [K, N] row-major (merge_gemm concatenates along N), not
                # nn.Linear's K-contiguous layout the other sides read: the same kernel on that layout
                "skinny_rms_rowmajor": lambda a=a, bc=b_rowmajor, act=act: S.skinny_gemm(
                    a, bc, [], Epilogue(), torch.float16, row_rms=1e-5, gated=act
                ),
                "skinny_rms_slice": lambda a=a, b=b, act=act, k=k, n=n: S.skinny_gemm(
                    a,
                    b,
                    [],
                    Epilogue(),
                    torch.float16,
                    replace(S.default_config(m, n // 2 if act else n, k, sms, bool(act)), rms_slice=True),
                    row_rms=1e-5,
                    gated=act,
                ),
            }
            if gated:
                sides["norm+gated_tile"] = lambda a=a, b=b: G.gated_gemm(norm(a, rms=True, eps=1e-5), b, "silu")
                del sides["norm+cublas"]
            for side, fn in sides.items():
                err = float((fn().float() - want).abs().max() / want.abs().max())
                rec[side] = graph_us(fn) if err < 2e-2 else f"wrong {err:.3g}"
            rows.append(rec)
            print(f"M={m} {name:8s} folded norm: " + ", ".join(f"{k_} {v:.2f} us" if isinstance(v, float) else f"{k_} {v}"
                                                                for k_, v in rec.items() if k_ in sides), flush=True)  # fmt: skip
    with open(os.path.join(args.out, "skinny_probe.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
