"""The one `Profile` of a kernel, made from an Nsight Compute report: what the search reward, the
LLM prompt, the editor's hover and its diagnostics all read. Also the bottleneck diagnosis, with a
one-sentence explanation, and the roofline position against the device's measured ceilings.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from optiml.profile.ncu import ReportData, RuleResult

Kind = Literal[
    "dram",
    "l2",
    "l1_shared",
    "compute",
    "latency",
    "occupancy",
    "small_grid",
    "uncoalesced",
    "bank_conflicts",
    "spilling",
    "atomics",
]

# ncu's SpeedOfLight rule calls a unit "high" above 60 % of its peak; we start from the same line.
HIGH_PCT = 60.0
# Sectors per request from which a global access counts as uncoalesced when the report has no
# per-instruction excess counts: 4 is ideal for 4-byte accesses, 16 for 16-byte ones.
UNCOALESCED_SECTORS = 16.0


class Ceilings(BaseModel):
    """A device's measured ceilings (not datasheet peaks, where a measurement exists)."""

    device: str
    dram_tbps: float
    fp32_tflops: float
    source: str


CEILINGS = {
    "NVIDIA H200": Ceilings(
        device="NVIDIA H200",
        dram_tbps=4.3,
        fp32_tflops=67.0,
        source="device-to-device copy measured at ~4.3 TB/s; fp32 peak from the datasheet (no measured FMA ceiling yet)",
    ),
}


class Occupancy(BaseModel):
    achieved_pct: float | None
    theoretical_pct: float | None
    limiter: str | None  # registers | shared_memory | warps | blocks
    blocks_per_sm: dict[str, int]


class Coalescing(BaseModel):
    load_sectors_per_request: float | None
    store_sectors_per_request: float | None
    excessive_sector_fraction: float | None  # of global sectors, from SourceCounters


class Stall(BaseModel):
    reason: str
    cycles_per_issue: float  # average warps stalled on this reason per issued instruction
    share: float


class Hotspot(BaseModel):
    """One line of the user's file, with what the profiler attributed to it."""

    file: str
    line: int
    stall_samples: float = 0
    instructions: float = 0
    excessive_sectors: float = 0
    top_stall: str | None = None
    share: float = 0  # of all stall samples


class Roofline(BaseModel):
    arithmetic_intensity: float | None  # FLOP per DRAM byte
    achieved_tflops: float | None
    achieved_tbps: float | None
    ridge: float | None
    bound: Literal["memory", "compute"] | None
    fraction_of_roof: float | None


class Bottleneck(BaseModel):
    kind: Kind
    detail: str | None = None  # the pipe, the limiter, the memory unit
    explanation: str


class Profile(BaseModel):
    kernel: str
    device: str | None = None
    ncu_version: str | None = None
    section_set: str = "search"
    clock_control: str = "none"
    duration_ms: float | None
    sm_clock_mhz: float | None = None
    sol_compute_pct: float | None
    sol_memory_pct: float | None
    dram_pct: float | None
    l2_pct: float | None
    l1_pct: float | None
    dram_read_bytes: float | None
    dram_write_bytes: float | None
    dram_tbps: float | None
    flops: float | None
    registers_per_thread: float | None
    grid_blocks: float | None
    block_threads: float | None
    sm_count: float | None
    occupancy: Occupancy
    coalescing: Coalescing
    shared_bank_conflicts: float | None
    shared_wavefronts: float | None
    bank_conflict_ways: float | None = None
    local_sectors: float | None  # local-memory traffic: spills and local arrays
    global_sectors: float | None
    atomic_sectors: float | None
    pipes: dict[str, float] = Field(default_factory=dict)  # instruction issue, % of peak, per pipe
    stalls: list[Stall]
    rules: list[RuleResult] = Field(default_factory=list)
    hotspots: list[Hotspot] = Field(default_factory=list)
    roofline: Roofline
    bottleneck: Bottleneck
    wall_s: float | None = None  # the profile's own wall time
    ncu_s: float | None = None  # of which ncu ran
    read_s: float | None = None  # and reading its report back took
    passes: int | None = None  # replay passes ncu made of the kernel

    def markdown(self) -> str:
        """The hover text: the diagnosis first, then the numbers behind it."""
        b = self.bottleneck
        lines = [
            f"**{_TITLES[b.kind]}**{f' ({b.detail})' if b.detail else ''}: {b.explanation}",
            "",
        ]
        lines.append("| | |")
        lines.append("| --- | --- |")
        if self.duration_ms is not None:
            lines.append(f"| duration | {self.duration_ms:.4g} ms |")
        lines.append(
            f"| SOL compute / memory | {_pct(self.sol_compute_pct)} / {_pct(self.sol_memory_pct)} |"
        )
        lines.append(
            f"| DRAM / L2 / L1 | {_pct(self.dram_pct)} / {_pct(self.l2_pct)} / {_pct(self.l1_pct)} |"
        )
        if self.dram_tbps is not None:
            ceiling = CEILINGS.get(self.device or "")
            of = (
                f" of {ceiling.dram_tbps} TB/s measured ({self.dram_tbps / ceiling.dram_tbps:.0%})"
                if ceiling
                else ""
            )
            lines.append(f"| DRAM bandwidth | {self.dram_tbps:.2f} TB/s{of} |")
        o = self.occupancy
        lines.append(
            f"| occupancy achieved / theoretical | {_pct(o.achieved_pct)} / {_pct(o.theoretical_pct)} (limit: {o.limiter or '?'}) |"
        )
        if self.registers_per_thread is not None:
            lines.append(f"| registers / thread | {self.registers_per_thread:.0f} |")
        if self.stalls:
            lines.append(
                "| top stalls | "
                + ", ".join(f"{s.reason} {s.share:.0%}" for s in self.stalls[:3])
                + " |"
            )
        advice = [r for r in self.rules if r.type == "OPT" and r.estimated_speedup_pct]
        for r in sorted(advice, key=lambda r: -(r.estimated_speedup_pct or 0))[:2]:
            lines.append("")
            lines.append(
                f"> ncu ({r.name}, est. {r.estimated_speedup_pct:.0f} %): {r.message.split('. ')[0]}."
            )
        return "\n".join(lines)


_TITLES = {
    "dram": "DRAM-bound",
    "l2": "L2-bound",
    "l1_shared": "L1/shared-bound",
    "compute": "Compute-bound",
    "latency": "Latency-bound",
    "occupancy": "Occupancy-limited",
    "small_grid": "Small grid",
    "uncoalesced": "Uncoalesced access",
    "bank_conflicts": "Shared-memory bank conflicts",
    "spilling": "Register spilling",
    "atomics": "Atomic contention",
}


def _pct(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f} %"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def build_profile(
    data: ReportData,
    *,
    device: str | None = None,
    user_file: str | None = None,
    section_set: str = "search",
    clock_control: str = "none",
    ncu_version: str | None = None,
) -> Profile:
    """The `Profile` of one kernel's report; hotspots only for lines of `user_file`."""
    n = data.number
    duration_ns = n("gpu__time_duration.sum")
    dram_read, dram_write = n("dram__bytes_read.sum"), n("dram__bytes_write.sum")
    dram_bytes = _sum(dram_read, dram_write)
    flops = _flops(data)
    limits = {
        k: int(v)
        for k, name in (
            ("registers", "launch__occupancy_limit_registers"),
            ("shared_memory", "launch__occupancy_limit_shared_mem"),
            ("warps", "launch__occupancy_limit_warps"),
            ("blocks", "launch__occupancy_limit_blocks"),
        )
        if (v := n(name)) is not None
    }
    limiter = None
    if limits:
        low = min(limits.values())
        limiter = next(
            k for k in ("warps", "blocks", "registers", "shared_memory") if limits.get(k) == low
        )
    ld_sec, ld_req = (
        n("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
        n("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    )
    st_sec, st_req = (
        n("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"),
        n("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
    )
    red = _sum(
        n("l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum"),
        n("l1tex__t_sectors_pipe_lsu_mem_global_op_atom.sum"),
    )
    global_sectors = _sum(ld_sec, st_sec, red)
    excessive = n("derived__memory_l2_theoretical_sectors_global_excessive")
    local = _sum(
        n("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"),
        n("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"),
    )
    conflicts = _sum(
        n("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
        n("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
    )
    wavefronts = _sum(
        n("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
        n("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"),
    )
    seconds = duration_ns * 1e-9 if duration_ns else None
    ceilings = CEILINGS.get(device or "")
    profile = Profile(
        kernel=data.kernel,
        device=device,
        ncu_version=ncu_version,
        section_set=section_set,
        clock_control=clock_control,
        duration_ms=duration_ns / 1e6 if duration_ns is not None else None,
        sm_clock_mhz=(n("sm__cycles_elapsed.avg.per_second") or 0) / 1e6 or None,
        sol_compute_pct=n("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        sol_memory_pct=n("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        dram_pct=n("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        l2_pct=n("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        l1_pct=n("l1tex__throughput.avg.pct_of_peak_sustained_active"),
        dram_read_bytes=dram_read,
        dram_write_bytes=dram_write,
        dram_tbps=dram_bytes / seconds / 1e12 if dram_bytes is not None and seconds else None,
        flops=flops,
        registers_per_thread=n("launch__registers_per_thread"),
        grid_blocks=n("launch__grid_size"),
        block_threads=n("launch__block_size"),
        sm_count=n("device__attribute_multiprocessor_count"),
        occupancy=Occupancy(
            achieved_pct=n("sm__warps_active.avg.pct_of_peak_sustained_active"),
            theoretical_pct=n("sm__maximum_warps_per_active_cycle_pct"),
            limiter=limiter,
            blocks_per_sm=limits,
        ),
        coalescing=Coalescing(
            load_sectors_per_request=_ratio(ld_sec, ld_req),
            store_sectors_per_request=_ratio(st_sec, st_req),
            excessive_sector_fraction=_ratio(excessive, global_sectors),
        ),
        shared_bank_conflicts=conflicts,
        shared_wavefronts=wavefronts,
        bank_conflict_ways=_conflict_ways(data),
        local_sectors=local,
        global_sectors=global_sectors,
        atomic_sectors=red,
        pipes=_pipes(data),
        stalls=_stalls(data),
        rules=data.rules,
        hotspots=_hotspots(data, user_file),
        roofline=_roofline(flops, dram_bytes, seconds, ceilings),
        bottleneck=Bottleneck(kind="latency", explanation=""),
    )
    profile.bottleneck = diagnose(profile)
    _point_at_worst_line(profile, user_file)
    return profile


def _point_at_worst_line(p: Profile, user_file: str | None) -> None:
    """Name the line the diagnosis is about, with its text, where the profile has per-line data."""
    if not p.hotspots:
        return
    by = "excessive_sectors" if p.bottleneck.kind == "uncoalesced" else "stall_samples"
    worst = max(p.hotspots, key=lambda h: getattr(h, by))
    if not getattr(worst, by):
        return
    text = ""
    if user_file and Path(user_file).is_file():
        lines = Path(user_file).read_text(errors="replace").splitlines()
        if 0 < worst.line <= len(lines):
            text = f": `{lines[worst.line - 1].strip()[:80]}`"
    p.bottleneck.explanation += f" (worst at line {worst.line}{text})"


def _conflict_ways(data: ReportData) -> float | None:
    """How many wavefronts a shared-memory access takes on average, for the worse of loads and
    stores: 32 for a warp that hits one bank with all its lanes."""
    ways = []
    for op in ("ld", "st"):
        wf = data.number(f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum")
        conf = data.number(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum")
        if wf and conf is not None and wf > conf:
            ways.append(wf / (wf - conf))
    return max(ways) if ways else None


def _flops(data: ReportData) -> float | None:
    """FP32/FP64 operations executed (an FMA counts two), where the report has the counters."""
    cycles = data.number("smsp__cycles_elapsed.avg") or data.number("sm__cycles_elapsed.avg")
    total, found = 0.0, False
    for op, weight in (
        ("fadd", 1),
        ("fmul", 1),
        ("ffma", 2),
        ("dadd", 1),
        ("dmul", 1),
        ("dfma", 2),
    ):
        name = f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
        count = data.number(name)
        rate = data.number(name + ".per_cycle_elapsed")
        if count is None and cycles is not None and rate is not None:
            count = rate * cycles  # the full set reports the rate summed over sub-partitions
        if count is not None:
            total += weight * count
            found = True
    return total if found else None


def _stalls(data: ReportData) -> list[Stall]:
    prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    values = {
        name[len(prefix) : -len(suffix)]: v
        for name in data.metrics
        if name.startswith(prefix)
        and name.endswith(suffix)
        and (v := data.number(name)) is not None
        and v > 0
    }
    values.pop("selected", None)  # issuing, not a stall
    total = sum(values.values())
    ranked = sorted(values.items(), key=lambda kv: -kv[1])[:5]
    return (
        [Stall(reason=k, cycles_per_issue=v, share=v / total) for k, v in ranked] if total else []
    )


# Samples that do not say a line is slow: a warp issuing (selected) or ready but not picked
# (not_selected), and stores draining at the kernel's exit (drain, charged to the closing brace).
NOT_A_LINE_STALL = frozenset({"selected", "not_selected", "drain"})


def _hotspots(data: ReportData, user_file: str | None, top: int = 8) -> list[Hotspot]:
    """Per-instruction counters summed per source line, for lines of the user's file only (the
    generated launcher and the runner are not the user's code)."""
    by_line: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stall_kinds: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    target = Path(user_file).resolve() if user_file else None
    for pc in data.per_pc:
        if pc.file is None or pc.line is None or pc.line <= 0:
            continue
        if target is not None and Path(pc.file).resolve() != target:
            continue
        key = (pc.file, pc.line)
        for name, value in pc.counters.items():
            if name.startswith("smsp__pcsamp_warps_issue_stalled_"):
                reason = name.removeprefix("smsp__pcsamp_warps_issue_stalled_")
                if reason.endswith("_not_issued") or reason in NOT_A_LINE_STALL:
                    continue
                by_line[key]["stall_samples"] += value
                stall_kinds[key][reason] += value
            elif name == "inst_executed":
                by_line[key]["instructions"] += value
            elif name == "memory_l2_theoretical_sectors_global_excessive":
                by_line[key]["excessive_sectors"] += value
            elif name == "memory_l2_theoretical_sectors_global":
                by_line[key]["global_sectors"] += value
            elif name == "memory_l2_theoretical_sectors_global_ideal":
                by_line[key]["ideal_sectors"] += value
    total = sum(v["stall_samples"] for v in by_line.values()) or 1.0
    spots = [
        Hotspot(
            file=file,
            line=line,
            stall_samples=v["stall_samples"],
            instructions=v["instructions"],
            excessive_sectors=v["excessive_sectors"]
            or max(v["global_sectors"] - v["ideal_sectors"], 0),
            top_stall=max(stall_kinds[(file, line)], key=stall_kinds[(file, line)].get)
            if stall_kinds[(file, line)]
            else None,
            share=v["stall_samples"] / total,
        )
        for (file, line), v in by_line.items()
    ]
    spots.sort(key=lambda h: (-h.stall_samples, -h.excessive_sectors, -h.instructions))
    return spots[:top]


def _roofline(flops, dram_bytes, seconds, ceilings: Ceilings | None) -> Roofline:
    ai = flops / dram_bytes if flops is not None and dram_bytes else None
    tflops = flops / seconds / 1e12 if flops is not None and seconds else None
    tbps = dram_bytes / seconds / 1e12 if dram_bytes is not None and seconds else None
    if ceilings is None or ai is None:
        return Roofline(
            arithmetic_intensity=ai,
            achieved_tflops=tflops,
            achieved_tbps=tbps,
            ridge=None,
            bound=None,
            fraction_of_roof=None,
        )
    ridge = ceilings.fp32_tflops / ceilings.dram_tbps
    bound = "memory" if ai < ridge else "compute"
    roof = min(ceilings.fp32_tflops, ai * ceilings.dram_tbps)
    return Roofline(
        arithmetic_intensity=ai,
        achieved_tflops=tflops,
        achieved_tbps=tbps,
        ridge=ridge,
        bound=bound,
        fraction_of_roof=(tflops / roof) if tflops is not None and roof else None,
    )


def diagnose(p: Profile) -> Bottleneck:
    """The bottleneck, most specific evidence first; each with a sentence a CUDA developer would
    agree with, built from the numbers that decided it."""
    sol_c, sol_m = p.sol_compute_pct or 0, p.sol_memory_pct or 0
    top_stall = p.stalls[0].reason if p.stalls else None
    if p.grid_blocks is not None and p.sm_count and p.grid_blocks < p.sm_count / 2:
        return Bottleneck(
            kind="small_grid",
            explanation=f"the grid has {p.grid_blocks:.0f} blocks for {p.sm_count:.0f} SMs, so most SMs are idle; give each block less work and launch more of them",
        )
    if (
        p.local_sectors
        and p.global_sectors is not None
        and p.local_sectors > 0.05 * (p.global_sectors + p.local_sectors)
    ):
        share = p.local_sectors / (p.global_sectors + p.local_sectors)
        return Bottleneck(
            kind="spilling",
            detail=f"{p.registers_per_thread:.0f} registers" if p.registers_per_thread else None,
            explanation=f"{share:.0%} of the memory sectors are local-memory traffic: registers spill (or a per-thread array lives in local memory)",
        )
    if (
        p.shared_bank_conflicts
        and p.shared_wavefronts
        and p.shared_bank_conflicts > 0.5 * p.shared_wavefronts
    ):
        ways = p.bank_conflict_ways or p.shared_wavefronts / max(
            p.shared_wavefronts - p.shared_bank_conflicts, 1
        )
        return Bottleneck(
            kind="bank_conflicts",
            explanation=f"{p.shared_bank_conflicts / p.shared_wavefronts:.0%} of shared-memory wavefronts are bank conflicts (about {ways:.0f}-way): pad the shared array by one element per row or swizzle",
        )
    c = p.coalescing
    worst = max(
        ("loads", c.load_sectors_per_request or 0),
        ("stores", c.store_sectors_per_request or 0),
        key=lambda kv: kv[1],
    )
    frac = c.excessive_sector_fraction
    # Excess sectors are a source counter (the full set); without them, a request that touches
    # 16 or more 32-byte sectors (a warp's 4-byte accesses spread over 16+ lines) says the same.
    spread = frac > 0.3 if frac is not None else worst[1] >= UNCOALESCED_SECTORS
    if spread and sol_m > 30:
        excess = f" and {frac:.0%} of all global sectors are excess" if frac is not None else ""
        return Bottleneck(
            kind="uncoalesced",
            detail=worst[0],
            explanation=f"global {worst[0]} use {worst[1]:.1f} sectors per request{excess}: neighbouring threads do not touch neighbouring addresses",
        )
    if (
        p.atomic_sectors
        and p.global_sectors
        and p.atomic_sectors > 0.2 * p.global_sectors
        and max(sol_c, sol_m) < HIGH_PCT
    ):
        return Bottleneck(
            kind="atomics",
            explanation=f"{p.atomic_sectors / p.global_sectors:.0%} of global sectors are atomics and neither compute ({sol_c:.0f} %) nor memory ({sol_m:.0f} %) is busy: the atomics serialize on few addresses; privatize per block and combine once",
        )
    units = {"dram": p.dram_pct or 0, "l2": p.l2_pct or 0, "l1_shared": p.l1_pct or 0}
    # ncu's memory throughput is the headline of one unit; L2 also carries all DRAM traffic, so
    # the unit that sets the headline, not the numerically largest, is the one that limits.
    busiest = min(units, key=lambda u: abs(units[u] - sol_m))
    if max(sol_c, sol_m) >= HIGH_PCT:
        if sol_m >= sol_c:
            names = {"dram": "DRAM", "l2": "L2", "l1_shared": "L1/shared"}
            bw = f" ({p.dram_tbps:.2f} TB/s)" if busiest == "dram" and p.dram_tbps else ""
            return Bottleneck(
                kind=busiest,
                explanation=f"{names[busiest]} throughput is at {units[busiest]:.0f} % of peak{bw}, the busiest unit; compute is at {sol_c:.0f} %",
            )
        pipe = _busiest_pipe(p)
        return Bottleneck(
            kind="compute",
            detail=pipe,
            explanation=f"the SMs are at {sol_c:.0f} % of peak{f', mostly the {pipe} pipe' if pipe else ''}; memory is at {sol_m:.0f} %",
        )
    o = p.occupancy
    if (
        o.theoretical_pct is not None
        and o.theoretical_pct < 50
        and top_stall in ("long_scoreboard", "short_scoreboard", "wait", "barrier")
    ):
        return Bottleneck(
            kind="occupancy",
            detail=o.limiter,
            explanation=f"theoretical occupancy is {o.theoretical_pct:.0f} %, limited by {(o.limiter or '?').replace('_', ' ')}, and warps wait on {top_stall.replace('_', ' ')}: too few warps to hide the latency",
        )
    # Memory-bound by the roofline where FLOPs were counted (the full set). The search set counts
    # none: there DRAM, the busiest memory unit at 40 % or more with neither SOL high, says it (the
    # SM's SOL counts address arithmetic too, so compute's share above memory's does not say
    # otherwise: an elementwise 2-D scale has 48 % against 46 %).
    ai = p.roofline.arithmetic_intensity
    memory_bound = p.roofline.bound == "memory" or (p.roofline.bound is None and ai is None)
    if memory_bound and busiest == "dram" and (p.dram_pct or 0) >= 40:
        intensity = f" (intensity {ai:.2f} FLOP/B)" if ai is not None else ""
        return Bottleneck(
            kind="dram",
            explanation=f"a memory-bound kernel{intensity} reaching {p.dram_pct:.0f} % of DRAM peak: too few bytes in flight; wider loads or more work per thread",
        )
    return Bottleneck(
        kind="latency",
        explanation=f"neither compute ({sol_c:.0f} %) nor memory ({sol_m:.0f} %) is busy; warps mostly wait on {(top_stall or 'dependencies').replace('_', ' ')}",
    )


def _pipes(data: ReportData) -> dict[str, float]:
    prefix, suffix = "sm__inst_executed_pipe_", ".avg.pct_of_peak_sustained_active"
    return {
        name[len(prefix) : -len(suffix)]: v
        for name in data.metrics
        if name.startswith(prefix) and name.endswith(suffix) and (v := data.number(name))
    }


def _busiest_pipe(p: Profile) -> str | None:
    return max(p.pipes, key=p.pipes.get) if p.pipes else None
