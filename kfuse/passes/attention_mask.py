"""What an attention mask means, found by evaluating the graph that computes it.

HF models build their masks from ``arange``/``ge``/``le``/``index``/``expand`` (BERT, GPT-2, ViT
with SDPA) or as an additive ``where(mask, 0, min)`` (eager attention). Rather than pattern-match
every mask builder, kfuse takes the subgraph that computes the mask and runs it:

- a constant mask (no runtime input) is compared with "all allowed" and with the causal tril;
- a mask computed from one runtime input ``X`` of shape ``[B, Sk]`` is run on random 0/1 probes
  of ``X`` (every row keeps at least one 1) and compared with the key-padding mask ``X[b, j] != 0``
  and with key padding combined with causal. It must agree on every probe.

Additive masks (float, or integer/bool masks added to the scores) count as hard masks when their
values are 0 (attend) or <= -1e4 / -inf (blocked); other values (ALiBi, learned biases) make the
mask dense. Only a bool mask given as SDPA's ``attn_mask`` means True = attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kfuse.ir.graph import Graph, GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run

HARD_NEG = -1.0e4  # additive values at or below this are "blocked" for a softmax in fp16/fp32
N_PROBES = 6


@dataclass(frozen=True)
class MaskInfo:
    kind: str  # "none" | "padding" (key padding from input `source`) | "dense"
    causal: bool = False
    source: str | None = None  # the runtime [B, Sk] input of a padding mask
    note: str = ""


def subgraph_for(graph: Graph, value: str) -> Graph:
    """The part of ``graph`` that computes ``value``: its ancestors, the inputs and constants they read."""
    nodes = graph.node_map()
    need: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in need:
            continue
        need.add(v)
        if v in nodes:
            stack.extend(nodes[v].inputs)
    b = GraphBuilder(f"{graph.name}_mask")
    for n, t in graph.inputs:
        if n in need:
            b.add_input(n, t)
    for n, c in graph.constants.items():
        if n in need:
            b.add_constant(c, n)
    for node in graph.nodes:
        if node.name in need:
            b.add_node(node)
    return b.build([value])


def _allowed(m: torch.Tensor, additive: bool = False) -> torch.Tensor | None:
    """Boolean "may attend" of a mask value; None when an additive mask is not a hard mask.

    A bool mask given as SDPA's ``attn_mask`` (``additive`` False) means True = attend. Any other
    mask is added to the scores, whatever its dtype (an int64 ``pad * -10000`` bias, or a bool
    added as 0/1): 0 attends, <= -1e4 blocks, and anything else is a soft (dense) mask."""
    if m.dtype == torch.bool and not additive:
        return m
    m = m.float()
    ok = (m == 0) | (m <= HARD_NEG)
    if not bool(ok.all()):
        return None
    return m == 0


def _probes(x_type: TensorType, gen: torch.Generator) -> list[torch.Tensor]:
    b, s = x_type.shape
    out = []
    for i in range(N_PROBES):
        if i == 0:
            p = torch.ones(b, s, dtype=torch.bool)
        elif i == 1:  # prefix masks of random lengths (the common case)
            lens = torch.randint(1, s + 1, (b,), generator=gen)
            p = torch.arange(s)[None, :] < lens[:, None]
        else:  # arbitrary patterns: the mask must not rely on prefixes
            p = torch.rand(b, s, generator=gen) < 0.5
            p[torch.arange(b), torch.randint(0, s, (b,), generator=gen)] = True
        out.append(p.to(x_type.dtype))
    return out


def classify(graph: Graph, mask: str | None, q_type: TensorType, k_len: int, additive: bool = False) -> MaskInfo:
    """The meaning of ``mask`` for an attention whose queries have type ``[B, H, Sq, D]``.

    ``additive``: the mask is added to the scores (the explicit ``softmax(q @ k^T * s + mask)``
    form), so even a bool or integer mask is read as an additive bias (see ``_allowed``)."""
    if mask is None:
        return MaskInfo("none")
    b, sq = q_type.shape[0], q_type.shape[2]
    sub = subgraph_for(graph, mask)
    tril = torch.ones(sq, k_len, dtype=torch.bool).tril()
    if not sub.inputs:
        try:
            allowed = _allowed(reference_run(sub, [])[0].cpu(), additive)
        except Exception as e:  # a mask kfuse cannot evaluate stays dense
            return MaskInfo("dense", note=f"mask could not be evaluated at compile time ({type(e).__name__})")
        if allowed is None:
            return MaskInfo("dense", note="additive mask with soft values")
        full = allowed.expand(b, 1 if allowed.dim() < 4 else allowed.shape[1], sq, k_len) if allowed.dim() >= 2 else None
        if full is not None and bool(full.all()):
            return MaskInfo("none")
        if full is not None and bool((full == tril).all()):
            return MaskInfo("none", causal=True)
        return MaskInfo("dense", note="constant mask that is neither empty nor causal")
    if len(sub.inputs) != 1:
        return MaskInfo("dense", note=f"mask depends on {len(sub.inputs)} inputs")
    x_name, x_type = sub.inputs[0]
    if x_type.rank != 2 or x_type.shape != (b, k_len):
        return MaskInfo("dense", note=f"mask input {x_name} has shape {x_type.shape}, not [B, Sk] = [{b}, {k_len}]")
    gen = torch.Generator().manual_seed(1234)
    device = next((c.device for c in sub.constants.values()), torch.device("cpu"))
    pad_ok = causal_ok = True
    for p in _probes(x_type, gen):
        try:
            val = reference_run(sub, [p.to(device)])[0].cpu()
        except Exception as e:
            return MaskInfo("dense", note=f"mask could not be probed ({type(e).__name__})")
        allowed = _allowed(val, additive)
        if allowed is None:
            return MaskInfo("dense", note="additive mask with soft values")
        try:
            got = allowed.expand(b, allowed.shape[1] if allowed.dim() == 4 else 1, sq, k_len)
        except RuntimeError:
            return MaskInfo("dense", note=f"mask of shape {tuple(allowed.shape)} is not [B, H, Sq, Sk]")
        pad = (p != 0)[:, None, None, :].expand_as(got)
        pad_ok = pad_ok and bool((got == pad).all())
        causal_ok = causal_ok and bool((got == (pad & tril)).all())
        if not (pad_ok or causal_ok):
            return MaskInfo("dense", note=f"mask computed from {x_name} is not a key-padding mask")
    return MaskInfo("padding", causal=not pad_ok, source=x_name)
