"""Where candidates run. One interface (`Executor`): evaluate, profile and sanitize a candidate of a
kernel; implementations differ in where the GPU is. `LocalExecutor` uses this machine's GPUs."""

from optiml.executors.base import Executor, Job
from optiml.executors.local import LocalExecutor, parse_gpus

__all__ = ["Executor", "Job", "LocalExecutor", "parse_gpus"]
