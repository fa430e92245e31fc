"""Per-tile dependency lists for the tile-flag variant: which earlier tiles a tile waits on.

Tile t holds positions [t*R, (t+1)*R). Its producers are the distinct tiles c // R of its
columns c < t*R (columns inside the tile are solved in registers). A CSR over tiles, sorted
by producer, built on the device with torch (no Python loop over rows).
"""

from __future__ import annotations

import torch


def tile_dependencies(rowptr: torch.Tensor, cols: torch.Tensor, n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ptr int32 [n_tiles + 1], producers int32) of the level-ordered matrix with R = ``r``."""
    dev = rowptr.device
    n_tiles = -(-n // r)
    lengths = (rowptr[1:] - rowptr[:-1]).to(torch.int64)
    consumer = torch.repeat_interleave(torch.arange(n, device=dev) // r, lengths)
    producer = cols.to(torch.int64) // r
    keep = producer < consumer
    key = torch.unique(consumer[keep] * n_tiles + producer[keep])  # sorted: by consumer, then producer
    ptr = torch.zeros(n_tiles + 1, dtype=torch.int64, device=dev)
    ptr[1:] = torch.cumsum(torch.bincount(key // n_tiles, minlength=n_tiles), 0)
    return ptr.to(torch.int32), (key % n_tiles).to(torch.int32)
