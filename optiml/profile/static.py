"""Static feedback without a GPU: ptxas's resource usage per kernel and the theoretical occupancy
it allows for the spec's launch, with the limiter, from the architecture's published limits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from optiml.harness.nvcc import Resources

Limiter = Literal["registers", "shared_memory", "warps", "blocks"]


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one architecture (CUDA C Programming Guide, compute capabilities table)."""

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


ARCHES: dict[str, ArchLimits] = {
    a.arch: a
    for a in [
        ArchLimits("sm_70", 64, 32, 65536, 256, 255, 96 * 1024, 96 * 1024, 0, 256),
        ArchLimits("sm_75", 32, 16, 65536, 256, 255, 64 * 1024, 64 * 1024, 0, 256),
        ArchLimits("sm_80", 64, 32, 65536, 256, 255, 164 * 1024, 163 * 1024, 1024, 128),
        ArchLimits("sm_86", 48, 16, 65536, 256, 255, 100 * 1024, 99 * 1024, 1024, 128),
        ArchLimits("sm_89", 48, 24, 65536, 256, 255, 100 * 1024, 99 * 1024, 1024, 128),
        ArchLimits("sm_90", 64, 32, 65536, 256, 255, 228 * 1024, 227 * 1024, 1024, 128),
    ]
}


def limits_for(arch: str) -> ArchLimits:
    base = arch.removesuffix("a")
    if base not in ARCHES:
        raise ValueError(f"no occupancy table for {arch}; known: {', '.join(ARCHES)}")
    return ARCHES[base]


class Occupancy(BaseModel):
    threads_per_block: int
    smem_per_block: int  # static + dynamic
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # active warps / max warps
    limiter: Limiter
    limits: dict[str, int]  # blocks per SM allowed by each resource


def occupancy(arch: str, threads_per_block: int, registers: int, smem_per_block: int) -> Occupancy:
    """Theoretical occupancy of a kernel using `registers` per thread and `smem_per_block` bytes."""
    a = limits_for(arch)
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
) -> StaticReport:
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
        threads = block[0] * block[1] * block[2]
        occ = occupancy(arch, threads, r.registers, r.static_smem_bytes + (dynamic_smem or 0))
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
