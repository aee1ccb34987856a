"""How the user's project builds a file: include directories, macro definitions, the C++ standard
and other nvcc flags, given on the command line (`-I`, `-D`, `--std`, `--nvcc-flag`), by an
editor's settings, or read from the project's `compile_commands.json` (CMake's
`CMAKE_EXPORT_COMPILE_COMMANDS`, Bear), found up the tree from the file or named.

A file's build options are a property of where it lives, as in a compilation database: every
compile of that file — the check, the reference, every candidate of a search, the profile, the
sanitizers, the judge's — gets them (`options_for(path)`), appended to the flags of the compile
itself. `configure(path, ...)` says what the command line or the editor gave for a file.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field

from optiml.errors import InputFileError, UsageError, quote

DATABASE = "compile_commands.json"
# Where a database is looked for in each directory up from the file: CMake writes it in the build
# tree, which projects keep in `build/` or link to the source root.
PLACES = (DATABASE, f"build/{DATABASE}")
STD = re.compile(r"(c|gnu)\+\+(03|11|14|17|20|23|2a|2b)")
# nvcc options that change what a compile produces or for which GPU: OptiML decides those itself.
REFUSED = (
    "-o",
    "--output-file",
    "-c",
    "--compile",
    "-E",
    "--preprocess",
    "-M",
    "--ptx",
    "-ptx",
    "--cubin",
    "-cubin",
    "--fatbin",
    "-fatbin",
    "-lib",
    "--lib",
    "-shared",
    "--shared",
    "-run",
    "--run",
    "-arch",
    "--gpu-architecture",
    "-gencode",
    "--generate-code",
    "-code",
    "--gpu-code",
    "-dc",
    "--device-c",
    "-rdc",
    "--relocatable-device-code",
    "-x",
    "--x",
)


class BuildOptions(BaseModel):
    """A file's build options, as plain data (they travel with a job to another machine)."""

    include: list[str] = Field(default_factory=list)  # directories, absolute once resolved
    define: list[str] = Field(default_factory=list)  # NAME or NAME=VALUE
    std: str | None = None  # c++17, c++20, ...
    nvcc_flags: list[str] = Field(default_factory=list)
    database: str | None = None  # the compile_commands.json they came from, if any

    def flags(self) -> list[str]:
        out = [f"-I{d}" for d in self.include] + [f"-D{d}" for d in self.define]
        if self.std:
            out.append(f"-std={self.std}")
        return out + list(self.nvcc_flags)

    def then(self, other: BuildOptions) -> BuildOptions:
        """These options, then `other`'s (a later -D wins in nvcc; `other`'s std wins)."""
        return BuildOptions(
            include=self.include + [d for d in other.include if d not in self.include],
            define=self.define + other.define,
            std=other.std or self.std,
            nvcc_flags=self.nvcc_flags + other.nvcc_flags,
            database=other.database or self.database,
        )

    @property
    def empty(self) -> bool:
        return not (self.include or self.define or self.std or self.nvcc_flags)


def checked(
    include: list[str] | tuple[str, ...] = (),
    define: list[str] | tuple[str, ...] = (),
    std: str | None = None,
    nvcc_flags: list[str] | tuple[str, ...] = (),
    base: Path | None = None,
) -> BuildOptions:
    """Options as a user gives them, checked (a `UsageError` naming the bad one): include
    directories resolved against `base` (default: the working directory) and required to exist,
    macro names that are identifiers, a C++ standard nvcc knows, no flag that changes what is
    built or for which GPU."""
    base = base or Path.cwd()
    dirs = []
    for d in include:
        path = (base / d).resolve()
        if not path.is_dir():
            raise UsageError(f"-I {quote(d, 80)}: no such directory")
        dirs.append(str(path))
    for d in define:
        if not re.fullmatch(r"[A-Za-z_]\w*(=.*)?", d, re.S) or "\n" in d:
            raise UsageError(f"-D {quote(d, 60)}: write NAME or NAME=VALUE")
    if std is not None and not STD.fullmatch(std):
        raise UsageError(f"--std {quote(std, 20)}: write c++17, c++20 or another c++NN")
    for flag in nvcc_flags:
        name = flag.split("=", 1)[0]
        if name in REFUSED or any(name.startswith(r) for r in ("-M", "-o", "--output")):
            raise UsageError(
                f"--nvcc-flag {quote(flag, 60)}: OptiML sets what nvcc produces and for which "
                "GPU itself (use --arch for the GPU)"
            )
        if name.startswith("-std") or name.startswith("--std"):
            raise UsageError(f"--nvcc-flag {quote(flag, 60)}: give the standard with --std")
    return BuildOptions(include=dirs, define=list(define), std=std, nvcc_flags=list(nvcc_flags))


def discover(file: Path) -> Path | None:
    """The nearest `compile_commands.json` up the tree from `file` (also in a `build/` folder)."""
    for directory in Path(file).resolve().parents:
        for place in PLACES:
            candidate = directory / place
            if candidate.is_file():
                return candidate
    return None


def _arguments(entry: dict) -> list[str]:
    if isinstance(entry.get("arguments"), list):
        return [str(a) for a in entry["arguments"]]
    return shlex.split(str(entry.get("command", "")))


def _expanded(args: list[str], directory: Path, depth: int = 0) -> list[str]:
    """`args` with nvcc's response files (`--options-file F`, `-optf F`, `@F`; CMake writes the
    include directories into one) read in place."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        name = None
        if a in ("--options-file", "-optf") and i + 1 < len(args):
            name, i = args[i + 1], i + 1
        elif a.startswith("--options-file="):
            name = a.split("=", 1)[1]
        elif a.startswith("@") and len(a) > 1:
            name = a[1:]
        if name is None:
            out.append(a)
        elif depth < 4:
            try:
                text = (directory / name).read_text()
            except OSError:
                text = ""  # a response file that is gone: its flags are unknown, the rest stands
            out += _expanded(shlex.split(text), directory, depth + 1)
        i += 1
    return out


def from_database(database: Path, file: Path) -> BuildOptions:
    """The build options the database gives `file`: its own entry, else one of a file in the
    same directory, else the first CUDA entry (a project's flags are usually the same for all its
    files). Only what changes how the file compiles is taken: -I/-isystem/-iquote, -D/-U, the
    standard, -include; never outputs or targets. An `InputFileError` if it cannot be read."""
    try:
        entries = json.loads(database.read_text())
    except OSError as e:
        raise InputFileError(f"{database}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{database}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    if not isinstance(entries, list) or not all(isinstance(x, dict) for x in entries):
        raise UsageError(f"{database}: a compilation database is a JSON list of objects")
    file = Path(file).resolve()

    def entry_file(e: dict) -> Path:
        return (Path(str(e.get("directory", database.parent))) / str(e.get("file", ""))).resolve()

    cuda = [e for e in entries if str(e.get("file", "")).endswith((".cu", ".cuh"))]
    entry = (
        next((e for e in entries if entry_file(e) == file), None)
        or next((e for e in cuda if entry_file(e).parent == file.parent), None)
        or (cuda[0] if cuda else None)
    )
    if entry is None:
        return BuildOptions(database=str(database))
    directory = Path(str(entry.get("directory", database.parent)))
    include: list[str] = []
    define: list[str] = []
    flags: list[str] = []
    std = None
    args = _expanded(_arguments(entry)[1:], directory)  # the compiler itself first
    i = 0
    while i < len(args):
        a = args[i]
        value = args[i + 1] if i + 1 < len(args) else ""
        for prefix in ("-isystem", "-iquote", "-I", "--include-path"):
            if a == prefix or (a.startswith(prefix) and prefix != "--include-path"):
                d = a[len(prefix) :].lstrip("=") or value
                include.append(str((directory / d).resolve()))
                i += 1 if a == prefix else 0
                break
            if a.startswith("--include-path="):
                include.append(str((directory / a.split("=", 1)[1]).resolve()))
                break
        else:
            if a in ("-D", "--define-macro"):
                define.append(value)
                i += 1
            elif a.startswith("-D"):
                define.append(a[2:])
            elif a.startswith("--define-macro="):
                define.append(a.split("=", 1)[1])
            elif a in ("-U", "--undefine-macro"):
                flags += ["-U", value]
                i += 1
            elif a.startswith("-U"):
                flags.append(a)
            elif a.startswith(("-std=", "--std=")):
                std = a.split("=", 1)[1]
            elif a in ("-std", "--std"):
                std = value
                i += 1
            elif a == "-include":
                flags += ["-include", str((directory / value).resolve())]
                i += 1
        i += 1
    if std is not None and not STD.fullmatch(std):
        std = None  # a C standard (a .c entry) or one nvcc does not take: the default stays
    return BuildOptions(
        include=list(dict.fromkeys(include)),
        define=define,
        std=std,
        nvcc_flags=flags,
        database=str(database),
    )


# What the command line or the editor said, per file (resolved path); the database to read per
# file: a path, None (none), or "auto" (discover).
_GIVEN: dict[str, tuple[BuildOptions, str | None]] = {}


def configure(path: str | Path, given: BuildOptions, database: str | None = "auto") -> None:
    """Set `path`'s build options: the database's (`database`: a path, `auto` to look up the tree,
    None for none), then `given`. Reads the database now, so a bad one fails here."""
    key = str(Path(path).resolve())
    _GIVEN[key] = (given, database)
    _resolved.cache_clear()
    options_for(path)


@lru_cache(maxsize=256)
def _resolved(key: str) -> BuildOptions:
    given, database = _GIVEN.get(key, (BuildOptions(), "auto"))
    db = discover(Path(key)) if database == "auto" else (Path(database) if database else None)
    base = from_database(db, Path(key)) if db is not None else BuildOptions()
    return base.then(given)


def options_for(path: str | Path) -> BuildOptions:
    """The build options of the file at `path` (none for a file held only in memory)."""
    if not path or str(path).startswith("<"):
        return BuildOptions()
    return _resolved(str(Path(path).resolve()))


def build_data(path: str | Path) -> dict | None:
    """`path`'s build options as data for a request (None where there are none)."""
    options = options_for(path)
    return None if options.empty else options.model_dump()
