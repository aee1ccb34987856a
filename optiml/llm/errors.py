"""Typed errors of the LLM layer, each with a one-line message that never contains an API key.

Every error is an `OptimlError`, so the CLI prints `str(error)` and exits with `error.exit_code`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum

from optiml.errors import OptimlError


class LLMExitCode(IntEnum):
    """Exit codes of LLM failures, above those of `optiml.errors.ExitCode` so they never collide.

    `optiml llm check` documents them in its help.
    """

    NO_KEY = 20
    AUTH_FAILED = 21
    UNREACHABLE = 22
    LLM_ERROR = 23


class LLMError(OptimlError):
    """Base of every failure of the LLM layer.

    `retryable` says whether the same request may succeed if sent again (rate limits, overloaded or
    unreachable servers); `retry_after` is the delay in seconds the server asked for, if any.
    """

    exit_code = LLMExitCode.LLM_ERROR
    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ConfigError(LLMError):
    """The LLM settings are invalid or incomplete (unknown provider, no model, bad value)."""


class MissingAPIKey(ConfigError):
    exit_code = LLMExitCode.NO_KEY


class Offline(LLMError):
    """A request was made while the provider is `offline`; callers use their built-in policy."""


class AuthenticationFailed(LLMError):
    exit_code = LLMExitCode.AUTH_FAILED


class ModelNotFound(LLMError):
    pass


class ContextOverflow(LLMError):
    """The prompt does not fit in the model's context window."""


class RequestRejected(LLMError):
    """The provider rejected the request as malformed (HTTP 400/422 other than context overflow)."""


class RateLimited(LLMError):
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, retryable: bool = True):
        super().__init__(message, retry_after=retry_after)
        self.retryable = retryable


class ProviderUnavailable(LLMError):
    """The server could not be reached, failed (5xx), or sent a response that cannot be read."""

    exit_code = LLMExitCode.UNREACHABLE
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, retryable: bool = True):
        super().__init__(message, retry_after=retry_after)
        self.retryable = retryable


class RequestTimeout(ProviderUnavailable):
    pass


class InvalidStructuredOutput(LLMError):
    """The model's output did not validate against the schema, even after one repair round."""


class Refused(LLMError):
    """The model declined to answer (a refusal or a content filter)."""


class BudgetExceeded(LLMError):
    """Sending the next request could take the job over its budget; nothing was sent."""


class ReplayMiss(LLMError):
    """Replay mode found no recorded response for a request; nothing was sent."""


# Key-shaped tokens ("sk-…", "sk-ant-…", "Bearer …") that a server may echo in an error body.
_KEY_LIKE = re.compile(r"(?i)(sk-[A-Za-z0-9_\-*.]{6,}|bearer\s+[A-Za-z0-9_\-.=]{6,})")


def redact(text: str, secrets: Iterable[str] = (), *, key_shaped: bool = True) -> str:
    """`text` with each secret, and (if `key_shaped`) anything shaped like a key, redacted."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _KEY_LIKE.sub("[redacted]", text) if key_shaped else text


def one_line(text: str, secrets: Iterable[str] = (), limit: int = 200) -> str:
    """A provider's error text made fit for a one-line message: redacted, collapsed, truncated."""
    flat = " ".join(redact(text, secrets).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
