"""This machine's GPUs: compiles run on a pool of CPU workers while the GPUs run other candidates;
each GPU times one candidate at a time (`CUDA_VISIBLE_DEVICES` per run), so timings and profiles of
two candidates never share a GPU."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from optiml.errors import NoGpu, UsageError, quote
from optiml.executors.base import Executor, Job
from optiml.harness import procs
from optiml.harness.ahead import AHEAD
from optiml.harness.evaluate import EvalOptions, build_candidate, evaluate
from optiml.harness.gpu import local_gpus, require_gpu
from optiml.harness.sanitize import SanitizerReport, sanitize
from optiml.harness.verdict import Verdict
from optiml.profile.model import Profile
from optiml.profile.run import profile_kernel

logger = logging.getLogger(__name__)


def parse_gpus(text: str | None) -> list[int] | None:
    """`all` (or None) -> None (every GPU); `0,2` -> [0, 2]; a `UsageError` otherwise."""
    if text is None or text.strip() in ("", "all"):
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]{1,4}", part) for part in parts):
        raise UsageError(f"--gpus takes `all` or GPU indices like `0,1`, not `{quote(text, 30)}`")
    ids = [int(part) for part in parts]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus takes distinct GPU indices like `0,1`, not `{quote(text, 30)}`")
    return ids


class LocalExecutor(Executor):
    def __init__(
        self,
        gpus: list[int] | None = None,
        compile_workers: int | None = None,
        device_count: int | None = None,
    ):
        found = len(local_gpus()) if device_count is None else device_count
        if gpus is None:
            require_gpu("optimize")
            gpus = list(range(found))
        missing = [g for g in gpus if g >= found]
        if missing:
            has = f"it has {found}: 0 to {found - 1}" if found > 1 else f"it has {found or 'none'}"
            raise NoGpu(f"--gpus: no GPU {missing[0]} on this machine ({has})")
        self.gpus = gpus
        self._slots: asyncio.Semaphore | None = None
        self._locks: dict[int, asyncio.Lock] = {}
        self._compile = ThreadPoolExecutor(compile_workers or os.cpu_count() or 1, "optiml-nvcc")
        self._building: dict[tuple, asyncio.Future] = {}
        self._run = ThreadPoolExecutor(max(len(gpus), 1) * 2, "optiml-gpu")

    @property
    def slots(self) -> int:
        return len(self.gpus)

    @contextlib.asynccontextmanager
    async def _gpu(self, pinned: bool = False) -> AsyncIterator[dict[str, str]]:
        """A free GPU (the first of the executor's with `pinned`), held for the block."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(len(self.gpus))
            self._locks = {g: asyncio.Lock() for g in self.gpus}
        async with self._slots:
            if pinned:
                gpu = self.gpus[0]
            else:
                gpu = next(g for g in self.gpus if not self._locks[g].locked())
            async with self._locks[gpu]:
                yield {"CUDA_VISIBLE_DEVICES": str(gpu)}

    async def run_on_gpu(self, fn, *args, pinned: bool = False, **kwargs):
        """`fn(*args, env=..., **kwargs)` in a worker thread once a GPU is free (`env` names it)."""
        loop = asyncio.get_running_loop()
        token = object()  # the processes this run starts (a runner, ncu, compute-sanitizer)

        def call():
            with procs.owned_by(token):
                return fn(*args, env=env, **kwargs)

        async with self._gpu(pinned) as env:
            running = loop.run_in_executor(self._run, call)
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                # A thread is not stopped by a cancel: its processes are killed, and the GPU
                # stays held until the thread has seen them end, so that nothing is timed beside
                # them (a search stopped on time while a slow candidate ran, then the
                # confirmation's timings).
                procs.kill_owned(token)
                with contextlib.suppress(Exception):
                    await running
                raise

    async def evaluate(self, job: Job, options: EvalOptions, *, pinned: bool = False) -> Verdict:
        opts = replace(options, candidate_flags=job.flags)
        build = None
        asked = time.perf_counter()
        if job.candidate is not None:
            # compile first, on the CPU pool: the GPU stays free for another candidate meanwhile
            build = await self._build(job, opts)
        built = time.perf_counter()
        acquired = built

        def run(env: dict[str, str]) -> Verdict:
            nonlocal acquired
            acquired = time.perf_counter()
            return evaluate(
                job.source,
                job.kernel,
                job.spec,
                job.candidate,
                replace(opts, env={**opts.env, **env}),
            )

        verdict = await self.run_on_gpu(run, pinned=pinned)
        verdict.build_s = round(built - asked, 3) if build is not None else None
        verdict.gpu_wait_s = round(acquired - built, 3)
        if build is not None and build.seconds > verdict.compile_s:
            # the candidate's nvcc time, where it compiled before the run found it cached
            verdict.compile_s = build.seconds
        return verdict

    async def precompile(self, job: Job, options: EvalOptions) -> None:
        if job.candidate is None:
            return
        try:
            await self._build(job, replace(options, candidate_flags=job.flags))
        except Exception as e:  # a hint: `evaluate` reports what is wrong with the candidate
            logger.debug("precompiling a candidate of %s: %s", job.kernel.name, e)

    def _build(self, job: Job, opts: EvalOptions) -> asyncio.Future:
        """The candidate's compile on the CPU pool, shared by every caller that asks for the same
        text, flags and options while it runs (a precompile and the evaluation that follows)."""
        key = (job.candidate.text, job.flags, repr(opts))
        running = self._building.get(key)
        if running is None:
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(
                self._compile,
                build_candidate,
                job.source,
                job.kernel,
                job.spec,
                job.candidate,
                opts,
            )
            self._building[key] = running
            running.add_done_callback(lambda _: self._building.pop(key, None))
        return asyncio.shield(running)

    async def profile(self, job: Job, *, full: bool = False) -> Profile:
        source, kernel, spec = job.target
        return await self.run_on_gpu(
            profile_kernel, source, kernel, spec, full=full, flags=job.flags
        )

    async def sanitize(
        self, job: Job, tool: str, sizes: list[dict[str, int]] | None = None
    ) -> SanitizerReport:
        source, kernel, spec = job.target
        return await self.run_on_gpu(
            sanitize, source, kernel, spec, tool, sizes=sizes, flags=job.flags
        )

    async def close(self) -> None:
        self._compile.shutdown(wait=False, cancel_futures=True)
        self._run.shutdown(wait=False, cancel_futures=True)
        AHEAD.close()  # runners started for evaluations that will not come
