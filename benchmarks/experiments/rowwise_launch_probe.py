"""Rows per program and warps for the two row-wise kernels (layer/RMS norm, rotary) at decoder shapes.

Session 36: in OPT-125m at B1 S512 (fp16) kfuse's ``_norm_fwd`` took 7.8 us a call against PyTorch's
3.8 us (512 x 768: 4 rows a program = 128 programs on 132 SMs), and GPT-NeoX's partial ``_rotary_fwd``
7.6 us (6144 rows of 8 + 8 columns, 64 rows a program = 96 programs). Floors: 512 x 768 fp16 read + write
with one residual = 2.4 MB / 4.3 TB/s = 0.55 us; the rotary's 6144 x 16 x 2 B x 2 = 0.4 MB, 0.1 us: both
are latency-bound, so the grid should give every SM several programs. This times each kernel for every
(rows, warps) at each shape, 20 launches captured in one CUDA graph (per-launch time, graph overhead
amortised), beside PyTorch's own op, so the two ``launch_config`` rules can be set from the data.

    PYTHONPATH=. python benchmarks/experiments/rowwise_launch_probe.py --out $OUT   # H200, ~60 s
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton

from kfuse.bench.harness import graph_ms_per_call
from kfuse.kernels import norm as norm_mod
from kfuse.kernels import rotary as rot_mod

NORM_SHAPES = [(512, 768), (512, 2048), (512, 4096), (2048, 768), (4096, 768), (4096, 1024), (16384, 768), (8192, 4096)]
# (batch, heads, seq, rotated dims of a head of `head` dims): NeoX's partial rotary, Llama's whole head
ROT_SHAPES = [(1, 12, 512, 16, 64), (1, 32, 512, 128, 128), (8, 12, 128, 64, 64), (1, 16, 2048, 64, 64)]


def per_launch_us(fn: Any, launches: int = 20, rep: int = 30) -> float:
    return graph_ms_per_call(fn, (), calls=launches, rep=rep)[0] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="")
    args = p.parse_args()
    dt, rows_out = torch.float16, []
    torch.manual_seed(0)
    for m, n in NORM_SHAPES:
        x, r = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(m, n, device="cuda", dtype=dt)
        w, b = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        want = torch.nn.functional.layer_norm((x.float() + r.float()), (n,), w.float(), b.float())
        torch_us = per_launch_us(lambda: torch.nn.functional.layer_norm(x, (n,), w, b))
        auto = norm_mod.launch_config(m, triton.next_power_of_2(n))
        best = None
        for rows in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8):
                if rows * triton.next_power_of_2(n) > 16384 or rows * triton.next_power_of_2(n) < 32 * warps:
                    continue
                fn = lambda rows=rows, warps=warps: norm_mod.norm(x, [r], w, b, out=y, rows=rows, num_warps=warps)  # noqa: E731
                us = per_launch_us(fn)
                err = ((y.float() - want).abs().max()).item()
                rows_out.append({"kernel": "norm", "m": m, "n": n, "rows": rows, "warps": warps, "us": us, "err": err})
                best = min(best or (us, rows, warps), (us, rows, warps))
        key = (m, n, *auto)
        auto_us = next(o["us"] for o in rows_out if o["kernel"] == "norm" and (o["m"], o["n"], o.get("rows"), o.get("warps")) == key)
        rows_out.append({"kernel": "norm", "m": m, "n": n, "torch_us": torch_us, "auto": auto, "auto_us": auto_us, "best": best})
        print(f"norm {m:6d} x {n:5d}: torch {torch_us:6.2f} us  now {auto} {auto_us:6.2f}  best rows {best[1]} w{best[2]} {best[0]:6.2f}")
    for bsz, h, s, rd, hd in ROT_SHAPES:
        qkv = torch.randn(bsz, s, h, 3 * hd, device="cuda", dtype=dt)
        x = qkv[..., :rd].transpose(1, 2)  # the rotated part of q, a strided view as in the models
        cos = torch.randn(s, rd, device="cuda", dtype=dt)
        sin = torch.randn(s, rd, device="cuda", dtype=dt)
        o = torch.empty(x.shape, device="cuda", dtype=dt)
        want = rot_mod.reference(x.float(), cos.float(), sin.float())
        half = rd // 2
        x1, x2 = x[..., :half], x[..., half:]
        torch_us = per_launch_us(lambda: x * cos + torch.cat((-x2, x1), -1) * sin)
        n_rows = bsz * h * s
        block_h = max(16, triton.next_power_of_2(half))
        auto = rot_mod.launch_config(n_rows, block_h)
        best = None
        for br in (2, 4, 8, 16, 32, 64):
            for warps in (1, 2, 4):
                if br * block_h < 32 * warps:
                    continue
                us = per_launch_us(lambda br=br, warps=warps: rot_mod.rotary(x, cos, sin, out=o, block_r=br, num_warps=warps))
                err = (o.float() - want).abs().max().item()
                rows_out.append({"kernel": "rotary", "shape": [bsz, h, s, rd], "block_r": br, "warps": warps, "us": us, "err": err})
                best = min(best or (us, br, warps), (us, br, warps))
        auto_us = next(o_["us"] for o_ in rows_out if o_["kernel"] == "rotary" and o_["shape"] == [bsz, h, s, rd]
                       and (o_.get("block_r"), o_.get("warps")) == auto)  # fmt: skip
        shape = [bsz, h, s, rd]
        rows_out.append({"kernel": "rotary", "shape": shape, "torch_us": torch_us, "auto": auto, "auto_us": auto_us, "best": best})
        print(f"rotary {shape}: torch (3 ops) {torch_us:6.2f} us  now {auto} {auto_us:6.2f}  best r{best[1]} w{best[2]} {best[0]:6.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "rowwise_launch_probe.json").write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
