"""Runners started ahead of their jobs. A runner process spends ~0.3 s opening the GPU (its CUDA
context) and ~0.1 s closing it, of a ~0.9 s evaluation of a small kernel in the search
(benchmarks/results/eval-phases-h100.json); the GPU is held for all of it. Here the next
evaluation's runner is started while the current one runs, opens the GPU, and waits for its
arguments and plan on standard input (`runner --args-on-stdin`); an evaluation is done once the
runner has written its result (it closes the result pipe then), and the process's exit is waited
for on a thread. Every evaluation still runs in a process of its own: nothing of one candidate's
run is left for the next."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from optiml.harness import procs

# A runner started ahead exits with this before its job where it cannot open the GPU.
CANNOT_OPEN = 4


@dataclass
class Started:
    """A runner waiting for its job: its process, its folder (working directory, stdout and
    stderr files) and the pipe its result comes back on (`fd` is the number in the runner)."""

    proc: subprocess.Popen
    work: Path
    read_end: int
    fd: int

    def discard(self, wait: float | None = None) -> None:
        """End it (after up to `wait` seconds for it to exit of itself) and remove its files."""
        procs.finish(self.proc, timeout=wait)
        os.close(self.read_end)
        shutil.rmtree(self.work, ignore_errors=True)


class Ahead:
    """At most one runner started ahead per runner binary and environment (a GPU each)."""

    def __init__(self) -> None:
        self._idle: dict[tuple, Started] = {}
        self._lock = threading.Lock()
        self._refused: set[tuple] = set()  # runners and GPUs that cannot be opened ahead
        self._closings = 0  # a runner started before the last `close` is not kept

    @staticmethod
    def key(runner: Path, env: dict[str, str], workdir: Path | None) -> tuple:
        return (str(runner), tuple(sorted(env.items())), str(workdir))

    def usable(self, runner: Path, env: dict[str, str], workdir: Path | None) -> bool:
        return self.key(runner, env, workdir) not in self._refused

    def refuse(self, runner: Path, env: dict[str, str], workdir: Path | None) -> None:
        """A runner started ahead could not open its GPU (`CANNOT_OPEN`): from now on, jobs there
        run in runners of their own."""
        key = self.key(runner, env, workdir)
        with self._lock:
            self._refused.add(key)
            idle = self._idle.pop(key, None)
        if idle is not None:
            idle.discard()

    def take(self, runner: Path, env: dict[str, str], workdir: Path | None) -> Started:
        """A started runner for a job now, and another started for the next job."""
        key = self.key(runner, env, workdir)
        with self._lock:
            ready = self._idle.pop(key, None)
        if ready is not None and ready.proc.poll() is not None:  # it died waiting: a fresh one
            ready.discard()
            ready = None
        job = ready or _start(runner, env, workdir)
        procs.adopt(job.proc)  # started by the refill's thread: now the job's
        threading.Thread(
            target=self._refill, args=(key, runner, env, workdir, self._closings), daemon=True
        ).start()
        return job

    def _refill(
        self, key: tuple, runner: Path, env: dict[str, str], workdir: Path | None, closings: int
    ) -> None:
        try:
            started = _start(runner, env, workdir)
        except OSError:
            return  # the next job starts its own
        with self._lock:
            if key in self._idle or key in self._refused or closings != self._closings:
                extra: Started | None = started
            else:
                self._idle[key], extra = started, None
        if extra is not None:
            extra.discard()

    def close(self) -> None:
        """End the runners waiting for a job (an executor's close, the process's exit)."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
            self._closings += 1
        for started in idle:
            started.discard()


def _start(runner: Path, env: dict[str, str], workdir: Path | None) -> Started:
    work = Path(tempfile.mkdtemp(prefix="optiml-eval-", dir=workdir))
    read_end, write_end = os.pipe()
    try:
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            proc = procs.start(
                [str(runner), "--args-on-stdin"],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env={**os.environ, **env},
                cwd=work,
                pass_fds=(write_end,),
            )
    except OSError:
        os.close(read_end)
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        os.close(write_end)
    return Started(proc, work, read_end, write_end)


AHEAD = Ahead()
atexit.register(AHEAD.close)
