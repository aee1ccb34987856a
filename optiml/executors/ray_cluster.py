"""`ray` and `ray://host:port`: jobs run as Ray tasks, on a cluster started here (on loopback) or on
an existing one reached through its client address.

The task is the worker's own `answer`, so a Ray job answers what `optiml worker` answers. An eval
asks for a GPU where the cluster has one. Needs the `ray` package (`pip install 'optiml[ray]'`), on
the cluster too, with this version of OptiML.
"""

from __future__ import annotations

import asyncio
import logging
import warnings

from optiml import __version__
from optiml.errors import RemoteUnreachable, RemoteWorkerError, UsageError, one_line, quote
from optiml.executors import worker
from optiml.executors.protocol import Hello, Request, raise_if_error
from optiml.executors.registry import WorkExecutor

LOCAL_CPUS = 2  # a cluster started here: enough for a job and the hello


class RayExecutor(WorkExecutor):
    def __init__(self, url: str):
        if url != "ray" and not (url.startswith("ray://") and len(url) > len("ray://")):
            raise UsageError(
                f"--executor: `{quote(url, 60)}` is not a Ray address; write `ray` (a cluster "
                "started here) or ray://host:port (a cluster's client address, port 10001 by default)"
            )
        self.address = None if url == "ray" else url
        self._started = False

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
        where = self.address or "the Ray cluster started here"
        hello = Hello.model_validate(ray.get(ray.remote(worker.hello_json).remote()))
        if hello.optiml != __version__:
            raise RemoteWorkerError(
                f"{where} runs OptiML {hello.optiml} and this is OptiML {__version__}: "
                "install the same version on both"
            )
        task = ray.remote(worker.answer_apart)
        if request.command == "eval" and ray.cluster_resources().get("GPU", 0) >= 1:
            task = task.options(num_gpus=1)
        return raise_if_error(ray.get(task.remote(request.model_dump_json())))

    async def run(self, request: Request) -> dict:
        return await asyncio.to_thread(self._run, request)

    async def close(self) -> None:
        if self._started:
            import ray

            await asyncio.to_thread(ray.shutdown)
