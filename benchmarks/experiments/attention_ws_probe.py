"""The warp-specialised Gluon attention (``kfuse/kernels/attention_ws.py``, built offline in session 24)
against kfuse's Triton kernel and SDPA's backends, in one process.

Question: SDPA's cuDNN backend ran 4-17% faster than the Triton kernel at head dim 64 and 1.3x at 128
(session 24). Does a TMA loader warp with two consumer warpgroups sharing every K/V tile close that, and
does issuing the next tile's scores before this tile's softmax (``pipelined``) add to it? Three tiles,
each plain and pipelined.
Prediction (docs/perf-notes.md, session 24): within 10% of cuDNN at head dim 64 and within 20% at 128;
causal GQA at Llama B8 about cuDNN's 0.042 ms. Every side replayed from its own CUDA graph, rotated
rounds, outputs checked against SDPA; results written after every case (a hang is cut by the caller's
time limit with the finished cases kept).

    PYTHONPATH=. python benchmarks/experiments/attention_ws_probe.py --out $OUT   # H200, ~90 s

Run 1 (session 25, ``experiments/s25_attention_ws_probe.json``): correct, 20-35% slower than the Triton
kernel at head dim 64 and 2% at 128; pipelined no better. Run 2 adds the ``pingpong`` configs (dense):
the two consumers take turns at the tensor cores (FlashAttention-3's inter-warpgroup schedule): within 2%
of plain. Run 3 adds three consumer warpgroups of 64 rows at 160 registers (head dim 64): one program of
two consumers holds 60.7k registers, so one fits an SM; is occupancy what the kernel lacks?
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kfuse.bench.harness import graph_or_plain, interleaved_medians, max_rel_err, time_ms, write_experiment
from kfuse.kernels import attention as A
from kfuse.kernels import attention_ws as W

CASES = [  # b, heads, kv heads, s, d, causal, layout of q/k/v
    (16, 12, 12, 512, 64, False, "bhsd"),
    (8, 12, 12, 512, 128, False, "bhsd"),
    (8, 12, 12, 512, 64, False, "merged"),
    (8, 32, 4, 512, 64, True, "bhsd"),
    (8, 12, 12, 512, 64, True, "bhsd"),
]


def _inputs(b: int, h: int, hk: int, s: int, d: int, layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    if layout == "merged":  # slices of one [B, S, 3, H, D] projection output, as BERT's plan passes them
        qkv = torch.randn(b, s, 3, h, d, generator=gen).to("cuda", torch.float16)
        return tuple(qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))  # type: ignore[return-value]
    q = torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16)
    k, v = (torch.randn(b, hk, s, d, generator=gen).to("cuda", torch.float16) for _ in range(2))
    return q, k, v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for b, h, hk, s, d, causal, layout in CASES:
        case = f"B{b}_H{h}_KV{hk}_S{s}_D{d}_{layout}" + ("_causal" if causal else "")
        print(f"== {case}", flush=True)
        q, k, v = _inputs(b, h, hk, s, d, layout)
        kr, vr = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
        ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        sides, errs, failed = {}, {}, {}
        A.attention(q, k, v, causal=causal)  # the Triton kernel's tile, tuned
        sides["triton"] = graph_or_plain(lambda: A.attention(q, k, v, causal=causal))
        errs["triton"] = max_rel_err(A.attention(q, k, v, causal=causal), ref)
        for cfg in [c for c in W.config_space(d, causal) if (c.block_n, c.stages) in ((128, 2), (128, 3), (64, 3))]:
            name = cfg.describe()
            try:
                o = W.attention_ws(q, k, v, causal=causal, config=cfg)
                torch.cuda.synchronize()
                errs[name] = max_rel_err(o, ref)
                sides[name] = graph_or_plain(lambda cfg=cfg: W.attention_ws(q, k, v, causal=causal, config=cfg))
            except Exception as e:  # not eligible or out of resources
                failed[name] = f"{type(e).__name__}: {str(e)[:160]}"
                torch.cuda.synchronize()
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):

            def run(backend=backend):  # noqa: ANN001, ANN202
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)

            try:
                errs[name] = max_rel_err(run(), ref)
                sides[name] = graph_or_plain(run)
            except Exception as e:  # noqa: BLE001 - backend not available for these inputs
                failed[name] = f"{type(e).__name__}: {str(e)[:160]}"
        ms = interleaved_medians(list(sides), lambda n: time_ms(sides[n], warmup=5, rep=30), args.rounds)
        rows.append({"case": case, "ms": ms, "max_rel_err": errs, "failed": failed})
        for n in sorted(ms, key=ms.__getitem__):
            print(f"  {n:22s} {ms[n] * 1e3:8.2f} us  err {errs.get(n, float('nan')):.1e}", flush=True)
        for n, why in failed.items():
            print(f"  {n:22s} failed: {why}", flush=True)
        write_experiment("attention_ws_probe", args.out, rows=rows, rounds=args.rounds)


if __name__ == "__main__":
    main()
