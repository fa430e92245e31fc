"""Issue 3's GEMM under the H200's power limit: fewer L2 bytes and fewer epilogue instructions per
GEMM, on the twelve BERT / GPT-2 shapes.

**What session 20's counters showed** (``ncu_gemm_probe.py``, ``experiments/s20_ncu_gemm_probe.json``).
At BERT T16384 ffn1 kfuse's bias + GELU ping-pong kernel takes as many cycles as cuBLAS's bare GEMM
(186.0k against 185.0k; the bare ping-pong kernel 178.3k, fewer), but runs at 1.465 GHz where cuBLAS
runs at 1.537: the GPU is at its power limit, and kfuse moves 1.48x cuBLAS's bytes through L2 (1.07
against 0.72 GB: 128 x 128 tiles without clusters, against cuBLAS's 256 x 128 tiles with the B block
multicast to a 2-CTA cluster). Under a power cap the time of a GEMM is its energy, so what pays is
less data moved and fewer instructions, not more overlap.

**Variants** (all bias + GELU in the default tanh form, one call a graph replay, interleaved with the
bare cuBLAS GEMM and cuBLASLt's fused bias + GELU in rotated rounds, as ``gemm_bench`` times):
- ``128x128 s5`` without the bias fold: the kernel kfuse ran before this session;
- ``fold``: the accumulator starts from the bias row (the wgmma accumulates onto it), so the
  epilogue has no add and no bias load: FP32-pipe instructions 1,536 -> 1,280 a 128 x 128 tile
  (sm_90 offline); predicted 1-3% where the epilogue's FP32 work costs the other warpgroup's wgmma;
- ``192x128``: a 128-row and a 64-row accumulator over the same B block (three m64n128 wgmma a K step,
  where 128 x 192 issues two m64n128 and two m64n64): 17% fewer operand bytes than 128 x 128; wave
  counts 132 tiles a wave at BERT T4096 N = 768 (one wave exactly);
- ``sc``: the two consumers share one set of staging buffers (their epilogues take turns), which
  frees a ring stage: 128 x 128 at 6 stages, 192 x 128 / 128 x 192 at 4 (3 with a buffer each, which
  left the consumer one slot of look-ahead: session 19's 128 x 192 tile was 15% slower per cycle).
Prediction: the 192 x 128 sc tile at or under the bare cuBLAS GEMM on the T16384 and GPT-2 shapes
(-13% L2 bytes, +3-5% clock, per-cycle parity with 128 x 128 if 4 stages suffice), and the fold
worth 1-3% on every tile.

Result (session 20, ``experiments/s20_ws_power_probe.json``, run 1, the first seven variants with the
128 x 192 one folded): the fold made the 128 x 128 tile 0-3% *slower* (T16384 ffn1 1.047 -> 1.076x
cuBLAS), most on the K = 768 shapes with many tiles, so a fixed cost per tile; shared staging at 128 x
128 (s6) changed nothing; 192 x 128 s4 with shared staging was the best variant on 9 of 12 shapes
(1.015x at T16384 ffn1, 0.985 at T4096 attn_out, 0.996 at T16384 qkv; at s3 1.09-1.15x). Run 2 adds
the 192 x 128 tile without the fold (the bias loaded in the epilogue, which spills 344 B): 0.95-1.16x
cuBLAS, at or under it on 3 of 12 (T16384 qkv 0.952, ffn1 0.971, GPT-2 qkv 0.990), 2-5% faster than the
folded form on the T16384 and GPT-2 shapes, 2-5% slower on three T4096 ones: kfuse's kernels now read the
bias in the epilogue on every tile.

Runs 3-7 (session 21, ``experiments/s21_ws_power_probe_v{3..7}.json``; docs/perf-notes.md, "Session 21"):
the "blocked" load (predicted 1-3% faster on the T16384 / GPT-2 shapes) was 0-3% slower; the bias row by
TMA 3-4% slower on T16384 qkv / ffn1 and GPT-2 qkv; the tuned kernel with no epilogue at all at or under
cuBLAS on 8-11 of 12 (0.88-1.03x) where with bias + GELU on 3-5; the rows kernel (two warpgroups on one
tile) 10-11 of 12 bare (0.88-1.02x) but 1.04-1.16x with its epilogue, 1.01-1.17x with an epilogue
warpgroup beside its main loop; the output stored from the registers 1.03-1.30x.

Run 8 (session 29): see docs/perf-notes.md, "Session 29"; run 9 (session 30): "Session 30"; run 10 (session 31): "Session 31".

    PYTHONPATH=. python benchmarks/experiments/ws_power_probe.py --out $OUT   # H200, ~90 s
"""

from __future__ import annotations

import argparse

import torch

from kfuse.bench.harness import interleaved_ms, write_experiment
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import prepare
from kfuse.kernels.gemm_ws import WsConfig

ADD = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
BIAS_GELU = Epilogue((ADD, EpilogueStep("gelu", (Operand("reg", 1),))), 1)
LAYERS = {"qkv": (768, 2304), "attn_out": (768, 768), "ffn1": (768, 3072), "ffn2": (3072, 768)}  # (K, N)
MODELS = {"bert": (4096, 16384), "gpt2": (8192,)}
VARIANTS = {  # label: (config, where the bias row is read: gemm_ws.BIAS_MODES; "bare": no epilogue at all; gelu16, gelu_mix)
    # Runs 1-2 (experiments/s20_ws_power_probe_v{1,2}.json) also timed 128x128 s5 g8 fold, 128x128 s6 g8 sc,
    # 192x128 s3 g8 fold, 192x128 s4 g{1,8} sc fold and 128x128 s4 g8 sc; runs 3-7 (s21_ws_power_probe_v{3..7}.json)
    # the bias row "blocked", 128x128 s5 g8 with the TMA row, the rows kernel at 256x128 s3, the rows kernel with
    # an epilogue warpgroup (commit f2cb384) and the output stored from the registers (commit 638bfbf; both
    # removed since): each behind "192x128 s4 g1 sc epi" where a program holds many tiles.
    # Run 8 (session 29): the GELU on f16x2 pairs ("g16", gemm_ws._bias_gelu_f16x2) on the tiles and schedules
    # the tuner's space holds and on the rows kernel, whose exposed epilogue it shortens
    # Run 9 (session 30): the bias row prefetched before the turn wait ("pre", bias mode "prefetch"), beside the
    # row loaded in the epilogue (g1 / g8, 128x128 s6, the rows kernel: experiments/s30_ws_power_probe_v9.json)
    # Run 10 (session 31): half the GELU's values on gelu_poly's FMA-pipe polynomial instead of the MUFU, in every
    # tile ("mixall", gelu_mix) or only in a program's last tile (a branch, removed since: no better on the one-tile
    # shapes, up to 4% slower on 128x128 s6): experiments/s31_ws_power_probe_v10.json
    "192x128 s4 g1 sc pre g16": (WsConfig("pingpong", 192, 128, 64, 4, 1, shared_c=True), "prefetch", True, False),
    "192x128 s4 g1 sc pre mixall": (WsConfig("pingpong", 192, 128, 64, 4, 1, shared_c=True), "prefetch", True, True),
    "128x128 s6 g8 sc pre g16": (WsConfig("pingpong", 128, 128, 64, 6, 8, shared_c=True), "prefetch", True, False),
    "128x128 s6 g8 sc pre mixall": (WsConfig("pingpong", 128, 128, 64, 6, 8, shared_c=True), "prefetch", True, True),
    # the tuned tile without an epilogue (what bias + GELU costs)
    "192x128 s4 g1 sc bare": (WsConfig("pingpong", 192, 128, 64, 4, 1, shared_c=True), "bare", False, False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    dev, dt = "cuda", torch.float16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    # the generated modules the variants use ("bare": no epilogue)
    mods = {(mode, g16, mix): gemm_ws.module(Epilogue((), 0) if mode == "bare" else BIAS_GELU, True, "epilogue" if mode == "bare" else mode,
                                             g16, mix)
            for _, mode, g16, mix in VARIANTS.values()}  # fmt: skip
    recs = []
    for mdl, toks in MODELS.items():
        for m in toks:
            for layer, (k, n) in LAYERS.items():
                case = f"{mdl}_T{m}_{layer}"
                a = torch.randn(m, k, device=dev, dtype=dt)
                w = (torch.randn(n, k, device=dev) / k**0.5).to(dt)
                b = w.t().contiguous()  # kfuse folds nn.Linear's transpose at compile time
                bias = torch.randn(n, device=dev, dtype=dt)
                ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh")
                mm_out = torch.empty(m, n, device=dev, dtype=dt)
                fns = {
                    "cublas mm alone": lambda a=a, b=b, o=mm_out: torch.mm(a, b, out=o),
                    "cublaslt bias+gelu": lambda a=a, b=b, bias=bias: torch._addmm_activation(bias, a, b, use_gelu=True),
                }
                rec: dict = {"case": case, "m": m, "n": n, "k": k, "errors": {}}
                for label, (cfg, mode, g16, mix) in VARIANTS.items():
                    out = torch.full((m, n), float("nan"), device=dev, dtype=dt)
                    g = prepare(a, b, [] if mode == "bare" else [bias], dt, out)

                    def run(g=g, cfg=cfg, mod=mods[mode, g16, mix]) -> None:
                        gemm_ws.run_module(mod, g.a, g.b, g.c, g.extras, cfg, sms)

                    try:
                        run()
                        torch.cuda.synchronize()
                        want = a.float() @ b.float() if mode == "bare" else ref
                        err = float((out.float() - want).abs().max() / want.abs().max())
                    except Exception as e:  # recorded, not fatal
                        rec["errors"][label] = f"{type(e).__name__}: {str(e)[:200]}"
                        continue
                    rec["errors"][label] = err
                    if err < 1e-2:
                        fns[label] = run
                rec["ms"] = interleaved_ms(fns, rounds=args.rounds)
                recs.append(rec)
                mm = rec["ms"]["cublas mm alone"]
                print(f"[{case}] cublas {mm * 1e3:.1f} us; " + ", ".join(f"{lab} {t / mm:.3f}" for lab, t in rec["ms"].items()), flush=True)
    write_experiment("ws_power_probe", args.out, records=recs, rounds=args.rounds,
                     timing="one call a CUDA-graph replay, all sides interleaved in rotated rounds (median)")  # fmt: skip
    labels = ["cublaslt bias+gelu", *VARIANTS]
    print("\ncolumns: " + "; ".join(f"[{i}] {lab}" for i, lab in enumerate(labels)))
    print(f"{'case':20s} {'mm us':>7s} " + " ".join(f"{f'[{i}]':>6s}" for i in range(len(labels))) + "   (time / bare cuBLAS)")
    wins = dict.fromkeys(labels, 0)
    for r in recs:
        mm = r["ms"]["cublas mm alone"]
        cells = []
        for lab in labels:
            t = r["ms"].get(lab)
            cells.append(f"{t / mm:6.3f}" if t else f"{'-':>6s}")
            wins[lab] += bool(t and t <= mm)
        print(f"{r['case']:20s} {mm * 1e3:7.1f} " + " ".join(cells))
    print(f"{'at or under cuBLAS':28s} " + " ".join(f"{wins[lab]:6d}" for lab in labels))
    with_epilogue = [lab for lab, (_, mode, *_) in VARIANTS.items() if mode != "bare"]
    best = [min((t for lab, t in r["ms"].items() if lab in with_epilogue), default=None) for r in recs]
    n_best = sum(1 for r, t in zip(recs, best, strict=True) if t is not None and t <= r["ms"]["cublas mm alone"])
    print(f"best kfuse variant with bias + GELU per shape at or under cuBLAS: {n_best}/{len(recs)}")


if __name__ == "__main__":
    main()
