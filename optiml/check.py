"""`optiml check` as a library: parse a file, check its specs, compile its device code once and
report on each kernel (registers, spills, occupancy, rounding notes). Needs nvcc, not a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import Kernel, SourceFile, no_kernel_message
from optiml.errors import NoSuchKernel, OptimlError, SpecError, ToolMissing
from optiml.harness.build import Build, ResourceIndex, build_device_code
from optiml.harness.device import gpu_limits
from optiml.harness.gpu import default_arch
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.profile.numerics import rounding_notes
from optiml.profile.static import StaticReport, static_report
from optiml.spec import Spec, evaluated_at_run_time, parse_spec


@dataclass
class KernelCheck:
    """One kernel of `optiml check`: its spec (or the spec's errors), its compile and its report."""

    kernel: Kernel
    spec: Spec | None
    spec_error: SpecError | None
    build: Build | None
    report: StaticReport | None
    skipped: str | None = None  # why it was not compiled

    @property
    def messages(self) -> list[CompilerMessage]:
        return self.build.messages if self.build else []


@dataclass
class CheckResult:
    source: SourceFile
    arch: str
    kernels: list[KernelCheck]

    @property
    def compile_failed(self) -> bool:
        return any(k.build is not None and not k.build.ok for k in self.kernels)

    @property
    def spec_failed(self) -> bool:
        return any(k.spec_error is not None for k in self.kernels)

    def to_json(self) -> dict:
        """What `optiml check --json` prints, and what a worker answers for a check: plain JSON."""
        kernels = []
        for c in self.kernels:
            kernels.append(
                {
                    "kernel": c.kernel.name,
                    "spec": c.spec.model_dump() if c.spec else None,
                    "spec_errors": [
                        {"message": m, "path": p.path, "line": p.line, "column": p.column}
                        for m, p in c.spec_error.issues
                    ]
                    if c.spec_error
                    else [],
                    "compiled": c.build.ok if c.build else None,
                    "skipped": c.skipped,
                    "messages": [m.model_dump() for m in c.messages],
                    "report": c.report.model_dump() if c.report else None,
                }
            )
        return {"file": self.source.path, "arch": self.arch, "kernels": kernels}


def check_file(path: str | Path, kernel: str | None = None, arch: str | None = None) -> CheckResult:
    """Parse, compile (device code only) and report on the kernels of a file; needs no GPU."""
    return check_source(SourceFile.read(path), kernel, arch)


def check_source(
    source: SourceFile, kernel: str | None = None, arch: str | None = None
) -> CheckResult:
    """`check_file` for text that need not be on disk (an editor's unsaved buffer): `source.path`
    gives the file name compiler messages use and the directory local includes are found in."""
    kernels = [source.kernel(kernel)] if kernel else list(source.kernels)
    if not kernels:
        raise NoSuchKernel(no_kernel_message(source.path))
    find_toolkit()
    checks: list[KernelCheck] = []
    for k in kernels:
        spec, error = None, None
        if k.spec_comment is not None:
            try:
                spec = parse_spec(source, k)
            except SpecError as e:
                error = e
        checks.append(KernelCheck(k, spec, error, None, None))

    # --arch, else the first spec that names one, else the local GPU's, else sm_90
    arch = (
        arch
        or next((c.spec.arch for c in checks if c.spec and c.spec.arch), None)
        or default_arch()
    )
    instantiations = {
        c.kernel.name: c.spec.instantiation for c in checks if c.spec and c.spec.instantiation
    }
    build = build_device_code(source, instantiations, arch=arch)
    found = ResourceIndex(build.all_resources)
    device = (
        gpu_limits() if build.ok else None
    )  # this machine's GPU's limits, where it is the target
    for c in checks:
        c.build = build
        if c.kernel.template_params and c.kernel.name not in instantiations:
            c.skipped = (
                "a template without a valid spec: give `template:` in its spec to compile it"
            )
            continue
        resources = found.of(c.kernel) if build.ok else None
        if resources is None:
            continue
        with evaluated_at_run_time(source, c.kernel):
            case = _first_case(c.spec)
        c.report = static_report(
            c.kernel.name,
            arch,
            resources,
            case.block if case else None,
            case.smem if case else None,
            device,
        )
        c.report.notes += rounding_notes(KernelAST(source, c.kernel), c.spec)
    return CheckResult(source, arch, checks)


class KernelFeedback(BaseModel):
    """One kernel of an editor's compile: its static report, or why it was not compiled."""

    report: StaticReport | None = None
    skipped: str | None = None


class CheckFeedback(BaseModel):
    """`check_text`'s answer: the compile of a whole text (or why there was none)."""

    arch: str | None = None
    ok: bool = False
    messages: list[CompilerMessage] = Field(default_factory=list)
    kernels: dict[str, KernelFeedback] = Field(default_factory=dict)
    error: str | None = None  # why nothing was compiled
    tool_missing: bool = False  # ... because nvcc is not there


def check_text(text: str, path: str, arch: str | None = None) -> CheckFeedback:
    """`check_source` for an editor's snapshot, as plain data; a text without kernels (a header)
    has nothing to compile on its own, and an error is the answer's `error`, not an exception."""
    source = SourceFile(text, path)
    if not source.kernels:
        return CheckFeedback(arch=arch, ok=True)
    try:
        result = check_source(source, arch=arch)
    except ToolMissing as e:
        return CheckFeedback(error=str(e), tool_missing=True)
    except OptimlError as e:
        return CheckFeedback(error=str(e))
    build = result.kernels[0].build if result.kernels else None
    return CheckFeedback(
        arch=result.arch,
        ok=not result.compile_failed,
        messages=build.messages if build else [],
        kernels={
            c.kernel.name: KernelFeedback(report=c.report, skipped=c.skipped)
            for c in result.kernels
        },
    )


def _first_case(spec: Spec | None):
    # a spec that parsed has evaluated all its sizes already; its first is the one reported on
    return spec.case(spec.sizes[0]) if spec is not None else None
