"""The fused transformer ops (``fused_attention``, ``varlen_attention``, ``fused_norm``, ``rotary``):
their PyTorch references (the oracle and the ``torch`` backend) and their lowerings to the Triton
templates in ``kfuse.kernels.attention`` / ``kfuse.kernels.norm`` / ``kfuse.kernels.rotary``.

Imported by the passes that create these ops, so registration happens before lowering.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.ir import ops
from kfuse.ir.graph import Graph, Node, TensorType, ValueType
from kfuse.runtime.choice import choose, example_inputs, library_mode, problem_key
from kfuse.runtime.executor import KernelInfo, Step, lowering
from kfuse.runtime.plan_alternatives import offer, runners_up


def _out_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    return a["out_type"]


# ---------------------------------------------------------------------------------------
# fused_attention: q, k, v (, mask)
#   layout "bshd": q/k/v are [B, S, H*D] (projection outputs, read in place)
#   layout "bhsd": q/k/v are [B, H, S, D]
#   out_layout (default: layout) "bshd": output [B, Sq, H*D]; "bhsd": output [B, H, Sq, D]; "sbhd": output
#   [Sq, B, H*D] (nn.MultiheadAttention's sequence-first heads merged back)
#   kv_group G (default 1): k/v have H / G heads, query head h reads kv head h // G (GQA)
#   mask_kind "none" | "padding" (mask is the [B, Sk] input, nonzero = attend) | "dense"
#   (bool: True = attend; float: added to the scores), plus ``causal``
# ---------------------------------------------------------------------------------------
def to_bhsd(x: torch.Tensor, a: Mapping[str, Any], kv: bool = False) -> torch.Tensor:
    """q (or, with ``kv``, k or v) as a [B, H, S, D] view."""
    if a["layout"] == "bhsd":
        return x
    b, s = x.shape[0], x.shape[1]
    heads = a["heads"] // a.get("kv_group", 1) if kv else a["heads"]
    try:
        x4 = x.view(b, s, heads, a["head_dim"])
    except RuntimeError:  # not viewable (a copy in an odd layout): make it so
        x4 = x.reshape(b, s, heads, a["head_dim"])
    return x4.permute(0, 2, 1, 3)


def _qkv(xs: list[torch.Tensor], a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return to_bhsd(xs[0], a), to_bhsd(xs[1], a, kv=True), to_bhsd(xs[2], a, kv=True)


def out_layout(a: Mapping[str, Any]) -> str:
    return a.get("out_layout", a["layout"])


def _sdpa_mask(mask: torch.Tensor | None, a: Mapping[str, Any], sq: int, sk: int, device: torch.device) -> tuple[Any, bool]:
    kind, causal = a["mask_kind"], a.get("causal", False)
    if mask is None or kind == "none":
        return None, causal
    m = (mask != 0)[:, None, None, :] if kind == "padding" else mask
    if causal:
        tril = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
        m = (m & tril) if m.dtype == torch.bool else m.masked_fill(~tril, float("-inf"))
    return m, False


def _attention_mask(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor | None:
    """The one mask SDPA takes: the sum of the two additive masks where the kernel reads two (``mask2``)."""
    if a.get("mask2"):
        return xs[3].float() + xs[4].float()
    return xs[3] if len(xs) > 3 else None


def _split_query_rotary(xs: list[torch.Tensor], a: Mapping[str, Any]) -> tuple[list[torch.Tensor], Any, Any]:
    """(the attention's own inputs, cos, sin): where the node folded its query's rotary embedding in (``q_rotary``,
    ``kfuse.passes.fuse_query_rotary``) cos and sin are its last two inputs; else (xs, None, None)."""
    return (xs[:-2], xs[-2], xs[-1]) if a.get("q_rotary") else (xs, None, None)


def _query_rotated(xs: list[torch.Tensor], a: Mapping[str, Any], kernel: bool = False) -> list[torch.Tensor]:
    """The inputs with the query rotated where the node folded its rotary embedding in, by PyTorch's ops or
    (``kernel``) the rotary kernel, for the candidates that take the query as it is."""
    rot = a.get("q_rotary")
    if not rot:
        return xs
    xs, cos, sin = _split_query_rotary(xs, a)
    if kernel:
        from kfuse.kernels.rotary import rotary

        q = rotary(xs[0], cos, sin, dtype=xs[0].dtype, rotary_dims=rot.get("rotary_dims"), interleaved=rot["interleaved"])
    else:
        q = _rotary_ref([xs[0], cos, sin], rot).to(xs[0].dtype)
    return [q, *xs[1:]]


def _fused_attention_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    xs = _query_rotated(xs, a)
    q, k, v = _qkv(xs, a)
    mask, causal = _sdpa_mask(_attention_mask(xs, a), a, q.shape[2], k.shape[2], q.device)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    gqa = a.get("kv_group", 1) > 1
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=a["scale"], enable_gqa=gqa)
    if out_layout(a) == "bshd":
        return o.permute(0, 2, 1, 3).reshape(q.shape[0], q.shape[2], -1)
    if out_layout(a) == "sbhd":
        return o.permute(2, 0, 1, 3).reshape(q.shape[2], q.shape[0], -1)
    return o


ops.register("fused_attention", ops.FUSED, infer=_out_type)(_fused_attention_ref)


def describe_attention(a: Mapping[str, Any]) -> str:
    lay = a["layout"] if out_layout(a) == a["layout"] else f"{a['layout']}->{out_layout(a)}"
    parts = [f"{lay} h{a['heads']} d{a['head_dim']} mask={a['mask_kind']}"]
    if a.get("kv_group", 1) > 1:
        parts.append(f"gqa{a['kv_group']}")
    if a.get("causal"):
        parts.append("causal")
    if a.get("q_rotary"):
        parts.append("query rotary folded in")
    if a.get("note"):
        parts.append(f"note: {a['note']}")
    return " ".join(parts)


@lowering("fused_attention")
def _lower_attention(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    if backend == "torch":
        return None
    from kfuse.kernels import attention as K

    a = dict(node.attrs)
    kind = a["mask_kind"]
    rot = a.get("q_rotary")

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        xs = _query_rotated(xs, a, kernel=True)
        q, k, v = _unit_stride_heads(xs, a)
        mask = xs[3] if len(xs) > 3 else None
        mask2 = xs[4] if a.get("mask2") else None
        mk = K.MASK_NONE
        if mask is not None and kind == "padding":
            mk = K.MASK_KEY_PADDING
        elif mask is not None and kind == "dense":
            mk = K.MASK_DENSE_BOOL if mask.dtype == torch.bool else K.MASK_DENSE_ADD
        out, o4 = _merged_output(q, a)
        res = K.attention(q, k, v, mask=mask, mask_kind=mk, causal=a["causal"], scale=a["scale"], out=o4, mask2=mask2)
        return res if out is None else out

    def run_decode(xs: list[torch.Tensor], splits: int | None = None, combine: str = "launch") -> torch.Tensor:
        # a decode step's few query rows over a long cache: split along the keys, a key/value head's query heads in
        # one tile (kfuse.kernels.decode_attention)
        from kfuse.kernels.decode_attention import decode_attention

        xs, cos, sin = _split_query_rotary(xs, a)
        q, k, v = _unit_stride_heads(xs, a)
        out, o4 = _merged_output(q, a)
        mask = xs[3] if len(xs) > 3 and kind == "dense" else None
        rd, inter = (rot.get("rotary_dims"), rot["interleaved"]) if rot else (None, False)
        res = decode_attention(q, k, v, mask=mask, scale=a["scale"], out=o4, splits=splits, cos=cos, sin=sin, rotary_dims=rd,
                               interleaved=inter, combine=combine, owner=owner)  # fmt: skip
        return res if out is None else out

    ops_ = tuple(a.get("fused_ops", ("sdpa",)))
    owner = zlib.crc32(node.name.encode())  # combine="last": partials and counters of this node's own
    kernels = {"kernel": run}
    if _decode_shaped(node, graph, a):
        kernels["decode"] = run_decode
        if backend == "triton" and torch.cuda.is_available():  # measured: one chunk, no combine launch (chunk count untuned)
            kernels["decode_single"] = partial(run_decode, splits=1)
            kernels["decode_last"] = partial(run_decode, combine="last")  # the chunks merged by the last program: one launch
    name, fn, why, times = _attention_choice(node, graph, backend, options, kernels)
    if name == "sdpa":
        return Step(node.name, node.inputs, fn, KernelInfo(node.name, "library_attention", ops_, f"{describe_attention(a)}; {why}"))
    template = "decode_attention" if name.startswith("decode") else "fused_attention"
    step = Step(node.name, node.inputs, fn, KernelInfo(node.name, template, ops_, describe_attention(a) + (f"; {why}" if why else "")))
    # the one-launch merge saves in the plan what a race of the kernel alone cannot see (the second launch's gap):
    # timed again in the plan where it came close (runtime/plan_alternatives)
    close = runners_up(times, name, lambda n: n == "decode_last") if name == "decode" else []
    last = KernelInfo(node.name, "decode_attention", ops_, describe_attention(a) + "; kfuse decode kernel, merged by its last program")
    return offer(step, problem_key(node, graph), name, {n: (kernels[n], last) for n in close})


def _unit_stride_heads(xs: list[torch.Tensor], a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as [B, H, S, D] views; the kernels read the head dim with stride 1, and a model that keeps its
    projections channels-first (SqueezeBERT's (B, C, S) convs) hands them transposed views: one copy each."""
    q, k, v = _qkv(xs, a)
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # type: ignore[return-value]


def _merged_output(q: torch.Tensor, a: Mapping[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the node's output, the [B, H, Sq, D] view of it a kernel writes) where the heads are merged back
    (``bshd`` / ``sbhd``, written in place through strides); (None, None) where the kernel's own [B, H, Sq, D]
    output is the node's."""
    if out_layout(a) not in ("bshd", "sbhd"):
        return None, None
    b, h, sq, d = q.shape
    if out_layout(a) == "sbhd":
        out = torch.empty((sq, b, h * d), dtype=q.dtype, device=q.device)
        return out, out.view(sq, b, h, d).permute(1, 2, 0, 3)
    out = torch.empty((b, sq, h * d), dtype=q.dtype, device=q.device)
    return out, out.view(b, sq, h, d).permute(0, 2, 1, 3)


def _bhsd_shape(shape: tuple[int, ...], a: Mapping[str, Any], kv: bool) -> tuple[int, ...]:
    """The [B, H, S, D] shape ``to_bhsd`` gives an input of this shape."""
    if a["layout"] == "bhsd":
        return shape
    heads = a["heads"] // a.get("kv_group", 1) if kv else a["heads"]
    return (shape[0], heads, shape[1], a["head_dim"])


def _decode_shaped(node: Node, graph: Graph, a: Mapping[str, Any]) -> bool:
    """Whether the decode kernel takes this attention: a few query rows per key/value head, no causal flag,
    no mask or a dense one (``kfuse.kernels.decode_attention.applies``), and a cache at least four times the
    query rows (a prefill's square attention stays with the dense kernel where nothing is measured)."""
    from kfuse.kernels.decode_attention import applies

    if a["mask_kind"] not in ("none", "dense") or a.get("mask2"):
        return False
    tq, tk = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    if not isinstance(tq, TensorType) or not isinstance(tk, TensorType) or len(tq.shape) != (4 if a["layout"] == "bhsd" else 3):
        return False
    q, k = _bhsd_shape(tq.shape, a, False), _bhsd_shape(tk.shape, a, True)
    return applies(q, k, bool(a.get("causal"))) and q[2] <= 16 and k[2] >= max(32, 4 * q[2])


def _attention_choice(
    node: Node, graph: Graph, backend: str, options: Any, kernels: dict[str, Any]
) -> tuple[str, Any, str, dict[str, float]]:
    """Which attention runs: kfuse's kernels (the dense one, and the decode one where it applies) and PyTorch's
    SDPA (flash / memory-efficient kernels) as measured candidates; the lowering keeps the fastest on the GPU.
    ``gemm_library`` in the options ("never" / "always" / "auto") governs the library candidate, as for GEMMs.
    Without a GPU to measure on: the decode kernel where it applies, else the dense one. Returns (name, run,
    why, each candidate's time; empty where nothing was timed)."""
    mode = library_mode(options)
    if backend == "torch":
        return "kernel", kernels["kernel"], "", {}

    def run_sdpa(xs: list[torch.Tensor]) -> torch.Tensor:  # a folded query rotary runs as the rotary kernel first
        return _fused_attention_ref(_query_rotated(xs, node.attrs, kernel=True), {**node.attrs, "q_rotary": None})

    if mode == "always":
        return "sdpa", run_sdpa, "SDPA (forced)", {}
    candidates = dict(kernels)
    if mode == "auto":
        candidates["sdpa"] = run_sdpa
    if backend != "triton" or not torch.cuda.is_available() or len(candidates) == 1:
        name = "decode" if "decode" in kernels else "kernel"
        return name, kernels[name], "", {}
    # every candidate checked against kfuse's two-launch decode kernel first (its in-kernel merge and one chunk are other sums)
    name, times = choose(node, graph, candidates, problem_key(node, graph), reference="decode" if "decode" in candidates else None)
    label = {"kernel": "kfuse kernel", "decode": "kfuse decode kernel", "decode_single": "kfuse decode kernel, one chunk",
             "decode_last": "kfuse decode kernel, merged by its last program",
             "sdpa": "PyTorch SDPA"}  # fmt: skip
    return name, candidates[name], ", ".join(f"{label[n]} {t * 1e3:.1f} us" for n, t in sorted(times.items(), key=lambda kv: kv[1])), times


# ---------------------------------------------------------------------------------------
# varlen_attention: q, k, v packed [T, H*D] (any row stride), cu_seqlens int32 [B+1]
# ---------------------------------------------------------------------------------------
def _varlen_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    q, k, v, cu = xs
    t = q.shape[0]
    h, d = a["heads"], a["head_dim"]
    seg = torch.zeros(t, dtype=torch.int64, device=q.device)
    if t:
        # each sequence's first row starts a segment, and so does the row after the last sequence:
        # a bucket's rows past cu_seqlens[-1] (BucketedRunner pads T up) are a segment of their own,
        # never keys of the last sequence
        starts = cu[1:].long()
        seg.index_add_(0, starts[starts < t], torch.ones_like(starts[starts < t]))
        seg = seg.cumsum(0)
    allowed = seg[:, None] == seg[None, :]
    if a.get("causal"):
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    qh, kh, vh = (x.reshape(t, h, d).permute(1, 0, 2)[None] for x in (q, k, v))
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=a["scale"])
    return o[0].permute(1, 0, 2).reshape(t, h * d)


ops.register("varlen_attention", ops.FUSED, infer=_out_type)(_varlen_ref)


def _heads(xs: tuple[torch.Tensor, ...], t: int, h: int, d: int) -> tuple[torch.Tensor, ...]:
    """Packed [T, H*D] projections (any row stride) as [T, H, D] views (copies only if not viewable)."""
    return tuple(x.view(t, h, d) if x.stride(-1) == 1 else x.reshape(t, h, d) for x in xs)


@lowering("varlen_attention")
def _lower_varlen(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    if backend == "torch":
        return None
    from kfuse.kernels import attention as K

    a = dict(node.attrs)
    h, d = a["heads"], a["head_dim"]

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        q, k, v, cu = xs
        t = q.shape[0]
        out = torch.empty((t, h * d), dtype=q.dtype, device=q.device)
        q3, k3, v3 = _heads((q, k, v), t, h, d)
        K.varlen_attention(q3, k3, v3, cu, a["max_seqlen"], causal=a["causal"], scale=a["scale"], out=out.view(t, h, d))
        return out

    desc = f"packed h{h} d{d} max_seqlen={a['max_seqlen']}" + (" causal" if a.get("causal") else "")
    ops_ = tuple(a.get("fused_ops", ("sdpa",)))
    if backend == "triton" and torch.cuda.is_available() and library_mode(options) == "auto":

        def run_fa2(xs: list[torch.Tensor]) -> torch.Tensor:
            # PyTorch's FlashAttention-2 variable-length kernel (the one nested tensors use)
            q, k, v, cu = xs
            t = q.shape[0]
            q3, k3, v3 = _heads((q, k, v), t, h, d)
            m = a["max_seqlen"]
            o = torch.ops.aten._flash_attention_forward(q3, k3, v3, cu, cu, m, m, 0.0, bool(a["causal"]), False, scale=a["scale"])[0]
            return o.reshape(t, h * d)

        xs = example_inputs(node, graph)  # cu_seqlens: the tokens split evenly (ones would be no prefix sum)
        n_seq = xs[3].shape[0] - 1
        xs[3] = torch.linspace(0, xs[0].shape[0], n_seq + 1, device="cuda").round().to(torch.int32)
        choice, times = choose(node, graph, {"kernel": run, "fa2_varlen": run_fa2}, problem_key(node, graph), xs)
        if choice == "fa2_varlen":
            why = f"; FlashAttention-2 varlen {times['fa2_varlen'] * 1e3:.1f} us vs kfuse kernel {times['kernel'] * 1e3:.1f} us"
            return Step(node.name, node.inputs, run_fa2, KernelInfo(node.name, "library_varlen_attention", ops_, desc + why))
    return Step(node.name, node.inputs, run, KernelInfo(node.name, "varlen_attention", ops_, desc))


# ---------------------------------------------------------------------------------------
# fused_norm: x, addends..., (weight), (bias); attrs rms, eps, n_add, has_weight, has_bias
# ---------------------------------------------------------------------------------------
def _split_norm_inputs(xs: list[Any], a: Mapping[str, Any]) -> tuple[Any, list[Any], Any, Any]:
    n_add = a["n_add"]
    x, adds, rest = xs[0], list(xs[1 : 1 + n_add]), list(xs[1 + n_add :])
    w = rest.pop(0) if a["has_weight"] else None
    bias = rest.pop(0) if a["has_bias"] else None
    return x, adds, w, bias


def _trailing_inputs(xs: list[Any], a: Mapping[str, Any]) -> tuple[list[Any], Any, Any]:
    """The inputs without the trailing optional ones, then the row index (``row_index``: a gather folded in,
    ``kfuse.passes.gather_rows``) and the residual added to the output (``post_add``: a post-norm residual,
    ``fuse_norm.fuse_norm_residuals``); inputs end ``..., residual, index``."""
    xs = list(xs)
    index = xs.pop() if a.get("row_index") else None
    residual = xs.pop() if a.get("post_add") else None
    return xs, index, residual


def _fused_norm_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    xs, index, residual = _trailing_inputs(xs, a)
    x, adds, w, bias = _split_norm_inputs(xs, a)
    for t in adds:
        x = x + t
    n = (x.shape[-1],)
    y = F.rms_norm(x, n, w, a["eps"]) if a["rms"] else F.layer_norm(x, n, w, bias, a["eps"])
    if index is not None:  # output row r is source row index[r]
        y = y.reshape(-1, n[0]).index_select(0, index).reshape(a["out_type"].shape)
    if residual is not None:
        y = y + residual
    return y


ops.register("fused_norm", ops.FUSED, infer=_out_type)(_fused_norm_ref)


@lowering("fused_norm")
def _lower_norm(node: Node, graph: Graph, backend: str) -> Step | None:
    if backend == "torch":
        return None
    from kfuse.kernels.norm import norm

    a = dict(node.attrs)
    out_dtype = node.ttype.dtype

    out_shape = tuple(node.ttype.shape)

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        xs, index, residual = _trailing_inputs(xs, a)
        x, adds, w, bias = _split_norm_inputs(xs, a)
        eps = a["eps"] if a["eps"] is not None else torch.finfo(x.dtype).eps
        y = norm(x, adds, w, bias, eps=eps, rms=a["rms"], row_index=index, residual=residual)
        if index is not None:
            y = y.view(out_shape)
        return y if y.dtype == out_dtype else y.to(out_dtype)

    what = ("rms_norm" if a["rms"] else "layer_norm") + (f" + {a['n_add']} addends" if a["n_add"] else "")
    what += ", rows gathered" if a.get("row_index") else ""
    what += ", + residual" if a.get("post_add") else ""
    info = KernelInfo(node.name, "fused_norm", tuple(a.get("fused_ops", ("layer_norm",))), what)
    return Step(node.name, node.inputs, run, info)


# ---------------------------------------------------------------------------------------
# rotary: x, cos, sin -> x * cos + rotate_half(x) * sin (cos/sin broadcast to x); interleaved: rotate_every_two
# ---------------------------------------------------------------------------------------
def _rotary_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    x, c, s = types
    assert isinstance(x, TensorType) and isinstance(c, TensorType) and isinstance(s, TensorType)
    return TensorType(x.shape, torch.promote_types(torch.promote_types(x.dtype, c.dtype), s.dtype))


@ops.register("rotary", ops.FUSED, infer=_rotary_type)
def _rotary_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    x, cos, sin = xs
    rd = a.get("rotary_dims") or x.shape[-1]  # partial rotary: the columns past rd pass through
    xr, h = x[..., :rd], rd // 2
    if a.get("interleaved"):  # GPT-J's rotate_every_two: column pairs (2i, 2i + 1)
        rot = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    else:
        rot = torch.cat((-xr[..., h:], xr[..., :h]), dim=-1)
    y = xr * cos + rot * sin
    return torch.cat((y, x[..., rd:].to(y.dtype)), dim=-1) if rd < x.shape[-1] else y


# ---------------------------------------------------------------------------------------
# cache_write: cache [B, H, L, D], index [T], x [B, H, T, D] (, cos, sin) (, offset): a KV cache's update,
#   cache.index_copy(2, index (+ offset), rotary(x, cos, sin) or x), with the rotary node's attrs (rotary_dims,
#   interleaved) and index_offset (the last input is one integer added to every position: the cache's length);
#   kfuse.passes.fuse_cache_write makes it, kfuse.runtime.state_writes runs it in place
# ---------------------------------------------------------------------------------------
def _cache_write_type(types: list[ValueType], a: Mapping[str, Any]) -> ValueType:
    return types[0]


def _cache_write_rows(xs: list[torch.Tensor], a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, rows) of a cache write, by PyTorch's ops: the index plus its offset, the rotated (or plain) rows."""
    cache, index, x, *rest = xs
    if a.get("index_offset"):
        index, rest = index + rest[-1].reshape(()), rest[:-1]
    src = _rotary_ref([x, *rest], a) if rest else x
    return index, src.to(cache.dtype)


@ops.register("cache_write", ops.FUSED, infer=_cache_write_type)
def _cache_write_ref(xs: list[torch.Tensor], a: Mapping[str, Any]) -> torch.Tensor:
    return xs[0].index_copy(2, *_cache_write_rows(xs, a))


@lowering("cache_write")
def _lower_cache_write(node: Node, graph: Graph, backend: str) -> Step | None:
    from kfuse.kernels.rotary import write_rows

    rd, interleaved = node.attrs.get("rotary_dims"), bool(node.attrs.get("interleaved"))
    offset = bool(node.attrs.get("index_offset"))
    rotate = len(node.inputs) - offset == 5

    def kernel_in_place(xs: list[torch.Tensor]) -> torch.Tensor:
        cos, sin = (xs[3], xs[4]) if rotate else (None, None)
        off = xs[-1] if offset else None
        return write_rows(xs[2], xs[0], xs[1], cos, sin, rotary_dims=rd, interleaved=interleaved, index_offset=off)

    def torch_in_place(xs: list[torch.Tensor]) -> torch.Tensor:  # PyTorch's ops, still in place: no cache copy a token
        return xs[0].index_copy_(2, *_cache_write_rows(xs, node.attrs))

    # what state_writes.pair_cache_writes needs to write this cache and another in one launch (the kernel form only)
    kernel_in_place.rows_write = {"rotary_dims": rd, "interleaved": interleaved, "rotate": rotate, "offset": offset}  # type: ignore[attr-defined]
    in_place = torch_in_place if backend == "torch" else kernel_in_place

    def run(xs: list[torch.Tensor]) -> torch.Tensor:  # functional: a new cache (state_writes runs in_place where it may)
        return in_place([xs[0].clone(), *xs[1:]])

    run.in_place = in_place  # type: ignore[attr-defined]
    pairing = "rotate_every_two" if interleaved else "rotate_half"
    what = ("rows at the index + offset" if offset else "rows at the index") + (f", {pairing} rotary first" if rotate else "")
    template = "torch" if backend == "torch" else "cache_write"
    return Step(node.name, node.inputs, run, KernelInfo(node.name, template, tuple(node.attrs.get("fused_ops", ())), what))


@lowering("rotary")
def _lower_rotary(node: Node, graph: Graph, backend: str) -> Step | None:
    if backend == "torch":
        return None
    from kfuse.kernels.rotary import rotary

    out_dtype = node.ttype.dtype

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        return rotary(xs[0], xs[1], xs[2], dtype=out_dtype, rotary_dims=rd, interleaved=interleaved)

    rd, interleaved = node.attrs.get("rotary_dims"), bool(node.attrs.get("interleaved"))
    what = f"x * cos + {'rotate_every_two' if interleaved else 'rotate_half'}(x) * sin" + (
        f" on {rd} of {node.ttype.shape[-1]} columns, the rest copied" if rd else ""
    )
    info = KernelInfo(node.name, "rotary", tuple(node.attrs.get("fused_ops", ("rotary",))), what)
    return Step(node.name, node.inputs, run, info)
