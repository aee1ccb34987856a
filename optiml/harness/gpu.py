"""What GPU this machine has, through NVML: whether there is one, and its architecture."""

from __future__ import annotations

import functools

from optiml.errors import NoGpu

DEFAULT_ARCH = "sm_90"


@functools.cache
def local_gpus() -> tuple[tuple[str, str], ...]:
    """(name, "sm_XY") for each NVIDIA GPU NVML sees; empty without a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: both mean "no GPU here"
        return ()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            out.append((name if isinstance(name, str) else name.decode(), f"sm_{major}{minor}"))
        return tuple(out)
    finally:
        pynvml.nvmlShutdown()


def default_arch() -> str:
    """The local GPU's architecture, else sm_90."""
    gpus = local_gpus()
    return gpus[0][1] if gpus else DEFAULT_ARCH


def require_gpu(command: str) -> None:
    if not local_gpus():
        raise NoGpu(
            f"no NVIDIA GPU found: `optiml {command}` runs kernels and needs one (`optiml check` works without)"
        )
