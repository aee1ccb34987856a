"""The `optiml` command. Each subcommand is a thin shell over `optiml.api`: it prints a rich table
for people or JSON for machines (`--json`), and turns errors into one line and a distinct exit code.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from optiml import __version__
from optiml.errors import ExitCode, OptimlError
from optiml.llm.cli import llm_group

# Tables keep their columns when piped (rich would otherwise fold them to 80 columns).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_CODES = """Exit codes:
  0 ok, 1 internal error, 2 usage, 3 file missing or unreadable, 4 no such kernel, 5 bad spec,
  6 nvcc not found, 7 no NVIDIA GPU, 8 compile error, 9 runtime error, 10 timeout, 11 wrong result,
  12 ncu not found, 13 profiling failed;
  llm: 20 no API key, 21 authentication failed, 22 provider unreachable, 23 other LLM error"""

VERDICT_EXIT = {
    "ok": ExitCode.OK,
    "compile_error": ExitCode.COMPILE_ERROR,
    "runtime_error": ExitCode.RUNTIME_ERROR,
    "timeout": ExitCode.TIMEOUT,
    "wrong_result": ExitCode.WRONG_RESULT,
}


def _fail(e: OptimlError, as_json: bool) -> None:
    if as_json:
        pos = e.position
        payload = {"error": e.message, "exit_code": int(e.exit_code)}
        if pos:
            payload["position"] = {"path": pos.path, "line": pos.line, "column": pos.column}
        click.echo(json.dumps(payload))
    err.print(f"optiml: error: {e}", markup=False)
    sys.exit(int(e.exit_code))


def handles_errors(fn):
    """One line on stderr and the error's exit code for every `OptimlError`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OptimlError as e:
            _fail(e, kwargs.get("as_json", False))

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
arch_option = click.option(
    "--arch",
    default=None,
    metavar="SM",
    help="Target architecture, e.g. sm_90 (default: the spec's `arch`, else the local GPU's, else sm_90).",
)


@click.group(epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
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
@json_option
@handles_errors
def check(file: Path, kernel: str | None, arch: str | None, as_json: bool) -> None:
    """Parse FILE, check its specs, compile its kernels and report registers, spills and
    theoretical occupancy. Needs nvcc, not a GPU."""
    from optiml.api import check_file

    result = check_file(file, kernel, arch)
    if as_json:
        click.echo(json.dumps(_check_json(result), indent=2))
    else:
        _print_check(result)
    if result.compile_failed:
        sys.exit(int(ExitCode.COMPILE_ERROR))
    if result.spec_failed:
        sys.exit(int(ExitCode.BAD_SPEC))


def _check_json(result) -> dict:
    kernels = []
    for c in result.kernels:
        kernels.append(
            {
                "kernel": c.kernel.name,
                "spec": c.spec.model_dump() if c.spec else None,
                "spec_errors": [
                    {"message": m, "path": p.path, "line": p.line, "column": p.column}
                    for m, p in c.spec_error.issues
                ]
                if c.spec_error
                else [],
                "compiled": c.build.ok if c.build else None,
                "skipped": c.skipped,
                "messages": [m.model_dump() for m in c.messages],
                "report": c.report.model_dump() if c.report else None,
            }
        )
    return {"file": result.source.path, "arch": result.arch, "kernels": kernels}


def _print_check(result) -> None:
    for c in result.kernels:
        if c.spec_error:
            for message, pos in c.spec_error.issues:
                err.print(f"{pos}: spec error: {message}", markup=False)
        for m in c.messages:
            if m.severity in ("error", "warning"):
                err.print(str(m), markup=False)
    table = Table(title=f"{result.source.path} ({result.arch})", title_justify="left")
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
    for c in result.kernels:
        spec = "ok" if c.spec else ("error" if c.spec_error else "none")
        if c.report is None:
            status = c.skipped or (
                "does not compile" if c.build and not c.build.ok else "no report"
            )
            table.add_row(c.kernel.name, spec, "", "", "", "", "", "", status)
            continue
        r, o = c.report.resources, c.report.occupancy
        table.add_row(
            c.kernel.name,
            spec,
            str(r.registers),
            f"{r.spill_store_bytes}/{r.spill_load_bytes}",
            str(r.stack_bytes),
            str(r.static_smem_bytes + (c.report.dynamic_smem or 0)),
            _dims(c.report.block) if c.report.block else "",
            f"{o.occupancy:.0%} ({o.blocks_per_sm}/SM)" if o else "",
            o.limiter.replace("_", " ") if o else "",
        )
    out.print(table)
    for c in result.kernels:
        if c.skipped:
            out.print(f"  {c.kernel.name}: {c.skipped}", markup=False)
        for note in c.report.notes if c.report else []:
            out.print(f"  {c.kernel.name}: {note}", markup=False)


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
    default=60.0,
    show_default=True,
    help="Wall-clock limit of the run, seconds.",
)
@click.option("--no-time", is_flag=True, help="Check correctness only.")
@json_option
@handles_errors
def eval_(
    file: Path,
    kernel: str,
    candidate: Path | None,
    arch: str | None,
    timeout_s: float,
    no_time: bool,
    as_json: bool,
) -> None:
    """Run KERNEL (or CANDIDATE's version of it) on a GPU at every size and seed of its spec,
    check every output element against the reference, and time both with CUDA events."""
    from optiml.api import EvalOptions, evaluate_file

    opts = EvalOptions(arch=arch, timeout_s=timeout_s, time=not no_time)
    verdict = evaluate_file(file, kernel, candidate, opts)
    if as_json:
        click.echo(verdict.model_dump_json(indent=2))
    else:
        _print_verdict(verdict)
    sys.exit(int(VERDICT_EXIT[verdict.status]))


def _print_verdict(v) -> None:
    style = "green" if v.ok else "red"
    out.print(f"[{style}]{v.status}[/{style}] {v.kernel}: ", end="")
    out.print(v.message, markup=False)
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
    help="full: everything, per-line hotspots included; search: the sections the search reads "
    "for each candidate (speed of light, memory, occupancy, launch, warp states, scheduler), faster.",
)
@click.option(
    "--clock-control",
    type=click.Choice(["none", "base"]),
    default="none",
    show_default=True,
    help="none keeps the GPU's own clocks (as timing sees them); base locks them to base clocks.",
)
@arch_option
@json_option
@handles_errors
def profile(
    file: Path, kernel: str, section_set: str, clock_control: str, arch: str | None, as_json: bool
) -> None:
    """Profile KERNEL with Nsight Compute at its first problem size: speed-of-light, memory,
    occupancy, stalls and per-line hotspots, and the bottleneck in one sentence."""
    from optiml.api import profile_file

    p = profile_file(
        file, kernel, full=section_set == "full", clock_control=clock_control, arch=arch
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
    from optiml.cuda.draft import draft_spec
    from optiml.cuda.source import SourceFile

    source = SourceFile.read(file)
    k = source.kernel(kernel)
    text = draft_spec(source, k)
    if as_json:
        line = k.span.start_point[0] + 1
        click.echo(json.dumps({"kernel": k.name, "insert_before_line": line, "spec": text}))
    else:
        click.echo(text, nl=False)


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


if __name__ == "__main__":
    main()
