"""Compiling Triton kernels in worker processes, so that a batch of candidates compiles on every core.

The tuner and the back-to-back decision compile 10-20 candidate kernels before they time any. Threads
do not scale that: a Triton compile holds the GIL for much of its frontend and LLVM passes (session
31, offline: four heavy Gluon GEMMs took 4.44 s one after the other and 2.93 s on two threads).
Here the batch runs once with Triton's ``jit_cache_hook`` recording and skipping every compile on
the calling thread (no kernel launches: the calls only specialise their kernels), worker processes
compile what was recorded into Triton's on-disk cache, and the real first calls afterwards load the
cubins from that cache in milliseconds.

Measured on the H200 host (16 cores, session 32, fresh caches): a cold compile of bert-base B8 S128
31.3 s against 37.3 with thread pools alone, vit-tiny 47.6 against 58.2. A batch still waits for its
slowest kernel, and a worker takes ~10 s to start (it imports torch and kfuse's kernels), so the pool
starts when a compile starts. Processes also make a compile time-out possible (a thread cannot be
stopped): a candidate whose kernel passes it is reported in ``slow_calls`` and dropped by its caller.

The workers only warm the cache. A request they cannot reproduce (a kernel defined where a fresh
process cannot import it, a specialisation that does not round-trip) costs its compile time
twice at worst; it never changes which kernel runs, because the caller still compiles and runs
every candidate itself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

_LOG = logging.getLogger("kfuse.parallel_compile")

# a worker per core beyond the caller's, at most this many (each holds a Triton + torch import)
MAX_WORKERS = 12


@dataclass(frozen=True)
class CompileRequest:
    """One kernel specialisation as Triton's ``jit_cache_hook`` describes it, and where a fresh
    process finds the kernel: its module (by name, or by file for kfuse's generated modules)."""

    module: str
    module_file: str | None
    qualname: str
    specialization: str  # Triton's JSON (``serialize_specialization_data``)
    target: tuple[str, int | str, int]  # backend, arch, warp size

    def as_json(self) -> str:
        return json.dumps({"module": self.module, "module_file": self.module_file, "qualname": self.qualname,
                           "specialization": self.specialization, "target": list(self.target)})  # fmt: skip


@dataclass
class PrecompileReport:
    """What one ``precompile`` did: requests recorded, compiled by the workers, failed (with the
    worker's reason), calls that raised while recording, and the wall time."""

    requests: int = 0
    compiled: int = 0
    hashes: list[str] = field(default_factory=list)  # of the kernels compiled (Triton's ``CompiledKernel.hash``)
    durations: list[tuple[str, float]] = field(default_factory=list)  # (kernel, worker seconds), longest first
    failed: dict[str, str] = field(default_factory=dict)
    timed_out: list[int] = field(default_factory=list)  # requests whose compile passed the kernel time-out
    slow_calls: list[int] = field(default_factory=list)  # calls with such a request (``precompile``)
    call_errors: int = 0
    workers: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"{self.compiled}/{self.requests} kernels compiled on {self.workers} worker processes in {self.seconds:.1f} s"
                + (f", {len(self.failed)} failed" if self.failed else "")
                + (f" ({len(self.timed_out)} past the time-out)" if self.timed_out else ""))  # fmt: skip


def enabled() -> bool:
    """Worker compiles are on unless ``KFUSE_COMPILE_WORKERS=0``, or kernels run in the interpreter."""
    from kfuse.kernels.codegen import interpreting

    return not interpreting() and worker_count() > 0


def worker_count() -> int:
    """``$KFUSE_COMPILE_WORKERS``, else one per core but one, at most ``MAX_WORKERS``."""
    env = os.environ.get("KFUSE_COMPILE_WORKERS")
    if env is not None and env.strip() != "":
        return max(0, int(env))
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 2) - 1))


# ------------------------------------------------------------------------------------------
# recording: Triton's jit_cache_hook, on the recording thread only
# ------------------------------------------------------------------------------------------
_RECORDING: dict[int, list[CompileRequest]] = {}
_HOOK_LOCK = threading.Lock()
_PREVIOUS_HOOK: list[Any] = []  # the hook that was set before ours (chained for other threads)


def request_from_hook(fn: Any, compile: dict[str, Any], target: Any) -> CompileRequest:
    """A ``CompileRequest`` from the arguments Triton passes its ``jit_cache_hook``."""
    jit = fn.jit_function
    mod = sys.modules.get(jit.fn.__module__)
    mod_file = getattr(mod, "__file__", None) if mod is not None else None
    return CompileRequest(jit.fn.__module__, mod_file, jit.fn.__qualname__, compile["specialization_data"],
                          (target.backend, target.arch, target.warp_size))  # fmt: skip


def _hook(**kw: Any) -> bool | None:
    sink = _RECORDING.get(threading.get_ident())
    if sink is None:  # another thread compiling for real: whatever hook was there before
        prev = _PREVIOUS_HOOK[0] if _PREVIOUS_HOOK else None
        return prev(**kw) if prev is not None else None
    from triton.runtime import driver

    sink.append(request_from_hook(kw["fn"], kw["compile"], driver.active.get_current_target()))
    return True  # skip the compile (and so the launch)


@contextlib.contextmanager
def recording() -> Iterator[list[CompileRequest]]:
    """Inside the block, every Triton JIT compile on this thread is recorded and skipped: the
    kernel is not compiled and not launched (its outputs hold whatever was there)."""
    from triton import knobs

    me = threading.get_ident()
    sink: list[CompileRequest] = []
    with _HOOK_LOCK:
        if not _RECORDING:
            _PREVIOUS_HOOK[:] = [knobs.runtime.jit_cache_hook]
            knobs.runtime.jit_cache_hook = _hook
        _RECORDING[me] = sink
    try:
        yield sink
    finally:
        with _HOOK_LOCK:
            del _RECORDING[me]
            if not _RECORDING:
                knobs.runtime.jit_cache_hook = _PREVIOUS_HOOK[0] if _PREVIOUS_HOOK else None
                _PREVIOUS_HOOK.clear()


def record(calls: Iterable[Callable[[], Any]]) -> tuple[list[CompileRequest], list[list[int]], int]:
    """The distinct compile requests of ``calls`` (run once each while recording), which of them
    each call made (indexes), and how many calls raised (a launcher that needs a real compile
    result, or a candidate that cannot run: its own first call reports that later)."""
    errors = 0
    index: dict[CompileRequest, int] = {}
    requests: list[CompileRequest] = []
    per_call: list[list[int]] = []
    with recording() as sink:
        for call in calls:
            before = len(sink)
            try:
                call()
            except Exception:  # noqa: BLE001 - the real first call raises it again, where it is recorded
                errors += 1
            mine = []
            for r in sink[before:]:
                if r not in index:
                    index[r] = len(requests)
                    requests.append(r)
                mine.append(index[r])
            per_call.append(mine)
    return requests, per_call, errors


# ------------------------------------------------------------------------------------------
# compiling one request (in the worker)
# ------------------------------------------------------------------------------------------
def _tuples(v: Any) -> Any:
    """JSON's lists back to the tuples Triton's options hold (``extern_libs`` is a tuple of pairs)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _constant(v: Any) -> Any:
    """A constexpr value as ``serialize_specialization_data`` wrote it, as the JIT held it."""
    import triton.language as tl

    if isinstance(v, str) and tl.dtype.is_dtype(v):
        return tl.dtype(v)
    if isinstance(v, dict) and "constexpr" in v:
        return tl.constexpr(v["constexpr"])
    return _tuples(v)


def _load_function(module: str, module_file: str | None, qualname: str) -> Any:
    import importlib
    import importlib.util

    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            if module_file is None:
                raise
            spec = importlib.util.spec_from_file_location(module, module_file)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {module} from {module_file}") from None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[module] = mod
            spec.loader.exec_module(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def compile_request(req: CompileRequest) -> str:
    """Compile ``req`` as ``JITFunction.preload`` would, for the recorded target rather than the
    current device (a worker needs no GPU); returns the compiled kernel's hash. The result lands in
    Triton's cache under the key the caller's own compile computes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    fn = _load_function(req.module, req.module_file, req.qualname)
    spec = json.loads(req.specialization)
    constexprs = {tuple(k): _constant(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)}
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"], strict=True)}
    signature = {k: _tuples(v) for k, v in spec["signature"].items()}
    target = GPUTarget(req.target[0], req.target[1], req.target[2])
    backend = make_backend(target)
    options = backend.parse_options({k: _tuples(v) for k, v in spec["options"].items()})
    source_cls = ASTSource
    with contextlib.suppress(ImportError):
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

        if isinstance(fn, GluonJITFunction):
            source_cls = GluonASTSource
    kernel = triton.compile(source_cls(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    return str(kernel.hash)


# imported by each worker before it says it is ready (while the caller is still tracing its model):
# the modules whose kernels kfuse compiles most, so a request does not wait for torch and Triton's compiler
PRELOAD = ("triton.compiler.compiler", "kfuse.kernels.gemm", "kfuse.kernels.gemm_ws", "kfuse.kernels.conv",
           "kfuse.kernels.attention", "kfuse.kernels.b2b.launcher")  # fmt: skip


# seconds a worker waits for a request before it exits
IDLE_EXIT_S = 300.0


def worker_main() -> None:
    """A worker: imports ``PRELOAD``, says "ready", then one JSON request a line on stdin, one JSON
    answer a line on stdout."""
    import importlib

    out = sys.stdout
    sys.stdout = sys.stderr  # anything a kernel module prints must not corrupt the answers
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    out.write("ready\n")
    out.flush()
    idle_s = float(os.environ.get("KFUSE_COMPILE_WORKER_IDLE_S", IDLE_EXIT_S))
    while True:
        # an idle worker exits (a serving process keeps no idle compilers); the pool starts another on demand
        if not select.select([sys.stdin], [], [], idle_s)[0]:
            return
        line = sys.stdin.readline()
        if not line:
            return
        if not line.strip():
            continue
        t0 = time.perf_counter()
        try:
            d = json.loads(line)
            req = CompileRequest(d["module"], d["module_file"], d["qualname"], d["specialization"], tuple(d["target"]))
            answer = {"ok": True, "hash": compile_request(req)}
        except BaseException as e:  # noqa: BLE001 - reported to the caller, who compiles it itself
            answer = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        answer["s"] = time.perf_counter() - t0
        out.write(json.dumps(answer) + "\n")
        out.flush()


# ------------------------------------------------------------------------------------------
# the pool: long-lived worker processes (started once, early, and reused by every later batch)
# ------------------------------------------------------------------------------------------
class _Worker:
    def __init__(self) -> None:
        env = dict(os.environ)
        # the caller's import path (a tree run with PYTHONPATH=., pytest's rootdir), so the worker
        # imports the same kfuse and the same kernel modules
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["TRITON_INTERPRET"] = "0"  # compiles, even where kfuse would default to the interpreter (no GPU)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kfuse.runtime.parallel_compile", "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        self.ready = threading.Event()
        self.busy = threading.Lock()  # taken by a batch for the thread it gives this worker, released when that thread ends
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() == "ready":
            self.ready.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, req: CompileRequest, timeout_s: float) -> dict[str, Any]:
        """The worker's answer to ``req``; past ``timeout_s`` the worker is killed (TimeoutError)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(req.as_json() + "\n")
        self.proc.stdin.flush()
        # one request in flight, so nothing is buffered ahead of the answer: select sees it
        if not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            self.close()
            raise TimeoutError(f"compile took over {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"compile worker exited (code {self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)


_POOL: list[_Worker] = []
_POOL_LOCK = threading.Lock()


def start_pool(n: int | None = None) -> int:
    """Start worker processes up to ``n`` (default ``worker_count()``) without waiting for them:
    a compile calls this first, so the workers import while the model is traced. Returns the
    pool's size (0 where worker compiles are off)."""
    if not enabled():
        return 0
    n = worker_count() if n is None else n
    with _POOL_LOCK:
        _POOL[:] = [w for w in _POOL if w.alive()]
        if not _POOL:
            atexit.register(shutdown)
        while len(_POOL) < n:
            _POOL.append(_Worker())
        return len(_POOL)


def shutdown() -> None:
    """Stop the worker processes (at exit; a later batch starts new ones)."""
    with _POOL_LOCK:
        for w in _POOL:
            w.close()
        _POOL.clear()


# how long a worker may take to start (import torch, Triton and kfuse's kernels) before a batch gives up on it
START_TIMEOUT_S = 120.0


def compile_in_workers(
    requests: list[CompileRequest], workers: int | None = None, kernel_timeout_s: float = 600.0, batch_timeout_s: float = 1800.0
) -> PrecompileReport:  # fmt: skip
    """Compile ``requests`` on the pool's ready workers (at most ``workers``, default
    ``worker_count()``): each takes the next request as it finishes one, and workers that become
    ready during the batch join it. A kernel past ``kernel_timeout_s`` is reported in
    ``timed_out`` and its worker replaced; what is left when no worker can help (none starts,
    or the batch passes ``batch_timeout_s``) is left to the caller's own compiles."""
    report = PrecompileReport(requests=len(requests))
    if not requests:
        return report
    n = min(workers if workers is not None else worker_count(), len(requests))
    start_pool(max(n, len(_POOL)))
    t0 = time.perf_counter()
    todo: queue.Queue[tuple[int, CompileRequest]] = queue.Queue()
    for i, r in enumerate(requests):
        todo.put((i, r))
    lock = threading.Lock()
    answered = threading.Semaphore(0)
    used: set[int] = set()

    def drain(w: _Worker) -> None:
        try:
            while True:
                try:
                    i, req = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    ans = w.ask(req, kernel_timeout_s)
                except TimeoutError as e:
                    start_pool(len(_POOL))  # a fresh worker in its place
                    with lock:
                        report.timed_out.append(i)
                        report.failed[req.qualname] = str(e)
                    answered.release()
                    return
                except Exception as e:  # noqa: BLE001 - a dead worker: the caller compiles this one
                    with lock:
                        report.failed[req.qualname] = f"{type(e).__name__}: {e}"
                    answered.release()
                    return
                with lock:
                    report.durations.append((req.qualname, round(float(ans.get("s", 0.0)), 2)))
                    if ans.get("ok"):
                        report.compiled += 1
                        report.hashes.append(str(ans["hash"]))
                    else:
                        report.failed[req.qualname] = str(ans.get("error"))
                answered.release()
        finally:
            w.busy.release()

    done = 0
    while done < len(requests):
        now = time.perf_counter()
        with _POOL_LOCK:
            pool = list(_POOL)
        active = sum(1 for w in pool if id(w) in used and w.alive())
        for w in pool:
            if active < n and id(w) not in used and w.ready.is_set() and w.alive() and w.busy.acquire(blocking=False):
                active += 1
                used.add(id(w))
                threading.Thread(target=drain, args=(w,), daemon=True).start()
        starting = any(w.alive() and not w.ready.is_set() for w in pool)
        working = any(id(w) in used and w.alive() for w in pool)
        if now - t0 > batch_timeout_s or not (working or (starting and now - t0 < START_TIMEOUT_S)):
            break  # nothing left that can answer: the caller compiles the rest
        if answered.acquire(timeout=0.05):
            done += 1
    report.workers = len(used)
    report.seconds = time.perf_counter() - t0
    report.durations.sort(key=lambda d: -d[1])
    return report


def ready_workers() -> int:
    """How many of the pool's workers are started and idle-ready."""
    with _POOL_LOCK:
        return sum(1 for w in _POOL if w.ready.is_set() and w.alive())


def precompile(calls: Iterable[Callable[[], Any]], workers: int | None = None, kernel_timeout_s: float = 600.0,
               wait: bool = True) -> PrecompileReport:  # fmt: skip
    """Record the kernels ``calls`` would compile and compile them on worker processes, so that
    the calls, made for real afterwards, find their cubins in Triton's cache. ``slow_calls`` of
    the report: the calls with a kernel that took over ``kernel_timeout_s`` to compile (a caller
    choosing among candidates drops them; compiling them itself would take as long).
    ``wait=False``: nothing is done unless half the pool is ready (a worker takes ~10 s to start
    on the H200 host; a caller whose own threads compile as fast needs no time-out and should not
    wait for them). Nothing to do (an empty report) where ``enabled()`` is false."""
    if not enabled():
        return PrecompileReport()
    if not wait:
        n = start_pool()
        if ready_workers() < max(2, n // 2):
            return PrecompileReport()
    t0 = time.perf_counter()
    requests, per_call, errors = record(calls)
    report = compile_in_workers(requests, workers, kernel_timeout_s)
    report.call_errors = errors
    slow = set(report.timed_out)
    report.slow_calls = [c for c, reqs in enumerate(per_call) if slow & set(reqs)]
    report.seconds = time.perf_counter() - t0
    if report.requests:
        _LOG.info("%s; longest %s", report.summary(), report.durations[:3])
        for name, why in report.failed.items():
            _LOG.info("worker compile of %s failed: %s", name, why)
    return report


if __name__ == "__main__" and "--worker" in sys.argv:
    worker_main()
