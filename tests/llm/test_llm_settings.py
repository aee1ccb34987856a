"""Where settings and keys come from, in which order, and how bad settings are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from optiml.llm import ConfigError, LLMSettings, Price, load_settings, resolve_api_key

PYPROJECT = """
[project]
name = "user-project"

[tool.optiml.llm]
provider = "openai"
model = "from-pyproject"
timeout_s = 11
max_retries = 1
cache_dir = "build/llm"

[tool.optiml.llm.prices]
"from-pyproject" = { input = 1.0, output = 2.0 }
"""

OPTIML_TOML = """
[llm]
model = "from-optiml-toml"
max_concurrency = 7
budget_usd = 2.5

[llm.prices]
"from-optiml-toml" = { input = 0.5, output = 1.5 }
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "optiml.toml").write_text(OPTIML_TOML)
    (tmp_path / "src" / "kernels").mkdir(parents=True)
    return tmp_path


def test_defaults_are_offline(tmp_path: Path):
    settings = load_settings({}, None, tmp_path, env={})
    assert settings.provider == "offline"
    assert settings.cache_dir == tmp_path / ".optiml" / "llm-cache"


def test_each_layer_overrides_the_ones_below(project: Path):
    start = project / "src" / "kernels"
    files_only = load_settings({}, None, start, env={})
    assert files_only.model == "from-optiml-toml"  # optiml.toml beats pyproject.toml
    assert files_only.timeout_s == 11  # from pyproject.toml, which optiml.toml does not set
    assert files_only.max_concurrency == 7
    assert files_only.cache_dir == project / "build" / "llm"  # relative to the file
    assert set(files_only.prices) == {"from-pyproject", "from-optiml-toml"}

    env = {"OPTIML_LLM_MODEL": "from-env", "OPTIML_LLM_TIMEOUT_S": "12", "OPTIML_LLM_REPLAY": "1"}
    with_env = load_settings({}, None, start, env=env)
    assert (with_env.model, with_env.timeout_s, with_env.replay) == ("from-env", 12, True)

    editor = {"model": "from-editor", "baseUrl": "http://127.0.0.1:8000/v1", "timeoutS": 13}
    with_editor = load_settings({}, editor, start, env=env)
    assert (with_editor.model, with_editor.timeout_s) == ("from-editor", 13)
    assert with_editor.base_url == "http://127.0.0.1:8000/v1"

    cli = {"model": "from-cli", "timeout_s": None, "max_retries": 5}
    with_cli = load_settings(cli, editor, start, env=env)
    assert (with_cli.model, with_cli.timeout_s, with_cli.max_retries) == ("from-cli", 13, 5)
    assert with_cli.budget_usd == 2.5  # untouched layers still apply


def test_editor_blanks_mean_unset(project: Path):
    settings = load_settings({}, {"model": "", "baseUrl": None}, project, env={})
    assert settings.model == "from-optiml-toml"


def test_a_pyproject_without_optiml_settings_is_fine(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_settings({}, None, tmp_path, env={}).provider == "offline"


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("optiml.toml", '[llm]\napi_key = "sk-in-a-file-1234567890"\n'),
        ("pyproject.toml", '[tool.optiml.llm]\napi_key = "sk-in-a-file-1234567890"\n'),
    ],
)
def test_keys_in_files_are_refused_without_echo(tmp_path: Path, where: str, text: str):
    (tmp_path / where).write_text(text)
    with pytest.raises(
        ConfigError, match="keys are read only from environment variables"
    ) as caught:
        load_settings({}, None, tmp_path, env={})
    assert "sk-in-a-file" not in str(caught.value)


def test_a_key_in_editor_settings_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="an API key is set in editor settings"):
        load_settings({}, {"apiKey": "sk-editor-1234567890"}, tmp_path, env={})


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"OPTIML_LLM_TIMEOUT_S": "-1"}, "`timeout_s` in environment: Input should be greater"),
        ({"OPTIML_LLM_PROVIDER": "gemini"}, "`provider` in environment"),
        ({"OPTIML_LLM_PROVIDER": "openai"}, "no model is configured for provider openai"),
        (
            {"OPTIML_LLM_PROVIDER": "openai-compatible", "OPTIML_LLM_MODEL": "m"},
            "needs a base URL",
        ),
        ({"OPTIML_LLM_BASE_URL": "127.0.0.1:8000"}, "`base_url` in environment"),
    ],
)
def test_bad_values_name_their_source(tmp_path: Path, layer: dict[str, str], message: str):
    with pytest.raises(ConfigError, match=message):
        load_settings({}, None, tmp_path, env=layer)


def test_unknown_settings_are_named(tmp_path: Path):
    (tmp_path / "optiml.toml").write_text("[llm]\nmodle = 'typo'\n")
    with pytest.raises(ConfigError, match="unknown LLM setting `modle` in optiml.toml"):
        load_settings({}, None, tmp_path, env={})


def test_broken_toml_is_a_config_error(tmp_path: Path):
    (tmp_path / "optiml.toml").write_text("[llm\n")
    with pytest.raises(ConfigError, match="optiml.toml: cannot read settings"):
        load_settings({}, None, tmp_path, env={})


def test_anthropic_takes_only_its_structured_modes(tmp_path: Path):
    with pytest.raises(ConfigError, match="json_schema is not available with anthropic"):
        load_settings(
            {"provider": "anthropic", "model": "claude", "structured_mode": "json_schema"},
            None,
            tmp_path,
            env={},
        )


def test_prices_validate(tmp_path: Path):
    (tmp_path / "optiml.toml").write_text('[llm.prices]\n"m" = { input = -1, output = 1 }\n')
    with pytest.raises(ConfigError, match="prices.m.input"):
        load_settings({}, None, tmp_path, env={})
    settings = LLMSettings(prices={"m": Price(input=1, output=2)})
    assert settings.prices["m"].cost(1_000_000, 500_000) == 2.0


@pytest.mark.parametrize(
    ("provider", "env", "source"),
    [
        ("openai", {"OPENAI_API_KEY": "a", "OPTIML_LLM_API_KEY": "b"}, "OPTIML_LLM_API_KEY"),
        ("openai", {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "c"}, "OPENAI_API_KEY"),
        ("anthropic", {"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "c"}, "ANTHROPIC_API_KEY"),
        ("openai-compatible", {"OPENAI_API_KEY": "a"}, None),
        ("openai-compatible", {"OPTIML_LLM_API_KEY": "b"}, "OPTIML_LLM_API_KEY"),
        ("offline", {"OPTIML_LLM_API_KEY": "b"}, None),
        ("openai", {"OPENAI_API_KEY": "  \n"}, None),
    ],
)
def test_keys_come_from_the_provider_variables(provider, env, source):
    key = resolve_api_key(provider, env)
    assert (key.source if key else None) == source


def test_a_key_hides_its_value(secret: str):
    key = resolve_api_key("openai", {"OPENAI_API_KEY": secret + "\n"})
    assert key is not None and key.reveal() == secret
    assert secret not in repr(key) and secret not in str(key)
