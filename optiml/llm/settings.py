"""LLM settings: what they are, where they come from and in which order, and where keys come from.

Order, highest first: CLI flags, editor settings, `OPTIML_LLM_*` environment variables,
`optiml.toml` (`[llm]`), `pyproject.toml` (`[tool.optiml.llm]`), defaults. API keys come only
from the environment.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from optiml.llm.errors import ConfigError
from optiml.llm.prices import Price

Provider = Literal["openai", "anthropic", "openai-compatible", "offline"]
StructuredMode = Literal["auto", "json_schema", "tool", "json_object", "prompt"]

ENV_PREFIX = "OPTIML_LLM_"
GENERIC_KEY_VAR = "OPTIML_LLM_API_KEY"
# OPENAI_API_KEY is deliberately not sent to OpenAI-compatible endpoints: they are third-party
# servers, and the user's OpenAI key must not leak to them.
KEY_VARS: dict[str, tuple[str, ...]] = {
    "openai": (GENERIC_KEY_VAR, "OPENAI_API_KEY"),
    "anthropic": (GENERIC_KEY_VAR, "ANTHROPIC_API_KEY"),
    "openai-compatible": (GENERIC_KEY_VAR,),
    "offline": (),
}
_ANTHROPIC_MODES = ("auto", "tool", "prompt")
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class LLMSettings(BaseModel):
    """Everything that configures the LLM layer except the API key, which is never a setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider = "offline"
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0, le=10)
    max_retry_wait_s: float = Field(default=60.0, ge=0)
    max_concurrency: int = Field(default=4, ge=1, le=256)
    max_tokens: int = Field(default=2048, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    budget_usd: float | None = Field(default=None, ge=0)
    cache: bool = True
    cache_dir: Path | None = None
    replay: bool = False
    structured_mode: StructuredMode = "auto"
    prices: dict[str, Price] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> LLMSettings:
        if self.provider == "offline":
            return self
        if self.model is None:
            raise ValueError(
                f"no model is configured for provider {self.provider}; "
                "set --model, OPTIML_LLM_MODEL or `model` in optiml.toml"
            )
        if self.provider == "openai-compatible" and self.base_url is None:
            raise ValueError(
                "provider openai-compatible needs a base URL (e.g. http://127.0.0.1:8000/v1); "
                "set --base-url, OPTIML_LLM_BASE_URL or `base_url` in optiml.toml"
            )
        if self.provider == "anthropic" and self.structured_mode not in _ANTHROPIC_MODES:
            raise ValueError(
                f"structured_mode {self.structured_mode} is not available with anthropic; "
                f"use one of {', '.join(_ANTHROPIC_MODES)}"
            )
        if self.replay and not self.cache:
            raise ValueError("replay needs the cache; do not disable `cache` with --replay")
        return self


class ApiKey:
    """An API key and the environment variable it came from; its repr never shows the value."""

    __slots__ = ("source", "_value")

    def __init__(self, value: str, source: str):
        self.source = source
        self._value = SecretStr(value)

    def reveal(self) -> str:
        return self._value.get_secret_value()

    def __repr__(self) -> str:
        return f"ApiKey(from ${self.source})"


def resolve_api_key(provider: str, env: Mapping[str, str] | None = None) -> ApiKey | None:
    """The key for `provider` from the first of its variables that is set, or None."""
    env = os.environ if env is None else env
    for var in KEY_VARS.get(provider, ()):
        value = env.get(var, "").strip()
        if value:
            return ApiKey(value, var)
    return None


def load_settings(
    cli_overrides: Mapping[str, Any] | None = None,
    editor_settings: Mapping[str, Any] | None = None,
    start_dir: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> LLMSettings:
    """Merge every source of settings in the documented order and validate the result.

    `start_dir` is where the search for `optiml.toml` / `pyproject.toml` begins (walking up to the
    first directory holding either); relative paths resolve against the file that gave them, or
    against `start_dir` for the other sources. Raises `ConfigError` naming the offending source.
    """
    start = (start_dir or Path.cwd()).resolve()
    env = os.environ if env is None else env
    root = _project_root(start)
    layers: list[tuple[str, Mapping[str, Any], Path]] = []
    if root is not None:
        pyproject = root / "pyproject.toml"
        if pyproject.is_file():
            table = _read_toml(pyproject).get("tool", {}).get("optiml", {}).get("llm", {})
            layers.append(("pyproject.toml [tool.optiml.llm]", _table(table, pyproject), root))
        optiml_toml = root / "optiml.toml"
        if optiml_toml.is_file():
            table = _read_toml(optiml_toml).get("llm", {})
            layers.append(("optiml.toml [llm]", _table(table, optiml_toml), root))
    layers.append(("environment", _from_env(env), start))
    if editor_settings:
        layers.append(("editor settings", _from_editor(editor_settings), start))
    if cli_overrides:
        cli = {key: value for key, value in cli_overrides.items() if value is not None}
        layers.append(("command line", cli, start))

    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for label, values, base in layers:
        for key, value in values.items():
            if key in ("api_key", "key"):
                raise ConfigError(
                    f"an API key is set in {label}; keys are read only from environment variables "
                    f"({', '.join(sorted({v for vs in KEY_VARS.values() for v in vs}))})"
                )
            if key == "prices":
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{label}: `prices` must be a table of model = {{...}}")
                merged.setdefault("prices", {}).update(value)
            elif key == "cache_dir":
                merged[key] = base / Path(str(value)).expanduser()
            else:
                merged[key] = value
            origin[key] = label
    merged.setdefault("cache_dir", (root or start) / ".optiml" / "llm-cache")
    try:
        return LLMSettings.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(_describe(error, origin)) from None


def _project_root(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / "optiml.toml").is_file() or (directory / "pyproject.toml").is_file():
            return directory
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read settings: {error}") from None


def _table(value: object, path: Path) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: the LLM settings must be a table")
    return value


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for name in LLMSettings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper(), "").strip()
        if raw and name != "prices":
            values[name] = raw
    return values


def _from_editor(editor: Mapping[str, Any]) -> dict[str, Any]:
    # Editors name settings in camelCase ("baseUrl") and send "" or null for an unset one.
    return {
        re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value
        for key, value in editor.items()
        if value is not None and value != ""
    }


def _describe(error: ValidationError, origin: Mapping[str, str]) -> str:
    first = error.errors()[0]
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    if not first["loc"]:
        return f"invalid LLM settings: {first['ctx']['error'] if 'ctx' in first else first['msg']}"
    key = str(first["loc"][0])
    where = origin.get(key, "defaults")
    if first["type"] == "extra_forbidden":
        return f"unknown LLM setting `{key}` in {where}{more}"
    path = ".".join(str(part) for part in first["loc"])
    return f"invalid LLM setting `{path}` in {where}: {first['msg']}{more}"
