"""`WorkExecutor`: what every `--executor URL` is, whatever its scheme — it runs whole
`protocol.Request`s somewhere (a check, an eval, and the search's jobs where it can). Its own
module, so that the executors (`ssh.py`, `ray_cluster.py`, `worker.py`), the search's
`RemoteExecutor` and the registry that picks among them all import it without importing each
other."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from optiml.errors import UsageError
from optiml.executors.protocol import Request


class WorkExecutor(ABC):
    """Runs `Request`s somewhere and answers with the result as plain JSON (what `--json`
    prints); an error there is raised here as the `OptimlError` it was."""

    in_process = False  # True where `--arch` and the file are resolved by this process itself
    url: str

    @abstractmethod
    async def run(self, request: Request) -> dict: ...

    async def search_slots(self) -> int:
        """Connect; how many of the search's jobs run there at once (one per GPU)."""
        raise UsageError(f"--executor {self.url} cannot run the search")

    async def submit(self, request: Request) -> Any:
        """One of the search's jobs (evaluate, profile, sanitize): its result as JSON values; an
        error there raised here. Called concurrently: the executor runs up to `search_slots`."""
        raise UsageError(f"--executor {self.url} cannot run the search")

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the executor holds (a connection, a cluster)."""
