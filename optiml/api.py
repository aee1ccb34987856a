"""The public API: what the CLI, the language server and the search call. Plain data in, plain
data (pydantic models) out; errors are `OptimlError`s with positions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import OptimlError, SpecError
from optiml.harness.build import Build, build_device_code, kernel_resources
from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch, require_gpu
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.profile.run import profile_kernel
from optiml.profile.static import StaticReport, static_report
from optiml.spec import Spec, load, parse_spec

__all__ = [
    "CheckResult",
    "EvalOptions",
    "KernelCheck",
    "Verdict",
    "check_file",
    "check_source",
    "default_arch",
    "evaluate_file",
    "load",
    "profile_file",
]


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
        raise OptimlError(f"{source.path} defines no __global__ kernel")
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
    for c in checks:
        c.build = build
        if c.kernel.template_params and c.kernel.name not in instantiations:
            c.skipped = (
                "a template without a valid spec: give `template:` in its spec to compile it"
            )
            continue
        resources = kernel_resources(build.all_resources, c.kernel) if build.ok else None
        if resources is None:
            continue
        case = _first_case(c.spec)
        c.report = static_report(
            c.kernel.name,
            arch,
            resources,
            case.block if case else None,
            case.smem if case else None,
        )
    return CheckResult(source, arch, checks)


def evaluate_file(
    path: str | Path,
    kernel: str,
    candidate: str | Path | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """`optiml eval`: the kernel (or a candidate file's version of it) checked and timed on the GPU."""
    source, k, spec = load(path, kernel)
    cand = SourceFile.read(candidate) if candidate else None
    if cand is not None:
        cand.kernel(k.name)
    find_toolkit()
    require_gpu("eval")
    return evaluate(source, k, spec, cand, options or EvalOptions())


def _first_case(spec: Spec | None):
    # a spec that parsed has evaluated all its sizes already; its first is the one reported on
    return spec.case(spec.sizes[0]) if spec is not None else None


def profile_file(
    path: str | Path,
    kernel: str,
    *,
    full: bool = False,
    clock_control: str = "none",
    arch: str | None = None,
) -> Profile:
    """`optiml profile`: the kernel under Nsight Compute at its first size, as a `Profile`."""
    source, k, spec = load(path, kernel)
    find_toolkit()
    return profile_kernel(source, k, spec, full=full, clock_control=clock_control, arch=arch)
