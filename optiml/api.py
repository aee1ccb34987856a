"""The public API, and the only module of OptiML that the CLI and the language server import:
what they call, and the data types they see. Plain data in, plain data (pydantic models that
serialize to JSON and back) out; errors are `OptimlError`s with positions. An executor is the one
object that crosses: where a job's work runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from optiml import __version__
from optiml.arch import arch_number, resolve_arch
from optiml.check import (
    CheckFeedback,
    CheckResult,
    KernelCheck,
    KernelFeedback,
    check_file,
    check_source,
    check_text,
)
from optiml.cuda.source import SourceFile, changed, read_text
from optiml.errors import (
    ExitCode,
    InputFileError,
    OptimlError,
    Position,
    SourceWarning,
    SpecValueError,
    ToolMissing,
    UsageError,
    one_line,
)
from optiml.executors import Executor, LocalExecutor, parse_gpus
from optiml.executors.protocol import Request
from optiml.executors.registry import open_executor, open_search_executor, split_urls
from optiml.expr import ExprError
from optiml.generate.cli import run_generate
from optiml.generate.comment import (
    GeneratedKernel,
    comment_start,
    formula_in_comment,
    generate_from_comment,
    generate_from_prose,
    llm_configured,
    prose_in_comment,
)
from optiml.generate.options import MotOptions
from optiml.harness.build import cache_dir
from optiml.harness.evaluate import EvalOptions, evaluate_file, evaluate_source
from optiml.harness.gpu import default_arch, local_gpus
from optiml.harness.nvcc import CompilerMessage, find_toolkit
from optiml.harness.procs import kill_all, kill_children_on_terminate
from optiml.harness.project import BuildOptions, build_data, options_for
from optiml.harness.project import checked as checked_build
from optiml.harness.project import configure as set_build
from optiml.harness.verdict import STATUS_EXIT, Verdict
from optiml.llm.check import LLMCheckReport, check_llm
from optiml.llm.settings import Provider
from optiml.outline import (
    KernelOutline,
    Outline,
    Parameter,
    Range,
    SpecIssue,
    Syntax,
    draft_spec,
    outline,
    syntax,
)
from optiml.profile.model import Hotspot, Profile
from optiml.profile.run import profile_kernel
from optiml.profile.static import ARCHES, StaticReport
from optiml.search.optimize import Event
from optiml.search.request import (
    DEFAULT_BUDGET,
    DEFAULT_SECONDS,
    OptimizeRequest,
    OptimizeResult,
    default_out_dir,
)
from optiml.search.trajectory import ProfileSummary, Trajectory
from optiml.spec import Spec, evaluated_at_run_time, load, parse_spec

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_SECONDS",
    "Syntax",
    "changed",
    "syntax",
    "BuildOptions",
    "build_data",
    "configure_build",
    "options_for",
    "set_build",
    # what the front ends call
    "check_file",
    "check_source",
    "check_llm",
    "check_text",
    "draft_file_spec",
    "local_gpus",
    "open_executor",
    "open_search_executor",
    "read_text",
    "run_generate",
    "comment_start",
    "formula_in_comment",
    "generate_from_comment",
    "generate_from_prose",
    "llm_configured",
    "prose_in_comment",
    "default_arch",
    "describe_kernel",
    "draft_spec",
    "evaluate_file",
    "evaluate_source",
    "load",
    "optimize_file",
    "optimize_file_async",
    "outline",
    "profile_file",
    "profile_text",
    "write_winner",
    # the data they see
    "CheckFeedback",
    "CheckResult",
    "CompilerMessage",
    "EvalOptions",
    "GeneratedKernel",
    "Event",
    "Hotspot",
    "KernelCheck",
    "KernelFeedback",
    "KernelOutline",
    "LLMCheckReport",
    "MotOptions",
    "Request",
    "SpecDraft",
    "OptimizeRequest",
    "OptimizeResult",
    "Outline",
    "Parameter",
    "Position",
    "Profile",
    "ProfileSummary",
    "Range",
    "Spec",
    "SpecIssue",
    "StaticReport",
    "Trajectory",
    "Verdict",
    "STATUS_EXIT",
    # settings' vocabularies and checks
    "ARCHES",
    "Provider",
    "arch_number",
    "parse_gpus",
    "resolve_arch",
    "split_urls",
    # errors
    "ExitCode",
    "ExprError",
    "OptimlError",
    "SourceWarning",
    "SpecValueError",
    "ToolMissing",
    "UsageError",
    "one_line",
    # where work runs, and the process hygiene of a job that runs elsewhere
    "Executor",
    "LocalExecutor",
    "cache_dir",
    "kill_all",
    "kill_children_on_terminate",
    "__version__",
]


def describe_kernel(path: str | Path, kernel: str):
    """What `kernel` in the file at `path` computes: its lifted model read as a `Description`
    (family, evidence, domain, accesses, reductions, guards, outputs), or, for a kernel the
    lifting does not follow, the family "opaque" with the lines and reasons."""
    from optiml.lift import lift
    from optiml.lift.families import describe

    source, k, spec = load(path, kernel)
    return describe(lift(source, k, spec), spec)


class SpecDraft(BaseModel):
    """`optiml spec`: a drafted spec comment and where it goes."""

    kernel: str
    insert_before_line: int  # 1-based: the kernel's first line (its `template <...>` line, if any)
    spec: str


def draft_file_spec(path: str | Path, kernel: str) -> SpecDraft:
    """A drafted spec for `kernel` in the file at `path`; the file is not changed."""
    text = SourceFile.read(path)
    found = text.kernel(kernel)
    drafted = draft_spec(text.text, text.path, found.name)
    return SpecDraft(
        kernel=found.name, insert_before_line=found.span.start_point[0] + 1, spec=drafted
    )


def profile_file(
    path: str | Path,
    kernel: str,
    *,
    full: bool = False,
    clock_control: str = "none",
    arch: str | None = None,
    executor: Executor | str | None = None,
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


async def profile_text(
    text: str, path: str, kernel: str, executor: Executor, *, full: bool = True
) -> Profile:
    """`profile_file` for an editor's snapshot, through `executor` (which is closed after)."""
    from optiml.executors.base import Job

    source = SourceFile(text, path)
    k = source.kernel(kernel)
    spec = parse_spec(source, k)
    try:
        return await executor.profile(Job(source, k, spec), full=full)
    finally:
        await executor.close()


# ---- optimize ---------------------------------------------------------------------------------


def optimize_file(
    request: OptimizeRequest,
    on_event: Callable[[Event], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    executor: Executor | str | None = None,
) -> OptimizeResult:
    """Run OptiML-X on one kernel (blocking): the trajectory, the winner (if any) and the files it
    wrote (trajectory, report, optimized file, saved search) in `files`.
    `executor`: an `Executor`, or `--executor`'s text (`local`, `ssh://host`, `ray`, several
    comma-separated: their GPUs pooled), opened and closed here; None: this machine's GPUs."""
    import asyncio

    return asyncio.run(optimize_file_async(request, on_event, should_stop, executor))


async def optimize_file_async(
    request: OptimizeRequest,
    on_event: Callable[[Event], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    executor: Executor | str | None = None,
) -> OptimizeResult:
    from optiml.search.deliver import deliver
    from optiml.search.optimize import BaselineFailed, OptimizeOptions, optimize

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
        raise InputFailed(str(e), STATUS_EXIT[e.status]) from None
    finally:
        if own_executor:
            await executor.close()
        if llm is not None:
            await llm.aclose()
    return deliver(outcome, request, out_dir)


def _search_executor(executor: Executor | str, gpus: list[int] | None) -> Executor:
    """`executor` itself, or the executor `--executor`'s text names."""
    return open_search_executor(executor, gpus) if isinstance(executor, str) else executor


class InputFailed(OptimlError):
    """The kernel as written does not pass its own checks: nothing to optimize from. Its exit code
    is its verdict's, as `optiml eval` of the kernel gives (8 for one that does not compile)."""

    exit_code = ExitCode.WRONG_RESULT

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.WRONG_RESULT):
        super().__init__(message)
        self.exit_code = exit_code


def write_winner(file: Path, original_text: str, winner: str) -> Path:
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
    tmp.write_text(winner, encoding="utf-8")
    tmp.replace(path)
    return path


def _policy(request: OptimizeRequest, out_dir: Path):
    """(policy, LLM review or None, LLM client to close or None) for the request."""
    from optiml.search.policy import OfflinePolicy

    if request.policy == "offline":
        return OfflinePolicy(), None, None
    from optiml.search.llm_policy import make_llm_policy

    return make_llm_policy(request, out_dir)


def configure_build(
    paths: list[str | Path],
    include: tuple[str, ...] = (),
    define: tuple[str, ...] = (),
    std: str | None = None,
    nvcc_flags: tuple[str, ...] = (),
    compile_commands: str | None = "auto",
) -> BuildOptions:
    """Say how the user's project builds the files at `paths` (`-I`, `-D`, `--std`,
    `--nvcc-flag`; `compile_commands`: a compile_commands.json, `auto` to look for one up the tree
    from each file, None for none): every compile of those files gets them. Returns the first
    file's options as resolved (the database's, then the ones given)."""
    given = checked_build(include, define, std, nvcc_flags)
    if compile_commands not in (None, "auto") and not Path(compile_commands).is_file():
        raise InputFileError(f"--compile-commands {compile_commands}: no such file")
    for path in paths:
        set_build(path, given, compile_commands)
    return options_for(paths[0])
