"""docs/cli.md: each command's options are what `optiml COMMAND --help` shows (written there by
`python tools/cli_reference.py`), every command has its section, and every `optiml ...` example
on the page parses: its command exists and takes the options it gives."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from optiml.cli import main
from tests.support import load_script

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"
reference = load_script("tools/cli_reference.py", "cli_reference")


def test_the_page_is_up_to_date_with_the_commands():
    assert PAGE.read_text(encoding="utf-8") == reference.expected(), (
        f"docs/cli.md is out of date with optiml/cli: run `{reference.COMMAND}`"
    )


def test_a_stale_page_is_found_and_rewritten(tmp_path: Path, capsys):
    (tmp_path / "docs").mkdir()
    stale = PAGE.read_text(encoding="utf-8").replace("| Only this kernel", "| Just this kernel")
    (tmp_path / "docs" / "cli.md").write_text(stale)
    assert reference.main(["--check"], root=tmp_path) == 1
    assert f"run `{reference.COMMAND}`" in capsys.readouterr().out
    assert reference.main([], root=tmp_path) == 0
    assert (tmp_path / "docs" / "cli.md").read_text() == PAGE.read_text(encoding="utf-8")
    assert reference.main(["--check"], root=tmp_path) == 0


def test_the_script_runs_from_anywhere(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_command_without_a_section_is_named(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    text = PAGE.read_text(encoding="utf-8").replace(reference.begin("lift"), "")
    (tmp_path / "docs" / "cli.md").write_text(text)
    with pytest.raises(SystemExit, match="no section for `optiml lift`"):
        reference.expected(tmp_path)


def examples() -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.M | re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("optiml ")]


def parse(args: list[str]) -> str:
    """The command `args` name, parsed as `optiml` would parse them (a click error if not)."""
    ctx = main.make_context("optiml", list(args))
    group: click.Group = main
    while True:
        name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = command.make_context(name, rest, parent=ctx)
        if not isinstance(command, click.Group):
            return ctx.command_path
        group = command


@pytest.mark.parametrize("line", examples())
def test_an_example_parses(line: str):
    assert parse(shlex.split(line)[1:]).startswith("optiml ")


def test_every_command_has_an_example_or_says_why_not():
    shown = {parse(shlex.split(line)[1:]).removeprefix("optiml ") for line in examples()}
    names = {name for name, _, _ in reference.commands()}
    assert names - shown == {"serve", "worker"}  # an editor or --executor starts them
