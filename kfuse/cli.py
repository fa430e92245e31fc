"""The ``kfuse`` command line: compile, demo, bench, models, and the tools of each subsystem."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="kfuse: a kernel-fusion compiler and tuner for DL inference on NVIDIA GPUs.", no_args_is_help=True)
console = Console()

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device is available", param_hint="--device")
    return device


def _command_line(cmd: str, positional: str, **opts: Any) -> str:
    """The command that reproduces this run (options that differ from 'unset')."""
    parts = ["kfuse", cmd, positional]
    for k, v in opts.items():
        if v is None or v is False or (k == "tune" and v == "none"):
            continue
        flag = "--" + k.replace("_", "-")
        parts += [flag] if v is True else [flag, str(v)]
    return " ".join(parts)


def _load(
    model: str,
    batch: int | None,
    seq: int | None,
    dtype: str,
    device: str,
    varlen: bool,
    avg_len_ratio: float | None,
    image_size: int | None = None,
) -> tuple[Any, tuple, dict]:
    """An embedded model by name, a torchvision model (``torchvision:NAME``), a local Hugging Face checkpoint
    directory, or an ONNX file, with random inputs of its declared shapes."""
    import torch

    import kfuse.models as zoo
    from kfuse.models.pretrained import PretrainedLoadError, is_checkpoint, load_pretrained
    from kfuse.models.torchvision_models import is_torchvision_name

    tdtype = getattr(torch, DTYPES[dtype])
    if is_torchvision_name(model):
        return _load_torchvision(model, batch, image_size, tdtype, device)
    if is_checkpoint(model):
        try:
            return load_pretrained(model, batch=batch, seq=seq, dtype=tdtype, device=device, with_mask=varlen or avg_len_ratio is not None)
        except PretrainedLoadError as e:
            raise typer.BadParameter(str(e), param_hint="MODEL") from None
    if model.endswith(".onnx") or os.path.sep in model:
        from kfuse.frontend.onnx import random_inputs_for

        if not Path(model).exists():
            raise typer.BadParameter(f"no such ONNX file: {model}", param_hint="MODEL")
        return model, random_inputs_for(model, batch=batch, dtype=tdtype, device=device), {}
    try:
        zoo.get_spec(model)
    except KeyError as e:
        raise typer.BadParameter(str(e).strip("'\""), param_hint="MODEL") from None
    with_mask = varlen or avg_len_ratio is not None
    m, args, kwargs = zoo.build(
        model, batch=batch, seq=seq, dtype=tdtype, device=device, with_mask=with_mask, avg_len_ratio=avg_len_ratio if with_mask else None
    )
    return m, args, kwargs


def _load_torchvision(model: str, batch: int | None, size: int | None, dtype: Any, device: str) -> tuple[Any, tuple, dict]:
    """``torchvision:NAME`` (``kfuse.models.torchvision_models``), its errors as the CLI's."""
    from kfuse.models.torchvision_models import TorchvisionLoadError, load_torchvision

    try:
        return load_torchvision(model, batch=batch, size=size, dtype=dtype, device=device)
    except TorchvisionLoadError as e:
        raise typer.BadParameter(str(e), param_hint="MODEL") from None


@app.command("compile")
def compile_cmd(
    model: Annotated[
        str,
        typer.Argument(
            help="an embedded model name (see `kfuse models`), torchvision:NAME (random weights, e.g. torchvision:densenet121), "
            "a Hugging Face checkpoint directory, or an .onnx file"
        ),
    ],
    batch: Annotated[int | None, typer.Option(help="batch size (default: the model's; 1 for torchvision)")] = None,
    seq: Annotated[int | None, typer.Option(help="sequence length for token models")] = None,
    image_size: Annotated[
        int | None, typer.Option(help="image side for torchvision models (default: the one its weights were evaluated at)")
    ] = None,
    dtype: Annotated[str, typer.Option(help="fp32 | fp16 | bf16")] = "fp32",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    explain: Annotated[bool, typer.Option(help="print the graph after each stage and the kernel plan")] = False,
    report: Annotated[Path | None, typer.Option(help="write the compile report as JSON to this file")] = None,
    varlen: Annotated[bool, typer.Option(help="padding-free mode (token models; adds an attention mask)")] = False,
    avg_len_ratio: Annotated[float | None, typer.Option(help="mean valid length / seq for the generated attention mask")] = None,
    tune: Annotated[str, typer.Option(help="none | fast | full")] = "none",
    profile: Annotated[bool, typer.Option(help="time each kernel of the plan (GPU) and write a PNG bar chart")] = False,
    sass: Annotated[bool, typer.Option(help="SASS schedule tuning of the 2 hottest Triton kernels, verified before use (GPU)")] = False,
    cuda_graphs: Annotated[bool, typer.Option(help="launch the whole plan as one CUDA graph (GPU)")] = True,
    pdl: Annotated[
        str, typer.Option(help="programmatic dependent launch (sm_90): auto (time the plan with it on and off, keep the faster) | on | off")
    ] = "auto",
    library: Annotated[
        str, typer.Option(help="auto (time kfuse kernels vs cuBLAS/cuDNN/SDPA per node on the GPU, keep the faster) | never | always")
    ] = "auto",
    b2b: Annotated[bool, typer.Option(help="back-to-back GEMM/conv chains in one kernel where measured faster")] = True,
    b2b_recheck: Annotated[bool, typer.Option(help="time close fused-vs-unfused chain decisions again on the whole plan (GPU)")] = True,
    gather_rows: Annotated[
        bool, typer.Option(help="row-only data movement (Swin's shifted windows, patch merging) as one gather, folded into LayerNorms")
    ] = True,
    input_scale: Annotated[
        bool,
        typer.Option(help="a squeeze-excitation's x * s, or a batch norm + ReLU, read by the next conv's input loads (RegNet-Y, DenseNet)"),
    ] = True,
    concat_in_place: Annotated[
        bool, typer.Option(help="concatenations as views of one buffer their inputs are computed into (DenseNet, Inception)")
    ] = True,
    merge_activated: Annotated[
        bool, typer.Option(help="merge a GEMM that feeds a GELU / ReLU with its siblings (the activation then runs alone)")
    ] = False,
    step_errors: Annotated[
        int,
        typer.Option(
            help="print the N steps with the largest error of their own (each on PyTorch's values of its inputs), to tell a "
            "wrong kernel from error the network amplifies"
        ),
    ] = 0,
) -> None:
    """Compile MODEL, check it against PyTorch on random inputs and print the kernel plan."""
    import kfuse
    from kfuse.report import plan_table, summary_lines

    if dtype not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}", param_hint="--dtype")
    dev = _device(device)
    m, args, kwargs = _load(model, batch, seq, dtype, dev, varlen, avg_len_ratio, image_size)
    if pdl not in ("auto", "on", "off"):
        raise typer.BadParameter(f"unknown choice {pdl!r}; choose auto, on or off", param_hint="--pdl")
    if library not in ("auto", "never", "always"):
        raise typer.BadParameter(f"unknown choice {library!r}; choose auto, never or always", param_hint="--library")
    overrides: dict[str, Any] = {"tune": tune, "profile": profile, "sass": sass, "cuda_graphs": cuda_graphs, "gemm_library": library,
                                 "fuse_b2b": b2b, "b2b_recheck": b2b_recheck, "gather_rows": gather_rows,
                                 "input_scale": input_scale, "merge_activated": merge_activated, "concat_in_place": concat_in_place,
                                 "pdl": {"auto": "auto", "on": True, "off": False}[pdl]}  # fmt: skip
    if varlen:
        overrides["varlen"] = True
    with console.status(f"compiling {model} ..."):
        compiled = kfuse.compile(m, args, kwargs, explain=explain, **overrides)
    rep = dict(compiled.report)
    rep["model"] = model
    rep["command"] = _command_line(
        "compile", model, batch=batch, seq=seq, dtype=dtype, varlen=varlen, avg_len_ratio=avg_len_ratio, tune=tune,
        no_b2b=not b2b, no_b2b_recheck=not b2b_recheck, no_gather_rows=not gather_rows, no_input_scale=not input_scale,
        merge_activated=merge_activated,
    )  # fmt: skip
    if not explain:
        console.print(plan_table(rep))
        for line in summary_lines(rep):
            console.print(line, markup=False)
    variant = getattr(compiled, "variant", None)  # none through Dynamo's frontend (a DynamoCompiledModel): no profile
    if profile and variant is not None and variant.profile:
        from kfuse.runtime.profile import plot_profile, print_profile

        print_profile(variant.profile, console=console)
        png = (report.with_suffix("") if report else Path(f"kfuse_profile_{model.replace('/', '_')}")).as_posix() + "_profile.png"
        plot_profile(variant.profile, png, title=f"kfuse profile: {model}")
        console.print(f"profile chart written to {png}")
    if step_errors > 0 and variant is None:
        console.print("--step-errors needs one compiled graph; this model went through Dynamo (report['frontend'])", markup=False)
    elif step_errors > 0:
        _print_step_errors(compiled, args, kwargs, step_errors, rep)
    if report is not None:
        report.write_text(json.dumps(rep, indent=2, default=str))
        console.print(f"report written to {report}")


def _print_step_errors(compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any], top: int, rep: dict[str, Any]) -> None:
    from rich.table import Table

    from kfuse.runtime.step_errors import worst

    with console.status("running each step on PyTorch's values of its inputs ..."):
        rows, whole = compiled.step_errors(*args, **kwargs)
    table = Table(title=f"the {min(top, len(rows))} steps with the largest error of their own (of {len(rows)})")
    for col in ("step", "template", "output", "shape", "rel err"):
        table.add_column(col, justify="right" if col in ("step", "rel err") else "left")
    top_rows = worst(rows, top)
    for r in top_rows:
        table.add_row(str(r.index), r.template, r.output, "x".join(map(str, r.shape)), f"{r.rel_err:.2e}")
    console.print(table)
    largest = max((r.rel_err for r in rows), default=0.0)
    console.print(f"output error {whole:.2e}, largest step error {largest:.2e}", markup=False)
    rep["step_errors"] = {"output_rel_err": whole, "worst": [r.as_dict() for r in top_rows]}


@app.command()
def models() -> None:
    """List the embedded models."""
    import kfuse.models as zoo

    t = Table(title="embedded models (random weights, built from configs)")
    for col in ("name", "family", "default batch", "default seq", "description"):
        t.add_column(col)
    for s in zoo.list_models():
        t.add_row(s.name, s.family, str(s.default_batch), str(s.default_seq or "-"), s.description)
    console.print(t)
    console.print("Also: torchvision:NAME (any torchvision classifier or segmentation model, random weights, where torchvision "
                  "is installed), a Hugging Face checkpoint directory, or an .onnx file.")  # fmt: skip


@app.command()
def demo(
    model: Annotated[str | None, typer.Option(help="embedded model (default: bert-tiny on CPU, bert-base on a GPU)")] = None,
    batch: Annotated[int | None, typer.Option(help="batch size")] = None,
    seq: Annotated[int | None, typer.Option(help="sequence length")] = None,
) -> None:
    """The main job: compile a built-in model, check it against PyTorch, print the plan;
    on a GPU also print a speed table against PyTorch eager and eager in a CUDA graph."""
    import torch

    import kfuse
    import kfuse.models as zoo
    from kfuse.report import plan_table, summary_lines

    gpu = torch.cuda.is_available()
    name = model or ("bert-base" if gpu else "bert-tiny")
    dtype = torch.float16 if gpu else torch.float32
    batch = batch or (8 if gpu else 2)
    seq = seq or (128 if gpu else 16)
    m, args, kwargs = zoo.build(name, batch=batch, seq=seq, dtype=dtype, device="cuda" if gpu else "cpu")
    console.print(
        f"[bold]kfuse demo[/]: {name} batch={batch} seq={seq} {str(dtype)[6:]} on {'the GPU' if gpu else 'the CPU (Triton interpreter)'}"
    )
    with console.status("compiling ..."):
        compiled = kfuse.compile(m, args, kwargs)
    rep = compiled.report
    console.print(plan_table(rep))
    for line in summary_lines(rep):
        console.print(line, markup=False)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    ok = rep["max_rel_err"] <= tol
    console.print(
        f"check against PyTorch: {'[green]PASS[/]' if ok else '[red]FAIL[/]'} (max_rel_err {rep['max_rel_err']:.2e}, tolerance {tol:g})"
    )
    if gpu:
        from kfuse.bench.harness import pytorch_baselines, time_ms

        with torch.no_grad():
            base, _, _ = pytorch_baselines(m, args, kwargs, which=("eager", "eager_cudagraph"), log=lambda s: None)
            t_k = time_ms(lambda: compiled(*args, **kwargs))
        t = Table(title=f"{name} B={batch} S={seq} fp16 on {torch.cuda.get_device_name()}")
        t.add_column("implementation")
        t.add_column("ms", justify="right")
        t.add_column("speedup of kfuse", justify="right")
        for k, v in base.items():
            t.add_row(k, f"{v:.3f}", f"{v / t_k:.2f}x")
        t.add_row("kfuse", f"{t_k:.3f}", "1.00x")
        console.print(t)
    if not ok:
        raise typer.Exit(1)


def _bench_case(model: str, batch: int | None, seq: int | None) -> str:
    """The record's case name: the batch and (token models) sequence length ``zoo.build`` used, defaults included."""
    import kfuse.models as zoo

    spec = zoo.get_spec(model)
    b = spec.default_batch if batch is None else batch
    s = None if spec.default_seq is None else (spec.default_seq if seq is None else seq)
    return f"B{b}_S{s}" if s is not None else f"B{b}"


@app.command()
def bench(
    model: Annotated[str, typer.Argument(help="embedded model name, or torchvision:NAME (random weights; batch 32 unless given)")],
    batch: Annotated[int | None, typer.Option(help="batch size")] = None,
    seq: Annotated[int | None, typer.Option(help="sequence length")] = None,
    image_size: Annotated[int | None, typer.Option(help="image side for torchvision models (default: the weights' own)")] = None,
    baselines: Annotated[
        str, typer.Option(help="comma list of eager,eager_cudagraph,compile,compile_cudagraphs,max_autotune")
    ] = "eager,eager_cudagraph,compile,compile_cudagraphs",
    out: Annotated[Path | None, typer.Option(help="write the JSON record here")] = None,
) -> None:
    """Time a compiled model side by side with PyTorch baselines on the GPU (fp16)."""
    import torch

    import kfuse
    import kfuse.models as zoo
    from kfuse.bench.harness import make_record, max_rel_err, pytorch_baselines, time_ms

    if not torch.cuda.is_available():
        console.print("[red]kfuse bench needs a CUDA GPU[/]")
        raise typer.Exit(2)
    from kfuse.models.torchvision_models import is_torchvision_name

    if is_torchvision_name(model):
        m, args, kwargs = _load_torchvision(model, batch or 32, image_size, torch.float16, "cuda")
        case = f"B{args[0].shape[0]}_{args[0].shape[-1]}px"
    else:
        m, args, kwargs = zoo.build(model, batch=batch, seq=seq, dtype=torch.float16, device="cuda")
        case = _bench_case(model, batch, seq)
    with torch.no_grad():
        compiled = kfuse.compile(m, args, kwargs)
        times, outs, _ = pytorch_baselines(m, args, kwargs, which=tuple(baselines.split(",")))
        t_k = time_ms(lambda: compiled(*args, **kwargs))
        err = max_rel_err(compiled(*args, **kwargs), outs["eager"]) if "eager" in outs else None
    command = _command_line("bench", model, batch=batch, seq=seq, image_size=image_size, baselines=baselines)
    rec = make_record(model, case, t_k, times, None, err, command)
    console.print_json(json.dumps(rec, default=str))
    if out:
        out.write_text(json.dumps([rec], indent=2, default=str))


@app.command()
def generate(
    model: Annotated[str, typer.Argument(help="llama-1b / llama-tiny (random weights) or a local Hugging Face causal-LM checkpoint")],
    batch: Annotated[int, typer.Option(help="sequences decoded together")] = 1,
    prompt: Annotated[int, typer.Option(help="prompt tokens (prefilled eagerly)")] = 128,
    cache: Annotated[int, typer.Option(help="static KV cache slots (prompt + new tokens must fit)")] = 512,
    new_tokens: Annotated[int, typer.Option(help="tokens per timed generate call (0: time the decode step only)")] = 32,
    dtype: Annotated[str, typer.Option(help="fp32 | fp16 | bf16 (default: fp16 on a GPU, fp32 on the CPU)")] = "auto",
    device: Annotated[str, typer.Option(help="auto | cuda | cpu")] = "auto",
    sides: Annotated[
        str,
        typer.Option(
            help="comma list of eager,eager_cudagraph,compile,compile_cudagraphs,kfuse, and kfuse A/B variants "
            "kfuse_no_cache_write,kfuse_no_query_rotary,kfuse_no_pdl,kfuse_no_skinny,kfuse_no_norm_fold,"
            "kfuse_no_paired_writes (GPU-only sides skipped on the CPU)"
        ),
    ] = "eager,eager_cudagraph,compile,compile_cudagraphs,kfuse",
    out: Annotated[Path | None, typer.Option(help="write the JSON record here")] = None,
    profile: Annotated[bool, typer.Option(help="GPU: also list the kernels of kfuse's step and of eager's in a CUDA graph")] = False,
) -> None:
    """Decode with a static KV cache: one decode step timed for eager PyTorch (and, on a GPU, eager in a CUDA graph
    and torch.compile) and for kfuse, checked against eager, then whole generate calls per token."""
    import torch

    import kfuse  # noqa: F401 - the torch.compile backend
    from kfuse.bench.decode import ABLATIONS, SIDES, build, decode_case

    known = (*SIDES, *ABLATIONS)
    unknown = set(sides.split(",")) - set(known)
    if unknown:
        raise typer.BadParameter(f"unknown side(s) {', '.join(sorted(unknown))}: choose from {', '.join(known)}", param_hint="--sides")

    dev = _device(device)
    dt = getattr(torch, DTYPES[dtype]) if dtype != "auto" else (torch.float16 if dev == "cuda" else torch.float32)
    if prompt + max(new_tokens, 1) > cache:
        raise typer.BadParameter(f"prompt {prompt} + new tokens {new_tokens} do not fit {cache} cache slots", param_hint="--cache")
    try:
        m = build(model, dt, dev)
    except (ValueError, OSError) as e:
        raise typer.BadParameter(str(e), param_hint="MODEL") from None
    console.print(f"decode {model}: batch {batch}, prompt {prompt}, {cache} cache slots, {dt}, {dev}")
    gpu = dev == "cuda"
    r = decode_case(m, batch, prompt, cache, tuple(sides.split(",")), new_tokens, warmup=10 if gpu else 1, rep=50 if gpu else 2,
                    log=lambda line: console.print(line, highlight=False),
                    profile=("kfuse", "eager_cudagraph") if profile else ())  # fmt: skip
    table = Table(title="one decode step (ms)")
    for col in ("side", "ms", "kfuse speedup", "logits err", "generate ms/token"):
        table.add_column(col)
    k = r["kfuse_ms"]
    gen = r["generate_ms_per_token"]
    rows = [("kfuse", k), *r["ablation_ms"].items()] + sorted(r["baselines_ms"].items(), key=lambda kv: kv[1])
    for side, ms in rows:
        g = gen.get("transformers_compile" if side == "compile_cudagraphs" else side)
        err = r["logits_err"].get(side)
        ratio = f"{ms / k:.2f}x" if k and ms else "-"
        table.add_row(side, f"{ms:.4f}" if ms else "failed", ratio, f"{err:.1e}" if err is not None else "-", f"{g:.3f}" if g else "-")
    console.print(table)
    if dev != "cuda":
        console.print("(on the CPU kfuse's kernels run in the Triton interpreter: the times check the wiring, not speed)")
    console.print(f"floor {r['floor_ms']:.4f} ms; kfuse plan: {r['kfuse_plan'].get('kernels_by_template')}")
    writes = r["kfuse_plan"].get("state_writes", [])
    console.print(f"state writes: {sum(w['how'] == 'in place' for w in writes)} of {len(writes)} in place")
    if out:
        out.write_text(json.dumps(r, indent=2, default=str))


def _mount_subcommands() -> None:
    """Each subsystem brings its own typer app; mount the ones that are installed."""
    for module, name, help_text in [
        ("kfuse.tune.cli", "tune-db", "the tuning record database"),
        ("kfuse.sass.cli", "sass", "SASS schedule inspection and tuning"),
        ("kfuse.sparse.cli", "sparse", "sync-free sparse triangular solve"),
        ("kfuse.colocate.cli", "colocate", "co-location of LC inference with BE jobs"),
    ]:
        try:
            sub = __import__(module, fromlist=["app"]).app
        except Exception as e:  # a subsystem that fails to import does not take the CLI down, but says why
            _mount_unavailable(name, help_text, f"{type(e).__name__}: {e}")
            continue
        app.add_typer(sub, name=name, help=help_text)


def _mount_unavailable(name: str, help_text: str, why: str) -> None:
    """A stand-in command for a subsystem whose module failed to import: any use prints the error."""

    @app.command(name, help=f"{help_text} (unavailable here: {why})", add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})  # fmt: skip
    def _unavailable(ctx: typer.Context) -> None:
        Console(stderr=True).print(f"kfuse {name} is unavailable: {why}", style="red")
        raise typer.Exit(2)


# the issues write the co-location experiment as `kfuse colocate --lc resnet50 --be sgemm,lbm ...`: options straight
# after a group whose one experiment is a command of its own mean that command
DEFAULT_SUBCOMMANDS = {"colocate": "run"}


def with_default_subcommand(argv: list[str]) -> list[str]:
    """``argv`` (without the program name) with a group's default command inserted where options follow the group."""
    if len(argv) >= 2 and argv[0] in DEFAULT_SUBCOMMANDS and argv[1].startswith("-") and argv[1] not in ("--help", "-h"):
        return [argv[0], DEFAULT_SUBCOMMANDS[argv[0]], *argv[1:]]
    return argv


def main(argv: list[str] | None = None) -> None:
    """The ``kfuse`` command."""
    import sys

    app(args=with_default_subcommand(list(sys.argv[1:] if argv is None else argv)), prog_name="kfuse")


_mount_subcommands()
