"""Selectable synchronisation strategies of the sync-free solve (what one GPU run compares).

* ``backoff_ns``: a waiting program sleeps (``nanosleep.u32``) between polls, so thousands of
  idle pollers stop flooding L2 while the few producers of the current level store and release.
* ``tile_flags``: one done flag per tile (tile of position c = c // R) instead of one per row.
  The analysis lists each tile's distinct producing tiles, and a program waits on that list
  once, then fences once, before its gathers; the per-nonzero poll and the per-chunk fence go.
* ``persistent``: about resident-capacity programs (SM count x ``programs_per_sm``) loop,
  taking tickets until the tiles run out, instead of one program per tile.
* ``prefetch`` (the second kernel, ``_syncfree_fast_kernel``): every load that does not need
  x (rowptr, level span, perm, b, diag, the first chunk's cols/vals, the in-tile block) is
  issued before the wait, so only the gather, the in-tile sweeps, the store and the release
  remain on the dependency chain; tickets become relaxed atomics.
* ``flags`` (with prefetch): ``"tile"`` / ``"row"`` as above, or ``"value"``: no done flags at
  all; x (in position order) starts as a signalling-NaN sentinel and a consumer polls the x
  values it gathers until none is the sentinel. The producer's store is the publication.
* ``acquire`` (with prefetch): poll with ``ld.acquire.gpu`` instead of volatile loads plus
  ``fence.acq_rel.gpu``.
* ``st_release`` (with prefetch, tile flags): publish with ``st.release.gpu``.
* ``long_row_min`` (with prefetch and value flags; 0 = off): **mixed tiling**. A row with more
  than this many off-diagonal nonzeros is a tile of its own, swept by the whole program in
  chunks of ``long_lanes``; the short rows between long ones keep the packed R x W tiles (a
  tile may then hold fewer than R rows). One kernel with a runtime branch on the tile kind,
  one ticket counter (``_syncfree_mixed_kernel``); ``long_warps`` is its ``num_warps``.
``DEFAULT`` (value flags, 8 programs per SM) is the best measured variant on short-row matrices,
``DEFAULT_LONG_ROWS`` (the same with 2 programs per SM) on power-law rows, ``DEFAULT_V1`` the
default of the first variants run; ``LEGACY`` is the original kernel: a per-row flag polled in
a tight loop, one program per tile (still the choice on chains and bands, the only kernel
measured there). ``kfuse.sparse.analysis.choose_sync`` picks among them per matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kfuse.kernels.codegen import interpreting

INTERPRETER_SMS = 2  # any small number: the interpreter runs programs one after another


@dataclass(frozen=True)
class SyncOptions:
    backoff_ns: int = 64  # 0 = spin without sleeping
    tile_flags: bool = True
    persistent: bool = True
    programs_per_sm: int = 8  # persistent grid = SM count x this (capped at the tile count)
    prefetch: bool = False  # the fast kernel: loads that need no x before the wait
    flags: str = ""  # with prefetch: "tile", "row" or "value" ("" = from tile_flags)
    acquire: bool = False  # with prefetch: ld.acquire.gpu polls, no fence.acq_rel.gpu
    st_release: bool = False  # with prefetch and tile flags: st.release.gpu instead of atom.exch.release
    long_row_min: int = 0  # mixed tiling: rows with more off-diagonal nonzeros get their own program (0 = off)
    long_lanes: int = 256  # mixed tiling: lanes sweeping one long row (a power of two)
    long_warps: int = 4  # mixed tiling: num_warps of the mixed kernel (both tile kinds)

    def __post_init__(self) -> None:
        if self.flags not in ("", "tile", "row", "value"):
            raise ValueError(f"SyncOptions: flags={self.flags!r} must be 'tile', 'row' or 'value'")
        if not self.prefetch and (self.flags or self.acquire or self.st_release):
            raise ValueError("SyncOptions: flags/acquire/st_release need prefetch=True (the fast kernel)")
        if self.flags and self.flags != ("tile" if self.tile_flags else "row") and self.flags != "value":
            raise ValueError(f"SyncOptions: flags={self.flags!r} contradicts tile_flags={self.tile_flags}")
        if not 0 <= self.backoff_ns < 1 << 20:
            raise ValueError(f"SyncOptions: backoff_ns={self.backoff_ns} must be in [0, 2**20)")
        if self.programs_per_sm < 1:
            raise ValueError(f"SyncOptions: programs_per_sm={self.programs_per_sm} must be >= 1")
        if self.long_row_min < 0:
            raise ValueError(f"SyncOptions: long_row_min={self.long_row_min} must be >= 0")
        if self.long_row_min and not (self.prefetch and self.flags == "value"):
            raise ValueError("SyncOptions: long_row_min (mixed tiling) needs prefetch=True, flags='value'")
        for nm, v in (("long_lanes", self.long_lanes), ("long_warps", self.long_warps)):
            if v < 1 or v & (v - 1):
                raise ValueError(f"SyncOptions: {nm}={v} must be a power of two")

    @property
    def flag_kind(self) -> str:
        """The flag scheme: tile, row or value."""
        return self.flags or ("tile" if self.tile_flags else "row")

    @property
    def name(self) -> str:
        parts = ["persistent" if self.persistent else "grid", self.flag_kind + "flag"]
        if self.prefetch:
            parts.append("prefetch")
        if self.acquire:
            parts.append("acq")
        if self.st_release:
            parts.append("strel")
        if self.long_row_min:
            parts.append(f"mixed{self.long_row_min}x{self.long_lanes}w{self.long_warps}")
        if self.backoff_ns:
            parts.append(f"sleep{self.backoff_ns}")
        if self.persistent:
            parts.append(f"ppsm{self.programs_per_sm}")
        return "-".join(parts)


LEGACY = SyncOptions(backoff_ns=0, tile_flags=False, persistent=False)
DEFAULT_V1 = SyncOptions()  # the default of the first variants run (docs/sparse.md)
FAST = SyncOptions(backoff_ns=0, prefetch=True)  # persistent, tile flags, prefetch
DEFAULT = SyncOptions(backoff_ns=0, tile_flags=False, prefetch=True, flags="value")  # best on the Laplacians (round 2)
DEFAULT_LONG_ROWS = SyncOptions(backoff_ns=0, tile_flags=False, prefetch=True, flags="value", programs_per_sm=2)  # power-law
# DEFAULT_LONG_ROWS with mixed tiling: rows with > 64 off-diagonal nonzeros swept by a 256-lane, 4-warp program
MIXED = replace(DEFAULT_LONG_ROWS, long_row_min=64, long_lanes=256, long_warps=4)
# what the mixed-tiling experiment compares on the power-law matrices (docs/sparse.md "Mixed tiling")
MIXED_EXPERIMENT = ["default-ppsm2", "mixed", "mixed-w8", "mixed-t32", "mixed-ppsm4"]
MIXED_EXPERIMENT_TILED = ("8x4w1", ["mixed-t16-w1", "mixed-t32"])  # ... and these under one-warp 8x4 short tiles

# what benchmarks/experiments/sptrsv_variants.py measures side by side (one idea at a time, then combined)
VARIANTS: dict[str, SyncOptions] = {
    "legacy": LEGACY,
    "backoff": SyncOptions(backoff_ns=64, tile_flags=False, persistent=False),
    "tileflags": SyncOptions(backoff_ns=0, tile_flags=True, persistent=False),
    "tileflags+backoff": SyncOptions(backoff_ns=64, tile_flags=True, persistent=False),  # pathological above ~4k tiles
    "persistent": SyncOptions(backoff_ns=0, tile_flags=False, persistent=True),
    "persistent+tileflags": SyncOptions(backoff_ns=0, tile_flags=True, persistent=True),
    "default-v1": DEFAULT_V1,
    "default-v1-ppsm2": SyncOptions(programs_per_sm=2),
    "default-v1-ppsm32": SyncOptions(programs_per_sm=32),
    "default-v1-sleep256": SyncOptions(backoff_ns=256),
    # the latency variants (second run): one change at a time on top of FAST, then combined
    "prefetch": FAST,
    "prefetch+acquire": SyncOptions(backoff_ns=0, prefetch=True, acquire=True),
    "prefetch+acquire+strel": SyncOptions(backoff_ns=0, prefetch=True, acquire=True, st_release=True),
    "rowflags+prefetch+acquire": SyncOptions(backoff_ns=0, tile_flags=False, prefetch=True, flags="row", acquire=True),
    "default": DEFAULT,
    "default-ppsm2": DEFAULT_LONG_ROWS,
    "default-grid": SyncOptions(backoff_ns=0, tile_flags=False, persistent=False, prefetch=True, flags="value"),
    # mixed tiling (long rows: one program each, 256 lanes); the tuner's candidates for long rows include it
    "mixed": MIXED,
    "mixed-w8": replace(MIXED, long_warps=8),
    "mixed-t32": replace(MIXED, long_row_min=32),
    "mixed-ppsm4": replace(MIXED, programs_per_sm=4),
    "mixed-t16-w1": replace(MIXED, long_row_min=16, long_warps=1),  # for one-warp short tiles (8x4w1)
}

# what the experiment script runs unless told otherwise: drops the dominated first-run variants
# (tileflags+backoff blew up on the 1M-row matrices; the other knobs moved times by < 15%)
EXPERIMENT_DEFAULT = [
    "legacy", "default-v1", "default-v1-ppsm2", "prefetch", "prefetch+acquire", "prefetch+acquire+strel",
    "rowflags+prefetch+acquire", "default", "default-ppsm2", "default-grid",
]  # fmt: skip


def persistent_grid(device: torch.device, n_tiles: int, opts: SyncOptions) -> int:
    """Programs of the persistent launch: SM count x programs_per_sm, at most one per tile."""
    on_gpu = device.type == "cuda" and not interpreting()
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else INTERPRETER_SMS
    return max(1, min(n_tiles, sms * opts.programs_per_sm))
