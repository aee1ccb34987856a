"""What an evaluation says about a candidate: the typed `Verdict`, with every check and timing it
rests on, the check that decided it, and the device and tools it was measured with."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from optiml.errors import ExitCode
from optiml.harness.nvcc import CompilerMessage

Status = Literal[
    "ok",
    "compile_error",
    "forbidden_code",
    "runtime_error",
    "timeout",
    "wrong_result",
    "modified_input",
    "below_floor",
]

# The exit code of `optiml eval` for each status (and of `optiml optimize` for an input that does
# not pass its own checks).
STATUS_EXIT: dict[str, ExitCode] = {
    "ok": ExitCode.OK,
    "compile_error": ExitCode.COMPILE_ERROR,
    "forbidden_code": ExitCode.FORBIDDEN_CODE,
    "runtime_error": ExitCode.RUNTIME_ERROR,
    "timeout": ExitCode.TIMEOUT,
    "wrong_result": ExitCode.WRONG_RESULT,
    "modified_input": ExitCode.MODIFIED_INPUT,
    "below_floor": ExitCode.BELOW_FLOOR,
}


class Mismatch(BaseModel):
    index: int
    expected: str
    got: str
    unwritten: bool = False


class OracleCheck(BaseModel):
    """Errors against the reference promoted to double, in units of the tolerance (|x - exact| /
    (atol + rtol |exact|), the largest over the buffer): a candidate outside the tolerance of the
    reference is still correct where it is within the tolerance of the exact result, or, where
    the reference itself is not (the tolerance is more than float reaches on these inputs),
    within four times the reference's error (values.h's `within_exact_error`). Failing both,
    `conditioned` is the candidate's error against the tolerance widened, element by element, by
    how far the exact result itself moves when the inputs move by a few units in the last place
    of float (a sign, a comparison or a rounding of a value within rounding of its edge): the
    candidate is accepted where that is at most 1, since no float computation can be held to
    more."""

    candidate: float | str
    reference: float | str
    conditioned: float | str | None = None
    accepted: bool


class BufferCheck(BaseModel):
    name: str
    mismatches: int
    unwritten: int
    skipped: int = 0  # elements the reference left non-finite, not compared (lenient cases)
    max_abs_error: float | str
    max_rel_error: float | str
    need_atol: float | str = 0.0  # the tolerance the mismatches would have needed
    need_rtol: float | str = 0.0
    oracle: OracleCheck | None = None
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


class FirstBad(BaseModel):
    launch: int
    buffer: str
    index: int
    near_repeat: bool = False  # on the previous launch's inputs with one element changed


class CaseTiming(BaseModel):
    candidate: TimingStats
    reference: TimingStats | None = None
    warmup_rounds: int
    sm_clock_mhz: list[int]
    # timed by its first round alone: far slower than its reference (`EvalOptions.give_up`)
    coarse: bool = False
    # the reference's time is one measured before (`EvalOptions.reference_ms`), not beside it
    reference_before: bool = False
    candidate_ms: list[float] = Field(default_factory=list)
    fresh_inputs: bool = False  # each timed launch had inputs of its own, from a per-run seed
    checked_launches: int = 0  # timed launches whose outputs and inputs were checked
    near_repeats: int = 0  # of those, on the previous launch's inputs with one element changed
    compared: bool = False  # outputs compared (not when a kernel is timed against itself)
    mismatches: int = 0
    unwritten: int = 0
    first_bad: FirstBad | None = None

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


class Dependence(BaseModel):
    """Of `samples` elements of an input, how many the candidate's outputs changed with."""

    buffer: str
    samples: int
    sensitive: int


class InputChange(BaseModel):
    buffer: str
    when: str


class GuardViolation(BaseModel):
    buffer: str
    bytes: int
    when: str


class Floor(BaseModel):
    """The least time the case's work can take on the device: the bytes it must move over the
    device's measured bandwidth ceiling (with an allowance)."""

    bytes: int
    ms: float
    ceiling_gbs: float


class CaseResult(BaseModel):
    label: str
    launch: dict[str, LaunchConfig]  # "candidate" and "reference"
    attributes: dict[str, KernelAttributes | None] = Field(default_factory=dict)
    seeds: list[SeedCheck]
    timing: CaseTiming | None = None
    dependence: list[Dependence] = Field(default_factory=list)
    input_changes: list[InputChange] = Field(default_factory=list)
    guard_violations: list[GuardViolation] = Field(default_factory=list)
    floor: Floor | None = None

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.seeds)

    @property
    def reads_probed(self) -> bool:
        """Whether its inputs' reads were probed: not where the runner made no dependence probes
        (a launch slower than any floor, which the probes could only have lowered a bound under):
        its floor then counts no reads, too low to compare its work with another case's."""
        return all(d.samples > 0 for d in self.dependence)


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
    check: str = ""  # the check that decided it (for `ok`: what it passed)
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
    # where an executor ran it: from the request to the candidate's build done (its nvcc time and
    # any wait for a compile worker), and then the wait for a free GPU
    build_s: float | None = None
    gpu_wait_s: float | None = None
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
