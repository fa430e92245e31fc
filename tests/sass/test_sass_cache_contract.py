"""The schedule cache may only hand back what passed this request's verification (CPU, no GPU needed).

A cache hit used to be keyed by the original cubin's sha256 alone and installed the cached bytes without
parsing them, whatever `samples`, `movable`, `min_gain` or the verification problem asked for. A miss
now reaches the search, which the tests stop at the Evaluator (the GPU worker)."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest
import torch

from kfuse.sass import api, cache, examples
from kfuse.sass.cubin import load_cubin
from kfuse.sass.schedule import DEFAULT_MOVABLE
from kfuse.sass.verify import LaunchSpec

Target = collections.namedtuple("Target", "backend arch warp_size")
Meta = collections.namedtuple("Meta", "target shared")
NAMES = ["x_ptr", "y_ptr", "z_ptr", "n", "BLOCK"]


def grid(a):
    return ((a["n"] + 1023) // 1024,)


def _args(n: int) -> list:
    return [torch.empty(n, dtype=torch.float16)] * 3 + [n, 1024]


def _ck(cubin: bytes = b"", name: str = "add_kernel") -> SimpleNamespace:
    src = SimpleNamespace(fn=SimpleNamespace(arg_names=NAMES), signature={}, constants={})
    return SimpleNamespace(name=name, asm={"cubin": cubin}, metadata=Meta(Target("cuda", 90, 32), 0), src=src)


@pytest.fixture(scope="module")
def add_cubin() -> tuple[bytes, str]:
    ck = examples.compile_add()
    return bytes(ck.asm["cubin"]), ck.name


class _Searched(Exception):
    pass


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))

    def no_gpu(*a, **k):
        raise _Searched

    monkeypatch.setattr(api, "Evaluator", no_gpu)
    return tmp_path


def _key(cubin: bytes, name: str, args, movable=DEFAULT_MOVABLE, verify_args=None) -> str:
    spec = api.launch_spec(_ck(cubin, name), args, grid, verify_args)
    return cache.entry_key(load_cubin(cubin).sha256, name, movable, api.verification_hash(spec))


def _info(cubin: bytes, name: str, samples: int, **kw) -> dict:
    return {"kernel": name, "original_sha256": load_cubin(cubin).sha256, "triton_ms": 1.0, "kfuse_ms": 0.5,
            "verified_samples": samples, "moves_applied": 3, **kw}  # fmt: skip


def _run(cubin: bytes, name: str, **kw):
    ck = _ck(cubin, name)
    kw = {"samples": 1000, "min_gain": 0.01, **kw}
    try:
        res = api.optimize_compiled_kernel(ck, _args(4096), grid, **kw)
    except _Searched:
        return ck, None
    return ck, res


def test_valid_entry_hits(env, add_cubin):
    cubin, name = add_cubin
    cache.store(_key(cubin, name, _args(4096)), cubin, _info(cubin, name, 1000))
    ck, res = _run(cubin, name)
    assert res is not None and res.from_cache and res.accepted and res.verified_samples == 1000
    assert ck.kernel == cubin


def test_not_a_cubin_is_never_installed(env, add_cubin):
    cubin, name = add_cubin
    cache.store(_key(cubin, name, _args(4096)), b"\x7fELF-not-really-a-cubin", _info(cubin, name, 10**9))
    ck, res = _run(cubin, name)
    assert res is None and not hasattr(ck, "kernel")
    cache.store(_key(cubin, name, _args(4096)), cubin[: len(cubin) // 2], _info(cubin, name, 10**9))  # truncated
    ck, res = _run(cubin, name)
    assert res is None and not hasattr(ck, "kernel")


def test_too_few_verified_samples_is_a_miss(env, add_cubin):
    cubin, name = add_cubin
    cache.store(_key(cubin, name, _args(4096)), cubin, _info(cubin, name, 16))
    ck, res = _run(cubin, name, samples=1_000_000)
    assert res is None and not hasattr(ck, "kernel")
    ck, res = _run(cubin, name, samples=16)
    assert res is not None and res.from_cache


def test_min_gain_wrong_kernel_and_tampered_bytes_are_misses(env, add_cubin):
    cubin, name = add_cubin
    key = _key(cubin, name, _args(4096))
    cache.store(key, cubin, _info(cubin, name, 1000))
    assert _run(cubin, name, min_gain=0.6)[1] is None  # recorded gain 50%
    cache.store(key, cubin, _info(cubin, name, 1000, kernel="other_kernel"))
    assert _run(cubin, name)[1] is None
    cache.store(key, cubin, _info(cubin, name, 1000))
    (env / "sass" / f"{key}.cubin").write_bytes(cubin[:-16] + bytes(16))  # bytes changed after the store
    assert _run(cubin, name)[1] is None


def test_key_covers_movable_and_verification_problem(env, add_cubin):
    cubin, name = add_cubin
    cache.store(_key(cubin, name, _args(4096)), cubin, _info(cubin, name, 1000))
    assert _run(cubin, name)[1] is not None
    assert _run(cubin, name, movable=frozenset({"LDS"}))[1] is None
    assert _run(cubin, name, verify_args=_args(1 << 16))[1] is None
    assert _run(cubin, name, samples_per_launch=4)[1] is None
    # an entry of the old sha-only layout is not trusted
    for f in (env / "sass").iterdir():
        f.unlink()
    cache.store(load_cubin(cubin).sha256, cubin, _info(cubin, name, 1000))
    assert _run(cubin, name)[1] is None


def test_an_entry_of_an_older_legality_model_is_searched_again(env, add_cubin, monkeypatch):
    # a schedule the model accepted before a rule made it stricter (session 60's barrier-settle rule) is not reused
    cubin, name = add_cubin
    today = cache.LEGALITY_VERSION
    monkeypatch.setattr(cache, "LEGALITY_VERSION", today - 1)
    cache.store(_key(cubin, name, _args(4096)), cubin, _info(cubin, name, 1000))
    monkeypatch.setattr(cache, "LEGALITY_VERSION", today)
    assert _run(cubin, name)[1] is None
    cache.store(_key(cubin, name, _args(4096)), cubin, _info(cubin, name, 1000))
    assert _run(cubin, name)[1] is not None


def test_key_changes_with_copied_argument_data():
    a = [torch.empty(8, dtype=torch.float16), torch.arange(8, dtype=torch.int32), torch.empty(8), 8, 1024]
    b = [a[0], torch.arange(8, dtype=torch.int32).flip(0), a[2], 8, 1024]
    h = [api.verification_hash(api.launch_spec(_ck(), x, grid)) for x in (a, b, a)]
    assert h[0] != h[1] and h[0] == h[2]


def test_verify_grid_defaults_to_grid_of_verification_args():
    small, big = _args(2048), _args(1 << 20)
    spec = api.launch_spec(_ck(), small, grid, verify_args=big)
    assert spec.grid == (2, 1, 1)
    assert spec.verify_grid == (1024, 1, 1) and spec.verification()[1] == (1024, 1, 1)
    assert api.launch_spec(_ck(), small, grid, verify_args=big, verify_grid=(7,)).verification()[1] == (7, 1, 1)
    assert api.launch_spec(_ck(), small, grid, verify_grid=lambda a: (a["n"],)).verification()[1] == (2048, 1, 1)
    assert api.launch_spec(_ck(), small, grid).verification()[1] == (2, 1, 1)


def test_launch_spec_refuses_verify_args_without_grid():
    with pytest.raises(ValueError, match="verify_grid"):
        LaunchSpec("k", b"", {}, {}, {}, [], [], (1, 1, 1), verify_args=[("value", 1)])
