"""GPU targets: which `sm_XY` the installed nvcc compiles for, checked before anything is compiled,
and `native` resolved to the local GPU's.

nvcc lists its plain targets (`nvcc --list-gpu-code`: sm_75 ... sm_121 for CUDA 13.0); whether it
also has an architecture-specific (`sm_90a`) or family (`sm_100f`) variant of one is asked with a
dry run, which compiles nothing. Both answers are cached per toolkit.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess

from optiml.errors import NoGpu, ToolMissing, UsageError, quote

# `sm_90`, `sm_90a` (architecture-specific features), `sm_100f` (family-specific features)
ARCH = re.compile(r"sm_([0-9]{2,3})([af]?)")
EXAMPLE = "sm_90"


def arch_number(arch: str) -> int | None:
    """90 for `sm_90`, `sm_90a` and `sm_90f`; None for anything that is not written like a target."""
    m = ARCH.fullmatch(arch)
    return int(m.group(1)) if m else None


@functools.cache
def _listed(nvcc: str, version: str) -> tuple[str, ...]:
    """The plain targets of one toolkit, in order (`version` keys the cache to the toolkit)."""
    try:
        proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ()
    found = {m.group(0) for m in re.finditer(r"\bsm_[0-9]{2,3}\b", proc.stdout)}
    return tuple(sorted(found, key=lambda a: arch_number(a) or 0))


@functools.cache
def _accepts(nvcc: str, version: str, arch: str) -> bool:
    """Whether nvcc takes `-arch=ARCH`: a dry run prints the steps and compiles nothing."""
    try:
        proc = subprocess.run(
            [nvcc, f"-arch={arch}", "--dryrun", "-cubin", "-x", "cu", "-o", os.devnull, os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _toolkit() -> tuple[str, str] | None:
    from optiml.harness.nvcc import find_toolkit

    try:
        tk = find_toolkit()
    except ToolMissing:
        return None
    return str(tk.nvcc), tk.version


def nvcc_targets() -> tuple[str, ...]:
    """Every target the installed nvcc compiles for, variants included (empty without nvcc)."""
    tk = _toolkit()
    if tk is None:
        return ()
    out: list[str] = []
    for plain in _listed(*tk):
        out.append(plain)
        out += [plain + s for s in "af" if _accepts(*tk, plain + s)]
    return tuple(out)


def arch_problem(arch: str) -> str | None:
    """Why `arch` cannot be compiled for, in one line that names what nvcc accepts; None if it
    can. Without nvcc only the form is checked (a missing nvcc is reported where it is needed)."""
    if arch_number(arch) is None:
        what = f"`{quote(arch)}` is not a GPU target"
        tk = _toolkit()
        if tk is None or not _listed(*tk):
            return f"{what}; write one like {EXAMPLE} (sm_XY, sm_XYa or sm_XYf)"
        return f"{what}; {_accepted(tk)}"
    tk = _toolkit()
    if tk is None:
        return None
    listed = _listed(*tk)
    if not listed:  # an nvcc that does not list its targets: leave the answer to the compile
        return None
    plain = f"sm_{arch_number(arch)}"
    if plain in listed and (plain == arch or _accepts(*tk, arch)):
        return None
    return f"nvcc {tk[1]} cannot compile for `{arch}`; {_accepted(tk)}"


def _accepted(tk: tuple[str, str]) -> str:
    return f"nvcc {tk[1]} accepts {', '.join(nvcc_targets())}"


def resolve_arch(arch: str | None, option: str = "--arch") -> str | None:
    """A target given on the command line, checked; `native` is the local GPU's architecture.
    `UsageError` (exit 2) for a target nvcc does not accept, `NoGpu` for `native` without a GPU."""
    if arch is None:
        return None
    arch = arch.strip()
    if arch == "native":
        from optiml.harness.gpu import local_gpus

        gpus = local_gpus()
        if not gpus:
            raise NoGpu(
                f"{option} native takes the local GPU's architecture, and NVML finds no NVIDIA GPU "
                f"here; name a target instead, e.g. {option} {EXAMPLE}"
            )
        arch = gpus[0][1]
    problem = arch_problem(arch)
    if problem is not None:
        raise UsageError(f"{option}: {problem}")
    return arch
