"""A simulated GPU with known durations, for testing the scheduler without a GPU.

LC kernel i takes ``lc_ms[i]``; BE kernel b takes ``a_b + b_b * blocks``; a fused launch follows a
known two-stage law in the load ratio (``fused_law``); two streams overlap by ``stream_overlap``
of the shorter kernel. Optional multiplicative noise checks robustness to prediction error.
``stall_ms`` adds a one-off stall to the first launch of every new (kernel, range-bound class) with
the classes Triton specialised integers on (== 1, % 16 == 0, other): the JIT compiles the H200 run
timed into Aker's split launches before the range bounds were marked ``do_not_specialize``.
``h200_like`` builds a GPU shaped like the measured ResNet-50 B32 + sgemm/lbm case; ``h200_round2`` one
from the numbers of the second H200 re-run (profiled LC kernel times, wave-quantised BE kernels on the
528-program PTB grid, measured best overlap per LC shape and version).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kfuse.colocate.fuser import any_kernel
from kfuse.colocate.scheduler import Backend, LCKernel


def overlap_law(overlap: float) -> Callable[[float, float, Any], float]:
    """T_fused = (T_lc + T_be) * (1 - overlap), never below the longer kernel (overlap < 0: worse than serial)."""

    def law(t_lc: float, t_be: float, version: Any) -> float:
        return max(t_lc, t_be, (t_lc + t_be) * (1.0 - overlap))

    return law


def partition_law(be_share: float, lc_slowdown: float = 1.0, launch_ms: float = 0.0) -> Callable[[float, float, Any], float]:
    """An SM-partition version: the LC kernel on its SMs (``lc_slowdown`` x its whole-GPU time) beside the BE slice on
    ``be_share`` of the SMs (its whole-GPU time less the launch cost ``launch_ms``, over the share); the pair ends with
    the later of the two."""

    def law(t_lc: float, t_be: float, version: Any) -> float:
        return max(t_lc * lc_slowdown, launch_ms + max(0.0, t_be - launch_ms) / be_share)

    return law


def two_stage_law(c_co: float = 0.15, x_star: float = 1.5, c_solo: float = 1.0) -> Callable[[float, float, Any], float]:
    """T_fused = T_lc * (1 + c_co x) below x*, then slope c_solo in x above it (continuous)."""

    def law(t_lc: float, t_be: float, version: Any) -> float:
        x = t_be / t_lc
        g = 1.0 + c_co * min(x, x_star) + c_solo * max(0.0, x - x_star)
        return t_lc * g

    return law


class SimGPU(Backend):
    def __init__(
        self, lc_ms: Sequence[float], fusible: Sequence[bool], be: dict[str, tuple[float, float, int]],
        fused_law: Callable[[float, float, Any], float] | dict[Any, Callable[[float, float, Any], float]] | None = None,
        stream_overlap: float = 0.1, noise: float = 0.0, seed: int = 0, keys: Sequence[str] | None = None,
        stall_ms: float = 0.0, sms: int = 132, span_slowdown: dict[int, float] | None = None,
        span_contention: dict[str, float] | None = None, span_idle: float = 0.0, fill_contention: dict[str, float] | None = None,
    ) -> None:  # fmt: skip
        self.sms = sms
        # the share of the query's own SMs' time it leaves idle (gaps between kernels, kernels with fewer programs than
        # SMs): a backfill runs there at the BE's whole-GPU rate per SM; what does not fit runs after the query
        self.span_idle = span_idle
        # BE kernel -> the query's extra time (a fraction) per whole BE kernel's blocks backfilled beside it: what the
        # backfill's blocks contend for on the query's SMs (H100, session 53, ResNet-50 B32, a 10% backfill: pathfinder
        # +2.9% of the query, stencil7 +5.8%, sgemm +10.7%; a fixed wait per query kernel start for a resident block,
        # modelled in session 52, was refuted: pathfinder's 8.9 us blocks cost least)
        self.fill_contention = dict(fill_contention or {})
        self.span_slowdown = dict(span_slowdown or {})  # BE SM count -> the whole query's slowdown on the rest
        # BE kernel -> the query's extra time (a fraction) per whole BE kernel's blocks beside it: the HBM and L2
        # contention session 50's simulation lacked (H100, session 51: mri-q ~0.013, sgemm ~0.03-0.05, hotspot ~0.05)
        self.span_contention = dict(span_contention or {})
        self.lc_ms = list(lc_ms)
        self.fusible = list(fusible)
        self.keys = list(keys) if keys is not None else [f"k{i}" for i in range(len(lc_ms))]
        self.be = be  # name -> (a, b, n_blocks)
        self.law = fused_law or two_stage_law()
        self.stream_overlap = stream_overlap
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.launches: list[tuple[str, Any]] = []
        self.stall_ms = stall_ms
        self.compiled: set[tuple[Any, ...]] = set()
        self.stalls = 0

    def _n(self, t: float) -> float:
        return t * (1.0 + self.noise * self.rng.uniform(-1, 1)) if self.noise else t

    def _stall(self, *variant: Any) -> float:
        if not self.stall_ms:
            return 0.0
        v = tuple(("1" if x == 1 else "D" if x % 16 == 0 else "") if isinstance(x, int) else x for x in variant)
        if v in self.compiled:
            return 0.0
        self.compiled.add(v)
        self.stalls += 1
        return self.stall_ms

    def lc_kernels(self) -> list[LCKernel]:
        return [LCKernel(f"lc{i}", f, k) for i, (f, k) in enumerate(zip(self.fusible, self.keys, strict=True))]

    def be_blocks(self, be: str) -> int:
        return self.be[be][2]

    def be_time(self, be: str, n: int) -> float:
        """``a + b n``; with a 4th entry W (programs of the PTB grid) the blocks run in whole waves: ``a + b W ceil(n / W)``."""
        a, b, *rest = self.be[be]
        if n <= 0:
            return 0.0
        return a + b * (rest[1] * -(-n // rest[1]) if len(rest) > 1 else n)

    def run_lc(self, i: int) -> float:
        self.launches.append(("lc", i))
        return self._n(self.lc_ms[i])

    def run_be(self, be: str, start: int, end: int) -> float:
        self.launches.append(("be", (be, start, end)))
        return self._n(self.be_time(be, end - start)) + self._stall("be", be, start, end)

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        if not self.fusible[i] and not any_kernel(version):
            raise ValueError(f"LC kernel {i} is not fusible")
        self.launches.append(("fused", (i, be, start, end, version)))
        law = (self.law.get((self.keys[i], version)) or self.law[version]) if isinstance(self.law, dict) else self.law
        return self._n(law(self.lc_ms[i], self.be_time(be, end - start), version)) + self._stall("fused", be, version, start, end)

    def run_span(self, be: str, start: int, end: int, be_sms: int, fill: int = 0) -> float:
        """The query on ``sms - be_sms`` SMs (``span_slowdown``) beside the blocks on ``be_sms`` (their launch cost once,
        the rest at the partition's share of the whole GPU's rate); the later of the two. A backfill of ``fill`` blocks
        runs in the query's idle share of its own SMs (``span_idle``), slowing it by ``fill_contention``; what does
        not fit there runs on those SMs after it."""
        self.launches.append(("span", (be, start, end, be_sms) + ((fill,) if fill else ())))
        t_lc = sum(self.lc_ms) * (self.span_slowdown.get(be_sms, 1.0) if be_sms else 1.0)
        if (not be_sms or end <= start) and not fill:
            return self._n(t_lc)
        a, n_blocks = self.be[be][0], self.be[be][2]
        t_lc *= 1.0 + self.span_contention.get(be, 0.0) * (end - start) / n_blocks
        t_lc *= 1.0 + self.fill_contention.get(be, 0.0) * fill / n_blocks
        launches = 1 + max(0, end - 1) // n_blocks - start // n_blocks  # past a kernel's blocks: the job's next instances
        t_be = launches * a + (self.be_time(be, end - start) - a) * self.sms / be_sms if end > start and be_sms else 0.0
        t = max(t_lc, t_be)
        if fill:  # whole-GPU BE time of the backfill, on the query's SMs: in its idle share, then after it
            lc_sms = self.sms - be_sms
            work = (self.be_time(be, fill) - a) * self.sms / lc_sms
            t = max(t, t_lc + max(0.0, work - self.span_idle * t_lc))
        return self._n(t) + self._stall("span", be, start, end)

    def run_concurrent(self, i: int, be: str, start: int, end: int) -> float:
        self.launches.append(("streams", (i, be, start, end)))
        t_lc, t_be = self.lc_ms[i], self.be_time(be, end - start)
        return self._n(t_lc + t_be - self.stream_overlap * min(t_lc, t_be))


def from_items(items: Sequence[Any], be: dict[str, Any], seed: int = 0) -> SimGPU:
    """A simulated GPU for an LC kernel list (``lc.LCItem``) and BE workloads, with roofline-style
    durations: GEMMs at 400 TFLOP/s, other segments 10 us per op, BE blocks from their FLOPs and bytes."""
    from kfuse.colocate.workloads import FP32_PEAK_FLOPS, PEAK_BYTES

    lc_ms, fusible, keys = [], [], []
    for it in items:
        if it.kernel is not None:
            m, n, k = it.kernel.meta["M"], it.kernel.meta["N"], it.kernel.meta["K"]
            lc_ms.append(0.005 + 2.0 * m * n * k / 400e12 * 1e3)
        else:
            lc_ms.append(0.01 * max(1, len(it.ops)))
        fusible.append(it.kernel is not None)
        keys.append(it.key or it.name)
    be_models = {}
    for name, w in be.items():
        k = w.kernel
        per_block = max(k.flops_per_block / FP32_PEAK_FLOPS, k.bytes_per_block / PEAK_BYTES) * 1e3 / 0.7
        be_models[name] = (0.005, per_block, k.n_blocks)
    return SimGPU(lc_ms, fusible, be_models, keys=keys, seed=seed)


def h200_like(
    overlap: float | dict[Any, Any], noise: float = 0.1, seed: int = 3, stall_ms: float = 0.0, lc_overlap_keys: int = 6
) -> SimGPU:
    """ResNet-50 B32 on the H200 as measured: 44 LC kernels, 4.24 ms solo, 28 PTB GEMM/conv kernels over
    ``lc_overlap_keys`` shapes, 16 segments; BE ``sgemm`` (1024 blocks, 0.18 ms) and ``lbm`` (8192
    blocks, 0.34 ms) with a 0.03 ms launch cost; fused launches overlapping by ``overlap`` (per version)."""
    rng = np.random.default_rng(seed)
    lc = list(rng.uniform(0.04, 0.26, 28)) + list(rng.uniform(0.02, 0.12, 16))
    fus = [True] * 28 + [False] * 16
    keys = [f"g{i % lc_overlap_keys}" for i in range(28)] + [f"seg{i}" for i in range(16)]
    order = rng.permutation(44)
    scale = 4.24 / sum(lc)
    law: Any = {v: o if callable(o) else overlap_law(o) for v, o in overlap.items()} if isinstance(overlap, dict) else overlap_law(overlap)
    return SimGPU([lc[j] * scale for j in order], [fus[j] for j in order],
                  {"sgemm": (0.03, 0.15 / 1024, 1024), "lbm": (0.03, 0.31 / 8192, 8192)},
                  fused_law=law, noise=noise, seed=seed, keys=[keys[j] for j in order], stall_ms=stall_ms)  # fmt: skip


# The second H200 re-run (benchmarks/results/h200/predictor.json, logs/s3_colocate_bench_round2.log)
H200_R2_LC = {"401408x64x147": 0.2578, "100352x64x256": 0.0956, "25088x128x512": 0.0848, "6272x256x1024": 0.0826,
              "1568x512x4608": 0.0975, "1568x2048x512": 0.0650}  # fmt: skip
H200_R2_OVERLAP = {  # best measured overlap per LC shape and version ("measured_overlap")
    "401408x64x147": {"tail": -0.063, "1:1": 0.075, "1:2": 0.238}, "100352x64x256": {"tail": 0.298, "1:1": 0.348, "1:2": 0.366},
    "25088x128x512": {"tail": 0.332, "1:1": 0.293, "1:2": 0.299}, "6272x256x1024": {"tail": 0.307, "1:1": 0.331, "1:2": 0.360},
    "1568x512x4608": {"tail": 0.320, "1:1": 0.340, "1:2": 0.355}, "1568x2048x512": {"tail": 0.214, "1:1": 0.272, "1:2": 0.285},
}  # fmt: skip
H200_R2_OVERLAP_LBM = {
    "401408x64x147": {"tail": -0.588, "1:1": -0.041, "1:2": 0.098}, "100352x64x256": {"tail": 0.248, "1:1": 0.214, "1:2": 0.228},
    "25088x128x512": {"tail": 0.326, "1:1": 0.348, "1:2": 0.334}, "6272x256x1024": {"tail": 0.351, "1:1": 0.319, "1:2": 0.380},
    "1568x512x4608": {"tail": 0.341, "1:1": 0.353, "1:2": 0.271}, "1568x2048x512": {"tail": 0.252, "1:1": 0.364, "1:2": 0.179},
}  # fmt: skip
H200_R2_SOLO_MS = 5.259
PTB_GRID = 528  # 4 programs x 132 SMs: the BE kernels' persistent grid


def h200_round2(be: str, noise: float = 0.1, seed: int = 3, overlap_scale: float = 1.0) -> SimGPU:
    """The second H200 re-run as measured: 44 LC kernels, 5.26 ms solo; 28 PTB GEMM/conv kernels over the 6
    profiled shapes at their profiled times, 16 segments with the rest; BE kernels in whole waves of 528 blocks:
    sgemm 1024 blocks, 0.097 ms for one wave and 0.179 ms for two (the overlap records' t_be and the
    classification run); lbm 8192 blocks, 0.345 ms in 16 waves; fused launches overlapping by the best overlap
    measured for that shape and version (x ``overlap_scale``), at every load ratio. Versions: "tail", "1:1", "1:2"."""
    shapes = list(H200_R2_LC)
    keys = [shapes[i % 6] for i in range(28)]
    lc = [H200_R2_LC[k] for k in keys]
    seg = (H200_R2_SOLO_MS - sum(lc)) / 16
    rng = np.random.default_rng(seed)
    order = rng.permutation(44)
    all_lc, all_f, all_k = lc + [seg] * 16, [True] * 28 + [False] * 16, keys + [f"seg{i}" for i in range(16)]
    table = H200_R2_OVERLAP if be == "sgemm" else H200_R2_OVERLAP_LBM
    law: dict[Any, Any] = {(k, v): overlap_law(o * overlap_scale) for k, per_v in table.items() for v, o in per_v.items()}
    bes = {"sgemm": (0.015, 0.082 / PTB_GRID, 1024, PTB_GRID), "lbm": (0.02, 0.0203 / PTB_GRID, 8192, PTB_GRID)}
    return SimGPU([all_lc[j] for j in order], [all_f[j] for j in order], {be: bes[be]}, fused_law=law, noise=noise, seed=seed,
                  keys=[all_k[j] for j in order])  # fmt: skip


# Session 9's H200 run of BERT-base B8 S128 + hotspot (benchmarks/results/h200/predictor.json, "bert-base
# (hotspot run, session 9)"): profiled LC GEMM times (ms) and the measured (x = T_be/T_lc, T_fused/T_lc)
# samples of the tail-fill version, per GEMM shape.
H200_S9_BERT_GEMMS = {"1024x2304x768": 0.0178, "1024x768x768": 0.0102, "1024x3072x768": 0.0183, "1024x768x3072": 0.0264}
H200_S9_BERT_POOLER = ("8x768x768", 0.0096)
H200_S9_BERT_SOLO_MS = 1.101  # sum of the profile's median kernel times (86 kernels: 49 GEMMs, 37 segments)
H200_S9_HOTSPOT_TAIL = {
    "1024x2304x768": [(0.33, 1.03), (0.55, 1.03), (0.75, 1.35), (0.94, 1.79), (1.4, 2.71), (2.1, 3.69), (2.61, 4.5), (3.09, 5.25)],
    "1024x768x768": [(0.44, 1.05), (0.56, 1.05), (0.85, 1.26), (1.04, 1.54), (1.41, 1.92), (1.82, 2.71), (2.31, 3.83), (2.89, 5.04)],
    "1024x3072x768": [(0.32, 1.01), (0.53, 1.35), (0.72, 1.87), (0.93, 2.54), (1.4, 4.24), (2.08, 5.57), (2.61, 6.89), (3.06, 8.15)],
    "1024x768x3072": [(0.28, 1.05), (0.49, 1.05), (0.7, 1.64), (0.92, 1.92), (1.58, 2.75), (2.08, 3.78), (2.55, 4.74), (3.04, 5.73)],
    "8x768x768": [(0.48, 1.03), (0.59, 1.04), (0.77, 1.04), (1.01, 1.44), (1.49, 1.72), (1.84, 2.28), (2.29, 3.09), (2.82, 4.05)],
}  # fmt: skip
H200_S9_HOTSPOT = (0.0031, 8.1e-6, 16400)  # launch cost (ms), ms per block, blocks of one kernel (0.136 ms)


def sample_law(points: Sequence[tuple[float, float]]) -> Callable[[float, float, Any], float]:
    """T_fused / T_lc interpolated in the measured (x, y) samples, anchored at (0, 1), slope 1 past the last."""
    xs, ys = zip(*sorted([(0.0, 1.0), *points]), strict=True)

    def law(t_lc: float, t_be: float, version: Any) -> float:
        x = t_be / t_lc
        y = float(np.interp(x, xs, ys)) if x <= xs[-1] else ys[-1] + (x - xs[-1])
        return t_lc * max(1.0, y)

    return law


def h200_bert_s9(noise: float = 0.05, seed: int = 5) -> SimGPU:
    """BERT-base + hotspot as measured in session 9: 12 layers of QKV, attention-out, FFN-up and FFN-down GEMMs
    (the profiled medians) with the other 37 LC steps as equal segments, the pooler GEMM last; hotspot as its linear
    fit; fused launches ("tail" version) following the measured samples of their shape."""
    return bert_replay(H200_S9_BERT_GEMMS, H200_S9_BERT_POOLER, H200_S9_BERT_SOLO_MS, {"tail": H200_S9_HOTSPOT_TAIL}, noise, seed)


def bert_s9_partitioned(
    fused_law: Callable[[float, float, Any], float] | dict[Any, Callable[[float, float, Any], float]], noise: float,
    span_slowdown: dict[int, float] | None = None, be: tuple[str, tuple[float, float, int]] = ("sgemm", (0.0047, 15.6e-6, 16384)),
) -> SimGPU:  # fmt: skip
    """BERT-base B8 S128 as session 9 profiled it (49 GEMMs, 37 segments, 1.1 ms) beside ``be`` (by default sgemm, with
    its 4.7 us launch cost), for the SM-partition tests: each layer's four GEMMs each followed by an equal segment, then
    the pooler GEMM and 13 more segments; ``span_slowdown`` as ``SimGPU``'s."""
    seg = (H200_S9_BERT_SOLO_MS - 12 * sum(H200_S9_BERT_GEMMS.values()) - H200_S9_BERT_POOLER[1]) / 37
    lc: list[float] = []
    fus: list[bool] = []
    keys: list[str] = []
    for _ in range(12):
        for k, t in H200_S9_BERT_GEMMS.items():
            lc += [t, seg]
            fus += [True, False]
            keys += [k, f"seg{k}"]
    lc += [H200_S9_BERT_POOLER[1]] + [seg] * 13
    fus += [True] + [False] * 13
    keys += [H200_S9_BERT_POOLER[0]] + ["segx"] * 13
    return SimGPU(lc, fus, {be[0]: be[1]}, fused_law=fused_law, keys=keys, noise=noise, span_slowdown=span_slowdown)


def bert_replay(
    gemms: dict[str, float], pooler: tuple[str, float], solo_ms: float,
    samples: dict[str, dict[str, Sequence[tuple[float, float]]]], noise: float = 0.05, seed: int = 5,
    be: tuple[str, tuple[float, float, int]] = ("hotspot", H200_S9_HOTSPOT),
) -> SimGPU:  # fmt: skip
    """BERT-base + a BE kernel on the simulated GPU from measured numbers: ``gemms`` (QKV, attention-out, FFN-up,
    FFN-down: shape key -> solo ms) repeated over 12 layers, the other 37 LC steps as equal segments filling
    ``solo_ms``, the ``pooler`` GEMM last; the BE kernel ``be`` = (name, (launch ms, ms per block, blocks)),
    by default hotspot as session 9's linear fit; fused launches of each version following
    ``samples[version][shape]`` ((x, T_fused / T_lc) points, ``sample_law``)."""
    names = list(gemms)
    lc: list[float] = []
    fus: list[bool] = []
    keys: list[str] = []
    gemm_total = 12 * sum(gemms.values()) + pooler[1]
    seg = (solo_ms - gemm_total) / 37
    for layer in range(12):
        for j, k in enumerate(names):  # QKV, seg (attention), out-proj, seg (norm), FFN-up, FFN-down, seg (norm)
            lc.append(gemms[k])
            fus.append(True)
            keys.append(k)
            if j != 2:
                lc.append(seg)
                fus.append(False)
                keys.append(f"seg{layer}_{j}")
    lc.append(seg)
    fus.append(False)
    keys.append("seg_pool")
    lc.append(pooler[1])
    fus.append(True)
    keys.append(pooler[0])
    law: dict[Any, Any] = {(k, v): sample_law(pts) for v, per_shape in samples.items() for k, pts in per_shape.items()}
    return SimGPU(lc, fus, {be[0]: be[1]}, fused_law=law, noise=noise, seed=seed, keys=keys)
