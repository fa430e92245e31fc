"""Depthwise conv tiles against PyTorch (cuDNN, with its algorithm search) at ConvNeXt-T's and MobileNet-V2's layers.

Session 37: compiled ConvNeXt-T kept PyTorch's depthwise conv for all 18 layers (kfuse's kernel measured
slower), though cuDNN's ``conv2d_c1_k1_nhwc_specialized`` plus its bias add took ~47 us a layer on average,
~10x the memory floor at stage 1. ptxas showed why kfuse's lost: the 49 unrolled taps took 255 registers and
spilled (two programs an SM); the kernel row loop is now rolled. Session 38 added the rows kernel (each input
row loaded once per program, a ring of KH output rows) and EfficientNet-B0's 5x5 layers. This times tiles of
both kernels at each layer, 20 launches in one CUDA graph (per-launch time), beside ``F.conv2d`` with bias,
checks each against it, times what ``depthwise_conv2d`` picks by itself ("auto"), and prints the floor (read +
write once at 4.3 TB/s), so ``launch_config``, ``rows_config`` and ``use_rows`` can be set from the data.

    PYTHONPATH=. python benchmarks/experiments/depthwise_probe.py --out $OUT   # H200, ~3 min
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_ms_per_call
from kfuse.kernels.depthwise import auto_kernel, depthwise_conv2d, pack_rows_weight

# (name, batch, channels, height/width, kernel, stride)
LAYERS = [
    ("convnext_s1", 32, 96, 56, 7, 1), ("convnext_s2", 32, 192, 28, 7, 1), ("convnext_s3", 32, 384, 14, 7, 1),
    ("convnext_s4", 32, 768, 7, 7, 1), ("mbv2_112_c32", 32, 32, 112, 3, 1), ("mbv2_112_c96_s2", 32, 96, 112, 3, 2),
    ("mbv2_56_c144", 32, 144, 56, 3, 1), ("mbv2_28_c192", 32, 192, 28, 3, 1), ("mbv2_14_c576", 32, 576, 14, 3, 1),
    ("mbv2_7_c960", 32, 960, 7, 3, 1), ("effb0_28_c240_k5", 32, 240, 28, 5, 1), ("effb0_14_c672_k5", 32, 672, 14, 5, 1),
    ("effb0_7_c1152_k5", 32, 1152, 7, 5, 1),
]  # fmt: skip
# session 37 scanned 24 tiles of the taps kernel: these four hold the best at every layer within 4%
TAPS_CONFIGS = [(64, 32, 2), (32, 32, 2), (64, 64, 4), (16, 128, 4)]
# the rows kernel (session 38): (BLOCK_W, BLOCK_C, ROWS, warps); 8 fp32 accumulators a thread and ring slot
# is what ptxas fits in 136 registers without spilling (16 took 202)
ROWS_CONFIGS = [(16, 32, 14, 2), (16, 32, 7, 2), (16, 32, 28, 2), (32, 32, 14, 4), (32, 16, 14, 2), (8, 64, 14, 2), (16, 64, 14, 4)]


def per_launch_us(fn: Any) -> float:
    return graph_ms_per_call(fn, (), calls=20, rep=30)[0] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="")
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    dt, rows, summary = torch.float16, [], []
    for name, nb, c, hw, k, s in LAYERS:
        x = torch.randn(nb, c, hw, hw, device="cuda", dtype=dt).contiguous(memory_format=torch.channels_last)
        w = (torch.randn(c, 1, k, k, device="cuda", dtype=dt) / k).contiguous(memory_format=torch.channels_last)
        b = torch.randn(c, device="cuda", dtype=dt)
        pad = k // 2
        want = F.conv2d(x, w, b, s, pad, 1, c)
        torch_us = per_launch_us(lambda: F.conv2d(x, w, b, s, pad, 1, c))
        out = torch.empty_like(want)
        floor_us = (x.numel() + want.numel()) * x.element_size() / 4.3e12 * 1e6
        best = None
        wp = pack_rows_weight(w)
        candidates = [("taps", cfg) for cfg in TAPS_CONFIGS] + ([("rows", cfg) for cfg in ROWS_CONFIGS] if s == 1 else [])
        for kind, cfg in candidates:
            fn = lambda kind=kind, cfg=cfg: depthwise_conv2d(x, w, b, s, pad, 1, out=out, config=cfg, kernel=kind, packed_weight=wp)  # noqa: E731
            out.fill_(float("nan"))
            try:
                us = per_launch_us(fn)
            except Exception as e:  # a config the compiler refuses is recorded, not fatal
                rows.append({"layer": name, "kernel": kind, "config": cfg, "error": str(e)[:200]})
                continue
            err = (out.float() - want.float()).abs().max().item()
            rows.append({"layer": name, "kernel": kind, "config": cfg, "us": us, "err": err})
            if err < 5e-2 and (best is None or us < best[0]):
                best = (us, (kind, cfg))
        out.fill_(float("nan"))
        auto_us = per_launch_us(lambda: depthwise_conv2d(x, w, b, s, pad, 1, out=out, packed_weight=wp))
        auto_err = (out.float() - want.float()).abs().max().item()
        auto = auto_kernel(c, hw, out.shape[2], out.shape[3], k, k, rows_ok=s == 1)
        best_cfg, best_us = (best[1], best[0]) if best else (None, None)
        summary.append({"layer": name, "shape": [nb, c, hw, hw], "k": k, "stride": s, "floor_us": floor_us, "torch_us": torch_us,
                        "auto": auto, "auto_us": auto_us, "auto_err": auto_err, "best": best_cfg, "best_us": best_us})  # fmt: skip
        print(f"{name:16s} floor {floor_us:6.1f} torch {torch_us:7.1f} auto {auto} {auto_us or 0:7.1f} best {best}", flush=True)
        if args.out:  # after every layer: a call cut by its time limit keeps what it measured
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "depthwise_probe.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(f"\n{'layer':16s} {'floor us':>8s} {'torch us':>8s} {'auto us':>8s} {'best us':>8s}  best (kernel, tile)")
    for r in summary:
        print(f"{r['layer']:16s} {r['floor_us']:8.1f} {r['torch_us']:8.1f} {r['auto_us'] or 0:8.1f} {r['best_us'] or 0:8.1f}  {r['best']}")


if __name__ == "__main__":
    main()
