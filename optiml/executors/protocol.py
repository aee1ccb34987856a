"""Jobs as data: what crosses the wire between the `optiml` command and an `optiml worker`.

A request carries only text and flags (the file's text and the name the user knows it by, the
kernel, the target, the command and its options) and the caller's OptiML version. The worker
speaks JSON lines: a `Hello` first, then one response per request, which is either the command's
result exactly as `--json` prints it, or `{"error": {...}}` mirroring an `OptimlError`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from optiml import __version__
from optiml.errors import OptimlError, Position, ReportedError


class Request(BaseModel):
    """One job. `path` is the file as the user names it: messages and the result use it, and the
    worker never reads it (quoted `#include`s next to the file are not sent)."""

    model_config = ConfigDict(extra="forbid")

    optiml: str = __version__
    command: Literal["check", "eval"]
    path: str
    text: str
    kernel: str | None = None  # check: every kernel of the file when None
    arch: str | None = (
        None  # as given on the command line (`native` included): the worker resolves it
    )
    # eval only
    candidate_path: str | None = None
    candidate_text: str | None = None
    timeout_s: float = 60.0
    time: bool = True


class Gpu(BaseModel):
    name: str
    arch: str


class Hello(BaseModel):
    """The worker's first line: its version and the GPUs NVML finds there (none is an empty list)."""

    optiml: str
    gpus: list[Gpu]


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
    body = ErrorBody.model_validate(reply["error"])
    position = (
        Position(body.path, body.line, body.column or 1)
        if body.path is not None and body.line is not None
        else None
    )
    raise ReportedError(body.message, body.exit_code, position)
