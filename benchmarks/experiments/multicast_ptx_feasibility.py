"""Can a Gluon 3.6 kernel load by TMA multicast across a 2-CTA cluster? Offline check of a PTX-patch route.

cuBLAS's GEMMs on the H200 multicast the shared operand to a 2-CTA cluster (session 19,
``cublas_kernel_names.py``), which cuts their L2 bytes (session 20: kfuse's 192 x 128 tiles move 1.35x
cuBLAS's), and under the power cap bytes cost clock. Gluon 3.6's TMA lowering has no multicast ("NYI:
Support multicast" in libtriton). This script checks, without a GPU, that everything else a multicast
ping-pong kernel needs is reachable:

- from Gluon itself: the CTA's rank in its cluster (``%cluster_ctarank`` by inline asm), a cluster
  barrier (inline asm), a TMA load predicated on the rank, and a marker for a remote arrive (an
  ``mbarrier.arrive`` with count 2, which Triton emits as ``mbarrier.arrive.shared::cta.b64 _, [r], 2``);
- by patching the PTX: ``.reqnctapercluster 2, 1, 1`` on the entry, ``.multicast::cluster`` with a CTA
  mask on the TMA load, and the marker arrive turned into ``mapa`` + an arrive on the peer CTA's barrier;
- and that Triton's bundled ptxas assembles the result for sm_90a into UTMALDG.2D.MULTICAST, the
  cluster barrier (UCGABAR_ARV / UCGABAR_WAIT), a remote SYNCS arrive and the cubin's
  EIATTR_CTA_PER_CLUSTER.

Session 21: all of it assembles. The ``release.cluster`` arrive costs a MEMBAR.ALL.GPU before it (two
in the SASS against one, the cluster barrier's); the plain ``shared::cluster`` arrive (CUTLASS's form)
does not. Not built into
kfuse's GEMM: the expected gain is small (the multicast would take 192 x 128's L2 reads to about cuBLAS's,
and session 20's variants between 0.75 and 0.97 GB of L2 traffic ran within 1.536-1.563 GHz of each
other), and a 2-CTA schedule needs every tile pair in lockstep and cluster barriers around Triton's warp
specialisation (docs/perf-notes.md, "Session 21").

    python benchmarks/experiments/multicast_ptx_feasibility.py   # CPU, ~10 s
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

CHECKS = ("UTMALDG.2D.MULTICAST", "UCGABAR_ARV", "UCGABAR_WAIT", "SYNCS.ARRIVE.TRANS64.RED", "MEMBAR.ALL.GPU")


def gluon_ptx() -> str:
    """A one-warp Gluon kernel with the pieces a multicast GEMM needs, compiled for sm_90 offline."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    @gluon.jit
    def probe(desc, out_ptr):
        bufs = gl.allocate_shared_memory(desc.dtype, [2] + desc.block_type.shape, desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar.index(0), count=1)
        mbarrier.init(bar.index(1), count=2)
        rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)
        gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
        mbarrier.expect(bar.index(0), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [0, 0], bar.index(0), bufs.index(0), pred=rank == 0)
        mbarrier.wait(bar.index(0), 0)
        mbarrier.arrive(bar.index(1), count=2)  # the marker the patch turns into a remote arrive
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
        x = bufs.index(0).load(layout)
        offs = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        gl.store(out_ptr + offs, gl.sum(x.to(gl.float32), axis=1))

    t = torch.empty((256, 64), dtype=torch.float16)
    d = TensorDescriptor.from_tensor(t, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16))
    ck = triton.compile(GluonASTSource(probe, {"desc": mangle_type(d), "out_ptr": "*fp32"}, {}), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 1})  # fmt: skip
    return ck.asm["ptx"]


def patch(ptx: str, release: bool) -> tuple[str, int, int]:
    """The cluster shape, the multicast TMA load and the remote arrive; returns (ptx, loads, arrives)."""
    ptx = re.sub(r"(\.reqntid \d+)", r"\1\n.reqnctapercluster 2, 1, 1", ptx, count=1)
    body = ptx.index("{", ptx.index(".visible .entry"))
    regs = ("\n\t.reg .b16 %kf_mask;\n\t.reg .b32 %kf_rank, %kf_peer, %kf_remote;\n\tmov.b16 %kf_mask, 3;"
            "\n\tmov.u32 %kf_rank, %cluster_ctarank;\n\txor.b32 %kf_peer, %kf_rank, 1;\n")  # fmt: skip
    ptx = ptx[: body + 1] + regs + ptx[body + 1 :]
    load = r"(cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes)( \[[^\]]+\], \[[^\]]+\], \[[^\]]+\]);"
    ptx, loads = re.subn(load, r"\1.multicast::cluster\2, %kf_mask;", ptx)
    sem = ".release.cluster" if release else ""

    def remote(m: re.Match) -> str:
        pred = m.group(1) or ""
        mapa = f"mapa.shared::cluster.u32 %kf_remote, {m.group(2)}, %kf_peer;"
        return f"{mapa}\n\t{pred}mbarrier.arrive{sem}.shared::cluster.b64 _, [%kf_remote];"

    ptx, arrives = re.subn(r"(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\], 2;", remote, ptx)
    return ptx, loads, arrives


def main() -> None:
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptx = gluon_ptx()
    for release in (True, False):
        patched, loads, arrives = patch(ptx, release)
        with tempfile.TemporaryDirectory() as d:
            src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
            with open(src, "w") as f:
                f.write(patched)
            r = subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90a", src, "-o", cubin], capture_output=True, text=True)
            if r.returncode:
                print(f"ptxas failed: {r.stderr[-1500:]}")
                continue
            sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout
            elf = subprocess.run([os.path.join(tools, "cuobjdump"), "-elf", cubin], capture_output=True, text=True).stdout
        found = {c: sass.count(c) for c in CHECKS}
        print(f"arrive {'release.cluster' if release else 'shared::cluster'}: patched {loads} TMA load(s), {arrives} arrive(s); "
              f"SASS {found}; EIATTR_CTA_PER_CLUSTER {'EIATTR_CTA_PER_CLUSTER' in elf}")  # fmt: skip


if __name__ == "__main__":
    main()
