"""Probe for the illegal memory access seen once in padding-free bert-base B16 S512 (GPU only).

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python benchmarks/experiments/varlen_crash_probe.py --batch 16 --seq 512

Compiles the model with an attention mask (kfuse checks it against PyTorch), calls it once more,
and prints the compile report's choices for the packed plan, so a failing launch shows its stack.
"""

from __future__ import annotations

import argparse
import traceback

import torch

import kfuse
import kfuse.models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    m, args, kwargs = kfuse.models.build(
        "bert-base", batch=a.batch, seq=a.seq, dtype=torch.float16, device="cuda", with_mask=True, avg_len_ratio=0.6
    )
    before = {k: v.clone() for k, v in m.state_dict().items()}
    try:
        compiled = kfuse.compile(m, args, kwargs, tune="fast", check=False)
        torch.cuda.synchronize()
        for k, v in m.state_dict().items():  # did kfuse write into the model's own tensors?
            if not torch.equal(v, before[k]):
                bad = (v != before[k]).reshape(-1).nonzero().reshape(-1)
                print(f"CHANGED {k} {tuple(v.shape)} {v.dtype}: {bad.numel()} elements, first {bad[:8].tolist()}", flush=True)
        print("model tensors checked", flush=True)
        print("cuda graph:", compiled.report["cuda_graph"], "max_rel_err", compiled.report.get("max_rel_err"), flush=True)
        v = list(compiled.variants.values())[-1]
        step = next(s for s in v.plan.steps if s.info.template == "varlen_region")
        state = step.fn.region_state
        print("region note:", state["runner"].note, "buckets:", sorted(state["runner"].buckets), flush=True)
        inner = state["plan"]
        seen = {}
        for s in inner.steps:
            seen[s.info.template] = seen.get(s.info.template, 0) + 1
        print("packed plan templates:", seen, flush=True)
        with torch.no_grad():
            out = compiled(*args, **kwargs)
        torch.cuda.synchronize()
        print("second call ok", tuple(out[0].shape), flush=True)
    except Exception:  # noqa: BLE001 - a probe: print the stack
        traceback.print_exc()
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
