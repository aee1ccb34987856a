"""A stand-in for a worker's GPUs, for `OPTIML_WORKER_EXECUTOR=tests.remote_stand_in:make`: the
stand-in of tests/search/test_optimize.py (real compiles, a fixed cost model) with the slots
`OPTIML_STAND_IN_SLOTS` says (default 2). A candidate evaluation first runs `sleep` in a process
group of its own (`harness.procs`, as the runner does) for `OPTIML_STAND_IN_SLEEP` seconds, or as
long as a `-DSTAND_IN_SLEEP=S` among the job's flags says, on one of the slots as the local
executor runs a GPU's work (`LocalExecutor.run_on_gpu`: a cancel kills the sleep); where
`OPTIML_STAND_IN_LOG` names a
file, each such sleep appends `worker PID`, `start PID T` and `stop PID T` (the worker's process,
the sleep's process group, monotonic seconds)."""

from __future__ import annotations

import os
import subprocess
import time

from optiml.executors.local import LocalExecutor
from optiml.harness import procs
from tests.search.test_optimize import StandInExecutor


def _log(what: str, pid: int) -> None:
    path = os.environ.get("OPTIML_STAND_IN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {pid} {time.monotonic()}\n")
            f.flush()


def _sleep(seconds: float) -> None:
    with procs.spawned(["sleep", str(seconds)], stdin=subprocess.DEVNULL) as proc:
        _log("start", proc.pid)
        proc.wait()
        _log("stop", proc.pid)


class RemoteStandIn(StandInExecutor):
    def __init__(self) -> None:
        super().__init__()
        self._slots = int(os.environ.get("OPTIML_STAND_IN_SLOTS", "2"))
        self._gpus = LocalExecutor(list(range(self._slots)), device_count=self._slots)

    @property
    def slots(self) -> int:
        return self._slots

    async def evaluate(self, job, options, *, pinned=False):
        seconds = float(os.environ.get("OPTIML_STAND_IN_SLEEP", "0"))
        for flag in job.flags:
            if flag.startswith("-DSTAND_IN_SLEEP="):
                seconds = float(flag.split("=", 1)[1])
        if seconds and job.candidate is not None and job.candidate.text != job.source.text:
            _log("worker", os.getpid())
            await self._gpus.run_on_gpu(lambda env: _sleep(seconds), pinned=pinned)
        return await super().evaluate(job, options, pinned=pinned)


def make() -> RemoteStandIn:
    return RemoteStandIn()
