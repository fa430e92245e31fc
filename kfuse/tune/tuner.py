"""The tuning entry used at compile time: ``kfuse.compile(..., tune="none"|"fast"|"full")``.

``tune_graph`` (a pipeline stage, after every fusion pass) finds each GEMM / conv kernel of
the graph, takes its config from the database when the problem was tuned before on this GPU
(a warm compile measures nothing), tunes the others (search + profiler, every measurement
committed to the database as it is made, so an interrupted run resumes), and writes the
chosen config into the node (``attrs["config"]``) for the lowering. A progress bar shows the
problems being tuned; a one-line summary says what was considered, measured and how long it
took. Without a GPU (and no injected ``measure``) nothing is measured: the database, the
nearest tuned neighbour or the template default is used, and the summary says so.

The database is an optimisation, never a failure: a file that cannot be opened, read or written
(locked, read-only, corrupt past its first page) is reported once and the tuner goes on without
it (nothing read counts as "no data"; measurements are then not stored).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.kernels.epilogue import Epilogue, exact_gelu
from kfuse.runtime.device import on_device
from kfuse.tune.cost_model import CostModel
from kfuse.tune.database import Record, TuningDB
from kfuse.tune.hardware import Hardware, query
from kfuse.tune.profiler import Measure, Measurement, Profiler, make_runner
from kfuse.tune.search import Budget, SearchResult, search, transfer_candidates
from kfuse.tune.shipped import seed
from kfuse.tune.space import Config, ConvProblem, GemmProblem, Problem, config_from_dict, is_valid, problem_from_dict

# what a database read can raise that means "this data is unusable": SQLite errors (a locked file,
# a page corrupt past the open check, text that is not UTF-8), and the JSON / fields of a record
# that this kfuse cannot read
_DB_ERRORS = (sqlite3.Error, ValueError, TypeError, KeyError, AttributeError)

TUNABLE = ("gemm_epilogue", "conv_epilogue")
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def dtype_name(dt: torch.dtype) -> str:
    return _DTYPES.get(dt, "fp32")


def problem_of(node: Node, graph: Graph) -> Problem | None:
    """The tuning problem of a ``gemm_epilogue`` / ``conv_epilogue`` node (None otherwise)."""
    ts = [graph.type_of(i) for i in node.inputs[:2]]
    if not all(isinstance(t, TensorType) for t in ts):
        return None
    a, b = ts
    assert isinstance(a, TensorType) and isinstance(b, TensorType)
    epi: Epilogue = node.attrs["epilogue"]
    if node.op == "gemm_epilogue":
        k, n = b.shape[-2], b.shape[-1]
        if b.rank == 2:
            m, batch = a.numel // max(1, a.shape[-1]), 1
        else:
            batch = 1
            for s in torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]):
                batch *= s
            m = a.shape[-2]
        if min(m, n, k, batch) <= 0:
            return None
        erf = exact_gelu(a.dtype) and any(s.op == "gelu" for s in epi.steps)
        return GemmProblem(m, n, k, batch, dtype_name(a.dtype), n_extras=epi.n_inputs, erf_gelu=erf)
    if node.op == "conv_epilogue":
        if int(node.attrs.get("groups", 1)) != 1 or any(node.attrs.get("pad_end") or ()):
            return None  # the conv problems are dense, symmetrically padded convs; the others run the default tile
        nb, c, h, w = a.shape
        oc, _, kh, kw = b.shape

        def pair(v: Any, d: int) -> tuple[int, int]:
            v = d if v is None else v
            return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))

        return ConvProblem(nb, c, h, w, oc, kh, kw, pair(node.attrs.get("stride"), 1), pair(node.attrs.get("padding"), 0),
                           pair(node.attrs.get("dilation"), 1), dtype_name(a.dtype), epi.n_inputs)  # fmt: skip
    return None


@dataclass
class TuneStats:
    problems: int = 0
    from_db: int = 0
    tuned: int = 0
    transferred: int = 0
    default: int = 0
    considered: int = 0
    measured: int = 0
    failed: int = 0
    problem_s: dict[str, float] = field(default_factory=dict)  # wall seconds of each tuned problem's search
    seconds: float = 0.0
    measuring: bool = True
    shipped: int = 0  # records seeded into the database from the file kfuse ships for this GPU, this compile
    results: list[SearchResult] = field(default_factory=list)

    def line(self, mode: str) -> str:
        s = (f"kfuse tune ({mode}): {self.problems} kernel problems: {self.from_db} from the database, {self.tuned} tuned"
             f" ({self.considered} candidates considered, {self.measured} measured, {self.failed} failed)"
             f" in {self.seconds:.1f} s")  # fmt: skip
        if not self.measuring:
            s += f"; no GPU: nothing measured, {self.transferred} from nearest tuned problem"
        if self.default:
            s += f"; {self.default} with the template default"
        if self.shipped:
            s += f"; {self.shipped} records seeded from kfuse's shipped records for this GPU"
        return s

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "results"}
        return d


class Tuner:
    """Chooses configs for problems: database first, else search + measure."""

    def __init__(
        self,
        mode: str = "fast",
        db: TuningDB | None = None,
        hw: Hardware | None = None,
        measure: Measure | None = None,
        device: torch.device | str | None = None,
        profiler: Profiler | None = None,
        progress: bool = True,
        check: bool = True,
    ) -> None:
        self.budget = Budget.for_mode(mode)
        self.mode = mode
        self._db_warned = False
        self._db_writable = True
        if db is None:
            try:
                db = TuningDB()
            except (sqlite3.Error, OSError) as e:  # locked, read-only, can't open: tune without it
                self._db_problem("open", e)
                db = TuningDB(":memory:")
        self.db = db
        self.hw = hw or query(device)
        self.gpu = self.hw.key()
        self.measure = measure
        self.device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # records seeded from the file kfuse ships for this GPU (kfuse.tune.shipped), once; only on the GPU itself (on
        # the CPU the hardware is the H200 table entry, not a GPU the records were measured on)
        self.shipped = 0
        if self.device.type == "cuda":
            try:
                self.shipped = seed(self.db, self.gpu)
            except _DB_ERRORS as e:  # a bad shipped file or a read-only database: tune as before
                self._db_problem("seed", e)
        self.can_measure = measure is not None or self.device.type == "cuda"
        self.profiler = profiler or Profiler(measure=measure, check=check)
        self.progress = progress
        self.model: dict[str, CostModel] = {}
        self.stats = TuneStats(measuring=self.can_measure, shipped=self.shipped)

    # ---- database ------------------------------------------------------------------------
    def _db_problem(self, what: str, e: BaseException) -> None:
        if not self._db_warned:
            self._db_warned = True
            path = getattr(getattr(self, "db", None), "path", None)
            why = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"kfuse tuning database{f' {path}' if path else ''}: cannot {what} it ({type(e).__name__}: {why});"
                          " tuning without it", stacklevel=3)  # fmt: skip

    def _read(self, fn: Callable[[], list[Record]]) -> list[Record]:
        """``fn()``'s records; none (and a warning, once) when the database cannot be read."""
        try:
            return fn()
        except _DB_ERRORS as e:
            self._db_problem("read", e)
            return []

    def _parsed(self, records: list[Record], template: str) -> Iterator[tuple[Record, Problem | None, Config]]:
        """Each record with its problem (None where its JSON is unreadable) and config; a record
        whose config this kfuse cannot read is skipped."""
        for rec in records:
            try:
                cfg = config_from_dict(template, rec.config)
            except _DB_ERRORS:
                continue
            try:
                prob: Problem | None = problem_from_dict(json.loads(rec.problem_json))
            except _DB_ERRORS:
                prob = None
            yield rec, prob, cfg

    def lookup(self, problem: Problem) -> Config | None:
        """The tuned config of a problem when its tuning finished before (this GPU, Triton and kfuse)."""
        recs = self._read(lambda: self.db.measured(self.gpu, problem.template, problem.signature()))
        for rec in reversed(recs):
            if rec.status == "done" and (self.mode != "full" or "mode=full" in rec.error):
                try:
                    cfg = config_from_dict(problem.template, rec.config)
                    return cfg if is_valid(cfg, problem, self.hw) else None
                except _DB_ERRORS:
                    return None
        return None

    def _neighbours(self, template: str) -> list[tuple[Problem, Config]]:
        recs = [r for r in self._read(lambda: self.db.records(self.gpu, template)) if r.status == "done"]
        return [(p, cfg) for _, p, cfg in self._parsed(recs, template) if p is not None]

    def _history(self, template: str) -> list[tuple[Config, Problem, float]]:
        recs = [r for r in self._read(lambda: self.db.records(self.gpu, template)) if r.status == "ok" and r.time_ms]
        return [(cfg, p, r.time_ms) for r, p, cfg in self._parsed(recs, template) if p is not None and r.time_ms]  # type: ignore[misc]

    def _write(self, *args: Any) -> None:
        """``db.add(*args)``; a database that cannot be written (locked past the busy timeout,
        read-only, disk full) is reported once and the tuning goes on without storing."""
        if not self._db_writable:
            return
        try:
            self.db.add(*args)
        except sqlite3.Error as e:
            self._db_writable = False
            self._db_problem("write", e)

    def _model(self, template: str) -> CostModel:
        if template not in self.model:
            m = CostModel(self.hw)
            m.fit(self._history(template))
            self.model[template] = m
        return self.model[template]

    # ---- tuning --------------------------------------------------------------------------
    def tune(self, problem: Problem, epi: Epilogue | None = None, space: Sequence[Config] | None = None) -> SearchResult:
        """Search + measure one problem (resuming from its earlier measurements)."""
        tmpl, sig = problem.template, problem.signature()
        pj = json.dumps(problem.as_dict())
        earlier = [r for r in self._read(lambda: self.db.measured(self.gpu, tmpl, sig)) if r.status != "done"]
        already = [Measurement(cfg, r.time_ms, r.status, r.error) for r, _, cfg in self._parsed(earlier, tmpl)]

        def commit(m: Measurement) -> None:
            self._write(self.gpu, tmpl, sig, pj, m.config.as_dict(), m.time_ms, m.status, m.error)

        runner = None
        if self.device.type == "cuda" or (self.measure is not None and self.profiler.do_check and self._small(problem)):
            runner = make_runner(problem, self.device, epi)
        with on_device(self.device):  # Triton launches, CUDA events and graphs on the tuned GPU, also where another is current
            res = search(problem, self.hw, self.profiler, runner, self._model(tmpl), self.budget,
                         self._neighbours(tmpl), self._history(tmpl), space=space, on_result=commit, already=already)  # fmt: skip
        if res.best is not None and not is_valid(res.best, problem, self.hw):  # never: search filters; never store or use one
            warnings.warn(f"kfuse tune: {sig}: the search returned an invalid config {res.best.describe()}; not used", stacklevel=2)
            res.best, res.best_ms = None, None
        if res.best is not None and space is None:  # a sub-space's best is not the problem's tuned config
            self._write(self.gpu, tmpl, sig, pj, res.best.as_dict(), res.best_ms, "done", f"mode={self.mode}")
        return res

    @staticmethod
    def _small(problem: Problem) -> bool:
        """Small enough to execute in the Triton interpreter for the correctness check."""
        m, n, k = problem.mnk()
        return m * n * k <= 1 << 18

    def choose(self, problems: Sequence[tuple[Problem, Epilogue | None]]) -> dict[str, Config | None]:
        """A config for each problem (by signature), tuning those the database lacks."""
        t0 = time.perf_counter()
        out: dict[str, Config | None] = {}
        todo: list[tuple[Problem, Epilogue | None]] = []
        for p, e in problems:
            sig = p.signature()
            if sig in out or any(q.signature() == sig for q, _ in todo):
                continue
            self.stats.problems += 1
            cfg = self.lookup(p)
            if cfg is not None:
                out[sig] = cfg
                self.stats.from_db += 1
            elif self.can_measure:
                todo.append((p, e))
            else:
                near = transfer_candidates(p, self._neighbours(p.template), self.hw, 1)
                out[sig] = near[0] if near else None
                if near:
                    self.stats.transferred += 1
                else:
                    self.stats.default += 1
        if todo:
            for p, e in self._with_progress(todo):
                t_problem = time.perf_counter()
                res = self.tune(p, e)
                self.stats.problem_s[p.signature()] = round(time.perf_counter() - t_problem, 2)
                out[p.signature()] = res.best
                if res.considered == 0:  # no valid config in the space (tiny problem): template default
                    self.stats.default += 1
                    continue
                self.stats.tuned += 1
                self.stats.considered += res.considered
                self.stats.measured += res.n_measured
                self.stats.failed += sum(1 for m in res.measured if not m.ok)
                self.stats.results.append(res)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def _with_progress(self, todo: list[tuple[Problem, Epilogue | None]]):  # noqa: ANN202 - a generator
        if not self.progress:
            yield from todo
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        cols = (TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
        with Progress(*cols, console=Console(file=sys.stderr), transient=True) as prog:
            task = prog.add_task("", total=len(todo))
            for p, e in todo:
                prog.update(task, description=p.signature())
                yield p, e
                prog.advance(task)


def tune_graph(
    graph: Graph, options: Any = None, tuner: Tuner | None = None, verbose: bool = True, device: torch.device | str | None = None
) -> Graph:
    """Pipeline stage: set ``attrs["config"]`` of every GEMM / conv kernel node from the
    database or by tuning. ``options.tune`` picks the mode ("none" returns ``graph``). ``device``:
    where the plan runs (the compile's inputs' device); None: the weights' device."""
    mode = getattr(options, "tune", "fast") if tuner is None else tuner.mode
    if mode == "none":
        return graph
    # a b2b chain keeps its original kernels (attrs["unfused"]) for the measured fused-vs-unfused
    # decision: they are tuned too, so that the decision compares two tuned plans (their
    # intermediates' types come from the stage nodes themselves)
    inner = [s for n in graph.nodes for s in n.attrs.get("unfused", ()) if s.op in TUNABLE]
    nodes = [n for n in graph.nodes if n.op in TUNABLE] + inner
    if not nodes:
        return graph
    if tuner is None:
        # the model's device, not the machine's: a CPU model compiled on a GPU machine runs on the CPU,
        # where there is nothing to time. The compile passes the inputs' device, where the plan runs; the
        # weights' device is only a fallback (ONNX initializers are CPU tensors even for a GPU model)
        if device is None:
            weights = [t for t in graph.constants.values() if isinstance(t, torch.Tensor)]
            device = weights[0].device if weights else None
        tuner = Tuner(mode, progress=verbose, device=device)
    LAST.clear()
    LAST.append(tuner)  # the benchmark and the report read the stats of the latest compile
    ctx = graph.replace(nodes=tuple(graph.nodes) + tuple(inner)) if inner else graph
    probs = {n.name: problem_of(n, ctx) for n in nodes}
    chosen = tuner.choose([(p, n.attrs["epilogue"]) for n in nodes if (p := probs[n.name]) is not None])
    if verbose:
        print(tuner.stats.line(mode), file=sys.stderr)

    def configured(node: Node) -> Node:
        p = probs.get(node.name)
        cfg = chosen.get(p.signature()) if p is not None and node.op in TUNABLE else None
        if cfg is not None:
            node = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "config": cfg})
        if "unfused" in node.attrs:
            stages = tuple(map(configured, node.attrs["unfused"]))
            node = Node(node.name, node.op, node.inputs, node.type, {**node.attrs, "unfused": stages})
        return node

    b = GraphBuilder.from_graph(graph)
    for node in graph.nodes:
        b.add_node(configured(node))
    return b.build(graph.outputs)


_LOOKUP: dict[tuple[str, int], Tuner] = {}
LAST: list[Tuner] = []


def lookup_config(problem: Problem, mode: str = "fast") -> Config | None:
    """The database's config for ``problem`` on the current GPU (a compile makes its inputs' GPU
    current), without tuning (for lowerings of graphs that did not go through the tuning stage)."""
    try:
        # one lookup tuner per GPU: its records are keyed by that GPU's name (a node may mix models)
        index = torch.cuda.current_device() if torch.cuda.is_available() else -1
        key = (mode, index)
        if key not in _LOOKUP:
            _LOOKUP[key] = Tuner(mode, progress=False, device=torch.device("cuda", index) if index >= 0 else None)
        return _LOOKUP[key].lookup(problem)
    except Exception:  # noqa: BLE001 - the database is an optimisation, never a failure
        return None
