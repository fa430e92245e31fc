"""``kfuse sass tune``: its two example kernels (SIP's GEMM + LeakyReLU and attention) and their launch arguments, and
the errors it gives before any GPU work (the search itself needs a GPU: ``benchmarks/sass_bench.py`` runs it there)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from kfuse.sass import examples
from kfuse.sass.cli import app


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["tune", "conv"], "unknown example kernel 'conv'"),
        (["tune", "attention", "--seq", "200"], "multiple of 128"),
        (["tune", "gemm", "--moves", "everything"], "everything"),
        (["tune", "gemm", "--tile", "96x128x64w4s3"], "powers of two"),
        (["tune", "gemm", "--mma-form", "mma-v4"], "unknown tensor-core form"),
    ],
)
def test_tune_refuses_what_it_cannot_run_before_touching_a_gpu(argv: list[str], why: str) -> None:
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 1 and why in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_tune_says_it_needs_a_gpu() -> None:
    r = CliRunner().invoke(app, ["tune", "attention", "--seq", "256"])
    assert r.exit_code == 1 and "needs a CUDA GPU" in r.output


def test_example_launch_arguments_match_the_kernels_parameters() -> None:
    """One argument a kernel parameter (constexprs last, as the launcher takes them), random inputs, the grid covering
    every tile; built on the CPU here, on the GPU by the CLI and the benchmark."""
    gemm_params = examples.as_jit_function(examples.matmul_leaky_relu_kernel).arg_names
    attention_params = examples.as_jit_function(examples.attention_fwd_kernel).arg_names
    a = examples.attention_args(2, 3, 256, 64, device="cpu")
    assert len(a) == len(attention_params) and a[-5:] == [3, 256, 64, 128, 64]
    q, k, v, o = a[:4]
    assert q.shape == (2, 3, 256, 64) and q.dtype == torch.float16 and q.std() > 0.5 and not torch.equal(q, k)
    assert a[5:9] == [q.stride(0), q.stride(1), q.stride(2), 1] and o.shape == q.shape
    with pytest.raises(ValueError, match="multiple of 128"):
        examples.attention_launch(1, 1, 100, 64, device="cpu")
    ck, g, grid = examples.gemm_launch(300, 200, 96, (64, 64, 32, 4, 2), device="cpu")  # compiled for sm_90 offline
    assert ck.name == "matmul_leaky_relu_kernel" and len(g) == len(gemm_params) and grid == (5 * 4, 1, 1)
    assert g[0].shape == (300, 96) and g[1].shape == (96, 200) and g[2].shape == (300, 200) and g[3:6] == [300, 200, 96]
    assert g[-4:] == [64, 64, 32, 8] and g[0].std() > 0.5
