"""compute-sanitizer on one kernel: the runner launches the candidate twice (a profile-only plan,
inputs made anew before each launch, buffers allocated to their exact sizes) at each of the given
problem sizes under `memcheck` (out-of-bounds and misaligned accesses; leaks are not ours),
`initcheck` (reads of global memory never written: the `out` buffers are left unwritten for it),
`racecheck` (shared-memory hazards) or `synccheck` (barriers not every thread reaches), and the
tool's error summary becomes a `SanitizerReport`. Each run is a process group of its own, killed
whole at its time limit."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import CompileFailed, ExitCode, OptimlError, SpecValueError
from optiml.expr import ExprError
from optiml.harness import procs
from optiml.harness.build import DEFAULT_FLAGS, build_kernel
from optiml.harness.evaluate import launch_once
from optiml.harness.gpu import default_arch
from optiml.spec import Case, Spec


class SanitizerMissing(OptimlError):
    exit_code = ExitCode.NO_NCU


TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")


class SanitizerReport(BaseModel):
    tool: str  # memcheck | initcheck | racecheck | synccheck
    errors: int
    ok: bool
    size: str  # the problem sizes it ran at
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
    sizes: list[dict[str, int]] | dict[str, int] | None = None,
    launches: int = 2,
    flags: tuple[str, ...] = DEFAULT_FLAGS,
    arch: str | None = None,
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
) -> SanitizerReport:
    """Run the kernel (its variant's launch and instantiation) `launches` times under
    compute-sanitizer at each of `sizes` (default: the spec's smallest)."""
    exe = find_sanitizer()
    arch = arch or spec.arch or default_arch()
    build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=arch, flags=flags)
    if not build.ok:
        first = next((m for m in build.messages if m.severity == "error"), None)
        raise CompileFailed(f"the kernel does not compile: {first or 'nvcc failed'}")
    if sizes is None:
        sizes = [min(spec.sizes, key=lambda s: sum(_case(spec, s).lengths.values()))]
    elif isinstance(sizes, dict):
        sizes = [sizes]
    start = time.perf_counter()
    errors, messages, labels = 0, [], []
    for chosen in sizes:
        case = _case(spec, chosen)
        labels.append(case.label)
        with tempfile.TemporaryDirectory(prefix="optiml-sanitize-") as tmp:
            work = Path(tmp)
            cmd = [
                str(exe),
                "--tool",
                tool,
                "--error-exitcode",
                "99",
                *(["--leak-check", "no"] if tool == "memcheck" else []),
                *launch_once(
                    spec,
                    case,
                    arch,
                    build.path,
                    work,
                    launches=launches,
                    poison_outputs=tool != "initcheck",
                ),
            ]
            left = max(1.0, timeout_s - (time.perf_counter() - start))
            run = procs.run(cmd, timeout=left, env={**os.environ, **(env or {})}, cwd=str(work))
        if run.returncode is None:
            errors += 1
            messages.append(f"did not finish within {timeout_s:g} s at {case.label}")
            break
        log = run.stdout + run.stderr
        m = _SUMMARY.search(log)
        found = int(m.group(1)) if m else (0 if run.returncode == 0 else 1)
        lines = [
            line.strip("= ").strip() for line in log.splitlines() if line.startswith("=========")
        ]
        found_messages = [line for line in lines if line and "ERROR SUMMARY" not in line][:8]
        if m is None and run.returncode != 0 and not found_messages:
            found_messages = [log.strip()[-300:]]
        if found or run.returncode != 0:
            errors += max(found, 1)
            messages += [f"{msg} (at {case.label})" for msg in found_messages]
    return SanitizerReport(
        tool=tool,
        errors=errors,
        ok=errors == 0,
        size="; ".join(labels),
        messages=messages[:8],
        seconds=time.perf_counter() - start,
    )


def _case(spec: Spec, sizes: dict[str, int]) -> Case:
    try:
        return spec.case(sizes)
    except ExprError as e:
        raise SpecValueError(f"`{spec.kernel}`'s spec at {sizes}: {e}") from None
