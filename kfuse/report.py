"""Human-readable compile reports: the graph after each stage and the kernel plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from kfuse.runtime.compiled_model import CompiledModel, Variant


def plan_table(report: dict[str, Any], title: str = "kernel plan") -> Table:
    t = Table(title=title)
    t.add_column("#", justify="right")
    t.add_column("kernel")
    t.add_column("template")
    t.add_column("ops fused")
    t.add_column("config / epilogue")
    for i, k in enumerate(report["kernels"]):
        extra = " ".join(x for x in (k.get("config", ""), k.get("epilogue", "")) if x)
        style = "green" if k["template"] not in ("torch", "fallback") else ("red" if k["template"] == "fallback" else "")
        t.add_row(str(i), k["name"], f"[{style}]{k['template']}[/]" if style else k["template"], ", ".join(k["ops"]), extra)
    return t


def summary_lines(report: dict[str, Any]) -> list[str]:
    kernels = [k for k in report["kernels"] if k["template"] != "view"]  # a cat served as a view launches nothing
    fused = [k for k in kernels if k["template"] not in ("torch", "fallback")]
    lines = [
        f"model {report['model']}: {len(kernels)} launches, {len(fused)} kfuse kernels, backend {report['backend']}, "
        f"CUDA graph {report['cuda_graph']}, compiled in {report['compile_s']:.2f} s",
        "stages: " + " -> ".join(f"{s['name']}({s['nodes']})" for s in report["stages"]),
        "fallback to PyTorch: " + (", ".join(report["fallback"]) or "none"),
    ]
    if report.get("frontend") == "dynamo":
        lines.append(f"frontend: Dynamo, {report['graphs']} graph(s); torch.export could not take the model: {report['frontend_reason']}")
    if report.get("compile_phases_s"):
        lines.append("compile time by phase: " + ", ".join(f"{k} {v:.2f} s" for k, v in report["compile_phases_s"].items()))
    lines += b2b_lines(report.get("b2b"))
    lines += concat_lines(report.get("concat_in_place"))
    lines += state_lines(report.get("state_writes"))
    lines += pdl_lines(report)
    if "max_abs_err" in report:
        lines.append(f"vs PyTorch on the example inputs: max_abs_err {report['max_abs_err']:.3g}, max_rel_err {report['max_rel_err']:.3g}")
    return lines


def concat_lines(c: dict[str, Any] | None) -> list[str]:
    """Concatenations served as views (``runtime/concat_in_place.py``): how many, and the copies they save a call."""
    if not c:
        return []
    return [f"concatenations: {c['view_cats']} cat(s) are views of {c['groups']} buffer(s); of their {c['members']} inputs "
            f"{c['members_in_place']} are computed in place, the rest copied once; copies a call "
            f"{c['copy_mb_before']} MB -> {c['copy_mb_after']} MB"]  # fmt: skip


def state_lines(writes: list[dict[str, Any]] | None) -> list[str]:
    """Inputs and buffers the forward writes (``runtime/state_writes.py``): how many in place, and why the others not."""
    if not writes:
        return []
    in_place = [w for w in writes if w["how"] == "in place"]
    batched = sum("batched" in w for w in in_place)
    line = f"state writes: {len(in_place)} of {len(writes)} in place" + (f" ({batched} counters bumped in one launch)" if batched else "")
    return [line] + [f"  {w['input']} copied back: {w['why']}" for w in writes if w["how"] != "in place"]


def pdl_lines(report: dict[str, Any]) -> list[str]:
    """Programmatic dependent launch: on or off, and the plan times that decided it (``pdl="auto"``)."""
    c = report.get("pdl_choice")
    if not c or not c.get("timed"):
        return [f"programmatic dependent launch: {'on' if report.get('pdl') else 'off'}"] if "pdl" in report else []
    state = "on" if c["kept"] else "off"
    return [f"programmatic dependent launch: {state} (whole plan timed: {c['on_ms']} ms with it, {c['off_ms']} ms without)"]


def b2b_lines(b2b: dict[str, Any] | None) -> list[str]:
    """One line per back-to-back chain: fused or not, with what, and on what evidence (the
    measured fused and unfused times, and what the unfused stages run)."""
    if not b2b:
        return []
    lines = []
    for f in b2b.get("fused", []):
        head = f"b2b {f['node']} ({' -> '.join(f['stages'])}, widths {f['widths']}): "
        head += f"fused, {f.get('config', '')}" if f.get("fused", True) else "kept unfused"
        if "fused_ms" in f:
            head += f"; measured fused {f['fused_ms']} ms vs unfused {f['unfused_ms']} ms ({f.get('decided_by', 'measured')})"
            if f.get("plan_recheck"):
                r = f["plan_recheck"]
                head += f"; in the whole plan: fused {r['fused_plan_ms']} ms vs unfused {r['unfused_plan_ms']} ms, kept {r['kept']}"
            if f.get("unfused_kernels"):
                head += "; unfused stages: " + " | ".join(f["unfused_kernels"])
        else:
            head += f" ({f.get('decided_by', 'rule')})"
        lines.append(head)
    lines += [f"b2b not fused at {n['node']}: {n['reason']}" for n in b2b.get("not_fused", [])]
    return lines


def print_explain(model: CompiledModel, variant: Variant, console: Console | None = None) -> None:
    console = console or Console()
    previous = None
    for name, graph in variant.stages:
        text = str(graph)
        if previous is not None and text == previous:
            console.print(f"after {name}: unchanged", markup=False)
            continue
        console.rule(f"after {name}: {len(graph.nodes)} nodes, {len(graph.constants)} constants")
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        previous = text
    console.print(plan_table(variant.report))
    for line in summary_lines(variant.report):
        console.print(line, markup=False)
