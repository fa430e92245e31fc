"""`kfuse sparse bench`: the SpTRSV benchmark from the command line (mounted by kfuse/cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kfuse.sparse.bench import SIZES, format_table, plot, run_case, write_json

app = typer.Typer(help="Sparse kernels (sync-free triangular solve).", no_args_is_help=True)


@app.callback()
def sparse() -> None:
    """Sparse kernels (sync-free triangular solve)."""


@app.command()
def bench(
    sizes: Annotated[str, typer.Option("--sizes", help=f"matrix set: {', '.join(sorted(SIZES))}")] = "full",
    out: Annotated[Path, typer.Option("--out", help="JSON records path")] = Path("benchmarks/results/h200/sptrsv.json"),
    plot_path: Annotated[Path, typer.Option("--plot", help="PNG plot: time vs levels")] = Path("benchmarks/results/h200/sptrsv_levels.png"),
) -> None:
    """Time kfuse sync-free vs level-set vs cuSPARSE on generated matrices (needs a GPU)."""
    import torch

    console = Console()
    if sizes not in SIZES:
        raise typer.BadParameter(f"unknown size set {sizes!r}; choose from {sorted(SIZES)}", param_hint="--sizes")
    if not torch.cuda.is_available():
        console.print("[red]kfuse sparse bench needs a CUDA GPU[/red]")
        raise typer.Exit(2)
    command = f"kfuse sparse bench --sizes {sizes} --out {out} --plot {plot_path}"
    records = []
    cases = SIZES[sizes]
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console
    ) as prog:
        task = prog.add_task("sptrsv", total=len(cases))
        for case in cases:
            prog.update(task, description=f"sptrsv {case.name}")
            records.append(run_case(case, command, log=lambda s: prog.console.log(s)))
            write_json(records, out)  # a cut-short run keeps what it finished
            prog.advance(task)
    plot(records, plot_path)
    console.print(format_table(records))
    console.print(f"wrote {out} and {plot_path}")
