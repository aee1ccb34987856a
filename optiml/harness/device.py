"""The device values a spec's launch may use (`sm_count`, `max_threads_per_sm`), read on the GPU
the runs use by the runner (`runner --device`, cudaGetDeviceProperties), once per device."""

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
            return Device(**{k: data[k] for k in ("sm_count", "max_threads_per_sm")})
        except (OSError, ValueError, KeyError):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise NoGpu(
                f"cannot read the device's values (runner --device exited {proc.returncode}: "
                f"{tail[0]})"
            ) from None
