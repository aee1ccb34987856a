"""Background work on a snapshot of a document (never the live one), one path for every kind
(`run_job`: its progress, its cancel, its result stored, one message if it fails):

- *check*: the compile after an open or a save (`server.checks`: nvcc in a process group of its
  own), on the whole document; a newer snapshot of the document cancels the older one's check,
  as does its closing; the outcome is kept and published as diagnostics and inlay hints;
- *optimize*: OptiML-X's search (`optiml.api.optimize_file_async`) on one kernel, in a process of
  its own — the search parses every candidate (tree-sitter holds the interpreter lock for a whole
  parse: ~40 ms for a 5,000-line file), so a thread would stall the server's loop; its winner is
  a proposal;
- *profile*: Nsight Compute on one kernel through the executor, in a worker thread;
- *generate*: OptiML-G on the formula in a comment (`optiml.api.generate_from_comment`; prose
  goes to the LLM's experts where one is configured, `generate_from_prose`), the
  kernel checked and then optimized through the executor as an optimize job is, in a process of
  its own; the delivered kernel, inserted below the comment, is a proposal.

Progress goes to the client as work-done progress, cancellable but for a compile's (a newer save
ends that one; VS Code would show a cancellable one as a notification). At most one optimize or profile
job per (document, kernel) and one generate job per comment, several at once in all.

A job stops through `should_stop` (an event the search checks between evaluations, shared with
the job's process): the progress UI's cancel, `optiml.cancelJob` (which, without a job, cancels
the optimize, profile and generate jobs: the ones commands started) and the server's shutdown set it.
Whatever a job raises (no GPU, a bad spec, no nvcc, a bug, a dead process) ends its progress and
is shown in one message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import queue
import re
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from optiml.api import (
    Event,
    Executor,
    KernelOutline,
    OptimizeRequest,
    OptimizeResult,
    OptimlError,
    Profile,
    Trajectory,
    cache_dir,
    check_file,
    formula_in_comment,
    generate_from_comment,
    generate_from_prose,
    kill_all,
    kill_children_on_terminate,
    open_search_executor,
    optimize_file_async,
    outline,
    parse_gpus,
    profile_text,
)
from server.checks import CheckOutcome, Checks
from server.documents import Model, Snapshot, kernel_block
from server.proposals import Proposal, make_generated_proposal, make_proposal
from server.protocol import one_line, shown
from server.settings import Settings

logger = logging.getLogger(__name__)

OPTIMIZE_COMMAND = "optiml.optimize"
PROFILE_COMMAND = "optiml.profile"
GENERATE_COMMAND = "optiml.generate"
CANCEL_COMMAND = "optiml.cancelJob"

Kind = Literal["check", "optimize", "profile", "generate"]
VERB = {
    "check": "compiling",
    "optimize": "optimizing",
    "profile": "profiling",
    "generate": "generating",
}
DONE = {
    "check": "compiled",
    "optimize": "optimized",
    "profile": "profiled",
    "generate": "generated",
}
T = TypeVar("T")

ExecutorFactory = Callable[[Settings], Executor]

# Jobs' processes start fresh (no fork of a server with threads and an event loop running).
PROCESSES = multiprocessing.get_context("spawn")


def local_executor(settings: Settings) -> Executor:
    """The executor the settings name (`executor`: `local` is this machine's GPUs, `gpus` of
    them; `ssh://...`, `ray`, several pooled); raises without a GPU there."""
    return open_search_executor(settings.executor, parse_gpus(settings.gpus))


class JobHost(Protocol):
    """What a job needs of the server it runs in: where it reports, and where its results go."""

    caps: Any  # the client's capabilities (`server.capabilities.ClientCapabilities`)
    work_done_progress: Any  # pygls's progress API
    settings: Settings
    executor_factory: ExecutorFactory
    jobs: Jobs
    checks: Checks
    profiles: Profiles
    proposals: Any  # `server.proposals.Proposals`

    def tell(self, message: str, kind: types.MessageType = ..., once: bool = ...) -> None: ...
    def spawn(self, coro: Any) -> asyncio.Task[None]: ...
    def refresh_code_lenses(self) -> None: ...
    def refresh_inlay_hints(self) -> None: ...
    def republish(self, uri: str) -> None: ...


@dataclass(frozen=True)
class Target:
    uri: str
    version: int
    kernel: str


def target_arg(command: str, args: tuple[Any, ...]) -> Target:
    """`[{uri, version, kernel}]` → a Target; a clear InvalidParams otherwise."""
    if len(args) == 1 and isinstance(args[0], dict):
        a = args[0]
        uri, version, kernel = a.get("uri"), a.get("version"), a.get("kernel")
        if (
            isinstance(uri, str)
            and isinstance(version, int)
            and not isinstance(version, bool)
            and isinstance(kernel, str)
        ):
            return Target(uri, version, kernel)
    raise JsonRpcInvalidParams(f"{command} takes [{{uri, version, kernel}}], got {shown(args)}")


@dataclass(frozen=True)
class CommentTarget:
    uri: str
    version: int
    line: int  # 0-based: a line of the comment


def comment_arg(command: str, args: tuple[Any, ...]) -> CommentTarget:
    """`[{uri, version, line}]` → a CommentTarget; a clear InvalidParams otherwise."""
    if len(args) == 1 and isinstance(args[0], dict):
        a = args[0]
        uri, version, line = a.get("uri"), a.get("version"), a.get("line")
        if (
            isinstance(uri, str)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (version, line))
            and line >= 0
        ):
            return CommentTarget(uri, version, line)
    raise JsonRpcInvalidParams(f"{command} takes [{{uri, version, line}}], got {shown(args)}")


def job_arg(args: tuple[Any, ...]) -> str | None:
    """`[{job}]` → its id; no arguments (or `[]`, `[null]`, `[{}]`) → None, every job."""
    if not args or args in ((None,), ({},)):
        return None
    if len(args) == 1 and isinstance(args[0], dict) and isinstance(args[0].get("job"), str):
        return args[0]["job"]
    raise JsonRpcInvalidParams(f"{CANCEL_COMMAND} takes [{{job}}] or nothing, got {shown(args)}")


@dataclass(eq=False)
class Job:
    id: str
    kind: Kind
    snapshot: Snapshot
    kernel: str  # "" for a check (the whole document) and a generate job (a comment)
    settings: Settings  # as they were when it started
    stop: Any = field(default_factory=PROCESSES.Event)  # shared with the job's process
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)  # the loop's view of `stop`
    token: str | None = None  # its work-done progress, if the client shows one
    task: asyncio.Task[None] | None = None
    percentage: int = 0
    ended: bool = False
    line: int | None = None  # a generate job's comment (0-based)

    @property
    def subject(self) -> str:
        """What the job works on: its kernel, the document's name for a check, the comment's line
        for a generate job."""
        if self.line is not None:
            return f"{self.snapshot.name}:{self.line + 1}"
        return self.kernel or self.snapshot.name

    @property
    def title(self) -> str:
        return f"OptiML: {VERB[self.kind]} {self.subject}"

    @property
    def folder(self) -> Path:
        """Where an optimize job writes its trajectory, report and variant."""
        return cache_dir() / "jobs" / self.id

    def cancel(self) -> None:
        self.stop.set()
        self.cancelled.set()


class Jobs:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def __iter__(self):
        return iter(list(self._jobs.values()))

    def busy(self, uri: str, kernel: str, line: int | None = None) -> Job | None:
        return next(
            (
                j
                for j in self._jobs.values()
                if j.kind != "check" and (j.snapshot.uri, j.kernel, j.line) == (uri, kernel, line)
            ),
            None,
        )

    def cancel_checks(self, uri: str) -> None:
        """End the compiles of `uri` in flight (a newer snapshot, or the document closed)."""
        for j in self._jobs.values():
            if j.kind == "check" and j.snapshot.uri == uri:
                j.cancel()

    def newer_check(self, snapshot: Snapshot) -> bool:
        """Whether a compile of a newer version of `snapshot`'s document is in flight."""
        return any(
            j.kind == "check"
            and j.snapshot.uri == snapshot.uri
            and j.snapshot.version > snapshot.version
            for j in self._jobs.values()
        )

    def new(
        self,
        kind: Kind,
        snapshot: Snapshot,
        kernel: str,
        settings: Settings,
        line: int | None = None,
    ) -> Job:
        job = Job(uuid.uuid4().hex[:12], kind, snapshot, kernel, settings, line=line)
        self._jobs[job.id] = job
        return job

    def remove(self, job: Job) -> None:
        self._jobs.pop(job.id, None)

    def cancel(self, job_id: str | None = None) -> list[str]:
        """Cancel one job (or, with None, every optimize and profile job): the ids cancelled."""
        found = [
            j
            for j in self._jobs.values()
            if j.id == job_id or (job_id is None and j.kind != "check")
        ]
        for j in found:
            j.cancel()
        return [j.id for j in found]

    def cancel_token(self, token: types.ProgressToken) -> None:
        for j in self._jobs.values():
            if j.token == token:
                j.cancel()

    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job, compiles included, and give them `timeout` seconds to end (an
        evaluation in flight ends first): `shutdown` waits for this."""
        for j in self._jobs.values():
            j.cancel()
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)


# ---- profiles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelProfile:
    """A profile job's result: valid while the kernel's lines are those it profiled."""

    profile: Profile
    digest: str  # of the kernel's lines at the snapshot (`Block.digest`)
    first: int  # their first line then: hotspots move with the kernel
    version: int
    path: str


class Profiles:
    """The newest profile per (document, kernel)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], KernelProfile] = {}

    def put(self, uri: str, kernel: str, found: KernelProfile) -> None:
        self._by[(uri, kernel)] = found

    def get(self, model: Model, kernel: KernelOutline) -> KernelProfile | None:
        found = self._by.get((model.snapshot.uri, kernel.name))
        if found is None or found.digest != model.block(kernel).digest:
            return None
        return found

    def of(self, model: Model) -> list[tuple[KernelOutline, KernelProfile]]:
        if not any(uri == model.snapshot.uri for uri, _ in self._by):
            return []
        return [(k, p) for k in model.kernels if (p := self.get(model, k)) is not None]


# ---- the work, in the job's thread ------------------------------------------------------------


@dataclass(frozen=True)
class Optimized:
    """What an optimize job's process sends back: the record and the proposal, if any."""

    trajectory: Trajectory
    proposal: Proposal | None


def search(
    file: Path,
    kernel: str,
    settings: Settings,
    folder: Path,
    executor: Executor,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    text: str | None = None,
) -> OptimizeResult:
    """OptiML-X on `kernel` of `file` (or of `text`, an editor's snapshot of it) as the settings
    say, its files in `folder`; the executor closed after."""
    request = OptimizeRequest(
        file=file,
        kernel=kernel,
        budget=settings.evaluations,
        max_seconds=settings.seconds or None,
        policy=settings.policy,
        editor_settings=settings.llm_section() or None,
        gpus=settings.gpus,
        out_dir=folder,
        arch=settings.arch,
        text=text,
    )

    async def run():  # one event loop for the search and the close (a connection lives in one)
        try:
            return await optimize_file_async(
                request, on_event=on_event, should_stop=should_stop, executor=executor
            )
        finally:
            await executor.close()

    return asyncio.run(run())


def optimize_work(
    job_id: str,
    snapshot: Snapshot,
    kernel: str,
    settings: Settings,
    folder: Path,
    make_executor: ExecutorFactory,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> Optimized:
    settings.configure_build(snapshot.path)  # in the job's own process
    executor = make_executor(settings)
    path = Path(snapshot.path)
    outcome = search(path, kernel, settings, folder, executor, on_event, should_stop, snapshot.text)
    proposal = make_proposal(job_id, snapshot, kernel, outcome, folder)
    return Optimized(outcome.trajectory, proposal)


@dataclass(frozen=True)
class Generated:
    """What a generate job's process sends back: the proposal (the kernel below the comment)
    and what the job's progress ends with."""

    proposal: Proposal
    message: str


def generate_work(
    job_id: str,
    snapshot: Snapshot,
    line: int,
    settings: Settings,
    folder: Path,
    make_executor: ExecutorFactory,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> Generated:
    """The comment's formula as a kernel (OptiML-G), in a file of its own in the job's folder
    with its float64 NumPy reference; checked; then optimized (OptiML-X: the plain kernel is
    checked against the reference first) where the executor has a GPU. The proposal inserts the
    delivered kernel below the comment and creates the reference next to the document."""
    taken = {k.name for k in outline(snapshot.text, snapshot.path).kernels}
    folder.mkdir(parents=True, exist_ok=True)
    text, path = snapshot.text, snapshot.path
    if formula_in_comment(text, path, line) is not None:
        g = generate_from_comment(text, path, line, taken, settings.arch or None)
    else:  # prose: the LLM's experts draft, vote and aggregate (their work in the job's folder)
        on_event(Event(phase="generate", last="the LLM's experts are drafting"))
        llm = settings.llm_section() or None
        g = generate_from_prose(text, path, line, folder / "experts", llm, taken)
    standalone = folder / f"{g.name}.cu"
    standalone.write_text(g.standalone, encoding="utf-8")
    (folder / g.reference_file).write_text(g.reference, encoding="utf-8")
    on_event(Event(phase="generate", last=f"`{g.name}` generated; compiling it"))
    checked = check_file(standalone, g.name, settings.arch)
    if checked.compile_failed or checked.spec_failed:  # a bug of the generator: said plainly
        (k,) = checked.kernels
        why = k.spec_error or next((m for m in k.messages if m.severity == "error"), "nvcc failed")
        raise OptimlError(f"the generated `{g.name}` does not check: {why}")
    outcome: OptimizeResult | None = None
    not_run = ""
    try:
        executor = make_executor(settings)
    except OptimlError as e:  # no GPU here, say: the plain kernel, compiled, is proposed
        not_run = str(e)
    else:
        out = folder / "optimize"
        outcome = search(standalone, g.name, settings, out, executor, on_event, should_stop)
    proposal = make_generated_proposal(job_id, snapshot, g, outcome, not_run, folder)
    if outcome is None:
        message = f"`{g.name}` generated and compiled; not run ({not_run})"
    elif outcome.winner is not None:
        message = f"`{g.name}` generated, checked against its reference and optimized: {outcome.trajectory.outcome}"
    else:
        message = (
            f"`{g.name}` generated and checked against its reference; {outcome.trajectory.outcome}"
        )
    return Generated(
        proposal, message + " — Accept or Reject it with the code lens over the comment"
    )


def _job_process(
    kind: Kind, args: tuple, make_executor: ExecutorFactory, out: Any, stop: Any
) -> None:
    """The job's process (an optimize or generate job): its events, then ("done", Optimized or
    Generated) or ("error", exception). A cancel (or SIGTERM) kills the runner, sanitizer and
    profiler process groups in flight at once."""
    kill_children_on_terminate()

    def watch() -> None:
        stop.wait()
        kill_all()

    threading.Thread(target=watch, daemon=True).start()
    work = generate_work if kind == "generate" else optimize_work
    try:
        result = work(*args, make_executor, lambda e: out.put(("event", e)), stop.is_set)
        out.put(("done", result))
    except BaseException as e:  # sent to the server, which shows it in one message
        try:
            out.put(("error", e))
        except Exception:
            out.put(("error", RuntimeError(f"{type(e).__name__}: {e}")))


def run_in_process(job: Job, make_executor: ExecutorFactory, forward) -> Any:
    """Start the job's process and relay its events until it ends (blocking: call in a thread);
    what the work returned (`Optimized`, `Generated`)."""
    out = PROCESSES.Queue()
    what = job.line if job.kind == "generate" else job.kernel
    args = (job.id, job.snapshot, what, job.settings, job.folder)
    proc = PROCESSES.Process(
        target=_job_process, args=(job.kind, args, make_executor, out, job.stop), daemon=True
    )
    proc.start()
    try:
        while True:
            try:
                kind, value = out.get(timeout=0.25)
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(
                        f"the job's process ended with exit code {proc.exitcode}"
                    ) from None
                continue
            if kind == "event":
                forward(value)
            elif kind == "done":
                return value
            else:
                raise value
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()  # its SIGTERM handler kills the process groups it started
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()


def profile_work(job: Job, make_executor: ExecutorFactory) -> KernelProfile:
    text, path = job.snapshot.text, job.snapshot.path
    profile = asyncio.run(profile_text(text, path, job.kernel, make_executor(job.settings)))
    kernel = outline(text, path).kernel(job.kernel)
    assert kernel is not None  # profiled: the kernel is there
    block = kernel_block(text.split("\n"), kernel)
    return KernelProfile(profile, block.digest, block.first, job.snapshot.version, path)


# ---- the job, on the server's loop ------------------------------------------------------------


def start(
    ls: JobHost, kind: Kind, snapshot: Snapshot, kernel: str = "", line: int | None = None
) -> Job:
    """A job of `kind` on `snapshot`, running in the background; a check first cancels the
    document's older one."""
    if kind == "check":
        ls.jobs.cancel_checks(snapshot.uri)
    job = ls.jobs.new(kind, snapshot, kernel, ls.settings, line)
    job.task = ls.spawn(run_job(ls, job))
    return job


async def run_job(ls: JobHost, job: Job) -> None:
    """Drive `job` to its end: progress, the work (in a process, a thread or a compile's own
    process group), its result stored, one message if it fails. Never raises."""
    loop = asyncio.get_running_loop()

    def forward(event: Event) -> None:  # in the job's thread
        try:
            loop.call_soon_threadsafe(_report, ls, job, event)
        except RuntimeError:  # the loop is closed: the server is gone
            job.stop.set()

    try:
        job.token = await _begin(ls, job)
        job.settings.configure_build(job.snapshot.path)
        if job.kind == "check":
            arch = job.settings.arch
            _checked(ls, job, await _unless_cancelled(job, ls.checks.compile(job.snapshot, arch)))
        elif job.kind == "optimize":
            result = await asyncio.to_thread(run_in_process, job, ls.executor_factory, forward)
            _optimized(ls, job, result.trajectory, result.proposal)
        elif job.kind == "generate":
            made = await asyncio.to_thread(run_in_process, job, ls.executor_factory, forward)
            _generated(ls, job, made)
        else:
            work = asyncio.to_thread(profile_work, job, ls.executor_factory)
            _profiled(ls, job, await _unless_cancelled(job, work))
    except Exception as e:
        message = failure(job, e)
        _end(ls, job, message)
        ls.tell(message, once=job.kind == "check")  # a compile's failure recurs on every save
    finally:
        _end(ls, job, "ended")
        ls.jobs.remove(job)


async def _unless_cancelled(job: Job, work: Awaitable[T]) -> T | None:
    """`work`, or None as soon as the job is cancelled: `work` is cancelled then (a compile's
    process group killed before this returns; a profile cannot stop halfway, what its thread
    finds after that is dropped)."""
    task = asyncio.ensure_future(work)
    cancelled = asyncio.ensure_future(job.cancelled.wait())
    try:
        await asyncio.wait({task, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()
    if task.done() and not job.cancelled.is_set():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # dropped with the job
        await task
    return None


def _checked(ls: JobHost, job: Job, outcome: CheckOutcome | None) -> None:
    if outcome is None:  # a newer snapshot, the document's closing or the progress's cancel
        _end(ls, job, f"{job.subject}: cancelled")
        return
    ls.checks.keep(outcome)
    if outcome.error is not None:
        kind = types.MessageType.Warning if outcome.tool_missing else types.MessageType.Error
        ls.tell(f"OptiML: {outcome.error}", kind, once=True)
    ls.republish(job.snapshot.uri)
    ls.refresh_inlay_hints()
    errors = sum(1 for m in outcome.messages if m.severity == "error")
    if outcome.error is not None:
        summary = "not compiled"
    elif outcome.ok:
        summary = DONE[job.kind]
    else:
        summary = f"{errors} compile error{'s' if errors != 1 else ''}"
    _end(ls, job, f"{job.subject}: {summary}")


def _optimized(ls: JobHost, job: Job, t: Trajectory, proposal: Proposal | None) -> None:
    line = _ascii_free(t.outcome)
    if t.stop == "cancelled":
        line = f"cancelled after {t.evaluations} of {job.settings.evaluations} evaluations; {line}"
    message = f"{job.kernel}: {line}"
    if proposal is not None:
        ls.proposals.add(proposal)
        message += " — Accept or Reject it with the code lens over the kernel"
        ls.refresh_code_lenses()
    _end(ls, job, message)
    if job.token is None:  # the client shows no progress: the outcome as a message
        ls.tell(f"OptiML: {message}", types.MessageType.Info)


def _generated(ls: JobHost, job: Job, made: Generated) -> None:
    if job.stop.is_set():  # as a cancelled search, a cancelled generate job proposes nothing
        _end(ls, job, f"{job.subject}: cancelled")
        return
    message = _ascii_free(made.message)
    ls.proposals.add(made.proposal)
    ls.refresh_code_lenses()
    _end(ls, job, message)
    if job.token is None:
        ls.tell(f"OptiML: {message}", types.MessageType.Info)


def _profiled(ls: JobHost, job: Job, found: KernelProfile | None) -> None:
    if found is None:
        _end(ls, job, f"{job.kernel}: cancelled")
        return
    ls.profiles.put(job.snapshot.uri, job.kernel, found)
    b = found.profile.bottleneck
    message = f"{job.kernel}: {b.kind} — {b.explanation}; hover the kernel's name for the profile"
    _end(ls, job, message)
    if job.token is None:
        ls.tell(f"OptiML: {message}", types.MessageType.Info)
    ls.republish(job.snapshot.uri)


def failure(job: Job, e: BaseException) -> str:
    what = f"OptiML: {VERB[job.kind]} `{job.subject}` failed"
    if isinstance(e, OptimlError):
        return f"{what}: {e}"
    logger.error("%s", what, exc_info=e)
    return f"{what} ({type(e).__name__}: {one_line(str(e), 200)}); see the server log"


def progress(event: Event) -> tuple[int | None, str]:
    """(percentage, message) of a search event: `12/48 evaluations · best 1.84× · dram ·
    vectorize: 1.31×`."""
    if event.phase != "search" or not event.budget:
        return None, _ascii_free(event.last)
    parts = [f"{event.evaluations}/{event.budget} evaluations"]
    if event.best_speedup is not None:
        parts.append(f"best {event.best_speedup:.2f}×")
    if event.bottleneck:
        parts.append(event.bottleneck)
    if event.last:
        parts.append(_ascii_free(event.last))
    return round(100 * (event.search_done() or 0.0)), " · ".join(parts)


def _ascii_free(text: str) -> str:
    """The library's `1.31x` and `->` as an editor shows them: `1.31×`, `→`."""
    return re.sub(r"(\d)x\b", r"\1×", text).replace(" -> ", " → ")


async def _begin(ls: JobHost, job: Job) -> str | None:
    if not ls.caps.work_done_progress:
        return None
    token = f"optiml/job/{job.id}"
    try:
        await ls.work_done_progress.create_async(token)
    except JsonRpcException:
        return None
    begin = types.WorkDoneProgressBegin(
        title=job.title,
        # a compile is ended by a newer save (or the document's closing), never asked to: VS Code
        # shows a cancellable progress as a notification, and one per save would be noise
        cancellable=job.kind != "check",
        message=f"{job.snapshot.name}, version {job.snapshot.version}",
        percentage=0,
    )
    ls.work_done_progress.begin(token, begin)
    return token


def _report(ls: JobHost, job: Job, event: Event) -> None:
    if job.token is None or job.ended:
        return
    percentage, message = progress(event)
    if percentage is not None:
        job.percentage = max(job.percentage, percentage)  # never backwards
    report = types.WorkDoneProgressReport(message=message, percentage=job.percentage)
    ls.work_done_progress.report(job.token, report)


def _end(ls: JobHost, job: Job, message: str) -> None:
    """End the job's progress, once."""
    if job.ended:
        return
    job.ended = True
    if job.token is not None:
        ls.work_done_progress.end(job.token, types.WorkDoneProgressEnd(message=message))
        ls.work_done_progress.tokens.pop(job.token, None)
