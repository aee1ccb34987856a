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
    DEFAULT_BUDGET,
    DEFAULT_SECONDS,
    OptimlError,
    Provider,
    arch_number,
    configure_build,
    parse_gpus,
    split_urls,
)

SECTION = "optiml"


# The targets the VS Code extension offers in its list: every one the server knows, and the
# arch-specific ones people ask for by name (any other `a` or `f` target can still be typed).
OFFERED_ARCHES = sorted([*ARCHES, "sm_90a", "sm_100a"], key=lambda a: (arch_number(a), a))


def _values(values) -> str:
    return ", ".join(f"`{v}`" for v in values)


class Settings(BaseModel):
    """Each field's `description` (and `unset`: what an unset value means) is the one text of the
    setting: `python -m server.settings_table` writes it into VS Code's package.json (with the
    `vscode` extras: a list of values, their labels, a pattern), the table of docs/editor.md and
    the one of vscode-client/README.md. In a text, `#key#` in backticks names another setting
    (VS Code turns it into a link)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: str | None = Field(
        default=None,
        description=(
            f"The compile target of the static feedback and of jobs: one of {_values(ARCHES)}, "
            "also with an `a` or `f` suffix (e.g. `sm_90a`), and one the installed nvcc compiles "
            "for (CUDA 13 dropped `sm_70`). Changing it recompiles the open files."
        ),
        json_schema_extra={
            "unset": "the spec's `arch`, else the local GPU's, else `sm_90`",
            "vscode": {
                "enum": [None, *OFFERED_ARCHES],
                "enumItemLabels": ["automatic", *OFFERED_ARCHES],
                "markdownEnumDescriptions": [
                    "The spec's `arch`, else the local GPU's, else `sm_90`.",
                    *[""] * len(OFFERED_ARCHES),
                ],
            },
        },
    )
    # The LLM of the `llm` policy and of prose comments; validated here so that a typo shows at once. Unset, the LLM
    # layer's own sources apply (docs/llm.md): the environment, then optiml.toml or pyproject.toml.
    provider: Provider | None = Field(
        default=None,
        description=(
            "The LLM provider of the `llm` policy and of *Generate kernel from comment* on a "
            "comment in prose: `openai`, `anthropic`, `openai-compatible` (a server at "
            "`#baseUrl#`: vLLM, llama.cpp, Ollama) or `offline` (no requests at all). API keys "
            "are never settings."
        ),
        json_schema_extra={
            "unset": (
                "`OPTIML_LLM_PROVIDER`, else the project's `optiml.toml` or `pyproject.toml`, "
                "else `offline`"
            ),
            "vscode": {
                "enumItemLabels": [
                    "not set",
                    "openai",
                    "anthropic",
                    "openai-compatible",
                    "offline",
                ],
                "markdownEnumDescriptions": [
                    "`OPTIML_LLM_PROVIDER` in the editor's environment, else the project's "
                    "`optiml.toml` or `pyproject.toml`, else `offline`.",
                    "OpenAI. Key: **OptiML: Set API Key**, or `OPENAI_API_KEY` in the editor's "
                    "environment.",
                    "Anthropic. Key: **OptiML: Set API Key**, or `ANTHROPIC_API_KEY` in the "
                    "editor's environment.",
                    "An OpenAI-compatible endpoint at `#baseUrl#` (vLLM, llama.cpp, Ollama). Key "
                    "(optional): **OptiML: Set API Key**.",
                    "No model and no requests: the `llm` policy is refused.",
                ],
            },
        },
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        description="The model name for `#provider#`, e.g. `gpt-4.1` or `claude-sonnet-4-5`.",
        json_schema_extra={
            "unset": (
                "`OPTIML_LLM_MODEL`, else the project's `optiml.toml` or `pyproject.toml` "
                "(no default)"
            )
        },
    )
    base_url: str | None = Field(
        default=None,
        alias="baseUrl",
        description=(
            "The endpoint of `#provider#`, an `http://` or `https://` URL: required for "
            "`openai-compatible` (e.g. `http://127.0.0.1:8000/v1`), optional for the others."
        ),
        json_schema_extra={
            "unset": (
                "`OPTIML_LLM_BASE_URL`, else the project's `optiml.toml` or `pyproject.toml`, "
                "else the provider's own"
            ),
            "vscode": {
                "pattern": r"^(https?://\S+)?$",
                "patternErrorMessage": "An http:// or https:// URL, e.g. http://127.0.0.1:8000/v1",
            },
        },
    )
    budget: float | None = Field(
        default=None,
        gt=0,
        description="The most one job may spend on the provider, in US dollars (more than 0).",
        json_schema_extra={
            "unset": (
                "`OPTIML_LLM_BUDGET_USD`, else the project's `optiml.toml` or `pyproject.toml`, "
                "else no limit"
            )
        },
    )
    evaluations: int = Field(
        default=DEFAULT_BUDGET,
        ge=1,
        description=(
            "The search budget of an optimize job: how many candidate kernels it may compile, "
            "check and time (1 or more)."
        ),
    )
    seconds: float = Field(
        default=DEFAULT_SECONDS,
        ge=0,
        description=(
            "The wall-time budget of an optimize job, in seconds: measuring the kernel, the "
            "search, confirming and judging the best (the search stops at three quarters of it, "
            "or earlier for a slow kernel: 9 times its own checked run kept, at most 60 %; the "
            "checks are never cut short). 0: no time limit, `evaluations` alone."
        ),
    )
    policy: Literal["offline", "llm"] = Field(
        default="offline",
        description=(
            "Where an optimize job's candidates come from: `offline` (OptiML's catalog of "
            "rewrites) or `llm` (also `#provider#`'s `#model#`)."
        ),
        json_schema_extra={
            "vscode": {
                "markdownEnumDescriptions": [
                    "Rewrites from OptiML's own catalog; no model, no cost.",
                    "Candidates proposed by `#provider#`'s `#model#` as well, within `#budget#`.",
                ]
            }
        },
    )
    executor: str = Field(
        default="local",
        description=(
            "Where jobs compile and run kernels, as `optiml optimize --executor` takes it: "
            "`local` (this machine's GPUs, `#gpus#`), `ssh://[user@]host[:port]` (`optiml worker` "
            "on that machine, over SSH; host keys checked against known_hosts), `ray` (a Ray "
            "cluster started here) or `ray://host:port` (a Ray cluster's client address); "
            "several, separated by commas, pool their GPUs, e.g. `local,ssh://gpubox`."
        ),
    )
    gpus: str = Field(
        default="all",
        description="The GPUs jobs may use: `all`, or indices such as `0,1`.",
        json_schema_extra={
            "vscode": {
                "pattern": r"^(all|\d+(,\d+)*)$",
                "patternErrorMessage": "`all`, or GPU indices separated by commas, e.g. 0,1",
            }
        },
    )
    # How the project builds its files (as `-I`, `-D`, `--std`, `--nvcc-flag`, `--compile-commands`
    # on the command line). pydantic copies a list default.
    include: list[str] = Field(
        default=[],
        description=(
            "Include directories of your project for every compile (as `-I`), relative to the "
            "server's working directory (in VS Code, the workspace folder)."
        ),
    )
    define: list[str] = Field(
        default=[],
        description="Macro definitions for every compile (as `-D`): `NAME` or `NAME=VALUE`.",
        json_schema_extra={"vscode": {"items": {"pattern": r"^[A-Za-z_]\w*(=.*)?$"}}},
    )
    std: str | None = Field(
        default=None,
        description="The C++ standard (as `--std`), e.g. `c++20`.",
        json_schema_extra={
            "unset": "the project's `compile_commands.json`, else `c++17`",
            "vscode": {
                "pattern": r"^(c|gnu)\+\+\d\w$",
                "patternErrorMessage": "c++17, c++20 or another c++NN (or gnu++NN)",
            },
        },
    )
    nvcc_flags: list[str] = Field(
        default=[],
        alias="nvccFlags",
        description=(
            "Other nvcc flags for every compile (as `--nvcc-flag`); not the output or target, "
            "which OptiML sets."
        ),
    )
    compile_commands: str = Field(
        default="auto",
        alias="compileCommands",
        description=(
            "The project's `compile_commands.json` (CMake, Bear), whose entry for a file gives "
            "its `-I`, `-D` and standard: `auto` looks for one up the tree from the file (also "
            "in `build/`), `none` reads none, anything else is its path (relative to the "
            "server's working directory)."
        ),
    )

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
