"""One compile option on and off, side by side in one process: each ``arch:option`` case is compiled twice
(``kfuse.compile(..., option=True)`` and ``False``), checked against eager, and timed in alternating rounds.

Session 42's cases and predictions (written before any GPU run; fp16, batch and widths as in zoo_sweep):

* ``regnet:input_scale`` (RegNet-Y-040 B32): the squeeze-excitation multiply read by the 1x1 projection's
  input loads. 22 blocks; the multiply read and wrote ~390 MB a call (stage 1: 2 x 51 MB, stage 2: 6 x 19 MB,
  stage 3: 12 x 13 MB, stage 4: 2 x 7 MB), ~130 us at 3 TB/s, and 22 launches. The conv pays an extra load
  per A element from an N x C table in L1/L2. Prediction: -70..-170 us of 2.82 ms.
* ``efficientnet:input_scale`` (EfficientNet-B0 B32): 16 SE blocks on the expanded maps, ~300 MB.
  Prediction: -50..-120 us of 2.02 ms, unless the projection conv was in a back-to-back chain (then smaller).
* ``gptj:fuse_rotary`` (GPT-J-6B widths, 4 layers, B1 S512): rotate_every_two as one kernel for Q and one for K
  a layer instead of the negation, copies and multiply-add (~5 launches each on ~2 MB tensors). Prediction:
  -40..-80 us.
* ``gptj:merge_activated`` and ``phi:merge_activated`` (on = session 41's plan, fc_in merged with Q, K, V and
  its GELU a pointwise kernel over [512, 4 x hidden]; off, the default now = fc_in its own GEMM with the GELU in
  its epilogue). The pointwise pass moved 32 MB a layer on GPT-J (16 MB on Phi-1.5), ~11 / ~6 us at 3 TB/s, plus a
  launch; the split costs one more GEMM launch and reads the LayerNorm output twice (4 / 2 MB). Prediction: off
  faster by 20-50 us on GPT-J's 4 layers, 10-30 us on Phi's; more if the MLP pair then fuses back to back.

Session 44's cases (diffusers wheels on the path: BENCHMARKS.md "Next runs"):

* ``sd15-unet:group_norm`` (SD 1.5's UNet, B2, latents 64 x 64) and ``sd15-vae-decoder:group_norm`` (B1, 512 x 512):
  GroupNorm + SiLU as two passes over the map (on) or the layer-norm form, a copy, the norm and a pointwise
  kernel (off). Floor of what it removes, counted from the architectures: the UNet's 61 GroupNorms read and write
  ~150 MB of maps, 6x in the old form and 3x in the new, so ~450 MB (~150 us at 3 TB/s; most maps fit the L2) and
  ~120 launches; the VAE decoder's ~30 read ~900 MB of maps (up to 67 MB each at 512 x 512), so ~2.7 GB (~0.9 ms).
  Predictions: UNet -0.2..-0.5 ms, VAE decoder -0.6..-1.2 ms. On the GPU each norm also races PyTorch's own
  GroupNorm + SiLU (two kernels) and keeps the faster, so "on" should be no slower than "off" on any shape.

* ``regnet:global_pool`` and ``efficientnet:global_pool``: an NHWC graph's global average pools as a kernel reading
  along the channels (on) or as the generated row reduction, whose rows read pixels C elements apart (off). Floor:
  the SE maps, ~193 MB on RegNet-Y-040 B32 and ~148 MB on EfficientNet-B0. Predictions: RegNet-Y -60..-150 us,
  EfficientNet-B0 -40..-100 us; less if the L2 absorbed the strided reads.

Session 45's cases (torchvision at zoo_sweep's GPU sizes, B32 fp16; no device that session, so predictions only):

* ``tv-densenet121:concat_in_place``: the dense layers' 58 cats as views of one buffer a block, each feature made in
  its slice (on) or each cat copying the block's input and every feature so far (off). Floor: the cats read and
  write 1.24 GB a call (blocks 1-4: 424, 405, 395, 79 MB); on, the four block inputs are copied once (~48 MB) and
  the conv outputs are written in place where the template won their race (a cuDNN conv's output is copied, 32
  channels). Block 3's cats are under 13 MB each and may be served from the L2. Prediction: -0.25..-0.45 ms,
  and 54 fewer launches.
* ``tv-densenet121:input_scale``: the batch norm + ReLU before each 1x1 conv (and each transition) in the conv's
  input loads (on) or a pointwise kernel writing the normalised cat (off). Floor: the same ~1.24 GB as the cats,
  plus the transitions. The prologue conv runs the pointer kernel (not TMA) and is raced against cuDNN with the
  norm run first. Prediction: -0.1..-0.4 ms.
* ``tv-inception-v3:concat_in_place``: each block's cat of four branch convs computed in place. Floor: 326 MB of
  cat copies at B32 299 px. Prediction: -0.03..-0.11 ms, the upper end only if the template wins the branch convs.

    PYTHONPATH=. python benchmarks/experiments/option_ab.py --out $OUT                        # H200
    PYTHONPATH=. python benchmarks/experiments/option_ab.py --smoke --case regnet:input_scale  # CPU check
    PYTHONPATH=.:/tmp/site python benchmarks/experiments/option_ab.py --case sd15-unet:group_norm,sd15-vae-decoder:group_norm --out $OUT
    PYTHONPATH=. python benchmarks/experiments/option_ab.py --out $OUT \
        --case tv-densenet121:concat_in_place,tv-densenet121:input_scale,tv-inception-v3:concat_in_place
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo_sweep  # noqa: E402

import kfuse  # noqa: E402
from kfuse.bench.harness import max_rel_err, time_ms  # noqa: E402

CASES = "regnet:input_scale,efficientnet:input_scale,gptj:fuse_rotary,gptj:merge_activated,phi:merge_activated"


def ab(
    arch: str, option: str, smoke: bool, rounds: int, rep: int, counts: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The case compiled with ``option`` on and off, checked against eager and timed in alternating rounds;
    ``counts``: more per-side figures from the plan's kernel list."""
    model, a, kw = zoo_sweep.build(arch, smoke, "cpu" if smoke else "cuda", torch.float32 if smoke else torch.float16)
    out: dict[str, Any] = {"arch": arch, "option": option, "checkpoint": zoo_sweep.ALL_ARCHS[arch].checkpoint}
    compiled = {}
    with torch.no_grad():
        ref = zoo_sweep.first_tensor(model(*a, **kw))
        for on in (True, False):
            cm = kfuse.compile(model, a, kw, tune="none" if smoke else "fast", check=False, **{option: on})
            compiled[on] = cm
            kernels = cm.report["kernels"]
            templates: dict[str, int] = {}
            for k in kernels:
                templates[k["template"]] = templates.get(k["template"], 0) + 1
            out["on" if on else "off"] = {"max_rel_err": max_rel_err(zoo_sweep.first_tensor(cm(*a, **kw)), ref), "steps": len(kernels),
                                          "templates": templates, "pdl_choice": cm.report.get("pdl_choice"),
                                          **(counts(kernels) if counts else {})}  # fmt: skip
        if smoke:
            return out
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):  # alternate, each side first in half the rounds
            for on in (True, False) if r % 2 == 0 else (False, True):
                times[on].append(time_ms(lambda cm=compiled[on]: cm(*a, **kw), 10, rep))
    for on in (True, False):
        side = out["on" if on else "off"]
        side["ms_rounds"], side["ms"] = times[on], statistics.median(times[on])
    out["gain_us"] = (out["off"]["ms"] - out["on"]["ms"]) * 1e3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default=CASES, help="comma-separated arch:option (zoo_sweep architectures, kfuse.compile options)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--out", default="")
    p.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (interpreter): checks the script, times nothing")
    args = p.parse_args()
    rows = []
    for case in args.case.split(","):
        arch, option = case.split(":")
        rows.append(ab(arch, option, args.smoke, args.rounds, args.rep))
        if args.out:  # after every case: a later one that fails leaves the earlier ones
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, "option_ab.json").write_text(json.dumps({"command": " ".join(sys.argv[1:]), "rows": rows}, indent=1))
    print(f"{'arch':13s} {'option':12s} {'on ms':>8s} {'off ms':>8s} {'gain us':>8s}  steps on/off  err on/off")
    for r in rows:
        on, off = r["on"], r["off"]
        ms = f"{on.get('ms', float('nan')):8.3f} {off.get('ms', float('nan')):8.3f} {r.get('gain_us', float('nan')):8.1f}"
        print(f"{r['arch']:13s} {r['option']:12s} {ms}  {on['steps']}/{off['steps']}  {on['max_rel_err']:.1e}/{off['max_rel_err']:.1e}")


if __name__ == "__main__":
    main()
