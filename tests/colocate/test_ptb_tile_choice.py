"""A tile per LC GEMM shape (``ptb.pick_ptb_config``, ``lc_items(gemms="ptb-tuned")``): the choice is the fastest
candidate that ran, every candidate tile computes the same GEMM on odd shapes, and a tile that fails is never chosen."""

from __future__ import annotations

import pytest
import torch

from kfuse.colocate.ptb import CPU_LC_TILES, GPU_FP16_CONFIG, GPU_FP16_LC_TILES, PtbGemmConfig, gemm_kernel, launch_ptb, pick_ptb_config


def _operands(m: int, n: int, k: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    return a.to(device), b.to(device), torch.full((m, n), float("nan"), device=device)


@pytest.mark.parametrize("m,n,k", [(37, 45, 29), (16, 16, 16), (1, 33, 70)])
def test_every_candidate_tile_computes_the_gemm_on_odd_shapes(m: int, n: int, k: int, device: str) -> None:
    a, b, c = _operands(m, n, k, device)
    for cfg in CPU_LC_TILES:
        c.fill_(float("nan"))  # poisoned: every element must be written
        launch_ptb(gemm_kernel(a, b, c, cfg, precision="ieee"), grid=3)
        torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)


def test_the_fastest_candidate_is_chosen_and_every_time_is_kept() -> None:
    a, b, c = _operands(40, 24, 16)
    fake = {16: 2.0, 32: 1.5}  # by BLOCK_M: the 32-row tile is faster

    def timer(kern, grid: int) -> float:  # noqa: ANN001
        assert grid == 6
        return fake[kern.consts["BLOCK_M"]]

    cfg, times = pick_ptb_config(a, b, c, 6, candidates=CPU_LC_TILES, time_ms=timer)
    assert cfg == CPU_LC_TILES[1] and times == {CPU_LC_TILES[0]: 2.0, CPU_LC_TILES[1]: 1.5}


def test_a_tile_that_fails_is_left_out_and_none_left_is_an_error() -> None:
    a, b, c = _operands(20, 20, 20)
    bad = PtbGemmConfig(16, 16, 16, 2, 4, 1)

    def timer(kern, grid: int) -> float:  # noqa: ANN001
        if kern.consts["BLOCK_N"] == 16:
            raise RuntimeError("out of resources: shared memory")
        return 1.0

    cfg, times = pick_ptb_config(a, b, c, 4, candidates=[bad, PtbGemmConfig(16, 32, 16, 2, 4, 1)], time_ms=timer)
    assert cfg.block_n == 32 and bad not in times
    with pytest.raises(RuntimeError, match="no candidate tile ran.*out of resources"):
        pick_ptb_config(a, b, c, 4, candidates=[bad], time_ms=timer)


def test_the_gpu_tiles_keep_the_default_tiles_shared_memory() -> None:
    """The LC's grid is two programs an SM: no candidate may take more shared memory (stages x operand tiles) or more
    accumulator elements a thread than the default tile, which fits two."""

    def smem(t: PtbGemmConfig) -> int:
        return t.num_stages * (t.block_m + t.block_n) * t.block_k * 2

    def acc_per_thread(t: PtbGemmConfig) -> float:
        return t.block_m * t.block_n / (32 * t.num_warps)

    assert GPU_FP16_LC_TILES[0] == GPU_FP16_CONFIG
    for t in GPU_FP16_LC_TILES:
        assert smem(t) <= smem(GPU_FP16_CONFIG) and acc_per_thread(t) <= acc_per_thread(GPU_FP16_CONFIG), t


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU model's PTB GEMMs run (and are timed) in the interpreter")
def test_lc_items_take_a_tile_per_shape() -> None:
    import kfuse.models
    from kfuse.colocate.lc import compile_lc, lc_items

    model, args, kwargs = kfuse.models.build("bert-tiny", batch=2, seq=16, dtype=torch.float32, device="cpu")
    compiled = compile_lc(model, args, kwargs, log=lambda s: None, backend="torch")
    one = lc_items(compiled, args, kwargs)
    tuned = lc_items(compiled, args, kwargs, gemms="ptb-tuned")
    assert [it.key for it in one] == [it.key for it in tuned]  # the same LC sequence, only the GEMM tiles differ
    gemms = [it for it in tuned if it.kernel is not None]
    assert gemms and all(set(it.kernel.meta["tile_ms"]) == {"16x16x16w4s1", "32x16x16w4s1"} for it in gemms)
    by_shape: dict[str, tuple] = {}
    for it in gemms:  # one choice a shape, shared by the model's repeated layers
        chosen = (it.kernel.consts["BLOCK_M"], it.kernel.consts["BLOCK_N"])
        assert by_shape.setdefault(it.key, chosen) == chosen
        assert chosen in {(t.block_m, t.block_n) for t in CPU_LC_TILES}
    for it in gemms[:2]:  # and each still computes its GEMM
        a, b, c = it.kernel.args[:3]
        c.fill_(float("nan"))
        launch_ptb(it.kernel)
        torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
