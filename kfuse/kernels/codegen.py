"""Loading generated Triton source: Triton's JIT reads kernel source from files, so every
generated kernel is written once to the kernel cache and imported from there. Also the small
host-side helpers every kernel launcher uses (interpreter check, ceiling division, 2-D pairs)."""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

_LOAD_LOCK = threading.Lock()
_LOADED: dict[str, ModuleType] = {}


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter (TRITON_INTERPRET=1, the CPU path)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# the SMs launches are sized for, where a caller runs kernels on part of the GPU (a green context's partition,
# kfuse.colocate): a persistent grid sized for the whole GPU would queue its surplus programs behind the first wave
_SM_COUNT: contextvars.ContextVar[int | None] = contextvars.ContextVar("kfuse_sm_count", default=None)


@contextmanager
def sm_count(n: int) -> Iterator[None]:
    """Size the launches made inside (persistent grids, launch rules) for ``n`` SMs, as if the GPU had ``n``."""
    if n < 1:
        raise ValueError(f"sm_count: at least one SM, got {n}")
    token = _SM_COUNT.set(n)
    try:
        yield
    finally:
        _SM_COUNT.reset(token)


def num_sms(device: torch.device, cpu_default: int) -> int:
    """The GPU's streaming multiprocessors (or those ``sm_count`` sizes launches for); ``cpu_default`` for the
    interpreter (launch rules sized for it)."""
    override = _SM_COUNT.get()
    if override is not None:
        return override
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else cpu_default


def cdiv(a: int, b: int) -> int:
    """Ceiling division on host integers (grid sizes)."""
    return -(-a // b)


def as_pair(v: Any, default: int) -> tuple[int, int]:
    """A 2-D window attribute (stride, padding, kernel size...) as (h, w): None -> the default,
    an int or a 1-tuple -> repeated."""
    if v is None:
        return (default, default)
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1]))


def cache_dir() -> Path:
    """``$KFUSE_CACHE_DIR`` or ``~/.cache/kfuse``."""
    root = os.environ.get("KFUSE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kfuse")
    return Path(root)


_BY_KEY: dict[tuple[str, str], ModuleType] = {}


def generated(family: str, key: str, make_source: Callable[[], str]) -> ModuleType:
    """``load_generated`` with the source rendered only the first time ``(family, key)`` is
    seen: launchers call this on every launch, so it must be a dict lookup."""
    mod = _BY_KEY.get((family, key))
    if mod is None:
        mod = _BY_KEY[(family, key)] = load_generated(family, key, make_source())
    return mod


def load_generated(family: str, key: str, source: str) -> ModuleType:
    """Import ``source`` as module ``kfuse_gen_<family>_<key>`` (written to the cache once)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    mod_name = f"kfuse_gen_{family}_{key}_{digest}"
    with _LOAD_LOCK:  # compile threads (the b2b decision, the tuner) load the same module at once
        if mod_name in _LOADED:
            return _LOADED[mod_name]
        path = cache_dir() / "kernels" / f"{mod_name}.py"
        if not path.exists() or path.read_text() != source:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a name per process and thread: another process may write the same module
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)  # atomic: concurrent compiles never see half a file
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        _LOADED[mod_name] = module
        return module


class KeptBuffers:
    """Device buffers made once per key and kept for the process: a CUDA graph replays the same addresses, and the
    kernels that count in them (the skinny GEMM's split-K, the decode attention's last-program merge) leave their
    counters at zero for the next call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bufs: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._bufs:
                self._bufs[key] = make()
            return self._bufs[key]
