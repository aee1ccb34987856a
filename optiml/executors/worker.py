"""The worker: runs `protocol.Request`s where the GPU is, and answers with plain JSON.

`execute` runs one request in this process (the `local` executor calls it directly); `serve` is
`optiml worker`: a `Hello` line, then one JSON line per request line, until stdin ends. Nothing but
those lines reaches stdout (what a library or a compiler prints goes to stderr), and every failure
is an `{"error": ...}` line, never a traceback.

The search's jobs (requests with an `id`) run concurrently on the worker's search executor — this
machine's GPUs, one job per GPU at a time (`LocalExecutor`), compiles in parallel on its CPUs — and
are answered as they finish. When stdin ends (the caller closed the connection, or lost it), the
jobs in flight are cancelled and every process group they started is killed.

`OPTIML_WORKER_EXECUTOR=module:callable` names a factory of the search executor to use instead of
`LocalExecutor` (the callable takes no arguments and returns an `executors.base.Executor`); its
`slots` are announced in the hello. Tests use it to stand in for a GPU.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import tempfile
import threading
import traceback
from dataclasses import replace
from typing import Any, TextIO

from pydantic import ValidationError

from optiml import __version__
from optiml.errors import OptimlError, RemoteWorkerError, SpecValueError, UsageError, one_line
from optiml.executors.protocol import SEARCH_COMMANDS, Gpu, Hello, Request, error_reply, options_of
from optiml.executors.work import WorkExecutor

EXECUTOR_HOOK = "OPTIML_WORKER_EXECUTOR"


def hello(slots: int | None = None) -> Hello:
    from optiml.harness.gpu import local_gpus

    gpus = [Gpu(name=n, arch=a) for n, a in local_gpus()]
    return Hello(optiml=__version__, gpus=gpus, slots=slots)


def search_executor(gpus: list[int] | None = None):
    """The executor the search's jobs run on here: `OPTIML_WORKER_EXECUTOR`'s factory, else this
    machine's GPUs (`gpus`, default all; `NoGpu` without one)."""
    hook = os.environ.get(EXECUTOR_HOOK)
    if not hook:
        from optiml.executors.local import LocalExecutor

        return LocalExecutor(gpus)
    module, _, name = hook.partition(":")
    try:
        return getattr(importlib.import_module(module), name)()
    except Exception as e:
        raise OptimlError(
            f"{EXECUTOR_HOOK}={hook}: not a factory of an executor ({type(e).__name__}: "
            f"{one_line(str(e))}); write module:callable"
        ) from None


def hooked() -> bool:
    return bool(os.environ.get(EXECUTOR_HOOK))


def configure_request(request: Request) -> None:
    """The build options the caller resolved for the file (and a candidate file) hold here."""
    from optiml.harness.project import BuildOptions, configure

    if request.build is not None:
        given = BuildOptions.model_validate(request.build)
        for path in {request.path, request.candidate_path or request.path}:
            configure(path, given, database=None)


async def run_search(request: Request, executor) -> Any:
    """A search job's result as JSON values (a `Verdict`, a `Profile`, a `SanitizerReport`)."""
    from optiml.executors.base import Job

    if request.optiml != __version__:
        raise RemoteWorkerError(
            f"the worker runs OptiML {__version__} and the request comes from OptiML "
            f"{request.optiml}: install the same version on both machines"
        )
    configure_request(request)
    job = Job.of_request(request)
    if request.command == "evaluate":
        result = await executor.evaluate(job, options_of(request.options), pinned=request.pinned)
    elif request.command == "profile":
        result = await executor.profile(job, full=request.full)
    else:
        if request.tool is None:
            raise UsageError("sanitize needs a tool (memcheck, initcheck, racecheck, synccheck)")
        result = await executor.sanitize(job, request.tool, request.sizes)
    return result.model_dump(mode="json")


async def answer_search(request: Request, executor) -> dict:
    """`{"id", "result"}` or `{"id", "error"}` for a search job (never an exception)."""
    try:
        return {"id": request.id, "result": await run_search(request, executor)}
    except Exception as e:
        return {"id": request.id, **_error(e)}


def execute(request: Request) -> dict:
    """The request's result as `optiml COMMAND --json` prints it; an `OptimlError` otherwise."""
    from optiml import api
    from optiml.arch import resolve_arch
    from optiml.cuda.source import SourceFile

    if request.optiml != __version__:
        raise RemoteWorkerError(
            f"the worker runs OptiML {__version__} and the request comes from OptiML "
            f"{request.optiml}: install the same version on both machines"
        )
    arch = resolve_arch(request.arch)
    configure_request(request)
    source = SourceFile(request.text, request.path)
    if request.command == "check":
        return api.check_source(source, request.kernel, arch).to_json()
    if request.kernel is None:
        raise UsageError("eval needs a kernel")
    candidate = None
    if request.candidate_text is not None:
        candidate = SourceFile(request.candidate_text, request.candidate_path or "<candidate>")
    options = api.EvalOptions(arch=arch, timeout_s=request.timeout_s, time=request.time)
    if request.numpy_all_sizes:
        options = replace(options, numpy_elements=None)
    verdict = api.evaluate_source(source, request.kernel, candidate, options)
    return json.loads(verdict.model_dump_json())


def answer(line: str) -> dict:
    """One request line's response: the result, or `{"error": ...}` (never an exception)."""

    request = parse(line)
    if isinstance(request, dict):
        return request
    try:
        return execute(request)
    except Exception as e:
        return _error(e)


def parse(line: str) -> Request | dict:
    """The request on a line, or the error reply for a line that is not one."""
    try:
        return Request.model_validate_json(line)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the request"
        return error_reply(
            OptimlError(f"not a request OptiML understands: {where}: {first['msg']}")
        )


def _error(e: Exception) -> dict:
    """`{"error": ...}` for what a request raised: an `OptimlError` as it is, anything else as one
    line of internal error (its traceback on stderr with OPTIML_DEBUG)."""
    from optiml.expr import ExprError

    if isinstance(e, OptimlError):
        return error_reply(e)
    if isinstance(e, ExprError):  # as the CLI reports it
        return error_reply(SpecValueError(f"a value of the spec cannot be evaluated: {e}"))
    if os.environ.get("OPTIML_DEBUG"):
        traceback.print_exception(e)  # to stderr: the caller's log, not the protocol
    return error_reply(
        OptimlError(f"internal error on the worker: {type(e).__name__}: {one_line(str(e))}")
    )


def answer_apart(line: str) -> dict:
    """`answer` in a private temporary folder (for a worker process that runs other jobs, a Ray
    worker's): a relative file name resolves to nothing of the machine's."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="optiml-job-") as tmp:
        os.chdir(tmp)
        try:
            return answer(line)
        finally:
            os.chdir(here)


def hello_json() -> dict:
    return hello().model_dump()


def serve(stdin: TextIO | None = None) -> int:
    """`optiml worker`: the hello, then a response per request line, on the real stdout only.

    The process's stdout (fd 1) is pointed at stderr for the duration, so that nothing else (nvcc,
    a library's print) can break a line; the worker runs in a private temporary folder, so a
    relative file name resolves to nothing of the remote user's."""
    stdin = stdin or sys.stdin
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with tempfile.TemporaryDirectory(prefix="optiml-worker-") as tmp:
        os.chdir(tmp)
        lock = threading.Lock()

        def send(payload: dict) -> None:
            with lock:
                channel.write(json.dumps(payload) + "\n")
                channel.flush()

        asyncio.run(_serve(stdin, send))
    return 0


async def _serve(stdin: TextIO, send) -> None:
    """Requests without an id one after another, in order; the search's (with an id) at once, on
    the search executor, made at the first (its slots said in the hello where a hook makes it)."""
    from optiml.harness import procs

    executor = None
    try:
        executor = search_executor() if hooked() else None
        send(hello(executor.slots if executor is not None else None).model_dump())
    except OptimlError as e:
        send(error_reply(e))
        return
    jobs: dict[int, asyncio.Task] = {}
    try:
        while line := await asyncio.to_thread(stdin.readline):
            if not line.strip():
                continue
            request = parse(line)
            if isinstance(request, dict):
                send(request)
            elif request.id is None:
                send(await asyncio.to_thread(answer, line))
            elif request.command == "cancel":
                if (task := jobs.pop(request.id, None)) is not None:
                    task.cancel()
            elif request.command in SEARCH_COMMANDS:
                if executor is None:
                    try:
                        executor = search_executor()
                    except Exception as e:
                        send({"id": request.id, **_error(e)})
                        continue
                jobs[request.id] = asyncio.create_task(_job(request, executor, send, jobs))
            else:  # a check or an eval with an id: in order with the others, answered with it
                reply = await asyncio.to_thread(answer, line)
                send(
                    {"id": request.id, "result": reply}
                    if "error" not in reply
                    else {"id": request.id, **reply}
                )
    finally:
        for task in jobs.values():
            task.cancel()
        procs.kill_all()  # what the jobs in flight started: runners, sanitizers, profilers
        if jobs:
            await asyncio.gather(*jobs.values(), return_exceptions=True)
        if executor is not None:
            await executor.close()


async def _job(request: Request, executor, send, jobs: dict) -> None:
    reply = await answer_search(request, executor)
    if jobs.pop(request.id, None) is not None:  # not cancelled meanwhile
        send(reply)


class InProcess(WorkExecutor):
    """The `local` executor: the request runs here, in this process, as it always has."""

    in_process = True

    def __init__(self, url: str = "local"):
        self.url = url

    async def run(self, request: Request) -> dict:
        return execute(request)
