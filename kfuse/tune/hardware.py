"""What the tuner needs to know about a GPU: SM count, shared memory, registers, L2.

A table of the data-center GPUs kfuse targets (H100, H200, A100) and a query of the live
device that fills in what the driver reports and falls back on the table for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Hardware:
    name: str
    sm: int  # compute capability as 90, 80, ...
    num_sms: int
    smem_per_block: int  # bytes, the opt-in maximum a kernel may request
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_sm: int = 2048
    l2_bytes: int = 50 * 1024 * 1024
    peak_tflops_fp16: float = 790.0  # dense, as measured / specified
    mem_bw_gbs: float = 4300.0

    @property
    def has_wgmma(self) -> bool:
        return self.sm >= 90

    def key(self) -> str:
        """The name tuning records are filed under (records do not transfer across GPUs)."""
        return self.name


def programs_per_sm(regs: int, shared: int, num_warps: int, hw: Hardware | None = None) -> int:
    """Programs of one kernel resident on an SM at once, from its registers a thread (allocated in
    units of 8), shared memory per program and warps. 0 when one program does not fit."""
    hw = hw or DEFAULT
    per_program_regs = ((max(regs, 1) + 7) // 8 * 8) * 32 * num_warps
    return max(0, min(hw.regs_per_sm // per_program_regs, hw.smem_per_block // max(shared, 1), hw.max_threads_per_sm // (32 * num_warps)))


TABLE: dict[str, Hardware] = {
    "H200": Hardware("NVIDIA H200", 90, 132, 232448, l2_bytes=60 * 1024 * 1024, peak_tflops_fp16=790.0, mem_bw_gbs=4300.0),
    "H100": Hardware("NVIDIA H100 80GB HBM3", 90, 132, 232448, l2_bytes=50 * 1024 * 1024, peak_tflops_fp16=760.0, mem_bw_gbs=3000.0),
    "A100": Hardware("NVIDIA A100-SXM4-80GB", 80, 108, 166912, l2_bytes=40 * 1024 * 1024, peak_tflops_fp16=300.0, mem_bw_gbs=1800.0),
}

DEFAULT = TABLE["H200"]


def lookup(name: str) -> Hardware:
    """The table entry whose key appears in ``name`` (e.g. "NVIDIA H200" -> H200)."""
    up = name.upper()
    for key, hw in TABLE.items():
        if key in up:
            return replace(hw, name=name)
    raise KeyError(f"no hardware entry for {name!r}; known: {', '.join(TABLE)}")


def query(device: torch.device | str | None = None) -> Hardware:
    """The live device when there is one (driver values win over the table), else the H200
    entry (CPU tests, CPU devices and offline planning target the benchmark GPU)."""
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return DEFAULT
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    p = torch.cuda.get_device_properties(dev)
    try:
        base = lookup(p.name)
    except KeyError:
        base = Hardware(p.name, p.major * 10 + p.minor, p.multi_processor_count, 99 * 1024)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or base.smem_per_block
    regs = getattr(p, "regs_per_multiprocessor", 0) or base.regs_per_sm
    l2 = getattr(p, "L2_cache_size", 0) or base.l2_bytes
    sm = p.major * 10 + p.minor
    return replace(base, name=p.name, sm=sm, num_sms=p.multi_processor_count, smem_per_block=smem, regs_per_sm=regs, l2_bytes=l2)
