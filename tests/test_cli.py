"""The `optiml` command as a user meets it: one clear line and a distinct exit code for bad input,
JSON on request, and --help everywhere. The first tests run the entry point in a subprocess, as a
user does; the in-process ones (click's CliRunner) stand in for nvcc and the GPU where what they
check is the command line itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import optiml.api
import optiml.arch
import optiml.check
import optiml.harness.evaluate
import optiml.harness.gpu
from optiml.cli import main
from optiml.expr import ExprError
from optiml.harness.build import Build
from optiml.harness.nvcc import Resources
from tests.support import FIXTURES, the_one_line
from tests.support import run_optiml as run


def one_error_line(p: subprocess.CompletedProcess) -> str:
    line = the_one_line(p.stderr)
    assert line.startswith("optiml: error: ")
    return line


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


# ---- in-process, without nvcc: every bad input is one line and its exit code ------------------


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


def the_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("optiml: error: "), lines
    return lines[0].removeprefix("optiml: error: ")


@pytest.fixture
def no_nvcc_needed(monkeypatch):
    """`optiml check` with the compile stood in for: each kernel gets 32 registers."""

    def build(source, instantiations, *, arch, flags=()):
        found = [
            Resources(mangled=k.short_name, name=f"void {k.name}()", arch=arch, registers=32)
            for k in source.kernels
        ]
        return Build(
            ok=True, path=Path("/dev/null"), messages=[], resources=None, all_resources=found
        )

    monkeypatch.setattr(optiml.check, "build_device_code", build)
    monkeypatch.setattr(optiml.check, "find_toolkit", lambda: None)
    monkeypatch.setattr(optiml.arch, "_toolkit", lambda: None)


def test_an_empty_file_has_no_kernel(tmp_path):
    f = tmp_path / "empty.cu"
    f.write_text("")
    r = invoke("check", str(f))
    assert r.exit_code == 4
    assert the_error(r) == f"no kernel in {f}: it defines no __global__ function"


def test_a_directory_is_not_a_file(tmp_path):
    r = invoke("check", str(tmp_path))
    assert r.exit_code == 3
    assert the_error(r) == f"{tmp_path} is a directory, not a .cu file"


def test_a_file_that_is_not_utf8_is_read_with_a_warning(tmp_path):
    f = tmp_path / "latin1.cu"
    f.write_bytes((FIXTURES / "saxpy.cu").read_bytes().replace(b"@optiml", b"@optiml caf\xe9", 1))
    r = invoke("spec", str(f), "--kernel", "saxpy")
    assert r.exit_code == 0, r.stderr
    first, *guesses = r.stderr.splitlines()
    assert first == (
        f"optiml: warning: {f} is not UTF-8 (byte 0xe9 at offset "
        f"{(FIXTURES / 'saxpy.cu').read_bytes().index(b'@optiml') + 11} does not decode): read "
        "with U+FFFD in place of each such byte"
    )
    # the draft's own guesses (the scalar's value, which the file does not give) follow it
    assert guesses and all(g.startswith(f"optiml: warning: guessed: {f}:") for g in guesses)
    assert "args:" in r.stdout


def test_a_target_nvcc_does_not_accept_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(optiml.arch, "_toolkit", lambda: None)
    r = invoke("check", str(FIXTURES / "saxpy.cu"), "--arch", "banana")
    assert r.exit_code == 2
    assert the_error(r) == (
        "--arch: `banana` is not a GPU target; write one like sm_90 (sm_XY, sm_XYa or sm_XYf)"
    )


@pytest.mark.skipif(not optiml.arch.nvcc_targets(), reason="needs nvcc to list its targets")
def test_a_target_nvcc_does_not_have_names_those_it_has():
    r = invoke("eval", str(FIXTURES / "saxpy.cu"), "-k", "saxpy", "--arch", "sm_130")
    assert r.exit_code == 2
    line = the_error(r)
    assert line.startswith("--arch: nvcc ") and "cannot compile for `sm_130`; nvcc" in line
    assert line.endswith(", ".join(optiml.arch.nvcc_targets()))


def test_native_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(optiml.harness.gpu, "local_gpus", lambda: ())
    r = invoke("check", str(FIXTURES / "saxpy.cu"), "--arch", "native", "--json")
    assert r.exit_code == 7
    assert the_error(r).startswith("--arch native takes the local GPU's architecture, and NVML")
    assert json.loads(r.stdout)["exit_code"] == 7


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "-1"], "Invalid value for '--budget': -1 is not in the range x>=1; see `"),
        (["--gpus", "x"], "--gpus takes `all` or GPU indices like `0,1`, not `x`"),
        (["--gpus", "0,0"], "--gpus takes distinct GPU indices like `0,1`, not `0,0`"),
        (["--gpus", "١"], "--gpus takes `all` or GPU indices like `0,1`, not `١`"),
        (["--policy", "magic"], "Invalid value for '--policy': 'magic' is not one of"),
    ],
)
def test_bad_options_are_usage_errors_before_any_work(args, message):
    r = invoke("optimize", str(FIXTURES / "saxpy.cu"), "-k", "saxpy", *args)
    assert r.exit_code == 2
    assert the_error(r).startswith(message)


def test_a_missing_argument_is_one_line():
    r = invoke("check")
    assert r.exit_code == 2
    assert the_error(r).startswith("Missing argument 'FILE'; see `")


def test_check_json_says_the_first_spec_error_in_one_line(tmp_path, no_nvcc_needed):
    f = tmp_path / "k.cu"
    f.write_text((FIXTURES / "saxpy.cu").read_text().replace("n = 1 << 26", "n = 10**10**10"))
    r = invoke("check", str(f), "--json")
    assert r.exit_code == 5
    error = json.loads(r.stdout)["kernels"][0]["spec_errors"][0]
    assert the_error(r) == f"{f}:{error['line']}:{error['column']}: {error['message']}"
    assert (
        error["message"]
        == "sizes are numbers: `10**10**10` is too large: the value must fit in 64 bits"
    )


def test_check_json_reports_a_newer_architecture(no_nvcc_needed):
    r = invoke("check", str(FIXTURES / "saxpy.cu"), "--json", "--arch", "sm_120")
    assert r.exit_code == 0 and r.stderr == ""
    report = json.loads(r.stdout)["kernels"][0]["report"]
    assert report["arch"] == "sm_120" and report["occupancy"]["warps_per_sm"] == 48


def test_a_spec_value_that_fails_at_run_time_is_a_bad_spec(monkeypatch):
    def evaluate(*args, **kwargs):
        raise ExprError("`n - 2000000` is negative")

    monkeypatch.setattr(optiml.harness.evaluate, "find_toolkit", lambda: None)
    monkeypatch.setattr(optiml.harness.evaluate, "require_gpu", lambda command: None)
    monkeypatch.setattr(optiml.harness.evaluate, "evaluate", evaluate)
    r = invoke("eval", str(FIXTURES / "saxpy.cu"), "-k", "saxpy")
    assert r.exit_code == 5
    assert the_error(r).startswith(f"{FIXTURES / 'saxpy.cu'}:")
    assert the_error(r).endswith(
        "a value of the spec of `saxpy` cannot be evaluated: `n - 2000000` is negative"
    )


def test_an_unexpected_exception_is_an_internal_error_in_one_line(monkeypatch):
    def check_source(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(optiml.api, "check_source", check_source)
    r = invoke("check", str(FIXTURES / "saxpy.cu"))
    assert r.exit_code == 1
    assert the_error(r) == (
        "internal error: RuntimeError: boom (OPTIML_DEBUG=1 shows where); please report it with "
        "the input"
    )


def test_an_expr_error_that_reaches_the_command_is_a_bad_spec(monkeypatch):
    def evaluate_source(*args):
        raise ExprError("`m` is not a size variable, scalar argument or template value")

    monkeypatch.setattr(optiml.api, "evaluate_source", evaluate_source)
    r = invoke("eval", str(FIXTURES / "saxpy.cu"), "-k", "saxpy", "--json")
    assert r.exit_code == 5
    assert the_error(r) == (
        "a value of the spec cannot be evaluated: `m` is not a size variable, scalar argument or "
        "template value"
    )
    assert json.loads(r.stdout)["exit_code"] == 5


def test_the_command_alone_shows_its_help():
    r = invoke()
    assert r.exit_code == 2
    assert "Usage: " in r.output and "optiml: error" not in r.output


def test_a_compile_error_in_a_file_of_several_kernels_is_told_once_at_its_line(tmp_path):
    f = tmp_path / "two.cu"
    saxpy = (FIXTURES / "saxpy.cu").read_text()
    broken = saxpy.replace("y[i] = a * x[i] + y[i];", "y[i] = a * x[i] + y[i] + undefined_thing;")
    assert broken != saxpy
    twin = saxpy.replace("saxpy", "saxpy_twin").split("#include <cuda_runtime.h>", 1)[1]
    f.write_text(broken + "\n" + twin)
    r = invoke("check", str(f), "--json")
    assert [k["kernel"] for k in json.loads(r.stdout)["kernels"]] == ["saxpy", "saxpy_twin"]
    r = invoke("check", str(f))
    assert r.exit_code == 8
    errors = [x for x in r.stderr.splitlines() if "undefined_thing" in x]
    assert len(errors) == 1 and errors[0].startswith(f"{f}:"), r.stderr


TRAJECTORY = dict(
    file="k.cu",
    kernel="k",
    arch="sm_90",
    nvcc="13.0",
    date="2026-12-07",
    policy="offline",
    seed=0,
    budget=8,
)


def test_the_flags_a_winner_needs_beyond_the_inputs_are_named():
    from optiml.search.trajectory import Trajectory, TrajectoryNode

    def node(i, parent, flags):
        return TrajectoryNode(
            id=i, parent=parent, depth=int(i > 0), edit=None, kernel="", flags=flags
        )

    nodes = [node(0, None, ["-O3"]), node(1, 0, ["-O3", "-use_fast_math"]), node(2, 0, ["-O3"])]
    t = Trajectory(**TRAJECTORY, nodes=nodes)
    assert t.model_copy(update={"winner": 1}).added_flags() == ["-use_fast_math"]
    assert t.model_copy(update={"winner": 2}).added_flags() == []
    assert t.added_flags() == []


def test_the_outcome_every_front_end_shows_names_the_flags_its_winner_needs():
    # the CLI prints it, the editor's proposal and its report show it
    from optiml.search.optimize import _outcome
    from optiml.search.trajectory import Confirmation, Trajectory, TrajectoryNode

    def node(i, flags):
        return TrajectoryNode(
            id=i, parent=i - 1 if i else None, depth=i, edit=None, kernel="", flags=flags
        )

    confirmed = [
        Confirmation(node=n, speedup=2.0, candidate_ms=1.0, reference_ms=2.0, noise=0.0, repeats=5)
        for n in (1, 2)
    ]
    t = Trajectory(
        **TRAJECTORY,
        nodes=[node(0, ["-O3"]), node(1, ["-O3", "-prec-div=false"]), node(2, ["-O3"])],
        confirmed=confirmed,
        winner=1,
    )
    plain = "2.00x faster (2 ms -> 1 ms), confirmed and judged"
    assert _outcome(t, [], None) == (
        f"{plain}; measured with the nvcc flags -prec-div=false: your build needs them too "
        "(the file alone does not carry them)"
    )
    assert _outcome(t.model_copy(update={"winner": 2}), [], None) == plain
