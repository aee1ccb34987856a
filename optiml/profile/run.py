"""`optiml profile`: one kernel of a file, run by the evaluation runner under Nsight Compute at its
first problem size, read back into a `Profile`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from optiml.cuda.source import Kernel, SourceFile
from optiml.errors import CompileFailed
from optiml.harness.build import DEFAULT_FLAGS, build_kernel
from optiml.harness.evaluate import launch_once
from optiml.harness.gpu import default_arch, local_gpus, require_gpu
from optiml.profile.model import Profile, build_profile
from optiml.profile.ncu import find_ncu, read_report, run_ncu
from optiml.spec import Spec


def profile_kernel(
    source: SourceFile,
    kernel: Kernel,
    spec: Spec,
    *,
    full: bool = False,
    clock_control: str = "none",
    arch: str | None = None,
    sizes: dict[str, int] | None = None,
    save_report: Path | None = None,
    flags: tuple[str, ...] = DEFAULT_FLAGS,
    env: dict[str, str] | None = None,
) -> Profile:
    """Profile the first launch of `kernel` at its first size (or `sizes`); `save_report` keeps
    the report's data as JSON (what the offline parser tests read)."""
    start = time.perf_counter()
    tool = find_ncu()
    require_gpu("profile")
    arch = arch or spec.arch or default_arch()
    build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=arch, flags=flags)
    if not build.ok:
        first = next((m for m in build.messages if m.severity == "error"), None)
        raise CompileFailed(f"the kernel does not compile: {first or 'nvcc failed'}")
    case = spec.case(sizes or spec.sizes[0])
    with tempfile.TemporaryDirectory(prefix="optiml-profile-") as tmp:
        work = Path(tmp)
        program = launch_once(spec, case, arch, build.path, work)
        run = run_ncu(
            tool,
            program,
            mangled=build.resources.mangled,
            out=work / "profile",
            full=full,
            clock_control=clock_control,
            env=env,
        )
        read_start = time.perf_counter()
        data = read_report(tool, run.report, source_lines=full)
        read_s = time.perf_counter() - read_start
    if save_report is not None:
        save_report.write_text(data.model_dump_json())
    gpus = local_gpus()
    profile = build_profile(
        data,
        device=gpus[0][0] if gpus else None,
        user_file=source.path,
        section_set="full" if full else "search",
        clock_control=clock_control,
        ncu_version=tool.version,
    )
    profile.ncu_s = run.seconds
    profile.passes = run.passes
    profile.read_s = read_s
    profile.wall_s = time.perf_counter() - start
    return profile
