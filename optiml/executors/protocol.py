"""Jobs as data: what crosses the wire between the `optiml` command and an `optiml worker`.

A request carries only text and flags (the file's text and the name the user knows it by, the
kernel, the target, the command and its options) and the caller's OptiML version. The worker
speaks JSON lines: a `Hello` first, then one response per request, which is either the command's
result exactly as `--json` prints it, or `{"error": {...}}` mirroring an `OptimlError`.

The search's jobs (`evaluate`, `profile`, `sanitize` of a candidate: `executors.base.Job` as data,
with `EvalOptions` as data) carry an `id`; the worker runs them concurrently and answers each as
`{"id": N, "result": ...}` or `{"id": N, "error": {...}}`, in the order they finish. A request with
an `id` may be cancelled by `{"command": "cancel", "id": N}` (no answer follows).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter

from optiml import __version__
from optiml.errors import OptimlError, Position, ReportedError
from optiml.harness.evaluate import EvalOptions

SEARCH_COMMANDS = ("evaluate", "profile", "sanitize")


class Request(BaseModel):
    """One job. `path` is the file as the user names it: messages and the result use it, and the
    worker never reads it (quoted `#include`s next to the file are not sent)."""

    model_config = ConfigDict(extra="forbid")

    optiml: str = __version__
    command: Literal["check", "eval", "evaluate", "profile", "sanitize", "cancel"]
    id: int | None = None  # answered with the same id, in any order; the search's jobs have one
    path: str = ""
    text: str = ""
    kernel: str | None = None  # check: every kernel of the file when None
    arch: str | None = (
        None  # as given on the command line (`native` included): the worker resolves it
    )
    # eval only
    candidate_path: str | None = None
    candidate_text: str | None = None
    timeout_s: float = 60.0
    time: bool = True
    numpy_all_sizes: bool = False  # a NumPy reference at every size, however large
    # the search's jobs: a candidate (`candidate_text`, None: the kernel itself) built with `flags`
    spec: dict[str, Any] | None = None  # the contract (`Spec`) the caller holds for the kernel
    flags: list[str] | None = None
    # the file's build options (`project.BuildOptions` as data: -I, -D, --std, nvcc flags), as the
    # caller resolved them; a remote machine gets the macros and the standard, not the headers
    build: dict[str, Any] | None = None
    options: dict[str, Any] | None = None  # evaluate: `EvalOptions` as data (`options_data`)
    pinned: bool = False  # evaluate: on the executor's first GPU
    full: bool = False  # profile: the full set
    tool: str | None = None  # sanitize: memcheck, initcheck, racecheck, synccheck
    sizes: list[dict[str, int]] | None = None  # sanitize: the sizes (None: the spec's smallest)


_OPTIONS = TypeAdapter(EvalOptions)


def options_data(options: EvalOptions) -> dict[str, Any]:
    """`EvalOptions` as JSON values. Its `env` and `workdir` are this machine's (the GPU a run is
    given, a folder) and do not cross: the other side sets its own."""
    return _OPTIONS.dump_python(replace(options, env={}, workdir=None), mode="json")


def options_of(data: dict[str, Any] | None) -> EvalOptions:
    return _OPTIONS.validate_python(data) if data is not None else EvalOptions()


class Gpu(BaseModel):
    name: str
    arch: str


class Hello(BaseModel):
    """The worker's first line: its version and the GPUs NVML finds there (none is an empty list)."""

    optiml: str
    gpus: list[Gpu]
    slots: int | None = None  # the search's jobs it runs at once (None: one per GPU)

    @property
    def search_slots(self) -> int:
        return len(self.gpus) if self.slots is None else self.slots


class ErrorBody(BaseModel):
    exit_code: int
    message: str  # one line
    path: str | None = None
    line: int | None = None
    column: int | None = None


class ErrorReply(BaseModel):
    error: ErrorBody


def error_reply(e: OptimlError) -> dict:
    """`{"error": {...}}` for an `OptimlError`: its exit code, its one-line message, its position."""
    body = ErrorBody(exit_code=int(e.exit_code), message=e.message)
    if e.position is not None:
        body.path, body.line, body.column = e.position.path, e.position.line, e.position.column
    return ErrorReply(error=body).model_dump(exclude_none=True)


def raise_if_error(reply: dict) -> dict:
    """The reply itself, or the `OptimlError` it carries raised as it would be raised locally."""
    if set(reply) != {"error"}:
        return reply
    raise reported(reply["error"])


def result_of(reply: dict) -> Any:
    """An answer with an id: its `result`, or the `OptimlError` its `error` carries, raised."""
    if "error" in reply:
        raise reported(reply["error"])
    return reply["result"]


def reported(error: dict) -> ReportedError:
    body = ErrorBody.model_validate(error)
    position = (
        Position(body.path, body.line, body.column or 1)
        if body.path is not None and body.line is not None
        else None
    )
    return ReportedError(body.message, body.exit_code, position)
