"""The executor interface: what the search, the judge and the editor's jobs ask of a GPU."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from optiml.cuda.source import Kernel, SourceFile
from optiml.executors.protocol import Request
from optiml.harness.build import DEFAULT_FLAGS
from optiml.harness.evaluate import EvalOptions, candidate_spec
from optiml.harness.project import build_data
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.spec import Spec


@dataclass(frozen=True)
class Job:
    """One kernel and one candidate of it: the user's file (the reference and the contract) and
    the candidate's whole text, built with its own flags. `candidate=None` is the kernel itself.

    Parsed here; as data (`request`, `of_request`) it is the file's text and name, the kernel's
    name, the spec, the candidate's text and the flags: what a `protocol.Request` carries to a
    worker, which parses them again."""

    source: SourceFile
    kernel: Kernel
    spec: Spec
    candidate: SourceFile | None = None
    flags: tuple[str, ...] = DEFAULT_FLAGS

    @classmethod
    def of_variant(cls, source: SourceFile, kernel: Kernel, spec: Spec, variant) -> Job:
        """The job of a catalog variant (`optiml.search.variant.Variant`: its text and flags) of
        `kernel` in `source`."""
        return cls(
            source,
            kernel,
            spec,
            candidate=SourceFile(variant.text, source.path),
            flags=variant.flags,
        )

    @property
    def target(self) -> tuple[SourceFile, Kernel, Spec]:
        """What runs: the candidate's file, its kernel and its spec (its launch, its instantiation)."""
        if self.candidate is None:
            return self.source, self.kernel, self.spec
        kernel = self.candidate.kernel(self.kernel.name)
        return self.candidate, kernel, candidate_spec(self.spec, self.candidate, kernel)

    def request(self, command: str, **fields: Any) -> Request:
        """This job as a `protocol.Request` of `command` (evaluate, profile, sanitize)."""
        return Request(
            command=command,
            path=self.source.path,
            text=self.source.text,
            kernel=self.kernel.name,
            spec=self.spec.model_dump(mode="json"),
            candidate_path=None if self.candidate is None else self.candidate.path,
            candidate_text=None if self.candidate is None else self.candidate.text,
            flags=list(self.flags),
            build=build_data(self.source.path),
            **fields,
        )

    @classmethod
    def of_request(cls, request: Request) -> Job:
        """The job a request carries, parsed (a kernel the text lacks is `NoSuchKernel`)."""
        from optiml.spec import parse_spec

        source = SourceFile(request.text, request.path)
        kernel = source.kernel(request.kernel or "")
        spec = (
            Spec.model_validate(request.spec)
            if request.spec is not None
            else parse_spec(source, kernel)
        )
        candidate = (
            None
            if request.candidate_text is None
            else SourceFile(request.candidate_text, request.candidate_path or source.path)
        )
        flags = DEFAULT_FLAGS if request.flags is None else tuple(request.flags)
        return cls(source, kernel, spec, candidate, flags)


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

    async def precompile(self, job: Job, options: EvalOptions) -> None:  # noqa: B027
        """Compile the candidate as `evaluate` will, where that lets a later `evaluate` skip its
        compile (this machine's CPUs while its GPUs are busy); a hint, which may do nothing and
        never fails."""

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Connect where the executor needs to (before `slots` is read); idempotent."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the executor holds (worker processes, connections)."""
