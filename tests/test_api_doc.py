"""docs/api.md's examples, as written on the page: each ```python block runs in its own Python
process from the repository's root and must exit 0 (a block whose first line says it needs an
NVIDIA GPU is a `gpu` test: skipped, with the reason, where there is none). The page also names
every export of `optiml.api`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import optiml.api

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
TEXT = PAGE.read_text(encoding="utf-8")
GPU = "# needs an NVIDIA GPU"

# What some blocks print, by a call that only that block makes: the page says so in its prose.
PRINTS = {
    "outline(text": ["saxpy.cu:3:42: unknown role `inoot`; use in, out or inout", "] None"],
    "check_text(": ['error line 17: identifier "b" is undefined'],
    'load("fixtures/saxpy.cu", "saxpi")': ["4 no kernel `saxpi` in fixtures/saxpy.cu"],
    "describe_kernel(": ["map ['y: each element from elements at its own index"],
    "run_generate(": ["['rowsum.cu', 'rowsum_ref.py'] True", "24 <formula>:1:"],
    "k.build.ok": ["scaled_axpy True"],
}


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", TEXT, re.M | re.S)


def cases():
    for i, block in enumerate(blocks()):
        first = block.splitlines()[0]
        marks = [pytest.mark.gpu] if first.startswith(GPU) else []
        yield pytest.param(block, id=f"block{i + 1}", marks=marks)


def test_the_page_has_examples_with_and_without_a_gpu():
    found = blocks()
    assert len([b for b in found if not b.startswith(GPU)]) >= 6
    assert len([b for b in found if b.startswith(GPU)]) == 3


def test_the_page_names_every_export():
    missing = [name for name in optiml.api.__all__ if f"`{name}`" not in TEXT]
    assert not missing, f"docs/api.md does not name {missing}"


@pytest.mark.parametrize("block", cases())
def test_an_example_runs_as_written(block: str, tmp_path: Path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OPTIML_CACHE_DIR": str(tmp_path / "cache"),
    }
    run = subprocess.run(
        [sys.executable, "-c", block],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{block}\n--- stderr:\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), "the example prints nothing"
    for call, lines in PRINTS.items():
        if call in block:
            for line in lines:
                assert line in run.stdout, (line, run.stdout)
    if "draft_spec(" in block:  # the comment the page shows after the block
        after = TEXT[TEXT.index(block) + len(block) + len("```") :]
        shown = re.search(r"^```\n(.*?)^```$", after, re.M | re.S)
        assert shown and shown.group(1) in run.stdout, run.stdout
