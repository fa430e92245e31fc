"""Persistent b2b grids sized by what fits an SM: the launcher caps ``programs_per_sm`` at the
programs its compiled kernel can hold at once, and the candidates that ask for three per SM fit three
(offline sm_90 compiles, as the JIT specialises them)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from cubin_facts import sass_facts
from test_b2b import _epi

from kfuse.kernels import b2b
from kfuse.kernels.b2b import launcher
from kfuse.tune.hardware import TABLE, programs_per_sm


def test_programs_per_sm_is_the_tightest_of_registers_shared_memory_and_warps() -> None:
    assert programs_per_sm(134, 57360, 4) == 3  # registers: 136 x 128 x 3 = 52224 <= 65536 < 4 x 17408
    assert programs_per_sm(254, 114960, 4) == 2  # both bind at 2
    assert programs_per_sm(134, 81936, 8) == 1  # 8 warps x 136 registers: one program
    assert programs_per_sm(78, 36888, 4) == 6  # shared memory: 232448 // 36888
    assert programs_per_sm(32, 1024, 4) == 16  # warps: 2048 threads / 128
    assert programs_per_sm(195, 262424, 4) == 0  # more shared memory than a block may have
    assert programs_per_sm(32, 100_000, 4) == 2 and programs_per_sm(32, 100_000, 4, TABLE["A100"]) == 1  # per-GPU shared memory


class _Compiled:
    def __init__(self, regs: int, shared: int) -> None:
        self.n_regs, self.metadata, self.loaded = 0, SimpleNamespace(shared=shared), False
        self._regs = regs

    def _init_handles(self) -> None:  # as Triton's: registers are known once the binary is loaded
        self.n_regs, self.loaded = self._regs, True


class _Kernel:
    def __init__(self, regs: int, shared: int, fail: bool = False) -> None:
        self.regs, self.shared, self.fail, self.compiles = regs, shared, fail, 0

    def warmup(self, *args: Any, grid: tuple[int, ...], **kw: Any) -> _Compiled:
        self.compiles += 1
        if self.fail:
            raise RuntimeError("out of resources")
        return _Compiled(self.regs, self.shared)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    launcher._FIT.clear()


def test_programs_that_fit_reads_the_compiled_kernel_once() -> None:
    k = _Kernel(134, 57360)
    kw = {"num_warps": 4, "NUM_PROGRAMS": 528, "BLOCK_M": 64, "launch_pdl": True, "w1b_desc": object()}
    assert launcher.programs_that_fit(k, (), (528,), kw, torch.float16) == 3
    # the same variant with another grid size: cached, no second compile
    assert launcher.programs_that_fit(k, (), (396,), {**kw, "NUM_PROGRAMS": 396}, torch.float16) == 3 and k.compiles == 1
    # another variant (a constexpr differs) is compiled and read on its own
    assert launcher.programs_that_fit(_Kernel(254, 114960), (), (528,), {**kw, "BLOCK_M": 128}, torch.float16) == 2


def test_a_kernel_that_cannot_be_read_is_not_capped() -> None:
    k = _Kernel(0, 0, fail=True)
    assert launcher.programs_that_fit(k, (), (264,), {"num_warps": 4, "NUM_PROGRAMS": 264}, torch.float16) == 0
    assert launcher.programs_that_fit(k, (), (264,), {"num_warps": 4, "NUM_PROGRAMS": 264}, torch.float16) == 0 and k.compiles == 1


def test_three_per_sm_candidates_of_a_64_128_64_chain_fit_three() -> None:
    """The preloaded 64-row TMA tilings: 134 registers and 57-66 KB, three programs per SM. Without
    preload the pipeliner buffers both weights num_stages deep in the tile loop (131+ KB)."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("bias_relu"), torch.float16)))
    cands = [c for c in b2b.candidate_configs(262144, [128, 64], k0=64) if c.persistent and c.tma and c.programs_per_sm == 3]
    assert len(cands) == 2 and all(c.preload and c.block_m == 64 for c in cands)
    for cfg in cands:
        asm = b2b.compile_asm(cfg=cfg, chain=chain, widths=[128, 64], dtype=torch.float16, arch=90, kernel_hw=(1, 1), widths_k0=64,
                              jit_like=True, rowbcast=True)  # fmt: skip
        sass = sass_facts(asm["cubin"])
        assert sass["STL"] == 0, sass
        assert programs_per_sm(sass["REG"], asm["shared"], cfg.num_warps) >= 3, (cfg.describe(), sass["REG"], asm["shared"])


def test_a_capped_grid_still_covers_every_tile_and_says_so(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """The launcher's cap, in the interpreter or on a GPU: a persistent TMA config asking for 3
    programs per "SM" whose kernel fits 1 runs with 1 x SMs programs (each looping over more row
    tiles), gives the reference result on a NaN-poisoned output, and the decision's report names
    what it ran with."""
    from test_b2b import _extras, _ref

    monkeypatch.setattr(launcher, "interpreting", lambda: False)  # on the CPU the kernels still run in the interpreter
    monkeypatch.setattr(launcher, "programs_that_fit", lambda *a, **k: 1)
    # 2 "SMs" on either device (the interpreter's count): 13 row tiles are past the 2 x 1 programs
    # that fit, while a GPU's real count (132 x 3) would cover them all and nothing would be capped
    monkeypatch.setattr(launcher, "_num_sms", lambda dev: 2)
    grids: list[int] = []
    real_tma = launcher._tma_descriptors
    monkeypatch.setattr(launcher, "_tma_descriptors", lambda *a: grids.append(1) or real_tma(*a))
    launcher.CAPPED.clear()
    torch.manual_seed(3)
    m, k0 = 203, 32
    cfg = b2b.B2BConfig(16, 32, 64, 4, 3, "register", True, tma=True, programs_per_sm=3)
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float32), b2b.Stage(_epi("residual_sigmoid"), torch.float32)))
    x = torch.randn(m, k0, device=device)
    ws = [torch.randn(k0, 48, device=device) / k0**0.5, torch.randn(48, 40, device=device) / 48**0.5]
    extras = [_extras("bias_relu", (m,), 48, torch.float32, device), _extras("residual_sigmoid", (m,), 40, torch.float32, device)]
    out = torch.full((m, 40), float("nan"), device=device)
    got = b2b.b2b_chain(chain, x, ws, [None, None], extras, cfg, out=out)
    assert grids, "the TMA kernel was not used"
    torch.testing.assert_close(got.cpu(), _ref(chain, x, ws, [None, None], extras), rtol=1e-4, atol=1e-4)
    assert launcher.CAPPED == {cfg: 1} and launcher.capped_note(cfg) == " (ran x1)"
    assert launcher.capped_note(b2b.B2BConfig()) == ""
    launcher.CAPPED.clear()
