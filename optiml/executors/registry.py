"""Executors by name: `--executor URL` picks where a job runs by the URL's scheme.

Each executor is one module with one class (a `WorkExecutor`, `work.py`) and one line in `EXECUTORS`; a module
is imported only when its scheme is used, so `asyncssh` and `ray` load only for their URLs.

The search (`optimize`, `profile`) takes one URL or several, comma-separated: `local` is this
machine's GPUs (`LocalExecutor`), any other a `RemoteExecutor` over its `WorkExecutor`, and several
pool their GPUs (`PooledExecutor`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from optiml.errors import UsageError, quote
from optiml.executors.work import WorkExecutor

if TYPE_CHECKING:
    from optiml.executors.base import Executor

# scheme -> "module:class"; `local` and `ray` are also valid without `://`
EXECUTORS = {
    "local": "optiml.executors.worker:InProcess",
    "ssh": "optiml.executors.ssh:SshExecutor",
    "ray": "optiml.executors.ray_cluster:RayExecutor",
}


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


def split_urls(text: str) -> list[str]:
    """`--executor` of the search: one URL or several, comma-separated (a `UsageError` for none
    or one named twice)."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise UsageError(
            "--executor takes a URL (`local`, `ssh://host`, `ray`) or several, comma-separated"
        )
    if len(set(urls)) != len(urls):
        raise UsageError(f"--executor names `{quote(text, 60)}`: each executor once")
    for url in urls:
        if scheme_of(url) != "local":
            open_executor(url)  # a bad URL fails here, before any work
    return urls


def open_search_executor(text: str, gpus: list[int] | None = None) -> Executor:
    """The search's executor for `--executor`: `local` (this machine's `gpus`), a remote one, or
    several pooled (the first takes the pinned final comparisons)."""
    from optiml.executors.local import LocalExecutor
    from optiml.executors.pool import PooledExecutor
    from optiml.executors.remote import RemoteExecutor

    members: list[Executor] = [
        LocalExecutor(gpus) if scheme_of(url) == "local" else RemoteExecutor(open_executor(url))
        for url in split_urls(text)
    ]
    return members[0] if len(members) == 1 else PooledExecutor(members)
