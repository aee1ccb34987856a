"""Background compiles: one `check_job` process per saved snapshot, at most one per document (a
newer snapshot kills the older one's process group, nvcc included) and a few at once in all. The
editor never waits for one: requests answer from the newest finished `CheckOutcome`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from optiml.api import CheckFeedback, CompilerMessage, KernelFeedback
from server.documents import Snapshot

logger = logging.getLogger(__name__)

# The job imports `server` too, wherever the editor started this process from.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class CheckOutcome:
    snapshot: Snapshot
    arch: str | None = None
    ok: bool = False
    messages: list[CompilerMessage] = field(default_factory=list)
    kernels: dict[str, KernelFeedback] = field(default_factory=dict)
    error: str | None = None  # why nothing was compiled
    tool_missing: bool = False

    @classmethod
    def of(cls, snapshot: Snapshot, found: CheckFeedback) -> CheckOutcome:
        return cls(snapshot, **dict(found))


async def run_job(snapshot: Snapshot, arch: str | None) -> CheckOutcome:
    request = json.dumps({"text": snapshot.text, "path": snapshot.path, "arch": arch})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p
        ),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.check_job",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, so that a kill reaches nvcc too
        env=env,
    )
    try:
        out, err = await proc.communicate(request.encode())
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    if proc.returncode != 0:
        logger.error("the compile job for %s failed:\n%s", snapshot.uri, err.decode())
        last = next((x for x in reversed(err.decode().splitlines()) if x.strip()), "no output")
        return CheckOutcome(snapshot, error=f"the compile job failed: {last.strip()}")
    return CheckOutcome.of(snapshot, CheckFeedback.model_validate_json(out))


class Checks:
    def __init__(self, slots: int):
        self._running: dict[str, asyncio.Task[CheckOutcome]] = {}
        self._latest: dict[str, CheckOutcome] = {}  # the newest finished compile per document
        self._slots = asyncio.Semaphore(slots)

    async def run(self, snapshot: Snapshot, arch: str | None) -> CheckOutcome | None:
        """Compile `snapshot`: its outcome, or None when a newer snapshot of the same document
        (or the document's closing) cancelled it."""
        self.cancel(snapshot.uri)
        task = asyncio.create_task(self._compile(snapshot, arch))
        self._running[snapshot.uri] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this caller was cancelled, not superseded
            return None
        finally:
            if self._running.get(snapshot.uri) is task:
                del self._running[snapshot.uri]

    def latest(self, uri: str) -> CheckOutcome | None:
        return self._latest.get(uri)

    def keep(self, outcome: CheckOutcome) -> None:
        self._latest[outcome.snapshot.uri] = outcome

    def outcomes(self) -> list[CheckOutcome]:
        return list(self._latest.values())

    def forget(self, uri: str) -> None:
        """The document closed: its compile in flight ends, its outcome goes."""
        self.cancel(uri)
        self._latest.pop(uri, None)

    def cancel(self, uri: str) -> None:
        if (task := self._running.pop(uri, None)) is not None:
            task.cancel()

    async def stop(self, timeout: float = 10.0) -> None:
        """Cancel every compile and wait, `timeout` seconds at most, until their processes are
        gone: `shutdown` waits for this, and must be answered whatever a compile does."""
        tasks = list(self._running.values())
        for uri in list(self._running):
            self.cancel(uri)
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout)
            for task in stuck:
                logger.warning(
                    "a compile did not end within %.0f s of its cancel: %r", timeout, task
                )

    async def _compile(self, snapshot: Snapshot, arch: str | None) -> CheckOutcome:
        async with self._slots:
            return await run_job(snapshot, arch)
