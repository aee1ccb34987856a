"""Background compiles: one `check_job` process per saved snapshot, a few at once in all, each the
work of a *check* job (`server.jobs`: its progress, its cancel — a newer snapshot of the document
cancels the older one's job, which kills its process group, nvcc included — and its result). The
editor never waits for one: requests answer from the newest finished `CheckOutcome`, kept here."""

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

from optiml.api import CheckFeedback, CompilerMessage, KernelFeedback, build_data
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


async def compile_snapshot(snapshot: Snapshot, arch: str | None) -> CheckOutcome:
    """`snapshot` checked in a `check_job` process of its own group; cancelling this kills it."""
    build = build_data(snapshot.path)  # as the settings made them (`Settings.configure_build`)
    request = json.dumps(
        {"text": snapshot.text, "path": snapshot.path, "arch": arch, "build": build}
    )
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
    """The newest finished compile per document, and the slots compiles share."""

    def __init__(self, slots: int):
        self._latest: dict[str, CheckOutcome] = {}
        self._slots = asyncio.Semaphore(slots)

    async def compile(self, snapshot: Snapshot, arch: str | None) -> CheckOutcome:
        """`snapshot` compiled once a slot is free (cancelling this ends the compile)."""
        async with self._slots:
            return await compile_snapshot(snapshot, arch)

    def latest(self, uri: str) -> CheckOutcome | None:
        return self._latest.get(uri)

    def keep(self, outcome: CheckOutcome) -> None:
        self._latest[outcome.snapshot.uri] = outcome

    def outcomes(self) -> list[CheckOutcome]:
        return list(self._latest.values())

    def forget(self, uri: str) -> None:
        """The document closed: its outcome goes."""
        self._latest.pop(uri, None)
