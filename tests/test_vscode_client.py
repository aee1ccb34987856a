"""The VS Code extension (vscode-client/) against the server: its settings and commands match the
server's, its own checks pass (npm test, lint, build), and the bundle, run with the real
vscode-languageclient in Node, drives a server through the job and proposal protocol."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from optiml import __version__
from optiml.profile.static import ARCHES
from server.app import make_server
from server.settings import Settings

CLIENT = Path(__file__).resolve().parent.parent / "vscode-client"
PACKAGE = json.loads((CLIENT / "package.json").read_text(encoding="utf-8"))
PROPERTIES: dict[str, dict[str, Any]] = PACKAGE["contributes"]["configuration"]["properties"]
CONSTANTS = (CLIENT / "src" / "constants.ts").read_text(encoding="utf-8")

# The commands of the server's job and proposal protocol (docs/editor.md's, and the one the
# server has today): the extension must know each.
PROTOCOL_COMMANDS = {
    "optiml.addSpec",
    "optiml.optimize",
    "optiml.profile",
    "optiml.generate",
    "optiml.acceptProposal",
    "optiml.rejectProposal",
    "optiml.compareProposal",
    "optiml.openReport",
    "optiml.cancelJob",
}

# Values the extension offers that the server is still to accept; an entry the server accepts
# now fails the test, so that the list only shrinks.
PENDING_ON_SERVER: set[tuple[str, str]] = set()


def server_settings() -> dict[str, dict[str, Any]]:
    return Settings.model_json_schema(by_alias=True)["properties"]


def contributed() -> dict[str, dict[str, Any]]:
    """The settings the extension passes to the server: `optiml.*` less `server.*`, `trace.*`."""
    out = {}
    for name, schema in PROPERTIES.items():
        key = name.removeprefix("optiml.")
        if not key.startswith(("server.", "trace.")):
            out[key] = schema
    return out


def accepts(key: str, value: Any) -> bool:
    try:
        Settings.model_validate({key: value})
    except ValidationError:
        return False
    return True


def json_types(schema: dict[str, Any]) -> set[str]:
    if "anyOf" in schema:
        return set().union(*(json_types(s) for s in schema["anyOf"]))
    found = schema.get("type")
    if found is None and "const" in schema:
        return {type(schema["const"]).__name__.replace("str", "string")}
    return set(found) if isinstance(found, list) else {found}


def ts_block(name: str) -> set[str]:
    """The command ids in `export const NAME = {...}` of constants.ts."""
    match = re.search(rf"export const {name} = \{{(.*?)\n\}} as const;", CONSTANTS, re.S)
    assert match, f"{name} not found in src/constants.ts"
    return set(re.findall(r"'(optiml\.[A-Za-z]+)'", match.group(1)))


class TestAgreement:
    """No Node needed."""

    def test_every_server_setting_is_contributed(self):
        missing = set(server_settings()) - set(contributed())
        assert not missing, f"server settings the extension does not contribute: {missing}"

    def test_overlapping_settings_agree(self):
        server = server_settings()
        overlap = set(server) & set(contributed())
        assert overlap, "no setting in common"
        for key in sorted(overlap):
            ours, theirs = contributed()[key], server[key]
            assert ours["default"] == theirs.get("default"), key
            assert accepts(key, ours["default"]), key
            our_types = set(ours["type"]) if isinstance(ours["type"], list) else {ours["type"]}
            their_types = json_types(theirs)
            if "integer" in our_types and "number" in their_types:
                their_types |= {"integer"}
            assert our_types <= their_types, f"{key}: {our_types} vs the server's {their_types}"
            for bound in ("exclusiveMinimum", "minimum", "maximum"):
                found = [s[bound] for s in theirs.get("anyOf", [theirs]) if bound in s]
                if found:
                    assert ours.get(bound) == found[0], f"{key}: {bound}"

    def test_enum_values_are_accepted_by_the_server(self):
        server = server_settings()
        for key, schema in contributed().items():
            if key not in server or "enum" not in schema:
                continue
            for value in schema["enum"]:
                pending = (key, value) in PENDING_ON_SERVER
                if pending:
                    assert not accepts(key, value), (
                        f"the server accepts {key}={value!r} now: remove it from PENDING_ON_SERVER"
                    )
                else:
                    assert accepts(key, value), f"the server refuses {key}={value!r}"

    def test_the_extension_offers_every_value_the_server_takes(self):
        offered = {k: set(s.get("enum", [])) for k, s in contributed().items()}
        assert set(ARCHES) <= offered["arch"]
        for key, schema in server_settings().items():
            for s in schema.get("anyOf", [schema]):
                values = set(s.get("enum", [])) | ({s["const"]} if "const" in s else set())
                assert values <= offered.get(key, set()), f"{key}: {values - offered[key]}"

    def test_protocol_commands_are_known_to_the_extension(self):
        known = ts_block("ServerCommand")
        missing = PROTOCOL_COMMANDS - known
        assert not missing, f"unknown to the extension: {missing}"

    def test_the_server_commands_of_today_are_known_and_not_taken(self):
        registered = set(make_server().protocol.fm.commands)
        assert registered <= ts_block("ServerCommand")
        client = ts_block("ClientCommand")
        # The language client registers the server's commands; VS Code refuses an id twice.
        assert not client & (registered | PROTOCOL_COMMANDS)
        assert client == {c["command"] for c in PACKAGE["contributes"]["commands"]}

    def test_the_extension_opens_compare_and_report_results(self):
        follow_up = (CLIENT / "src" / "followUp.ts").read_text(encoding="utf-8")
        for name in ("compareProposal", "openReport"):
            assert f"ServerCommand.{name}" in follow_up


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def npm(*args: str, timeout: float = 120) -> str:
    """Run npm in the extension's folder; its output without colour (vitest colours it where
    FORCE_COLOR or a CI variable says so, whatever NO_COLOR says)."""
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    result = subprocess.run(
        ["npm", *args], cwd=CLIENT, capture_output=True, text=True, timeout=timeout, env=env
    )
    output = ANSI.sub("", result.stdout + result.stderr)
    assert result.returncode == 0, f"npm {' '.join(args)} failed:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def bundle() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH: the extension's checks need Node.js and npm")
    if not (CLIENT / "node_modules").is_dir():
        npm("ci", "--no-audit", "--no-fund")
    npm("run", "build")
    built = CLIENT / "dist" / "extension.js"
    assert built.is_file()
    return built


def test_npm_test_and_lint(bundle: Path):
    out = npm("test")
    assert re.search(r"Tests\s+\d+ passed", out), out[-2000:]
    npm("run", "lint")


def drive(bundle: Path, tmp_path: Path, command: list[str], mode: str) -> dict[str, Any]:
    """Runs test/e2e/drive.js: the bundle in Node, with a stub editor, against `command`."""
    wrapper = tmp_path / "optiml"
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(f'"{c}"' for c in command) + ' "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    result = subprocess.run(
        ["node", "test/e2e/drive.js", str(bundle), str(wrapper), mode],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.name == "nt", reason="the server wrapper is a shell script")
def test_bundle_drives_the_job_and_proposal_protocol(bundle: Path, tmp_path: Path):
    fake = CLIENT / "test" / "e2e" / "fake_server.py"
    out = drive(bundle, tmp_path, [sys.executable, str(fake)], "protocol")
    assert out["state"] == {"kind": "running", "version": "9.9.9"}
    saw = out["serverSaw"]
    assert saw["experimental"] == {"optiml": {"diff": True, "openReport": True}}
    assert saw["initializationOptions"]["arch"] == "sm_80"
    assert not {"server", "trace"} & set(saw["initializationOptions"])
    # compareProposal's result opens VS Code's diff, openReport's the browser.
    assert saw["compareArg"] == {"proposal": "p1"}
    assert out["executed"] == [["vscode.diff", *out["compareResult"].values()]]
    assert out["external"] == ["file:///tmp/optiml/p1/report.html"]
    # A cancellable job is a notification; its Cancel cancels its token.
    assert out["jobProgress"]["options"] == {
        "location": 15,
        "title": "OptiML: optimize saxpy",
        "cancellable": True,
    }
    assert out["jobProgress"]["reports"] == [{"message": "8/64 evaluations", "increment": 12}]
    assert out["statusDuringJob"].endswith("· 1 job")
    assert saw["cancelledToken"] == "job-1"
    assert saw["cancelJobArgs"] == []
    assert out["keyVariablesLogged"] and not out["keyInLog"]
    assert out["messages"] == []


@pytest.mark.skipif(os.name == "nt", reason="the server wrapper is a shell script")
def test_bundle_starts_and_restarts_the_real_server(bundle: Path, tmp_path: Path):
    out = drive(bundle, tmp_path, [sys.executable, "-m", "optiml.cli"], "start")
    assert out["state"] == {"kind": "running", "version": __version__}
    assert out["status"] == f"$(check) OptiML {__version__}"
    assert out["stateAfterRestart"] == {"kind": "running", "version": __version__}
    assert out["stateAfterStop"] == {"kind": "stopped"}
    assert "optiml.addSpec" in out["registered"]
    assert out["configurationAnswers"], "the server asked for no configuration"
    for answer in out["configurationAnswers"]:
        assert not {"server", "trace"} & set(answer[0])
        assert answer[0]["arch"] == "sm_80"
    assert not out["keyInLog"]
