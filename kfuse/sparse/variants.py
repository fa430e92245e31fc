"""Selectable synchronisation strategies of the sync-free solve (what one GPU run compares).

* ``backoff_ns``: a waiting program sleeps (``nanosleep.u32``) between polls, so thousands of
  idle pollers stop flooding L2 while the few producers of the current level store and release.
* ``tile_flags``: one done flag per tile (tile of position c = c // R) instead of one per row.
  The analysis lists each tile's distinct producing tiles, and a program waits on that list
  once, then fences once, before its gathers; the per-nonzero poll and the per-chunk fence go.
* ``persistent``: about resident-capacity programs (SM count x ``programs_per_sm``) loop,
  taking tickets until the tiles run out, instead of one program per tile.
The defaults are the predicted best combination (docs/sparse.md); ``LEGACY`` is the original
kernel: a per-row flag polled in a tight loop, one program per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kfuse.kernels.codegen import interpreting

INTERPRETER_SMS = 2  # any small number: the interpreter runs programs one after another


@dataclass(frozen=True)
class SyncOptions:
    backoff_ns: int = 64  # 0 = spin without sleeping
    tile_flags: bool = True
    persistent: bool = True
    programs_per_sm: int = 8  # persistent grid = SM count x this (capped at the tile count)

    def __post_init__(self) -> None:
        if not 0 <= self.backoff_ns < 1 << 20:
            raise ValueError(f"SyncOptions: backoff_ns={self.backoff_ns} must be in [0, 2**20)")
        if self.programs_per_sm < 1:
            raise ValueError(f"SyncOptions: programs_per_sm={self.programs_per_sm} must be >= 1")

    @property
    def name(self) -> str:
        parts = ["persistent" if self.persistent else "grid", "tileflag" if self.tile_flags else "rowflag"]
        if self.backoff_ns:
            parts.append(f"sleep{self.backoff_ns}")
        if self.persistent:
            parts.append(f"ppsm{self.programs_per_sm}")
        return "-".join(parts)


LEGACY = SyncOptions(backoff_ns=0, tile_flags=False, persistent=False)
DEFAULT = SyncOptions()

# what benchmarks/experiments/sptrsv_variants.py measures side by side (one idea at a time, then combined)
VARIANTS: dict[str, SyncOptions] = {
    "legacy": LEGACY,
    "backoff": SyncOptions(backoff_ns=64, tile_flags=False, persistent=False),
    "tileflags": SyncOptions(backoff_ns=0, tile_flags=True, persistent=False),
    "tileflags+backoff": SyncOptions(backoff_ns=64, tile_flags=True, persistent=False),
    "persistent": SyncOptions(backoff_ns=0, tile_flags=False, persistent=True),
    "persistent+tileflags": SyncOptions(backoff_ns=0, tile_flags=True, persistent=True),
    "default": DEFAULT,
    "default-ppsm2": SyncOptions(programs_per_sm=2),
    "default-ppsm32": SyncOptions(programs_per_sm=32),
    "default-sleep256": SyncOptions(backoff_ns=256),
}


def persistent_grid(device: torch.device, n_tiles: int, opts: SyncOptions) -> int:
    """Programs of the persistent launch: SM count x programs_per_sm, at most one per tile."""
    on_gpu = device.type == "cuda" and not interpreting()
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else INTERPRETER_SMS
    return max(1, min(n_tiles, sms * opts.programs_per_sm))
