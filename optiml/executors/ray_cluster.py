"""`ray` and `ray://host:port`: jobs run as Ray tasks, on a cluster started here (on loopback) or on
an existing one reached through its client address.

The task is the worker's own `answer`, so a Ray job answers what `optiml worker` answers. An eval
asks for a GPU where the cluster has one. Needs the `ray` package (`pip install 'optiml[ray]'`), on
the cluster too, with this version of OptiML.

The search's jobs go to warm actors, one per GPU of the cluster (`num_gpus=1`), each holding a
`LocalExecutor` for the GPU Ray gave it: as many jobs in flight as GPUs, a pinned one on the first
actor. Where `OPTIML_WORKER_EXECUTOR` names a factory (tests stand in for a GPU with it; it must
be importable on the cluster), the actors hold what it makes and ask for no GPU: as many as its
`slots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import warnings

from optiml import __version__
from optiml.errors import RemoteUnreachable, RemoteWorkerError, UsageError, one_line, quote
from optiml.executors import worker
from optiml.executors.protocol import Hello, Request, raise_if_error, result_of
from optiml.executors.work import WorkExecutor

LOCAL_CPUS = 2  # a cluster started here: enough for a job and the hello


class RayExecutor(WorkExecutor):
    def __init__(self, url: str):
        if url != "ray" and not (url.startswith("ray://") and len(url) > len("ray://")):
            raise UsageError(
                f"--executor: `{quote(url, 60)}` is not a Ray address; write `ray` (a cluster "
                "started here) or ray://host:port (a cluster's client address, port 10001 by default)"
            )
        self.url = url
        self.address = None if url == "ray" else url
        self._started = False
        self._actors: list | None = None
        self._idle: asyncio.Queue | None = None
        self._pinned = asyncio.Lock()
        self._ids = itertools.count(1)

    def _ray(self):
        try:
            import ray
        except ImportError:
            raise UsageError(
                "--executor ray needs the ray package: pip install 'optiml[ray]'"
            ) from None
        if not ray.is_initialized():
            where = self.address or "a Ray cluster started here"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the reason is in the error's one line
                    if self.address is None:
                        ray.init(
                            num_cpus=LOCAL_CPUS,
                            include_dashboard=False,
                            logging_level=logging.ERROR,
                            log_to_driver=False,
                        )
                    else:
                        ray.init(
                            address=self.address, logging_level=logging.ERROR, log_to_driver=False
                        )
            except Exception as e:
                raise RemoteUnreachable(f"cannot reach {where}: {one_line(str(e))[:200]}") from None
            self._started = True
        return ray

    def _run(self, request: Request) -> dict:
        ray = self._ray()
        self._hello(ray)
        task = ray.remote(worker.answer_apart)
        if request.command == "eval" and ray.cluster_resources().get("GPU", 0) >= 1:
            task = task.options(num_gpus=1)
        return raise_if_error(ray.get(task.remote(request.model_dump_json())))

    def _hello(self, ray) -> Hello:
        where = self.address or "the Ray cluster started here"
        hello = Hello.model_validate(ray.get(ray.remote(worker.hello_json).remote()))
        if hello.optiml != __version__:
            raise RemoteWorkerError(
                f"{where} runs OptiML {hello.optiml} and this is OptiML {__version__}: "
                "install the same version on both"
            )
        return hello

    async def run(self, request: Request) -> dict:
        return await asyncio.to_thread(self._run, request)

    # ---- the search's jobs: one warm actor per GPU -----------------------------------------

    def _start_actors(self) -> list:
        ray = self._ray()
        self._hello(ray)
        hook = os.environ.get(worker.EXECUTOR_HOOK)
        if hook:
            count = ray.get(ray.remote(_hooked_slots).remote(hook))
            actor = ray.remote(num_gpus=0)(GpuActor)
            runtime_env = {"env_vars": {worker.EXECUTOR_HOOK: hook}}
            actors = [actor.options(runtime_env=runtime_env).remote() for _ in range(count)]
        else:
            count = int(ray.cluster_resources().get("GPU", 0))
            actors = [ray.remote(num_gpus=1)(GpuActor).remote() for _ in range(count)]
        ray.get([a.ready.remote() for a in actors])  # warm: each has made its executor
        return actors

    async def search_slots(self) -> int:
        if self._actors is None:
            self._actors = await asyncio.to_thread(self._start_actors)
            self._idle = asyncio.Queue()
            for actor in self._actors[1:]:
                self._idle.put_nowait(actor)
            if self._actors:
                self._idle.put_nowait(self._actors[0])
        return len(self._actors)

    async def submit(self, request: Request) -> dict:
        """A search job on a free actor (`pinned`: the first, whose GPU the others never take
        while it runs one): the answer as `optiml worker` gives it, raised if an error."""
        await self.search_slots()
        assert self._actors is not None and self._idle is not None
        ident = next(self._ids)
        line = request.model_copy(update={"id": ident}).model_dump_json()
        if request.pinned:
            async with self._pinned:
                return await _call(self._actors[0], line)
        actor = await self._idle.get()
        try:
            return await _call(actor, line)
        finally:
            self._idle.put_nowait(actor)

    async def close(self) -> None:
        if self._actors:
            import ray

            for actor in self._actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            self._actors = None
        if self._started:
            import ray

            await asyncio.to_thread(ray.shutdown)


# How long a cancelled job is waited for to end on its actor (its processes killed there).
CANCEL_WAIT_S = 30.0


async def _call(actor, line: str) -> dict:
    """The actor's answer to `line`, raised if an error. Cancelled, the job is cancelled there too:
    an async actor's call is an asyncio task, whose executor then kills what the job started
    (a runner, a profiler) and frees its GPU; that is waited for (at most `CANCEL_WAIT_S`), so
    that an executor closed next does not kill the actor first and leave those processes
    running."""
    import ray

    ref = actor.call.remote(line)
    try:
        return result_of(await ref)
    except asyncio.CancelledError:
        ray.cancel(ref)
        with contextlib.suppress(Exception):  # TaskCancelledError, or an answer after all
            await asyncio.wait_for(asyncio.wrap_future(ref.future()), CANCEL_WAIT_S)
        raise


def _hooked_slots(hook: str) -> int:
    os.environ[worker.EXECUTOR_HOOK] = hook
    return worker.search_executor().slots


class GpuActor:
    """One GPU of the cluster (the one Ray assigned: `CUDA_VISIBLE_DEVICES` for its runs), or what
    `OPTIML_WORKER_EXECUTOR` makes; runs one search job at a time, warm between them."""

    def __init__(self):
        if os.environ.get(worker.EXECUTOR_HOOK):
            self.executor = worker.search_executor()
        else:
            import ray

            gpu = int(ray.get_gpu_ids()[0])
            # NVML numbers every GPU of the node; Ray's id is that number
            self.executor = worker.search_executor([gpu])

    def ready(self) -> bool:
        return True

    async def call(self, line: str) -> dict:
        return await worker.answer_search(Request.model_validate_json(line), self.executor)
