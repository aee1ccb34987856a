"""What several test modules share: the fixtures folder and its manifest."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
MANIFEST: list[dict] = tomllib.loads((FIXTURES / "manifest.toml").read_text())["fixture"]
GOOD = [e for e in MANIFEST if e["verdict"] == "ok"]
BROKEN = [e for e in MANIFEST if e["verdict"] != "ok"]


def fixture_ids(entries: list[dict]) -> list[str]:
    return [f"{e['file']}::{e['kernel']}" for e in entries]


# Kernels written as people write them, not in the catalog's style (fixtures/wild/): `file` is made
# relative to fixtures/ like the others'.
WILD: list[dict] = [
    {**e, "file": f"wild/{e['file']}", "verdict": "ok"}
    for e in tomllib.loads((FIXTURES / "wild" / "manifest.toml").read_text())["fixture"]
]
