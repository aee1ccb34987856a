"""The worker: runs `protocol.Request`s where the GPU is, and answers with plain JSON.

`execute` runs one request in this process (the `local` executor calls it directly); `serve` is
`optiml worker`: a `Hello` line, then one JSON line per request line, until stdin ends. Nothing but
those lines reaches stdout (what a library or a compiler prints goes to stderr), and every failure
is an `{"error": ...}` line, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from typing import TextIO

from pydantic import ValidationError

from optiml import __version__
from optiml.errors import OptimlError, RemoteWorkerError, SpecValueError, UsageError, one_line
from optiml.executors.protocol import Gpu, Hello, Request, error_reply
from optiml.executors.registry import WorkExecutor


def hello() -> Hello:
    from optiml.harness.gpu import local_gpus

    return Hello(optiml=__version__, gpus=[Gpu(name=n, arch=a) for n, a in local_gpus()])


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
    source = SourceFile(request.text, request.path)
    if request.command == "check":
        return api.check_source(source, request.kernel, arch).to_json()
    if request.kernel is None:
        raise UsageError("eval needs a kernel")
    candidate = None
    if request.candidate_text is not None:
        candidate = SourceFile(request.candidate_text, request.candidate_path or "<candidate>")
    options = api.EvalOptions(arch=arch, timeout_s=request.timeout_s, time=request.time)
    verdict = api.evaluate_source(source, request.kernel, candidate, options)
    return json.loads(verdict.model_dump_json())


def answer(line: str) -> dict:
    """One request line's response: the result, or `{"error": ...}` (never an exception)."""
    from optiml.expr import ExprError

    try:
        request = Request.model_validate_json(line)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the request"
        return error_reply(
            OptimlError(f"not a request OptiML understands: {where}: {first['msg']}")
        )
    try:
        return execute(request)
    except OptimlError as e:
        return error_reply(e)
    except ExprError as e:  # as the CLI reports it
        return error_reply(SpecValueError(f"a value of the spec cannot be evaluated: {e}"))
    except Exception as e:
        if os.environ.get("OPTIML_DEBUG"):
            traceback.print_exc()  # to stderr: the caller's log, not the protocol
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

        def send(payload: dict) -> None:
            channel.write(json.dumps(payload) + "\n")
            channel.flush()

        send(hello().model_dump())
        for line in stdin:
            if line.strip():
                send(answer(line))
    return 0


class InProcess(WorkExecutor):
    """The `local` executor: the request runs here, in this process, as it always has."""

    in_process = True

    def __init__(self, url: str = "local"):
        self.url = url

    async def run(self, request: Request) -> dict:
        return execute(request)
