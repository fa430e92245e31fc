"""What do row gathers buy a windowed vision transformer? Each architecture compiled with ``gather_rows`` on and
off (``kfuse.passes.gather_rows``), in one process, timed in alternating rounds.

Prediction (session 41, written before the run): Swin-T B32 fp16 moves about 520 MB less a call (the roll's
two cats and the partition copy folded into the LayerNorm, the reverse copy and cats one gather: 6 passes of
38.5 MB at stage 1, 6 of 19 MB at stage 2, 18 of 9.6 MB at stage 3; stage 4 is one window, a view), 120-175 us
at 3-4.3 TB/s: 2.28 -> 2.10-2.17 ms. Swin-V2-T: its LayerNorm follows the reverse partition (folded), the
forward partition stays a standalone gather: about half of that, -60..-100 us.

    PYTHONPATH=. python benchmarks/experiments/gather_rows_ab.py --out $OUT                       # H200, ~200 s
    PYTHONPATH=. python benchmarks/experiments/gather_rows_ab.py --arch swin --smoke              # CPU check
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo_sweep  # noqa: E402

import kfuse  # noqa: E402
from kfuse.bench.harness import max_rel_err, time_ms  # noqa: E402


def ab(arch: str, smoke: bool, rounds: int, rep: int) -> dict[str, Any]:
    model, a, kw = zoo_sweep.build(arch, smoke, "cpu" if smoke else "cuda", torch.float16 if not smoke else torch.float32)
    out: dict[str, Any] = {"arch": arch, "checkpoint": zoo_sweep.ALL_ARCHS[arch].checkpoint}
    with torch.no_grad():
        ref = zoo_sweep.first_tensor(model(*a, **kw))
        compiled = {}
        for on in (True, False):
            cm = kfuse.compile(model, a, kw, tune="none" if smoke else "fast", gather_rows=on, check=False)
            kernels = cm.report["kernels"]
            compiled[on] = cm
            out[f"gather_{'on' if on else 'off'}"] = {
                "max_rel_err": max_rel_err(zoo_sweep.first_tensor(cm(*a, **kw)), ref),
                "steps": len(kernels),
                "torch_copies": sum(k["template"] == "torch" and bool({"cat", "roll"} & set(k["ops"])) for k in kernels),
                "gathers": sum(k["template"] == "gather_rows" for k in kernels),
                "norms_with_gather": sum(k["template"] == "fused_norm" and "gather_rows" in k["ops"] for k in kernels),
                "pdl_choice": cm.report.get("pdl_choice"),
            }
        if smoke:
            return out
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):  # alternate, each side first in half the rounds
            for on in (True, False) if r % 2 == 0 else (False, True):
                cm = compiled[on]
                times[on].append(time_ms(lambda cm=cm: cm(*a, **kw), 10, rep))
    for on in (True, False):
        side = out[f"gather_{'on' if on else 'off'}"]
        side["ms_rounds"] = times[on]
        side["ms"] = statistics.median(times[on])
    out["gain_us"] = (out["gather_off"]["ms"] - out["gather_on"]["ms"]) * 1e3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="swin,swinv2", help="comma-separated zoo_sweep architectures")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--out", default="")
    p.add_argument("--smoke", action="store_true", help="tiny config on the CPU (interpreter): checks the script, times nothing")
    args = p.parse_args()
    rows = [ab(arch, args.smoke, args.rounds, args.rep) for arch in args.arch.split(",")]
    print(f"{'arch':10s} {'on ms':>8s} {'off ms':>8s} {'gain us':>8s}  steps on/off  gathers  norms+gather  err on/off")
    for r in rows:
        on, off = r["gather_on"], r["gather_off"]
        print(
            f"{r['arch']:10s} {on.get('ms', float('nan')):8.3f} {off.get('ms', float('nan')):8.3f} {r.get('gain_us', float('nan')):8.1f}"
            f"  {on['steps']}/{off['steps']}  {on['gathers']}  {on['norms_with_gather']}  {on['max_rel_err']:.1e}/{off['max_rel_err']:.1e}"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gather_rows_ab.json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
