"""Static feedback without a GPU: ptxas's resource usage per kernel and the theoretical occupancy
it allows for the spec's launch, with the limiter, from the architecture's published limits — or,
where this machine's GPU is the target, from the limits its CUDA runtime reports."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from optiml.harness.nvcc import Resources

Limiter = Literal["registers", "shared_memory", "warps", "blocks"]


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one architecture."""

    arch: str
    max_warps: int
    max_blocks: int
    registers: int  # per SM
    register_unit: int  # registers are allocated per warp in units of this many
    max_registers_per_thread: int
    smem_per_sm: int  # the largest carveout, bytes
    smem_per_block_optin: int
    smem_reserved_per_block: int
    smem_unit: int
    sub_partitions: int = 4


# Where the numbers come from:
# - warps and blocks per SM, registers per SM and per thread, shared memory per SM (the largest
#   carveout) and per block (opt-in): the CUDA Programming Guide, "Compute Capabilities",
#   Table 30 (device and SM information) and Table 31 (memory information), columns 7.5 to 12.x
#   (docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html);
# - sm_88, which that table does not list: the same as sm_86 in NVIDIA's own CCCL
#   (libcudacxx/include/cuda/__device/arch_traits.h, `arch_traits<arch_id::sm_88>`), and the same
#   block limit (16) and carveouts (up to 100 KB) in the CUDA 13.0 occupancy calculator header;
# - shared memory reserved per block (1 KB from 8.0 on): CCCL's
#   `reserved_shared_memory_per_block`, and the Guide's per-block figures, 1 KB under per-SM;
# - allocation units — registers 256 per warp, shared memory 256 bytes on 7.x and 128 from 8.0 on —
#   and 4 sub-partitions: cudaOccRegAllocationGranularity, cudaOccSMemAllocationGranularity and
#   cudaOccSubPartitionsPerMultiprocessor in cuda_occupancy.h (CUDA 13.0). sm_70 (Volta), which
#   nvcc 13 no longer targets, is kept for older toolkits.
KB = 1024
ARCHES: dict[str, ArchLimits] = {
    a.arch: a
    for a in [
        ArchLimits("sm_70", 64, 32, 65536, 256, 255, 96 * KB, 96 * KB, 0, 256),
        ArchLimits("sm_75", 32, 16, 65536, 256, 255, 64 * KB, 64 * KB, 0, 256),
        ArchLimits("sm_80", 64, 32, 65536, 256, 255, 164 * KB, 163 * KB, KB, 128),
        ArchLimits("sm_86", 48, 16, 65536, 256, 255, 100 * KB, 99 * KB, KB, 128),
        ArchLimits("sm_87", 48, 16, 65536, 256, 255, 164 * KB, 163 * KB, KB, 128),
        ArchLimits("sm_88", 48, 16, 65536, 256, 255, 100 * KB, 99 * KB, KB, 128),
        ArchLimits("sm_89", 48, 24, 65536, 256, 255, 100 * KB, 99 * KB, KB, 128),
        ArchLimits("sm_90", 64, 32, 65536, 256, 255, 228 * KB, 227 * KB, KB, 128),
        ArchLimits("sm_100", 64, 32, 65536, 256, 255, 228 * KB, 227 * KB, KB, 128),
        ArchLimits("sm_103", 64, 32, 65536, 256, 255, 228 * KB, 227 * KB, KB, 128),
        ArchLimits("sm_110", 48, 24, 65536, 256, 255, 228 * KB, 227 * KB, KB, 128),
        ArchLimits("sm_120", 48, 24, 65536, 256, 255, 100 * KB, 99 * KB, KB, 128),
        ArchLimits("sm_121", 48, 24, 65536, 256, 255, 100 * KB, 99 * KB, KB, 128),
    ]
}


def _number(arch: str) -> int:
    m = re.fullmatch(r"sm_([0-9]+)[af]?", arch)
    return int(m.group(1)) if m else 0


def table_for(arch: str, device: dict | None = None) -> tuple[ArchLimits, str | None]:
    """The limits of `arch` (`sm_90a` and `sm_100f` are those of `sm_90` and `sm_100`), and a
    note where the table has no row for it: an architecture newer than the table gets the nearest
    older row, never an error. `device`: a GPU's limits as the CUDA runtime gives them
    (`optiml.harness.device.gpu_limits`); where its architecture is `arch`, they are the limits
    (the table gives only the allocation units), whatever the table says."""
    base = f"sm_{_number(arch)}"
    if device is not None and device.get("arch") == base:
        return _from_device(device, table_for(arch)[0]), None
    if base in ARCHES:
        return ARCHES[base], None
    older = [a for a in ARCHES.values() if _number(a.arch) < _number(arch)]
    lowest = min(ARCHES.values(), key=lambda a: _number(a.arch))
    chosen = max(older, key=lambda a: _number(a.arch)) if older else lowest
    return chosen, (
        f"no occupancy table for {arch}: the occupancy shown uses {chosen.arch}'s limits"
    )


def _from_device(d: dict, units: ArchLimits) -> ArchLimits:
    return ArchLimits(
        arch=d["arch"],
        max_warps=d["max_threads_per_sm"] // 32,
        max_blocks=d["max_blocks_per_sm"],
        registers=d["registers_per_sm"],
        register_unit=units.register_unit,
        max_registers_per_thread=units.max_registers_per_thread,
        smem_per_sm=d["smem_per_sm"],
        smem_per_block_optin=d["smem_per_block_optin"],
        smem_reserved_per_block=d["smem_reserved_per_block"],
        smem_unit=units.smem_unit,
        sub_partitions=units.sub_partitions,
    )


def limits_for(arch: str, device: dict | None = None) -> ArchLimits:
    return table_for(arch, device)[0]


class Occupancy(BaseModel):
    threads_per_block: int
    smem_per_block: int  # static + dynamic
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # active warps / max warps
    limiter: Limiter
    limits: dict[str, int]  # blocks per SM allowed by each resource


def occupancy(
    arch: str,
    threads_per_block: int,
    registers: int,
    smem_per_block: int,
    device: dict | None = None,
) -> Occupancy:
    """Theoretical occupancy of a kernel using `registers` per thread and `smem_per_block` bytes
    (with a GPU's own limits, `device`, where it is the target)."""
    a = limits_for(arch, device)
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / a.register_unit) * a.register_unit
    # Registers are split across the SM's sub-partitions; a warp lives in one of them.
    warps_by_regs = (a.registers // a.sub_partitions // regs_per_warp) * a.sub_partitions
    smem = smem_per_block + a.smem_reserved_per_block
    smem = math.ceil(smem / a.smem_unit) * a.smem_unit
    limits = {
        "registers": warps_by_regs // warps if registers > 0 else a.max_blocks,
        "shared_memory": a.smem_per_sm // smem if smem_per_block > 0 else a.max_blocks,
        "warps": a.max_warps // warps,
        "blocks": a.max_blocks,
    }
    if registers > a.max_registers_per_thread:
        limits["registers"] = 0
    if smem_per_block > a.smem_per_block_optin:
        limits["shared_memory"] = 0
    blocks = min(limits.values())
    # On a tie the hardware's own ceiling (warps, blocks) is named: a kernel at full occupancy is
    # not "limited by registers" in any sense a developer acts on.
    order: list[Limiter] = ["warps", "blocks", "registers", "shared_memory"]
    limiter = next(k for k in order if limits[k] == blocks)
    return Occupancy(
        threads_per_block=threads_per_block,
        smem_per_block=smem_per_block,
        blocks_per_sm=blocks,
        warps_per_sm=blocks * warps,
        occupancy=blocks * warps / a.max_warps,
        limiter=limiter,
        limits=limits,
    )


class StaticReport(BaseModel):
    """What `optiml check` says about one kernel."""

    kernel: str
    mangled: str
    arch: str
    resources: Resources
    block: tuple[int, int, int] | None = None
    dynamic_smem: int | None = None
    occupancy: Occupancy | None = None
    notes: list[str]


def static_report(
    kernel: str,
    arch: str,
    r: Resources,
    block: tuple[int, int, int] | None,
    dynamic_smem: int | None,
    device: dict | None = None,
) -> StaticReport:
    """`device`: this machine's GPU's limits (`gpu_limits`), used where it is the target."""
    notes = []
    if r.spill_store_bytes or r.spill_load_bytes:
        notes.append(
            f"spills: {r.spill_store_bytes} bytes stored and {r.spill_load_bytes} loaded from local memory per thread"
        )
    elif r.stack_bytes:
        notes.append(
            f"{r.stack_bytes}-byte stack frame: a local array or a call that was not inlined"
        )
    occ = None
    if block is not None:
        _, fallback = table_for(arch, device)
        if fallback:
            notes.append(fallback)
        threads = block[0] * block[1] * block[2]
        smem = r.static_smem_bytes + (dynamic_smem or 0)
        occ = occupancy(arch, threads, r.registers, smem, device)
        if occ.blocks_per_sm == 0:
            notes.append(
                "the launch does not fit on one SM: too many registers or too much shared memory"
            )
        elif occ.occupancy < 0.5:
            notes.append(
                f"theoretical occupancy {occ.occupancy:.0%}, limited by {occ.limiter.replace('_', ' ')}"
            )
    return StaticReport(
        kernel=kernel,
        mangled=r.mangled,
        arch=arch,
        resources=r,
        block=block,
        dynamic_smem=dynamic_smem,
        occupancy=occ,
        notes=notes,
    )
