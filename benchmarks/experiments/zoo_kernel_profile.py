"""Why is a zoo_sweep architecture slower compiled than eager? Kernel-by-kernel time of one call, both ways.

Session 35: OPT-125m (0.88x) and Pythia-160m / GPT-NeoX (0.85x) at B1 S512 fp16 were the two of sixteen timed
architectures kfuse made slower. This builds one architecture as the sweep does, compiles it (tune fast),
profiles a few calls of eager and of the compiled model under ``torch.profiler`` and prints, for each, the
summed kernel time per kernel name (largest first), so the kernels that lose stand out.

    PYTHONPATH=. python benchmarks/experiments/zoo_kernel_profile.py --arch opt --out $OUT   # H200, ~60 s
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo_sweep  # noqa: E402

import kfuse  # noqa: E402
from kfuse.bench.kernel_profile import kernel_table  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True, choices=sorted(zoo_sweep.ALL_ARCHS))
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--out", default="")
    p.add_argument(
        "--sequence", default="", help="also list each launch, in order, of the kernels whose name holds one of these (comma list)"
    )
    args = p.parse_args()
    model, a, kw = zoo_sweep.build(args.arch, False, "cuda", torch.float16)
    record: dict[str, Any] = {"arch": args.arch, "shape": list(a[0].shape)}
    with torch.no_grad():
        cm = kfuse.compile(model, a, kw, tune="fast")
        for label, fn in (("eager", lambda: model(*a, **kw)), ("kfuse", lambda: cm(*a, **kw))):
            seq: list[float] = []
            rows = kernel_table(fn, args.calls, seq, args.sequence)
            busy = sum(us * 1 for _, us, _ in rows)
            print(f"{args.arch} {label}: kernels {busy:.1f} us a call, {sum(c for *_, c in rows)} launches")
            for name, us, c in rows[: args.top]:
                print(f"  {us:8.1f} us  x{c:<3d} {name[:100]}")
            if seq:
                print(f"  each {args.sequence!r} launch, in order (us): " + " ".join(f"{u:.1f}" for u in seq))
            record[label] = {"kernel_us": busy, "kernels": [{"name": n, "us": u, "n": c} for n, u, c in rows], "sequence_us": seq}
    record["report"] = {k: v for k, v in cm.report.items() if isinstance(v, int | float | str)}
    record["plan"] = cm.report.get("kernels", [])  # each step's template and config (measured choices say their times)
    for k in record["plan"]:
        if args.sequence and k.get("template") not in ("torch",) and "us vs" in str(k.get("config", "")):
            print(f"  {k['name']:28s} {k['template']:16s} {k['config']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"zoo_kernel_profile_{args.arch}.json").write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
