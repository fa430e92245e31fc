"""Does the ping-pong GEMM (``kfuse/kernels/gemm_ws.py``) overlap one warpgroup's epilogue with the
other's main loop at all?

Session 18's ``ws_epilogue_probe``: bias or ReLU cost 1-5% over no epilogue, but the exact GELU adds
40-75% and the tanh-form GELU 6-12%, while the coop kernel (no overlap by design) pays less for the
exact GELU than ping-pong. Two explanations predict different things here:

* the schedule does not overlap (a synchronisation that serialises the epilogue with the other
  consumer's main loop): an epilogue that only *waits* (``nanosleep``, no arithmetic) adds its full
  length to every tile, as in coop;
* the overlap works but arithmetic in one warpgroup slows the other's main loop (issue slots or
  register-file bandwidth shared with wgmma): a sleeping epilogue is free up to the main loop's
  length (~5 us a 128 x 128 tile at K = 768), while FMA or MUFU work is not.

Variants, per schedule (ping-pong 128 x 128 s4; coop 128 x 256 s3 as the serial control): ReLU (the
base), ReLU then sleeps of 1, 3 and 8 us a tile, ReLU then 24 dependent FMAs a value, ReLU then 4
MUFU ex2 a value (a tile: 16,384 values). Outputs checked where the arithmetic is exact (ReLU, the sleeps); 20 calls a graph.

Result (session 18, ``experiments/s18_ws_overlap_probe.json``, extra us a tile over ReLU in ping-pong):
sleeps of ~1 and ~3 us 0.07-0.39, ~8 us 1.25-2.0 (hidden up to the main loop's length); 4 MUFU ex2 a
value 0.02-0.12 (hidden); 24 FMAs a value 3.0-3.1, as much as in coop (not hidden). The schedule
overlaps; FP32 FMA-pipe work competes with the other warpgroup's wgmma.

    PYTHONPATH=. python benchmarks/experiments/ws_overlap_probe.py --out $OUT   # H200, ~30 s
"""

from __future__ import annotations

import argparse

import torch

from kfuse.bench.harness import graph_ms_per_call, write_experiment
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels import gemm_ws
from kfuse.kernels.codegen import load_generated
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import prepare
from kfuse.kernels.gemm_ws import WsConfig

RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)
HELPERS = """

@gluon.jit
def _sleep(x):
    # one nanosleep per element a thread holds of x; the result is a copy of x
    return gl.inline_asm_elementwise("nanosleep.u32 SLEEP_NS; mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _fma_chain(v, N: gl.constexpr):
    for _ in gl.static_range(N):
        v = v * 0.999 + 0.001
    return v


@gluon.jit
def _ex2_chain(v, N: gl.constexpr):
    for _ in gl.static_range(N):
        v = gl.exp2(v * 0.01)
    return v
"""
RELU_LINE = "acc_r1 = tl.maximum(acc, 0.0)"


def variant_source(kind: str, arg: int) -> str:
    """The ReLU kernel module with extra work after the ReLU in both schedules' epilogues."""
    src = gemm_ws.kernel_source(RELU)
    head, sep, rest = src.partition("tl = gl")
    src = head + sep + HELPERS.replace("SLEEP_NS", str(arg if kind == "sleep" else 0)) + rest
    if kind == "sleep":
        # offs_m (a few row indices a thread) carries the sleeps; kept live by adding 0 of it to acc
        extra = "acc_r1 = acc_r1 + (_sleep(offs_m) * 0).to(gl.float32)[:, None]"
    elif kind == "fma":
        extra = f"acc_r1 = _fma_chain(acc_r1, {arg})"
    elif kind == "ex2":
        extra = f"acc_r1 = _ex2_chain(acc_r1, {arg})"
    else:
        return src
    out = []
    for line in src.split("\n"):
        out.append(line)
        if line.strip() == RELU_LINE:
            out.append(line[: len(line) - len(line.lstrip())] + extra)
    return "\n".join(out)


# each thread holds 4 of offs_m's elements in both schedules (sm_90 SASS: 4 NANOSLEEP per consumer),
# so a tile sleeps ~4x the argument: ~1, ~3 and ~8 us
VARIANTS = [("relu", "base", 0), ("sleep 1us", "sleep", 250), ("sleep 3us", "sleep", 750), ("sleep 8us", "sleep", 2000),
            ("fma x24", "fma", 24), ("ex2 x4", "ex2", 4)]  # fmt: skip
SCHEDULES = [WsConfig("pingpong", 128, 128, 64, 4, 8), WsConfig("coop", 128, 256, 64, 3, 8, 2)]
SHAPES = [("bert_T4096_ffn1", 4096, 3072, 768), ("bert_T16384_ffn1", 16384, 3072, 768)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, dt = "cuda", torch.float16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    mods = {name: load_generated("gemm_ws_overlap", name.replace(" ", "_"), variant_source(kind, arg)) for name, kind, arg in VARIANTS}
    recs = []
    for case, m, n, k in SHAPES:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = (torch.randn(k, n, device=dev) / k**0.5).to(dt)
        ref = torch.relu(a.float() @ b.float())
        rec: dict = {"case": case, "m": m, "n": n, "k": k, "variants": {}}
        for cfg in SCHEDULES:
            for name, kind, _ in VARIANTS:
                label = f"{cfg.describe()} {name}"
                try:
                    out = torch.full((m, n), float("nan"), device=dev, dtype=dt)
                    g = prepare(a, b, [], dt, out)

                    def run(g=g, cfg=cfg, mod=mods[name]) -> torch.Tensor:
                        gemm_ws.run_module(mod, g.a, g.b, g.c, [], cfg, sms)
                        return g.c[0]

                    got = run()
                    err = float((got.float() - ref).abs().max() / ref.abs().max()) if kind in ("base", "sleep") else None
                    ms, _ = graph_ms_per_call(run, (), calls=20, rep=20)
                    rec["variants"][label] = {"ms": ms, "rel_err": err, "ok": err is None or err < 1e-2}
                except Exception as e:  # recorded, not fatal
                    rec["variants"][label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"[{case}] {label}: {rec['variants'][label]}", flush=True)
        recs.append(rec)
    write_experiment("ws_overlap_probe", args.out, records=recs)
    print(f"\n{'case':20s} {'schedule':28s} " + " ".join(f"{v[0]:>10s}" for v in VARIANTS) + "   (us a tile over relu)")
    for r in recs:
        for cfg in SCHEDULES:
            cells = [r["variants"].get(f"{cfg.describe()} {v[0]}", {}) for v in VARIANTS]
            tiles = -(-r["m"] // cfg.block_m) * -(-r["n"] // cfg.block_n)
            per_sm = -(-tiles // sms)
            base = cells[0].get("ms")
            txt = " ".join(f"{c['ms']:10.4f}" if "ms" in c else f"{'error':>10s}" for c in cells)
            over = " ".join(f"{1e3 * (c['ms'] - base) / per_sm:6.2f}" if "ms" in c and base else "     -" for c in cells[1:])
            print(f"{r['case']:20s} {cfg.describe():28s} {txt}   {over}")


if __name__ == "__main__":
    main()
