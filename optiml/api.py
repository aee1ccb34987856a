"""The public API: what the CLI, the language server and the search call. Plain data in, plain
data (pydantic models) out; errors are `OptimlError`s with positions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import Kernel, SourceFile, no_kernel_message
from optiml.errors import ExitCode, NoSuchKernel, OptimlError, SpecError
from optiml.harness.build import DEFAULT_FLAGS, Build, ResourceIndex, build_device_code
from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch, require_gpu
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.profile.numerics import rounding_notes
from optiml.profile.run import profile_kernel
from optiml.profile.static import StaticReport, static_report
from optiml.spec import Spec, evaluated_at_run_time, load, parse_spec

__all__ = [
    "CheckResult",
    "EvalOptions",
    "KernelCheck",
    "Verdict",
    "check_file",
    "check_source",
    "default_arch",
    "evaluate_file",
    "evaluate_source",
    "describe_kernel",
    "load",
    "profile_file",
    "OptimizeRequest",
    "optimize_file",
    "optimize_file_async",
    "write_winner",
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


def describe_kernel(path: str | Path, kernel: str):
    """What `kernel` in the file at `path` computes: its lifted model read as a `Description`
    (family, evidence, domain, accesses, reductions, guards, outputs), or, for a kernel the
    lifting does not follow, the family "opaque" with the lines and reasons."""
    from optiml.lift import lift
    from optiml.lift.families import describe

    source, k, spec = load(path, kernel)
    return describe(lift(source, k, spec), spec)


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
        )
        c.report.notes += rounding_notes(KernelAST(source, c.kernel), c.spec)
    return CheckResult(source, arch, checks)


def evaluate_file(
    path: str | Path,
    kernel: str,
    candidate: str | Path | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """`optiml eval`: the kernel (or a candidate file's version of it) checked and timed on the GPU."""
    source, _, _ = load(path, kernel)  # the kernel and its spec before the candidate is read
    cand = SourceFile.read(candidate) if candidate else None
    return evaluate_source(source, kernel, cand, options)


def evaluate_source(
    source: SourceFile,
    kernel: str,
    candidate: SourceFile | None = None,
    options: EvalOptions | None = None,
) -> Verdict:
    """`evaluate_file` for text that need not be on disk (a worker's job)."""
    k = source.kernel(kernel)
    spec = parse_spec(source, k)
    if candidate is not None:
        candidate.kernel(k.name)
    find_toolkit()
    require_gpu("eval")
    with evaluated_at_run_time(source, k):  # a candidate's launch at the original's sizes
        return evaluate(source, k, spec, candidate, options or EvalOptions())


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
    executor=None,
) -> Profile:
    """`optiml profile`: the kernel under Nsight Compute at its first size, as a `Profile`.
    `executor`: None (here), an `Executor`, or `--executor`'s URLs (opened and closed here); on an
    executor the profile is that GPU's, at its own architecture and clocks."""
    source, k, spec = load(path, kernel)
    find_toolkit()
    if executor is not None:
        import asyncio

        from optiml.executors import Job

        async def on_executor(ex) -> Profile:
            try:
                return await ex.profile(Job(source, k, spec), full=full)
            finally:
                if ex is not executor:
                    await ex.close()

        return asyncio.run(on_executor(_search_executor(executor, None)))
    with evaluated_at_run_time(source, k):
        return profile_kernel(source, k, spec, full=full, clock_control=clock_control, arch=arch)


# ---- optimize ---------------------------------------------------------------------------------


@dataclass
class OptimizeRequest:
    """`optiml optimize` as data: what the CLI and the language server ask for."""

    file: Path
    kernel: str
    budget: int | None = 48
    max_seconds: float | None = None
    policy: str = "offline"  # offline | llm
    llm_overrides: dict | None = None  # provider, model, base_url, replay
    editor_settings: dict | None = None  # the LLM section of an editor's settings
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


def optimize_file(request: OptimizeRequest, on_event=None, should_stop=None, executor=None):
    """Run OptiML-X on one kernel (blocking); returns `optiml.search.optimize.Outcome` with the
    files it wrote (trajectory, report, optimized file, saved search) in `outcome.files`.
    `executor`: an `Executor`, or `--executor`'s text (`local`, `ssh://host`, `ray`, several
    comma-separated: their GPUs pooled), opened and closed here; None: this machine's GPUs."""
    import asyncio

    return asyncio.run(optimize_file_async(request, on_event, should_stop, executor))


async def optimize_file_async(
    request: OptimizeRequest, on_event=None, should_stop=None, executor=None
):
    from optiml.executors import parse_gpus
    from optiml.search.optimize import BaselineFailed, OptimizeOptions, optimize
    from optiml.search.report import render

    if request.text is None:
        request.original_text = SourceFile.read(request.file).text
    else:
        request.original_text = request.text
    source = SourceFile(request.original_text, str(request.file))
    kernel = source.kernel(request.kernel)
    parse_spec(source, kernel)  # a bad spec is the user's error, before any GPU work
    find_toolkit()
    out_dir = request.out_dir or default_out_dir(request.file, kernel.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = out_dir / "search.json"
    policy, review, llm = _policy(request, out_dir)  # a bad LLM setting fails before any GPU work
    own_executor = executor is None or isinstance(executor, str)
    if own_executor:
        try:
            executor = _search_executor(executor or "local", parse_gpus(request.gpus))
        except BaseException:
            if llm is not None:
                await llm.aclose()
            raise
    options = OptimizeOptions(
        budget=request.budget,
        max_seconds=request.max_seconds,
        seed=request.seed,
        parallel=request.parallel,
        profile=request.profile,
        sanitize=request.sanitize,
        arch=request.arch,
        resume=saved if request.resume else None,
        save_to=saved,
    )
    try:
        with evaluated_at_run_time(source, kernel):  # the judge's unseen size, say
            outcome = await optimize(
                request.file,
                kernel.name,
                executor,
                options,
                policy=policy,
                on_event=on_event,
                should_stop=should_stop,
                source_text=request.original_text,
                llm_review=review,
            )
    except BaselineFailed as e:
        raise InputFailed(str(e)) from None
    finally:
        if own_executor:
            await executor.close()
        if llm is not None:
            await llm.aclose()
    t = outcome.trajectory
    outcome.search.save(saved)
    files = {"trajectory": out_dir / "trajectory.json", "report": out_dir / "report.html"}
    files["trajectory"].write_text(t.model_dump_json(indent=1))
    files["report"].write_text(render(t))
    if outcome.winner is not None:
        optimized = (
            out_dir / f"{Path(request.file).stem}.optimized{Path(request.file).suffix or '.cu'}"
        )
        optimized.write_text(outcome.winner.text)
        files["optimized"] = optimized
        if outcome.winner.flags != DEFAULT_FLAGS:
            files["flags"] = out_dir / "nvcc-flags.txt"
            files["flags"].write_text(" ".join(outcome.winner.flags) + "\n")
    files["search"] = saved
    outcome.files = files
    return outcome


def _search_executor(executor, gpus):
    """`executor` itself, or the executor `--executor`'s text names."""
    from optiml.executors.registry import open_search_executor

    return open_search_executor(executor, gpus) if isinstance(executor, str) else executor


class InputFailed(OptimlError):
    """The kernel as written does not pass its own checks: nothing to optimize from."""

    exit_code = ExitCode.WRONG_RESULT


def write_winner(file: Path, original_text: str, winner) -> Path:
    """Put the winner in the user's file (the CLI's --write), unless the file changed meanwhile."""
    path = Path(file)
    try:
        current = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise OptimlError(
            f"{path} is not UTF-8: writing the winner into it would replace the bytes that do not "
            "decode; it is left as it is (the optimized file is in the run's folder)"
        ) from None
    if current != original_text:
        raise OptimlError(
            f"{path} changed while the search ran; it is left as it is (the optimized file is in the run's folder)"
        )
    tmp = path.with_name(f".{path.name}.optiml-tmp")
    tmp.write_text(winner.text, encoding="utf-8")
    tmp.replace(path)
    return path


def _policy(request: OptimizeRequest, out_dir: Path):
    """(policy, LLM review or None, LLM client to close or None) for the request."""
    from optiml.search.policy import OfflinePolicy

    if request.policy == "offline":
        return OfflinePolicy(), None, None
    from optiml.search.llm_policy import make_llm_policy

    return make_llm_policy(request, out_dir)
