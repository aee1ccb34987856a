"""Every process that runs a kernel (the runner, compute-sanitizer, Nsight Compute) starts in a
process group of its own and is registered while it lives, so that a time limit, a cancel or the
end of the process that started it kills the whole group — the tool and whatever it started —
and leaves the GPU free for the next verdict."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

_live: set[int] = set()
_lock = threading.Lock()
# Who a process is for: a token its starter's thread holds (`owned_by`), so that a cancelled job's
# processes, and only its, can be killed (`kill_owned`) while the thread that waits for them goes on.
_owner = threading.local()
_owned: dict[int, object] = {}


@contextlib.contextmanager
def owned_by(token: object) -> Iterator[None]:
    """Processes this thread starts or adopts in the block are `token`'s."""
    before = getattr(_owner, "token", None)
    _owner.token = token
    try:
        yield
    finally:
        _owner.token = before


def _register(pid: int) -> None:
    token = getattr(_owner, "token", None)
    with _lock:
        _live.add(pid)
        if token is not None:
            _owned[pid] = token


def _unregister(pid: int) -> None:
    with _lock:
        _live.discard(pid)
        _owned.pop(pid, None)


def adopt(proc: subprocess.Popen) -> None:
    """A process another thread started (a runner started ahead) is now this thread's token's."""
    token = getattr(_owner, "token", None)
    if token is not None:
        with _lock:
            if proc.pid in _live:
                _owned[proc.pid] = token


def kill_owned(token: object) -> None:
    """Kill the groups of `token`'s processes (a cancelled job's): the thread waiting for them
    then finds them dead and returns."""
    with _lock:
        pids = [pid for pid, t in _owned.items() if t is token]
    for pid in pids:
        kill_group(pid)


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_all() -> None:
    """Kill every registered group (a cancelled job's, or at exit)."""
    with _lock:
        pids = list(_live)
    for pid in pids:
        kill_group(pid)


@contextlib.contextmanager
def spawned(cmd: list[str], **popen: object) -> Iterator[subprocess.Popen]:
    """`Popen` in a new session, registered until the block ends; its group is killed then if it
    is still running."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)  # type: ignore[call-overload]
    _register(proc.pid)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
        _unregister(proc.pid)


def start(cmd: list[str], **popen: object) -> subprocess.Popen:
    """`Popen` in a new session, registered until `finish`: for a process that outlives the
    block that started it (a runner started ahead of its job)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)  # type: ignore[call-overload]
    _register(proc.pid)
    return proc


def finish(proc: subprocess.Popen, timeout: float | None = None) -> None:
    """Wait up to `timeout` seconds for a `start`ed process to end (None: do not wait), kill its
    group if it has not, and unregister it."""
    if timeout:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    if proc.poll() is None:
        kill_group(proc.pid)
        proc.wait()
    _unregister(proc.pid)


@dataclass
class Finished:
    returncode: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float


def run(
    cmd: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> Finished:
    """Run to completion or to `timeout` seconds, then kill the group; output as text."""
    start = time.perf_counter()
    with spawned(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            rc = None
    return Finished(
        rc,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
        time.perf_counter() - start,
    )


def _terminated(signum: int, frame: object) -> None:
    kill_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def kill_children_on_terminate() -> None:
    """In a worker process (an editor's job): SIGTERM first kills the groups it started."""
    signal.signal(signal.SIGTERM, _terminated)
