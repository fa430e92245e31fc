"""Rotary embedding kernel vs the float32 reference: strided head-split views, broadcast cos/sin,
partial rotary (a slice of the head dim), odd row counts and head dims that are not powers of two."""

import pytest
import torch
from cubin_facts import run_offline_script

from kfuse.kernels import rotary as R


def _cos_sin(s: int, d: int, gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # HF's table: per position, the same frequencies on both halves; random angles (never all zero)
    ang = torch.rand(s, d // 2, generator=gen) * 6.0 + 0.1
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b,h,s,d", [(2, 4, 9, 32), (1, 3, 17, 24), (3, 1, 5, 130)])
def test_head_split_view_of_a_projection(dtype, b, h, s, d, device):
    gen = torch.Generator().manual_seed(b * 100 + s)
    proj = torch.randn(b, s, 3 * h * d, generator=gen).to(device, dtype)  # a merged QKV output
    x = proj[..., h * d : 2 * h * d].reshape(b, s, h, d).permute(0, 2, 1, 3)  # the K heads, strided
    cos, sin = (t.to(device)[None, None] for t in _cos_sin(s, d, gen, dtype))  # [1, 1, S, D]
    out = torch.full((b, h, s, d), float("nan"), dtype=dtype, device=device)
    R.rotary(x, cos, sin, out=out)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.float(), R.reference(x, cos, sin), atol=tol, rtol=tol)


def test_partial_rotary_on_a_slice_and_per_batch_tables(device):
    # GPT-NeoX rotates the first quarter of the head dim; cos/sin per batch row (position ids)
    gen = torch.Generator().manual_seed(5)
    b, h, s, d, rot = 2, 2, 7, 64, 16
    q = torch.randn(b, h, s, d, generator=gen).to(device)
    cos, sin = _cos_sin(s * b, rot, gen, torch.float32)
    cos, sin = (t.reshape(b, 1, s, rot).to(device) for t in (cos, sin))
    got = R.rotary(q[..., :rot], cos, sin)
    assert got.is_contiguous() and got.shape == (b, h, s, rot)
    torch.testing.assert_close(got, R.reference(q[..., :rot], cos, sin), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d,rot", [(64, 16), (24, 6), (80, 32), (10, 2)])
def test_partial_rotary_with_the_pass_through_columns(dtype, d, rot, device):
    # cat([rotary(x[..., :rot]), x[..., rot:]], -1) in one kernel (GPT-NeoX, Phi): the copied columns
    # follow the rotated ones in a contiguous output, from a strided head-split view
    gen = torch.Generator().manual_seed(d + rot)
    b, h, s = 2, 3, 11
    proj = torch.randn(b, s, 3 * h * d, generator=gen).to(device, dtype)
    x = proj[..., : h * d].reshape(b, s, h, d).permute(0, 2, 1, 3)
    cos, sin = (t.to(device)[None, None] for t in _cos_sin(s, rot, gen, dtype))
    out = torch.full((b, h, s, d), float("nan"), dtype=dtype, device=device)
    R.rotary(x, cos, sin, out=out, rotary_dims=rot)
    want = torch.cat((R.reference(x[..., :rot], cos, sin), x[..., rot:].float()), -1)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(R.reference(x, cos, sin, rotary_dims=rot), want, atol=tol, rtol=tol)
    assert torch.equal(out[..., rot:], x[..., rot:])  # copied bit for bit
    with pytest.raises(ValueError, match="even number of rotated dims"):
        R.rotary(x, cos, sin, rotary_dims=d + 2)


def test_reference_is_hf_rotate_half():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 8, generator=gen)
    cos, sin = _cos_sin(4, 8, gen, torch.float32)
    x1, x2 = x[..., :4], x[..., 4:]
    hf = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    torch.testing.assert_close(R.reference(x, cos, sin), hf)


def test_clear_errors(device):
    x = torch.randn(2, 3, 5, device=device)
    with pytest.raises(ValueError, match="even number of rotated dims"):
        R.rotary(x, x, x)
    y = torch.randn(2, 3, 4, device=device)
    with pytest.raises(ValueError, match="do not broadcast"):
        R.rotary(y, torch.randn(3, 3, 4, device=device), y)


def test_launch_rules_give_every_sm_two_programs(monkeypatch):
    # the GPU's rules (the interpreter's are fixed): short grids shrink the rows a program, long ones keep
    # 4096 elements a program; warps follow the elements (8 a thread)
    from kfuse.kernels import norm as N

    monkeypatch.setattr(R, "interpreting", lambda: False)
    monkeypatch.setattr(N, "interpreting", lambda: False)
    assert R.launch_config(6144, 16, sms=132) == (16, 1)  # GPT-NeoX's partial rotary: 384 programs, was 96
    assert R.launch_config(1 << 20, 64, sms=132) == (64, 4)  # a long grid keeps the widest tile
    assert N.launch_config(512, 1024, sms=132) == (1, 4)  # OPT-125m's 512 x 768: 512 programs, was 128
    assert N.launch_config(16384, 1024, sms=132) == (4, 4)
    assert N.launch_config(512, 256, sms=132) == (1, 1)
    for m in (1, 7, 300, 5000, 1 << 16):
        for bn in (16, 256, 1024, 4096, 8192):
            rows, warps = N.launch_config(m, bn, sms=132)
            assert rows >= 1 and rows & (rows - 1) == 0 and rows * bn <= max(4096, bn) and 1 <= warps <= 8
            assert rows == 1 or -(-m // rows) >= 2 * 132  # short grids were shrunk


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("d,rot", [(32, 32), (24, 8), (80, 32), (10, 6)])
def test_interleaved_rotary_pairs_neighbouring_columns(dtype, d, rot, device):
    # GPT-J's rotate_every_two on a strided head-split view, with its repeat-interleaved tables (each angle
    # on columns 2i and 2i + 1) and, where rot < d, the pass-through columns copied
    gen = torch.Generator().manual_seed(d * 7 + rot)
    b, h, s = 2, 3, 13
    proj = torch.randn(b, s, 2 * h * d, generator=gen).to(device, dtype)
    x = proj[..., h * d :].reshape(b, s, h, d)  # GPT-J rotates in (B, S, H, D) before the head transpose
    ang = (torch.rand(s, rot // 2, generator=gen) * 6.0 + 0.1).repeat_interleave(2, -1)
    cos, sin = (t.to(device, dtype)[None, :, None, :] for t in (ang.cos(), ang.sin()))  # [1, S, 1, rot]
    out = torch.full((b, s, h, d), float("nan"), dtype=dtype, device=device)
    R.rotary(x, cos, sin, out=out, rotary_dims=rot, interleaved=True)
    xr = x[..., :rot].float()
    hf = xr * cos.float() + torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2) * sin.float()
    want = torch.cat((hf, x[..., rot:].float()), -1)
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(R.reference(x, cos, sin, rotary_dims=rot, interleaved=True), want, atol=tol, rtol=tol)
    half = R.rotary(x, cos, sin, rotary_dims=rot)  # the rotate_half pairing is a different function
    assert not torch.allclose(half.float(), want, atol=1e-2)


@pytest.mark.parametrize("offset", [None, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["plain", "rotate_half", "interleaved", "partial"])
def test_write_rows_is_index_copy_of_the_rotary(variant: str, dtype: torch.dtype, offset: int | None) -> None:
    """A KV cache's update in one pass: the rows at the index get rotary(x) (or x), every other row of the cache
    keeps its value; the cache is a strided slice of a larger buffer, the index is not sorted. With an offset,
    the rows land at index + offset (a one-element tensor: the cache's length)."""
    from kfuse.kernels.rotary import reference, write_rows

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(3)
    b, h, t, d, slots = 2, 3, 4, 16, 11
    x = torch.randn(b, t, h, d, generator=g).to(device, dtype).transpose(1, 2)  # [B, H, T, D] head-split view
    cache = torch.randn(b, h, slots + 2, d, generator=g).to(device, dtype)[:, :, 1 : slots + 1]
    before = cache.clone()
    index = torch.tensor([7, 2, 9, 3], device=device) - (offset or 0)
    off = None if offset is None else torch.tensor([offset], device=device)
    rd = {"partial": 8}.get(variant)
    cos = sin = None
    if variant != "plain":
        angle = torch.randn(1, 1, t, rd or d, generator=g).to(device)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    out = write_rows(x, cache, index, cos, sin, rotary_dims=rd, interleaved=variant == "interleaved", index_offset=off)
    assert out is cache
    index = index + (offset or 0)
    rows = x if cos is None else reference(x, cos, sin, rotary_dims=rd, interleaved=variant == "interleaved").to(dtype)
    want = before.index_copy(2, index, rows)
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(cache, want, rtol=tol, atol=tol)


def test_write_rows_skips_positions_past_the_cache() -> None:
    """A position outside the cache is not written (no stray store past the buffer); the others are."""
    from kfuse.kernels.rotary import write_rows

    device = "cuda" if torch.cuda.is_available() else "cpu"
    backing = torch.randn(1, 2, 12, 8, device=device)
    cache = backing[:, :, 2:8]  # 6 slots inside a larger buffer: a stray store would land in the rest
    before = backing.clone()
    x = torch.randn(1, 2, 3, 8, device=device)
    write_rows(x, cache, torch.tensor([1, 6, -1], device=device))
    want = before.clone()
    want[:, :, 3] = x[:, :, 0]
    torch.testing.assert_close(backing, want)


def test_write_rows_refuses_shapes_it_does_not_take() -> None:
    from kfuse.kernels.rotary import write_rows

    x, cache = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 9, 8)
    with pytest.raises(ValueError, match="int32/int64 positions"):
        write_rows(x, cache, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="are not"):
        write_rows(x, torch.randn(1, 3, 9, 8), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="do not broadcast"):
        write_rows(x, cache, torch.tensor([0, 1, 2]), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="index_offset must be one int32/int64 element"):
        write_rows(x, cache, torch.tensor([0, 1, 2]), index_offset=torch.tensor([1, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["plain", "rotate_half", "interleaved", "partial"])
def test_a_pair_of_writes_in_one_launch_equals_two(variant: str, dtype: torch.dtype) -> None:
    """``write_rows_pair``: the keys (rotated or not) and the values written at the same positions in one launch,
    bit for bit what two ``write_rows`` calls write; caches strided slices of larger buffers, an offset index."""
    from kfuse.kernels.rotary import write_rows, write_rows_pair

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(11)
    b, h, t, d, slots = 1, 3, 2, 16, 9
    k = torch.randn(b, t, h, d, generator=g).to(device, dtype).transpose(1, 2)
    v = torch.randn(b, t, h, d, generator=g).to(device, dtype).transpose(1, 2)
    caches = [torch.randn(b, h, slots + 1, d, generator=g).to(device, dtype)[:, :, 1:] for _ in range(4)]
    caches[2].copy_(caches[0])
    caches[3].copy_(caches[1])
    index, off = torch.tensor([5, 1], device=device), torch.tensor([2], device=device)
    rd = {"partial": 8}.get(variant)
    cos = sin = None
    if variant != "plain":
        angle = torch.randn(1, 1, t, rd or d, generator=g).to(device)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    kw = {"rotary_dims": rd, "interleaved": variant == "interleaved", "index_offset": off}
    write_rows(k, caches[0], index, cos, sin, **kw)
    write_rows(v, caches[1], index, index_offset=off)
    write_rows_pair(k, caches[2], v, caches[3], index, cos, sin, **kw)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert not torch.equal(caches[3][:, :, 3], caches[2][:, :, 3])  # both caches written, and differently
    with pytest.raises(ValueError, match="differ"):
        write_rows_pair(k, caches[2], v[:, :2], caches[3], index)


_SM90_SCRIPT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from cubin_facts import sass_facts
from kfuse.kernels import rotary

k = rotary._rotary_fwd
names = k.arg_names
sig = {n: "i32" for n in names}
sig.update({"X": "*fp16", "C": "*fp16", "S": "*fp16", "Out": "*fp16", "OutIdx": "*i64", "IdxOffset": "*i64"})
out = {}
for out_index, rotate in ((False, True), (True, True), (True, False)):
    const = dict(BLOCK_R=4, BLOCK_H=32, BLOCK_P=0, INTERLEAVED=False, OUT_INDEX=out_index, INDEX_OFFSET=out_index, ROTATE=rotate,
                 PDL=True)
    s = {n: ("constexpr" if n in const else sig[n]) for n in names}
    src = ASTSource(k, s, {(names.index(n),): v for n, v in const.items()})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    out[f"{out_index}_{rotate}"] = sass_facts(ck.asm["cubin"])
k = rotary._write_pair_fwd  # a layer's key and value writes in one launch
names = k.arg_names
sig = {n: "i32" for n in names}
sig.update({n: "*fp16" for n in ("X", "C", "S", "Out", "X2", "Out2")})
sig.update({"OutIdx": "*i64", "IdxOffset": "*i64"})
const = dict(BLOCK_R=4, BLOCK_H=32, BLOCK_P=0, INTERLEAVED=False, INDEX_OFFSET=True, ROTATE=True, PDL=True)
s = {n: ("constexpr" if n in const else sig[n]) for n in names}
src = ASTSource(k, s, {(names.index(n),): v for n, v in const.items()})
ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
out["pair"] = sass_facts(ck.asm["cubin"])
print(json.dumps(out))
"""


def test_sm90_cache_write_variants_compile_without_spills() -> None:
    """The rotary kernel's cache-write forms (rows at an index; without rotation; a key and value pair in one
    launch) compile for sm_90 offline."""
    got = run_offline_script(_SM90_SCRIPT, None, timeout=600)
    assert set(got) == {"False_True", "True_True", "True_False", "pair"}
    for name, facts in got.items():
        assert facts["STL"] == 0 and facts["LDL"] == 0, (name, facts)
