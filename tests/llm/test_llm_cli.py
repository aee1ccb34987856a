"""`optiml llm check` through click's CliRunner, against the scripted local server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from optiml.cli.llm import llm_group

_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPTIML_LLM_API_KEY")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The developer's own keys and settings must not leak into these tests, nor theirs out.
    for name in list(os.environ):
        if name in _VARIABLES or name.startswith("OPTIML_LLM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def check(*args: str, **env: str):
    result = CliRunner().invoke(llm_group, ["check", *args], env=env)
    return result, result.stdout, result.stderr


def test_check_reports_the_configuration_and_one_request(server, secret):
    server.push(server.openai_chat("ok", prompt_tokens=14, completion_tokens=1))
    result, out, err = check(
        "--provider", "openai", "--model", "gpt-4o-mini", "--base-url", server.url + "/v1",
        OPENAI_API_KEY=secret,
    )  # fmt: skip
    assert result.exit_code == 0, err
    assert "provider  openai" in out
    assert "model     gpt-4o-mini" in out
    assert f"base URL  {server.url}/v1" in out
    assert "API key   from $OPENAI_API_KEY" in out
    assert "ok in" in out and "14 tokens in, 1 out, $0.000003" in out
    assert secret not in out + err
    assert server.received[0].body["max_completion_tokens"] == 16
    assert not (Path.cwd() / ".optiml").exists()  # the check bypasses the cache


def test_check_as_json_for_anthropic(server, secret):
    server.push(server.anthropic_message("ok", input_tokens=9, output_tokens=2))
    result, out, _ = check(
        "--provider", "anthropic", "--model", "claude-haiku-4-5", "--base-url", server.url,
        "--json", ANTHROPIC_API_KEY=secret,
    )  # fmt: skip
    report = json.loads(out)
    assert result.exit_code == 0
    assert report["ok"] is True
    assert report["key_source"] == "ANTHROPIC_API_KEY"
    assert (report["input_tokens"], report["output_tokens"], report["reply"]) == (9, 2, "ok")
    assert secret not in out


def test_settings_come_from_the_project_and_the_environment(server, secret):
    Path("optiml.toml").write_text(f'[llm]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n')
    server.push(server.openai_chat())
    result, out, _ = check(OPTIML_LLM_MODEL="gpt-4.1", OPTIML_LLM_API_KEY=secret)
    assert result.exit_code == 0
    assert "model     gpt-4.1" in out and "from $OPTIML_LLM_API_KEY" in out


def test_offline_is_fine_and_sends_nothing():
    result, out, _ = check()
    assert result.exit_code == 0
    assert "provider  offline" in out and "no LLM requests are made" in out


def test_no_key_exits_20():
    result, _, err = check("--provider", "openai", "--model", "gpt-4o")
    assert result.exit_code == 20
    assert err.strip() == "error: no API key for openai: set OPTIML_LLM_API_KEY or OPENAI_API_KEY"


def test_a_rejected_key_exits_21(server, secret):
    server.push(server.openai_error(401, "Incorrect API key provided", code="invalid_api_key"))
    result, out, err = check(
        "--provider", "openai", "--model", "gpt-4o", "--base-url", server.url + "/v1",
        OPENAI_API_KEY=secret,
    )  # fmt: skip
    assert result.exit_code == 21
    assert len(err.strip().splitlines()) == 1 and "(401)" in err
    assert secret not in out + err


@pytest.mark.parametrize("how", ["refused", "timeout"])
def test_an_unreachable_or_silent_provider_exits_22(server, secret, closed_port, how):
    server.push(server.openai_chat())
    server.script[0].hang = True
    url = f"http://127.0.0.1:{closed_port}/v1" if how == "refused" else server.url + "/v1"
    # A refused connection is refused at once; a limit short enough for the silent server could
    # run out first on a loaded machine, so the refused case gets room.
    limit = "5" if how == "refused" else "0.1"
    result, _, err = check(
        "--provider", "openai", "--model", "gpt-4o", "--base-url", url, "--timeout", limit,
        OPENAI_API_KEY=secret,
    )  # fmt: skip
    assert result.exit_code == 22
    assert ("cannot reach" if how == "refused" else "did not answer within 0.1 s") in err


def test_an_unknown_model_exits_23(server, secret):
    server.push(
        server.openai_error(404, "The model `gpt-x` does not exist", code="model_not_found")
    )
    result, _, err = check(
        "--provider", "openai", "--model", "gpt-x", "--base-url", server.url + "/v1", "--json",
        OPENAI_API_KEY=secret,
    )  # fmt: skip
    assert result.exit_code == 23


def test_bad_settings_exit_23_with_one_line(secret):
    result, out, err = check("--json", OPTIML_LLM_PROVIDER="openai", OPTIML_LLM_TIMEOUT_S="0")
    report = json.loads(out)
    assert result.exit_code == 23
    assert report["ok"] is False and "timeout_s" in report["error"]
