"""What every backend does: send one `ChatRequest` once, and turn any failure into a typed `LLMError`.

Retries, caching, budgets and concurrency live above, in `optiml.llm.client`; a backend makes one
attempt.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from optiml.llm.errors import (
    AuthenticationFailed,
    ContextOverflow,
    LLMError,
    ModelNotFound,
    ProviderUnavailable,
    RateLimited,
    RequestRejected,
    RequestTimeout,
    one_line,
)
from optiml.llm.messages import ChatRequest, ChatResult
from optiml.llm.retry import parse_retry_after
from optiml.llm.settings import ApiKey, LLMSettings

# How providers phrase "the prompt is too long": OpenAI's code, llama.cpp's type, Anthropic's and
# vLLM's messages, and the wording of other OpenAI-compatible servers.
_OVERFLOW = re.compile(
    r"context_length_exceeded|exceed_context_size|context length|context window|context size"
    r"|maximum context|prompt is too long|too many tokens|input is too long|reduce the length",
    re.IGNORECASE,
)
_QUOTA = re.compile(r"insufficient_quota|quota|billing|credit balance", re.IGNORECASE)


def display_url(url: str) -> str:
    """`url` without user info, query or fragment, which may carry credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class Backend(ABC):
    """One provider's SDK client, configured once; `complete` makes exactly one HTTP request."""

    provider: str
    default_base_url: str

    def __init__(self, settings: LLMSettings, key: ApiKey | None):
        self.settings = settings
        self.model = settings.model or ""
        self.base_url = settings.base_url or self.default_base_url
        self.key_source = key.source if key else None
        self._secrets = (key.reveal(),) if key else ()

    @property
    def label(self) -> str:
        if self.settings.base_url is None:
            return self.provider
        return f"{self.provider} at {display_url(self.base_url)}"

    @abstractmethod
    async def complete(self, request: ChatRequest) -> ChatResult:
        """The answer to `request`, or a typed `LLMError`; never retries."""

    @abstractmethod
    async def aclose(self) -> None: ...

    def clean(self, text: object) -> str:
        return one_line(str(text), self._secrets)

    def status_error(
        self,
        status: int,
        message: str,
        *,
        code: str | None,
        kind: str | None,
        headers: Mapping[str, str],
    ) -> LLMError:
        """The typed error for an HTTP error status, from the provider's code, type and message."""
        detail = self.clean(message) or f"HTTP {status}"
        evidence = " ".join(part for part in (code, kind, message) if part)
        retry_after = parse_retry_after(headers)
        error: LLMError
        if status == 401:
            source = f" from ${self.key_source}" if self.key_source else ""
            error = AuthenticationFailed(
                f"{self.label} rejected the API key{source} (401): {detail}"
            )
        elif status == 403:
            error = AuthenticationFailed(f"{self.label} denied access (403): {detail}")
        elif status == 404 and "model" in evidence.lower():
            error = ModelNotFound(
                f"model {self.model!r} is not available from {self.label} (404): {detail}"
            )
        elif status == 404:
            error = RequestRejected(
                f"{self.label} has no such endpoint (404): {detail}; check the base URL "
                "(OpenAI-compatible servers usually serve under /v1)"
            )
        elif status in (400, 413, 422) and _OVERFLOW.search(evidence):
            error = ContextOverflow(
                f"the prompt does not fit in the context window of {self.model} "
                f"({status}): {detail}"
            )
        elif status == 429:
            exhausted = bool(_QUOTA.search(evidence))
            what = "quota is exhausted" if exhausted else "rate limit reached"
            error = RateLimited(
                f"{self.label} {what} (429): {detail}",
                retry_after=retry_after,
                retryable=not exhausted,
            )
        elif status in (408, 409) or status >= 500:
            error = ProviderUnavailable(
                f"{self.label} is unavailable ({status}): {detail}", retry_after=retry_after
            )
        else:
            error = RequestRejected(f"{self.label} rejected the request ({status}): {detail}")
        # OpenAI and Anthropic servers say explicitly whether a retry can help; believe them.
        should_retry = headers.get("x-should-retry")
        if isinstance(error, RateLimited | ProviderUnavailable) and should_retry in (
            "true",
            "false",
        ):
            error.retryable = should_retry == "true"
        return error

    def timed_out(self) -> RequestTimeout:
        return RequestTimeout(f"{self.label} did not answer within {self.settings.timeout_s:g} s")

    def unreachable(self, reason: object) -> ProviderUnavailable:
        return ProviderUnavailable(
            f"cannot reach {self.provider} at {display_url(self.base_url)}: {self.clean(reason)}"
        )

    def malformed(self, reason: object) -> ProviderUnavailable:
        return ProviderUnavailable(
            f"{self.label} sent a response that cannot be read: {self.clean(reason)}"
        )
