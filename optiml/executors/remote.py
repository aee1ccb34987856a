"""The search's `Executor` on another machine: each evaluation, profile and sanitizer run is a
`protocol.Request` (the `Job` as data, `EvalOptions` as data) sent through a `WorkExecutor` (an
`optiml worker` over SSH, Ray actors), whose answer is rebuilt into the `Verdict`, `Profile` or
`SanitizerReport` it was. Its slots are the worker's (one per GPU there); the worker schedules its
GPUs as `LocalExecutor` does here."""

from __future__ import annotations

import asyncio

from optiml.errors import NoGpu
from optiml.executors.base import Executor, Job
from optiml.executors.protocol import options_data
from optiml.executors.work import WorkExecutor
from optiml.harness.evaluate import EvalOptions
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile


class RemoteExecutor(Executor):
    def __init__(self, work: WorkExecutor):
        self.work = work
        self._slots: int | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return self.work.url

    async def start(self) -> None:
        async with self._lock:
            if self._slots is None:
                slots = await self.work.search_slots()
                if slots < 1:
                    raise NoGpu(f"--executor {self.url}: no GPU there to run the search on")
                self._slots = slots

    @property
    def slots(self) -> int:
        if self._slots is None:
            raise RuntimeError("RemoteExecutor.slots before start()")
        return self._slots

    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        await self.start()
        request = job.request("evaluate", options=options_data(options), pinned=pinned)
        return Verdict.model_validate(await self.work.submit(request))

    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        await self.start()
        return Profile.model_validate(await self.work.submit(job.request("profile", full=full)))

    async def sanitize(
        self, job: Job, tool: str, sizes: list[dict[str, int]] | None = None
    ) -> SanitizerReport:
        await self.start()
        request = job.request("sanitize", tool=tool, sizes=sizes)
        return SanitizerReport.model_validate(await self.work.submit(request))

    async def close(self) -> None:
        await self.work.close()
