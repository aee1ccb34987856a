"""Where work runs. Two interfaces: `Executor` (evaluate, profile and sanitize a candidate of a
kernel, for the search; `LocalExecutor` uses this machine's GPUs) and `work.WorkExecutor`, which
runs a whole `protocol.Request` (a check, an eval) where `--executor URL` says: `local`, `ssh://`,
`ray`. The search reaches another machine through `remote.RemoteExecutor` (its jobs as requests)
and several at once through `pool.PooledExecutor`."""

from optiml.executors.base import Executor, Job
from optiml.executors.local import LocalExecutor, parse_gpus

__all__ = ["Executor", "Job", "LocalExecutor", "parse_gpus"]
