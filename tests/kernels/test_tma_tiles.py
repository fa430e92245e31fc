"""``least_waste_tile`` / ``tile_waste``: the spatial tile of several images that covers an (nb, oh, ow) output with
the fewest pixels computed in vain, and ``spatial_tile``'s checks."""

from __future__ import annotations

import itertools

import pytest

from kfuse.kernels.tma import least_waste_tile, spatial_tile, tile_waste


@pytest.mark.parametrize(
    "bm,nb,oh,ow,want",
    [
        (128, 64, 28, 28, (8, 4)),  # 8 images x 4 x 4: exact
        (128, 64, 56, 56, (2, 8)),  # 2 x 8 x 8: exact
        (128, 64, 14, 14, (32, 2)),  # 32 x 2 x 2: exact
        (256, 64, 28, 28, (16, 4)),
        (128, 64, 64, 64, (1, 2)),  # one image tiles exactly: no stacking, the widest rows that fit (2 x 64)
    ],
)
def test_exact_tilings(bm: int, nb: int, oh: int, ow: int, want: tuple[int, int]) -> None:
    tn, th, waste = least_waste_tile(bm, nb, oh, ow)
    assert (tn, th) == want and waste == 1.0


@pytest.mark.parametrize("bm,nb,oh,ow", [(128, 1, 28, 28), (128, 1, 56, 56), (128, 64, 7, 7), (64, 3, 5, 6), (256, 2, 13, 17)])
def test_no_tiling_wastes_less(bm: int, nb: int, oh: int, ow: int) -> None:
    """Exhaustively: no power-of-two tile of ``bm`` pixels (box dims <= 256) wastes less."""
    tn, th, waste = least_waste_tile(bm, nb, oh, ow)
    assert waste == pytest.approx(tile_waste(bm, tn, th, nb, oh, ow))
    pows = [1 << i for i in range(9)]
    for n, h in itertools.product(pows, pows):
        if n * h <= bm and bm // (n * h) <= 256:
            assert tile_waste(bm, n, h, nb, oh, ow) >= waste - 1e-12
    assert tn <= max(1, nb) or waste == 1.0  # batch 1 never stacks images it does not have


def test_batch_one_keeps_one_image() -> None:
    tn, th, waste = least_waste_tile(128, 1, 28, 28)
    assert tn == 1 and waste == pytest.approx(32 / 28)  # 4 x 32: 28 columns in 32


def test_spatial_tile_checks() -> None:
    assert spatial_tile(128, 4, "t", 8) == (4, 4)
    assert spatial_tile(128, 8, "t") == (8, 16)
    for bad in [(128, 3, 1), (128, 4, 3), (128, 64, 4), (96, 4, 1)]:
        with pytest.raises(ValueError, match="tile_h"):
            spatial_tile(bad[0], bad[1], "t", bad[2])
