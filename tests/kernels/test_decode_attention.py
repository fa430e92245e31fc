"""Split-KV decode attention vs the float32 reference: grouped-query heads packed into one tile, several
query rows, odd cache lengths, chunk counts that leave a short last chunk, masks of every broadcast, strided
caches (a static cache's slices) and a strided output."""

from __future__ import annotations

import pytest
import torch
from cubin_facts import run_offline_script

from kfuse.kernels import decode_attention as DA

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-4, torch.float16: 2e-2}


def _qkv(b: int, h: int, hk: int, sq: int, sk: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g).to(DEVICE, dtype)
    # a static cache with room to spare, read through a slice: [B, Hk, cap, D] and its first sk slots
    cap = sk + 5
    k = torch.randn(b, hk, cap, d, generator=g).to(DEVICE, dtype)[:, :, :sk]
    v = torch.randn(b, hk, cap, d, generator=g).to(DEVICE, dtype)[:, :, :sk]
    return q, k, v


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "b,h,hk,sq,sk,d,splits",
    [
        (1, 8, 2, 1, 77, 16, None),  # GQA 4, one token, the default chunking
        (2, 4, 4, 1, 130, 32, 3),  # MHA, a short last chunk
        (1, 6, 2, 3, 45, 24, 2),  # three query rows per head (speculative tokens), head dim not a power of two
        (3, 2, 1, 1, 5, 16, 4),  # fewer keys than a tile; more chunks asked than there are keys per tile
        (2, 8, 2, 2, 70, 24, 1),  # one chunk: the program writes the output, no combine
        (1, 32, 1, 2, 50, 16, 3),  # 64 rows a program: "last" takes the combine launch (LAST_MAX_ROWS)
    ],
)
@pytest.mark.parametrize("combine", ["launch", "last"])
def test_matches_reference_without_mask(b, h, hk, sq, sk, d, splits, dtype, combine) -> None:
    q, k, v = _qkv(b, h, hk, sq, sk, d, dtype)
    out = torch.full((b, h, sq, d), float("nan"), dtype=dtype, device=DEVICE)  # poisoned
    DA.decode_attention(q, k, v, out=out, splits=splits, block_n=16, combine=combine, owner=7)
    _close(out, DA.reference(q, k, v), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", ["b1qk", "bhqk", "11qk"])
@pytest.mark.parametrize("combine", ["launch", "last"])
def test_bool_mask_of_a_static_cache(shape, dtype, combine) -> None:
    """Hugging Face's static-cache mask: the slots past the current position are masked."""
    b, h, hk, sq, sk, d = 2, 4, 2, 1, 50, 16
    q, k, v = _qkv(b, h, hk, sq, sk, d, dtype, seed=1)
    filled = torch.tensor([31, 12])
    mask = torch.arange(sk)[None, :] < filled[:, None]  # [B, Sk]
    mask = {"b1qk": mask[:, None, None, :], "bhqk": mask[:, None, None, :].expand(b, h, sq, sk).clone(), "11qk": mask[:1, None, None, :]}[
        shape
    ].to(DEVICE)
    got = DA.decode_attention(q, k, v, mask=mask, splits=3, block_n=16, combine=combine)
    _close(got, DA.reference(q, k, v, mask), dtype)


def test_additive_mask_and_scale() -> None:
    b, h, hk, sq, sk, d = 1, 4, 1, 2, 40, 16
    q, k, v = _qkv(b, h, hk, sq, sk, d, torch.float32, seed=2)
    add = torch.randn(1, h, sq, sk).to(DEVICE)
    add[..., 30:] = float("-inf")
    got = DA.decode_attention(q, k, v, mask=add, scale=0.3, splits=4, block_n=16)
    _close(got, DA.reference(q, k, v, add, scale=0.3), torch.float32)


@pytest.mark.parametrize("splits,combine", [(3, "launch"), (3, "last"), (1, "launch")])
def test_rows_with_every_key_masked_are_zero(splits: int, combine: str) -> None:
    b, h, hk, sq, sk, d = 2, 2, 1, 1, 33, 16
    q, k, v = _qkv(b, h, hk, sq, sk, d, torch.float32, seed=3)
    mask = torch.ones(b, 1, 1, sk, dtype=torch.bool)
    mask[1] = False  # the second sequence attends to nothing
    mask[0, ..., :12] = False  # the first one's first chunk too: a chunk with no key merges as nothing
    got = DA.decode_attention(q, k, v, mask=mask.to(DEVICE), splits=splits, block_n=16, combine=combine)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    _close(got[:1], DA.reference(q[:1], k[:1], v[:1], mask[:1].to(DEVICE)), torch.float32)


@pytest.mark.parametrize("splits,combine", [(2, "launch"), (2, "last"), (1, "launch")])
def test_strided_output_merges_heads(splits: int, combine: str) -> None:
    """The attention's output written as [B, Sq, H*D] through strides, as the lowering asks."""
    b, h, hk, sq, sk, d = 2, 4, 2, 1, 21, 16
    q, k, v = _qkv(b, h, hk, sq, sk, d, torch.float32, seed=4)
    merged = torch.full((b, sq, h * d), float("nan"), device=DEVICE)
    DA.decode_attention(q, k, v, out=merged.view(b, sq, h, d).permute(0, 2, 1, 3), splits=splits, block_n=16, combine=combine)
    _close(merged.view(b, sq, h, d).permute(0, 2, 1, 3), DA.reference(q, k, v), torch.float32)


def test_applies_and_refuses() -> None:
    assert DA.applies((1, 32, 1, 64), (1, 4, 1024, 64), causal=False)
    assert not DA.applies((1, 32, 1, 64), (1, 4, 1024, 64), causal=True)
    assert not DA.applies((1, 32, 128, 64), (1, 4, 1024, 64), causal=False)  # 8 x 128 rows: a prefill
    assert not DA.applies((1, 6, 1, 64), (1, 4, 10, 64), causal=False)  # heads not a multiple
    q, k, v = _qkv(1, 4, 2, 1, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="does not broadcast"):
        DA.decode_attention(q, k, v, mask=torch.ones(3, 1, 1, 8, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="not a decode problem"):
        DA.decode_attention(q, k, v[:, :1])


def test_default_splits_fill_the_gpu() -> None:
    assert DA.default_splits(4, 1024, 64, 132) == 16  # TinyLlama B1, 1,024 slots: one key tile a chunk, 64 programs
    assert DA.default_splits(4, 8192, 64, 132) == 64  # a long cache: about two programs an SM
    assert DA.default_splits(256, 1024, 64, 132) == 2  # a large batch fills the GPU by itself
    assert DA.default_splits(1, 10, 64, 132) == 1


_SM90_SCRIPT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from cubin_facts import sass_facts
from kfuse.kernels import decode_attention as DA

out = {}
split = DA._decode_split
names = split.arg_names
sig = {n: "i32" for n in names}
sig.update({n: "*fp16" for n in ("q_ptr", "k_ptr", "v_ptr")})
sig.update({"mask_ptr": "*u8", "acc_ptr": "*fp32", "ml_ptr": "*fp32", "qk_scale": "fp32", "cos_ptr": "*fp16", "sin_ptr": "*fp16",
            "o_ptr": "*fp16", "count_ptr": "*i32"})
for rows, kind, rot, single, last in ((16, 1, 1, False, False), (64, 0, 0, False, False), (16, 1, 2, True, False), (16, 1, 1, False, True),
                                      (32, 0, 0, False, True)):
    const = dict(BLOCK_R=rows, BLOCK_N=64, BLOCK_D=64, MASK_KIND=kind, PRECISION="tf32", ROTARY=rot, SINGLE=single,
                 LAST_COMBINES=last, PDL=True)
    s = {n: ("constexpr" if n in const else sig[n]) for n in names}
    src = ASTSource(split, s, {(names.index(k),): v for k, v in const.items()})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    facts = sass_facts(ck.asm["cubin"])
    facts["atom_acq_rel"] = ck.asm["ptx"].count("acq_rel.add")
    facts["ld_cg"] = ck.asm["ptx"].count("ld.global.cg")
    out[f"split_{rows}_{kind}" + (f"_rot{rot}" if rot else "") + ("_last" if last else "")] = facts
comb = DA._decode_combine
names = comb.arg_names
const = dict(BLOCK_S=16, BLOCK_D=64, PDL=True)
sig = {n: "i32" for n in names}
sig.update({"acc_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": "*fp16"})
s = {n: ("constexpr" if n in const else sig[n]) for n in names}
src = ASTSource(comb, s, {(names.index(k),): v for k, v in const.items()})
ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
out["combine"] = sass_facts(ck.asm["cubin"])
print(json.dumps(out))
"""


def test_sm90_compiles_without_spills() -> None:
    """Both kernels compile for sm_90 (offline, the triton wheel's ptxas): the split kernel's products on the
    tensor cores, no local memory, at the smallest and the largest row tile."""
    got = run_offline_script(_SM90_SCRIPT, None, timeout=600)
    for name, facts in got.items():
        assert facts["STL"] == 0 and facts["LDL"] == 0 and facts["LOCAL"] == 0, (name, facts)
    for name in ("split_16_1_rot1", "split_64_0", "split_16_1_rot2", "split_16_1_rot1_last", "split_32_0_last"):
        assert got[name]["REG"] <= 255, got[name]
    for name in ("split_16_1_rot1_last", "split_32_0_last"):  # the count and the L2 reads of the merge
        assert got[name]["atom_acq_rel"] >= 1 and got[name]["ld_cg"] >= 1, (name, got[name])
    assert got["split_64_0"]["atom_acq_rel"] == 0


@pytest.mark.parametrize("splits,combine", [(None, "launch"), (None, "last"), (1, "launch")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("pairing,rotary_dims", [("rotate_half", None), ("interleaved", None), ("rotate_half", 8), ("interleaved", 6)])
def test_the_querys_rotary_applied_as_it_is_read(
    pairing: str, rotary_dims: int | None, dtype: torch.dtype, splits: int | None, combine: str
) -> None:
    """``cos`` / ``sin`` fold the query's rotary embedding into the kernel: the same result as the rotary kernel's
    output attended (HF's ``[B, Sq, rd]`` cos unsqueezed at the heads, a bool mask, GQA, two query rows, odd dims)."""
    from kfuse.kernels.rotary import reference as rotary_reference

    b, h, hk, sq, sk, d = 2, 6, 2, 2, 37, 24
    q, k, v = _qkv(b, h, hk, sq, sk, d, dtype, seed=5)
    g = torch.Generator().manual_seed(6)
    angle = torch.randn(b, 1, sq, rotary_dims or d, generator=g)
    cos, sin = angle.cos().to(DEVICE, dtype), angle.sin().to(DEVICE, dtype)
    mask = (torch.rand(b, 1, sq, sk, generator=g) > 0.2).to(DEVICE)
    out = torch.full((b, h, sq, d), float("nan"), dtype=dtype, device=DEVICE)
    DA.decode_attention(q, k, v, mask=mask, out=out, block_n=16, cos=cos, sin=sin, rotary_dims=rotary_dims,
                        interleaved=pairing == "interleaved", splits=splits, combine=combine)  # fmt: skip
    rq = rotary_reference(q, cos, sin, rotary_dims=rotary_dims, interleaved=pairing == "interleaved").to(dtype)
    _close(out, DA.reference(rq, k, v, mask), dtype)
    plain = DA.decode_attention(q, k, v, mask=mask, block_n=16)
    assert (plain.float() - out.float()).abs().max() > 10 * TOL[dtype]  # the rotation changed the result


def test_rotary_arguments_it_refuses() -> None:
    q, k, v = _qkv(1, 4, 2, 1, 20, 16, torch.float32)
    cos = torch.ones(1, 1, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="even number of rotated dims"):
        DA.decode_attention(q, k, v, cos=cos, sin=cos, rotary_dims=5)
    with pytest.raises(ValueError, match="do not broadcast"):
        DA.decode_attention(q, k, v, cos=torch.ones(1, 1, 3, 16, device=DEVICE), sin=cos)


def test_the_last_program_leaves_its_counters_at_zero_for_the_next_call() -> None:
    """``combine="last"`` keeps its partials and counters per owner and shape: after a call every counter is back at
    zero, and a second call on new inputs (the buffers reused, as a CUDA graph's replay reuses them) is right too."""
    b, h, hk, sq, sk, d = 2, 8, 2, 1, 90, 16
    for seed in (11, 12):
        q, k, v = _qkv(b, h, hk, sq, sk, d, torch.float32, seed=seed)
        out = torch.full((b, h, sq, d), float("nan"), device=DEVICE)
        DA.decode_attention(q, k, v, out=out, splits=4, block_n=16, combine="last", owner=99)
        _close(out, DA.reference(q, k, v), torch.float32)
    counters = [bufs[2] for key, bufs in DA._BUFFERS._bufs.items() if key[1] == 99]
    assert len(counters) == 1 and counters[0].numel() == b * hk and int(counters[0].abs().sum()) == 0
    with pytest.raises(ValueError, match="combine must be"):
        DA.decode_attention(q, k, v, combine="tree")
