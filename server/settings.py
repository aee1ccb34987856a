"""The server's settings, from `initializationOptions` and the `optiml` section of
`workspace/configuration`: typed, validated key by key, and a bad value never replaces a good one."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optiml.llm.settings import Provider
from optiml.profile.static import ARCHES

SECTION = "optiml"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str | None = None  # the compile target; else the spec's, the local GPU's, sm_90
    # Reserved for the optimize and generate jobs; validated now so that a typo shows at once.
    provider: Provider | None = None
    model: str | None = Field(default=None, min_length=1)
    budget: float | None = Field(default=None, gt=0)  # US dollars per job
    executor: Literal["local"] = "local"

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, value: str | None) -> str | None:
        if value is not None and value.removesuffix("a") not in ARCHES:
            raise ValueError(f"must be one of {', '.join(ARCHES)} (or with an `a` suffix)")
        return value


def merge(current: Settings, raw: Any) -> tuple[Settings, list[str]]:
    """`raw` over `current`: each valid key it names is taken, each bad one keeps its current
    value and is described in one line. A missing section (None) changes nothing."""
    if raw is None:
        return current, []
    if not isinstance(raw, dict):
        return current, [f"OptiML settings must be an object, got {type(raw).__name__}"]
    candidate = {**current.model_dump(), **raw}
    try:
        return Settings.model_validate(candidate), []
    except ValidationError as e:
        problems = e.errors()
    bad = {str(p["loc"][0]) for p in problems if p["loc"]}
    fixed = {k: v for k, v in candidate.items() if k not in bad} | current.model_dump(include=bad)
    return Settings.model_validate(fixed), [_describe(p, current) for p in problems]


def _describe(problem: dict, current: Settings) -> str:
    key = ".".join(str(part) for part in problem["loc"]) or "settings"
    if problem["type"] == "extra_forbidden":
        known = ", ".join(Settings.model_fields)
        return f"OptiML setting `{key}` is unknown (known: {known}); ignored"
    message = problem["msg"].removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    kept = getattr(current, key, None)
    return f"OptiML setting `{key}`: {message}, got {problem['input']!r}; keeping {kept!r}"
