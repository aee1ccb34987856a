"""Per-job accounting: tokens, cost, requests, retries, cache hits, and the budget that stops a job.

A request reserves its worst-case cost before it is sent, so concurrent requests cannot overspend.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from optiml.llm.errors import BudgetExceeded
from optiml.llm.messages import Usage

# Tokenizers differ per model, so the budget check estimates conservatively: about three
# characters per token (English prose is nearer four), plus a few tokens per message of framing.
_CHARS_PER_TOKEN = 3
_TOKENS_PER_MESSAGE = 4


def estimate_tokens(chars: int, messages: int = 0) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN) + _TOKENS_PER_MESSAGE * messages


def estimated_usage(request_chars: int, messages: int, answer: str) -> Usage:
    """What a request cost by our estimate, for a provider that reports no usage."""
    return Usage(
        input_tokens=estimate_tokens(request_chars, messages),
        output_tokens=estimate_tokens(len(answer)),
        estimated=True,
    )


class Accounting:
    """What one job has spent; shared by every client that works for the job."""

    def __init__(self, budget_usd: float | None = None):
        self.budget_usd = budget_usd
        self.requests = 0
        self.cache_hits = 0
        self.retries = 0
        self.failures = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_usd = 0.0
        self.unpriced_requests = 0
        self._in_flight_usd = 0.0

    @contextmanager
    def reserve(self, estimate_usd: float) -> Iterator[None]:
        """Hold `estimate_usd` against the budget while a request runs; raise if it would not fit.

        A request that succeeds is `settle`d inside the block; if the block raises, the request
        counts as failed and costs nothing (providers do not bill failed requests).
        """
        if self.budget_usd is not None:
            committed = self.cost_usd + self._in_flight_usd
            if committed + estimate_usd > self.budget_usd:
                raise BudgetExceeded(
                    f"budget of ${self.budget_usd:.4f} would be exceeded: spent "
                    f"${self.cost_usd:.4f} (${self._in_flight_usd:.4f} more in flight), and the "
                    f"next request may cost up to ${estimate_usd:.4f}; nothing was sent"
                )
        self._in_flight_usd += estimate_usd
        try:
            yield
        except BaseException:
            self.failures += 1
            raise
        finally:
            self._in_flight_usd -= estimate_usd

    def settle(self, usage: Usage, cost_usd: float | None) -> None:
        self.requests += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        if cost_usd is None:
            self.unpriced_requests += 1
        else:
            self.cost_usd += cost_usd

    def record_cache_hit(self) -> None:
        self.cache_hits += 1

    def record_retry(self) -> None:
        self.retries += 1

    @property
    def remaining_usd(self) -> float | None:
        return None if self.budget_usd is None else max(0.0, self.budget_usd - self.cost_usd)

    def as_dict(self) -> dict[str, Any]:
        """The numbers a report or a trajectory records."""
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "retries": self.retries,
            "failures": self.failures,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "unpriced_requests": self.unpriced_requests,
            "budget_usd": self.budget_usd,
        }
