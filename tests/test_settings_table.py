"""The server's settings have one source, `server/settings.py: Settings`: VS Code's package.json,
the table of docs/editor.md and the one of vscode-client/README.md are written from it by
`python -m server.settings_table`, and a file that differs from what it would write fails here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from server import settings_table
from server.settings import KEYS, Settings, merge

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_files_are_up_to_date():
    stale = [str(p.relative_to(ROOT)) for p in settings_table.outdated()]
    assert not stale, (
        f"{', '.join(stale)}: out of date with server/settings.py; run "
        f"`{settings_table.COMMAND}` and commit what it writes"
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for path in (settings_table.PACKAGE, settings_table.EDITOR_DOC, settings_table.CLIENT_README):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_a_hand_edit_of_a_generated_default_is_found(copy: Path):
    package = copy / settings_table.PACKAGE
    data = json.loads(package.read_text())
    data["contributes"]["configuration"]["properties"]["optiml.evaluations"]["default"] = 64
    package.write_text(json.dumps(data, indent=2) + "\n")
    doc = copy / settings_table.EDITOR_DOC
    doc.write_text(doc.read_text().replace("| `48` |", "| `64` |"))
    assert settings_table.outdated(copy) == [package, doc]
    for path, text in settings_table.expected(copy).items():
        path.write_text(text)
    assert settings_table.outdated(copy) == []


def test_the_extension_s_own_settings_and_the_rest_of_the_file_are_kept(copy: Path):
    before = json.loads((ROOT / settings_table.PACKAGE).read_text())
    after = json.loads(settings_table.package_json((copy / settings_table.PACKAGE).read_text()))
    properties = after["contributes"]["configuration"]["properties"]
    assert list(properties) == [f"optiml.{k}" for k in KEYS] + [
        "optiml.server.path",
        "optiml.server.args",
        "optiml.trace.server",
    ]
    for name in ("optiml.server.path", "optiml.server.args", "optiml.trace.server"):
        assert properties[name] == before["contributes"]["configuration"]["properties"][name]
    assert {k: v for k, v in after.items() if k != "contributes"} == {
        k: v for k, v in before.items() if k != "contributes"
    }
    assert after["contributes"]["commands"] == before["contributes"]["commands"]


def test_a_missing_marker_is_one_line(copy: Path):
    doc = copy / settings_table.EDITOR_DOC
    doc.write_text(doc.read_text().replace(settings_table.END, ""))
    with pytest.raises(SystemExit, match="docs/editor.md: no `<!-- settings"):
        settings_table.expected(copy)


def test_every_setting_says_what_it_is_and_what_unset_means():
    for key, schema in settings_table.fields().items():
        assert schema.get("description", "").endswith("."), key
        if schema.get("default") is None:
            assert schema.get("unset"), f"{key}: say what an unset value means"


def test_references_name_settings_that_exist():
    for key, schema in settings_table.fields().items():
        texts = [schema["description"], schema.get("unset") or ""]
        texts += json.dumps(schema.get("vscode", {})).split('"')
        for text in texts:
            for name in settings_table.REFERENCE.findall(text):
                assert name in KEYS, f"{key}: `#{name}#` is not a setting"


def test_every_generated_default_is_the_server_s_and_taken_by_it():
    package = json.loads((ROOT / settings_table.PACKAGE).read_text())
    properties = package["contributes"]["configuration"]["properties"]
    defaults = Settings().wire()
    for key in KEYS:
        assert properties[f"optiml.{key}"]["default"] == defaults[key], key
        assert merge(Settings(), {key: defaults[key]})[1] == [], key


def test_the_vscode_patterns_take_the_defaults_and_the_server_takes_what_they_take():
    import re

    examples = {
        "baseUrl": ["http://127.0.0.1:8000/v1", "https://api.openai.com/v1"],
        "gpus": ["all", "0", "0,1"],
        "std": ["c++17", "c++20", "gnu++20"],
        "define": ["DEBUG", "TILE=16"],
    }
    for key, schema in settings_table.fields().items():
        entry = settings_table.vscode_entry(schema)
        pattern = entry.get("pattern") or entry.get("items", {}).get("pattern")
        if pattern is None:
            continue
        # JSON schema patterns are ECMAScript; these use nothing that Python reads otherwise
        for value in examples[key]:
            assert re.search(pattern, value), (key, value)
            taken = [value] if key == "define" else value
            assert merge(Settings(), {key: taken})[1] == [], (key, value)
