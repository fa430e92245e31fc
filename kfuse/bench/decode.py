"""LLM decoding with a static KV cache, side by side: the harness behind ``benchmarks/decode_bench.py`` and
``kfuse generate``.

A causal LM is prefilled eagerly into a Hugging Face ``StaticCache``; one decode step (a token per sequence, the
cache written at its position) is then timed for each side, each with its own cache prefilled the same way:
PyTorch eager, eager in a CUDA graph, ``torch.compile`` default and ``mode="reduce-overhead"`` (what transformers
compiles a static-cache ``generate`` with), and kfuse as ``torch.compile``'s backend. Correctness in the same run:
each side's logits and the cache slot it wrote against eager's. Then whole ``generate`` calls, ms per new token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kfuse.bench.harness import cuda_graph_callable, floor_ms, max_rel_err, time_ms
from kfuse.bench.kernel_profile import profile_summary

SIDES = ("eager", "eager_cudagraph", "compile", "compile_cudagraphs", "kfuse")
# kfuse compiled with one option changed: an A/B in the same run, reported apart from the PyTorch baselines
ABLATIONS = {
    "kfuse_no_cache_write": {"fuse_cache_write": False},
    "kfuse_no_query_rotary": {"fuse_query_rotary": False},
    "kfuse_no_pdl": {"pdl": False},
    # the decode-step GEMMs without the skinny split-K kernel and without the RMSNorm folded into them (session 48's)
    "kfuse_no_skinny": {"skinny_gemm": "never", "fold_row_norm": False},
    # the skinny kernel, but each RMSNorm its own launch
    "kfuse_no_norm_fold": {"fold_row_norm": False},
    # a layer's key and value cache writes in two launches
    "kfuse_no_paired_writes": {"pair_cache_writes": False},
    # the skinny kernel without its weight prefetch into L2 before the PDL wait (session 49)
    "kfuse_no_prefetch": {"skinny_prefetch": False},
}
_MODES = {"compile": None, "compile_cudagraphs": "reduce-overhead"}


def build(model: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A causal LM: an embedded Llama config by name (``llama-1b``: TinyLlama-1.1B's shape; ``llama-tiny``), random
    weights, or a local Hugging Face checkpoint directory (``save_pretrained``'s; nothing is downloaded)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from kfuse.models.llama import CONFIGS
    from kfuse.models.pretrained import is_checkpoint

    if is_checkpoint(model):
        m = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, torch_dtype=dtype, attn_implementation="sdpa")
        return m.to(device).eval()
    if model not in CONFIGS:
        raise ValueError(f"unknown decoder {model!r}: one of {', '.join(CONFIGS)}, or a local Hugging Face checkpoint directory")
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIGS[model], attn_implementation="sdpa")).to(device, dtype).eval()


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
    if side == "kfuse" or side in ABLATIONS:
        compiled = torch.compile(step, backend=_recording_kfuse, options=ABLATIONS.get(side))
    else:
        compiled = torch.compile(step, mode=_MODES[side])
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


def step_floor_ms(model: torch.nn.Module, batch: int, slots: int) -> tuple[float, float]:
    """(floor ms, bytes) of one decode step: every weight once (the input embedding table's B rows only, unless it is
    the output layer's too), plus the cache's keys and values; FLOPs 2 x parameters x batch."""
    n_params = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    read = n_params - (emb.numel() if emb.data_ptr() != head.data_ptr() else 0)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * batch * slots * kv_heads * head_dim
    nbytes = float((read + kv) * next(model.parameters()).element_size())
    return floor_ms(2.0 * n_params * batch, nbytes), nbytes


def decode_case(
    model: torch.nn.Module,
    batch: int,
    prompt_len: int,
    slots: int,
    sides: tuple[str, ...] = SIDES,
    generate: int = 0,
    warmup: int = 10,
    rep: int = 50,
    log: Callable[[str], None] = print,
    profile: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Time one decode step of ``model`` for each side (those that need a GPU are skipped without one) and, with
    ``generate`` > 0, whole ``generate`` calls per new token; returns the measurements (``kfuse_ms``,
    ``baselines_ms``, errors, the kfuse plan's summary, ``generate_ms_per_token``, ...). The sides named in
    ``profile`` (GPU only) also get a kernel-by-kernel profile of their step (``kernel_profile``)."""
    device = next(model.parameters()).device
    gpu = device.type == "cuda"
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=g).to(device)
    times: dict[str, float] = {}
    errs: dict[str, float] = {}
    cache_errs: dict[str, float] = {}
    compile_s: dict[str, float] = {}
    steady: dict[str, float] = {}
    ref_logits = ref_slot = None
    plan: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    _KFUSE_GRAPHS.clear()
    for side in [s for s in sides if gpu or s in ("eager", "kfuse", *ABLATIONS)]:
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
                times[side] = time_ms(call, warmup, rep)
                # ten calls back to back, the host enqueueing ahead of the GPU: the GPU's own time a step, against
                # which the one-call time above shows the latency a step adds before its first kernel starts
                if gpu:
                    steady[side] = time_ms(lambda: [call() for _ in range(10)], 2, max(3, rep // 10)) / 10
                if gpu and side in profile:
                    profiles[side] = profile_summary(call, times[side])
        except Exception as e:  # a side that cannot run is reported, not fatal
            log(f"  {side:18s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        slot = torch.stack([t[:, :, prompt_len] for t in _layer_tensors(cache, -1)])  # what the step wrote, last layer
        if side == "eager":
            ref_logits, ref_slot = logits, slot
        elif ref_logits is not None:
            errs[side], cache_errs[side] = max_rel_err(logits, ref_logits), max_rel_err(slot, ref_slot)
        if side == "kfuse":
            plan = _kfuse_plan_summary()
            phases = ", ".join(f"{k} {v:.1f}" for k, v in plan.get("compile_phases_s", {}).items())
            log(f"  kfuse compile phases (s): {phases}" if phases else "  kfuse compile phases: none reported")
            for r in plan.get("alternatives_recheck", []):
                log(
                    f"  plan re-check x{r['steps']}: {r['winner']} {r['winner_plan_ms']} ms, {r['runner_up']} {r['runner_up_plan_ms']} ms"
                    f" -> {r['kept']}"
                )
        extra = f"   logits err {errs[side]:.2e}, cache err {cache_errs[side]:.2e}" if side in errs else ""
        b2b = f"back to back {steady[side]:.4f}; " if side in steady else ""
        log(f"  {side:18s} {times[side]:9.4f} ms ({b2b}compile {compile_s[side]:.1f} s){extra}")
        if side in profiles:
            pr = profiles[side]
            log(f"    kernels {pr['kernel_us']:.1f} us in {pr['launches']} launches, {pr['uncovered_us']:.1f} us of the step uncovered")
            for name, us, n in pr["top"][:12]:
                log(f"      {us:8.2f} us {n:4d}x  {name[:90]}")
    floor, nbytes = step_floor_ms(model, batch, slots)
    gen: dict[str, float] = {}
    agree: dict[str, float] = {}
    ref_tokens = None
    for how in [h for h in ("eager", "transformers_compile", "kfuse") if generate and (gpu or h != "transformers_compile")]:
        try:
            gen[how], tokens = generate_ms_per_token(model, prompt, generate, how)
        except Exception as e:  # noqa: BLE001 - reported
            log(f"  generate {how:20s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        if ref_tokens is None:
            ref_tokens = tokens[:, prompt_len:]
        agree[how] = float((tokens[:, prompt_len:] == ref_tokens).float().mean())
        log(f"  generate {how:20s} {gen[how]:8.3f} ms/token (tokens equal to eager's: {agree[how]:.0%})")
    kfuse_ms = times.pop("kfuse", None)
    ablations = {side: times.pop(side) for side in ABLATIONS if side in times}
    return {
        "ablation_ms": ablations,
        "kfuse_ms": kfuse_ms, "baselines_ms": times, "floor_ms": floor, "min_bytes": nbytes, "max_rel_err": errs.get("kfuse"),
        "logits_err": errs, "cache_err": cache_errs, "kernel_profile": profiles, "compile_s": compile_s, "kfuse_plan": plan,
        "back_to_back_ms": steady,
        "params": sum(p.numel() for p in model.parameters()), "batch": batch, "prompt": prompt_len, "cache_slots": slots,
        "generate_ms_per_token": gen, "generate_tokens_equal_to_eager": agree, "generate_new_tokens": generate,
    }  # fmt: skip


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
    # the GEMMs' measured choices (template, cuBLAS, skinny; each config names every candidate's time), one per kind
    gemms: dict[str, str] = {}
    for k in rep["kernels"]:
        if "gemm" in k["template"]:
            gemms.setdefault(f"{k['template']} {tuple(k.get('ops', ()))}", k.get("config", ""))
    return {"kernels_by_template": templates, "launches": len(rep["kernels"]), "cuda_graph": rep["cuda_graph"],
            "state_writes": rep.get("state_writes", []), "attention_choice": attention, "gemm_choices": gemms,
            "compile_phases_s": rep.get("compile_phases_s", {}), "parallel_compile": rep.get("parallel_compile"),
            "alternatives_recheck": rep.get("alternatives_recheck", [])}  # fmt: skip
