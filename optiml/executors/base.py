"""The executor interface: what the search, the judge and the editor's jobs ask of a GPU."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from optiml.cuda.source import Kernel, SourceFile
from optiml.harness.build import DEFAULT_FLAGS
from optiml.harness.evaluate import EvalOptions, candidate_spec
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.spec import Spec


@dataclass(frozen=True)
class Job:
    """One kernel and one candidate of it: the user's file (the reference and the contract) and
    the candidate's whole text, built with its own flags. `candidate=None` is the kernel itself."""

    source: SourceFile
    kernel: Kernel
    spec: Spec
    candidate: SourceFile | None = None
    flags: tuple[str, ...] = DEFAULT_FLAGS

    @property
    def target(self) -> tuple[SourceFile, Kernel, Spec]:
        """What runs: the candidate's file, its kernel and its spec (its launch, its instantiation)."""
        if self.candidate is None:
            return self.source, self.kernel, self.spec
        kernel = self.candidate.kernel(self.kernel.name)
        return self.candidate, kernel, candidate_spec(self.spec, self.candidate, kernel)


class Executor(ABC):
    """Runs jobs on some GPU. Every method may be called concurrently: the executor schedules."""

    @property
    @abstractmethod
    def slots(self) -> int:
        """How many candidates it times at once (one per GPU)."""

    @abstractmethod
    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        """Compile, check against the reference and time (a broken candidate is a verdict).
        `pinned`: on the executor's first GPU, so that final comparisons share one GPU."""

    @abstractmethod
    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        """Nsight Compute on the candidate at the first problem size."""

    @abstractmethod
    async def sanitize(
        self, job: Job, tool: str, sizes: list[dict[str, int]] | None = None
    ) -> SanitizerReport:
        """compute-sanitizer (memcheck, initcheck, racecheck, synccheck) on the candidate, two
        launches at each of `sizes` (default: the spec's smallest)."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the executor holds (worker processes, connections)."""
