"""The provider-neutral values that cross the LLM layer: messages in, a `ChatResult` out.

`ChatRequest` is the normalised form of one call; backends translate it into their wire format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant"]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    content: str


class Usage(BaseModel):
    """Tokens of one response; `estimated` when the server did not report them."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False


class ChatResult(BaseModel):
    """One answer. `cost_usd` is what this call cost: 0 for a cache hit, None if unpriced."""

    model_config = ConfigDict(frozen=True)

    text: str
    model: str
    provider: str
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None
    cached: bool = False
    finish_reason: str | None = None
    refusal: str | None = None
    latency_s: float = 0.0
    key: str = ""


@dataclass(frozen=True)
class StructuredSpec:
    """The pydantic model a structured call asks for, its JSON schema and its name on the wire."""

    model: type[BaseModel]
    name: str
    schema: dict[str, Any]

    @classmethod
    def of(cls, model: type[BaseModel]) -> StructuredSpec:
        # Tool and schema names allow only [A-Za-z0-9_-], up to 64; generics are named "Plan[int]".
        name = re.sub(r"[^A-Za-z0-9_-]", "_", model.__name__)[:64]
        return cls(model=model, name=name, schema=model.model_json_schema())

    def instruction(self) -> str:
        """The text that asks for the JSON when the wire format cannot."""
        return (
            "Reply with exactly one JSON object, and nothing else (no prose, no code fences), "
            "that conforms to this JSON Schema:\n" + json.dumps(self.schema, sort_keys=True)
        )


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    max_tokens: int
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    structured: StructuredSpec | None = None

    def prompt_chars(self) -> int:
        schema = len(json.dumps(self.structured.schema)) if self.structured else 0
        return sum(len(m.content) for m in self.messages) + schema


def normalize_messages(messages: Iterable[Message | Mapping[str, str]]) -> tuple[Message, ...]:
    normalized = tuple(m if isinstance(m, Message) else Message.model_validate(m) for m in messages)
    if not normalized:
        raise ValueError("a chat needs at least one message")
    return normalized


def split_system(messages: Sequence[Message]) -> tuple[str | None, list[Message]]:
    """System messages joined into one text (Anthropic takes them apart), and the rest in order."""
    system = [m.content for m in messages if m.role == "system"]
    rest = [m for m in messages if m.role != "system"]
    return ("\n\n".join(system) if system else None), rest
