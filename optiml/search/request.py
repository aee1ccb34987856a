"""`optiml optimize` as data: what the CLI and the language server ask of OptiML-X, and what it
delivers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from optiml.search.trajectory import ProfileSummary, Trajectory

# What a run gets where nobody says (the CLI, the editor's settings, the API): evaluations the
# search may spend, and the whole run's wall time in seconds.
DEFAULT_BUDGET = 48
DEFAULT_SECONDS = 90.0


class OptimizeRequest(BaseModel):
    """One search on one kernel; plain data that serializes to JSON and back."""

    file: Path
    kernel: str
    budget: int | None = DEFAULT_BUDGET
    max_seconds: float | None = DEFAULT_SECONDS  # the whole run's wall time; None: the budget alone
    policy: str = "offline"  # offline | llm
    llm_overrides: dict[str, Any] | None = None  # provider, model, base_url, replay
    editor_settings: dict[str, Any] | None = None  # the LLM section of an editor's settings
    seed: int = 0
    gpus: str | None = "all"
    parallel: int | None = None
    out_dir: Path | None = None
    resume: bool = False
    profile: bool = True
    sanitize: bool = True
    arch: str | None = None
    text: str | None = None  # an editor's snapshot of the file, instead of reading it
    original_text: str = ""  # the text the search started from (filled in by `optimize_file`)


def default_out_dir(file: Path, kernel: str) -> Path:
    return Path(".optiml") / "runs" / f"{Path(file).stem}-{kernel.replace('::', '_')}"


class OptimizeResult(BaseModel):
    """What a search delivered: its record, the confirmed and judged winner (the whole file, its
    nvcc flags) if any, and the files written for it."""

    trajectory: Trajectory
    winner: str | None = None  # the winner's whole file
    flags: list[str] = Field(default_factory=list)  # the winner's nvcc flags
    speedup: float | None = None  # the winner's confirmed speedup
    baseline_profile: ProfileSummary | None = None  # the input's
    files: dict[str, Path] = Field(default_factory=dict)  # trajectory, report, optimized, ...
