"""The search on another machine: jobs as data through the protocol, `optiml worker` running them
concurrently and answering by id, `RemoteExecutor` over a real sshd on 127.0.0.1 (tests/sshd.py)
and over a local Ray cluster, and pooled executors. The worker's GPU is the stand-in of
tests/remote_stand_in.py (real compiles, a fixed cost model), selected with
`OPTIML_WORKER_EXECUTOR`; the same stand-in in this process is the reference."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from optiml import __version__
from optiml.api import OptimizeRequest, optimize_file_async
from optiml.cuda.source import SourceFile
from optiml.errors import ExitCode, OptimlError
from optiml.executors import Job
from optiml.executors import ssh as ssh_module
from optiml.executors.pool import PooledExecutor
from optiml.executors.protocol import Request, options_data, options_of
from optiml.executors.remote import RemoteExecutor
from optiml.executors.ssh import SshExecutor
from optiml.harness.evaluate import CasePlan, EvalOptions
from optiml.harness.inputs import Dist, Mode
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.search.optimize import OptimizeOptions, optimize
from optiml.spec import load
from tests.remote_stand_in import RemoteStandIn
from tests.sshd import SSHD, Sshd, worker_command
from tests.support import FIXTURES

SAXPY = FIXTURES / "saxpy.cu"
HOOK = {"OPTIML_WORKER_EXECUTOR": "tests.remote_stand_in:make"}
needs_sshd = pytest.mark.skipif(
    SSHD is None, reason="OpenSSH's sshd is not installed (Debian: apt-get install openssh-server)"
)


def saxpy_job(flags=("-O3",)) -> Job:
    source, kernel, spec = load(SAXPY, "saxpy")
    candidate = SourceFile(source.text.replace("a * x[i]", "x[i] * a"), str(SAXPY))
    return Job(source, kernel, spec, candidate, tuple(flags))


# ---- jobs and results as data --------------------------------------------------------------


def test_a_job_its_options_and_its_results_round_trip_as_json():
    job = saxpy_job(("-O3", "-use_fast_math"))
    wire = Request.model_validate_json(job.request("evaluate").model_dump_json())
    back = Job.of_request(wire)
    assert (back.source.text, back.source.path, back.kernel.name) == (
        job.source.text,
        job.source.path,
        "saxpy",
    )
    assert back.candidate.text == job.candidate.text and back.flags == job.flags
    assert back.spec == job.spec
    assert back.target[2] == job.target[2]  # the candidate's spec, parsed again there
    kernel_itself = Job.of_request(Job(job.source, job.kernel, job.spec).request("profile"))
    assert kernel_itself.candidate is None

    options = EvalOptions(
        seeds=(3, 5),
        time_all_sizes=False,
        cases=[
            CasePlan(
                sizes={"n": 4097},
                dists={"x": Dist(-8.0, 8.0, Mode.SPIKES, 1e6)},
                scalars={"a": -1.5},
                tol_scale=4.0,
                lenient=True,
            )
        ],
        env={"CUDA_VISIBLE_DEVICES": "3", "SOME_TOKEN": "secret"},
    )
    data = json.loads(json.dumps(options_data(options)))
    assert "secret" not in json.dumps(data)  # this machine's environment never crosses
    assert options_of(data) == replace(options, env={})
    assert options_of(data).cases[0].dists["x"].mode is Mode.SPIKES

    stand_in = RemoteStandIn()

    async def results():
        return (
            await stand_in.evaluate(job, EvalOptions()),
            await stand_in.profile(job),
            await stand_in.sanitize(job, "memcheck"),
        )

    for result in asyncio.run(results()):
        kind = type(result)
        assert kind in (Verdict, Profile, SanitizerReport)
        again = kind.model_validate(json.loads(json.dumps(result.model_dump(mode="json"))))
        assert again == result


# ---- the worker ------------------------------------------------------------------------------


def worker(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "optiml.cli", "worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **HOOK, **env},
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pids, seconds=15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def log_lines(path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_the_worker_runs_jobs_at_once_answers_by_id_and_kills_them_when_stdin_ends(tmp_path):
    log = tmp_path / "log"
    proc = worker({"OPTIML_STAND_IN_SLOTS": "2", "OPTIML_STAND_IN_LOG": str(log)})
    hello = json.loads(proc.stdout.readline())
    assert hello["optiml"] == __version__ and hello["slots"] == 2
    slow = saxpy_job(("-O3", "-DSTAND_IN_SLEEP=2.5")).request("evaluate", id=1)
    fast = saxpy_job(("-O3", "-DSTAND_IN_SLEEP=0.3")).request("evaluate", id=2)
    started = time.monotonic()
    proc.stdin.write(slow.model_dump_json() + "\n" + fast.model_dump_json() + "\n")
    proc.stdin.flush()
    first, second = json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())
    assert [first["id"], second["id"]] == [2, 1]  # the fast one answered first
    assert Verdict.model_validate(second["result"]).status == "ok"
    starts = [float(t) for what, _, t in log_lines(log) if what == "start"]
    assert len(starts) == 2 and abs(starts[0] - starts[1]) < 2.0  # both sleeping at once
    assert time.monotonic() - started < 2.5 + 0.3 + 20  # not one after the other plus compiles
    # an unknown kernel is that job's error, with its exit code
    bad = saxpy_job().request("profile", id=3).model_copy(update={"kernel": "saxpi"})
    proc.stdin.write(bad.model_dump_json() + "\n")
    proc.stdin.flush()
    reply = json.loads(proc.stdout.readline())
    assert reply["id"] == 3 and reply["error"]["exit_code"] == ExitCode.NO_KERNEL

    # a job cancelled while it runs: its process group is killed, the worker goes on, the job
    # is not answered
    def sleeping(ident: int) -> int:
        """A 300 s job sent, the process its sleep runs in once it runs."""
        job = saxpy_job(("-O3", "-DSTAND_IN_SLEEP=300")).request("evaluate", id=ident)
        before = len([x for x in log_lines(log) if x[0] == "start"])
        proc.stdin.write(job.model_dump_json() + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while len([x for x in log_lines(log) if x[0] == "start"]) == before:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        return int([x for x in log_lines(log) if x[0] == "start"][-1][1])

    sleeper = sleeping(5)
    proc.stdin.write(json.dumps({"command": "cancel", "id": 5}) + "\n")
    proc.stdin.flush()
    assert wait_gone([sleeper], 10) and proc.poll() is None
    # a long job in flight when stdin ends: its process group is killed, the worker exits
    sleeper = sleeping(4)
    assert not gone(sleeper)
    proc.stdin.close()
    assert proc.wait(timeout=15) == 0
    assert wait_gone([sleeper], 5)
    assert proc.stdout.read() == ""  # the cancelled job is not answered


def test_a_broken_executor_hook_is_one_error_line_instead_of_the_hello():
    proc = worker({"OPTIML_WORKER_EXECUTOR": "tests.no_such_module:make"})
    out, _ = proc.communicate("", timeout=60)
    (line,) = out.splitlines()
    error = json.loads(line)["error"]
    assert error["message"].startswith("OPTIML_WORKER_EXECUTOR=tests.no_such_module:make: not a")


# ---- pooling ---------------------------------------------------------------------------------


def test_a_pool_adds_slots_fills_each_member_to_its_own_and_pins_to_the_first():
    class Counting(RemoteStandIn):
        def __init__(self, slots):
            super().__init__()
            self._slots, self.now, self.most, self.pinned = slots, 0, 0, 0

        async def evaluate(self, job, options, *, pinned=False):
            self.now += 1
            self.most = max(self.most, self.now)
            self.pinned += pinned
            await asyncio.sleep(0.05)
            self.now -= 1
            return await super().evaluate(job, options, pinned=pinned)

    a, b = Counting(2), Counting(1)
    pool = PooledExecutor([a, b])
    job = saxpy_job()

    async def go():
        await pool.start()
        assert pool.slots == 3
        free = await asyncio.gather(*(pool.evaluate(job, EvalOptions()) for _ in range(9)))
        pinned = await asyncio.gather(
            *(pool.evaluate(job, EvalOptions(), pinned=True) for _ in range(2))
        )
        return free + pinned

    verdicts = asyncio.run(go())
    assert all(v.status == "ok" for v in verdicts)
    assert (a.most, b.most) == (2, 2 - 1)  # each member full, none beyond its slots
    assert (a.pinned, b.pinned) == (2, 0)  # the final comparisons on the first member only
    assert len(a.calls) + len(b.calls) == 11 and len(b.calls) >= 2


# ---- over SSH ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if SSHD is None:
        pytest.skip("OpenSSH's sshd is not installed (Debian: apt-get install openssh-server)")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def remote_env(monkeypatch, server: Sshd, **env: str) -> None:
    """This process's SSH settings for `server`, its worker with the stand-in."""
    monkeypatch.setenv("OPTIML_SSH_CONFIG", str(server.ssh_config))
    monkeypatch.setenv("OPTIML_KNOWN_HOSTS", str(server.known_hosts))
    monkeypatch.setenv("OPTIML_REMOTE_COMMAND", worker_command(**HOOK, **env))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def search(executor, budget=8, **kw):
    return asyncio.run(
        optimize(SAXPY, "saxpy", executor, OptimizeOptions(budget=budget, parallel=2), **kw)
    )


@pytest.fixture(scope="module")
def in_process():
    """The winner of the search with the stand-in in this process."""
    return search(RemoteStandIn())


def winner_of(outcome):
    return (outcome.winner.text if outcome.winner else None, outcome.speedup)


@needs_sshd
def test_optimize_over_ssh_finds_the_in_process_winner_with_every_slot_busy(
    sshd, in_process, monkeypatch, tmp_path
):
    log = tmp_path / "log"
    remote_env(
        monkeypatch,
        sshd,
        OPTIML_STAND_IN_SLOTS="2",
        OPTIML_STAND_IN_SLEEP="0.4",
        OPTIML_STAND_IN_LOG=str(log),
    )
    work = SshExecutor(sshd.url)
    outcome = search(RemoteExecutor(work))
    assert outcome.winner is not None and "optiml_pack" in outcome.winner.text
    assert winner_of(outcome) == winner_of(in_process)
    assert work.connections == 1
    # two slots there: two candidates were sleeping at once
    events = sorted(
        (
            (float(t), +1 if what == "start" else -1)
            for what, _, t in log_lines(log)
            if what != "worker"
        ),
    )
    level, most = 0, 0
    for _, step in events:
        level += step
        most = max(most, level)
    assert most == 2


@needs_sshd
def test_a_dropped_connection_mid_search_is_made_again_and_the_search_goes_on(
    sshd, in_process, monkeypatch
):
    remote_env(monkeypatch, sshd, OPTIML_STAND_IN_SLEEP="0.3")
    monkeypatch.setattr(ssh_module, "RETRY_DELAYS", (0.2, 0.2, 0.2))
    work = SshExecutor(sshd.url)
    dropped = []

    def on_event(e):
        if e.phase == "search" and e.evaluations == 3 and not dropped:
            dropped.extend(sshd.connection_processes())
            for pid in dropped:  # the server's side of the connection dies: the TCP link drops
                os.kill(pid, 9)

    outcome = search(RemoteExecutor(work), on_event=on_event)
    assert dropped and work.connections >= 2
    assert outcome.trajectory.evaluations == 8
    assert winner_of(outcome) == winner_of(in_process)


@needs_sshd
def test_a_search_whose_connection_is_lost_for_good_saves_its_tree_and_resumes_from_it(
    tmp_path, monkeypatch
):
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    first = Sshd(tmp_path / "first")
    monkeypatch.setattr(ssh_module, "RETRIES", 1)
    monkeypatch.setattr(ssh_module, "RETRY_DELAYS", (0.2,))
    remote_env(monkeypatch, first, OPTIML_STAND_IN_SLEEP="0.3")
    out = tmp_path / "out"

    def on_event(e):
        if e.phase == "search" and e.evaluations == 3 and first.proc.poll() is None:
            connections = first.connection_processes()
            first.stop()  # the server goes away, and every connection with it
            for pid in connections:
                os.kill(pid, 9)

    request = OptimizeRequest(file=SAXPY, kernel="saxpy", budget=8, out_dir=out, parallel=2)
    try:
        with pytest.raises(OptimlError) as lost:
            asyncio.run(optimize_file_async(request, on_event=on_event, executor=first.url))
    finally:
        if first.proc.poll() is None:
            first.stop()
    assert lost.value.exit_code == ExitCode.REMOTE_UNREACHABLE
    message = lost.value.message
    assert "lost the connection to" in message and "gave up" in message
    assert f"saved in {out / 'search.json'}: run again with --resume" in message
    saved = json.loads((out / "search.json").read_text())
    assert saved["evaluations"] >= 3
    measured = {n["key"] for n in saved["nodes"] if n["evaluated"]}

    second = Sshd(tmp_path / "second")
    try:
        remote_env(monkeypatch, second, OPTIML_STAND_IN_SLEEP="0.1")
        request = request.model_copy(update={"resume": True, "budget": 4})
        outcome = asyncio.run(optimize_file_async(request, executor=second.url))
    finally:
        second.stop()
    t = outcome.trajectory
    assert t.evaluations == saved["evaluations"] + 4  # went on: nothing measured again
    resumed = {n.id for n in t.nodes if n.measurement is not None}
    assert len(resumed) >= len(measured) + 4 - 1


@needs_sshd
def test_cancelling_a_search_over_ssh_kills_the_remote_process_groups(sshd, monkeypatch, tmp_path):
    log = tmp_path / "log"
    remote_env(monkeypatch, sshd, OPTIML_STAND_IN_SLEEP="300", OPTIML_STAND_IN_LOG=str(log))
    request = OptimizeRequest(file=SAXPY, kernel="saxpy", budget=8, out_dir=tmp_path / "out")

    async def go():
        task = asyncio.ensure_future(optimize_file_async(request, executor=sshd.url))
        deadline = time.monotonic() + 60
        while len([x for x in log_lines(log) if x[0] == "start"]) < 2:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    lines = log_lines(log)
    workers = {int(x[1]) for x in lines if x[0] == "worker"}
    sleepers = {int(x[1]) for x in lines if x[0] == "start"}
    assert len(workers) == 1 and len(sleepers) >= 2
    assert wait_gone(workers | sleepers)


@needs_sshd
@pytest.mark.parametrize("case", ["missing", "version"])
def test_optimize_over_ssh_without_the_worker_there_is_one_line(sshd, tmp_path, case):
    fake = tmp_path / "old-worker.sh"
    fake.write_text('echo \'{"optiml": "0.0.1", "gpus": []}\'\ncat > /dev/null\n')
    command = "optiml-is-not-installed-here worker" if case == "missing" else f"sh {fake}"
    p = subprocess.run(
        [sys.executable, "-m", "optiml.cli", "optimize", str(SAXPY), "-k", "saxpy"]
        + ["--json", "--executor", sshd.url, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=sshd.env(OPTIML_REMOTE_COMMAND=command),
        timeout=120,
    )
    assert p.returncode == ExitCode.REMOTE_WORKER
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    expected = "is not found on" if case == "missing" else "runs OptiML 0.0.1 and this is OptiML"
    assert expected in lines[0]


# ---- over Ray ----------------------------------------------------------------------------------


@pytest.mark.xdist_group("ray")
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'optiml[ray]'; the dev extra has it)",
)
def test_optimize_on_a_ray_cluster_finds_the_in_process_winner(in_process, tmp_path):
    env = {
        **os.environ,
        **HOOK,
        "OPTIML_STAND_IN_SLOTS": "2",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(FIXTURES.parent),
    }
    p = subprocess.run(
        [sys.executable, "-m", "optiml.cli", "optimize", str(SAXPY), "-k", "saxpy", "--json"]
        + ["--budget", "8", "--parallel", "2", "--executor", "ray", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    t = json.loads(p.stdout)
    winner = (tmp_path / "saxpy.optimized.cu").read_text()
    assert (winner, next(c["speedup"] for c in t["confirmed"] if c["node"] == t["winner"])) == (
        winner_of(in_process)
    )


CANCEL_ON_RAY = """
import asyncio, os, pathlib, sys, time
from optiml.cuda.source import SourceFile
from optiml.executors import Job
from optiml.executors.ray_cluster import RayExecutor
from optiml.executors.remote import RemoteExecutor
from optiml.harness.evaluate import EvalOptions
from optiml.spec import load

log, saxpy = pathlib.Path(sys.argv[1]), sys.argv[2]
source, kernel, spec = load(saxpy, "saxpy")
candidate = SourceFile(source.text.replace("a * x[i]", "x[i] * a"), saxpy)
job = Job(source, kernel, spec, candidate, flags=("-O3", "-DSTAND_IN_SLEEP=300"))

def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False

async def go():
    executor = RemoteExecutor(RayExecutor("ray"))
    try:
        task = asyncio.ensure_future(executor.evaluate(job, EvalOptions()))
        deadline = time.monotonic() + 240
        while not log.exists() or "start" not in log.read_text():
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.1)
        sleeper = int(next(x for x in log.read_text().split("\\n") if x.startswith("start")).split()[1])
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        deadline = time.monotonic() + 10
        while alive(sleeper) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        print("gone" if not alive(sleeper) else "alive", sleeper)  # the actors still up
    finally:
        await executor.close()

asyncio.run(go())
"""


@pytest.mark.xdist_group("ray")
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed (pip install 'optiml[ray]'; the dev extra has it)",
)
def test_a_job_cancelled_on_ray_is_cancelled_on_its_actor(tmp_path):
    """A job cancelled here is cancelled on its Ray actor (an async actor's task), whose executor
    kills what the job started while the actor lives on: a search that stops on time leaves no
    runner of its in a Ray cluster to time its confirmation beside."""
    log = tmp_path / "log"
    env = {
        **os.environ,
        **HOOK,
        "OPTIML_STAND_IN_SLOTS": "2",
        "OPTIML_STAND_IN_LOG": str(log),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(FIXTURES.parent),
    }
    p = subprocess.run(
        [sys.executable, "-c", CANCEL_ON_RAY, str(log), str(SAXPY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[0] == "gone", p.stdout
