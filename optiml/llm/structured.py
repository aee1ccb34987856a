"""Turning a model's reply into a validated pydantic object, and the one repair round if it fails.

Native modes (json_schema, tools) usually give clean JSON; prompt and JSON modes may add fences or
prose around it, which `parse_reply` tolerates.
"""

from __future__ import annotations

import json
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)
_MAX_PROBLEMS = 5


class ReplyProblem(Exception):
    """Why a reply is not a valid instance of the schema, in words a model can act on."""


def parse_reply(text: str, schema: type[T]) -> T:
    """The reply as an instance of `schema`, or `ReplyProblem` saying what is wrong with it."""
    value = _json_value(text)
    try:
        return schema.model_validate(value)
    except ValidationError as error:
        problems = [
            f"{'.'.join(str(part) for part in item['loc']) or '(top level)'}: {item['msg']}"
            for item in error.errors()[:_MAX_PROBLEMS]
        ]
        more = error.error_count() - len(problems)
        if more > 0:
            problems.append(f"and {more} more")
        raise ReplyProblem("; ".join(problems)) from None


def repair_instruction(problem: ReplyProblem, schema: type[BaseModel]) -> str:
    return (
        f"That reply is not a valid {schema.__name__}: {problem}. Reply again with only the "
        "corrected JSON object, matching the required schema exactly."
    )


def _json_value(text: str) -> object:
    stripped = text.strip()
    if not stripped:
        raise ReplyProblem("the reply is empty")
    fenced = _FENCE.match(stripped)
    candidates = [fenced.group(1) if fenced else stripped]
    start, end = stripped.find("{"), stripped.rfind("}")
    if start != -1 and end > start:
        candidates.append(stripped[start : end + 1])
    first_error: json.JSONDecodeError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as error:
            first_error = first_error or error
    raise ReplyProblem(f"the reply is not valid JSON ({first_error})")
