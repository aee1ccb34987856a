"""The price table: USD per million tokens by model, the user's overrides, and a request's cost.

Shipped prices are list prices at the time of writing; `[llm.prices]` in the config overrides them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


class Price(BaseModel):
    """What a model costs, in USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


DEFAULT_PRICES: dict[str, dict[str, Price]] = {
    "openai": {
        "gpt-5": Price(input=1.25, output=10.0),
        "gpt-5-mini": Price(input=0.25, output=2.0),
        "gpt-5-nano": Price(input=0.05, output=0.40),
        "gpt-4.1": Price(input=2.0, output=8.0),
        "gpt-4.1-mini": Price(input=0.40, output=1.60),
        "gpt-4.1-nano": Price(input=0.10, output=0.40),
        "gpt-4o": Price(input=2.50, output=10.0),
        "gpt-4o-mini": Price(input=0.15, output=0.60),
        "o3": Price(input=2.0, output=8.0),
        "o3-mini": Price(input=1.10, output=4.40),
        "o4-mini": Price(input=1.10, output=4.40),
    },
    "anthropic": {
        "claude-opus-4-5": Price(input=5.0, output=25.0),
        "claude-opus-4-1": Price(input=15.0, output=75.0),
        "claude-opus-4": Price(input=15.0, output=75.0),
        "claude-sonnet-4-5": Price(input=3.0, output=15.0),
        "claude-sonnet-4": Price(input=3.0, output=15.0),
        "claude-haiku-4-5": Price(input=1.0, output=5.0),
        "claude-3-7-sonnet": Price(input=3.0, output=15.0),
        "claude-3-5-haiku": Price(input=0.80, output=4.0),
    },
}

# A dated snapshot costs what its alias costs: "gpt-4o-2024-08-06", "claude-sonnet-4-5-20250929".
# Nothing looser than that: "gpt-5" must not price "gpt-5.4-mini".
_SNAPSHOT_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def price_for(provider: str, model: str, overrides: Mapping[str, Price]) -> Price | None:
    """The price of `model`: the user's override first, then the shipped table; None if unknown."""
    alias = _SNAPSHOT_SUFFIX.sub("", model)
    for table in (overrides, DEFAULT_PRICES.get(provider, {})):
        for name in (model, alias):
            if name in table:
                return table[name]
    return None
