"""The `optiml` command as a user meets it: one clear line and a distinct exit code for bad input,
JSON on request, and --help everywhere. Runs the installed entry point in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support import FIXTURES

OPTIML = [sys.executable, "-m", "optiml.cli"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OPTIML, *args], capture_output=True, text=True, env=env or os.environ.copy(), timeout=120
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("optiml: error: ")
    return lines[0]


@pytest.mark.parametrize("command", [[], ["check"], ["eval"], ["spec"]])
def test_help_for_every_command(command):
    p = run(*command, "--help")
    assert p.returncode == 0
    assert "Usage: " in p.stdout and "Exit codes:" in p.stdout


def test_check_reports_each_kernel():
    p = run("check", str(FIXTURES / "multi_kernel_main.cu"), "--arch", "sm_90")
    assert p.returncode == 0, p.stderr
    for name in ("vec_add", "clamp_inplace", "block_partial_sums"):
        assert name in p.stdout


def test_check_json():
    p = run("check", str(FIXTURES / "spill.cu"), "--json", "--arch", "sm_90")
    assert p.returncode == 0
    data = json.loads(p.stdout)
    report = data["kernels"][0]["report"]
    assert report["resources"]["spill_store_bytes"] > 0
    assert report["occupancy"]["limiter"] in ("registers", "warps", "blocks", "shared_memory")


def test_missing_file():
    p = run("check", "nope.cu")
    assert p.returncode == 3
    assert one_error_line(p) == "optiml: error: no such file: nope.cu"


def test_no_such_kernel():
    p = run("check", str(FIXTURES / "saxpy.cu"), "--kernel", "saxpi")
    assert p.returncode == 4
    assert "did you mean `saxpy`?" in one_error_line(p)


def test_bad_spec_is_a_positioned_error(tmp_path):
    f = tmp_path / "k.cu"
    f.write_text((FIXTURES / "saxpy.cu").read_text().replace("inout float[n]", "inout flaot[n]"))
    p = run("eval", str(f), "--kernel", "saxpy")
    assert p.returncode == 5
    line = one_error_line(p)
    assert line.startswith(f"optiml: error: {f}:")
    assert "unknown element type `flaot`" in line


def test_bad_spec_in_check_lists_every_issue_and_exits_5(tmp_path):
    f = tmp_path / "k.cu"
    f.write_text((FIXTURES / "saxpy.cu").read_text().replace("inout float[n]", "inout flaot[n]"))
    p = run("check", str(f), "--arch", "sm_90")
    assert p.returncode == 5
    assert "spec error: unknown element type `flaot`" in p.stderr


def test_compile_error_exits_8():
    p = run("check", str(FIXTURES / "broken" / "compile_error.cu"), "--arch", "sm_90")
    assert p.returncode == 8
    assert f"{FIXTURES / 'broken' / 'compile_error.cu'}:16:" in p.stderr


def test_no_nvcc():
    env = {**os.environ, "OPTIML_NVCC": "/nonexistent/bin/nvcc"}
    p = run("check", str(FIXTURES / "saxpy.cu"), env=env)
    assert p.returncode == 6, p.stderr
    assert (
        one_error_line(p)
        == "optiml: error: nvcc not found: OPTIML_NVCC=/nonexistent/bin/nvcc is not a file"
    )


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU machine: there is a GPU")
def test_eval_without_a_gpu_says_so_in_one_line():
    p = run("eval", str(FIXTURES / "saxpy.cu"), "--kernel", "saxpy")
    assert p.returncode == 7
    assert one_error_line(p).startswith("optiml: error: no NVIDIA GPU found")


def test_eval_json_error_is_machine_readable():
    p = run("eval", str(FIXTURES / "saxpy.cu"), "--kernel", "nope", "--json")
    assert p.returncode == 4
    assert json.loads(p.stdout) == {
        "error": f"no kernel `nope` in {FIXTURES / 'saxpy.cu'}; kernels here: saxpy",
        "exit_code": 4,
    }


def test_spec_drafts_a_comment_that_check_accepts(tmp_path):
    src = (FIXTURES / "multi_kernel_main.cu").read_text()
    p = run("spec", str(FIXTURES / "multi_kernel_main.cu"), "--kernel", "vec_add", "--json")
    assert p.returncode == 0
    draft = json.loads(p.stdout)
    assert draft["spec"].startswith("/* @optiml\n")
    # the user's file is not changed by `optiml spec`
    assert (FIXTURES / "multi_kernel_main.cu").read_text() == src
