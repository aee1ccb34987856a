"""Chat completions through the official `openai` SDK, for OpenAI and OpenAI-compatible servers.

Structured output uses `response_format` json_schema (strict); for compatible servers that reject
it, `auto` falls back to JSON mode and then to the schema stated in the prompt.
"""

from __future__ import annotations

import logging
from typing import Any

import openai

# The SDK's own strict-schema conversion (what its `.parse()` and `pydantic_function_tool` use):
# every property required, no additional properties, `$ref`s with siblings inlined.
from openai.lib._pydantic import to_strict_json_schema

from optiml.llm.accounting import estimated_usage
from optiml.llm.errors import RequestRejected
from optiml.llm.messages import ChatRequest, ChatResult, Message, StructuredSpec, Usage
from optiml.llm.providers.base import Backend
from optiml.llm.settings import DEFAULT_BASE_URLS, ApiKey, LLMSettings

log = logging.getLogger("optiml.llm")

# Servers that check no key (llama.cpp, Ollama, vLLM without --api-key) still get a bearer token,
# because the SDK insists on one; this placeholder is not a secret.
_NO_KEY = "no-key"


class OpenAIBackend(Backend):
    default_base_url = DEFAULT_BASE_URLS["openai"]

    def __init__(self, settings: LLMSettings, key: ApiKey | None):
        super().__init__(settings, key)
        self.compatible = settings.provider == "openai-compatible"
        self.provider = settings.provider
        mode = settings.structured_mode
        if mode == "auto":
            self._modes = (
                ["json_schema", "json_object", "prompt"] if self.compatible else ["json_schema"]
            )
        else:
            self._modes = [mode]
        # The base URL is always explicit, so OPENAI_BASE_URL cannot silently redirect requests.
        self._client = openai.AsyncOpenAI(
            api_key=key.reveal() if key else _NO_KEY,
            base_url=self.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(self, request: ChatRequest) -> ChatResult:
        if request.structured is None:
            return await self._send(request, None)
        while True:
            mode = self._modes[0]
            try:
                return await self._send(request, mode)
            except _FormatRejected as rejected:
                # An OpenAI-compatible server in `auto` mode rejected this way of asking for JSON,
                # so this and every later request uses the next, plainer one.
                if self._modes[0] == mode:
                    self._modes.pop(0)
                log.info(
                    "%s rejected structured output by %s (%s); using %s from now on",
                    self.label,
                    mode,
                    rejected.error,
                    self._modes[0],
                )

    async def _send(self, request: ChatRequest, mode: str | None) -> ChatResult:
        kwargs = self._arguments(request, mode)
        try:
            response = await self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            raise self.timed_out() from None
        except openai.APIConnectionError as error:
            raise self.unreachable(error.__cause__ or error) from None
        except openai.APIStatusError as error:
            mapped = self.status_error(
                error.status_code,
                _message(error),
                code=error.code,
                kind=error.type,
                headers=error.response.headers,
            )
            if (
                mode is not None
                and len(self._modes) > 1
                and error.status_code in (400, 422)
                and isinstance(mapped, RequestRejected)
            ):
                raise _FormatRejected(mapped) from None
            raise mapped from None
        except (ValueError, openai.APIResponseValidationError) as error:
            raise self.malformed(error) from None
        try:
            return self._result(request, response, mode)
        except (AttributeError, IndexError, TypeError, ValueError) as error:
            raise self.malformed(f"unexpected chat completion shape: {error}") from None

    def _arguments(self, request: ChatRequest, mode: str | None) -> dict[str, Any]:
        messages = list(request.messages)
        spec = request.structured
        if spec is not None and mode in ("json_object", "prompt"):
            messages.insert(0, Message(role="system", content=spec.instruction()))
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() for m in messages],
        }
        # OpenAI's reasoning models refuse `max_tokens`; compatible servers may not know the
        # newer `max_completion_tokens`.
        kwargs["max_tokens" if self.compatible else "max_completion_tokens"] = request.max_tokens
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if spec is not None and mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": _strict(spec), "strict": True},
            }
        elif spec is not None and mode == "tool":
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": "Return the answer as the arguments of this function.",
                        "parameters": _strict(spec),
                        "strict": True,
                    },
                }
            ]
            kwargs["tool_choice"] = {"type": "function", "function": {"name": spec.name}}
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        return kwargs

    def _result(self, request: ChatRequest, response: Any, mode: str | None) -> ChatResult:
        choice = response.choices[0]
        message = choice.message
        text = message.content or ""
        if mode == "tool" and message.tool_calls:
            text = message.tool_calls[0].function.arguments
        refusal = message.refusal
        if refusal is None and choice.finish_reason == "content_filter":
            refusal = "the provider's content filter stopped the answer"
        usage = response.usage
        if usage is not None:
            counted = Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)
        else:
            counted = estimated_usage(request.prompt_chars(), len(request.messages), text)
        return ChatResult(
            text=text,
            model=response.model or self.model,
            provider=self.provider,
            usage=counted,
            finish_reason=choice.finish_reason,
            refusal=refusal,
        )


def _message(error: openai.APIStatusError) -> str:
    # The SDK unwraps {"error": {...}}; Ollama sends {"error": "text"}, others plain text.
    body = error.body
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)
    return str(body) if body else ""


def _strict(spec: StructuredSpec) -> dict[str, Any]:
    return to_strict_json_schema(spec.model)


class _FormatRejected(Exception):
    """A compatible server refused one way of asking for JSON; the next one may work."""

    def __init__(self, error: RequestRejected):
        super().__init__(str(error))
        self.error = error
