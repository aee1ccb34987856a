"""nvcc: finding it, running it, and reading what it says back in the user's terms — diagnostics
at the user's file and line, and ptxas's resource usage per kernel.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from optiml.errors import ToolMissing


class CompilerMessage(BaseModel):
    """One nvcc/host-compiler/ptxas message, at the user's file and 1-based line where it has one."""

    severity: str  # error | warning | remark | note
    message: str
    path: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.path or "nvcc"
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        return f"{where}: {self.severity}: {self.message}"


class Resources(BaseModel):
    """ptxas's report for one entry function."""

    mangled: str
    name: str  # demangled
    arch: str
    registers: int = 0
    barriers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0
    cmem_bytes: int = 0


@dataclass(frozen=True)
class Toolkit:
    nvcc: Path
    version: str  # "13.0.88"
    lib_dir: Path  # where libcudart.so lives

    @property
    def include_dir(self) -> Path:
        return self.nvcc.parent.parent / "include"


@functools.cache
def find_toolkit() -> Toolkit:
    """The CUDA toolkit on PATH (or $CUDA_HOME); `ToolMissing` with what to do if there is none."""
    chosen = os.environ.get("OPTIML_NVCC")
    if chosen and not Path(chosen).is_file():
        raise ToolMissing(f"nvcc not found: OPTIML_NVCC={chosen} is not a file")
    candidates = [chosen, shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    nvcc = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
    if nvcc is None:
        raise ToolMissing(
            "nvcc not found: install the CUDA toolkit or put its bin/ on PATH (or set CUDA_HOME)"
        )
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    root = nvcc.resolve().parent.parent
    lib = next(
        (
            d
            for d in (root / "lib64", root / "targets" / "x86_64-linux" / "lib", root / "lib")
            if (d / "libcudart.so").exists()
        ),
        root / "lib64",
    )
    return Toolkit(nvcc=nvcc, version=m.group(1) if m else "unknown", lib_dir=lib)


@dataclass
class CompileResult:
    """What nvcc did; `parse_messages` and `parse_resources` read the log."""

    ok: bool
    output: Path
    log: str
    seconds: float
    command: list[str]


def compile_cuda(
    source: Path,
    output: Path,
    *,
    arch: str,
    flags: list[str],
    include_dirs: list[Path],
    mode: str,  # "shared" (a .so for the runner) | "cubin" (device code only, for static reports)
    # | "ptx" (the device code's PTX: what a kernel instantiates and references)
    timeout_s: float = 300,
) -> CompileResult:
    tk = find_toolkit()
    std = [] if any(f.startswith(("-std=", "--std=")) for f in flags) else ["-std=c++17"]
    cmd = [str(tk.nvcc), f"-arch={arch}", *std, "-Xptxas", "-v", "-lineinfo"]
    cmd += [f"-I{d}" for d in include_dirs]
    if mode == "shared":
        cmd += [
            "-Xcompiler",
            "-fPIC",
            "-shared",
            "-cudart",
            "shared",
            "-Xlinker",
            f"-rpath,{tk.lib_dir}",
        ]
    elif mode == "cubin":
        cmd += ["-cubin"]
    elif mode == "ptx":
        cmd += ["-ptx"]
    else:
        raise ValueError(mode)
    cmd += list(flags) + ["-o", str(output), str(source)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, cwd=source.parent
        )
        log, ok = proc.stdout + proc.stderr, proc.returncode == 0
    except subprocess.TimeoutExpired:
        log, ok = f"nvcc did not finish within {timeout_s:.0f} s", False
    seconds = time.perf_counter() - start
    return CompileResult(ok, output, log, seconds, cmd)


# `file(12): error: message` (EDG front end), optionally with an error number
_EDG = re.compile(
    r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<sev>error|warning|remark|catastrophic error)(?: #\S+)?: (?P<msg>.*)$"
)
# `file:12:5: error: message` (host compiler)
_GCC = re.compile(
    r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<sev>error|warning|note|fatal error): (?P<msg>.*)$"
)
_PTXAS = re.compile(r"^ptxas (?P<sev>error|fatal|warning)\s*: (?P<msg>.*)$")
_DETECTED = re.compile(r"^\s*detected during")


def parse_messages(log: str) -> list[CompilerMessage]:
    """nvcc's diagnostics. EDG prints the source line and a caret under the column after each
    message; the caret gives the column."""
    lines = log.splitlines()
    out: list[CompilerMessage] = []
    for i, line in enumerate(lines):
        if m := _EDG.match(line):
            sev = "error" if "error" in m["sev"] else m["sev"]
            column = None
            if i + 2 < len(lines) and lines[i + 2].strip() == "^":
                column = _caret_column(lines[i + 1], lines[i + 2])
            out.append(
                CompilerMessage(
                    severity=sev,
                    message=m["msg"].strip(),
                    path=m["path"],
                    line=int(m["line"]),
                    column=column,
                )
            )
        elif m := _GCC.match(line):
            sev = "error" if "error" in m["sev"] else m["sev"]
            out.append(
                CompilerMessage(
                    severity=sev,
                    message=m["msg"].strip(),
                    path=m["path"],
                    line=int(m["line"]),
                    column=int(m["col"]),
                )
            )
        elif m := _PTXAS.match(line):
            sev = "warning" if m["sev"] == "warning" else "error"
            out.append(CompilerMessage(severity=sev, message="ptxas: " + m["msg"].strip()))
    return out


def _caret_column(echo: str, caret: str) -> int:
    """nvcc echoes the source line with two spaces of indent and puts `^` under the column."""
    indent = 2 if echo.startswith("  ") else 0
    return caret.index("^") - indent + 1


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<regs>\d+) registers(?P<rest>.*)")


def parse_resources(log: str) -> list[Resources]:
    """ptxas -v output, one `Resources` per entry function (kernels, not device functions)."""
    entries: dict[str, Resources] = {}
    props: dict[str, tuple[int, int, int]] = {}
    current_entry: str | None = None
    current_props: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current_entry = m["name"]
            entries[current_entry] = Resources(
                mangled=current_entry, name=current_entry, arch=m["arch"]
            )
        elif m := _PROPS.search(line):
            current_props = m["name"]
        elif (m := _FRAME.search(line)) and current_props:
            props[current_props] = (int(m["stack"]), int(m["st"]), int(m["ld"]))
        elif (m := _USED.search(line)) and current_entry:
            r = entries[current_entry]
            r.registers = int(m["regs"])
            rest = m["rest"]
            if b := re.search(r"used (\d+) barriers", rest):
                r.barriers = int(b[1])
            if s := re.search(r"(\d+) bytes smem", rest):
                r.static_smem_bytes = int(s[1])
            if c := re.search(r"(\d+) bytes cmem\[0\]", rest):
                r.cmem_bytes = int(c[1])
            current_entry = None
    for name, r in entries.items():
        if name in props:
            r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes = props[name]
    names = demangle(list(entries))
    for mangled, r in entries.items():
        r.name = names.get(mangled, mangled)
    return list(entries.values())


def demangle(names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    tool = shutil.which("cu++filt") or str(find_toolkit().nvcc.parent / "cu++filt")
    if not Path(tool).exists():
        tool = shutil.which("c++filt") or ""
    if not tool:
        return {n: n for n in names}
    proc = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = proc.stdout.splitlines()
    return dict(zip(names, out, strict=False)) if len(out) == len(names) else {n: n for n in names}
