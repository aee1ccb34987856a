"""Building what an evaluation runs: the translation unit of one kernel plus its launcher, compiled
to a shared object (or a cubin for static reports), content-addressed in a cache; and the runner.

The launcher exports the C functions the runner looks up: `optiml_launch`, `optiml_attributes`,
`optiml_occupancy` and `optiml_state` (the file's writable `__device__` variables). Every object gets its own symbols (loaded with RTLD_LOCAL), so a reference
and a candidate that define the same kernel never clash.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from optiml.cuda.source import Kernel, SourceFile
from optiml.cuda.types import lookup, struct_layout
from optiml.harness.nvcc import (
    CompilerMessage,
    Resources,
    compile_cuda,
    find_toolkit,
    parse_messages,
    parse_resources,
)
from optiml.harness.project import options_for

LAUNCHER_FILE = "optiml-launcher"
DEFAULT_FLAGS = ("-O3",)


def cache_dir() -> Path:
    root = (
        os.environ.get("OPTIML_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "optiml"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _line_name(source: SourceFile) -> str:
    """The file name `#line` gives nvcc: the user's file, absolute, so messages point at it."""
    return str(Path(source.path).resolve()) if source.path != "<memory>" else source.path


def launcher_source(source: SourceFile, kernel: Kernel, instantiation: str) -> str:
    """The user's file (without `main`) with `#line` markers so nvcc reports the user's lines, and
    the launcher after it."""
    path = _line_name(source)
    fn = f"{kernel.name}{instantiation}"
    return f"""#line 1 "{path}"
{source.translation_unit()}
#line 1 "{LAUNCHER_FILE}"
static const void* optiml_kernel() {{ return (const void*)&{fn}; }}
#define OPTIML_EXPORT extern "C" __attribute__((visibility("default")))
OPTIML_EXPORT int optiml_launch(void** args, const unsigned* g, const unsigned* b, size_t smem, void* stream) {{
  const void* fn = optiml_kernel();
  // Static and dynamic shared memory together over 48 KB need the opt-in, even where the dynamic
  // part alone is under it: opted in once per size that grows it.
  static size_t opted_in = 0;
  if (smem > opted_in) {{
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    opted_in = smem;
  }}
  return (int)cudaLaunchKernel(fn, dim3(g[0], g[1], g[2]), dim3(b[0], b[1], b[2]), args, smem, (cudaStream_t)stream);
}}
OPTIML_EXPORT int optiml_attributes(int* regs, int* local_bytes, int* static_smem, int* max_threads) {{
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, optiml_kernel());
  if (e != cudaSuccess) return (int)e;
  *regs = a.numRegs; *local_bytes = (int)a.localSizeBytes; *static_smem = (int)a.sharedSizeBytes;
  *max_threads = a.maxThreadsPerBlock;
  return 0;
}}
OPTIML_EXPORT int optiml_occupancy(int threads, size_t smem, int* blocks) {{
  return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, optiml_kernel(), threads, smem);
}}
{_layout_asserts(source, kernel)}OPTIML_EXPORT int optiml_state(int i, void** address, size_t* bytes) {{
  switch (i) {{
{_state_cases(source)}  }}
  return -1;
}}
"""


def _layout_asserts(source: SourceFile, kernel: Kernel) -> str:
    """For each struct the kernel takes by value: the layout the plan's bytes are packed in
    (`struct_layout`), asserted against the compiler's, so that a struct laid out otherwise
    (`alignas`, `#pragma pack`) is a compile error, never misread fields."""
    out = []
    for p in kernel.params:
        name = source.resolve_type(p.type_text)
        fields = source.structs.get(name)
        if p.is_pointer or not fields or not all(f.plain for f in fields):
            continue
        dtypes = [lookup(source.resolve_type(f.type_text)) for f in fields]
        if any(d is None for d in dtypes):
            continue
        layout = struct_layout([(f.name, d.code) for f, d in zip(fields, dtypes, strict=True)])
        checks = [f"sizeof({p.type_text}) == {layout.itemsize}"] + [
            f"offsetof({p.type_text}, {f.name}) == {layout.fields[f.name][1]}" for f in fields
        ]
        out.append(
            f'static_assert({" && ".join(checks)}, "OptiML packs `{p.name}` as a C struct of '
            f'its fields in order, each at its natural alignment; this one is laid out otherwise");\n'
        )
    return "".join(out)


def _state_cases(source: SourceFile) -> str:
    """The file's writable `__device__` variables, one `case` each, for `optiml_state`: the runner
    puts noise into them between launches when a judge asks whether a kernel keeps state."""
    return "".join(
        f"    case {i}: *bytes = sizeof({name}); "
        f"return (int)cudaGetSymbolAddress(address, {name});\n"
        for i, name in enumerate(source.device_variables)
    )


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _local_includes_digest(text: str, directory: Path) -> str:
    """Quoted includes next to the user's file are part of what is compiled, so of the cache key."""
    h = hashlib.sha256()
    for name in _LOCAL_INCLUDE.findall(text):
        p = directory / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@dataclass
class Build:
    """A compiled kernel: the object, the compiler's messages mapped to the user's file, and
    ptxas's resources for the kernel."""

    ok: bool
    path: Path
    messages: list[CompilerMessage]
    resources: Resources | None
    all_resources: list[Resources] = field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False
    log: str = ""


def build_kernel(
    source: SourceFile,
    kernel: Kernel,
    *,
    instantiation: str,
    arch: str,
    flags: list[str] | tuple[str, ...] = DEFAULT_FLAGS,
    mode: str = "shared",
) -> Build:
    """Compile one kernel of `source` with its launcher. Outputs are cached by content."""
    text = launcher_source(source, kernel, instantiation)
    target, log, ok, seconds, cached = _compile_cached(
        source, text, kernel.short_name, arch, flags, mode
    )
    found = parse_resources(log) if ok else []
    return Build(
        ok=ok,
        path=target,
        messages=_messages(log, ok, source, [kernel]),
        resources=kernel_resources(found, kernel) if ok else None,
        all_resources=found,
        seconds=seconds,
        cached=cached,
        log=log,
    )


def build_device_code(
    source: SourceFile,
    instantiations: dict[str, str],
    *,
    arch: str,
    flags: list[str] | tuple[str, ...] = DEFAULT_FLAGS,
) -> Build:
    """Compile the device code of a whole file once (templated kernels at the instantiations
    given), for static reports: one nvcc run however many kernels the file has."""
    templated = [k for k in source.kernels if k.name in instantiations]
    text = device_code_source(source, instantiations)
    stem = Path(source.path).stem
    target, log, ok, seconds, cached = _compile_cached(source, text, stem, arch, flags, "cubin")
    return Build(
        ok=ok,
        path=target,
        messages=_messages(log, ok, source, templated),
        resources=None,
        all_resources=parse_resources(log) if ok else [],
        seconds=seconds,
        cached=cached,
        log=log,
    )


def device_ptx(
    source: SourceFile,
    instantiations: dict[str, str],
    *,
    arch: str,
    flags: list[str] | tuple[str, ...] = DEFAULT_FLAGS,
) -> str | None:
    """The PTX of a file's device code (templated kernels at the instantiations given), or None
    where it does not compile: what the kernels instantiate and reference, no more."""
    text = device_code_source(source, instantiations)
    target, _, ok, _, _ = _compile_cached(source, text, Path(source.path).stem, arch, flags, "ptx")
    return target.read_text() if ok else None


def device_code_source(source: SourceFile, instantiations: dict[str, str]) -> str:
    """What `build_device_code` compiles: the file without `main`, and a reference to each
    templated kernel at its instantiation so that nvcc compiles it."""
    path = _line_name(source)
    templated = [k for k in source.kernels if k.name in instantiations]
    refs = "".join(
        f"static const void* optiml_ref_{i}() {{ return (const void*)&{k.name}{instantiations[k.name]}; }}\n"
        for i, k in enumerate(templated)
    )
    return f'#line 1 "{path}"\n{source.translation_unit()}\n#line 1 "{LAUNCHER_FILE}"\n{refs}'


def _messages(
    log: str, ok: bool, source: SourceFile, kernels: list[Kernel]
) -> list[CompilerMessage]:
    messages = [_to_user_file(m, source, kernels) for m in parse_messages(log)]
    if not ok and not any(m.severity == "error" for m in messages):
        tail = next(
            (line for line in reversed(log.strip().splitlines()) if line.strip()), "nvcc failed"
        )
        messages.append(CompilerMessage(severity="error", message=tail.strip()))
    return messages


def _compile_cached(
    source: SourceFile, text: str, stem: str, arch: str, flags, mode: str
) -> tuple[Path, str, bool, float, bool]:
    tk = find_toolkit()
    directory = Path(source.path).resolve().parent if source.path != "<memory>" else Path.cwd()
    flags = [*flags, *options_for(source.path).flags()]  # the project's (-I, -D, --std, ...)
    key = hashlib.sha256(
        "\0".join(
            [text, arch, " ".join(flags), mode, tk.version, _local_includes_digest(text, directory)]
        ).encode()
    ).hexdigest()[:24]
    suffix = {"shared": ".so", "cubin": ".cubin", "ptx": ".ptx"}[mode]
    out_dir = cache_dir() / "build"
    out_dir.mkdir(exist_ok=True)
    target = out_dir / f"{stem}-{key}{suffix}"
    meta = target.with_suffix(".log")
    if target.exists() and meta.exists():
        return target, meta.read_text(), True, 0.0, True
    with tempfile.TemporaryDirectory(prefix="optiml-build-") as tmp:
        tu = Path(tmp) / f"{stem}.cu"
        tu.write_text(text)
        partial = Path(tmp) / f"out{suffix}"
        result = compile_cuda(
            tu, partial, arch=arch, flags=list(flags), include_dirs=[directory], mode=mode
        )
        if result.ok:
            meta.write_text(result.log)
            os.replace(partial, target)  # atomic: a concurrent build of the same key is harmless
    return target, result.log, result.ok, result.seconds, False


def _to_user_file(m: CompilerMessage, source: SourceFile, kernels: list[Kernel]) -> CompilerMessage:
    """Messages about the launcher (a bad template instantiation, say) belong at the spec of the
    kernel whose line of the launcher they are on."""
    if m.path and m.path.endswith(LAUNCHER_FILE) and kernels:
        kernel = kernels[min(max((m.line or 1) - 1, 0), len(kernels) - 1)]
        anchor = kernel.spec_comment.span if kernel.spec_comment else kernel.name_span
        line, col = anchor.start_point
        return m.model_copy(
            update={
                "path": source.path,
                "line": line + 1,
                "column": col + 1,
                "message": f"{m.message} (instantiating `{kernel.name}` from its spec)",
            }
        )
    if (
        m.path
        and source.path != "<memory>"
        and Path(m.path).resolve() == Path(source.path).resolve()
    ):
        return m.model_copy(update={"path": source.path})
    return m


def kernel_resources(found: list[Resources], kernel: Kernel) -> Resources | None:
    for r in found:
        if kernel.extern_c and r.mangled == kernel.short_name:
            return r
        if _function_name(r.name) == kernel.name:
            return r
    return None


class ResourceIndex:
    """`kernel_resources` for every kernel of a file from one pass over ptxas's report: a file of
    thousands of kernels looks each up in a dict rather than in the whole list."""

    def __init__(self, found: list[Resources]):
        self._found = found
        self._by_mangled: dict[str, int] = {}
        self._by_name: dict[str, int] = {}
        for i, r in enumerate(found):
            self._by_mangled.setdefault(r.mangled, i)
            self._by_name.setdefault(_function_name(r.name), i)

    def of(self, kernel: Kernel) -> Resources | None:
        """What `kernel_resources(found, kernel)` gives: the first entry that matches."""
        hits = [self._by_name.get(kernel.name)]
        if kernel.extern_c:
            hits.append(self._by_mangled.get(kernel.short_name))
        first = min((i for i in hits if i is not None), default=None)
        return self._found[first] if first is not None else None


def _function_name(demangled: str) -> str:
    """`ns::k` from `void ns::k<float, (int)256>(int, float const*)`: template arguments may hold
    parentheses, so they go first."""
    out, depth = [], 0
    for ch in demangled:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("(", 1)[0].removeprefix("void ").strip()


def runner_binary() -> Path:
    """The generic runner, compiled once per toolkit and runner source."""
    tk = find_toolkit()
    files = {
        name: resources.files("optiml.harness").joinpath(name).read_text()
        for name in ("runner.cpp", "values.h")
    }
    # Its own kernels (a profiler's inputs): Hopper code, and PTX for any other GPU.
    codegen = [
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_75,code=compute_75",
    ]
    key = hashlib.sha256(
        ("".join(files.values()) + tk.version + " ".join(codegen)).encode()
    ).hexdigest()[:16]
    target = cache_dir() / f"runner-{key}"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(prefix="optiml-runner-") as tmp:
        cu = Path(tmp) / "runner.cu"
        cu.write_text(files["runner.cpp"])
        (Path(tmp) / "values.h").write_text(files["values.h"])
        out = Path(tmp) / "runner"
        cmd = [
            str(tk.nvcc),
            "-O2",
            "-std=c++17",
            *codegen,
            "-cudart",
            "shared",
            "-Xlinker",
            f"-rpath,{tk.lib_dir}",
            "-o",
            str(out),
            str(cu),
            "-ldl",
            "-Xcompiler",
            "-pthread",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the runner failed:\n{proc.stdout}{proc.stderr}")
        shutil.move(str(out), target)
    return target
