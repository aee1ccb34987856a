"""The server's settings, from `initializationOptions` and the `optiml` section of
`workspace/configuration`: typed, validated key by key, and a bad value never replaces a good one.
The keys are those of the VS Code extension's `optiml.*` settings (less its own `server.*` and
`trace.*`), spelled as there (`baseUrl`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optiml.api import (
    ARCHES,
    OptimlError,
    Provider,
    arch_number,
    configure_build,
    parse_gpus,
    split_urls,
)

SECTION = "optiml"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str | None = None  # the compile target; else the spec's, the local GPU's, sm_90
    # The LLM of the `llm` policy; validated here so that a typo shows at once.
    provider: Provider | None = None
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = Field(default=None, alias="baseUrl")  # the provider's endpoint
    budget: float | None = Field(default=None, gt=0)  # US dollars per job, for the LLM
    evaluations: int = Field(default=48, ge=1)  # the search budget of an optimize job
    policy: Literal["offline", "llm"] = "offline"
    # where jobs run kernels: `--executor`'s URLs (`local`, ssh://..., ray, ray://...; several,
    # comma-separated, pool their GPUs)
    executor: str = "local"
    gpus: str = "all"  # `all`, or indices like `0,1`
    # how the project builds its files (as `-I`, `-D`, `--std`, `--nvcc-flag`, `--compile-commands`
    # on the command line); include directories relative to the server's working directory
    include: list[str] = []  # (pydantic copies a default; the schema shows it)
    define: list[str] = []
    std: str | None = None
    nvcc_flags: list[str] = Field(default=[], alias="nvccFlags")
    compile_commands: str = Field(default="auto", alias="compileCommands")

    @field_validator("define")
    @classmethod
    def _macros(cls, value: list[str]) -> list[str]:
        for d in value:
            if not re.fullmatch(r"[A-Za-z_]\w*(=[^\n]*)?", d):
                raise ValueError(f"`{d[:40]}`: each must be NAME or NAME=VALUE")
        return value

    @field_validator("std")
    @classmethod
    def _standard(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(c|gnu)\+\+\d\w", value):
            raise ValueError("must be c++17, c++20 or another c++NN")
        return value

    def configure_build(self, path: str) -> None:
        """Every compile of the file at `path` builds as these settings say (a `UsageError`
        naming a bad include directory or flag)."""
        database = None if self.compile_commands == "none" else self.compile_commands
        configure_build(
            [path],
            tuple(self.include),
            tuple(self.define),
            self.std,
            tuple(self.nvcc_flags),
            database,
        )

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, value: str | None) -> str | None:
        if value is not None and f"sm_{arch_number(value)}" not in ARCHES:
            raise ValueError(f"must be one of {', '.join(ARCHES)} (or with an `a` or `f` suffix)")
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://\S+", value):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
        return value

    @field_validator("executor")
    @classmethod
    def _executor(cls, value: str) -> str:
        try:
            split_urls(value)
        except OptimlError:
            raise ValueError(
                "must be `local`, `ssh://[user@]host[:port]`, `ray` or `ray://host:port`, or "
                "several of them separated by commas"
            ) from None
        return value.strip()

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, value: str) -> str:
        try:
            parse_gpus(value)
        except OptimlError:
            raise ValueError("must be `all` or distinct GPU indices like `0,1`") from None
        return value.strip()

    def wire(self) -> dict[str, Any]:
        """The settings by their keys on the wire (`baseUrl`)."""
        return self.model_dump(by_alias=True)

    def llm_section(self) -> dict[str, Any]:
        """The LLM section for `OptimizeRequest.editor_settings`, in the LLM layer's names; unset
        keys are left out, so that `optiml.toml` and the environment still apply."""
        section = {
            "provider": self.provider,
            "model": self.model,
            "baseUrl": self.base_url,
            "budgetUsd": self.budget,
        }
        return {k: v for k, v in section.items() if v is not None}


KEYS = [field.alias or name for name, field in Settings.model_fields.items()]
_DEFAULTS = {field.alias or name: field.default for name, field in Settings.model_fields.items()}


def merge(current: Settings, raw: Any) -> tuple[Settings, list[str]]:
    """`raw` over `current`: each valid key it names is taken, each bad one keeps its current
    value and is described in one line. A missing section (None) changes nothing."""
    if raw is None:
        return current, []
    if not isinstance(raw, dict):
        return current, [f"OptiML settings must be an object, got {type(raw).__name__}"]
    before = current.wire()
    # null is "unset": back to the default (an editor sends null for a cleared setting)
    candidate = {**before, **{k: _DEFAULTS.get(k) if v is None else v for k, v in raw.items()}}
    try:
        return Settings.model_validate(candidate), []
    except ValidationError as e:
        problems = e.errors()
    bad = {str(p["loc"][0]) for p in problems if p["loc"]}
    fixed = {k: v for k, v in candidate.items() if k not in bad}
    fixed |= {k: before[k] for k in bad if k in before}
    return Settings.model_validate(fixed), [_describe(p, before) for p in problems]


def _describe(problem: dict, before: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in problem["loc"]) or "settings"
    if problem["type"] == "extra_forbidden":
        return f"OptiML setting `{key}` is unknown (known: {', '.join(KEYS)}); ignored"
    message = problem["msg"].removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    kept = before.get(key)
    return f"OptiML setting `{key}`: {message}, got {problem['input']!r}; keeping {kept!r}"
