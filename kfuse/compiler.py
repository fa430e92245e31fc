"""The optimisation pipeline: a list of named stages, each a pure function Graph -> Graph.

``optimize`` runs them in order and keeps every intermediate graph so ``explain`` can show
what each stage did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from kfuse.ir.graph import Graph
from kfuse.passes.fold import constant_fold, fold_batch_norm
from kfuse.passes.fold_pad import fold_pad
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.simplify import algebraic_simplify, cse, dce

if TYPE_CHECKING:
    import torch

Pass = Callable[[Graph], Graph]


@dataclass(frozen=True)
class Options:
    """What ``kfuse.compile`` may do. Every field has a safe default."""

    fuse_epilogue: bool = True
    fuse_b2b: bool = True  # back-to-back GEMM/Conv fusion (issue 5)
    # the TMA conv-chain kernel (b2b_conv_tma_kernel) among the measured candidates; on since it
    # ran on the H200 (session 6: every config of a 110-config sweep correct; fused beats the
    # unfused pair on three of the four bench chains)
    b2b_conv_tma: bool = True
    # programmatic dependent launch candidates for the persistent TMA GEMM chains (B2BConfig.pdl):
    # off until measured on the H200 (compiled for sm_90 only; whether torch's CUDA graph capture
    # keeps the programmatic edges is unverified, and a plan that fails capture runs without a graph)
    b2b_pdl: bool = False
    # decisions whose two sides measured within 10% are re-timed on the whole plan, and the faster
    # side in the plan is kept (kfuse.runtime.b2b_recheck; session 15: the plan ran a 256-wide
    # chain's chosen side 2.5-15% slower than the chain timed alone)
    b2b_recheck: bool = True
    # a race's close kfuse runner-up (the skinny GEMM, which prefetches its weight before the PDL wait, as no race
    # can see) timed again in the whole plan under PDL, a race key's steps swapped together (runtime/plan_alternatives)
    recheck_alternatives: bool = True
    fuse_attention: bool = True  # attention recognition + fused kernel (issue 4)
    fuse_pointwise: bool = True  # memory-bound chains -> generated kernels (issue 6)
    fuse_rotary: bool = True  # x * cos + rotate_half(x) * sin -> one rotary kernel (Llama-style decoders)
    # a KV cache's index_copy (with the key's rotary embedding before it) -> one cache_write kernel, run in place on
    # a static cache (kfuse.passes.fuse_cache_write); off: PyTorch's index_copy after the rotary kernel
    fuse_cache_write: bool = True
    # a layer's key and value cache writes at the same positions in one launch (kfuse.runtime.state_writes)
    pair_cache_writes: bool = True
    # a decode step's query rotary applied by the decode attention kernel as it reads the query
    # (kfuse.passes.fuse_query_rotary); off: the rotary kernel's own launch a layer
    fuse_query_rotary: bool = True
    # row-only data movement (Swin's roll + window partition) -> one row gather, folded into the LayerNorm before it
    gather_rows: bool = True
    # merge a GEMM whose value goes into a GELU / ReLU with the GEMMs that share its input (its activation then
    # runs as a kernel of its own); off: it keeps its own GEMM, whose epilogue takes the activation (GPT-J, Phi)
    merge_activated: bool = False
    # a conv reads x * s[N, C, 1, 1] (squeeze-excitation: RegNet-Y, EfficientNet), or relu(x * s + t) (a batch norm +
    # ReLU before it: DenseNet), through its input loads
    input_scale: bool = True
    # GroupNorm as one op with its SiLU (kfuse.kernels.group_norm: two passes over the map, timed against PyTorch's
    # GroupNorm on the GPU); off: the layer-norm form the importer wrote before session 44, for an A/B
    group_norm: bool = True
    # an NHWC graph's global average pools (squeeze-excitation, the head) as kfuse.kernels.global_pool, coalesced
    # along the channels; off: the generated row reduction, as before session 44
    global_pool: bool = True
    fuse_gated_mlp: bool = True  # merged gate/up GEMM + act(gate) * up -> one two-accumulator GEMM, where measured faster
    # an RMSNorm written out in elementwise ops (Hugging Face's decoders) -> one rms_norm node (the norm template)
    recognize_rms_norm: bool = True
    # a few-row RMSNorm (a decode step's) folded into the GEMMs that read it: its weight into theirs, its row scale
    # into their output (kfuse.passes.fold_row_norm); each GEMM then times kfuse's skinny kernel, which computes the
    # scale itself, against the norm kernel + the tiled template / cuBLAS
    fold_row_norm: bool = True
    # few-row GEMMs (a decode step's, M <= 16): "auto" adds kfuse's skinny split-K kernel (kfuse.kernels.skinny_gemm)
    # to the template-vs-library race on the GPU; "never": not a candidate; "always": run it wherever eligible
    skinny_gemm: str = "auto"
    # under PDL the skinny kernel (and a one-row-block gated tile) streams its weight into L2 before it waits for the
    # previous kernel (the weight is a constant): the bandwidth the previous kernel leaves idle (session 49)
    skinny_prefetch: bool = True
    layout: str = "auto"  # "auto": NHWC for convs on the GPU; "nchw": leave as is (issue 3)
    # 4-D outputs of an NHWC graph: "channels_last" keeps them as the kernels wrote them, "nchw"
    # copies them back; "auto" (kfuse.compile): channels-last when a 4-D example input is, as eager
    # PyTorch returns them (saves a full copy of the output, 0.01-0.05 ms for a B64 56x56 map)
    output_layout: str = "auto"
    varlen: bool | None = None  # padding-free mode; None: when an attention mask is given (issue 4)
    tune: str = "none"  # "none" | "fast" | "full" (issue 3)
    # GEMMs: "auto" times the template against cuBLAS(Lt) + the rest of the epilogue on the GPU and
    # keeps the faster; "never": always the template; "always": always the library (tests, A/B runs).
    # "never" also fuses bias + residual into the GEMM epilogues rather than the norm kernel (no cuBLAS
    # to leave a plain GEMM for); $KFUSE_GEMM_LIBRARY overrides the per-node choice only, not that
    gemm_library: str = "auto"
    memory_plan: bool = True  # static buffer reuse (issue 6)
    # nested concatenations (DenseNet's dense layers) as views of one buffer each member is copied into once
    # (kfuse.runtime.concat_in_place); off: every cat copies all its inputs, as before session 45
    concat_in_place: bool = True
    profile: bool = False  # per-kernel timing after compile (issue 6)
    sass: bool = False  # SASS schedule tuning of the hottest kernels (issue 7; kfuse.runtime.sass_plan)
    sass_kernels: int = 2  # how many of the hottest tunable Triton kernels to tune
    sass_samples: int = 10_000  # random input sets a schedule must pass before it is installed
    sass_iterations: int = 1000  # simulated-annealing steps per seed (3 seeds)
    cuda_graphs: bool = True
    # a CUDA-graph replay writes the same static output buffers every call; they are copied out (True) so a
    # later call cannot overwrite what the caller holds. False returns the buffers themselves, valid until the
    # next call (torch.compile's mode="reduce-overhead" semantics): a serving loop that consumes each output
    # before the next call saves one copy per output (OPT-125m B1 S512: 9 outputs, ~33 us of 423)
    copy_outputs: bool = True
    # programmatic dependent launch (kfuse.kernels.pdl): each kfuse kernel may start while the previous
    # one drains and waits for it in-kernel. Measured on the H200 (session 23, A/B in one process, outputs
    # bit-equal): BERT-base B1 0.481 -> 0.438 ms, B32 1.587 -> 1.569, Llama-1b B1 S512 2.647 -> 2.587,
    # ResNet-50 B1 0.391 -> 0.384. It cost ConvNeXt-T B32 12% (session 40: 2.029 vs 1.780 ms), so "auto"
    # (the default) times the plan with it on and off and keeps the faster (kfuse.runtime.pdl_choice)
    pdl: bool | str = "auto"
    explain: bool = False
    # shape signatures compiled per model (kfuse.compile) or per Dynamo graph: a call with another one after that
    # runs as PyTorch runs it, with one warning (torch.compile stops recompiling at 8 too). A generation loop with
    # a growing DynamicCache would otherwise compile every token; a static cache has one shape
    max_shapes: int = 8
    check: bool = True  # compare with the original model on the example inputs
    # "auto": torch.export, and where it cannot trace or functionalise the model (Mixtral's MoE routing writes
    # through views) Dynamo's frontend, as torch.compile(model, backend="kfuse"); "export": torch.export only
    frontend: str = "auto"
    backend: str | None = None  # "triton", "triton-interpreter", "torch"; None: by device


def default_pipeline(options: Options, device: torch.device | None = None) -> list[tuple[str, Pass]]:
    """The stages ``options`` asks for; ``device``: where the compiled plan runs (the tuning stage times kernels there)."""
    stages: list[tuple[str, Pass]] = [("dce", dce)]
    if not options.group_norm:
        from kfuse.passes.group_norm import decompose

        stages.append(("decompose_group_norm", decompose))
    stages += [
        ("fold_batch_norm", fold_batch_norm),
        ("constant_fold", constant_fold),
        ("algebraic_simplify", algebraic_simplify),
        ("cse", cse),
        ("constant_fold_2", constant_fold),
        ("algebraic_simplify_2", algebraic_simplify),
        ("fold_pad", fold_pad),  # before the layout pass and conv fusion see the convs
    ]
    if options.recognize_rms_norm:  # before the attention and norm matchers, which then see one norm node
        from kfuse.passes.recognize_rms_norm import recognize_rms_norm

        stages.append(("recognize_rms_norm", recognize_rms_norm))
    if options.fuse_epilogue:  # reshapes out of GEMM chains, so the epilogue sees bias/GELU/residual
        from kfuse.passes.sink_reshapes import sink_reshapes

        stages.append(("sink_reshapes", sink_reshapes))
    if options.layout != "nchw":
        from kfuse.passes.layout import layout_pass

        stages.append(("layout", layout_pass(options)))
    if options.fuse_attention:  # before fuse_epilogue: the merged QKV GEMM still gets its bias epilogue
        from kfuse.passes.compose_views import compose_views
        from kfuse.passes.fold_batch_dims import fold_batch_dims
        from kfuse.passes.fold_window_mask import fold_window_mask
        from kfuse.passes.fuse_attention import fuse_attention
        from kfuse.passes.hoist_row_views import hoist_row_views
        from kfuse.passes.lift_head_batch import lift_head_batch
        from kfuse.passes.merge_gemm import merge_gemms

        # nn.MultiheadAttention: its batch-first transpose moved above the output projection, into the heads'
        # merge, and its head split (a copy of Q, K and V in eager) as views of the projection; (B*H, S, D) bmm
        # attention (BLOOM, XGLM) lifted to the (B, H, S, D) chain that fuse_attention matches, and Swin-V2's window
        # mask added through a 5-D view folded into one 4-D mask (first: a constant mask), and attention over five dims
        # (MaxViT, Hiera) folded to four
        stages += [("hoist_row_views", hoist_row_views), ("compose_views", compose_views), ("lift_head_batch", lift_head_batch),
                   ("fold_window_mask", fold_window_mask), ("fold_batch_dims", fold_batch_dims), ("fuse_attention", fuse_attention),
                   ("merge_gemm", partial(merge_gemms, merge_activated=options.merge_activated))]  # fmt: skip
    if options.fuse_rotary:  # before fuse_pointwise, which would take its multiply-add alone
        from kfuse.passes.fuse_rotary import fuse_rotary

        stages.append(("fuse_rotary", fuse_rotary))
    if options.fuse_cache_write:  # after fuse_rotary: the key's rotary node folds into its cache's write
        from kfuse.passes.fuse_cache_write import fuse_cache_write

        stages.append(("fuse_cache_write", fuse_cache_write))
    if options.fuse_epilogue or options.fuse_pointwise:  # after the attention / rotary matchers, which read permutes
        from kfuse.passes.sink_permutes import sink_permutes

        # residual adds behind a shared permute (ConvNeXt) move into the GEMM epilogue and stay in the
        # producers' layout; the simplify composes the moved permute with the next block's inverse one
        stages += [("sink_permutes", sink_permutes), ("algebraic_simplify_3", algebraic_simplify)]
    # bias + residual + LayerNorm in the norm kernel (before epilogue fusion), leaving a plain GEMM
    # that cuBLAS runs at full speed: the norm reads one more tensor, the GEMM loses its 1.6x
    # slower fused-epilogue main loop (docs/perf-notes.md, "GEMM: library vs template")
    norm_first = options.fuse_attention and options.gemm_library != "never"
    if norm_first:
        from kfuse.passes.fuse_norm import fuse_norms

        stages.append(("fuse_norm", fuse_norms))
    if options.fuse_epilogue:
        if options.fuse_attention:  # attention fusion leaves reshapes in front of the output projection
            from kfuse.passes.sink_reshapes import sink_reshapes

            stages.append(("sink_reshapes_2", sink_reshapes))
        stages.append(("fuse_epilogue", fuse_epilogues))
    if options.fuse_attention and not norm_first:  # add + LayerNorm after the epilogues took bias and residual
        from kfuse.passes.fuse_norm import fuse_norms

        stages.append(("fuse_norm", fuse_norms))
    # after fuse_norm, whose LayerNorms take the row gathers in front of windows; memory-bound glue, so with
    # fuse_pointwise (off, as in the tests that stop before fusion, the copies stay PyTorch's)
    if options.gather_rows and options.fuse_pointwise:
        from kfuse.passes.gather_rows import gather_rows

        stages.append(("gather_rows", gather_rows))
    if options.fuse_attention:  # post-norm residuals (Swin-V2) into the norm kernel, after the gathers folded
        from kfuse.passes.fuse_norm import fuse_norm_residuals

        stages.append(("fuse_norm_residual", fuse_norm_residuals))
    if options.varlen is not False:  # padding-free: before fuse_pointwise, whose kernels have static shapes
        from kfuse.passes.varlen import varlen_pass

        stages.append(("varlen", varlen_pass(options)))
    if options.input_scale and options.fuse_epilogue:  # squeeze-excitation's x * s into the conv reading it, before b2b
        from kfuse.passes.fuse_input_scale import fuse_input_scale

        stages.append(("fuse_input_scale", fuse_input_scale))
    if options.fuse_b2b and options.fuse_epilogue:  # chains of the epilogue GEMMs/convs (issue 5)
        # after varlen: a chain inside a padding-free region would break the region (the region
        # packs token rows through the ops it knows; a transformer FFN whose hidden width is past
        # 256 is a chunked chain since session 15), so chains fuse where varlen left the graph
        from kfuse.passes.fuse_b2b import fuse_b2b

        stages.append(("fuse_b2b", fuse_b2b))
    if options.fuse_epilogue:  # a depthwise conv's activation into its kernel, before fuse_pointwise takes it
        from kfuse.passes.fuse_conv_activation import fuse_conv_activation

        stages.append(("fuse_conv_activation", fuse_conv_activation))
    if options.group_norm:  # a GroupNorm's SiLU into its kernel, before fuse_pointwise takes it
        from kfuse.passes.group_norm import fuse_silu

        stages.append(("group_norm_silu", fuse_silu))
    if options.fuse_pointwise:  # last fusion stage: takes whatever elementwise glue is left
        from kfuse.passes.fuse_pointwise import fuse_pointwise

        stages.append(("fuse_pointwise", lambda g: fuse_pointwise(g, options.global_pool)))
    if options.fuse_query_rotary and options.fuse_attention and options.fuse_rotary:  # after varlen, which reads attention inputs
        from kfuse.passes.fuse_query_rotary import fuse_query_rotary

        stages.append(("fuse_query_rotary", fuse_query_rotary))
    if options.tune != "none":  # it tunes the GEMM/conv kernels the fusion stages made
        from kfuse.tune.tuner import tune_graph

        stages.append(("tune", lambda g: tune_graph(g, options, device=device)))
    if options.fuse_gated_mlp and options.fuse_pointwise:  # after tuning: the unfused side keeps its tuned GEMM
        from kfuse.passes.fuse_gated_mlp import fuse_gated_mlp

        stages.append(("fuse_gated_mlp", fuse_gated_mlp))
    if options.fold_row_norm and options.fuse_attention:  # last: the GEMMs it folds into are final (merged, gated)
        from kfuse.passes.fold_row_norm import fold_row_norm

        stages.append(("fold_row_norm", fold_row_norm))
    return stages


@dataclass
class Optimized:
    graph: Graph
    stages: list[tuple[str, Graph]] = field(default_factory=list)


def optimize(
    graph: Graph, options: Options | None = None, pipeline: list[tuple[str, Pass]] | None = None, device: torch.device | None = None
) -> Optimized:
    """Run the stages (``pipeline``, else ``default_pipeline``) on ``graph``; ``device``: where the plan will run."""
    options = options or Options()
    stages = [("import", graph)]
    for name, fn in pipeline or default_pipeline(options, device):
        graph = fn(graph)
        graph.verify()
        stages.append((name, graph))
    return Optimized(graph, stages)
