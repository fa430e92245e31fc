"""What does the epilogue cost inside the warp-specialised GEMMs (``kfuse/kernels/gemm_ws.py``)?

Session 18's first probe (``pingpong_probe.py``): without an epilogue the ping-pong kernel at 128 x 128
runs BERT T4096 ffn1 in 0.0304 ms, ahead of cuBLAS (0.0318); with bias + exact GELU it takes 0.0466,
so the epilogue adds ~2.8 us a tile instead of hiding under the other warpgroup's main loop. The A&S
GELU is ~28 instructions and two MUFU ops a value; at MUFU's 16 results a clock an SM, 16,384 values
take ~1 us of MUFU and ~1.7 us of issue. Question: is the cost the math (then a cheaper GELU hides),
or anything after the main loop (then bias alone costs as much)?

Prediction: bias alone costs < 10% over none; exact GELU adds most of the gap; tanh.approx GELU
(~8 instructions, one MUFU) gets within 10% of bias-only.

Per shape and schedule: the epilogues none, bias, bias + ReLU, bias + exact GELU (A&S) and bias + GELU
on ``tanh.approx.f32``; outputs poisoned and checked against fp32 references; 20 calls per graph.

Result (session 18, ``experiments/s18_ws_epilogue_probe.json``): bias and ReLU cost 1-5% (as
predicted), the exact GELU 40-75% in ping-pong and less in coop, the ``tanh.approx`` GELU 6-12% (predicted
within 10% of bias alone: about right). The cost is the math, and ping-pong does not hide it.

    PYTHONPATH=. python benchmarks/experiments/ws_epilogue_probe.py --out $OUT   # H200, ~30 s
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_ms_per_call, write_experiment
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import prepare
from kfuse.kernels.gemm_ws import WsConfig

ADD = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
EPILOGUES = {  # name -> (epilogue, fast_gelu, reference of the fp32 product and the bias)
    "none": (Epilogue(), False, lambda p, b: p),
    "bias": (Epilogue((ADD,), 1), False, lambda p, b: p + b),
    "bias+relu": (Epilogue((ADD, EpilogueStep("relu", (Operand("reg", 1),))), 1), False, lambda p, b: F.relu(p + b)),
    "bias+gelu": (Epilogue((ADD, EpilogueStep("gelu", (Operand("reg", 1),))), 1), False, lambda p, b: F.gelu(p + b)),
    "bias+gelu fast": (Epilogue((ADD, EpilogueStep("gelu", (Operand("reg", 1),))), 1), True, lambda p, b: F.gelu(p + b)),
}
SHAPES = [("bert_T4096_ffn1", 4096, 3072, 768), ("bert_T16384_ffn1", 16384, 3072, 768), ("gpt2_T8192_attn_out", 8192, 768, 768),
          ("bert_T16384_ffn2", 16384, 768, 3072)]  # fmt: skip
SCHEDULES = [WsConfig("pingpong", 128, 128, 64, 4, 8), WsConfig("coop", 128, 256, 64, 3, 8, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, dt = "cuda", torch.float16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    recs = []
    for case, m, n, k in SHAPES:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = (torch.randn(k, n, device=dev) / k**0.5).to(dt)
        bias = torch.randn(n, device=dev, dtype=dt)
        prod = a.float() @ b.float()
        rec: dict = {"case": case, "m": m, "n": n, "k": k, "variants": {}}
        mm_out = torch.empty(m, n, device=dev, dtype=dt)
        rec["variants"]["cublas mm alone"] = {"ms": graph_ms_per_call(lambda: torch.mm(a, b, out=mm_out), (), calls=20, rep=20)[0]}
        for cfg in SCHEDULES:
            for name, (epi, fast, ref_fn) in EPILOGUES.items():
                label = f"{cfg.describe()} {name}"
                try:
                    out = torch.full((m, n), float("nan"), device=dev, dtype=dt)
                    g = prepare(a, b, [bias] if epi.n_inputs else [], dt, out)

                    def run(g=g, epi=epi, fast=fast, cfg=cfg) -> torch.Tensor:
                        gemm_ws.launch(g.a, g.b, g.c, g.extras, epi, cfg, sms, fast_gelu=fast)
                        return g.c[0]

                    got = run()
                    ref = ref_fn(prod, bias.float())
                    err = float((got.float() - ref).abs().max() / ref.abs().max())
                    ms, _ = graph_ms_per_call(run, (), calls=20, rep=20)
                    rec["variants"][label] = {"ms": ms, "rel_err": err, "ok": err < 1e-2}
                except Exception as e:  # recorded, not fatal
                    rec["variants"][label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"[{case}] {label}: {rec['variants'][label]}", flush=True)
        recs.append(rec)
    write_experiment("ws_epilogue_probe", args.out, records=recs)
    print(f"\n{'case':22s} {'schedule':30s} " + " ".join(f"{e:>14s}" for e in EPILOGUES) + f" {'mm alone':>9s}")
    for r in recs:
        for cfg in SCHEDULES:
            cells = [r["variants"].get(f"{cfg.describe()} {e}", {}) for e in EPILOGUES]
            txt = " ".join(f"{c['ms']:8.4f}{'' if c.get('ok') else ' BAD':>6s}" if "ms" in c else f"{'error':>14s}" for c in cells)
            print(f"{r['case']:22s} {cfg.describe():30s} {txt} {r['variants']['cublas mm alone']['ms']:9.4f}")


if __name__ == "__main__":
    main()
