"""PTB variants equal the original kernels for any [start, end) split; BE workloads match their references."""

import random

import pytest
import torch

from kfuse.colocate import ptb, workloads
from kfuse.colocate.workloads import error, make


def _splits(n: int, rng: random.Random) -> list[tuple[int, int]]:
    cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(2))})
    return list(zip(cuts[:-1], cuts[1:], strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ptb_gemm_any_split_equals_original(dtype: torch.dtype, device: str) -> None:
    rng = random.Random()
    m, k, n = 37, 29, 45
    # the 16 x 16 tile on the GPU too (9 blocks to split): the GPU's own tile covers 37 x 45 in one
    cfg = ptb.default_ptb_config(dtype, gpu=False)
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    c0 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    kern = ptb.gemm_kernel(a, b, c0, cfg)
    ptb.launch_original(kern)
    ref = a.cpu().double() @ b.cpu().double()  # on the CPU in float64: a GPU matmul may run in TF32
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert (c0.cpu().double() - ref).abs().max() <= tol * ref.abs().max()
    c1 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    k1 = ptb.gemm_kernel(a, b, c1, cfg)
    for s, e in _splits(k1.n_blocks, rng):
        ptb.launch_ptb(k1, s, e, grid=rng.randint(1, 4))
    assert torch.equal(c0, c1)


def test_ptb_partial_range_writes_only_its_blocks(device: str) -> None:
    a, b = torch.randn(33, 16, device=device), torch.randn(16, 33, device=device)
    c = torch.full((33, 33), float("nan"), device=device)
    k = ptb.gemm_kernel(a, b, c, ptb.default_ptb_config(a.dtype, gpu=False))  # 16 x 16 tiles on the GPU too: block 0 is c[:16, :16]
    ptb.launch_ptb(k, 0, 1, grid=2)
    assert torch.isnan(c).any() and not torch.isnan(c[:16, :16]).any()


def test_ptb_range_checked(device: str) -> None:
    k = ptb.gemm_kernel(torch.randn(8, 8, device=device), torch.randn(8, 8, device=device), torch.empty(8, 8, device=device))
    with pytest.raises(ValueError, match="outside"):
        ptb.launch_ptb(k, 0, k.n_blocks + 1)


def test_conv_as_gemm(device: str) -> None:
    x, w = torch.randn(2, 3, 9, 7, device=device), torch.randn(5, 3, 3, 3, device=device)
    assert ptb.conv_gemm_shape(x.shape, w.shape, (2, 1), (1, 1)) == (2 * 5 * 7, 5, 27)
    y = ptb.ptb_conv2d(x, w, (2, 1), (1, 1), grid=3)
    ref = torch.nn.functional.conv2d(x.cpu().double(), w.cpu().double(), stride=(2, 1), padding=1)  # cuDNN would use TF32
    assert (y.cpu().double() - ref).abs().max() < 1e-4


@pytest.mark.parametrize("name", workloads.NAMES)
def test_workload_original_and_ptb_splits(name: str, device: str) -> None:
    rng = random.Random()
    w = make(name, small=True, device=device, seed=rng.randrange(1000))
    w.reset()
    ptb.launch_original(w.kernel)
    assert error(w) <= w.tol, f"{name}: original kernel differs from the reference"
    orig = w.output().clone()
    w.reset()
    for s, e in _splits(w.kernel.n_blocks, rng):
        ptb.launch_ptb(w.kernel, s, e, grid=rng.randint(1, 3))
    assert torch.equal(w.output(), orig), f"{name}: PTB split differs from the original"


def test_classification_rule() -> None:
    assert workloads.classify(1e12, 3.5e12)[0] == "memory"
    assert workloads.classify(50e12, 0.1e12)[0] == "compute"
    assert workloads.classify(10e12, 1e12)[0] == "neutral"
    with pytest.raises(ValueError, match="unknown BE workload"):
        workloads.resolve("nope")
