"""Does kfuse's depthwise kernel make a whole model faster? One architecture compiled with and without it, in
one process, with programmatic dependent launch on and off.

Session 39: ConvNeXt-T B32 took kfuse's taps kernel at all 18 depthwise layers (session 38: 3 of 18), each
timed faster than cuDNN + bias at compile (89.1 vs 97.3 us at stage 1, 33.2 vs 37.0 at stage 3), about 120 us
a call in sum, yet the model ran 1.953 ms against session 38's 1.933. Under the profiler, blocks 2 and 3 of
stage 1 read 162 us a launch against 83 for block 1: with PDL a kernel starts before its predecessor ends, so
a launch's span holds its wait. Prediction: with the kernel off the model is ~0.1 ms slower (if the in-model
gain is what compile timed) or about the same (if the layer times do not add up in the model); PDL off
changes the model by a few percent either way.

    PYTHONPATH=. python benchmarks/experiments/depthwise_model_ab.py --arch convnext --out $OUT   # H200, ~120 s (--pdl-off-too: ~200 s)
    PYTHONPATH=. python benchmarks/experiments/depthwise_model_ab.py --arch convnext --pdl-off-too --profile --out $OUT
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
import kfuse.kernels.conv as conv  # noqa: E402
from kfuse.bench.harness import max_rel_err, time_ms  # noqa: E402
from kfuse.bench.kernel_profile import kernel_table  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="convnext", choices=sorted(zoo_sweep.ARCHS))
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--out", default="")
    p.add_argument("--pdl-off-too", action="store_true", help="also compile each with PDL off (two more compiles)")
    p.add_argument("--profile", action="store_true", help="kernel time by name for each variant, side by side (spans add up with PDL off)")
    p.add_argument("--smoke", action="store_true", help="tiny config on the CPU (interpreter): checks the script, times nothing real")
    args = p.parse_args()
    model, a, kw = zoo_sweep.build(args.arch, args.smoke, "cpu" if args.smoke else "cuda", torch.float16)
    is_depthwise = conv.is_depthwise
    rows: list[dict[str, Any]] = []
    tables: dict[tuple[bool, bool], dict[str, float]] = {}
    with torch.no_grad():
        ref = zoo_sweep.first_tensor(model(*a, **kw))
        for depthwise in (True, False):
            # off: every depthwise conv is left to PyTorch's lowering (cuDNN, bias added by PyTorch)
            conv.is_depthwise = is_depthwise if depthwise else (lambda *_: False)
            for pdl in (True, False) if args.pdl_off_too else (True,):
                cm = kfuse.compile(model, a, kw, tune="none" if args.smoke else "fast", pdl=pdl)
                err = max_rel_err(zoo_sweep.first_tensor(cm(*a, **kw)), ref)
                ms = time_ms(lambda cm=cm: cm(*a, **kw), 10, args.rep)
                n_dw = sum(k["template"] == "depthwise_conv" for k in cm.report["kernels"])
                rows.append({"depthwise_kernel": depthwise, "pdl": pdl, "ms": ms, "max_rel_err": err, "depthwise_launches": n_dw})
                print(f"depthwise kernel {depthwise!s:5s} pdl {pdl!s:5s}: {ms:.3f} ms  err {err:.1e}  kfuse depthwise {n_dw}", flush=True)
                if depthwise and pdl:
                    first = cm
                if args.profile and not args.smoke:
                    tables[(depthwise, pdl)] = {n: us for n, us, _ in kernel_table(lambda cm=cm: cm(*a, **kw), 10)}
        conv.is_depthwise = is_depthwise
        # the first compiled model timed again: how far the timing drifts within the run
        rows.append({"depthwise_kernel": True, "pdl": True, "ms": time_ms(lambda: first(*a, **kw), 10, args.rep), "repeat": True})
        print(f"repeat of the first: {rows[-1]['ms']:.3f} ms")
    side_by_side(tables)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        out = {"arch": args.arch, "rows": rows, "kernel_us": {f"depthwise={d} pdl={q}": t for (d, q), t in tables.items()}}
        Path(args.out, f"depthwise_model_ab_{args.arch}.json").write_text(json.dumps(out, indent=1))


def side_by_side(tables: dict[tuple[bool, bool], dict[str, float]]) -> None:
    """Per kernel name, microseconds a call with kfuse's depthwise kernel and without, at each PDL setting:
    the neighbours whose time moves show what the depthwise kernel does to them (cache, layout)."""
    for pdl in (True, False):
        on, off = tables.get((True, pdl)), tables.get((False, pdl))
        if on is None or off is None:
            continue
        print(
            f"pdl {pdl}: kernel us a call, with / without kfuse's depthwise kernel (sum {sum(on.values()):.1f} / {sum(off.values()):.1f})"
        )
        for name in sorted(set(on) | set(off), key=lambda n: -max(on.get(n, 0.0), off.get(n, 0.0)))[:16]:
            print(f"  {on.get(name, 0.0):8.1f} {off.get(name, 0.0):8.1f}  {name[:90]}")


if __name__ == "__main__":
    main()
