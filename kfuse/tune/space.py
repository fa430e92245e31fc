"""Search spaces of the GEMM and conv templates, hard rules that prune them, soft rules that
order what is left, and the feature vector the cost model learns from.

A *problem* is what a kernel computes (shapes, dtype, layout); a *config* is how (the
template's constexpr tile parameters and launch options). Hard rules reject a config that
cannot run or cannot be fast, always with a reason a person can read:

* shared memory: ``num_stages x (BLOCK_M x BLOCK_K + BLOCK_K x BLOCK_N) x element bytes`` must
  fit the device's per-block opt-in limit, plus in the persistent TMA kernel the output tile staged
  for its TMA store (``tma_store_bytes``);
* registers: the fp32 accumulator ``BLOCK_M x BLOCK_N / threads`` may not crowd out the rest
  (spills), and a tile too small for its warps leaves warps idle;
* tile vs problem: a tile more than the next power of two of the problem dimension is waste;
* wgmma (sm_90): 8 warps are two warpgroups and need ``BLOCK_M >= 64``;
* split-K only when the output tiles do not fill the GPU and each slice keeps >= 2 K blocks;
  the persistent variant only on sm_90, without split-K, when there are more tiles than SMs;
* TMA (``tma``: A/B tiles by tensor descriptors) only on sm_90, without split-K, and only when
  TMA can describe the operands (A K-contiguous, 16-byte aligned leading strides), since
  otherwise the launch falls back to the pointer kernel and the config is a duplicate. With
  ``persistent`` it is the persistent TMA kernel;
* that kernel's compile hints (``warp_specialize``, ``flatten``, ``epilogue_subtile``) only with
  persistent + tma, and only where Triton 3.6 builds what they ask for on sm_90 (compiled
  offline, run on the H200): warp specialisation needs num_warps=4 and BLOCK_M >= 64
  (otherwise the hint is dropped and the config duplicates another), is dropped on a flattened
  loop, fails to compile with the subtiled epilogue and on 64x256 tiles, and deadlocks on the
  H200 with BLOCK_M > 64, so it is kept to 64x32..64x128 tiles, and it is not searched at all
  (``GEMM_AXES``: 1.7-2x slower than the flattened loop where it ran; valid only when a config
  asks for it); the subtiled epilogue only where the accumulator is big enough (128
  registers/thread) for the full-tile epilogue to spill.

Soft rules (``estimate_ms``) are an analytic roofline-with-waves estimate used to rank
candidates before the database has data, and as a feature of the learned cost model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kfuse.kernels.conv import ConvConfig
from kfuse.kernels.gemm import GemmConfig, resident_programs_per_sm, resident_smem_bytes
from kfuse.kernels.gemm_ws import SMEM_LIMIT as SM90_SMEM
from kfuse.kernels.gemm_ws import ws_config
from kfuse.kernels.tma import least_waste_tile, tile_waste
from kfuse.tune.hardware import Hardware

Config = GemmConfig | ConvConfig

ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def _dt(dtype: str) -> int:
    return ELEM_BYTES.get(dtype, 2)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GemmProblem:
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "fp16"
    a_t: bool = False  # A column-major (stride along M is 1)
    b_t: bool = False  # B column-major (a transposed weight view)
    n_extras: int = 0
    # the epilogue's GELU in the erf form (KFUSE_EXACT_GELU=1): ~20 more FP32 instructions a value,
    # which change the best schedule (session 18: coop, not ping-pong, on 8 of 12 BERT/GPT-2 shapes),
    # so such problems are tuned and stored apart; the default (tanh form) keeps its old signature
    erf_gelu: bool = False

    template = "gemm"

    def mnk(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    def signature(self) -> str:
        lay = ("T" if self.a_t else "N") + ("T" if self.b_t else "N")
        sig = f"gemm b{self.batch} m{self.m} n{self.n} k{self.k} {self.dtype} {lay} e{self.n_extras}"
        return sig + (" erf-gelu" if self.erf_gelu else "")

    def features(self) -> list[float]:
        return [math.log2(self.m), math.log2(self.n), math.log2(self.k), math.log2(self.batch), _dt(self.dtype),
                float(self.a_t), float(self.b_t), 1.0, 1.0, 1.0, 0.0]  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {"template": "gemm", **asdict(self)}


@dataclass(frozen=True)
class ConvProblem:
    n: int
    c: int
    h: int
    w: int
    oc: int
    kh: int
    kw: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    dtype: str = "fp16"
    n_extras: int = 0

    template = "conv"

    def out_hw(self) -> tuple[int, int]:
        oh = (self.h + 2 * self.padding[0] - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        ow = (self.w + 2 * self.padding[1] - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return oh, ow

    def mnk(self) -> tuple[int, int, int]:
        oh, ow = self.out_hw()
        return self.n * oh * ow, self.oc, self.kh * self.kw * self.c

    def signature(self) -> str:
        return (f"conv n{self.n} c{self.c} h{self.h} w{self.w} oc{self.oc} k{self.kh}x{self.kw} s{self.stride[0]}x{self.stride[1]}"
                f" p{self.padding[0]}x{self.padding[1]} d{self.dilation[0]}x{self.dilation[1]} {self.dtype} e{self.n_extras}")  # fmt: skip

    def features(self) -> list[float]:
        m, n, k = self.mnk()
        return [math.log2(m), math.log2(n), math.log2(k), 0.0, _dt(self.dtype), 0.0, 0.0,
                float(self.kh), float(self.stride[0]), math.log2(self.c), 1.0]  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {"template": "conv", **asdict(self)}


Problem = GemmProblem | ConvProblem


def problem_from_dict(d: dict[str, Any]) -> Problem:
    """The problem of a stored dict; keys this kfuse does not know (a newer kfuse's record) are
    dropped, as ``config_from_dict`` does."""
    d = dict(d)
    t = d.pop("template")
    cls = GemmProblem if t == "gemm" else ConvProblem
    names = {f.name for f in fields(cls)}
    d = {k: v for k, v in d.items() if k in names}
    if cls is ConvProblem:
        for key in ("stride", "padding", "dilation"):
            if key in d:
                d[key] = tuple(d[key])
    return cls(**d)


def config_from_dict(template: str, d: dict[str, Any]) -> Config:
    cls = GemmConfig if template == "gemm" else ConvConfig
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


# ---------------------------------------------------------------------------------------
# the spaces
# ---------------------------------------------------------------------------------------
GEMM_AXES: dict[str, tuple[Any, ...]] = {
    "block_m": (16, 32, 64, 128, 256),
    "block_n": (32, 64, 128, 256),
    "block_k": (32, 64, 128),
    "group_m": (1, 8),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
    "split_k": (1, 2, 4, 8),
    "persistent": (False, True),
    "tma": (False, True),
    # warp specialisation is a config knob but not searched: on the H200 (Triton 3.6) it hung the
    # GPU on 128-row tiles and was 1.7-2x slower than the flattened loop on the 64-row tiles
    # that ran (benchmarks/results/h200/experiments/gemm_ws_probe.json); a tuner must never hang
    "warp_specialize": (False,),
    "flatten": (False, True),
    "epilogue_subtile": (False, True),
}

# compile hints of the persistent TMA kernel: enumerated only where that kernel runs
_HINTS = ("warp_specialize", "flatten", "epilogue_subtile")

# the resident-B kernel (gemm_tma_resident_kernel: B's column block in shared memory for the
# program's life, K in one tile): its own small space, valid only where BLOCK_K covers K. On the
# H200 (session 14, benchmarks/experiments/resident_gemm_probe.py, M x 256 x 256 + bias + ReLU)
# 64x128x256 w4 s4 ran 79-84 us at M = 262144 against 87-96 for cuBLASLt with the epilogue;
# 1-2 stages (one A tile in flight per SM) and column blocks under 128 (A re-read from L2 by
# 4-8 programs) were 1.1-2.3x slower
RESIDENT_AXES: dict[str, tuple[Any, ...]] = {
    "block_m": (64, 128),
    "block_n": (64, 128, 256),
    "block_k": (16, 32, 64, 128, 256),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
}

# the Gluon warp-specialised kernels (kfuse/kernels/gemm_ws.py; sm_90, one batch, TMA operands and
# output): tiles whose fp32 accumulator is at most 128 registers a thread in each consumer warpgroup
# (ping-pong: 192, its consumers hold 232); stages as shared memory allows (the rules). Session 18's
# probes (benchmarks/experiments/pingpong_probe.py) found these tiles and stage counts fastest among
# those tried; the 192-wide ping-pong tiles (two accumulator pieces, session 19) are for wave
# quantization: BERT-base's N = 768 at 4096 tokens is 192 tiles of 128 x 128 on 132 SMs (1.45 waves)
# but 128 tiles of 128 x 192. Session 20: under the H200's power limit a GEMM's time follows the
# bytes it moves through L2 (ncu: kfuse's 128 x 128 tiles 1.48x cuBLAS's); the 192 x 128 tile (two row
# pieces over one B block) moves 17% fewer, and the two consumers sharing their staging buffers
# (``shared_c``) buys it a fourth ring stage: offered only where it buys a stage
WS_TILES: dict[str, tuple[tuple[int, int], ...]] = {
    "pingpong": ((128, 128), (64, 128), (128, 64), (64, 256), (128, 192), (64, 192), (192, 128)),
    "coop": ((128, 256), (128, 128)),
}
WS_STAGES = (3, 4, 5, 6)

CONV_AXES: dict[str, tuple[Any, ...]] = {
    "block_m": (32, 64, 128, 256),
    "block_n": (32, 64, 128, 256),
    "block_k": (16, 32, 64),
    "group_m": (1, 8),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4),
    "flat_k": (False, True),
}


def axes(template: str) -> dict[str, tuple[Any, ...]]:
    return GEMM_AXES if template == "gemm" else CONV_AXES


def all_configs(template: str) -> Iterator[Config]:
    """The product of the axes, except that the persistent TMA kernel's hints are combined only
    with persistent + tma without split-K (elsewhere they are rejected anyway): 1.2x, not 8x."""
    ax = axes(template)
    cls = GemmConfig if template == "gemm" else ConvConfig
    hints = [h for h in _HINTS if h in ax]
    base = {k: v for k, v in ax.items() if k not in hints}
    for values in itertools.product(*base.values()):
        d = dict(zip(base, values, strict=True))
        if not hints or not (d["persistent"] and d["tma"] and d["split_k"] == 1):
            yield cls(**d)
            continue
        for hv in itertools.product(*(ax[h] for h in hints)):
            h = dict(zip(hints, hv, strict=True))
            if h["warp_specialize"] and (d["num_warps"] != 4 or h["flatten"] or h["epilogue_subtile"]):
                continue
            yield cls(**d, **h)
    if template == "gemm":
        for values in itertools.product(*RESIDENT_AXES.values()):
            yield GemmConfig(**dict(zip(RESIDENT_AXES, values, strict=True)), group_m=1, tma=True, resident_b=True)
        for sched, tiles in WS_TILES.items():
            for (bm, bn), stages, gm in itertools.product(tiles, WS_STAGES, (1, 8)):
                cfg = GemmConfig(bm, bn, 64, gm, 4 if sched == "pingpong" else 8, stages, tma=True, ws=sched)
                yield cfg
                if sched == "pingpong" and _shared_staging_buys_a_stage(cfg):
                    yield replace(cfg, shared_c=True)


def _shared_staging_buys_a_stage(cfg: GemmConfig) -> bool:
    """A ping-pong config's ring fits sm_90's shared memory only when the consumers share their
    staging buffers (fp16): the one case the ``shared_c`` variant is worth a measurement."""
    own, shared = ws_config(cfg).smem_bytes(), ws_config(replace(cfg, shared_c=True)).smem_bytes()
    return shared <= SM90_SMEM < own


def tma_store_bytes(cfg: Config, problem: Problem) -> int:
    """Shared memory for the output tile the persistent TMA GEMM kernel stages for its TMA store
    (``BLOCK_M x BLOCK_N`` output elements, half with ``epilogue_subtile``); 0 where the kernel
    stores by pointers or needs nothing extra. ``launch`` stores by TMA when C can be described:
    output dtype = input dtype assumed, C contiguous, so N x bytes must be 16-byte aligned. The
    buffer outlives the tile (the store is asynchronous), so it adds to the pipeline buffers the
    next tile's loads keep live; ``gemm_tma_kernel`` (one tile per program) reuses the dead
    pipeline buffers for it (sm_90 offline compiles, benchmarks/experiments/gemm_store_sass.py:
    the persistent kernel asks for pipeline + this + <= 1.3 KB of barriers, the other for the
    pipeline alone)."""
    if not (isinstance(cfg, GemmConfig) and isinstance(problem, GemmProblem) and cfg.tma and cfg.persistent and cfg.split_k == 1):
        return 0
    e = _dt(problem.dtype)
    if problem.n * e % 16:
        return 0
    return cfg.block_m * cfg.block_n * e // (2 if cfg.epilogue_subtile else 1)


def smem_bytes(cfg: Config, problem: Problem) -> int:
    e = _dt(problem.dtype)
    if isinstance(cfg, GemmConfig) and cfg.ws:
        return ws_config(cfg, e).smem_bytes(e)
    if isinstance(cfg, GemmConfig) and cfg.resident_b:
        return resident_smem_bytes(cfg, e, tma_store=isinstance(problem, GemmProblem) and problem.n * e % 16 == 0)
    pipeline = cfg.num_stages * (cfg.block_m * cfg.block_k + cfg.block_k * cfg.block_n) * e
    if isinstance(cfg, ConvConfig) and cfg.tile_h:
        pipeline += cfg.block_m * cfg.block_n * e  # the output box staged for the TMA store
    extra = 0
    if isinstance(cfg, GemmConfig) and cfg.epilogue_subtile:
        # splitting the accumulator goes through shared memory (a half tile of fp32), on top
        # of the pipeline buffers, which the next tile's loads keep live (H200: 128x256x64 s4
        # asked for 262176 B)
        extra = cfg.block_m * cfg.block_n * 2
    # the TMA store's staged tile; with the subtiled epilogue it is a half tile of the output
    # dtype (<= the split's half tile of fp32), and sm_90 offline compiles of every subtile config
    # the space allows ask for pipeline + the staged half tile only: the larger of the two bounds
    return pipeline + max(extra, tma_store_bytes(cfg, problem))


def _ws(cfg: Config) -> bool:
    return isinstance(cfg, GemmConfig) and cfg.warp_specialize


def acc_regs(cfg: Config) -> int:
    """fp32 accumulator registers per thread (warp-specialised: the tile is split over two
    consumer warp groups of ``num_warps`` warps)."""
    return cfg.block_m * cfg.block_n // (cfg.num_warps * 32 * (2 if _ws(cfg) else 1))


def threads(cfg: Config) -> int:
    """Threads of one program; warp specialisation adds a producer and a second consumer group
    (the Gluon kernels: a loader warp, which takes a warpgroup's registers, and for ping-pong a
    second consumer warpgroup)."""
    if isinstance(cfg, GemmConfig) and cfg.ws:
        return (cfg.num_warps * (2 if cfg.ws == "pingpong" else 1) + 4) * 32
    return cfg.num_warps * 32 * (3 if _ws(cfg) else 1)


def hard_reject(cfg: Config, problem: Problem, hw: Hardware) -> str | None:
    """Why ``cfg`` cannot run (or cannot be fast) for ``problem`` on ``hw``; None if valid."""
    m, n, k = problem.mnk()
    smem = smem_bytes(cfg, problem)
    if smem > hw.smem_per_block:
        what = "stages x tile bytes" + (" + the output tile staged for the TMA store" if tma_store_bytes(cfg, problem) else "")
        return f"shared memory {smem} B ({what}) > device limit {hw.smem_per_block} B"
    regs = acc_regs(cfg)
    # a ping-pong consumer warpgroup holds 232 registers (setmaxnreg): 192 for the accumulator
    # compile without spills at sm_90 with bias + GELU (tests/kernels/test_gemm_ws.py)
    most = 192 if isinstance(cfg, GemmConfig) and cfg.ws == "pingpong" else 128
    if regs > most:
        return f"accumulator needs {regs} registers/thread (> {most} leaves too few; spills)"
    if regs < 4:
        return f"{cfg.num_warps} warps on a {cfg.block_m}x{cfg.block_n} tile leave warps idle ({regs} acc values/thread)"
    if cfg.block_m > max(16, next_pow2(m)):
        return f"BLOCK_M {cfg.block_m} > problem M {m} (rounded up to {max(16, next_pow2(m))})"
    if cfg.block_n > max(32, next_pow2(n)):
        return f"BLOCK_N {cfg.block_n} > problem N {n} (rounded up to {max(32, next_pow2(n))})"
    if hw.has_wgmma and cfg.num_warps == 8 and cfg.block_m < 64:
        return "wgmma: 8 warps are two warpgroups and need BLOCK_M >= 64"
    if cfg.group_m > 1 and cdiv(m, cfg.block_m) <= 1:
        return "GROUP_M swizzle has no effect with a single row of tiles"
    if isinstance(cfg, GemmConfig) and cfg.shared_c and cfg.ws != "pingpong":
        return "shared staging (shared_c) is a ping-pong option"
    if isinstance(cfg, GemmConfig) and cfg.resident_b:
        return _resident_reject(cfg, problem, hw)
    if isinstance(cfg, GemmConfig) and cfg.ws:
        return _ws_reject(cfg, problem, hw)
    if isinstance(cfg, GemmConfig) and isinstance(problem, GemmProblem):
        split = cfg.split_k
        tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * problem.batch
        why = _hint_reject(cfg)
        if why:
            return why
        if split > 1 and tiles >= hw.num_sms:
            return f"split-K: already {tiles} tiles >= {hw.num_sms} SMs, a K split only adds a reduction"
        if split > 1 and k // split < 2 * cfg.block_k:
            return f"split-K {split}: a K slice of {k // split} is shorter than 2 x BLOCK_K"
        if cfg.block_k > max(32, next_pow2(cdiv(k, split))):
            return f"BLOCK_K {cfg.block_k} > K slice {cdiv(k, split)}"
        if cfg.persistent:
            if not hw.has_wgmma:
                return "the persistent variant is in the Hopper (sm_90) space only"
            if split > 1:
                return "persistent and split-K do not combine"
            if tiles <= hw.num_sms:
                return f"only {tiles} tiles <= {hw.num_sms} SMs: the persistent loop has nothing to amortise"
        if cfg.tma:
            why = _tma_reject(cfg, problem, hw)
            if why:
                return why
    if isinstance(cfg, ConvConfig) and isinstance(problem, ConvProblem):
        k_eff = k if cfg.flat_k else problem.c
        if cfg.block_k > max(16, next_pow2(k_eff)):
            return f"BLOCK_K {cfg.block_k} > {'K' if cfg.flat_k else 'channels'} {k_eff}"
        if cfg.flat_k and problem.c >= 32:
            return f"flat K order re-decodes every tap: only for few channels (C={problem.c} >= 32)"
        if cfg.tile_h:
            why = _conv_tma_reject(cfg, problem, hw)
            if why:
                return why
    return None


def _conv_tma_reject(cfg: ConvConfig, problem: ConvProblem, hw: Hardware) -> str | None:
    """Where ``conv_tma_kernel`` (TMA boxes of tile_n x tile_h x BW pixels) cannot run or only
    duplicates another config."""
    if not hw.has_wgmma:
        return "the TMA conv kernel is in the Hopper (sm_90) space only"
    if problem.stride != (1, 1):
        return f"a TMA box is a dense window: stride 1 only (stride {problem.stride})"
    if cfg.flat_k or cfg.group_m != 1:
        return "the TMA conv kernel has no flat-K order and no GROUP_M swizzle (a duplicate of g1)"
    # the product is computed transposed (acc^T = W^T A^T): wgmma's M is BLOCK_N, 64 per warpgroup
    if cfg.block_n < 64 * (cfg.num_warps // 4):
        return f"TMA conv: the transposed product needs BLOCK_N >= 64 per warpgroup ({cfg.block_n} with {cfg.num_warps} warps)"
    if cfg.block_m < 32:
        return "TMA conv: a spatial tile under 32 pixels"
    return None


def _hint_reject(cfg: GemmConfig) -> str | None:
    """The persistent TMA kernel's compile hints; the limits are Triton 3.6's on sm_90, found by
    compiling offline (tests/kernels/test_gemm.py checks the warp-specialised SASS)."""
    hints = [h for h in _HINTS if getattr(cfg, h)]
    if not hints:
        return None
    if not (cfg.persistent and cfg.tma):
        return f"{'/'.join(hints)}: hints of the persistent TMA kernel only (needs persistent and tma)"
    if cfg.warp_specialize:
        if cfg.num_warps != 4:
            return "warp_specialize needs num_warps=4 (Triton 3.6 on sm_90 ignores it with 8 warps: a duplicate config)"
        if cfg.block_m < 64:
            return "warp_specialize needs BLOCK_M >= 64 (wgmma consumer groups; smaller tiles are not specialised)"
        if cfg.block_m > 64:
            # the pass then splits BLOCK_M over the two consumer groups; measured on the H200:
            # 128x64, 128x128, 256x128 never finish (one tile per program or many, with or
            # without an epilogue), 64x64 and 64x128 (split along N) are correct
            return "warp_specialize with BLOCK_M > 64: Triton 3.6's Hopper kernel deadlocks on the H200 (64-row tiles only)"
        if cfg.flatten:
            return "warp_specialize with flatten: Triton 3.6 does not specialise a flattened loop (a duplicate of flatten alone)"
        if cfg.epilogue_subtile:
            return "warp_specialize with epilogue_subtile: Triton 3.6's Hopper data partitioning fails on the split epilogue"
        if cfg.block_m == 64 and cfg.block_n >= 256:
            return "warp_specialize on a 64x256 tile: Triton 3.6 fails to compile it (wgmma operand layout assertion)"
    if cfg.epilogue_subtile and acc_regs(cfg) < 128:
        # ptxas, offline: the bias+GELU epilogue of a 128-register accumulator spills ~2 KB, 10x
        # less subtiled; at 64 registers it spills ~20 B either way
        return f"epilogue_subtile only pays on big tiles (accumulator {acc_regs(cfg)} < 128 registers/thread)"
    return None


def _resident_reject(cfg: GemmConfig, problem: Problem, hw: Hardware) -> str | None:
    """Where ``gemm_tma_resident_kernel`` cannot run, or only duplicates another config (the
    generic rules above it have passed: shared memory, registers, tile vs problem)."""
    if not isinstance(problem, GemmProblem):
        return "resident B is a GEMM kernel"
    if not (cfg.tma and hw.has_wgmma):
        return "resident B needs TMA (Hopper, sm_90)"
    if cfg.persistent or cfg.split_k != 1 or cfg.group_m != 1 or any(getattr(cfg, h) for h in _HINTS):
        return "resident B is its own persistent kernel: no split-K, swizzle or persistent-TMA hints"
    if problem.batch != 1:
        return "resident B: one batch only (a batched B changes per batch)"
    if cfg.block_k != max(16, next_pow2(problem.k)):
        return f"resident B holds all of K in one tile: BLOCK_K must be K rounded up to a power of two ({max(16, next_pow2(problem.k))})"
    if problem.k > 256:
        return f"resident B: K {problem.k} > 256 (a TMA box is at most 256 wide)"
    rows = cdiv(problem.m, cfg.block_m)
    cols = cdiv(problem.n, cfg.block_n)
    slots = hw.num_sms * resident_programs_per_sm(cfg, _dt(problem.dtype))
    if rows * cols < 2 * slots:
        return f"resident B: {rows * cols} tiles < 2 per program ({slots} programs): loading B once saves nothing"
    return _tma_reject(cfg, problem, hw)


def _ws_reject(cfg: GemmConfig, problem: Problem, hw: Hardware) -> str | None:
    """Where the Gluon warp-specialised kernels (``gemm_ws``) cannot run, or only duplicate another
    config (the generic rules above it have passed: shared memory, registers, tile vs problem)."""
    if not isinstance(problem, GemmProblem):
        return "the warp-specialised kernels are GEMM kernels"
    if cfg.ws not in WS_TILES:
        return f"unknown warp-specialised schedule {cfg.ws!r} (pingpong, coop)"
    if not (cfg.tma and hw.has_wgmma):
        return "the warp-specialised kernels need TMA and wgmma (Hopper, sm_90)"
    if cfg.num_warps != (4 if cfg.ws == "pingpong" else 8):
        return f"{cfg.ws}: {'one warpgroup per consumer (num_warps 4)' if cfg.ws == 'pingpong' else 'two warpgroups (num_warps 8)'}"
    if cfg.ws == "coop" and cfg.block_m != 128:
        return "coop: two warpgroups of 64 rows (BLOCK_M 128)"
    if cfg.persistent or cfg.split_k != 1 or cfg.resident_b or any(getattr(cfg, h) for h in _HINTS):
        return "the warp-specialised kernels are their own persistent kernels: no split-K or persistent-TMA hints"
    if problem.batch != 1:
        return "the warp-specialised kernels run one batch"
    if problem.dtype not in ("fp16", "bf16"):
        return f"the warp-specialised kernels take fp16/bf16 (got {problem.dtype})"
    if problem.n * _dt(problem.dtype) % 16:
        return f"the warp-specialised kernels store C by TMA: N {problem.n} x {_dt(problem.dtype)} B is not 16-byte aligned"
    tiles = cdiv(problem.m, cfg.block_m) * cdiv(problem.n, cfg.block_n)
    if tiles < hw.num_sms // 2:
        return f"only {tiles} tiles: a persistent warp-specialised grid would leave most SMs idle"
    return _tma_reject(cfg, problem, hw)


def _tma_reject(cfg: GemmConfig, problem: GemmProblem, hw: Hardware) -> str | None:
    if not hw.has_wgmma:
        return "TMA (tensor descriptors) is in the Hopper (sm_90) space only"
    if cfg.split_k > 1:
        return "TMA and split-K do not combine (the split-K kernel loads by pointer)"
    if problem.a_t:
        return "TMA needs A K-contiguous (A is column-major): the launch would fall back to pointers"
    e = _dt(problem.dtype)
    lead = {"A": problem.k, "B": problem.k if problem.b_t else problem.n}
    for name, stride in lead.items():
        if stride * e % 16:
            return f"TMA: {name}'s leading stride {stride} x {e} B is not 16-byte aligned: the launch would fall back to pointers"
    return None


def valid_configs(problem: Problem, hw: Hardware) -> list[Config]:
    """Every config of the template's space that can run ``problem`` on ``hw``. For a stride-1
    conv on Hopper, each pointer-kernel config also comes as ``conv_tma_kernel`` on the spatial
    tile of least waste for the problem (``least_waste_tile``): the tile shape is derived, not
    searched, so the space grows by the valid TMA configs only."""
    out = [c for c in all_configs(problem.template) if hard_reject(c, problem, hw) is None]
    if isinstance(problem, ConvProblem) and hw.has_wgmma and problem.stride == (1, 1):
        oh, ow = problem.out_hw()
        for c in list(out):
            if isinstance(c, ConvConfig) and c.group_m == 1 and not c.flat_k:
                tn, th, _ = least_waste_tile(c.block_m, problem.n, oh, ow)
                v = replace(c, tile_h=th, tile_n=tn)
                if hard_reject(v, problem, hw) is None:
                    out.append(v)
    return out


def is_valid(cfg: Config, problem: Problem, hw: Hardware) -> bool:
    return hard_reject(cfg, problem, hw) is None


# ---------------------------------------------------------------------------------------
# soft rules: an analytic estimate (roofline per tile, wave quantisation, occupancy)
# ---------------------------------------------------------------------------------------
def occupancy(cfg: Config, problem: Problem, hw: Hardware) -> int:
    n = threads(cfg)
    by_smem = hw.smem_per_block // max(1, smem_bytes(cfg, problem))
    by_regs = hw.regs_per_sm // (n * (acc_regs(cfg) + 48))
    by_threads = hw.max_threads_per_sm // n
    return max(1, min(by_smem, by_regs, by_threads, 8))


def estimate_ms(cfg: Config, problem: Problem, hw: Hardware) -> float:
    """Predicted time (ms) from first principles; only its ranking matters."""
    m, n, k = problem.mnk()
    e = _dt(problem.dtype)
    batch = problem.batch if isinstance(problem, GemmProblem) else 1
    split = cfg.split_k if isinstance(cfg, GemmConfig) else 1
    k_eff = cdiv(k, split)
    if isinstance(cfg, ConvConfig) and isinstance(problem, ConvProblem) and not cfg.flat_k:
        k_eff = problem.kh * problem.kw * cdiv(problem.c, cfg.block_k) * cfg.block_k  # channel padding
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * batch * split
    occ = occupancy(cfg, problem, hw)
    slots = hw.num_sms * occ
    waves = cdiv(tiles, slots)
    per_sm_flops = hw.peak_tflops_fp16 * 1e12 / hw.num_sms
    # a tile's work at full rate, slowed when the tile's arithmetic intensity is below the
    # SM's L2 ridge (~ 160 flop/B per SM at these rates) and when tensor cores idle
    tile_flops = 2.0 * cfg.block_m * cfg.block_n * k_eff
    intensity = 2.0 * cfg.block_m * cfg.block_n / ((cfg.block_m + cfg.block_n) * e)
    eff = min(1.0, intensity / 160.0)
    if hw.has_wgmma and cfg.block_m < 64:
        eff *= 0.6  # mma.sync instead of wgmma
    eff *= {2: 0.8, 3: 0.95, 4: 1.0, 5: 0.98}.get(cfg.num_stages, 0.9)
    eff *= 1.0 - 4.0 / cfg.block_k  # per-iteration overhead (address math, barriers)
    if cfg.num_warps == 8 and cfg.block_m * cfg.block_n < 128 * 128:
        eff *= 0.85
    t_wave = tile_flops / (per_sm_flops * eff) * occ  # occ tiles share one SM
    t = waves * t_wave
    # DRAM floor: operands once, output once (+ split-K workspace round trip)
    bytes_moved = (m * k + k * n) * e * batch + m * n * e * batch
    if split > 1:
        bytes_moved += 2 * split * m * n * 4 * batch
    t = max(t, bytes_moved / (hw.mem_bw_gbs * 1e9))
    if cfg.group_m == 1 and cdiv(m, cfg.block_m) > 8:
        t *= 1.05  # B tiles fall out of L2 without the swizzle
    if isinstance(cfg, GemmConfig) and cfg.persistent:
        t *= _persistent_tma_factor(cfg, k, tiles, hw) if cfg.tma else 0.97
    if isinstance(cfg, GemmConfig) and cfg.tma:
        t *= 0.88  # TMA loads: 10-18% faster than cp.async on the H200 (GEMM+bias+GELU, K=768)
    if isinstance(cfg, ConvConfig) and cfg.tile_h and isinstance(problem, ConvProblem):
        # conv_tma_kernel: 1.06-1.46x faster than the tuned pointer kernel on every stride-1
        # ResNet-50 layer (H200, session 6, conv_layers.json kfuse_tma_ms), times the pixels its
        # spatial tile computes in vain
        oh, ow = problem.out_hw()
        t *= 0.82 * tile_waste(cfg.block_m, cfg.tile_n, cfg.tile_h, problem.n, oh, ow)
    if isinstance(cfg, GemmConfig) and cfg.resident_b:
        t = _resident_estimate_s(cfg, problem, hw)
    if isinstance(cfg, GemmConfig) and cfg.ws:
        # session 18 (pingpong_probe, bias + GELU, 12 BERT/GPT-2 shapes): ping-pong 0.84-1.04x and
        # coop 0.90-1.03x the flattened persistent TMA kernel's time, whose factor this replaces
        flat = replace(cfg, ws="", persistent=True, flatten=True)
        t *= _persistent_tma_factor(flat, k, tiles, hw) * (0.93 if cfg.ws == "pingpong" else 0.97)
    t += 4e-6 * (2 if split > 1 else 1)  # launch
    return t * 1e3


def _resident_estimate_s(cfg: GemmConfig, problem: Problem, hw: Hardware) -> float:
    """The resident-B kernel streams A in and C out once; B comes in once per program. Fitted to
    one H200 run (session 14, M x 256 x 256): DRAM time x a stage factor (one A tile in flight
    per SM at 2 stages is 1.7x slower than 4) x the L2 re-reads of A by ``n_cols`` column programs
    past two (64- and 32-wide column blocks ran 1.1x and 2.2x slower than 128-wide)."""
    m, n, k = problem.mnk()
    e = _dt(problem.dtype)
    dram = (m * k + m * n) * e / (hw.mem_bw_gbs * 1e9)
    mma = 2.0 * m * n * k / (hw.peak_tflops_fp16 * 1e12 * 0.7)
    stages = {2: 1.7, 3: 1.12, 4: 1.0}.get(cfg.num_stages, 1.02)
    cols = cdiv(n, cfg.block_n)
    reread = 1.0 + 0.3 * max(0, cols - 2)
    warps = 1.1 if cfg.num_warps == 8 and cfg.block_m == 64 else 1.0
    return max(dram, mma) * 1.25 * stages * reread * warps


def _persistent_tma_factor(cfg: GemmConfig, k: int, tiles: int, hw: Hardware) -> float:
    """The persistent TMA kernel against one TMA program per tile, from one H200 run of
    benchmarks/experiments/gemm_ws_probe.py (12 BERT/GPT-2 shapes, bias+GELU): the flattened
    loop hides a tile's prologue/epilogue behind the next tile's loads, 5-15% faster where K is a
    few blocks and each program gets several tiles (K=768), even at K=3072; without a hint the
    persistent loop gains nothing; warp specialisation (64-row tiles, the only ones that do not
    deadlock) is 1.7-2x slower than the flattened loop; the subtiled epilogue is mixed (+3%/-12%)."""
    short_k = cdiv(k, cfg.block_k) <= 16 and tiles >= 2 * hw.num_sms
    f = 1.02
    if cfg.warp_specialize:
        f *= 1.8
    elif cfg.flatten:
        f *= 0.9 if short_k else 0.98
    return f


def rank_by_rules(configs: list[Config], problem: Problem, hw: Hardware) -> list[Config]:
    return sorted(configs, key=lambda c: estimate_ms(c, problem, hw))


def features(cfg: Config, problem: Problem, hw: Hardware) -> list[float]:
    """Problem features + config features + derived quantities, for the cost model."""
    m, n, k = problem.mnk()
    batch = problem.batch if isinstance(problem, GemmProblem) else 1
    split = cfg.split_k if isinstance(cfg, GemmConfig) else 1
    persistent = float(cfg.persistent) if isinstance(cfg, GemmConfig) else 0.0
    flat = float(cfg.flat_k) if isinstance(cfg, ConvConfig) else 0.0
    tma = float(cfg.tma) if isinstance(cfg, GemmConfig) else float(cfg.tile_h > 0)
    hints = [float(getattr(cfg, h)) if isinstance(cfg, GemmConfig) else 0.0 for h in _HINTS]
    resident = float(isinstance(cfg, GemmConfig) and cfg.resident_b)
    ws = [float(isinstance(cfg, GemmConfig) and cfg.ws == w) for w in WS_TILES] + [float(getattr(cfg, "shared_c", False))]
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * batch * split
    occ = occupancy(cfg, problem, hw)
    waves = tiles / (hw.num_sms * occ)
    wave_eff = waves / math.ceil(waves) if waves > 0 else 0.0
    pad = (cdiv(m, cfg.block_m) * cfg.block_m * cdiv(n, cfg.block_n) * cfg.block_n) / (m * n)
    return problem.features() + [
        math.log2(cfg.block_m), math.log2(cfg.block_n), math.log2(cfg.block_k), float(cfg.group_m),
        float(cfg.num_warps), float(cfg.num_stages), math.log2(split), persistent, flat, tma, *hints, resident, *ws,
        math.log2(tiles), float(occ), wave_eff, pad, smem_bytes(cfg, problem) / 1024.0, float(acc_regs(cfg)),
        math.log(estimate_ms(cfg, problem, hw)),
    ]  # fmt: skip
