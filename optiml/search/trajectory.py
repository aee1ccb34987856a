"""The record of a search, shared by the CLI, the report and the editor: every node's edit, code,
verdict, timings, profile summary and reward; the confirmed winner; the judge's verdict. Plain
pydantic models, written as JSON next to the report."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from optiml.harness.verdict import Status, Verdict
from optiml.profile.model import Profile


class Edit(BaseModel):
    """An action of the search: a catalog transformation with its parameters, or an LLM's edit."""

    transform: str
    params: dict[str, Any] = Field(default_factory=dict)
    summary: str
    origin: Literal["catalog", "llm"] = "catalog"
    digest: str | None = None  # for an LLM edit: the hash of the code it proposes

    @property
    def key(self) -> str:
        if self.digest:
            return f"{self.transform}:{self.digest}"
        return f"{self.transform}:{json.dumps(self.params, sort_keys=True)}"

    @staticmethod
    def digest_of(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class ProfileSummary(BaseModel):
    """What the search, the prompt and the report keep of a `Profile`."""

    bottleneck: str
    detail: str | None = None
    explanation: str
    duration_ms: float | None = None
    dram_tbps: float | None = None
    dram_bytes: float | None = None
    sol_compute_pct: float | None = None
    sol_memory_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    limiter: str | None = None
    registers_per_thread: float | None = None
    local_sectors: float | None = None
    top_stalls: list[str] = Field(default_factory=list)
    advice: list[str] = Field(default_factory=list)  # ncu's rule messages, as hypotheses
    # the size it was profiled at where not the spec's first (a slow input's smallest), e.g.
    # "B=3, L=4099"
    size: str | None = None

    @classmethod
    def of(cls, p: Profile) -> ProfileSummary:
        dram = (
            (p.dram_read_bytes or 0) + (p.dram_write_bytes or 0)
            if p.dram_read_bytes is not None or p.dram_write_bytes is not None
            else None
        )
        advice = [
            f"{r.name}: {r.message.split('. ')[0]}"
            for r in sorted(p.rules, key=lambda r: -(r.estimated_speedup_pct or 0))
            if r.type == "OPT"
        ][:3]
        return cls(
            bottleneck=p.bottleneck.kind,
            detail=p.bottleneck.detail,
            explanation=p.bottleneck.explanation,
            duration_ms=p.duration_ms,
            dram_tbps=p.dram_tbps,
            dram_bytes=dram,
            sol_compute_pct=p.sol_compute_pct,
            sol_memory_pct=p.sol_memory_pct,
            achieved_occupancy_pct=p.occupancy.achieved_pct,
            theoretical_occupancy_pct=p.occupancy.theoretical_pct,
            limiter=p.occupancy.limiter,
            registers_per_thread=p.registers_per_thread,
            local_sectors=p.local_sectors,
            top_stalls=[s.reason for s in p.stalls[:3]],
            advice=advice,
        )

    def text(self) -> str:
        """A few lines for a prompt or a tooltip."""
        parts = [f"bottleneck: {self.bottleneck} — {self.explanation}"]
        if self.sol_compute_pct is not None and self.sol_memory_pct is not None:
            parts.append(
                f"SOL compute {self.sol_compute_pct:.0f} %, memory {self.sol_memory_pct:.0f} %"
            )
        if self.dram_tbps is not None:
            parts.append(f"DRAM {self.dram_tbps:.2f} TB/s")
        if self.achieved_occupancy_pct is not None:
            parts.append(
                f"occupancy {self.achieved_occupancy_pct:.0f} % achieved, "
                f"{self.theoretical_occupancy_pct or 0:.0f} % theoretical (limit {self.limiter})"
            )
        if self.registers_per_thread:
            parts.append(f"{self.registers_per_thread:.0f} registers/thread")
        if self.top_stalls:
            parts.append("top stalls: " + ", ".join(self.top_stalls))
        parts += [f"ncu hint: {a}" for a in self.advice]
        return "\n".join(parts)


class Measurement(BaseModel):
    """What one evaluation of a variant gave, at the first problem size where timed."""

    status: Status
    message: str
    speedup: float | None = None
    candidate_ms: float | None = None
    reference_ms: float | None = None
    candidate_iqr_ms: float | None = None
    reference_iqr_ms: float | None = None
    registers: int | None = None
    local_bytes: int | None = None
    blocks_per_sm: int | None = None
    profile: ProfileSummary | None = None
    compile_s: float = 0.0
    run_s: float = 0.0
    profile_s: float = 0.0
    # the executor's: request to build done (nvcc and any wait for a compile worker), then the
    # wait for a free GPU (None where the executor does not say)
    build_s: float | None = None
    gpu_wait_s: float | None = None
    # seconds into the optimize run at which the search's evaluation began (asked the executor),
    # its verdict came in, and it ended (profiled or not): with 8 in flight, where each waited
    started_s: float | None = None
    verdict_s: float | None = None
    ended_s: float | None = None
    device: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None

    @classmethod
    def of(cls, v: Verdict) -> Measurement:
        m = cls(
            status=v.status,
            message=v.message,
            compile_s=v.compile_s,
            run_s=v.run_s,
            build_s=v.build_s,
            gpu_wait_s=v.gpu_wait_s,
        )
        if v.device is not None:
            m.device, m.sm_count = v.device.name, v.device.sm_count
            m.memory_bytes = v.device.memory_bytes
        timed = [c for c in v.cases if c.timing]
        if timed:
            t = timed[0].timing
            m.candidate_ms, m.candidate_iqr_ms = t.candidate.median_ms, t.candidate.iqr_ms
            if t.reference is not None:
                m.reference_ms, m.reference_iqr_ms = t.reference.median_ms, t.reference.iqr_ms
                m.speedup = t.speedup
        if v.cases:
            attrs = v.cases[0].attributes.get("candidate")
            if attrs is not None:
                m.registers = attrs.registers
                m.local_bytes = attrs.local_bytes
                m.blocks_per_sm = attrs.blocks_per_sm
        return m

    @property
    def noise(self) -> float:
        """The relative spread of this measurement: an improvement smaller than it is not one."""
        spreads = [
            iqr / med
            for iqr, med in (
                (self.candidate_iqr_ms, self.candidate_ms),
                (self.reference_iqr_ms, self.reference_ms),
            )
            if iqr is not None and med
        ]
        return max(spreads, default=0.0)


class TrajectoryNode(BaseModel):
    id: int
    parent: int | None
    depth: int
    edit: Edit | None
    kernel: str  # the variant's kernel definition (the rest of the file is the user's)
    flags: list[str]
    order: int | None = None  # when it was evaluated
    measurement: Measurement | None = None
    reward: float | None = None
    reward_terms: dict[str, float] = Field(default_factory=dict)
    visits: int = 0


class Confirmation(BaseModel):
    """The top candidates re-measured, interleaved with the input, after the search."""

    node: int
    speedup: float
    candidate_ms: float
    reference_ms: float
    noise: float
    repeats: int
    # from asking for the GPU to the verdict, and of that the runner's part (its checks, the
    # oracle where it judged a difference, the timing): a slot still held by a stopped
    # evaluation shows as the gap between the two
    seconds: float | None = None
    run_s: float | None = None


class Check(BaseModel):
    name: str
    ok: bool
    detail: str
    seconds: float | None = None  # wall time from the check before it to this one's verdict


class JudgeVerdict(BaseModel):
    accepted: bool
    checks: list[Check]
    llm: dict[str, Any] | None = None  # the LLM judge's structured verdict, where one ran

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]


class JudgeRejection(BaseModel):
    node: int
    reasons: list[str]
    seconds: float  # the judge's wall time on it


class ProgressPoint(BaseModel):
    evaluations: int
    seconds: float
    best_speedup: float | None


class Trajectory(BaseModel):
    file: str
    kernel: str
    device: str | None = None
    arch: str
    nvcc: str
    ncu: str | None = None
    date: str
    policy: str
    seed: int
    budget: int | None
    max_seconds: float | None = None
    baseline: Measurement | None = None
    nodes: list[TrajectoryNode] = Field(default_factory=list)
    progress: list[ProgressPoint] = Field(default_factory=list)
    best: int | None = None  # the search's best node by reward
    confirmed: list[Confirmation] = Field(default_factory=list)
    winner: int | None = None  # the confirmed, judged winner, if any
    winner_profile: ProfileSummary | None = None
    judge: JudgeVerdict | None = None
    # confirmed candidates the judge turned down before the verdict above: node, why, seconds
    judge_rejected: list[JudgeRejection] = Field(default_factory=list)
    stop: str = ""
    # the nodes whose evaluations were in flight when the search stopped (cancelled, their
    # processes killed), and how long after the search's deadline it returned
    stopped_in_flight: list[int] = Field(default_factory=list)
    search_overrun_s: float | None = None
    evaluations: int = 0
    wall_s: float = 0.0
    # where the wall time went: baseline (the input measured, fully profiled), search, confirm,
    # judge
    phase_s: dict[str, float] = Field(default_factory=dict)
    llm_cost_usd: float | None = None
    # edits the policy proposed that failed a check before evaluation: title, reason, stage
    rejected: list[dict[str, Any]] = Field(default_factory=list)
    outcome: str = ""  # one line: what came of it
    # what the input computes, as the lifting reads it: "row normalization: line 42: ..."
    computes: str | None = None

    def added_flags(self) -> list[str]:
        """The nvcc flags the winner was measured with that the input was not built with (an
        LLM's allow-listed edit may add some): the delivered file does not carry them."""
        root = next((n for n in self.nodes if n.parent is None), None)
        winner = next((n for n in self.nodes if n.id == self.winner), None)
        if winner is None:
            return []
        return [f for f in winner.flags if root is None or f not in root.flags]
