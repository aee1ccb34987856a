"""Retries of transient failures: exponential backoff with jitter, honouring retry-after.

The SDKs' own retries are off (`max_retries=0`) so that the waits are ours: bounded, logged,
counted in the accounting, and testable with an injected sleep and random source.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from optiml.llm.errors import LLMError
from optiml.llm.settings import LLMSettings

log = logging.getLogger("optiml.llm")
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry number n (from 1) waits a uniform time in [c/2, c], c = min(max_delay_s, base·2^(n−1)).

    A server's retry-after r is a floor: the wait is max(r, that backoff). An r above
    `max_retry_after_s` is not waited for; the error is raised at once with the delay it asked.
    """

    max_retries: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    max_retry_after_s: float = 60.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)
    random: Callable[[], float] = field(default=random.random)

    @classmethod
    def from_settings(cls, settings: LLMSettings, **overrides: object) -> RetryPolicy:
        """The policy `settings` ask for; `overrides` replace fields (tests inject `sleep`)."""
        policy = cls(max_retries=settings.max_retries, max_retry_after_s=settings.max_retry_wait_s)
        return replace(policy, **overrides)

    def backoff_bounds(self, retry: int) -> tuple[float, float]:
        ceiling = min(self.max_delay_s, self.base_delay_s * 2.0 ** min(retry - 1, 60))
        return ceiling / 2, ceiling

    def delay(self, retry: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number `retry`, or None if the server asks for too long."""
        low, high = self.backoff_bounds(retry)
        backoff = low + (high - low) * self.random()
        if retry_after is None:
            return backoff
        if retry_after > self.max_retry_after_s:
            return None
        return max(retry_after, backoff)


def parse_retry_after(
    headers: Mapping[str, str], now: Callable[[], float] = time.time
) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date); None if absent."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            parsed = email.utils.parsedate_tz(value)
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - now()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


async def with_retries(
    send: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[], None],
) -> T:
    """Await `send()` until it succeeds, fails for good, or the retries run out."""
    retry = 0
    while True:
        try:
            return await send()
        except LLMError as error:
            if not error.retryable:
                raise
            if retry >= policy.max_retries:
                if retry:
                    _annotate(error, f"(gave up after {retry + 1} attempts)")
                raise
            retry += 1
            delay = policy.delay(retry, error.retry_after)
            if delay is None:
                _annotate(
                    error,
                    f"(the server asks to retry after {error.retry_after:.0f} s, longer than "
                    f"max_retry_wait_s = {policy.max_retry_after_s:g})",
                )
                raise
            log.warning(
                "%s; retrying in %.2f s (retry %d of %d)", error, delay, retry, policy.max_retries
            )
            on_retry()
            await policy.sleep(delay)


def _annotate(error: LLMError, note: str) -> None:
    error.message = f"{error.message} {note}"
    error.args = (error.message,)
