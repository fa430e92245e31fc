"""A fused launch computes exactly what the LC and BE kernels compute on their own, for every ratio."""

import pytest
import torch

from kfuse.colocate import fuser, ptb, workloads
from kfuse.colocate.fuser import FusedVersion
from kfuse.kernels.codegen import interpreting

VERSIONS = [*fuser.DEFAULT_VERSIONS, FusedVersion(2, 1, "interleave"), FusedVersion(1, 2, "interleave")]
VERSIONS += [fuser.TAIL, FusedVersion(4, 0, "tail"), fuser.TAILX, FusedVersion(4, 0, "tailx"), fuser.TAILSM]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's 16 x 16 LC tile on the GPU too: the GPU's 128 x 128 tile would make every LC GEMM here one
# block, and the tests below need fewer, as many and more LC blocks than programs
LC_TILE = ptb.default_ptb_config(torch.float16, gpu=False)


def _lc(m: int = 40, n: int = 33) -> tuple[ptb.BlockKernel, torch.Tensor]:
    """An m x 24 @ 24 x n LC GEMM (16 x 16 tiles) and its output, holding the original kernel's result."""
    a, b = torch.randn(m, 24, device=DEVICE).half(), torch.randn(24, n, device=DEVICE).half()
    c = torch.full((m, n), float("nan"), dtype=torch.float16, device=DEVICE)
    k = ptb.gemm_kernel(a, b, c, LC_TILE)
    ptb.launch_original(k)
    return k, c


def _be(name: str) -> tuple[workloads.Workload, torch.Tensor]:
    """A small BE workload and the output of its original kernel."""
    w = workloads.make(name, small=True, device=DEVICE)
    w.reset()
    ptb.launch_original(w.kernel)
    return w, w.output().clone()


def _fused_rest(lc: ptb.BlockKernel, c: torch.Tensor, w: workloads.Workload, version: FusedVersion, be_first: int, sms: int,
                trace: torch.Tensor | None = None) -> None:  # fmt: skip
    """Poison both outputs, run BE blocks [0, be_first) on their own, then one fused launch of all LC blocks
    and the rest of the BE blocks."""
    c.fill_(float("nan"))
    w.reset()
    if be_first:
        ptb.launch_ptb(w.kernel, 0, be_first, grid=2)
    fuser.launch_fused(lc, w.kernel, version, be_range=(be_first, w.kernel.n_blocks), sms=sms, trace=trace)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.describe())
@pytest.mark.parametrize("be", ["sgemm", "lbm", "histogram"])
def test_fused_equals_separate(be: str, version: FusedVersion) -> None:
    lc, c = _lc()
    expect_lc = c.clone()
    w, expect_be = _be(be)
    c.fill_(float("nan"))
    w.reset()
    fuser.launch_fused(lc, w.kernel, version, sms=2)
    assert torch.equal(c, expect_lc)
    assert torch.equal(w.output(), expect_be)


@pytest.mark.parametrize("be", ["stencil7", "mriq", "cutcp", "hotspot", "pathfinder"])
def test_fused_every_workload_with_split(be: str) -> None:
    lc, c = _lc()
    expect_lc = c.clone()
    w, expect_be = _be(be)
    c.fill_(float("nan"))
    w.reset()
    half = max(1, w.kernel.n_blocks // 2)  # the GPU's block sizes leave hotspot and pathfinder one block
    # first half of the BE kernel fused with the LC kernel, the rest alone (kernel split)
    fuser.launch_fused(lc, w.kernel, FusedVersion(1, 2), be_range=(0, half), sms=2)
    ptb.launch_ptb(w.kernel, half, w.kernel.n_blocks, grid=2)
    assert torch.equal(c, expect_lc)
    assert torch.equal(w.output(), expect_be)
    # the same split with tail fill, the BE range starting off a multiple of 16 (not specialised)
    c.fill_(float("nan"))
    w.reset()
    ptb.launch_ptb(w.kernel, 0, 1, grid=2)
    fuser.launch_fused(lc, w.kernel, fuser.TAIL, be_range=(1, half), sms=3)
    ptb.launch_ptb(w.kernel, half, w.kernel.n_blocks, grid=2)
    assert torch.equal(c, expect_lc)
    assert torch.equal(w.output(), expect_be)


@pytest.mark.parametrize("sms", [2, 3, 5, 9])
@pytest.mark.parametrize("m", [8, 40, 80])
def test_tailx_every_block_once_for_any_lc_size(m: int, sms: int) -> None:
    """tailx leaves the partners of LC programs idle only when the LC has fewer blocks than half the
    grid; whichever case, every LC and BE block is computed (fewer, equal and more LC blocks than SMs)."""
    lc, c = _lc(m, 70)
    expect_lc = c.clone()
    w, expect_be = _be("stencil7")
    _fused_rest(lc, c, w, fuser.TAILX, 3, sms)
    assert torch.equal(c, expect_lc)
    assert torch.equal(w.output(), expect_be)


@pytest.mark.parametrize("sms", [2, 3, 9])
@pytest.mark.parametrize("m", [8, 40, 80])
def test_tailsm_every_block_once_and_counters_reset(m: int, sms: int) -> None:
    """tailsm keeps the LC's static blocks and hands out BE blocks by ticket: every block runs once for fewer,
    equal and more LC blocks than programs (with and without the LC programs joining the BE work), and the
    kernel leaves the counters and the per-SM flags zeroed, so the next launch starts from zero."""
    lc, c = _lc(m, 70)
    expect_lc = c.clone()
    w, expect_be = _be("stencil7")  # 10 blocks at the GPU's block size (30 in the interpreter); hotspot has one there
    for _ in range(2):  # a second launch on the same counters
        _fused_rest(lc, c, w, fuser.TAILSM, 5, sms)
        assert torch.equal(c, expect_lc)
        assert torch.equal(w.output(), expect_be)
        assert int(fuser.ticket_counters(lc.args).abs().sum()) == 0


def test_tailsm_plan_keeps_the_solo_assignment_and_short_slices_unchunked() -> None:
    """48 LC tiles on a 264-program grid: programs 0..47 run them and exit; a 180-block slice runs one block a
    ticket over the 216 free programs, a 20000-block slice four; with 144 or more tiles (over half the grid)
    the LC programs join the BE work."""
    assert fuser.tailsm_plan(48, 180, 264) == (48, False, 1)
    assert fuser.tailsm_plan(48, 20000, 264) == (48, False, 4)
    assert fuser.tailsm_plan(48, 2 * 4 * 216, 264) == (48, False, 2)
    assert fuser.tailsm_plan(144, 3000, 264) == (144, True, 2)  # every program joins: 3000 // (4 * 264)
    assert fuser.tailsm_plan(132, 3000, 264) == (132, False, 4)  # exactly half: 132 free programs suffice
    assert fuser.tailsm_plan(300, 3, 264) == (264, True, 1)  # more LC blocks than programs: all loop, then join
    assert fuser.tailsm_plan(0, 0, 264) == (0, False, 1)
    with pytest.raises(ValueError, match="grid >= 1"):
        fuser.tailsm_plan(48, 10, 0)


@pytest.mark.parametrize("m", [8, 80])
def test_tailsm_trace_records_the_sm_of_every_lc_block(m: int) -> None:
    """The placement trace gets one valid SM per LC block, and tracing changes no output."""
    sms = 3
    lc, c = _lc(m, 70)
    expect_lc = c.clone()
    w, expect_be = _be("hotspot")
    trace = torch.full((lc.n_blocks + 2,), -1, dtype=torch.int32, device=DEVICE)
    _fused_rest(lc, c, w, fuser.TAILSM, 0, sms, trace)
    assert torch.equal(c, expect_lc) and torch.equal(w.output(), expect_be)
    got = trace[: lc.n_blocks]
    # the interpreter plays `sms` SMs (programs p and p + grid / 2 on one); a GPU records its own %smid
    n_sm = sms if interpreting() else ptb.num_sms()
    assert bool(((got >= 0) & (got < n_sm)).all()), got
    assert trace[lc.n_blocks :].tolist() == [-1, -1]  # nothing written past the range
    with pytest.raises(ValueError, match="slots"):
        fuser.launch_fused(lc, w.kernel, fuser.TAILSM, sms=sms, trace=trace[: lc.n_blocks - 1])
    with pytest.raises(ValueError, match="needs the tailsm version"):
        fuser.launch_fused(lc, w.kernel, fuser.TAIL, sms=sms, trace=trace)


def test_overlap_and_checks() -> None:
    assert fuser.overlap(1.0, 1.0, 2.0) == 0.0
    assert fuser.overlap(1.0, 1.0, 1.0) == 0.5
    lc, _ = _lc()
    w = workloads.make("sgemm", small=True, device=DEVICE)
    with pytest.raises(ValueError, match="outside"):
        fuser.launch_fused(lc, w.kernel, be_range=(0, w.kernel.n_blocks + 5), sms=2)
    with pytest.raises(ValueError, match="unknown fusion mode"):
        fuser.launch_fused(lc, w.kernel, FusedVersion(1, 1, "zigzag"), sms=2)
    assert fuser.parse_version("tail") == fuser.TAIL and fuser.parse_version("1:2") == FusedVersion(1, 2)
    assert fuser.parse_version("2:1il") == FusedVersion(2, 1, "interleave")
    assert fuser.parse_version("1:2il").describe() == "1:2il" and fuser.TAIL.describe() == "tail"
    assert fuser.parse_version("tailx") == fuser.TAILX and fuser.TAILX.describe() == "tailx"
    assert fuser.parse_version("tailsm") == fuser.TAILSM and fuser.TAILSM.describe() == "tailsm"
    assert fuser.fits({"n_regs": 128, "shared": 32768, "n_spills": 0}, FusedVersion(1, 1), 8)
    assert not fuser.fits({"n_regs": 255, "shared": 32768, "n_spills": 0}, FusedVersion(2, 2), 8)
