"""The device's memory-bandwidth ceilings, and the physical floor they put under a case: no correct
kernel moves the bytes its work needs faster than the device's DRAM can.

Once per device (the runner's `--ceilings` mode), cached by device name, driver and runtime in the
cache folder: the memory's theoretical bandwidth as NVML gives it (two transfers per clock of the
maximum memory clock over the bus width), and streaming float4 reads, writes and copies of 1 GiB
measured, best of ten. The floor uses the larger of the theoretical peak and the best measured
bandwidth with an allowance, so that neither a measurement slowed by another process on the GPU
nor a device NVML says nothing about can make an honest kernel look too fast. Nothing about a
particular GPU is written into the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel

from optiml.harness.build import cache_dir, runner_binary
from optiml.harness.verdict import DeviceInfo, Floor

# A measured streaming kernel does not reach the hardware's peak: the floor divides by the best
# measured bandwidth times this, so that no honest kernel can be under it.
CEILING_ALLOWANCE = 1.15


class Ceilings(BaseModel):
    device: str
    read_gbs: float
    write_gbs: float
    copy_gbs: float
    peak_gbs: float = 0.0  # theoretical, from NVML; 0 where it does not say
    sm_clock_mhz: int = -1

    @property
    def best_gbs(self) -> float:
        """The fastest a kernel's DRAM traffic can go: the floor's divisor."""
        measured = max(self.read_gbs, self.write_gbs, self.copy_gbs) * CEILING_ALLOWANCE
        return max(self.peak_gbs, measured)


def _key(device: DeviceInfo) -> str:
    return f"{device.name}|{device.driver_version}|{device.runtime_version}"


def _cache_file() -> Path:
    return cache_dir() / "ceilings.json"


def device_ceilings(device: DeviceInfo, env: dict[str, str] | None = None) -> Ceilings | None:
    """The ceilings of `device` (the GPU `env` selects), measured on first use; None where the
    measurement fails (the floor is then not checked, and nothing else depends on it)."""
    path = _cache_file()
    try:
        known = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        known = {}
    if _key(device) in known:
        return Ceilings.model_validate(known[_key(device)])
    with tempfile.TemporaryDirectory(prefix="optiml-ceilings-") as tmp:
        out = Path(tmp) / "ceilings.json"
        try:
            subprocess.run(
                [str(runner_binary()), "--ceilings", str(out)],
                env={**os.environ, **(env or {})},
                capture_output=True,
                timeout=120,
                start_new_session=True,
                check=False,
            )
            data = json.loads(out.read_text())
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            return None
    if data.get("status") != "done" or data["device"]["name"] != device.name:
        return None
    ceilings = Ceilings(
        device=device.name,
        read_gbs=data["read_gbs"],
        write_gbs=data["write_gbs"],
        copy_gbs=data["copy_gbs"],
        peak_gbs=float(data["peak_gbs"]) if isinstance(data.get("peak_gbs"), int | float) else 0.0,
        sm_clock_mhz=data.get("sm_clock_mhz", -1),
    )
    known[_key(device)] = ceilings.model_dump()
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(known, indent=1))
    os.replace(partial, path)
    return ceilings


def floor_of(least_bytes: int, ceilings: Ceilings) -> Floor:
    """The least time `least_bytes` of DRAM traffic can take on the device."""
    gbs = ceilings.best_gbs
    return Floor(bytes=least_bytes, ms=least_bytes / (gbs * 1e9) * 1e3, ceiling_gbs=gbs)
