"""Issue 8 on the GPU: do tail-fill BE programs slow the LC GEMM blocks they share an SM with?

Session 10 measured BERT-base's N=768 GEMMs (1024 x 768, 48 tiles of 128 x 128 on a grid of 264
persistent programs) fused with hotspot in ``tail`` mode: at a load ratio x = T_be / T_lc of 1.0 the
fused launch took 1.38 T_lc, although the 84 SMs without an LC tile could have run that BE slice
in T_lc or less. If the first wave places program p and p + 132 on one SM, each LC tile shares its
SM with a BE program under ``tail``; ``tailx`` leaves those partners idle. This probe

1. reads ``%smid`` in a grid of two programs per SM (32 warps each: two fill an SM's 64 warps) and
   counts how often programs p and p + S share an SM;
2. times each BERT-base GEMM shape alone, each BE slice alone, and the fused launch in ``tail`` and
   ``tailx`` mode at x in {0.25, 0.5, 0.75, 1, 1.5}, with outputs checked against the separate runs;
3. times the BE slice inside the fused kernel with an empty LC range: the fused kernel's own BE rate
   (8 warps, two programs per SM) against the BE kernel's (4 warps, four per SM).

Prediction: p and p + S share an SM in >= 95% of pairs; on the 48-tile shapes ``tailx`` cuts the
fused time at x = 0.5-1.0 by 10-25% against ``tail`` (toward T_lc at x <= 0.6); on the 144/192-tile
shapes the two are the same kernel path (no program is skipped) and agree within noise.
Measured (session 10, `experiments/s10_tail_placement_probe.json`): 24 of 132 pairs share an SM;
``tailx`` is slower on the 48-tile shapes (1.56 vs 1.46 T_lc at x = 1); the 144/192-tile shapes agree
within 1%; the BE slice in the fused kernel runs at its solo rate. Refuted.

``tailsm`` keeps BE work off the SMs that run LC blocks, by ``%smid``. Session 11's first version (LC
blocks by ticket too) took 1.66-1.82 T_lc at x = 0.25 on the 48-tile shapes (LC tiles doubled up on SMs);
the second spread the tiles one per SM (trace: 48 SMs) but cost 1.39 T_lc at x = 0 and 1.41 at x = 0.5 on
1024x768x768: nearly free BE work behind a fixed ~4 us of serial atomics around each LC tile
(`experiments/s12_tail_placement_probe.json`). Now the LC keeps the solo kernel's static blocks and only
raises a per-SM flag (fire-and-forget atomics); BE programs wait while their SM's flag is up. For
``tailsm`` the probe records each LC tile's SM (``trace``) and prints the spread; x = 0 (one BE block)
shows each mode's own overhead. Prediction: ``tailsm`` <= 1.05 T_lc at x = 0 on every shape; on the
48-tile shapes <= 1.10 at x <= 0.5 and 1.3-1.45 at x = 1; on 8x768x768 (6 tiles) <= 1.10 up to x = 1;
on the 144/192-tile shapes within 5% of ``tail`` at x <= 0.25.

    PYTHONPATH=. python benchmarks/experiments/tail_placement_probe.py --out $OUT    # H200, ~60 s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from kfuse.bench.harness import gpu_name
from kfuse.colocate import workloads
from kfuse.colocate.cuda_backend import timed
from kfuse.colocate.fuser import TAIL, TAILSM, TAILX, launch_fused, overlap
from kfuse.colocate.predictor import LinearModel
from kfuse.colocate.ptb import gemm_kernel, launch_ptb, num_sms

SHAPES = ((1024, 768, 768), (1024, 768, 3072), (1024, 2304, 768), (1024, 3072, 768), (8, 768, 768))
RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)  # x = 0: one BE block, the mode's own overhead
MODES = {"tail": TAIL, "tailx": TAILX, "tailsm": TAILSM}
DEFAULT_MODES = "tail,tailsm"  # tailx: refuted in session 10, run with --modes tail,tailx,tailsm


@triton.jit
def smid_kernel(out_ptr, spin):
    pid = tl.program_id(0)
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    # hold the slot so that the whole first wave is resident before any program exits
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    t = t0
    while t - t0 < spin:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(out_ptr + pid, smid)


def placement(sms: int) -> dict[str, Any]:
    out = torch.full((2 * sms,), -1, dtype=torch.int32, device="cuda")
    smid_kernel[(2 * sms,)](out, 200_000, num_warps=32)  # 200 us of spin
    torch.cuda.synchronize()
    s = out.cpu().tolist()
    same = sum(s[p] == s[p + sms] for p in range(sms))
    return {"smid": s, "pairs_same_sm": same, "pairs": sms, "distinct_in_first_half": len(set(s[:sms]))}


def med(f: Any, reps: int = 9) -> float:
    f()
    return float(np.median([timed(f) for _ in range(reps)]))


def probe_shape(m: int, n: int, k: int, be_name: str, sms: int, modes: tuple[Any, ...]) -> list[dict[str, Any]]:
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16) / k**0.5
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    lc = gemm_kernel(a, b, c)
    w = workloads.make(be_name, device="cuda")
    be = w.kernel
    lc_grid, be_grid = 2 * sms, 4 * sms
    t_lc = med(lambda: launch_ptb(lc, 0, lc.n_blocks, lc_grid))
    counts = sorted({max(1, be.n_blocks * f // 8) for f in (1, 2, 4, 8)})
    be_fit = LinearModel.fit(counts, [med(lambda n_=n_: launch_ptb(be, 0, n_, be_grid)) for n_ in counts])
    launch_ptb(lc, 0, lc.n_blocks, lc_grid)
    expect_lc = c.clone()
    rows = []
    for x in RATIOS:
        nb = min(be.n_blocks, max(1, int(be_fit.blocks_for(x * t_lc))))
        w.reset()
        launch_ptb(be, 0, nb, be_grid)
        expect_be = w.output().clone()
        t_be = med(lambda nb=nb: launch_ptb(be, 0, nb, be_grid))
        row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "be": be_name, "x": x, "lc_blocks": lc.n_blocks, "be_blocks": nb,
                               "t_lc_ms": t_lc, "t_be_ms": t_be}  # fmt: skip
        for v in modes:
            c.fill_(float("nan"))
            w.reset()
            launch_fused(lc, be, v, be_range=(0, nb), sms=sms)
            torch.cuda.synchronize()
            # a partial BE slice leaves the rest of its poisoned (NaN) output untouched: NaN must equal NaN there
            ok = bool(torch.equal(c, expect_lc)) and bool(torch.allclose(w.output(), expect_be, rtol=1e-5, atol=1e-6, equal_nan=True))
            t_f = med(lambda v=v, nb=nb: launch_fused(lc, be, v, be_range=(0, nb), sms=sms))
            row[v.mode] = {"t_fused_ms": t_f, "y": t_f / t_lc, "overlap": overlap(t_lc, t_be, t_f), "ok": ok}
            if v.mode == "tailsm":  # where the LC blocks ran: spread over as many SMs as they need?
                trace = torch.full((lc.n_blocks,), -1, dtype=torch.int32, device="cuda")
                launch_fused(lc, be, v, be_range=(0, nb), sms=sms, trace=trace)
                per_sm = np.bincount(trace.cpu().numpy().clip(0))
                row[v.mode] |= {"lc_sms": int((per_sm > 0).sum()), "lc_max_per_sm": int(per_sm.max())}
        # the BE slice alone inside the fused kernel (empty LC range): its rate at 8 warps, 2 programs per SM
        row["be_in_fused_ms"] = med(lambda nb=nb: launch_fused(lc, be, TAIL, lc_range=(0, 0), be_range=(0, nb), sms=sms))
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--be", default="hotspot,stencil7")
    p.add_argument("--modes", default=DEFAULT_MODES, help="fused modes to time (tail, tailx, tailsm)")
    a = p.parse_args()
    if unknown := [m for m in a.modes.split(",") if m not in MODES]:
        p.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    modes = tuple(MODES[m] for m in a.modes.split(","))
    if not torch.cuda.is_available():
        sys.exit("tail_placement_probe needs a CUDA GPU")
    sms = num_sms()
    t0 = time.time()
    try:
        place = placement(sms)
    except Exception as e:  # noqa: BLE001 - the timing part does not depend on it
        place = {"error": repr(e)}
    rows = [r for m, n, k in SHAPES for be in a.be.split(",") for r in probe_shape(m, n, k, be, sms, modes)]
    res = {"experiment": "tail_placement_probe", "gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
           "sms": sms, "placement": place, "rows": rows, "seconds": time.time() - t0}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tail_placement_probe.json").write_text(json.dumps(res, indent=1))
    if "error" in place:
        print(f"placement probe failed: {place['error']}")
    else:
        print(f"placement: programs p and p+{sms} on one SM in {place['pairs_same_sm']}/{sms} pairs; "
              f"{place['distinct_in_first_half']} distinct SMs among programs 0..{sms - 1}")  # fmt: skip
    head = ("shape", "be", "x", "t_lc", "t_be", "be_in_f", *(f"{v.mode} y" for v in modes), *(f"ov {v.mode}" for v in modes))
    widths = (16, 9, 5, 7, 7, 7, *(8,) * (2 * len(modes)))
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)) + " ok")
    for r in rows:
        cells = [f"{r['shape']:>16}", f"{r['be']:>9}", f"{r['x']:5.2f}"]
        cells += [f"{r[k]:7.4f}" for k in ("t_lc_ms", "t_be_ms", "be_in_fused_ms")]
        cells += [f"{r[v.mode]['y']:8.3f}" for v in modes] + [f"{r[v.mode]['overlap']:+8.1%}" for v in modes]
        sm = r.get("tailsm", {})
        spread = f" LC on {sm['lc_sms']} SMs, <= {sm['lc_max_per_sm']} an SM" if "lc_sms" in sm else ""
        print(" ".join(cells), all(r[v.mode]["ok"] for v in modes), spread)


if __name__ == "__main__":
    main()
