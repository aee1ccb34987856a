"""Several executors as one: their slots add up, each job goes to the member with the most free
slots, and pinned jobs (the final comparisons, which are compared with each other) all go to the
first member, which pins them to its first GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from optiml.executors.base import Executor, Job
from optiml.harness.evaluate import EvalOptions
from optiml.harness.sanitize import SanitizerReport
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile

T = TypeVar("T")


class PooledExecutor(Executor):
    def __init__(self, members: list[Executor]):
        if not members:
            raise ValueError("a pool needs an executor")
        self.members = members
        self.busy = [0] * len(members)  # jobs in flight on each
        self._free: asyncio.Condition | None = None
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await asyncio.gather(*(m.start() for m in self.members))
            self._started = True

    @property
    def slots(self) -> int:
        return sum(m.slots for m in self.members)

    async def _on(self, fn: Callable[[Executor], Awaitable[T]], pinned: bool = False) -> T:
        await self.start()
        if self._free is None:
            self._free = asyncio.Condition()
        async with self._free:
            if pinned:
                i = 0
            else:
                await self._free.wait_for(
                    lambda: any(b < m.slots for b, m in zip(self.busy, self.members, strict=True))
                )
                i = max(
                    range(len(self.members)), key=lambda j: self.members[j].slots - self.busy[j]
                )
            self.busy[i] += 1
        try:
            return await fn(self.members[i])
        finally:
            async with self._free:
                self.busy[i] -= 1
                self._free.notify_all()

    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        return await self._on(lambda m: m.evaluate(job, options, pinned=pinned), pinned)

    async def precompile(self, job: Job, options: EvalOptions) -> None:
        await asyncio.gather(*(m.precompile(job, options) for m in self.members))

    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        return await self._on(lambda m: m.profile(job, full=full))

    async def sanitize(
        self, job: Job, tool: str, sizes: list[dict[str, int]] | None = None
    ) -> SanitizerReport:
        return await self._on(lambda m: m.sanitize(job, tool, sizes))

    async def close(self) -> None:
        await asyncio.gather(*(m.close() for m in self.members), return_exceptions=True)
