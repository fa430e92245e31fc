"""LLM decoding with a static KV cache: one generated token a step, the loop most inference serves.

A Llama decoder with TinyLlama-1.1B's shape (random weights, fp16) is prefilled eagerly into a Hugging Face
``StaticCache``; then one decode step (one token per sequence, the cache written at its position) is timed
side by side in one process: PyTorch eager, eager in a CUDA graph, ``torch.compile`` default and
``mode="reduce-overhead"`` (what transformers compiles a static-cache ``generate`` with), and kfuse as
``torch.compile``'s backend. Each side has its own cache, prefilled the same way. Correctness in the same run:
each side's logits and the cache slot it wrote against eager's. Then whole ``generate`` calls, ms per new token,
for eager, transformers' own compile and kfuse (``compile_config=CompileConfig(backend="kfuse")``).

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
import time
from typing import Any

if "--smoke" in sys.argv:
    import torch as _t

    if not _t.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch

import kfuse  # noqa: F401 - registers the "kfuse" torch.compile backend
from kfuse.bench.harness import cuda_graph_callable, floor_ms, make_record, max_rel_err, time_ms, write_results
from kfuse.models.llama import CONFIGS

SIDES = ("eager", "eager_cudagraph", "compile", "compile_cudagraphs", "kfuse")
_MODES = {"compile": None, "compile_cudagraphs": "reduce-overhead"}


def build(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIGS[name], attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(device, dtype).eval()


def prefilled_cache(model: torch.nn.Module, prompt: torch.Tensor, slots: int) -> tuple[Any, torch.Tensor]:
    """A static cache with ``prompt`` in it (eager prefill) and the prefill's last logits."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=slots)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(prompt.shape[1], device=prompt.device))
    return cache, out.logits[:, -1]


def _layer_tensors(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    la = cache.layers[layer]
    return la.keys, la.values


def step_fn(model: torch.nn.Module, cache: Any) -> Any:
    def step(ids: torch.Tensor, pos: torch.Tensor, cpos: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, position_ids=pos, cache_position=cpos, past_key_values=cache, use_cache=True).logits

    return step


def side_call(side: str, model: torch.nn.Module, cache: Any, args: tuple[torch.Tensor, ...]) -> Any:
    """A no-argument call of one decode step for ``side`` (compiled or captured now)."""
    step = step_fn(model, cache)
    if side == "eager":
        return lambda: step(*args)
    if side == "eager_cudagraph":
        return cuda_graph_callable(step, args)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=_recording_kfuse) if side == "kfuse" else torch.compile(step, mode=_MODES[side])
    return lambda: compiled(*args)


_KFUSE_GRAPHS: list[Any] = []  # what the kfuse backend made of each Dynamo graph, in order


def _recording_kfuse(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    from kfuse.frontend.dynamo import kfuse_backend

    fn = kfuse_backend(gm, example_inputs, **kwargs)
    _KFUSE_GRAPHS.append(fn)
    return fn


def generate_ms_per_token(model: torch.nn.Module, prompt: torch.Tensor, new: int, how: str) -> tuple[float, torch.Tensor]:
    """Wall time of ``generate`` per new token past the first (the prefill and the first token taken out by a
    one-token call), and the tokens. ``how``: eager, transformers' own compile, or kfuse as its backend."""
    from transformers import CompileConfig

    kw: dict[str, Any] = {"do_sample": False, "cache_implementation": "static"}
    if how == "eager":
        kw["disable_compile"] = True
    elif how == "kfuse":
        cfg = CompileConfig(backend="kfuse")
        cfg._compile_all_devices = True  # transformers compiles on its own only on CUDA
        kw["compile_config"] = cfg
    torch._dynamo.reset()

    def run(n: int) -> tuple[float, torch.Tensor]:
        if prompt.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n, **kw)
        if prompt.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    run(new)  # compiles (every side's first call)
    t1, _ = run(1)
    tn, out = run(new)
    return (tn - t1) * 1e3 / max(new - 1, 1), out


def run_case(model_name: str, batch: int, prompt_len: int, slots: int, args: argparse.Namespace, command: str) -> dict[str, Any]:
    gpu = torch.cuda.is_available() and not args.smoke
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    model = build(model_name, dtype, device)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g).to(device)
    print(f"== decode {model_name} B{batch} prompt {prompt_len} cache {slots} ({dtype}, {device})", flush=True)
    sides = [s for s in args.sides.split(",") if gpu or s in ("eager", "kfuse")]
    times: dict[str, float] = {}
    errs: dict[str, float] = {}
    cache_errs: dict[str, float] = {}
    compile_s: dict[str, float] = {}
    ref_logits = ref_slot = None
    report: dict[str, Any] = {}
    for side in sides:
        cache, last = prefilled_cache(model, prompt, slots)
        ids = last.argmax(-1, keepdim=True)
        cpos = torch.tensor([prompt_len], device=device)
        step_args = (ids, cpos[None].expand(batch, 1), cpos)
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                call = side_call(side, model, cache, step_args)
                logits = call().clone()
                compile_s[side] = round(time.perf_counter() - t0, 2)
                times[side] = time_ms(call, args.warmup, args.rep)
        except Exception as e:  # a side that cannot run is reported, not fatal
            print(f"  {side:18s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
            continue
        slot = torch.stack([t[:, :, prompt_len] for t in _layer_tensors(cache, -1)])  # what the step wrote, last layer
        if side == "eager":
            ref_logits, ref_slot = logits, slot
        elif ref_logits is not None:
            errs[side], cache_errs[side] = max_rel_err(logits, ref_logits), max_rel_err(slot, ref_slot)
        if side == "kfuse":
            report = _kfuse_plan_summary()
        extra = f"   logits err {errs[side]:.2e}, cache err {cache_errs[side]:.2e}" if side in errs else ""
        print(f"  {side:18s} {times[side]:9.4f} ms (compile {compile_s[side]:.1f} s){extra}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    read = n_params - (emb.numel() if emb.data_ptr() != head.data_ptr() else 0)  # a step reads B rows of the embedding table
    cfg = model.config
    kv_bytes = 2 * cfg.num_hidden_layers * batch * slots * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    nbytes = (read + kv_bytes) * (2 if dtype == torch.float16 else 4)
    floor = floor_ms(2.0 * n_params * batch, nbytes)
    gen: dict[str, float] = {}
    agree: dict[str, float] = {}
    if args.generate:
        ref_tokens = None
        for how in [h for h in ("eager", "transformers_compile", "kfuse") if gpu or h != "transformers_compile"]:
            try:
                gen[how], tokens = generate_ms_per_token(model, prompt, args.generate, how)
            except Exception as e:  # noqa: BLE001 - reported
                print(f"  generate {how:20s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            if ref_tokens is None:
                ref_tokens = tokens[:, prompt_len:]
            agree[how] = float((tokens[:, prompt_len:] == ref_tokens).float().mean())
            print(f"  generate {how:20s} {gen[how]:8.3f} ms/token (tokens equal to eager's: {agree[how]:.0%})", flush=True)
    kfuse_ms = times.pop("kfuse", None)
    return make_record(
        "decode", f"{model_name}_B{batch}_P{prompt_len}_L{slots}", kfuse_ms, times, floor, errs.get("kfuse"), command,
        dtype="fp16" if dtype == torch.float16 else "fp32",
        model=model_name, batch=batch, prompt=prompt_len, cache_slots=slots, params=n_params, min_bytes=nbytes,
        logits_err=errs, cache_err=cache_errs, compile_s=compile_s, kfuse_plan=report,
        generate_ms_per_token=gen, generate_tokens_equal_to_eager=agree, generate_new_tokens=args.generate, smoke=bool(args.smoke),
    )  # fmt: skip


def _kfuse_plan_summary() -> dict[str, Any]:
    """Templates and state writes of the last graph the kfuse backend compiled (the decode step)."""
    compiled = getattr(_KFUSE_GRAPHS[-1], "kfuse_compiled", None) if _KFUSE_GRAPHS else None
    if compiled is None:
        return {"note": "the decode step's graph ran as PyTorch's" if _KFUSE_GRAPHS else "no graph reached kfuse"}
    rep = compiled.report
    templates: dict[str, int] = {}
    for k in rep["kernels"]:
        templates[k["template"]] = templates.get(k["template"], 0) + 1
    attention = [k.get("config", "") for k in rep["kernels"] if "attention" in k["template"]][:1]
    return {"kernels_by_template": templates, "launches": len(rep["kernels"]), "cuda_graph": rep["cuda_graph"],
            "state_writes": rep.get("state_writes", []), "attention_choice": attention}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--cache", type=int, default=1024, help="static cache slots")
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--generate", type=int, default=64, help="new tokens per generate call (0: skip)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--smoke", action="store_true", help="llama-tiny on the CPU (interpreter), eager and kfuse only")
    args = p.parse_args()
    if args.smoke:
        args.model, args.batches, args.prompt, args.cache, args.generate = "llama-tiny", "2", 6, 40, 3
        args.warmup, args.rep = 0, 1
    command = "PYTHONPATH=. python benchmarks/decode_bench.py " + " ".join(sys.argv[1:])
    records = [run_case(args.model, int(b), args.prompt, args.cache, args, command) for b in args.batches.split(",")]
    path = write_results("decode" + ("_smoke" if args.smoke else ""), records, args.out)
    print(f"\n{'case':28s} {'kfuse ms':>9s} {'best PyTorch':>22s} {'floor':>7s} {'speedup':>8s}")
    for r in records:
        base = min(r["baselines_ms"].items(), key=lambda kv: kv[1]) if r["baselines_ms"] else ("-", float("nan"))
        k = r["kfuse_ms"] or float("nan")
        print(f"{r['case']:28s} {k:9.4f} {base[0]:>12s} {base[1]:9.4f} {r['floor_ms']:7.4f} {base[1] / k:7.2f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
