"""LLM decoding with a static KV cache: one generated token a step, the loop most inference serves.

A Llama decoder with TinyLlama-1.1B's shape (random weights, fp16) is prefilled eagerly into a Hugging Face
``StaticCache``; then one decode step (one token per sequence, the cache written at its position) is timed
side by side in one process: PyTorch eager, eager in a CUDA graph, ``torch.compile`` default and
``mode="reduce-overhead"`` (what transformers compiles a static-cache ``generate`` with), and kfuse as
``torch.compile``'s backend. Each side has its own cache, prefilled the same way. Correctness in the same run:
each side's logits and the cache slot it wrote against eager's. Then whole ``generate`` calls, ms per new token,
for eager, transformers' own compile and kfuse (``compile_config=CompileConfig(backend="kfuse")``).
The harness is ``kfuse.bench.decode`` (also behind ``kfuse generate``).

    PYTHONPATH=. python benchmarks/decode_bench.py --out $OUT              # H200
    PYTHONPATH=. python benchmarks/decode_bench.py --out /tmp/o --smoke    # CPU wiring check (interpreter)

Floor of a step: the weights once (1.03 G parameters past the embedding table, of which a step reads B rows:
2.07 GB in fp16) and the cache's keys and values (23 MB a sequence at 1,024 slots), ``floor_ms``: 0.487 ms at
B1, 0.524 ms at B8; the FLOPs (2 x parameters x batch) are far under it at these batches.
"""

from __future__ import annotations

import argparse
import os
import sys

if "--smoke" in sys.argv:
    import torch as _t

    if not _t.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch

import kfuse  # noqa: F401 - registers the "kfuse" torch.compile backend
from kfuse.bench.decode import ABLATIONS, SIDES, build, decode_case
from kfuse.bench.harness import make_record, write_results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--cache", type=int, default=1024, help="static cache slots")
    p.add_argument("--sides", default=",".join(SIDES + tuple(ABLATIONS)), help="PyTorch sides, kfuse, and kfuse A/B variants")
    p.add_argument("--generate", type=int, default=64, help="new tokens per generate call (0: skip)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--profile", default="", help="sides whose step is also profiled kernel by kernel (GPU; e.g. kfuse,eager_cudagraph)")
    p.add_argument("--smoke", action="store_true", help="llama-tiny on the CPU (interpreter), eager and kfuse only")
    args = p.parse_args()
    if args.smoke:
        args.model, args.batches, args.prompt, args.cache, args.generate = "llama-tiny", "2", 6, 40, 3
        args.warmup, args.rep = 0, 1
    command = "PYTHONPATH=. python benchmarks/decode_bench.py " + " ".join(sys.argv[1:])
    gpu = torch.cuda.is_available() and not args.smoke
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    model = build(args.model, dtype, device)
    records = []
    for b in (int(x) for x in args.batches.split(",")):
        print(f"== decode {args.model} B{b} prompt {args.prompt} cache {args.cache} ({dtype}, {device})", flush=True)
        r = decode_case(model, b, args.prompt, args.cache, tuple(args.sides.split(",")), args.generate, args.warmup, args.rep,
                        log=lambda s: print(s, flush=True), profile=tuple(filter(None, args.profile.split(","))))  # fmt: skip
        case = f"{args.model}_B{b}_P{args.prompt}_L{args.cache}"
        extra = {k: v for k, v in r.items() if k not in ("kfuse_ms", "baselines_ms", "floor_ms", "max_rel_err")}
        records.append(make_record("decode", case, r["kfuse_ms"], r["baselines_ms"], r["floor_ms"], r["max_rel_err"], command,
                                   dtype="fp16" if gpu else "fp32", model=args.model, smoke=bool(args.smoke), **extra))  # fmt: skip
    path = write_results("decode" + ("_smoke" if args.smoke else ""), records, args.out)
    print(f"\n{'case':28s} {'kfuse ms':>9s} {'best PyTorch':>22s} {'floor':>7s} {'speedup':>8s}")
    for r in records:
        base = min(r["baselines_ms"].items(), key=lambda kv: kv[1]) if r["baselines_ms"] else ("-", float("nan"))
        k = r["kfuse_ms"] or float("nan")
        print(f"{r['case']:28s} {k:9.4f} {base[0]:>12s} {base[1]:9.4f} {r['floor_ms']:7.4f} {base[1] / k:7.2f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
