"""Compiling Triton kernels on worker processes (kfuse.runtime.parallel_compile).

The compile tests run in a fresh process without the interpreter; on a machine with no GPU a
stand-in driver reports an sm_90 device, so the JIT specialises and compiles real sm_90 kernels
(nothing is launched: recording skips the launch, and the check compiles with ``warmup``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kfuse.runtime import executor, parallel_compile
from kfuse.runtime.parallel_compile import CompileRequest, PrecompileReport

HERE = Path(__file__).parent

SCRIPT = r"""
import json, sys, threading, time
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

if not torch.cuda.is_available():
    class StandInDriver:  # an sm_90 device for the JIT's specialisation; nothing is launched
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 0
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
    driver.set_active(StandInDriver())

from triton import knobs
from kfuse.runtime import parallel_compile as pc
from pc_kernels import scaled_add

dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(1000, device=dev, dtype=torch.float16)
out = {}
# distinct specialisations: BLOCK, ACT, n's divisibility by 16, and one repeated
specs = [(256, "none", 1000), (512, "none", 1000), (256, "relu", 1000), (256, "none", 1024), (256, "none", 1000)]
calls = [lambda b=b, a=a, n=n: scaled_add[(4,)](x, x, x, n, 0.5, BLOCK=b, ACT=a) for b, a, n in specs]
sentinel = lambda **kw: None
knobs.runtime.jit_cache_hook = sentinel
other = {}
with pc.recording() as sink:
    # another thread compiles for real while this one records
    t = threading.Thread(target=lambda: other.update(k=scaled_add.warmup(x, x, x, 1000, 0.5, BLOCK=1024, ACT="none", grid=(1,))))
    t.start(); t.join()
    for c in calls:
        assert c() is None  # skipped: no kernel, no launch
out["hook_restored"] = knobs.runtime.jit_cache_hook is sentinel
knobs.runtime.jit_cache_hook = None
out["other_thread_compiled"] = other.get("k") is not None
out["recorded"] = len(sink)
requests, per_call, errors = pc.record(calls)
out["requests"], out["call_errors"], out["per_call"] = len(requests), errors, per_call
out["in_process_kernels"] = sum(len(c[0]) for c in scaled_add.device_caches.values())

from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
a = torch.randn(1, 200, 96, device=dev, dtype=torch.float16); b = torch.randn(1, 96, 136, device=dev, dtype=torch.float16)
c = torch.empty(1, 200, 136, device=dev, dtype=torch.float16)
bias = torch.randn(1, 1, 136, device=dev, dtype=torch.float16).expand(1, 200, 136)
cfg = gemm_ws.WsConfig("pingpong", 128, 128, 64, 3, 8, 1, False)
gluon_call = lambda: gemm_ws.launch(a, b, c, [bias], epi, cfg, 4, warmup=True)
gluon_requests, _, _ = pc.record([gluon_call])
out["gluon_requests"] = len(gluon_requests)

bogus = pc.CompileRequest("no_such_module_kfuse", None, "k", requests[0].specialization, requests[0].target)
rep = pc.compile_in_workers(requests + gluon_requests + [bogus], workers=2)
out["compiled"], out["failed"], out["workers"] = rep.compiled, rep.failed, rep.workers

# every kernel now loads from Triton's cache: building IR again would mean it did not
from triton.compiler.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
def no_ir(*a, **k): raise AssertionError("compiled again: the worker's result was not found in the cache")
ASTSource.make_ir = no_ir
GluonASTSource.make_ir = no_ir
hashes = [str(scaled_add.warmup(x, x, x, n, 0.5, BLOCK=bl, ACT=ac, grid=(1,)).hash) for bl, ac, n in specs[:4]]
out["hits"] = sum(h in rep.hashes for h in hashes)
t0 = time.perf_counter(); gluon_call(); out["gluon_hit_s"] = time.perf_counter() - t0

# a kernel past the time-out: its call is reported slow and its worker replaced
slow = pc.precompile([lambda: scaled_add[(1,)](x, x, x, 1000, 0.5, BLOCK=2048, ACT="relu")], workers=1, kernel_timeout_s=0.01)
out["slow_calls"], out["timed_out"] = slow.slow_calls, slow.timed_out
out["pool_alive"] = sum(w.alive() for w in pc._POOL)
pc.shutdown()
print(json.dumps(out))
"""


def _run_script(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_INTERPRET"] = "0"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")  # empty: every compile is cold
    env["KFUSE_CACHE_DIR"] = str(tmp_path / "kfuse")
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), str(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_workers_compile_what_was_recorded_and_the_caller_loads_it_from_the_cache(tmp_path: Path) -> None:
    out = _run_script(tmp_path)
    assert out["hook_restored"] and out["other_thread_compiled"]
    assert out["recorded"] == 5 and out["requests"] == 4 and out["call_errors"] == 0
    assert out["per_call"] == [[0], [1], [2], [3], [0]]  # the repeated specialisation is one request
    assert out["in_process_kernels"] == 1  # only the other thread's: recording compiled nothing
    assert out["gluon_requests"] == 1
    assert out["workers"] == 2 and out["compiled"] == 5
    assert list(out["failed"]) == ["k"] and "no_such_module_kfuse" in out["failed"]["k"]
    assert out["hits"] == 4
    assert out["gluon_hit_s"] < 5.0  # loaded, not compiled (the IR builders raise if called)
    assert out["slow_calls"] == [0] and out["timed_out"] == [0]
    assert out["pool_alive"] >= 2  # the timed-out worker was replaced


def test_disabled_in_the_interpreter_and_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not parallel_compile.enabled()
    assert parallel_compile.precompile([lambda: 1 / 0]) == PrecompileReport()  # nothing recorded, nothing run
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("KFUSE_COMPILE_WORKERS", "0")
    assert not parallel_compile.enabled()
    monkeypatch.setenv("KFUSE_COMPILE_WORKERS", "3")
    assert parallel_compile.worker_count() == 3 and parallel_compile.enabled()
    monkeypatch.delenv("KFUSE_COMPILE_WORKERS")
    assert 1 <= parallel_compile.worker_count() <= parallel_compile.MAX_WORKERS


def test_json_round_trip_helpers() -> None:
    assert parallel_compile._tuples([["libdevice", "/x.bc"]]) == (("libdevice", "/x.bc"),)
    assert parallel_compile._tuples(3) == 3
    assert parallel_compile._constant({"constexpr": 4}).value == 4
    assert str(parallel_compile._constant("fp16")) == "fp16"
    assert parallel_compile._constant("relu") == "relu"
    r = CompileRequest("m", None, "f", "{}", ("cuda", 90, 32))
    assert json.loads(r.as_json())["target"] == ["cuda", 90, 32]
    assert "2/3 kernels" in PrecompileReport(requests=3, compiled=2, workers=2, seconds=1.0, failed={"f": "x"}).summary()


def test_no_requests_start_no_workers() -> None:
    rep = parallel_compile.compile_in_workers([])
    assert rep.requests == 0 and rep.workers == 0


def _step(name: str, inputs: tuple[str, ...], fn, host_sync: bool = False) -> executor.Step:
    return executor.Step(name, inputs, fn, SimpleNamespace(), host_sync=host_sync)


def test_precompile_plan_runs_the_steps_before_the_first_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def op(name: str):
        def fn(xs):
            ran.append(name)
            return xs[0] + 1

        return fn

    graph = SimpleNamespace(inputs=[("x", None)], outputs=["d"])
    steps = [_step("a", ("x",), op("a")), _step("b", ("a",), op("b")), _step("c", ("b",), op("c"), host_sync=True),
             _step("d", ("c",), op("d"))]  # fmt: skip
    plan = executor.Plan(graph, steps, "triton", release_after=[[], ["a"], [], []])
    seen = {}

    def fake_compile(requests, workers=None, kernel_timeout_s=None):
        seen["requests"] = requests
        return PrecompileReport(requests=len(requests))

    monkeypatch.setattr(parallel_compile, "enabled", lambda: True)
    monkeypatch.setattr(parallel_compile, "compile_in_workers", fake_compile)
    rep = executor.precompile_plan(plan, [torch.zeros(3)])
    assert ran == ["a", "b"]  # stops before the host-sync step: what follows it depends on device values
    assert rep.call_errors == 0 and seen["requests"] == []


def test_precompile_plan_survives_a_failing_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(xs):
        raise RuntimeError("needs a real compile result")

    graph = SimpleNamespace(inputs=[("x", None)], outputs=["b"])
    steps = [_step("a", ("x",), boom), _step("b", ("a",), lambda xs: xs[0])]
    plan = executor.Plan(graph, steps, "triton", release_after=[[], []])
    monkeypatch.setattr(parallel_compile, "enabled", lambda: True)
    monkeypatch.setattr(parallel_compile, "compile_in_workers", lambda r, w=None, t=None: PrecompileReport(requests=len(r)))
    rep = executor.precompile_plan(plan, [torch.zeros(3)])
    assert rep.call_errors == 2  # the failing step and the one that needed its output


def test_without_waiting_nothing_is_recorded_until_half_the_pool_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    monkeypatch.setattr(parallel_compile, "enabled", lambda: True)
    monkeypatch.setattr(parallel_compile, "start_pool", lambda n=None: 12)
    monkeypatch.setattr(parallel_compile, "compile_in_workers", lambda r, w=None, t=None: PrecompileReport(requests=len(r)))
    monkeypatch.setattr(parallel_compile, "ready_workers", lambda: 5)
    assert parallel_compile.precompile([lambda: ran.append(1)], wait=False) == PrecompileReport()
    assert ran == []  # the caller's own threads compile: its calls were not run here
    monkeypatch.setattr(parallel_compile, "ready_workers", lambda: 6)
    rep = parallel_compile.precompile([lambda: ran.append(1)], wait=False)
    assert ran == [1] and rep.requests == 0 and rep.call_errors == 0


def test_an_idle_worker_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that gets no request for ``KFUSE_COMPILE_WORKER_IDLE_S`` exits on its own (a
    serving process keeps no idle compilers); the pool starts another when a batch needs one."""
    monkeypatch.setenv("KFUSE_COMPILE_WORKER_IDLE_S", "0.5")
    w = parallel_compile._Worker()
    try:
        assert w.ready.wait(180)
        assert w.proc.wait(timeout=60) == 0 and not w.alive()
    finally:
        w.close()
