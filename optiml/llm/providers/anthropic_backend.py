"""Messages through the official `anthropic` SDK.

Structured output is a forced tool call: the schema is the tool's `input_schema` and `tool_choice`
names the tool, so the answer arrives as the tool's already-parsed input.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from optiml.llm.accounting import estimated_usage
from optiml.llm.messages import ChatRequest, ChatResult, Usage, split_system
from optiml.llm.providers.base import Backend
from optiml.llm.settings import DEFAULT_BASE_URLS, ApiKey, LLMSettings

# Anthropic's stop reasons in the vocabulary of OpenAI's finish reasons, which the rest uses.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "refusal",
}


class AnthropicBackend(Backend):
    provider = "anthropic"
    default_base_url = DEFAULT_BASE_URLS["anthropic"]

    def __init__(self, settings: LLMSettings, key: ApiKey):
        super().__init__(settings, key)
        self._use_tool = settings.structured_mode in ("auto", "tool")
        # An explicit key and base URL keep the SDK from consulting profiles on disk or
        # ANTHROPIC_BASE_URL: the settings say everything about where requests go.
        self._client = anthropic.AsyncAnthropic(
            api_key=key.reveal(),
            base_url=self.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(self, request: ChatRequest) -> ChatResult:
        try:
            response = await self._client.messages.create(**self._arguments(request))
        except anthropic.APITimeoutError:
            raise self.timed_out() from None
        except anthropic.APIConnectionError as error:
            raise self.unreachable(error.__cause__ or error) from None
        except anthropic.APIStatusError as error:
            message, kind, code = _error_fields(error.body)
            raise self.status_error(
                error.status_code, message, code=code, kind=kind, headers=error.response.headers
            ) from None
        except (ValueError, anthropic.APIResponseValidationError) as error:
            raise self.malformed(error) from None
        try:
            return self._result(request, response)
        except (AttributeError, TypeError, ValueError) as error:
            raise self.malformed(f"unexpected message shape: {error}") from None

    def _arguments(self, request: ChatRequest) -> dict[str, Any]:
        system, messages = split_system(request.messages)
        spec = request.structured
        if spec is not None and not self._use_tool:
            system = f"{system}\n\n{spec.instruction()}" if system else spec.instruction()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "messages": [m.model_dump() for m in messages],
        }
        if system:
            kwargs["system"] = system
        if request.stop:
            kwargs["stop_sequences"] = list(request.stop)
        # This SDK no longer lists `temperature`; the API still takes it for the models that do.
        if request.temperature is not None:
            kwargs["extra_body"] = {"temperature": request.temperature}
        if spec is not None and self._use_tool:
            kwargs["tools"] = [
                {
                    "name": spec.name,
                    "description": "Return the answer as the input of this tool.",
                    "input_schema": spec.schema,
                }
            ]
            kwargs["tool_choice"] = {"type": "tool", "name": spec.name}
        return kwargs

    def _result(self, request: ChatRequest, response: Any) -> ChatResult:
        texts: list[str] = []
        tool_input: str | None = None
        tool = request.structured.name if request.structured else None
        for block in response.content or ():
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use" and block.name == tool and tool_input is None:
                tool_input = json.dumps(block.input)
        text = tool_input if tool_input is not None else "".join(texts)
        refusal = None
        if response.stop_reason == "refusal":
            refusal = "".join(texts) or "the model declined to answer"
        usage = response.usage
        if usage is not None:
            counted = Usage(
                # Prompt-cache reads and writes are input too, and billed.
                input_tokens=usage.input_tokens
                + (usage.cache_creation_input_tokens or 0)
                + (usage.cache_read_input_tokens or 0),
                output_tokens=usage.output_tokens,
            )
        else:
            counted = estimated_usage(request.prompt_chars(), len(request.messages), text)
        return ChatResult(
            text=text,
            model=response.model or self.model,
            provider=self.provider,
            usage=counted,
            finish_reason=_FINISH.get(response.stop_reason or "", response.stop_reason),
            refusal=refusal,
        )


def _error_fields(body: object) -> tuple[str, str | None, str | None]:
    """Message, type and code of `{"type": "error", "error": {...}}`, read from the body itself so
    that every SDK version in the supported range gives the same answer."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return (body if isinstance(body, str) else json.dumps(body) if body else ""), None, None
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, dict) else None
    kind = error.get("type")
    return (
        str(error.get("message") or ""),
        kind if isinstance(kind, str) else None,
        code if isinstance(code, str) else None,
    )
