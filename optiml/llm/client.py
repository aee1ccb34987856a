"""`LLMClient`: the one interface callers use, and `make_client`, which builds it from settings.

Each call goes cache → budget → concurrency limit → retries → backend, in that order, so a cached
answer costs nothing, a refused budget sends nothing, and waiting for a slot does not time out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel

from optiml.llm.accounting import Accounting, estimate_tokens
from optiml.llm.cache import ResponseCache, cache_key
from optiml.llm.errors import (
    ConfigError,
    InvalidStructuredOutput,
    Offline,
    Refused,
    ReplayMiss,
    one_line,
)
from optiml.llm.messages import (
    ChatRequest,
    ChatResult,
    Message,
    StructuredSpec,
    normalize_messages,
)
from optiml.llm.prices import Price, price_for
from optiml.llm.providers import Backend, display_url, make_backend
from optiml.llm.retry import RetryPolicy, with_retries
from optiml.llm.settings import LLMSettings, resolve_api_key
from optiml.llm.structured import ReplyProblem, parse_reply, repair_instruction

log = logging.getLogger("optiml.llm")
T = TypeVar("T", bound=BaseModel)
MessageLike = Message | Mapping[str, str]

DEFAULT_CACHE_DIR = Path(".optiml") / "llm-cache"

# One concurrency limit per provider endpoint, shared by every client in the process. Semaphores
# belong to an event loop, hence one table per loop, dropped with the loop.
_LIMITERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], asyncio.Semaphore]
] = weakref.WeakKeyDictionary()


def _limiter(endpoint: tuple[Any, ...], limit: int) -> asyncio.Semaphore:
    per_loop = _LIMITERS.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((*endpoint, limit), asyncio.Semaphore(limit))


class LLMClient:
    """Chat and structured output against the configured provider, with cache and accounting."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        backend: Backend | None,
        accounting: Accounting,
        cache: ResponseCache | None,
        retry: RetryPolicy,
        price: Price | None,
    ):
        self.settings = settings
        self.accounting = accounting
        self._backend = backend
        self._cache = cache
        self._retry = retry
        self._price = price
        self._key_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @property
    def offline(self) -> bool:
        """True when no LLM is configured; callers then use their built-in policy."""
        return self.settings.provider == "offline"

    async def chat(
        self,
        messages: Iterable[MessageLike],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        prompt_id: str | None = None,
        use_cache: bool = True,
    ) -> ChatResult:
        """The model's reply to `messages`; raises `Refused` if the model declined.

        `temperature` and `max_tokens` default to the settings'; `prompt_id` (a prompt's
        `name@version`) joins the cache key; `use_cache=False` asks the provider even if the
        answer is cached, and records the new answer.
        """
        request = self._request(messages, temperature, max_tokens, stop, None)
        return self._accepted(await self._complete(request, prompt_id, use_cache))

    async def structured(
        self,
        messages: Iterable[MessageLike],
        schema: type[T],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        prompt_id: str | None = None,
        use_cache: bool = True,
    ) -> T:
        """The model's reply as a validated `schema` instance.

        Uses the provider's native structured output; if the reply does not validate, sends the
        errors back once and validates the answer; then raises `InvalidStructuredOutput`.
        """
        spec = StructuredSpec.of(schema)
        request = self._request(messages, temperature, max_tokens, (), spec)
        first = self._accepted(await self._complete(request, prompt_id, use_cache))
        try:
            return parse_reply(first.text, schema)
        except ReplyProblem as problem:
            log.info(
                "%s reply did not validate (%s); asking once to repair it", schema.__name__, problem
            )
            repair = replace(
                request,
                messages=(
                    *request.messages,
                    Message(role="assistant", content=first.text or "(empty reply)"),
                    Message(role="user", content=repair_instruction(problem, schema)),
                ),
            )
        second = self._accepted(await self._complete(repair, prompt_id, use_cache))
        try:
            return parse_reply(second.text, schema)
        except ReplyProblem as problem:
            cut = (
                " (the reply was cut off at max_tokens)" if second.finish_reason == "length" else ""
            )
            raise InvalidStructuredOutput(
                f"{self.settings.model} gave no valid {schema.__name__} after one repair round: "
                f"{one_line(str(problem))}{cut}"
            ) from None

    async def aclose(self) -> None:
        if self._backend is not None:
            await self._backend.aclose()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _request(
        self,
        messages: Iterable[MessageLike],
        temperature: float | None,
        max_tokens: int | None,
        stop: Sequence[str],
        spec: StructuredSpec | None,
    ) -> ChatRequest:
        return ChatRequest(
            messages=normalize_messages(messages),
            max_tokens=max_tokens or self.settings.max_tokens,
            temperature=self.settings.temperature if temperature is None else temperature,
            stop=tuple(stop),
            structured=spec,
        )

    def _accepted(self, result: ChatResult) -> ChatResult:
        if result.refusal is not None:
            raise Refused(f"{result.model} refused to answer: {one_line(result.refusal)}")
        return result

    async def _complete(
        self, request: ChatRequest, prompt_id: str | None, use_cache: bool
    ) -> ChatResult:
        if self.offline:
            raise Offline("the LLM provider is `offline`, so no LLM requests are made")
        material = self._key_material(request, prompt_id)
        key = cache_key(material)
        if self._cache is None:
            return await self._send(request, key, prompt_id)
        if not use_cache and not self.settings.replay:
            # A fresh answer was asked for; it still replaces the recorded one.
            result = await self._send(request, key, prompt_id)
            self._cache.put(key, material, result)
            return result
        # Identical requests in flight at once wait for the first, then find its answer cached.
        async with self._exclusive(key):
            hit = self._cache.get(key)
            if hit is not None:
                self.accounting.record_cache_hit()
                log.debug("cache hit %s (%s)", key[:12], prompt_id or "no prompt id")
                return hit.model_copy(
                    update={"cached": True, "cost_usd": 0.0, "key": key, "latency_s": 0.0}
                )
            result = await self._send(request, key, prompt_id)
            self._cache.put(key, material, result)
            return result

    async def _send(self, request: ChatRequest, key: str, prompt_id: str | None) -> ChatResult:
        backend = self._backend
        if backend is None:
            # Only replay mode has no backend, and it sends nothing.
            where = f" in {self._cache.directory}" if self._cache else ""
            raise ReplayMiss(
                f"no recorded response for request {key[:12]} ({prompt_id or 'no prompt id'})"
                f"{where}; run without --replay to record it"
            )
        input_estimate = estimate_tokens(request.prompt_chars(), len(request.messages))
        estimate = self._price.cost(input_estimate, request.max_tokens) if self._price else 0.0
        with self.accounting.reserve(estimate):
            result = await with_retries(
                lambda: self._attempt(backend, request),
                self._retry,
                on_retry=self.accounting.record_retry,
            )
            usage = result.usage
            cost = (
                self._price.cost(usage.input_tokens, usage.output_tokens) if self._price else None
            )
            self.accounting.settle(usage, cost)
        log.debug(
            "%s %s: %d in, %d out, %.2f s, %s",
            result.provider,
            result.model,
            usage.input_tokens,
            usage.output_tokens,
            result.latency_s,
            "unpriced" if cost is None else f"${cost:.6f}",
        )
        return result.model_copy(update={"cost_usd": cost, "key": key})

    async def _attempt(self, backend: Backend, request: ChatRequest) -> ChatResult:
        endpoint = (self.settings.provider, backend.base_url)
        async with _limiter(endpoint, self.settings.max_concurrency):
            started = time.monotonic()
            # The SDK's timeout bounds each read; this bounds the whole request, even when a
            # server trickles bytes.
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    result = await backend.complete(request)
            except TimeoutError:
                raise backend.timed_out() from None
            return result.model_copy(update={"latency_s": time.monotonic() - started})

    def _key_material(self, request: ChatRequest, prompt_id: str | None) -> dict[str, Any]:
        # The endpoint names the model only for OpenAI-compatible servers; for OpenAI and
        # Anthropic a base URL is a proxy or gateway, and the model name says it all.
        endpoint = None
        if self.settings.provider == "openai-compatible" and self.settings.base_url:
            endpoint = display_url(self.settings.base_url)
        spec = request.structured
        return {
            "provider": self.settings.provider,
            "model": self.settings.model,
            "endpoint": endpoint,
            "messages": [m.model_dump() for m in request.messages],
            "params": {
                "max_tokens": request.max_tokens,
                "temperature": request.temperature,
                "stop": list(request.stop),
            },
            "structured": None
            if spec is None
            else {"name": spec.name, "schema": spec.schema, "mode": self.settings.structured_mode},
            "prompt_id": prompt_id,
        }

    @asynccontextmanager
    async def _exclusive(self, key: str) -> AsyncIterator[None]:
        lock, users = self._key_locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._key_locks[key]


def make_client(
    settings: LLMSettings,
    *,
    accounting: Accounting | None = None,
    env: Mapping[str, str] | None = None,
    retry: RetryPolicy | None = None,
) -> LLMClient:
    """A client for `settings`; the key comes from `env` (default: the process environment).

    Raises `MissingAPIKey` when the provider needs a key and none is set, and `ConfigError` when
    a budget is set for a model with no known price; replay needs neither key nor price.
    """
    key = resolve_api_key(settings.provider, env)
    price = (
        price_for(settings.provider, settings.model, settings.prices) if settings.model else None
    )
    backend = None
    if settings.provider != "offline" and not settings.replay:
        if settings.budget_usd is not None and price is None:
            raise ConfigError(
                f"a budget is set but the price of {settings.model} is unknown; add it under "
                f'[llm.prices."{settings.model}"] (input = …, output = … USD per million tokens)'
            )
        backend = make_backend(settings, key)
    cache = None
    if settings.cache:
        secrets = (key.reveal(),) if key else ()
        cache = ResponseCache(settings.cache_dir or DEFAULT_CACHE_DIR, secrets)
    return LLMClient(
        settings,
        backend=backend,
        accounting=Accounting(settings.budget_usd) if accounting is None else accounting,
        cache=cache,
        retry=retry or RetryPolicy.from_settings(settings),
        price=price,
    )
