"""`kfuse sass ...` commands: inspect a cubin's schedule, tune an example kernel's schedule."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="SASS schedule inspection and tuning (SIP on sm_90)", no_args_is_help=True)
console = Console()


@app.command()
def inspect(
    cubin: Path,
    kernel: str = typer.Option(None, help="kernel name (default: the only one)"),
    deps: bool = typer.Option(True, help="print the dependency graph of movable instructions"),
    moves: str = typer.Option("memory", help="move set: memory (SIP's) or all (memory and register arithmetic)"),
) -> None:
    """Print the annotated schedule (control codes, blocks, legal moves) and dependency graph."""
    from .cubin import CubinError, load_cubin
    from .disasm import disassemble
    from .schedule import Move, Schedule, move_set

    try:
        movable = move_set(moves)
        cub = load_cubin(cubin)
        k = cub.kernel(kernel)
        s = Schedule.build(disassemble(cub, k.name), movable, pinned=frozenset(k.pinned_offsets()))
    except (CubinError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from e
    legal = {(m.index, m.direction) for m in s.legal_moves()}
    console.print(
        f"[bold]{k.name}[/bold] sm_{cub.arch}, {len(s.nodes)} instructions, "
        f"{len(legal)} legal moves; tables: {[a.name for a, _ in k.offset_tables()]}"
    )
    block = -1
    for pos, n in enumerate(s.nodes):
        if n.block != block:
            block = n.block
            console.print(f"[cyan]-- block {block}[/cyan]")
        mv = ("^" if (pos, -1) in legal else " ") + ("v" if (pos, 1) in legal else " ")
        console.print(f"{n.ins.offset:06x} {n.ctrl.render()} {mv} {n.ins.text()}", highlight=False)
    if deps:
        console.print("[bold]dependencies of movable instructions (neighbours they cannot pass)[/bold]")
        for pos in range(len(s.nodes)):
            if s.is_movable(pos):
                for d in (-1, 1):
                    why = s.why_illegal(Move(pos, d))
                    if why:
                        console.print(f"{s.nodes[pos].ins.offset:06x} {'up' if d < 0 else 'down'}: {why}", highlight=False)


@app.command()
def tune(
    kernel: str = typer.Argument("gemm", help="example kernel: gemm (GEMM + LeakyReLU) or attention (tutorial-style forward)"),
    m: int = typer.Option(512, help="gemm: rows of A and C"),
    n: int = typer.Option(512, help="gemm: columns of B and C"),
    k: int = typer.Option(2048, help="gemm: the reduction length"),
    tile: str = typer.Option("128x128x64w8s3", help="gemm: the Triton tile, BMxBNxBKwWARPSsSTAGES (the tutorial's by default)"),
    batch: int = typer.Option(1, help="attention: batch"),
    heads: int = typer.Option(4, help="attention: heads"),
    seq: int = typer.Option(16384, help="attention: sequence length (a multiple of 128)"),
    head_dim: int = typer.Option(64, help="attention: head dimension"),
    iters: int = 1000,
    seeds: str = "0,1,2",
    samples: int = 10_000,
    max_seconds: float = typer.Option(None, help="wall-clock search budget"),
    moves: str = typer.Option("memory", help="move set: memory (SIP's) or all (memory and register arithmetic)"),
    mma_form: str = typer.Option(
        "wgmma", help="Triton's tensor-core code: wgmma (its default on sm_90) or mma-sync (Ampere's HMMA fed by LDSM, as SIP tuned)"
    ),
) -> None:
    """Tune an example kernel's schedule on this machine's GPU with a progress bar (defaults: SIP's shapes, GEMM +
    LeakyReLU [512, 512, 2048] and attention [1, 4, 16384, 64]); prints the result and what the search tried."""
    import torch

    from .api import optimize_compiled_kernel
    from .examples import attention_launch, check_attention_seq, check_mma_form, gemm_launch, parse_gemm_config
    from .examples import mma_form as tensor_core_form
    from .schedule import move_set
    from .search import SimulatedAnnealing

    if kernel not in ("gemm", "attention"):
        console.print(f"[red]error:[/red] unknown example kernel {kernel!r} (gemm or attention)")
        raise typer.Exit(1)
    try:  # every option checked before any GPU work
        movable = move_set(moves)
        config = parse_gemm_config(tile)
        if kernel == "attention":
            check_attention_seq(seq)
        check_mma_form(mma_form)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from e
    if not torch.cuda.is_available():
        console.print("[red]error:[/red] tuning measures kernels and needs a CUDA GPU")
        raise typer.Exit(1)
    sa = SimulatedAnnealing(iterations=iters, seeds=tuple(int(x) for x in seeds.split(",")), max_seconds=max_seconds)
    with tensor_core_form(mma_form):
        ck, args, grid = gemm_launch(m, n, k, config) if kernel == "gemm" else attention_launch(batch, heads, seq, head_dim)
    res = optimize_compiled_kernel(ck, args, grid, strategy=sa, samples=samples, progress=True, movable=movable)
    console.print(
        f"{res.kernel}: {res.reason}; triton {res.triton_ms:.4f} ms, kfuse {res.kfuse_ms:.4f} ms, "
        f"{res.verified_samples} samples verified, {res.moves_applied} moves"
    )
    if res.trials:  # what the search tried, each candidate against the original as the search timed both
        t = res.trial_summary()
        console.print(
            f"tried {t['tried']} schedules ({t['failed']} computed something else, never kept); time / original: "
            f"min {t['rel_time_min']:.3f}, p10 {t['rel_time_p10']:.3f}, median {t['rel_time_median']:.3f}, max {t['rel_time_max']:.3f}"
        )
