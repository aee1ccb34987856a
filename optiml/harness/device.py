"""The device values a spec's launch may use (`sm_count`, `max_threads_per_sm`), read on the GPU
the runs use by the runner (`runner --device`, cudaGetDeviceProperties), once per device; and
the per-SM limits of this machine's GPU for the static occupancy (`gpu_limits`)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path

from optiml.errors import NoGpu
from optiml.harness.build import runner_binary
from optiml.spec import Device


def device_values(env: dict[str, str] | None = None) -> Device:
    """The values of the device that runs under `env` (e.g. its CUDA_VISIBLE_DEVICES)."""
    merged = {**os.environ, **(env or {})}
    return _query(merged.get("CUDA_VISIBLE_DEVICES", ""), tuple(sorted((env or {}).items())))


@functools.cache
def _query(visible: str, env: tuple[tuple[str, str], ...]) -> Device:
    data = _properties(env)
    return Device(**{k: data[k] for k in ("sm_count", "max_threads_per_sm")})


def _properties(env: tuple[tuple[str, str], ...] = ()) -> dict:
    """`runner --device`'s JSON for the first GPU `env` shows; `NoGpu` where it cannot run."""
    with tempfile.TemporaryDirectory(prefix="optiml-device-") as tmp:
        out = Path(tmp) / "device.json"
        proc = subprocess.run(
            [str(runner_binary()), "--device", str(out)],
            env={**os.environ, **dict(env)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            data = json.loads(out.read_text())
            if not isinstance(data, dict) or "sm_count" not in data:
                raise ValueError(data)
            return data
        except (OSError, ValueError):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise NoGpu(
                f"cannot read the device's values (runner --device exited {proc.returncode}: "
                f"{tail[0]})"
            ) from None


LIMIT_KEYS = (
    "arch",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "registers_per_sm",
    "smem_per_sm",
    "smem_per_block_optin",
    "smem_reserved_per_block",
)


@functools.cache
def gpu_limits() -> dict | None:
    """The per-SM limits of this machine's first GPU as the CUDA runtime gives them
    (`cudaGetDeviceProperties`: its architecture, threads, blocks, registers and shared memory
    per SM, shared memory per block), or None without a GPU or where they cannot be read. Kept
    on disk per GPU and driver, so that a compile job does not start the runner each time."""
    identity = _gpu_identity()
    if identity is None:
        return None
    from optiml.harness.build import cache_dir

    kept = cache_dir() / "device" / f"{identity}.json"
    try:
        data = json.loads(kept.read_text())
        if all(k in data for k in LIMIT_KEYS):
            return {k: data[k] for k in LIMIT_KEYS}
    except (OSError, ValueError):
        pass
    try:
        data = _properties()
    except (NoGpu, OSError, subprocess.SubprocessError):
        return None
    if not all(k in data for k in LIMIT_KEYS):
        return None
    found = {k: data[k] for k in LIMIT_KEYS}
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(found))
    return found


def _gpu_identity() -> str | None:
    """The first GPU's UUID and the driver's version (NVML), as a file name; None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no GPU here
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        driver = pynvml.nvmlSystemGetDriverVersion()
        text = f"{uuid}-{driver}"
        return "".join(c if c.isalnum() or c in "-." else "_" for c in str(text))
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()
