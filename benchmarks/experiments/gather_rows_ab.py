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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import option_ab  # noqa: E402


def gather_counts(kernels: list[dict[str, Any]]) -> dict[str, int]:
    """PyTorch's copies (cats, rolls), the standalone gathers and the norms with a gather folded in."""
    return {
        "torch_copies": sum(k["template"] == "torch" and bool({"cat", "roll"} & set(k["ops"])) for k in kernels),
        "gathers": sum(k["template"] == "gather_rows" for k in kernels),
        "norms_with_gather": sum(k["template"] == "fused_norm" and "gather_rows" in k["ops"] for k in kernels),
    }


def ab(arch: str, smoke: bool, rounds: int, rep: int) -> dict[str, Any]:
    """``option_ab.ab`` on ``gather_rows``, in this script's record form (``gather_on`` / ``gather_off``)."""
    out = option_ab.ab(arch, "gather_rows", smoke, rounds, rep, counts=gather_counts)
    out["gather_on"], out["gather_off"] = out.pop("on"), out.pop("off")
    del out["option"]
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
