"""The `optiml` command. Each subcommand is a thin shell over `optiml.api`: it prints a rich table
for people or JSON for machines (`--json`), and turns errors into one line and a distinct exit code.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from optiml.api import (
    DEFAULT_BUDGET,
    DEFAULT_SECONDS,
    ExitCode,
    ExprError,
    OptimlError,
    SourceWarning,
    SpecValueError,
    UsageError,
    __version__,
    one_line,
    resolve_arch,
)
from optiml.cli.llm import llm_group
from optiml.cli.mot import collect, mot_options

# Tables keep their columns when piped (rich would otherwise fold them to 80 columns). No emoji
# codes: `:x:` in a user's spec is printed as written.
out = Console(
    highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 160
)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

EXIT_CODES = """Exit codes:
  0 ok, 1 internal error, 2 usage, 3 file missing or unreadable, 4 no such kernel, 5 bad spec,
  6 nvcc not found, 7 no NVIDIA GPU, 8 compile error, 9 runtime error, 10 timeout, 11 wrong result,
  12 ncu not found, 13 profiling failed, 14 forbidden code in a candidate, 15 an `in` buffer
  modified, 16 faster than the physical floor (work skipped);
  --executor: 17 remote unreachable or login refused, 18 SSH host key not trusted (unknown or
  changed), 19 no `optiml worker` there, or another version of OptiML;
  llm: 20 no API key, 21 authentication failed, 22 provider unreachable, 23 other LLM error;
  generate: 24 bad formula (`where:line:column: what is wrong; what would be right`)"""


def _fail(e: OptimlError, as_json: bool) -> None:
    if as_json:
        pos = e.position
        payload = {"error": e.message, "exit_code": int(e.exit_code)}
        if pos:
            payload["position"] = {"path": pos.path, "line": pos.line, "column": pos.column}
        click.echo(json.dumps(payload))
    _error_line(str(e))
    sys.exit(int(e.exit_code))


def _error_line(message: str) -> None:
    err.print(f"optiml: error: {one_line(message)}", markup=False)


def handles_errors(fn):
    """One line on stderr and the error's exit code for every `OptimlError`; an `ExprError` that
    reaches here (a spec value that cannot be evaluated at run time) is a bad spec."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OptimlError as e:
            _fail(e, kwargs.get("as_json", False))
        except ExprError as e:
            _fail(
                SpecValueError(f"a value of the spec cannot be evaluated: {e}"),
                kwargs.get("as_json", False),
            )

    return wrapper


# click 8.2 and later raise this usage error for a group called without a command
_HELP_FOR_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Command(click.Group):
    """The `optiml` group, whose every failure is one line on stderr: click's usage errors
    (exit 2) in the same form as OptiML's own, and an unexpected exception as an internal error
    (exit 1) whose traceback OPTIML_DEBUG=1 shows."""

    def main(self, *args, **kwargs):
        kwargs.pop("standalone_mode", None)
        with warnings.catch_warnings():
            warnings.simplefilter("default", SourceWarning)
            warnings.showwarning = _warning_printer(warnings.showwarning)
            try:
                code = super().main(*args, standalone_mode=False, **kwargs)
            except _HELP_FOR_NO_ARGS as e:  # `optiml` alone: the help, as click prints it
                e.show()
                sys.exit(e.exit_code)
            except click.UsageError as e:
                hint = f"; see `{e.ctx.command_path} --help`" if e.ctx else ""
                _error_line(e.format_message().rstrip(".") + hint)
                sys.exit(int(ExitCode.USAGE))
            except click.ClickException as e:
                _error_line(e.format_message())
                sys.exit(e.exit_code)
            except click.Abort:
                _error_line("aborted")
                sys.exit(int(ExitCode.INTERNAL))
            except OptimlError as e:  # raised outside a command (a parameter's callback)
                _fail(e, as_json=False)
            except Exception as e:
                if os.environ.get("OPTIML_DEBUG"):
                    raise
                _error_line(
                    f"internal error: {type(e).__name__}: {e} (OPTIML_DEBUG=1 shows where); "
                    "please report it with the input"
                )
                sys.exit(int(ExitCode.INTERNAL))
        sys.exit(code if isinstance(code, int) else 0)


def _warning_printer(default):
    """OptiML's warnings about the user's input as one `optiml: warning:` line each; those of
    other libraries as Python prints them."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, SourceWarning):
            err.print(f"optiml: warning: {one_line(str(message))}", markup=False)
        else:
            default(message, category, filename, lineno, file, line)

    return show


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
executor_option = click.option(
    "--executor",
    "executor_url",
    default="local",
    show_default=True,
    metavar="URL",
    help="Where the job runs: `local` (here), `ssh://[user@]host[:port]` (`optiml worker` on that "
    "machine, over SSH; host keys checked against known_hosts), `ray` (a Ray cluster started here) "
    "or `ray://host:port` (a Ray cluster's client address). Only the file's text and the results "
    "cross; quoted #includes next to FILE are not sent.",
)
search_executor_option = click.option(
    "--executor",
    "executor_url",
    default="local",
    show_default=True,
    metavar="URL[,URL...]",
    help="Where candidates run: `local` (this machine's GPUs), `ssh://[user@]host[:port]` "
    "(`optiml worker` there: its GPUs), `ray` or `ray://host:port` (an actor per GPU of the "
    "cluster); several, comma-separated, pool their GPUs (the final comparisons stay on the first "
    "one's first GPU). Only the file's text, the candidates and the results cross.",
)

profile_executor_option = click.option(
    "--executor",
    "executor_url",
    default="local",
    show_default=True,
    metavar="URL[,URL...]",
    help="Where the profile runs: `local` (here), `ssh://[user@]host[:port]` (`optiml worker` "
    "there), `ray` or `ray://host:port` (an actor on a GPU of the cluster); of several, "
    "comma-separated, the one with the most free GPUs. Only the file's text and the profile cross.",
)


@dataclass(frozen=True)
class BuildArgs:
    """-I, -D, --std, --nvcc-flag and --compile-commands as given."""

    include: tuple[str, ...]
    define: tuple[str, ...]
    std: str | None
    nvcc_flags: tuple[str, ...]
    compile_commands: str

    def configure(self, files) -> dict | None:
        """Every compile of `files` builds as the project does; the options as request data."""
        from optiml.api import build_data, configure_build

        database = None if self.compile_commands == "none" else self.compile_commands
        paths = [str(f) for f in files]
        configure_build(paths, self.include, self.define, self.std, self.nvcc_flags, database)
        return build_data(paths[0])


def build_options(command):
    """-I, -D, --std, --nvcc-flag and --compile-commands (how the user's project builds FILE),
    given to the command as `build: BuildArgs`."""

    @functools.wraps(command)
    def with_build(*args, include, define, std, nvcc_flags, compile_commands, **kwargs):
        build = BuildArgs(include, define, std, nvcc_flags, compile_commands)
        return command(*args, build=build, **kwargs)

    for decorator in reversed(
        [
            click.option(
                "-I",
                "--include",
                "include",
                multiple=True,
                metavar="DIR",
                help="An include directory of your project (repeatable).",
            ),
            click.option(
                "-D",
                "--define",
                "define",
                multiple=True,
                metavar="NAME[=VALUE]",
                help="A macro definition (repeatable).",
            ),
            click.option(
                "--std",
                default=None,
                metavar="c++NN",
                help="The C++ standard (default: FILE's compile_commands.json entry's, else c++17).",
            ),
            click.option(
                "--nvcc-flag",
                "nvcc_flags",
                multiple=True,
                metavar="FLAG",
                help="Another nvcc flag for every compile of FILE (repeatable; not the output or "
                "target, which OptiML sets).",
            ),
            click.option(
                "--compile-commands",
                default="auto",
                show_default=True,
                metavar="PATH|auto|none",
                help="The project's compile_commands.json (CMake, Bear): FILE's entry gives its "
                "-I, -D and standard; `auto` looks for one up the tree from FILE (also in build/).",
            ),
        ]
    ):
        with_build = decorator(with_build)
    return with_build


arch_option = click.option(
    "--arch",
    default=None,
    metavar="SM",
    help="Target architecture: any sm_XY, sm_XYa or sm_XYf the installed nvcc compiles for "
    "(`nvcc --list-gpu-code`; sm_75 to sm_121 with CUDA 13.0), or `native` for the local GPU's "
    "(default: the spec's `arch`, else the local GPU's, else sm_90).",
)


@click.group(
    cls=_Command, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="optiml")
def main() -> None:
    """OptiML: check, time and optimize CUDA kernels against the contract in their @optiml spec."""


# ---- check ----------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--kernel", "-k", default=None, help="Only this kernel (default: every kernel in FILE)."
)
@arch_option
@build_options
@executor_option
@json_option
@handles_errors
def check(
    file: Path,
    kernel: str | None,
    arch: str | None,
    build: BuildArgs,
    executor_url: str,
    as_json: bool,
) -> None:
    """Parse FILE, check its specs, compile its kernels and report registers, spills and
    theoretical occupancy, with notes where a kernel's own rounding can fail a correct rewrite.
    Needs nvcc, not a GPU. The table lists every spec error and compiler message on stderr; with
    --json they are in the JSON, and stderr has one line for the first."""
    from optiml.api import Request, open_executor, read_text

    executor = open_executor(executor_url)
    if executor.in_process:  # elsewhere `--arch` is resolved where nvcc and the GPU are
        arch = resolve_arch(arch)
    text = read_text(file)
    request = Request(
        command="check",
        path=str(file),
        text=text,
        kernel=kernel,
        arch=arch,
        build=build.configure([file]),
    )
    data = _run_job(executor, request)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        _print_check(data)
    kernels = data["kernels"]
    if any(k["compiled"] is False for k in kernels):
        if as_json:
            _error_line(_first_compile_error(data))
        sys.exit(int(ExitCode.COMPILE_ERROR))
    spec_errors = next((k["spec_errors"] for k in kernels if k["spec_errors"]), None)
    if spec_errors:
        if as_json:
            first = spec_errors[0]
            more = f" (and {len(spec_errors) - 1} more)" if len(spec_errors) > 1 else ""
            _error_line(
                f"{first['path']}:{first['line']}:{first['column']}: {first['message']}{more}"
            )
        sys.exit(int(ExitCode.BAD_SPEC))


def _run_job(executor, request) -> dict:
    """The executor's answer to one request (an error there raised here); the executor closed."""
    import asyncio

    async def run() -> dict:
        try:
            return await executor.run(request)
        finally:
            await executor.close()

    return asyncio.run(run())


def _first_compile_error(data: dict) -> str:
    from optiml.api import CompilerMessage

    messages = [CompilerMessage.model_validate(m) for k in data["kernels"] for m in k["messages"]]
    first = next((m for m in messages if m.severity == "error"), None)
    if first is None:
        return f"{data['file']} does not compile"
    return str(first).replace(": error: ", ": ", 1)


def _print_check(data: dict) -> None:
    """`optiml check`'s table from its JSON, so that a remote check prints what a local one does."""
    from optiml.api import CompilerMessage, StaticReport

    kernels = data["kernels"]
    told: set[str] = set()  # one compile of the file: its messages come once, not per kernel
    for c in kernels:
        for e in c["spec_errors"]:
            err.print(
                f"{e['path']}:{e['line']}:{e['column']}: spec error: {e['message']}", markup=False
            )
        for m in map(CompilerMessage.model_validate, c["messages"]):
            if m.severity in ("error", "warning") and str(m) not in told:
                told.add(str(m))
                err.print(str(m), markup=False)
    reports = [StaticReport.model_validate(c["report"]) if c["report"] else None for c in kernels]
    table = Table(title=f"{data['file']} ({data['arch']})", title_justify="left")
    columns = (
        "kernel",
        "spec",
        "regs",
        "spill B",
        "stack B",
        "smem B",
        "block",
        "occupancy",
        "limiter",
    )
    for col in columns:
        left = col in ("kernel", "spec", "limiter")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for c, report in zip(kernels, reports, strict=True):
        name = c["kernel"]
        spec = "ok" if c["spec"] is not None else ("error" if c["spec_errors"] else "none")
        if report is None:
            status = c["skipped"] or ("does not compile" if c["compiled"] is False else "no report")
            table.add_row(name, spec, "", "", "", "", "", "", status)
            continue
        r, o = report.resources, report.occupancy
        table.add_row(
            name,
            spec,
            str(r.registers),
            f"{r.spill_store_bytes}/{r.spill_load_bytes}",
            str(r.stack_bytes),
            str(r.static_smem_bytes + (report.dynamic_smem or 0)),
            _dims(report.block) if report.block else "",
            f"{o.occupancy:.0%} ({o.blocks_per_sm}/SM)" if o else "",
            o.limiter.replace("_", " ") if o else "",
        )
    out.print(table)
    for c, report in zip(kernels, reports, strict=True):
        if c["skipped"]:
            out.print(f"  {c['kernel']}: {c['skipped']}", markup=False)
        for note in report.notes if report else []:
            out.print(f"  {c['kernel']}: {note}", markup=False)


def _dims(dims) -> str:
    dims = list(dims)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return "×".join(str(d) for d in dims)


# ---- eval -----------------------------------------------------------------------------------


@main.command("eval", epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--kernel", "-k", required=True, help="The kernel to evaluate.")
@click.option(
    "--candidate",
    type=click.Path(path_type=Path),
    default=None,
    help="A file with another version of the kernel: check it against FILE's reference and time both.",
)
@arch_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0, None, min_open=True),
    default=60.0,
    show_default=True,
    help="Wall-clock limit of the run, seconds.",
)
@click.option("--no-time", is_flag=True, help="Check correctness only.")
@click.option(
    "--numpy-all-sizes",
    is_flag=True,
    help="Against a NumPy reference, check at every size. By default sizes of more than 2^25 "
    "elements are checked against the kernel as written once it has passed against NumPy at the "
    "others (the function's inputs and outputs take minutes of CPU there).",
)
@build_options
@executor_option
@json_option
@handles_errors
def eval_(
    file: Path,
    kernel: str,
    candidate: Path | None,
    arch: str | None,
    timeout_s: float,
    no_time: bool,
    numpy_all_sizes: bool,
    build: BuildArgs,
    executor_url: str,
    as_json: bool,
) -> None:
    """Run KERNEL (or CANDIDATE's version of it) on a GPU at every size and seed of its spec,
    check every output element against the reference, and time both with CUDA events. The
    verdict's status is the exit code; with --json a failed verdict is also one line on stderr."""
    from optiml.api import STATUS_EXIT, Request, Verdict, open_executor, read_text

    executor = open_executor(executor_url)
    if executor.in_process:
        arch = resolve_arch(arch)
    text = read_text(file)
    candidate_text = read_text(candidate) if candidate else None
    files = [file, candidate] if candidate else [file]
    build_data = build.configure(files)
    request = Request(
        command="eval",
        path=str(file),
        text=text,
        kernel=kernel,
        arch=arch,
        candidate_path=str(candidate) if candidate else None,
        candidate_text=candidate_text,
        timeout_s=timeout_s,
        time=not no_time,
        numpy_all_sizes=numpy_all_sizes,
        build=build_data,
    )
    verdict = Verdict.model_validate(_run_job(executor, request))
    if as_json:
        click.echo(verdict.model_dump_json(indent=2))
        if not verdict.ok:  # as `check --json`: the details in the JSON, one line on stderr
            _error_line(f"{verdict.status} {verdict.kernel}: {verdict.message}")
    else:
        _print_verdict(verdict)
    sys.exit(int(STATUS_EXIT[verdict.status]))


def _print_verdict(v) -> None:
    style = "green" if v.ok else "red"
    out.print(f"[{style}]{v.status}[/{style}] {v.kernel}: ", end="")
    out.print(v.message, markup=False)
    if v.check:
        out.print(f"[dim]{'checked' if v.ok else 'decided by'}: {v.check}[/dim]")
    for m in v.messages:
        if m.severity in ("error", "warning"):
            err.print(str(m), markup=False)
    if v.cases:
        table = Table(title_justify="left")
        for col in (
            "size",
            "grid × block",
            "seeds",
            "max abs err",
            "candidate ms (IQR)",
            "reference ms (IQR)",
            "speedup",
            "floor ms",
            "SM MHz",
        ):
            table.add_column(col, justify="left" if col in ("size", "grid × block") else "right")
        for c in v.cases:
            seeds_ok = sum(1 for s in c.seeds if s.ok)
            errs = [
                b.max_abs_error
                for s in c.seeds
                for b in s.buffers
                if isinstance(b.max_abs_error, float)
            ]
            t = c.timing
            table.add_row(
                c.label,
                f"{_dims(c.launch['candidate'].grid)} × {_dims(c.launch['candidate'].block)}",
                f"{seeds_ok}/{len(c.seeds)}",
                f"{max(errs):.3g}" if errs else "",
                f"{t.candidate.median_ms:.4f} ({t.candidate.iqr_ms:.4f})" if t else "",
                f"{t.reference.median_ms:.4f} ({t.reference.iqr_ms:.4f})"
                if t and t.reference
                else "",
                f"{t.speedup:.2f}×" if t and t.speedup else "",
                f"{c.floor.ms:.4f}" if c.floor else "",
                "/".join(str(x) for x in t.sm_clock_mhz) if t else "",
            )
        out.print(table)
        for c in v.cases:
            for s in c.seeds:
                for b in s.buffers:
                    for m in b.first[:3]:
                        what = "unwritten" if m.unwritten else f"expected {m.expected}, got {m.got}"
                        out.print(
                            f"  {c.label} seed {s.seed}: {b.name}[{m.index}] {what}", markup=False
                        )
    if v.log_tail and not v.ok:
        err.print(v.log_tail, markup=False)
    if v.device:
        d = v.device
        out.print(
            f"[dim]{d.name} (sm_{d.compute_capability.replace('.', '')}, {d.sm_count} SMs), CUDA driver API {d.driver_version // 1000}.{d.driver_version % 1000 // 10}, "
            f"nvcc {v.nvcc_version}, {v.date}; compile {v.compile_s:.1f} s, run {v.run_s:.1f} s, total {v.wall_s:.1f} s[/dim]"
        )


# ---- profile --------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--kernel", "-k", required=True, help="The kernel to profile.")
@click.option(
    "--set",
    "section_set",
    type=click.Choice(["search", "full"]),
    default="full",
    show_default=True,
    help="full: the speed-of-light, memory, occupancy, launch, warp-state, scheduler, source, "
    "compute and instruction sections with ncu's rules, per-line hotspots included; search: only the "
    "metrics the diagnosis reads (what the search collects for each candidate): no rules, no "
    "hotspots, no FLOP counts (so no roofline intensity), fewer replay passes.",
)
@click.option(
    "--clock-control",
    type=click.Choice(["none", "base"]),
    default="none",
    show_default=True,
    help="none keeps the GPU's own clocks (as timing sees them); base locks them to base clocks.",
)
@arch_option
@build_options
@profile_executor_option
@json_option
@handles_errors
def profile(
    file: Path,
    kernel: str,
    section_set: str,
    clock_control: str,
    arch: str | None,
    build: BuildArgs,
    executor_url: str,
    as_json: bool,
) -> None:
    """Profile KERNEL with Nsight Compute at its first problem size: speed-of-light, memory,
    occupancy, stalls and per-line hotspots, and the bottleneck in one sentence. On another
    executor, at that GPU's architecture and own clocks (--arch and --clock-control are this
    machine's)."""
    from optiml.api import profile_file, split_urls

    remote = split_urls(executor_url) != ["local"]
    build.configure([file])
    if remote and (arch is not None or clock_control != "none"):
        raise UsageError(
            "--arch and --clock-control apply to `--executor local`; elsewhere the profile is "
            "taken at that GPU's architecture and clocks"
        )
    p = profile_file(
        file,
        kernel,
        full=section_set == "full",
        clock_control=clock_control,
        arch=None if remote else resolve_arch(arch),
        executor=executor_url if remote else None,
    )
    if as_json:
        click.echo(p.model_dump_json(indent=2))
        return
    out.print(
        f"[bold]{p.kernel}[/bold] on {p.device or 'the GPU'} (ncu {p.ncu_version}, {p.section_set} set, clock control {p.clock_control})"
    )
    from rich.markdown import Markdown

    out.print(Markdown(p.markdown()))
    if p.hotspots:
        table = Table(title="hotspots", title_justify="left")
        for col in (
            "line",
            "stall samples",
            "share",
            "top stall",
            "instructions",
            "excess sectors",
            "source",
        ):
            table.add_column(col, justify="left" if col in ("top stall", "source") else "right")
        lines = Path(file).read_text(errors="replace").splitlines()
        for h in p.hotspots:
            text = lines[h.line - 1].strip() if 0 < h.line <= len(lines) else ""
            table.add_row(
                str(h.line),
                f"{h.stall_samples:.0f}",
                f"{h.share:.0%}",
                h.top_stall or "",
                f"{h.instructions:.0f}",
                f"{h.excessive_sectors:.0f}",
                text[:60],
            )
        out.print(table)
    out.print(f"[dim]profile {p.wall_s:.1f} s, of which ncu {p.ncu_s:.1f} s[/dim]")


# ---- spec -----------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--kernel", "-k", required=True, help="The kernel to draft a spec for.")
@json_option
@handles_errors
def spec(file: Path, kernel: str, as_json: bool) -> None:
    """Draft an @optiml spec for KERNEL from its signature, how its body uses each pointer, and a
    <<<...>>> launch site in FILE where there is one. Prints it; FILE is not changed."""
    from optiml.api import draft_file_spec

    drafted = draft_file_spec(file, kernel)
    if as_json:
        click.echo(json.dumps(drafted.model_dump()))
    else:
        click.echo(drafted.spec, nl=False)


# ---- lift -----------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--kernel", "-k", required=True, help="The kernel to read.")
@json_option
@handles_errors
def lift(file: Path, kernel: str, as_json: bool) -> None:
    """What KERNEL computes, read from its code and spec (no GPU): its family (map, reduction,
    row normalization, contraction, permutation, gather, scatter, histogram, stencil, scan,
    multi-buffer update) with
    the evidence, the iteration domain, every global access as an affine form of the thread and
    loop indices (or indirect), the reductions and their strides, the guards, and each output's
    value. A kernel the lifting does not follow is "opaque", with the line and the reason."""
    import dataclasses

    from optiml.api import describe_kernel

    d = describe_kernel(file, kernel)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(d)))
        return
    out.print(f"[bold]{d.kernel}[/]: {d.family}", markup=True)
    for line in d.not_understood:
        out.print(f"  not understood: {line}", markup=False)
    for line in d.evidence:
        out.print(f"  because {line}", markup=False)
    if not d.lifted:
        return
    if d.domain:
        out.print(f"  domain: {', '.join(d.domain)}", markup=False)
    for r in d.reductions:
        strides = ", ".join(f"{t} stride {s}" for t, s in r.strides.items()) or "no data"
        out.print(
            f"  reduction: {r.op} into `{r.var}` (loop at line {r.line}; {strides})", markup=False
        )
    for g in d.guards:
        out.print(f"  guard: {g}", markup=False)
    table = Table(show_edge=False, box=None, pad_edge=False)
    for col in ("tensor", "access", "pattern", "index"):
        table.add_column(col)
    for a in d.accesses:
        table.add_row(a.tensor, a.kind, a.pattern, a.index)
    out.print(table)
    for t, v in d.outputs.items():
        out.print(f"  {t} = {v}", markup=False)


# ---- optimize -------------------------------------------------------------------------------


@main.command(epilog=EXIT_CODES)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--kernel", "-k", required=True, help="The kernel to optimize.")
@click.option(
    "--budget",
    type=click.IntRange(1, None),
    default=DEFAULT_BUDGET,
    show_default=True,
    help="Evaluations the search may spend (each compiles, checks, times and profiles a variant).",
)
@click.option(
    "--time",
    "max_seconds",
    type=click.FloatRange(0, None),
    default=DEFAULT_SECONDS,
    show_default=True,
    help="Wall-time budget of the whole run, seconds: measuring the input, the search, confirming "
    "and judging the best. The search stops at three quarters of it, or earlier for a slow "
    "input (9 times its own checked run kept, at most 60 %); the checks are never cut short. "
    "0: no time limit, --budget alone.",
)
@click.option(
    "--policy",
    type=click.Choice(["offline", "llm"]),
    default="offline",
    show_default=True,
    help="offline: the built-in catalog of CUDA transformations; llm: edits from the configured LLM.",
)
@click.option(
    "--provider",
    type=click.Choice(["openai", "anthropic", "openai-compatible", "offline"]),
    default=None,
    help="LLM provider for --policy llm (default: OPTIML_LLM_PROVIDER, else optiml.toml or "
    "pyproject.toml, else offline; see docs/llm.md).",
)
@click.option("--model", default=None, help="LLM model for --policy llm.")
@click.option(
    "--base-url",
    default=None,
    help="The provider's endpoint (an OpenAI-compatible server, a proxy).",
)
@click.option(
    "--replay", is_flag=True, help="Answer LLM requests from the response cache only (no network)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="The search's random seed.")
@click.option(
    "--gpus",
    default="all",
    show_default=True,
    help="GPUs to evaluate on: `all` or indices like `0,1`.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, None),
    default=None,
    help="Evaluations in flight: while a GPU measures one, the others compile (default: 8 per GPU).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the trajectory, the report and the optimized file go (default: .optiml/runs/FILE-KERNEL).",
)
@click.option("--resume", is_flag=True, help="Go on from the search saved in --out.")
@click.option(
    "--no-profile",
    is_flag=True,
    help="Do not profile candidates (faster; the reward is the speedup alone).",
)
@click.option("--no-sanitize", is_flag=True, help="Skip compute-sanitizer in the judge.")
@click.option("--write", is_flag=True, help="Replace the kernel in FILE with the confirmed winner.")
@arch_option
@build_options
@search_executor_option
@json_option
@handles_errors
def optimize(
    file: Path,
    kernel: str,
    budget: int,
    max_seconds: float | None,
    policy: str,
    provider: str | None,
    model: str | None,
    base_url: str | None,
    replay: bool,
    seed: int,
    gpus: str,
    parallel: int | None,
    out_dir: Path | None,
    resume: bool,
    no_profile: bool,
    no_sanitize: bool,
    write: bool,
    arch: str | None,
    build: BuildArgs,
    executor_url: str,
    as_json: bool,
) -> None:
    """Search for a faster KERNEL that is proven correct (OptiML-X): Monte Carlo tree search over
    edits of the kernel, each compiled, checked against the original, timed and profiled; the best
    are re-measured against the original and judged (unseen sizes, seeds and input values drawn
    per run, work scaling, the speedup at unseen sizes, state across launches, no hard-coded sizes,
    four compute-sanitizer tools). Writes the trajectory, an HTML report and the optimized file to
    --out; FILE itself changes only with --write."""
    from optiml.api import OptimizeRequest, optimize_file, parse_gpus, split_urls

    arch = resolve_arch(arch)
    if file.is_file():  # a missing FILE is the search's own one-line error
        build.configure([file])
    parse_gpus(gpus)  # a bad --gpus is a usage error before any work
    executor = None if split_urls(executor_url) == ["local"] else executor_url
    request = OptimizeRequest(
        file=file,
        kernel=kernel,
        budget=budget,
        max_seconds=max_seconds or None,  # 0: no time limit
        policy=policy,
        llm_overrides={
            "provider": provider,
            "model": model,
            "base_url": base_url,
            "replay": replay or None,
        },
        seed=seed,
        gpus=gpus,
        parallel=parallel,
        out_dir=out_dir,
        resume=resume,
        profile=not no_profile,
        sanitize=not no_sanitize,
        arch=arch,
    )
    outcome = (
        optimize_file(request, executor=executor)
        if as_json
        else _optimize_with_progress(request, executor)
    )
    t = outcome.trajectory
    written = None
    if write and outcome.winner is not None:
        from optiml.api import write_winner

        written = write_winner(file, request.original_text, outcome.winner)
    if as_json:
        payload = json.loads(t.model_dump_json())
        payload["files"] = {k: str(v) for k, v in outcome.files.items()}
        payload["written"] = str(written) if written else None
        click.echo(json.dumps(payload, indent=2))
        return
    style = "green" if t.winner is not None else "yellow"
    out.print(f"[{style}]{t.kernel}[/{style}]: ", end="")
    out.print(t.outcome, markup=False)
    if t.judge is not None:
        for c in t.judge.checks:
            mark = "[green]pass[/green]" if c.ok else "[red]fail[/red]"
            out.print(f"  {mark} {c.name}: ", end="")
            out.print(c.detail, markup=False)
    if t.winner is not None:
        path = [n.edit.summary for n in _path_to(t, t.winner) if n.edit]
        out.print("  edits: " + " → ".join(path), markup=False)
    for name, path in outcome.files.items():
        out.print(f"  {name}: {path}", markup=False)
    if written:
        out.print(f"  wrote the optimized kernel into {written}", markup=False)
    elif t.winner is not None:
        out.print("  FILE is unchanged; --write puts the optimized kernel in it", markup=False)


def _path_to(t, node_id):
    nodes = {n.id: n for n in t.nodes}
    chain = []
    n = nodes.get(node_id)
    while n is not None:
        chain.append(n)
        n = nodes.get(n.parent) if n.parent is not None else None
    return chain[::-1]


def _optimize_with_progress(request, executor=None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from optiml.api import optimize_file

    columns = (
        TextColumn("[bold]{task.fields[phase]:9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]:>7} · {task.fields[bottleneck]}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[last]}"),
    )
    # Shown from the first event on: an error before the search starts (no GPU, say) stays the
    # one line it is.
    bar = Progress(*columns, console=err, transient=False)
    task = bar.add_task(
        "search", total=request.budget, phase="baseline", best="-", bottleneck="", last=""
    )

    def on_event(e):
        if not bar.live.is_started:
            bar.start()
        bar.update(
            task,
            completed=min(e.evaluations, request.budget),
            phase=e.phase,
            best=f"{e.best_speedup:.2f}x" if e.best_speedup else "-",
            bottleneck=e.bottleneck or "",
            last=e.last[:60],
        )

    try:
        return optimize_file(request, on_event=on_event, executor=executor)
    except BaseException:
        # A search that fails says so in its one error line: the bar goes, with no empty line.
        bar.live.transient = True
        bar.live.stop()
        raise
    finally:
        if bar.live.is_started:
            bar.stop()


# ---- generate -------------------------------------------------------------------------------


def _check_summary(data: dict) -> None:
    """`optiml check` of a kernel that was printed, not written: its verdict on stderr."""
    for k in data["kernels"]:
        for e in k["spec_errors"]:
            err.print(f"spec error: {e['message']}", markup=False)
        if k["compiled"] is False:
            err.print(f"does not compile: {_first_compile_error(data)}", markup=False)
        elif not k["spec_errors"]:
            err.print(f"optiml check: {k['kernel']} compiles and its spec is valid", markup=False)


@main.command(epilog=EXIT_CODES)
@click.argument("formula", required=False)
@click.option(
    "--from-torch",
    "from_torch",
    default=None,
    metavar="TASK.py",
    help="Translate the forward of a PyTorch module in KernelBench's format (class Model, "
    "get_inputs, get_init_inputs) into the formula, reading the file without running it; no "
    "FORMULA then. What the notation cannot express is one line with the task's line.",
)
@click.option(
    "--line",
    "-l",
    type=click.IntRange(1, None),
    default=None,
    help="FORMULA is a .cu file: take the formula from its comment at this line, and write the "
    "file with the kernel below that comment into a new file (FILE is never changed).",
)
@click.option(
    "--out",
    "-o",
    "out_path",
    default=None,
    metavar="FILE",
    help="Write FILE.cu and FILE_ref.py (default: NAME in the current directory; with --line, "
    "FILE's stem and NAME next to it); `-` prints the kernel instead.",
)
@click.option(
    "--name",
    "-n",
    default=None,
    help="The kernel's name (default: the stem of --out, else `generated`; with --from-torch, "
    "the task file's name without its number, e.g. `LeakyReLU`).",
)
@click.option("--no-optimize", is_flag=True, help="Do not optimize the kernel afterwards.")
@click.option(
    "--plain",
    is_flag=True,
    help="Write the kernel as the formula's structure gives it: one thread per row even where the "
    "rows are too few for a warp each to fill a GPU (by default those get a block, or on sm_90 a "
    "cluster of blocks, per row).",
)
@mot_options
@arch_option
@search_executor_option
@json_option
@handles_errors
def generate(
    formula: str | None,
    from_torch: str | None,
    line: int | None,
    out_path: str | None,
    name: str | None,
    no_optimize: bool,
    plain: bool,
    mot: bool,
    experts: int,
    repairs: int,
    replay: bool,
    arch: str | None,
    executor_url: str,
    as_json: bool,
) -> None:
    """Generate a plain, correct CUDA kernel, its @optiml spec and a float64 NumPy reference from
    FORMULA, written in index notation (docs/generate.md), e.g.

        optiml generate "float x[R, C]; y[r] = sum(c) x[r, c]" --out rowsum

    or from a PyTorch module's forward (`--from-torch TASK.py`), then run `optiml check` on it,
    and, where there is a GPU, `optiml optimize`. Sizes that the formula does not give get
    defaults, said on stderr.

    FORMULA that does not parse as a formula is a task in prose, e.g. "fused bias + GELU over the
    last axis of a [tokens, 4096] bf16 tensor": with an LLM configured (docs/llm.md), experts
    draft and revise kernels, every draft kernel is checked against every draft reference, and
    the final kernel must pass against the reference most agree with (docs/generate.md, the
    Mixture-of-Thoughts path); --out names the folder of its files and trajectory."""
    from optiml.api import run_generate, split_urls

    if from_torch is not None and formula is not None:
        raise click.UsageError("give FORMULA or --from-torch TASK.py, not both")
    if from_torch is None and formula is None:
        raise click.UsageError("missing FORMULA (or --from-torch TASK.py)")
    if from_torch is not None and line is not None:
        raise click.UsageError("--line reads a formula from a comment; not with --from-torch")
    arch = resolve_arch(arch)
    remote = split_urls(executor_url) != ["local"]  # a bad URL: a usage error before any file
    if line is not None and mot:
        raise click.UsageError("--mot takes FORMULA or --from-torch TASK.py, not --line")
    options = collect(mot, experts, repairs, replay)
    result = run_generate(
        formula, line, out_path, name, arch, from_torch=from_torch, mot=options, plain=plain
    )
    notes = [*result.notes]
    if result.printed is not None:
        click.echo(result.printed, nl=False)
    data = result.check
    if not as_json:
        for note in notes:
            err.print(f"optiml: note: {note}", markup=False)
        for path in result.written:
            err.print(f"wrote {path}", markup=False)
        if result.printed is None:
            _print_check(data)
        else:
            _check_summary(data)
    failed = any(k["compiled"] is False for k in data["kernels"]) or any(
        k["spec_errors"] for k in data["kernels"]
    )
    optimized = None
    if failed:
        skip = "optimization skipped: the generated file does not pass `optiml check`"
    elif no_optimize:
        skip = "optimization skipped (--no-optimize)"
    elif result.printed is not None:
        skip = "optimization skipped: nothing was written (--out -)"
    else:
        from optiml.api import local_gpus

        skip = None
        if not remote and not local_gpus():  # the search runs where its GPUs are
            skip = (
                "optimization skipped: no NVIDIA GPU here; on a machine with one, run "
                f"`optiml optimize {result.checked_path} --kernel {result.name}`"
            )
    if skip is None:
        from optiml.api import OptimizeRequest, optimize_file

        request = OptimizeRequest(file=Path(result.checked_path), kernel=result.name, arch=arch)
        optimized = optimize_file(request, executor=executor_url if remote else None)
        if not as_json:
            out.print(f"{result.name}: {optimized.trajectory.outcome}", markup=False)
            for label, path in optimized.files.items():
                out.print(f"  {label}: {path}", markup=False)
    elif not as_json:
        err.print(skip, markup=False)
    if as_json:
        payload = {
            "name": result.name,
            "written": [str(p) for p in result.written],
            "notes": notes,
            "check": data,
            "optimized": {k: str(v) for k, v in optimized.files.items()} if optimized else None,
            "skipped": skip,
        }
        click.echo(json.dumps(payload, indent=2))
    if any(k["compiled"] is False for k in data["kernels"]):
        sys.exit(int(ExitCode.COMPILE_ERROR))
    if failed:
        sys.exit(int(ExitCode.BAD_SPEC))


@main.command()
def worker() -> None:
    """Run jobs sent as JSON lines on stdin, answering each with one JSON line on stdout: what
    `--executor ssh://...` starts on the other machine (README: Running on another machine)."""
    from optiml.executors.worker import serve

    sys.exit(serve())


@main.command()
@click.option("--stdio", is_flag=True, help="Speak LSP over stdin/stdout (the default).")
@click.option(
    "--tcp",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Listen on 127.0.0.1:PORT instead, for debugging.",
)
def serve(stdio: bool, tcp: int | None) -> None:
    """Run the OptiML language server for editors (docs/editor.md)."""
    if stdio and tcp is not None:
        raise click.UsageError("--stdio and --tcp exclude each other")
    from server import (
        main as serve_main,  # only here, and lazily: the library never loads the server
    )

    sys.exit(serve_main(["--tcp", str(tcp)] if tcp is not None else ["--stdio"]))


main.add_command(llm_group)
