"""The tilings a chain runs with: the rule-based default and the candidates the decision measures."""

from __future__ import annotations

from dataclasses import replace

from kfuse.kernels.b2b.chain import MAX_RESIDENT, B2BConfig, chunked_eligible, pad_width
from kfuse.kernels.codegen import interpreting
from kfuse.kernels.tma import least_waste_tile
from kfuse.tune.hardware import TABLE


def default_config(m: int, widths: list[int], residence: str | None = None, elem: int = 2) -> B2BConfig:
    """A tile for the chain when nothing was measured. Register residence while the widest
    resident tile is at most 128 columns; wider tiles go through shared memory. ``elem``: the
    operands' element size in bytes (what the chunked kernel's buffers take)."""
    widest = max(pad_width(w) for w in widths[:-1])
    if residence == "chunked" or (residence is None and len(widths) == 2 and widths[0] > MAX_RESIDENT):
        return chunked_config(widths, elem=elem)
    res = residence or ("register" if widest <= 128 else "smem")
    last = min(pad_width(widths[-1]), 128)
    if interpreting():
        cfg = B2BConfig(16, 32, min(last, 64), 4, 1, res)
    elif widest <= 64:
        cfg = B2BConfig(128, 64, last, 8 if res == "smem" else 4, 2, res)
    elif widest <= 128:
        cfg = B2BConfig(64, 64, last, 4, 2, res)
    else:
        cfg = B2BConfig(64, 32, min(last, 64), 8 if res == "smem" else 4, 2, res)
    return as_launched(cfg, widths)


def as_launched(cfg: B2BConfig, widths: list[int]) -> B2BConfig:
    """``cfg`` as the launcher runs it: a one-program-per-tile config whose last width is one tile
    always preloads the later stages' weights (see ``launcher.launch``), so it says so, and the
    candidate list does not measure the same kernel twice."""
    per_tile = not (cfg.persistent or cfg.tma or cfg.residence == "chunked")
    return replace(cfg, preload=True) if per_tile and widths[-1] <= min(cfg.block_n, pad_width(widths[-1])) else cfg


SMEM_LIMIT = TABLE["H200"].smem_per_block  # shared memory a program may use on an H100 / H200 SM (227 KB)


def chunked_smem_bytes(block_m: int, k: int, block_h: int, n: int, stages: int, elem: int = 2) -> int:
    """Shared memory of ``b2b_chunked_kernel``, as planned: the x tile (block_m x k) and ``stages``
    buffers of both weight chunks (k x block_h and block_h x n), ``elem`` bytes an element."""
    return elem * (block_m * k + stages * block_h * (k + n))


def chunked_config(widths: list[int], k0: int = 256, block_m: int = 64, block_h: int = 128, stages: int = 1, persistent: bool = False,
                   programs_per_sm: int = 1, elem: int = 2) -> B2BConfig:  # fmt: skip
    """``b2b_chunked_kernel``'s tiling. The default is the best of the session-15 H200 sweep at
    256 -> 256 -> 256 (M = 262144 and 1M, 34 tilings): 64-row tiles on one warpgroup, 128-column
    chunks, no buffering (160 KB of shared memory: x tile + one chunk of each weight), one
    program per row tile: 0.168 / 0.681 ms against 0.186 / 0.725 for 128-row tiles with two
    64-column buffers. ``block_h`` shrinks until the buffers fit 227 KB (at ``elem`` bytes an element:
    an fp32 chain's buffers are twice an fp16 one's)."""
    last = pad_width(widths[-1])
    if interpreting():
        return B2BConfig(16, 32, last, 4, 1, "chunked", block_h=min(block_h, 32))
    bk = pad_width(k0)  # K0 in one step (the launcher's x box)
    while block_h > 16 and chunked_smem_bytes(block_m, bk, block_h, last, stages, elem) > SMEM_LIMIT:
        block_h //= 2
    warps = 8 if block_m == 128 else 4
    return B2BConfig(block_m, bk, last, warps, stages, "chunked", persistent=persistent, programs_per_sm=programs_per_sm, block_h=block_h)


def candidate_configs(
    m: int, widths: list[int], k0: int | None = None, image: tuple[int, int, int] | None = None, elem: int = 2, sms: int = 132
) -> list[B2BConfig]:
    """The few configs the fused-vs-unfused decision measures on the GPU. Chains of more than
    three stages compile slowly (a wide register-resident 9-stage chain takes minutes of ptxas):
    they try only the default and one smem-resident alternative. GEMM chains whose first K
    (``k0``) fits one K step also try the persistent kernel pipelined across row tiles, the form
    for memory-bound chains (small widths, large M): the next tiles' loads are in flight while
    a tile's GEMMs and store run. ``image`` (batch, OH, OW) of a conv chain's output adds the TMA
    kernel's tiles of several images that cover it with the least waste (``least_waste_tile``).
    Persistent candidates are left out where the rows make fewer tiles than the GPU has SMs
    (``sms``): no program then holds a second tile, so there is nothing to pipeline across tiles,
    and their kernels are the slowest to compile (an fp32 ``b2b_tma_kernel`` past 60 s of ptxas for
    ViT-tiny's 34-row chain, session 33)."""
    widest = max(pad_width(w) for w in widths[:-1])
    last = min(pad_width(widths[-1]), 128)
    chunked: list[B2BConfig] = []
    if k0 is not None and chunked_eligible(False, widths, k0) is None and widest >= 256:
        # the intermediate in 64-column chunks (b2b_chunked_kernel): the only fused form past 256
        # columns; at 256 it measured 0.184 ms against 0.224 for the whole-width tile (M = 262144)
        # the best of the session-15 sweeps: the default; 128-row tiles with two 64-column buffers
        # on a persistent grid; 64-column chunks with two persistent programs per SM (256-wide
        # chains); 64-column chunks double-buffered (best at 64 -> 1024 -> 64: 0.122 vs 0.130 ms)
        chunked = [chunked_config(widths, k0, elem=elem), chunked_config(widths, k0, 128, 64, 2, persistent=True, elem=elem),
                   chunked_config(widths, k0, 64, 64, 1, persistent=True, programs_per_sm=2, elem=elem),
                   chunked_config(widths, k0, 64, 64, 2, elem=elem)]  # fmt: skip
        if widths[0] > MAX_RESIDENT:
            return list(dict.fromkeys(_pipelined_where_tiles_repeat(chunked, m, sms)))
    persistent: list[B2BConfig] = []
    if k0 is not None and k0 <= 128 and widths[-1] <= 128 and len(widths) <= 3:
        bk = max(16, pad_width(k0))
        res = "register" if widest <= 128 else "smem"
        persistent = [B2BConfig(128, bk, last, 4 if res == "register" else 8, 3, res, True),
                      B2BConfig(64, bk, last, 4, 4, res, True)]  # fmt: skip
        # the same loop with x and the output moved by TMA (b2b_tma_kernel): deeper pipelines for
        # the narrow chains, more programs per SM where registers allow (~115 regs at 32 wide,
        # 230-255 at 64-128 wide on sm_90)
        if widest <= 64:
            persistent += [B2BConfig(128, bk, last, 4, 4, res, True, tma=True, programs_per_sm=2),
                           B2BConfig(128, bk, last, 4, 3, res, True, preload=True, tma=True, programs_per_sm=2),
                           B2BConfig(64, bk, last, 4, 4, res, True, tma=True, programs_per_sm=4)]  # fmt: skip
        else:
            persistent += [B2BConfig(64, bk, last, 4, 3, res, True, tma=True, programs_per_sm=2),
                           B2BConfig(64, bk, last, 4, 2, res, True, preload=True, tma=True, programs_per_sm=2),
                           B2BConfig(128, bk, last, 8, 2, res, True, tma=True, programs_per_sm=1)]  # fmt: skip
            # 64-row tiles hold a 128-wide intermediate in 64 registers a thread, so 3 programs per
            # SM can hide each other's epilogues (M = 262144, 64 -> 128 -> 64 sits at 1.96-2.01x its
            # memory floor with the best 2-program tiling, sessions 15-16). Only with the weights
            # preloaded: otherwise the pipeliner buffers them num_stages deep in the tile loop
            # (131-172 KB, one program per SM; offline sm_90, session 16). Preloaded: 134 registers,
            # 57-66 KB, three per SM
            persistent += [B2BConfig(64, bk, last, 4, 3, res, True, preload=True, tma=True, programs_per_sm=3),
                           B2BConfig(64, bk, last, 4, 2, res, True, preload=True, tma=True, programs_per_sm=3)]  # fmt: skip
            # the 128-row winner's tiling with the weights loaded once per program instead of once per
            # tile (2048 tiles x 32 KB of weights from L2 at M = 262144, as much as the chain's DRAM
            # traffic): 176 registers and 82 KB against 251 and 115 KB, still two per SM (session 16,
            # offline; not yet measured)
            persistent += [B2BConfig(128, bk, last, 4, 2, res, True, preload=True, tma=True, programs_per_sm=2)]
            if bk <= 64:  # 64 -> 128 -> 64: the best two of the session-5 sweep at M = 1M (0.110 ms vs 0.120)
                persistent += [B2BConfig(128, bk, last, 8, 2, res, True, preload=True, tma=True, programs_per_sm=2),
                               B2BConfig(128, bk, last, 4, 2, res, True, tma=True, programs_per_sm=2)]  # fmt: skip
        # the two best TMA tilings again with programmatic dependent launch: a ~30 us chain pays
        # ~5 us a call for its grid's ramp and tail (M = 262144 vs 1M, session 6), which PDL
        # overlaps with the neighbouring kernels
        # (the session-6 winners: first two of the list, or the last two for 64 -> 128 -> 64)
        tma = [c for c in persistent if c.tma]
        persistent += [replace(c, pdl=True) for c in (tma[-2:] if widest > 64 and bk <= 64 else tma[:2])]
    if len(widths) > 3:
        first = default_config(m, widths)
        alt = B2BConfig(128, 32, min(last, 64), 8, 2, "smem") if widest > 128 else default_config(m, widths, "smem")
        return [first] if alt == first else [first, alt]
    out = [default_config(m, widths, "register"), default_config(m, widths, "smem")]
    if widest <= 128:
        out += [B2BConfig(128, 64, last, 8, 2, "register"), B2BConfig(64, 64, last, 4, 3, "register")]
        if k0 is None:  # conv chains: the best of the session-5 sweep on the H200 (3x3 -> 1x1 at 64/128 wide)
            out += [B2BConfig(128, 64, last, 4, 3, "register"), B2BConfig(128, 64, last, 4, 2, "smem"),
                    B2BConfig(64, 64, last, 4, 2, "smem")]  # fmt: skip
        if k0 is not None and k0 <= 128 and widths[-1] <= 128 and len(widths) <= 3:
            # the first K in one step (no K loop: on sm_90 a 128-wide chain then needs ~150
            # registers instead of ~235, so more programs fit an SM), and the same with the
            # resident weights preloaded; the default tile with preload too
            bk = max(16, pad_width(k0))
            out += [B2BConfig(64, bk, last, 4, 2, "register"), B2BConfig(64, bk, last, 4, 2, "register", preload=True)]
            # twice the rows per program: half the weight traffic from L2, which bounds 128-wide
            # chains at M = 1M (16384 programs x 64 KB of weights each with 64-row tiles)
            out += [B2BConfig(128, bk, last, 8, 2, "register")]
            out += [replace(default_config(m, widths, "register"), preload=True)]
    else:
        out += [B2BConfig(64, 64, min(last, 64), 4, 2, "register"), B2BConfig(128, 32, min(last, 64), 8, 2, "smem")]
    out += persistent + chunked
    if k0 is None:
        # conv chains: the Hopper kernel with TMA boxes (b2b_conv_tma_kernel; stride-1 NHWC
        # convs, else these run b2b_kernel). The best of the session-6 H200 sweep: 128-pixel tiles
        # in three shapes (a 28-wide image wastes 14% of a 4x32 / 32x4 tile, 31% of an 8x16 one)
        # and 8x8, register-resident up to 128 wide (124 / 76 registers at 64 wide, 218 / 122 at
        # 128, no spills); for outputs wider than 128, 4 stages and 256-pixel tiles with 8 warps
        # (128 -> 128 -> 512: 0.0615 ms against 0.0696 for the best 128-pixel tile), and the same
        # through shared memory; 8 warps through shared memory above 128 wide
        if widest <= 128:
            out += [B2BConfig(128, 64, last, 4, 3, "register", tma=True, tile_h=th) for th in (8, 32, 4)]
            out += [B2BConfig(64, 64, last, 4, 3, "register", tma=True, tile_h=8)]
            if widths[-1] > 128:
                out += [B2BConfig(128, 64, last, 4, 4, "register", tma=True, tile_h=32),
                        B2BConfig(256, 64, last, 8, 3, "register", tma=True, tile_h=8),
                        B2BConfig(256, 64, last, 8, 3, "register", tma=True, tile_h=16),
                        B2BConfig(256, 64, last, 8, 3, "smem", tma=True, tile_h=8),
                        B2BConfig(128, 64, last, 8, 3, "smem", tma=True, tile_h=8)]  # fmt: skip
        else:
            out += [B2BConfig(128, 64, min(last, 64), 8, 2, "smem", tma=True, tile_h=8),
                    B2BConfig(64, 64, min(last, 64), 4, 2, "smem", tma=True, tile_h=8)]  # fmt: skip
        if image is not None:
            out += _exact_tiles(image, widest, widths[-1], last)
    if k0 is not None and widest > 128:
        # GEMM chains wider than 128: no register-resident candidates. They lost every recorded H200
        # decision (b2b_gemm.json 256-wide chains by 22-37%, ViT-tiny's 256 -> 64 by 36-61%), and in fp32
        # they are the slowest kernels to compile (15-36 s of ptxas each, session 33)
        out = [c for c in out if c.residence != "register"]
    seen, uniq = set(), []
    for c in map(lambda c: as_launched(c, widths), _pipelined_where_tiles_repeat(out, m, sms)):
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


def _pipelined_where_tiles_repeat(cands: list[B2BConfig], m: int, sms: int) -> list[B2BConfig]:
    """``cands`` without the persistent configs whose row tiles (of ``block_m`` rows out of ``m``) are
    fewer than ``sms``: there every program of a persistent grid holds at most one tile."""
    return [c for c in cands if not c.persistent or -(-m // c.block_m) >= sms]


def _exact_tiles(image: tuple[int, int, int], widest: int, n_last: int, last: int) -> list[B2BConfig]:
    """The TMA conv kernel's tiles of several images with the least waste for an (nb, OH, OW)
    output (28 x 28 at batch 64: 8 images x 4 x 4, where one image's best 128-pixel tile computes
    14% more pixels than needed, and 31% for the 256-pixel tile the widest outputs want), in the
    configs that won the session-6 sweep with single-image tiles."""
    nb, oh, ow = image

    def tile(bm: int, bn: int, w: int, s: int, res: str, bk: int = 64, ns: int = 0) -> B2BConfig | None:
        tn, th, _ = least_waste_tile(bm, nb, oh, ow)
        return B2BConfig(bm, bk, bn, w, s, res, tma=True, tile_h=th, tile_n=tn, n_stages=ns) if tn > 1 else None

    if widest <= 128:
        cands = [tile(128, last, 4, 3, "register"), tile(64, last, 4, 3, "register")]
        # three programs per SM (session 16, offline sm_90 compiles): the intermediate through shared
        # memory, 64-column last tiles, a single-buffered N loop: 158-159 registers and 48-64 KB,
        # where the tilings above take 192-224 registers or 98 KB (two per SM). 28 x 28 at batch
        # 64 is 392 tiles of 128 pixels: one wave of 396 slots instead of 1.48 waves of 264
        cands += [tile(128, 64, 4, 2, "smem", ns=1), tile(128, 64, 4, 4, "smem", bk=32, ns=1)]
        if n_last <= 128:
            # session 14: 128 -> 128 -> 128 at 28x28 lost to the tuned pair by 2% (0.0342 vs 0.0334
            # ms) with only 3-stage register tiles tried; the deeper and smem-resident tilings that
            # won the wide-output chains (1-2% better than 3 stages there); their persistent form
            # never won (0.036-0.037 ms against 0.028 for the three-per-SM tilings, session 16)
            cands += [tile(128, last, 4, 4, "register"), tile(128, last, 8, 4, "smem"), tile(128, last, 8, 3, "smem")]
        if n_last > 128:  # the best four of the session-6 sweep (128 -> 128 -> 512, 64 -> 64 -> 256)
            best = [tile(128, last, 4, 4, "register"), tile(128, last, 8, 4, "smem")]
            cands += [*best, tile(128, last, 8, 3, "smem"), tile(256, last, 8, 3, "smem")]
            # those need 160-192 KB of shared memory, most of it the N loop's 4 pipelined weight
            # tiles: one program per SM, whose last stage overlaps nothing. Two programs per SM
            # measured no faster (H200, 128 -> 128 -> 512): 64-wide last tiles (session 7, the
            # one kept here: 0.0532-0.0537 ms), single- or double-buffered N loops (n_stages 1-2,
            # 64-128 KB: 0.0579-0.0766 against 0.0541 for the 4-deep loop, session 8); three per
            # SM did win (the smem 4-warp tilings above: 0.045-0.047, session 16)
            cands += [tile(128, 64, 8, 4, "smem", bk=32)]
            # (the two best in persistent form, one program per SM looping over the tiles, were
            # candidates in sessions 9-16 and never won: 0.052-0.065 ms against 0.045-0.047 for the
            # three-per-SM tilings above, session 16)
    else:
        cands = [tile(128, min(last, 64), 8, 2, "smem")]
    return [c for c in cands if c is not None]
