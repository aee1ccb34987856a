"""What an evaluation says about a candidate: the typed `Verdict`, with every check and timing it
rests on, and the device and tools it was measured with."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from optiml.harness.nvcc import CompilerMessage

Status = Literal["ok", "compile_error", "runtime_error", "timeout", "wrong_result"]


class Mismatch(BaseModel):
    index: int
    expected: str
    got: str
    unwritten: bool = False


class BufferCheck(BaseModel):
    name: str
    mismatches: int
    unwritten: int
    max_abs_error: float | str
    max_rel_error: float | str
    first: list[Mismatch] = Field(default_factory=list)


class SeedCheck(BaseModel):
    seed: int
    buffers: list[BufferCheck]

    @property
    def ok(self) -> bool:
        return all(b.mismatches == 0 for b in self.buffers)


class TimingStats(BaseModel):
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    reps: int

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


class CaseTiming(BaseModel):
    candidate: TimingStats
    reference: TimingStats | None = None
    warmup_rounds: int
    sm_clock_mhz: list[int]
    candidate_ms: list[float] = Field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.reference is None:
            return None
        return self.reference.median_ms / self.candidate.median_ms


class KernelAttributes(BaseModel):
    """What the CUDA runtime says about the loaded kernel (cudaFuncGetAttributes, occupancy API)."""

    registers: int
    local_bytes: int
    static_smem: int
    max_threads_per_block: int
    blocks_per_sm: int


class LaunchConfig(BaseModel):
    grid: list[int]
    block: list[int]
    smem: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


class CaseResult(BaseModel):
    label: str
    launch: dict[str, LaunchConfig]  # "candidate" and "reference"
    attributes: dict[str, KernelAttributes | None] = Field(default_factory=dict)
    seeds: list[SeedCheck]
    timing: CaseTiming | None = None

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.seeds)


class DeviceInfo(BaseModel):
    name: str
    compute_capability: str
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver_version: int
    runtime_version: int
    sm_clock_idle_mhz: int


class Verdict(BaseModel):
    status: Status
    message: str
    file: str
    kernel: str
    candidate_file: str | None = None
    reference: str
    arch: str
    nvcc_version: str
    messages: list[CompilerMessage] = Field(default_factory=list)
    cases: list[CaseResult] = Field(default_factory=list)
    device: DeviceInfo | None = None
    compile_s: float = 0.0
    run_s: float = 0.0
    wall_s: float = 0.0
    date: str
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def speedup(self) -> float | None:
        """Geometric mean over the timed sizes of reference time / candidate time."""
        ratios = [c.timing.speedup for c in self.cases if c.timing and c.timing.speedup]
        if not ratios:
            return None
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
