"""A project's own build: `-I`, `-D`, `--std`, `--nvcc-flag` and `compile_commands.json` (found up
the tree, or named) reach every compile of a file; bad values are one line and their exit code.

fixtures/project/ is a CMake project as people lay them out: its kernel includes `ops/scale.cuh`
from `include/`, which refuses to compile without `-DOPS_SCALE=...` (CMakeLists.txt sets it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from optiml.cli import main
from optiml.cuda.source import SourceFile
from optiml.executors.protocol import Request
from optiml.executors.worker import execute
from optiml.harness.build import build_device_code
from optiml.harness.project import BuildOptions, configure, from_database, options_for
from server.settings import Settings
from tests.support import FIXTURES

PROJECT = FIXTURES / "project"
KERNEL = "src/scaled_axpy.cu"


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "proj"
    shutil.copytree(PROJECT, root)
    return root


def optiml(*args: str):
    return CliRunner().invoke(main, list(args))


def first_error(r) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="CMake is not installed")
def test_check_works_from_cmakes_compile_commands_alone(project):
    """CMake writes build/compile_commands.json (the include directories in a response file);
    `optiml check` finds it up the tree and the kernel compiles with its -I, -D and -std."""
    subprocess.run(
        ["cmake", "-S", str(project), "-B", str(project / "build")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    r = optiml("check", str(project / KERNEL), "--json", "--arch", "sm_90")
    assert r.exit_code == 0, r.stderr
    (k,) = json.loads(r.stdout)["kernels"]
    assert k["compiled"] is True and k["report"]["resources"]["registers"] > 0
    # without the database the header is not found: the project's build is what made it compile
    r = optiml("check", str(project / KERNEL), "--compile-commands", "none")
    assert r.exit_code == 8
    assert f"{project / KERNEL}:2:10: error: ops/scale.cuh: No such file or directory" in r.stderr


def test_include_and_define_on_the_command_line(project):
    file = str(project / KERNEL)
    r = optiml("check", file, "-I", str(project / "include"), "--json")
    assert r.exit_code == 8  # the header is found now, and says what it needs
    assert "build with -DOPS_SCALE=<factor>" in r.stderr
    r = optiml("check", file, "-I", str(project / "include"), "-D", "OPS_SCALE=2.0f", "--json")
    assert r.exit_code == 0, r.stderr
    r = optiml("check", file, "-I", str(project / "include"), "-DOPS_SCALE=2.0f", "--std", "c++20")
    assert r.exit_code == 0, r.stderr


def test_a_database_entry_by_arguments_with_isystem_and_a_response_file(tmp_path, project):
    build = project / "out"
    build.mkdir()
    (build / "inc.rsp").write_text(f'-isystem "{project / "include"}"\n')
    db = build / "compile_commands.json"
    db.write_text(
        json.dumps(
            [
                {"directory": str(build), "file": "../src/other.cu", "command": "nvcc -DWRONG=1"},
                {
                    "directory": str(build),
                    "file": f"../{KERNEL}",
                    "arguments": [
                        "/usr/local/cuda/bin/nvcc",
                        "--options-file",
                        "inc.rsp",
                        "-D",
                        "OPS_SCALE=3.0f",
                        "--std=c++20",
                        "-arch=sm_80",
                        "-c",
                        f"../{KERNEL}",
                        "-o",
                        "x.o",
                    ],
                },
            ]
        )
    )
    options = from_database(db, project / KERNEL)
    assert options.include == [str((project / "include").resolve())]
    assert options.define == ["OPS_SCALE=3.0f"] and options.std == "c++20"
    assert options.nvcc_flags == []  # never the database's output or target
    r = optiml("check", str(project / KERNEL), "--compile-commands", str(db))
    assert r.exit_code == 0, r.stderr


def test_every_compile_of_the_file_gets_them(project):
    """A candidate of a search is the file's text changed, at the file's path: it builds as the
    file does, as does anything else compiled for that path."""
    path = project / KERNEL
    configure(path, BuildOptions(include=[str(project / "include")], define=["OPS_SCALE=1.5f"]))
    candidate = SourceFile(path.read_text().replace("256", "128"), str(path))
    build = build_device_code(candidate, {}, arch="sm_90")
    assert build.ok, build.log
    assert options_for(path).flags()[:2] == [f"-I{project / 'include'}", "-DOPS_SCALE=1.5f"]


def test_a_request_carries_the_build_to_the_worker(project):
    """What the caller resolved travels with the job: a worker (here, in process) builds with it."""
    path = project / KERNEL
    build = BuildOptions(include=[str(project / "include")], define=["OPS_SCALE=2.0f"])
    request = Request(
        command="check",
        path=str(path),
        text=path.read_text(),
        arch="sm_90",
        build=build.model_dump(),
    )
    (k,) = execute(request)["kernels"]
    assert k["compiled"] is True


def test_the_editors_settings_build_the_file(project):
    path = project / KERNEL
    Settings.model_validate(
        {"include": [str(project / "include")], "define": ["OPS_SCALE=2.0f"], "std": "c++17"}
    ).configure_build(str(path))
    assert options_for(path).std == "c++17"
    build = build_device_code(SourceFile(path.read_text(), str(path)), {}, arch="sm_90")
    assert build.ok, build.log


@pytest.mark.parametrize(
    "args,code,line",
    [
        (["-I", "no/such/dir"], 2, "-I no/such/dir: no such directory"),
        (["-D", "9LIVES"], 2, "-D 9LIVES: write NAME or NAME=VALUE"),
        (["--std", "c99"], 2, "--std c99: write c++17, c++20 or another c++NN"),
        (
            ["--nvcc-flag=-arch=sm_80"],
            2,
            "--nvcc-flag -arch=sm_80: OptiML sets what nvcc produces and for which GPU itself "
            "(use --arch for the GPU)",
        ),
        (["--nvcc-flag=-std=c++20"], 2, "--nvcc-flag -std=c++20: give the standard with --std"),
        (
            ["--compile-commands", "missing.json"],
            3,
            "--compile-commands missing.json: no such file",
        ),
    ],
)
def test_bad_build_options_are_one_line(project, args, code, line):
    r = optiml("check", str(project / KERNEL), *args)
    assert r.exit_code == code
    assert first_error(r) == f"optiml: error: {line}"


def test_a_database_that_is_not_json_is_one_line_with_its_position(project):
    db = project / "compile_commands.json"
    db.write_text('[\n  {"file": "x.cu",\n')
    r = optiml("check", str(project / KERNEL))
    assert r.exit_code == 2
    assert first_error(r).startswith(f"optiml: error: {db}:3:1: not JSON: ")
