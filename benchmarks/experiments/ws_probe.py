"""Does the warp-specialised Gluon chain kernel (``b2b_ws_kernel.py`` beside this file) beat the Triton chunked
kernel and the unfused pair on issue 5's wide GEMM chains?

Floor and prediction (session 17): 256 -> 256 -> 256 at M = 1M is 275 GFLOP (0.348 ms at 790
TFLOP/s) and 1.07 GB (0.25 ms at 4.3 TB/s); the 2x line is 0.696 ms. The Triton chunked kernel runs
0.65-0.67 ms (~410 TFLOP/s) and the pair 0.61-0.71. With the first product of chunk j + 1 on the
tensor cores during chunk j's epilogue, and the weight slices shared by 128 rows instead of 64,
FA3-like kernels hold 500-600 TFLOP/s on Hopper: predicted 0.50-0.58 ms at M = 1M (1.45-1.65x the
floor), 0.13-0.15 ms at M = 262144.

Per case: the cuBLAS pair (addmm, relu, addmm), the Triton chunked kernel's default tiling and the
Gluon kernel's tilings, each replayed 20 calls to a CUDA graph, each output poisoned with NaN and
checked against an fp32 reference first.

Result (session 17, two H200 runs, ``experiments/s17_ws_probe_v{1,2}.json``): **refuted**. Correct
on every case (relative error 3.2-3.6e-4, the same as cuBLAS), but slower than the Triton chunked
kernel everywhere. 256 -> 256 -> 256 at M = 1M: best Gluon tiling 0.815 ms (h32, one x buffer,
rings 3/4), against 0.654 for Triton's chunked kernel and 0.894 for the cuBLAS pair. v1 (wait for
every wgmma group each chunk) ran 0.87 ms; v2 (G2(j - 1) left running while G1(j) is waited for,
separate W0 / W1 ring depths) 0.815. M = 262144: 0.217 against 0.169; 64 -> 1024 -> 64: 0.152
against 0.131. See docs/perf-notes.md, "Session 17", for what this leaves.

    PYTHONPATH=. python benchmarks/experiments/ws_probe.py --out $OUT   # H200, ~90 s
"""

from __future__ import annotations

import argparse

import b2b_ws_kernel as ws  # beside this file (python puts the script's folder on sys.path)
import torch
import torch.nn.functional as F

from kfuse.bench.harness import floor_ms, graph_ms_per_call, write_experiment
from kfuse.kernels import b2b
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)
CASES = [(1 << 20, (256, 256, 256)), (262144, (256, 256, 256)), (1 << 20, (128, 128, 128)), (262144, (64, 1024, 64)),
         (262144, (256, 1024, 256))]  # fmt: skip
WS_TILINGS = [
    (32, 2, 2, 3),
    (32, 2, 2, 2),
    (64, 1, 2, 2),
    (64, 1, 2, 3),
    (32, 1, 3, 4),
    (16, 2, 3, 4),
]  # (block_h, x_bufs, w0_stages, w1_stages)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="", help="e.g. 1048576:256x256x256 (default: the built-in five)")
    a = ap.parse_args()
    cases = CASES
    if a.cases:
        cases = [(int(m), tuple(int(v) for v in w.split("x"))) for m, w in (c.split(":") for c in a.cases.split(","))]
    dt, dev = torch.float16, "cuda"
    torch.manual_seed(0)
    recs = []
    for m, (k0, n0, n1) in cases:
        name = f"M{m}_{k0}x{n0}x{n1}"
        x = torch.randn(m, k0, device=dev, dtype=dt)
        w0 = torch.randn(k0, n0, device=dev, dtype=dt) / k0**0.5
        w1 = torch.randn(n0, n1, device=dev, dtype=dt) / n0**0.5
        b0, b1 = torch.randn(n0, device=dev, dtype=dt), torch.randn(n1, device=dev, dtype=dt)
        ref = torch.addmm(b1.float(), F.relu(torch.addmm(b0.float(), x.float(), w0.float())).half().float(), w1.float())
        rec: dict = {"case": name, "floor_ms": floor_ms(2.0 * m * (k0 * n0 + n0 * n1), 2.0 * m * (k0 + n1)), "variants": {}}

        def record(label: str, fn, rec=rec, ref=ref) -> None:
            try:
                out = fn()
                torch.cuda.synchronize()
                err = rel_err(out, ref)
                ms, _ = graph_ms_per_call(fn, (), calls=20, rep=20)
                rec["variants"][label] = {"ms": ms, "rel_err": err, "ok": err < 2e-2}
            except Exception as e:  # a tiling that does not compile or fit is recorded, not fatal
                rec["variants"][label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"[{name}] {label}: {rec['variants'][label]}", flush=True)

        with torch.no_grad():
            record("cublas pair", lambda: torch.addmm(b1, F.relu(torch.addmm(b0, x, w0)), w1))
            chain = b2b.Chain((b2b.Stage(RELU, dt, True), b2b.Stage(Epilogue(), dt, True)))
            args = b2b.prepare(chain, x, [w0, w1], [b0, b1], [[], []])
            cfg = b2b.chunked_config([n0, n1], k0=k0)
            record(f"triton {cfg.describe()}", lambda: b2b.launch(chain, args, cfg))
            for h, xb, s0, s1 in WS_TILINGS:
                if ws.smem_bytes(k0, n1, h, xb, s0, s1) > ws.SMEM_LIMIT:
                    continue

                out = torch.full((m, n1), float("nan"), device=dev, dtype=dt)  # poisoned: the check sees every row

                def run_ws(h=h, xb=xb, s0=s0, s1=s1, out=out) -> torch.Tensor:
                    return ws.b2b_ws(x, w0, w1, b0, b1, ("relu", "none"), block_h=h, x_bufs=xb, w0_stages=s0, w1_stages=s1, out=out)

                record(f"ws h{h} x{xb} w{s0}/{s1}", run_ws)
        recs.append(rec)
    write_experiment("ws_probe", a.out, records=recs)
    print(f"{'case':24s} {'floor':>7s} {'variant':28s} {'ms':>8s} {'x floor':>8s} {'err':>8s}")
    for r in recs:
        for label, v in r["variants"].items():
            if "ms" in v:
                print(f"{r['case']:24s} {r['floor_ms']:7.4f} {label:28s} {v['ms']:8.4f} {v['ms'] / r['floor_ms']:8.3f} {v['rel_err']:8.1e}")
            else:
                print(f"{r['case']:24s} {r['floor_ms']:7.4f} {label:28s} {v['error'][:60]}")


if __name__ == "__main__":
    main()
