"""Executors by name: `--executor URL` picks where a job runs by the URL's scheme.

Each executor is one module with one class (a `WorkExecutor`) and one line in `EXECUTORS`; a module
is imported only when its scheme is used, so `asyncssh` and `ray` load only for their URLs.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from urllib.parse import urlsplit

from optiml.errors import UsageError, quote
from optiml.executors.protocol import Request

# scheme -> "module:class"; `local` and `ray` are also valid without `://`
EXECUTORS = {
    "local": "optiml.executors.worker:InProcess",
    "ssh": "optiml.executors.ssh:SshExecutor",
    "ray": "optiml.executors.ray_cluster:RayExecutor",
}


class WorkExecutor(ABC):
    """Runs `Request`s somewhere and answers with the result as plain JSON (what `--json`
    prints); an error there is raised here as the `OptimlError` it was."""

    in_process = False  # True where `--arch` and the file are resolved by this process itself

    @abstractmethod
    async def run(self, request: Request) -> dict: ...

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the executor holds (a connection, a cluster)."""


def scheme_of(url: str) -> str:
    url = url.strip()
    return urlsplit(url).scheme if "://" in url else url


def open_executor(url: str) -> WorkExecutor:
    """The executor for `url`; a `UsageError` for a scheme no executor has (or a bad URL)."""
    scheme = scheme_of(url)
    target = EXECUTORS.get(scheme)
    if target is None:
        names = ", ".join(f"`{s}`" for s in EXECUTORS)
        raise UsageError(
            f"--executor: `{quote(url, 40)}` names no executor; use one of {names} "
            "(e.g. `local`, `ssh://user@host:22`, `ray`, `ray://host:10001`)"
        )
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(url.strip())
