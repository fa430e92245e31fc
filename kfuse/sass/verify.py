"""Probabilistic testing and timing of candidate cubins in a child process that is allowed to die.

An illegal schedule can raise an illegal-address error (which poisons the CUDA context for good) or hang,
so every candidate runs in a worker process; the parent kills and restarts it when it dies or times out
and records the candidate as failed.  The parent never touches the GPU on the candidates' behalf.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Any

# ("tensor", shape, stride, dtype, fill, cpu_data_or_None) or ("value", v)
ArgSpec = tuple


@dataclass
class LaunchSpec:
    """Everything the worker needs to launch a Triton kernel from raw cubin bytes (all picklable)."""

    name: str
    cubin: bytes  # the original schedule, the reference for every test
    metadata: dict[str, Any]
    signature: dict[str, str]
    constants: dict[Any, Any]
    arg_names: list[str]
    args: list[ArgSpec]  # timing problem
    grid: tuple[int, int, int]
    verify_args: list[ArgSpec] | None = None  # verification problem (defaults to the timing one)
    verify_grid: tuple[int, int, int] | None = None  # its grid: required with verify_args
    samples_per_launch: int = 1  # independent random input sets one verification launch covers
    extra: dict[str, Any] = field(default_factory=dict)
    device_index: int = 0  # the GPU the kernel's tensors are on: the spawned worker times and checks there

    def __post_init__(self) -> None:
        # the timing grid on a bigger verification problem would leave most of its outputs unwritten by
        # both kernels, and the bitwise comparison would pass whatever the candidate computes there
        if self.verify_args is not None and self.verify_grid is None:
            raise ValueError("LaunchSpec: verify_args needs its own verify_grid (kfuse.sass.api.launch_spec derives it)")

    def verification(self) -> tuple[list[ArgSpec], tuple[int, int, int]]:
        """(argument specs, grid) of the problem candidates are verified on."""
        if self.verify_args is not None:
            assert self.verify_grid is not None
            return self.verify_args, self.verify_grid
        return self.args, self.verify_grid or self.grid


def arg_specs(args: tuple | list) -> list[ArgSpec]:
    """Describe example arguments: floating tensors get fresh random data per test, others are copied."""
    import torch

    out: list[ArgSpec] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            fill = "randn" if a.is_floating_point() else "copy"
            data = a.detach().cpu() if fill == "copy" else None
            out.append(("tensor", tuple(a.shape), tuple(a.stride()), str(a.dtype).replace("torch.", ""), fill, data))
        else:
            out.append(("value", a))
    return out


def abba_ratio(time_a: Any, time_b: Any, rounds: int = 8) -> tuple[float, float, float]:
    """Time two kernels in A B B A order, ``rounds`` times; returns (ms of A, ms of B, A / B), each
    the median over rounds. A linear drift of the clock within a round cancels exactly, and neither
    kernel always runs first: the H200 ran whichever of a heavy pair went first 3-10% faster
    (power and clocks settle over ~100 ms), so candidate-then-original made every attention and
    large-GEMM candidate look 6-12% faster and original-then-candidate made it look slower
    (session 6). ``time_a`` / ``time_b`` return ms per launch of one short chunk of launches."""
    ta, tb, ratios = [], [], []
    for _ in range(rounds):
        a1, b1, b2, a2 = time_a(), time_b(), time_b(), time_a()
        ta.append((a1 + a2) / 2)
        tb.append((b1 + b2) / 2)
        ratios.append((a1 + a2) / (b1 + b2))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return med(ta), med(tb), med(ratios)


# ---------------------------------------------------------------------------------------------- worker side
class _Runner:
    def __init__(self, spec: LaunchSpec) -> None:
        import collections
        from types import SimpleNamespace

        import torch
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        self.torch, self.spec, self.driver = torch, spec, driver
        md = dict(spec.metadata)
        t = md["target"]
        md["target"] = GPUTarget(t["backend"], t["arch"], t["warp_size"])
        self.md = collections.namedtuple("KernelMetadata", sorted(md))(**md)
        self.packed = make_backend(self.md.target).pack_metadata(self.md)
        src = SimpleNamespace(constants=spec.constants, signature=spec.signature, fn=SimpleNamespace(arg_names=spec.arg_names))
        self.launcher = driver.active.launcher_cls(src, self.md)
        self.device = driver.active.get_current_device()
        self.stream = driver.active.get_current_stream(self.device)
        self.ref = self.load(spec.cubin)
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(int(spec.extra.get("seed", 1234)))

    def load(self, cubin: bytes) -> Any:
        _, fn, _, _, _ = self.driver.active.utils.load_binary(self.spec.name, cubin, self.md.shared, self.device)
        return fn

    def make(self, specs: list[ArgSpec]) -> list[Any]:
        torch = self.torch
        out = []
        for s in specs:
            if s[0] == "value":
                out.append(s[1])
                continue
            _, shape, stride, dtype, fill, data = s
            t = torch.empty_strided(shape, stride, dtype=getattr(torch, dtype), device="cuda")
            if fill == "randn":
                t.normal_(generator=self.gen)
            elif data is not None:
                t.copy_(data)
            out.append(t)
        return out

    def launch(self, fn: Any, grid: tuple[int, int, int], args: list[Any]) -> None:
        self.launcher(grid[0], grid[1], grid[2], self.stream, fn, self.packed, None, None, None, *args)

    def _chunk_timer(self, fn: Any, args: list[Any], chunk_ms: float, min_reps: int, max_reps: int) -> Any:
        """A function timing one chunk of launches of any kernel on ``args`` (ms per launch); the
        chunk's launch count is sized from one timed launch of ``fn`` to take about ``chunk_ms``."""
        s, e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        s.record()
        self.launch(fn, self.spec.grid, args)
        e.record()
        e.synchronize()
        reps = max(min_reps, min(max_reps, int(chunk_ms / max(s.elapsed_time(e), 1e-3))))

        def chunk(kernel: Any) -> float:
            s.record()
            for _ in range(reps):
                self.launch(kernel, self.spec.grid, args)
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / reps

        return chunk

    def time(self, cubin: bytes, target_ms: float = 25.0) -> float:
        fn = self.load(cubin)
        args = self.make(self.spec.args)
        for _ in range(3):
            self.launch(fn, self.spec.grid, args)
        self.torch.cuda.synchronize()
        chunk = self._chunk_timer(fn, args, target_ms, 3, 500)
        return sorted(chunk(fn) for _ in range(5))[2]

    def time_pair(self, a: bytes, b: bytes, chunk_ms: float = 2.0, rounds: int = 8) -> tuple[float, float, float]:
        """``abba_ratio`` of cubins ``a`` and ``b`` on one set of arguments, in chunks of ~2 ms."""
        fa, fb = self.load(a), self.load(b)
        args = self.make(self.spec.args)
        for fn in (fa, fb, fa, fb):
            self.launch(fn, self.spec.grid, args)
        self.torch.cuda.synchronize()
        chunk = self._chunk_timer(fb, args, chunk_ms, 2, 1000)
        return abba_ratio(lambda: chunk(fa), lambda: chunk(fb), rounds)

    def make_batch(self, specs: list[ArgSpec], count: int) -> tuple[list[Any], list[list[Any]]]:
        """`count` independent argument sets carved from one flat buffer per tensor (one RNG call each)."""
        torch = self.torch
        flats, sets = [], [[] for _ in range(count)]
        for s in specs:
            if s[0] == "value":
                flats.append(None)
                for a in sets:
                    a.append(s[1])
                continue
            _, shape, stride, dtype, fill, data = s
            n = 1 + sum((d - 1) * st for d, st in zip(shape, stride, strict=True)) if all(shape) else 0
            flat = torch.empty(count * n, dtype=getattr(torch, dtype), device="cuda")
            if fill == "randn":
                flat.normal_(generator=self.gen)
            for i, a in enumerate(sets):
                t = flat[i * n : (i + 1) * n].as_strided(shape, stride)
                if fill != "randn" and data is not None:
                    t.copy_(data)
                a.append(t)
            flats.append(flat)
        return flats, sets

    def check(self, cubin: bytes, launches: int, batch_bytes: float = 2e9) -> tuple[bool, int, str]:
        """Run original and candidate on `launches` fresh random input sets; compare every tensor bitwise.

        Input sets are generated many at a time (one RNG call per tensor per batch), then launched one by one
        on the original (copy A) and the candidate (copy B)."""
        torch = self.torch
        fn = self.load(cubin)
        specs, grid = self.spec.verification()
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        per_set = sum(math.prod(s[1]) * getattr(torch, s[3]).itemsize for s in specs if s[0] == "tensor") or 1
        step = max(1, min(launches, int(batch_bytes // (2 * per_set))))
        done = 0
        while done < launches:
            count = min(step, launches - done)
            flats_a, sets_a = self.make_batch(specs, count)
            flats_b = [f.clone() if f is not None else None for f in flats_a]
            sets_b = []
            for i in range(count):
                row = []
                for k, x in enumerate(sets_a[i]):
                    if flats_b[k] is None:
                        row.append(x)
                    else:
                        n = flats_a[k].numel() // count
                        row.append(flats_b[k][i * n : (i + 1) * n].as_strided(x.shape, x.stride()))
                sets_b.append(row)
            for i in range(count):
                self.launch(self.ref, grid, sets_a[i])
            for i in range(count):
                self.launch(fn, grid, sets_b[i])
            for k, (x, y) in enumerate(zip(flats_a, flats_b, strict=True)):
                if x is not None and not torch.equal(x.view(ints[x.element_size()]), y.view(ints[y.element_size()])):
                    bad = int((x.view(ints[x.element_size()]) != y.view(ints[y.element_size()])).sum())
                    return False, done, f"argument {k} ({self.spec.arg_names[k]}) differs in {bad} elements"
            done += count
        torch.cuda.synchronize()
        return True, launches, ""


def _worker(conn: Any, spec: LaunchSpec) -> None:
    import torch

    torch.cuda.set_device(spec.device_index)  # a spawned process starts on device 0
    runner = _Runner(spec)
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        try:
            if msg[0] == "time":
                conn.send(("ok", runner.time(msg[1])))
            elif msg[0] == "time_pair":
                conn.send(("ok", runner.time_pair(msg[1], msg[2])))
            elif msg[0] == "check":
                conn.send(("ok", runner.check(msg[1], msg[2])))
        except Exception as e:  # a failing candidate; the context may be dead, so the worker exits
            conn.send(("error", f"{type(e).__name__}: {e}"))
            return


# ---------------------------------------------------------------------------------------------- parent side
class Evaluator:
    """Parent-side handle on the worker process; restarts it whenever a candidate kills it."""

    def __init__(self, spec: LaunchSpec, timeout_s: float = 60.0, start_timeout_s: float = 300.0) -> None:
        self.spec, self.timeout_s, self.start_timeout_s = spec, timeout_s, start_timeout_s
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0
        self.failures: list[str] = []  # why candidates failed (crash, hang, mismatch)

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.spec), daemon=True)
        self.proc.start()
        self.conn = parent
        if not parent.poll(self.start_timeout_s):
            self.close()
            raise RuntimeError("the SASS evaluation worker did not start (no GPU, or CUDA failed)")
        kind, _ = parent.recv()
        assert kind == "ready"

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
            self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(2)
        self.proc = self.conn = None

    def _call(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        try:
            self.conn.send(msg)
            if not self.conn.poll(timeout):
                raise TimeoutError(f"candidate ran longer than {timeout:.0f} s")
            kind, val = self.conn.recv()
        except (EOFError, OSError, TimeoutError) as e:
            kind, val = "error", f"worker died: {e}"
        if kind == "error":
            if self.proc is not None:
                self.proc.kill()
                self.proc.join(5)
            self.proc = None
            self.restarts += 1
            self.failures.append(str(val)[:300])
        return kind, val

    def time(self, cubin: bytes) -> float | None:
        kind, val = self._call(("time", cubin), self.timeout_s)
        return val if kind == "ok" else None

    def time_pair(self, a: bytes, b: bytes) -> tuple[float, float, float] | None:
        """(ms of a, ms of b, a / b) timed interleaved A B B A (``abba_ratio``); None if either failed."""
        kind, val = self._call(("time_pair", a, b), self.timeout_s)
        return tuple(val) if kind == "ok" else None

    def check(self, cubin: bytes, samples: int, chunk_launches: int = 2000, progress: Any = None) -> tuple[bool, int, str]:
        """Test `samples` random input sets (rounded up to whole launches); returns (ok, samples tested, why)."""
        per = max(1, self.spec.samples_per_launch)
        launches = math.ceil(samples / per)
        done = 0
        while done < launches:
            n = min(chunk_launches, launches - done)
            t0 = time.time()
            kind, val = self._call(("check", cubin, n), max(self.timeout_s, 600.0))
            if kind != "ok":
                return False, done * per, str(val)
            ok, did, why = val
            done += did
            if not ok:
                self.failures.append(why)
            if progress is not None:
                progress(done * per, launches * per, time.time() - t0)
            if not ok:
                return False, done * per, why
        return True, done * per, ""

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
