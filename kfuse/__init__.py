"""kfuse: a kernel-fusion compiler and tuner for deep-learning inference on NVIDIA GPUs."""

__version__ = "0.1.0"

from kfuse.api import compile  # noqa: E402,A004
from kfuse.compiler import Options  # noqa: E402
from kfuse.runtime.compiled_model import CompiledModel, KfuseInputError  # noqa: E402

try:
    from kfuse.frontend.dynamo import register as _register_dynamo

    _register_dynamo()
except Exception:  # pragma: no cover - an older torch without the registry
    pass

__all__ = ["compile", "Options", "CompiledModel", "KfuseInputError", "__version__"]
