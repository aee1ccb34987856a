"""Runners started ahead of their jobs (optiml.harness.ahead), with a stand-in runner that behaves
as the real one does in `--args-on-stdin` mode: its arguments on the first line of standard input,
the plan after them, the result written to the pipe it is given and the pipe closed, then a slow
exit (closing the GPU)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from optiml.harness import ahead
from optiml.harness.evaluate import EvalOptions, _run_isolated

STAND_IN = f"""#!{sys.executable}
import json, os, sys, time
started = time.time()
if sys.argv[1:] == ["--args-on-stdin"]:
    if os.environ.get("OPTIML_TEST") == "exclusive":  # the GPU cannot be opened ahead
        sys.exit(4)
    args = sys.stdin.readline().rstrip("\\n").split("\\t")
else:  # a runner of its own
    args = sys.argv[1:]
plan = sys.stdin.read().strip()
print("phase kernels loaded", file=sys.stderr, flush=True)
if plan == "hang":
    time.sleep(60)
if plan == "die":
    sys.exit(7)
fd = int(args[1].split(":")[1])
os.write(fd, json.dumps({{"args": args, "plan": plan, "pid": os.getpid(), "started": started,
                          "cwd": os.getcwd(), "ahead": sys.argv[1] == "--args-on-stdin"}}).encode())
os.close(fd)
if sys.argv[1] == "--args-on-stdin":
    time.sleep(6)  # closing the GPU (a runner of its own is waited for: it need not)
"""


@pytest.fixture
def runner(tmp_path: Path) -> Path:
    path = tmp_path / "runner"
    path.write_text(STAND_IN)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    yield path
    ahead.AHEAD.close()


def run(
    runner: Path, plan: str, timeout: float = 20.0, mode: str = "ahead", work: Path | None = None
):
    cmd = [str(runner), "-", "fd:{result}", "ref.so", "cand.so"]
    opts = EvalOptions(ahead=True, timeout_s=timeout, env={"OPTIML_TEST": mode})
    began = time.perf_counter()
    outcome = _run_isolated(cmd, opts, work or Path("/nonexistent"), [plan.encode()])
    return outcome, time.perf_counter() - began


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def test_the_job_ends_with_its_result_and_the_next_runner_is_already_started(runner):
    first, seconds = run(runner, "one")
    result = json.loads(first.result)
    assert first.returncode == 0 and result["plan"] == "one"
    # the arguments as the command gives them, the result pipe's number in place
    assert result["args"][0] == "-" and result["args"][2:] == ["ref.so", "cand.so"]
    assert result["args"][1].startswith("fd:") and result["args"][1] != "fd:{result}"
    # done with the result, not with the process: it is still closing the GPU (6 s in the stand-in)
    assert alive(result["pid"]), seconds
    assert "phase kernels loaded" in first.stderr
    time.sleep(0.5)
    began = time.time()
    second, _ = run(runner, "two")
    result2 = json.loads(second.result)
    assert result2["pid"] != result["pid"]  # a process of its own for every job
    assert result2["started"] < began  # started while the first job ran
    assert result2["cwd"] != result["cwd"]  # and a folder of its own


def test_a_runner_past_the_time_limit_is_killed_and_one_that_dies_says_how(runner):
    hung, seconds = run(runner, "hang", timeout=1.0)
    assert hung.returncode is None and hung.result == "" and seconds < 10
    died, _ = run(runner, "die")
    assert died.returncode == 7 and died.result == ""


def test_closing_ends_the_runners_waiting_for_a_job(runner):
    run(runner, "one")
    time.sleep(0.5)
    idle = list(ahead.AHEAD._idle.values())
    assert len(idle) == 1 and alive(idle[0].proc.pid)
    ahead.AHEAD.close()
    assert not ahead.AHEAD._idle and not alive(idle[0].proc.pid)
    assert not idle[0].work.exists()


def test_a_gpu_that_cannot_be_opened_ahead_gets_a_runner_of_its_own_per_job(runner, tmp_path):
    # an exclusive-process GPU: the runner started ahead exits 4 before its job; the job runs in
    # a runner of its own, and so does every later one there
    for plan in ("one", "two"):
        outcome, _ = run(runner, plan, mode="exclusive", work=tmp_path)
        result = json.loads(outcome.result)
        assert outcome.returncode == 0 and result["plan"] == plan and not result["ahead"]
    assert not ahead.AHEAD.usable(runner, {"OPTIML_TEST": "exclusive"}, None)
    assert ahead.AHEAD.usable(runner, {"OPTIML_TEST": "ahead"}, None)
