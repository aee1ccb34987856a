"""compute-sanitizer on one kernel: the runner launches the candidate once (a profile-only plan) at a
small problem size under `memcheck` (out-of-bounds and misaligned accesses, leaks are not ours) or
`racecheck` (shared-memory hazards), and the tool's error summary becomes a `SanitizerReport`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import ExitCode, OptimlError
from optiml.harness.build import DEFAULT_FLAGS, build_kernel
from optiml.harness.evaluate import launch_once
from optiml.harness.gpu import default_arch
from optiml.spec import Spec


class SanitizerMissing(OptimlError):
    exit_code = ExitCode.NO_NCU


class SanitizerReport(BaseModel):
    tool: str  # memcheck | racecheck | synccheck
    errors: int
    ok: bool
    size: str  # the problem size it ran at
    messages: list[str]  # the tool's first error lines
    seconds: float


def find_sanitizer() -> Path:
    candidates = [
        os.environ.get("OPTIML_COMPUTE_SANITIZER"),
        shutil.which("compute-sanitizer"),
        str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"),
    ]
    found = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
    if found is None:
        raise SanitizerMissing(
            "compute-sanitizer not found: it ships with the CUDA toolkit (or set OPTIML_COMPUTE_SANITIZER)"
        )
    return found


_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error", re.I)


def sanitize(
    source: SourceFile,
    kernel: Kernel,
    spec: Spec,
    tool: str,
    *,
    sizes: dict[str, int] | None = None,
    flags: tuple[str, ...] = DEFAULT_FLAGS,
    arch: str | None = None,
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
) -> SanitizerReport:
    """Run the kernel (its variant's launch and instantiation) once under compute-sanitizer."""
    exe = find_sanitizer()
    arch = arch or spec.arch or default_arch()
    build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=arch, flags=flags)
    if not build.ok:
        first = next((m for m in build.messages if m.severity == "error"), None)
        raise OptimlError(f"the kernel does not compile: {first or 'nvcc failed'}")
    chosen = sizes or min(spec.sizes, key=lambda s: sum(spec.case(s).lengths.values()))
    case = spec.case(chosen)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="optiml-sanitize-") as tmp:
        work = Path(tmp)
        cmd = [
            str(exe),
            "--tool",
            tool,
            "--error-exitcode",
            "99",
            "--leak-check",
            "no",
            *launch_once(spec, case, arch, build.path, work),
        ]
        try:
            p = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, **(env or {})},
                cwd=work,
            )
            log = p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            return SanitizerReport(
                tool=tool,
                errors=1,
                ok=False,
                size=case.label,
                messages=[f"did not finish within {timeout_s:g} s"],
                seconds=time.perf_counter() - start,
            )
    m = _SUMMARY.search(log)
    errors = int(m.group(1)) if m else (0 if p.returncode == 0 else 1)
    lines = [line.strip("= ").strip() for line in log.splitlines() if line.startswith("=========")]
    messages = [line for line in lines if line and "ERROR SUMMARY" not in line][:8]
    if m is None and p.returncode != 0 and not messages:
        messages = [log.strip()[-300:]]
    return SanitizerReport(
        tool=tool,
        errors=errors,
        ok=errors == 0 and p.returncode == 0,
        size=case.label,
        messages=messages,
        seconds=time.perf_counter() - start,
    )
