"""`kfuse sparse solve` (analyse, tune and check one matrix) and `kfuse sparse bench` (the SpTRSV
benchmark) from the command line (mounted by kfuse/cli.py)."""

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


def load_matrix(path: Path | None, gen: str | None) -> tuple[object, str]:
    """A scipy CSR matrix from ``.npz`` (``scipy.sparse.save_npz``) or ``.mtx`` (Matrix Market),
    or generated from ``KIND:SIZE`` (``kfuse.sparse.matrices``); and a name for it."""
    import scipy.io
    import scipy.sparse as sp

    from kfuse.sparse.matrices import GENERATORS, make

    if (path is None) == (gen is None):
        raise typer.BadParameter("give a matrix file or --gen KIND:SIZE (one of them)")
    if gen is not None:
        kind, _, size = gen.partition(":")
        if kind not in GENERATORS or not size.isdigit():
            raise typer.BadParameter(f"--gen wants KIND:SIZE with KIND in {sorted(GENERATORS)}, got {gen!r}", param_hint="--gen")
        return make(kind, int(size)), f"{kind}_{size}"
    assert path is not None
    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist", param_hint="MATRIX")
    if path.suffix == ".npz":
        return sp.load_npz(path).tocsr(), path.stem
    if path.suffix == ".mtx":
        return sp.csr_matrix(scipy.io.mmread(str(path))), path.stem
    raise typer.BadParameter(f"{path}: expected a .npz (scipy.sparse.save_npz) or .mtx (Matrix Market) file", param_hint="MATRIX")


@app.command()
def solve(
    matrix: Annotated[Path | None, typer.Argument(help="triangular matrix: .npz (scipy.sparse.save_npz) or .mtx")] = None,
    gen: Annotated[str | None, typer.Option("--gen", help="a generated matrix instead, KIND:SIZE (e.g. laplacian3d:40)")] = None,
    upper: Annotated[bool, typer.Option("--upper", help="the matrix is upper triangular")] = False,
    unit_diagonal: Annotated[bool, typer.Option("--unit-diagonal", help="take the diagonal as ones")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="fp64 or fp32")] = "fp64",
    tune: Annotated[bool | None, typer.Option("--tune/--no-tune", help="time the candidate variants (default: on a GPU)")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the plan, tuning and check as JSON")] = None,
) -> None:
    """Analyse one triangular matrix, show what kfuse chose and why, solve a random right-hand
    side and check it against scipy (on the GPU also time the solve, eager and as a CUDA graph)."""
    import json

    import numpy as np
    import scipy.sparse.linalg as sla
    import torch

    from kfuse.sparse import analyze

    console = Console()
    if dtype not in ("fp64", "fp32"):
        raise typer.BadParameter("--dtype is fp64 or fp32", param_hint="--dtype")
    a, name = load_matrix(matrix, gen)
    np_dtype = np.float64 if dtype == "fp64" else np.float32
    a = a.astype(np_dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        plan = analyze(a, lower=not upper, unit_diagonal=unit_diagonal, device=dev, tune=tune)
    except (ValueError, TypeError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from e
    except RuntimeError as e:  # tuning found no candidate that solves the system correctly
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from e
    info = plan.info
    sizes = f"{info['rows']:,} rows, {info['nnz']:,} nonzeros, {info['levels']:,} levels"
    console.print(f"[bold]{name}[/bold]: {sizes}, regime {info['regime']}")
    console.print(
        f"  kernel {info['sync']}, tiling {info['rows_per_program']}x{info['lanes_per_row']} ({info['num_warps']} warps); "
        "preprocessing " + ", ".join(f"{k} {v:.1f} ms" for k, v in info["preprocess_ms"].items())
    )
    for label, ms in sorted(plan.tuned.items(), key=lambda kv: kv[1] if isinstance(kv[1], float) else float("inf")):
        console.print(f"    tuned {label}: {ms if isinstance(ms, str) else f'{ms:.4f} ms'}")
    b = np.random.default_rng(0).standard_normal(a.shape[0]).astype(np_dtype)
    x = plan.solve(torch.from_numpy(b).to(dev))
    ref = sla.spsolve_triangular(a.astype(np.float64), b.astype(np.float64), lower=not upper, unit_diagonal=unit_diagonal)
    x64 = x.double().cpu().numpy()
    err = float(np.abs(x64 - ref).max() / max(np.abs(ref).max(), 1e-300))
    rec: dict = {"matrix": name, "plan": info, "tuned": plan.tuned, "max_rel_err": err}
    console.print(f"  check against scipy: max rel err {err:.1e}")
    if dev == "cuda":
        from kfuse.bench.harness import time_ms

        bt = torch.from_numpy(b).to(dev)
        rec["solve_eager_ms"] = time_ms(lambda: plan.solve(bt), warmup=3, rep=20)
        cap = plan.capture(bt)
        rec["solve_graph_ms"] = time_ms(cap.replay, warmup=3, rep=20)
        console.print(f"  solve: {rec['solve_eager_ms']:.4f} ms eager, {rec['solve_graph_ms']:.4f} ms as a CUDA graph")
    if json_path is not None:
        json_path.write_text(json.dumps(rec, indent=2, default=str))
        console.print(f"wrote {json_path}")
    if not err < (1e-10 if dtype == "fp64" else 1e-3):
        console.print("[red]the solution does not match scipy[/red]")
        raise typer.Exit(1)


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
