"""Errors a user can cause, each with a one-line message, an optional file position and an exit code.

The CLI prints `str(error)` and exits with `error.exit_code`; the language server turns the position
into a diagnostic. Nothing here knows about CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Distinct exit codes of the `optiml` command (documented in `optiml --help`)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    FILE = 3
    NO_KERNEL = 4
    BAD_SPEC = 5
    NO_NVCC = 6
    NO_GPU = 7
    COMPILE_ERROR = 8
    RUNTIME_ERROR = 9
    TIMEOUT = 10
    WRONG_RESULT = 11
    NO_NCU = 12
    PROFILE_FAILED = 13
    FORBIDDEN_CODE = 14
    MODIFIED_INPUT = 15
    BELOW_FLOOR = 16
    REMOTE_UNREACHABLE = 17
    HOST_KEY_NOT_TRUSTED = 18
    REMOTE_WORKER = 19
    BAD_FORMULA = 24  # 20-23 are the LLM's (optiml.llm.errors)


def one_line(text: str) -> str:
    """`text` as one printable line: a line break, a NUL or another control character that came
    from the user's input is shown escaped (`\\r`, `\\x00`) instead of breaking the line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def quote(text: str, limit: int = 60) -> str:
    """A piece of the user's input inside a message: one line, cut to `limit` characters."""
    text = one_line(text.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Position:
    """A place in a file: 1-based line and column, as editors and compilers print them."""

    path: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


class OptimlError(Exception):
    """A failure caused by the input or the environment, not by a bug in OptiML."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, position: Position | None = None):
        super().__init__(message)
        self.message = message
        self.position = position

    def __str__(self) -> str:
        return f"{self.position}: {self.message}" if self.position else self.message


class UsageError(OptimlError):
    """A command-line value that cannot be right (an unknown `--arch`, a bad `--gpus`)."""

    exit_code = ExitCode.USAGE


class SourceWarning(UserWarning):
    """Something about the user's input that OptiML works around and says so (a file that is not
    UTF-8); the CLI prints it as one `optiml: warning:` line."""


class InputFileError(OptimlError):
    exit_code = ExitCode.FILE


class NoSuchKernel(OptimlError):
    exit_code = ExitCode.NO_KERNEL


class SpecError(OptimlError):
    """One or more errors in an `@optiml` spec; `issues` holds each with its position."""

    exit_code = ExitCode.BAD_SPEC

    def __init__(self, issues: list[tuple[str, Position]]):
        self.issues = issues
        first_message, first_position = issues[0]
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        super().__init__(first_message + more, first_position)


class SpecValueError(OptimlError):
    """A value of a parsed spec that cannot be evaluated at run time, where no position is known."""

    exit_code = ExitCode.BAD_SPEC


class FormulaError(OptimlError):
    """A formula of `optiml generate` that cannot become a kernel: a syntax error, an unbound
    index, a shape mismatch, an unknown function or type, a temporary used before it is defined.
    The message says what would be right; the position is in the formula (or the file it is in)."""

    exit_code = ExitCode.BAD_FORMULA


class CompileFailed(OptimlError):
    """The kernel does not compile where a command needs it built (a profile, a sanitizer run);
    `optiml check` and `optiml eval` report compiler messages instead."""

    exit_code = ExitCode.COMPILE_ERROR


class ToolMissing(OptimlError):
    exit_code = ExitCode.NO_NVCC


class NoGpu(OptimlError):
    exit_code = ExitCode.NO_GPU


class NcuMissing(OptimlError):
    exit_code = ExitCode.NO_NCU


class RemoteUnreachable(OptimlError):
    """The machine named by `--executor` cannot be reached or refuses the login."""

    exit_code = ExitCode.REMOTE_UNREACHABLE


class HostKeyNotTrusted(OptimlError):
    """The remote machine's SSH host key is not in known_hosts, or differs from the one there."""

    exit_code = ExitCode.HOST_KEY_NOT_TRUSTED


class RemoteWorkerError(OptimlError):
    """No `optiml worker` answers on the remote machine, or it runs another version of OptiML."""

    exit_code = ExitCode.REMOTE_WORKER


class ReportedError(OptimlError):
    """An error a worker reported for a job, with the exit code it has where it happened."""

    def __init__(self, message: str, exit_code: int, position: Position | None = None):
        super().__init__(message, position)
        try:
            self.exit_code = ExitCode(exit_code)
        except ValueError:  # a code of another part (the LLM's) or a newer worker's
            self.exit_code = exit_code  # type: ignore[assignment]
