"""Programmatic dependent launch for kfuse's Gluon kernels (``gemm_ws``, ``attention_ws``): the same
wait-then-release as ``pdl.pdl_start``, written as inline PTX because Gluon kernels do not take
``tl.extra.cuda``'s calls. Its own module so that importing kfuse does not import Gluon; the launch
keywords still come from ``pdl.launch_kwargs``."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def pdl_start(PDL: gl.constexpr):
    # first thing in a kernel: wait for the previous grid before any TMA traffic, then let the next
    # grid's programs become resident as this one's leave
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
