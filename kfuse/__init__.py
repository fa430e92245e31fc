"""kfuse: a kernel-fusion compiler and tuner for deep-learning inference on NVIDIA GPUs."""

__version__ = "0.1.0"

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

# Without a GPU, kfuse's Triton kernels run in the Triton interpreter. The switch must be set
# before triton is imported, so it is set here unless the user decided otherwise.
if "triton" not in _sys.modules and "TRITON_INTERPRET" not in _os.environ:
    try:
        import torch as _torch

        if not _torch.cuda.is_available():
            _os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:  # pragma: no cover
        pass

from kfuse.api import compile  # noqa: E402,A004
from kfuse.compiler import Options  # noqa: E402
from kfuse.runtime.compiled_model import CompiledModel, KfuseInputError  # noqa: E402

try:
    from kfuse.frontend.dynamo import register as _register_dynamo

    _register_dynamo()
except Exception:  # pragma: no cover - an older torch without the registry
    pass

__all__ = ["compile", "Options", "CompiledModel", "KfuseInputError", "__version__"]
