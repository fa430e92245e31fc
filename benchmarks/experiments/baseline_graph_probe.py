"""Why do the PyTorch baselines of the transformer records look wrong? (session 25)

The records show eager in a CUDA graph *slower* than plain eager on the Hugging Face transformers
(ViT-B/16 B64: 18.3 against 6.6 ms; BERT-base B8 S512: 9.55 against 4.56) and ``torch.compile``
slower than eager there too (12.2, 5.41), while on ResNet-50 the graph is faster, as it should be. Same
kernels replayed from a graph cannot take 3x longer, so the graph must run different kernels or the
timing is wrong. This probe times each baseline twice in rotated order (an order or clock effect
shows as a moved time), checks outputs against eager, and lists the top CUDA kernels of one call of
each under ``torch.profiler``, with the SDPA backend flags of the process.

    PYTHONPATH=. python benchmarks/experiments/baseline_graph_probe.py --out $OUT   # H200, ~90 s

Run 1 found it (``experiments/s25_baseline_graph_probe.json``): under capture and compile the
transformers models ran attention as FP32 GEMMs (SDPA's math backend), because transformers builds
an all-true mask there (``kfuse/bench/hf_masks.py``). ``--fixed`` (run 2) times eager in a CUDA graph
with and without that fix on the four transformer models, lists the fixed graph's kernels, and shows
which SDPA backend each mask form gets (HF's expanded all-true mask, the same contiguous, an additive
fp16 mask) and what HF's padded BERT runs in eager.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from kfuse.bench.harness import cuda_graph_callable, max_rel_err, time_ms, write_experiment
from kfuse.models import zoo

CASES = [("vit-b16", 64, None), ("bert-base", 8, 512), ("resnet50", 64, None)]


def top_kernels(call: Any, n: int = 8) -> list[dict[str, Any]]:
    """The ``n`` CUDA kernels with the most device time in one call (after a warm call)."""
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        call()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dev and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"kernel": e.key[:110], "calls": e.count, "us": round(dev, 1)})
    rows.sort(key=lambda r: -r["us"])
    total = round(sum(r["us"] for r in rows), 1)
    return [{"total_us": total, "kernels": len(rows)}] + rows[:n]


FIXED_CASES = [("vit-b16", 64, None), ("bert-base", 8, 512), ("gpt2-small", 8, 512), ("llama-1b", 1, 512)]


def mask_forms() -> list[dict[str, Any]]:
    """The SDPA backend (top kernel) and time of one fp16 call for each mask form."""
    b, h, s, d = 16, 12, 512, 64
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    keep = torch.rand(b, 1, 1, s, device="cuda") > 0.3
    forms = {
        "none": None,
        "hf_all_true_expanded": torch.ones(1, 1, 1, 1, dtype=torch.bool, device="cuda").expand(b, 1, s, s),
        "all_true_contiguous": torch.ones(b, 1, s, s, dtype=torch.bool, device="cuda"),
        "padding_bool_expanded": keep.expand(b, 1, s, s),
        "padding_bool_contiguous": keep.expand(b, 1, s, s).contiguous(),
        "padding_additive_fp16": torch.zeros(b, 1, 1, s, device="cuda", dtype=torch.float16).masked_fill(~keep, -1e4),
    }
    rows = []
    for name, mask in forms.items():
        call = lambda mask=mask: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        top = top_kernels(call, 2)
        rows.append({"mask": name, "ms": round(time_ms(call, 5, 20), 4), "top": top})
        print(f"  mask {name:24s} {rows[-1]['ms']:.4f} ms  {top[1]['kernel'][:80] if len(top) > 1 else ''}", flush=True)
    return rows


def fixed(out: str) -> None:
    """Run 2: eager in a CUDA graph with and without the mask fix; the mask forms; padded BERT."""
    from kfuse.bench.hf_masks import hf_masks_skipped_when_absent

    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"rows": rows}
    result["mask_forms"] = mask_forms()
    for name, batch, seq in FIXED_CASES:
        m, a, kw = zoo.build(name, batch=batch, seq=seq, dtype=torch.float16, device="cuda")
        with torch.no_grad():
            ref = m(*a, **kw)
            calls = {"eager": lambda m=m, a=a, kw=kw: m(*a, **kw), "graph_stock": cuda_graph_callable(m, a, kw)}
            with hf_masks_skipped_when_absent():
                calls["graph_fixed"] = cuda_graph_callable(m, a, kw)
            rec: dict[str, Any] = {"case": f"{name}_B{batch}" + (f"_S{seq}" if seq else "")}
            for rnd in range(2):
                for side in list(calls) if rnd == 0 else list(calls)[::-1]:
                    rec.setdefault(f"{side}_ms", []).append(round(time_ms(calls[side], 5, 20), 4))
            for side, call in calls.items():
                rec[f"{side}_err"] = max_rel_err(call(), ref)
            rec["graph_fixed_top"] = top_kernels(calls["graph_fixed"], 6)
        rows.append(rec)
        print({k: v for k, v in rec.items() if not k.endswith("_top")}, flush=True)
        for r in rec["graph_fixed_top"][1:4]:
            print(f"     {r['us']:9.1f} us x{r['calls']:3d} {r['kernel'][:90]}", flush=True)
        write_experiment("baseline_graph_probe_fixed", out, **result)
        del m, calls
        torch.cuda.empty_cache()
    m, a, kw = zoo.build("bert-base", batch=16, seq=512, dtype=torch.float16, device="cuda", with_mask=True, avg_len_ratio=0.6)
    with torch.no_grad():
        result["bert_padded_eager_top"] = top_kernels(lambda: m(*a, **kw), 6)
    print("bert-base B16 S512 padded, eager:", result["bert_padded_eager_top"][:4], flush=True)
    write_experiment("baseline_graph_probe_fixed", out, **result)
    print("\ncase                 eager  graph_stock  graph_fixed (ms, rounds 1/2)")
    for r in rows:
        print(f"{r['case']:18s} {r['eager_ms']} {r['graph_stock_ms']} {r['graph_fixed_ms']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--fixed", action="store_true", help="run 2: the graph with and without the mask fix")
    args = ap.parse_args()
    if args.fixed:
        fixed(args.out)
        return
    flags = {
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "math": torch.backends.cuda.math_sdp_enabled(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    }
    print("sdpa flags", flags, flush=True)
    rows: list[dict[str, Any]] = []
    for name, batch, seq in CASES:
        t0 = time.perf_counter()
        m, a, kw = zoo.build(name, batch=batch, seq=seq, dtype=torch.float16, device="cuda")
        impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
        with torch.no_grad():
            ref = m(*a, **kw)
            calls = {"eager": lambda m=m, a=a, kw=kw: m(*a, **kw)}
            calls["eager_cudagraph"] = cuda_graph_callable(m, a, kw)
            torch._dynamo.reset()
            comp = torch.compile(m)
            calls["compile"] = lambda c=comp, a=a, kw=kw: c(*a, **kw)
            calls["compile"]()
            rec: dict[str, Any] = {"case": f"{name}_B{batch}" + (f"_S{seq}" if seq else ""), "attn_implementation": impl}
            order = list(calls)
            for rnd in range(2):  # two rounds, the second in reverse: an order effect moves a side's time
                for side in order if rnd == 0 else order[::-1]:
                    rec.setdefault(f"{side}_ms", []).append(round(time_ms(calls[side], 5, 20), 4))
            for side, call in calls.items():
                rec[f"{side}_err"] = max_rel_err(call(), ref)
                rec[f"{side}_top"] = top_kernels(call)
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(rec)
        print({k: v for k, v in rec.items() if not k.endswith("_top")}, flush=True)
        for side in calls:
            print(f"  {side}: {rec[f'{side}_top'][0]}", flush=True)
            for r in rec[f"{side}_top"][1:5]:
                print(f"     {r['us']:9.1f} us x{r['calls']:3d} {r['kernel'][:90]}", flush=True)
        write_experiment("baseline_graph_probe", args.out, flags=flags, rows=rows)
        del m, calls, comp
        torch.cuda.empty_cache()
    print("\ncase                 eager  graph  compile (ms, rounds 1/2)")
    for r in rows:
        print(f"{r['case']:18s} {r['eager_ms']} {r['eager_cudagraph_ms']} {r['compile_ms']}")


if __name__ == "__main__":
    main()
