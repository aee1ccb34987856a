"""What the model answers, as the structured output it is asked for: edits of the kernel
(`EditProposals`) and the judge's review (`JudgeReview`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ProposedEdit(BaseModel):
    """One edit of the kernel as the model proposes it."""

    title: str = Field(description="a short title, e.g. 'float4 loads with a scalar tail'")
    bottleneck: str = Field(description="the bottleneck it targets, e.g. 'dram', 'latency'")
    code: str | None = Field(
        description="the complete new text of what was shown (spec comment and kernel "
        "definition, helpers above it allowed), or null when `diff` is given"
    )
    diff: str | None = Field(
        description="a unified diff against exactly the text shown, or null when `code` is given"
    )
    grid: str | None = Field(description="a new launch grid expression, or null to keep it")
    block: str | None = Field(description="a new launch block expression, or null to keep it")
    smem: str | None = Field(
        description="a new dynamic shared memory expression in bytes, or null to keep it"
    )
    flags: list[str] = Field(description="extra nvcc flags from the allowed list, [] for none")
    why: str = Field(description="why it should be faster")
    risk: str = Field(description="what could make it wrong or slower")


class EditProposals(BaseModel):
    edits: list[ProposedEdit]


class JudgeReview(BaseModel):
    verdict: Literal["accept", "reject", "uncertain"]
    reasons: list[str]
    risks: list[str]
