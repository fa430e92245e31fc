"""SASS schedule tuning (SIP on sm_90): perturb memory-instruction order in a cubin, keep what is faster and
verified.  Heavy modules load lazily; `kfuse.sass.optimize` is the entry point."""

from __future__ import annotations

from typing import Any

__all__ = ["optimize", "optimize_compiled_kernel"]


def optimize(*args: Any, **kwargs: Any) -> Any:
    from .api import optimize as _optimize

    return _optimize(*args, **kwargs)


def optimize_compiled_kernel(*args: Any, **kwargs: Any) -> Any:
    from .api import optimize_compiled_kernel as _ock

    return _ock(*args, **kwargs)
