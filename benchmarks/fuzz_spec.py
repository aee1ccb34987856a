"""Seeded fuzzing of the spec language at scale: mutations of the `@optiml` comments of every
fixture kernel through `parse_spec` and `Spec.case`, expressions from the grammar of tokens through
`Expr.parse` and `evaluate`, and mutated files through `optiml check --json` in-process (the
compile stood in for, as in tests/test_fuzz_spec.py, whose inputs these are: tests/spec_fuzz.py).

Every input runs in a worker process under a time limit: an input that does not answer in time is
a hang (the worker is killed and replaced, so a hang inside C code is caught too), one that kills
the worker a crash, and an exception other than SpecError or ExprError (or, on the command line,
an exit code outside the documented ones, a traceback, or stderr other than one `optiml: error:`
line) a failure; each is recorded with its seed, the traceback or broken rule, and its text. Input i of a kind is drawn from random.Random(f"{kind}-{i}"), so any one can be run again.

    python3 benchmarks/fuzz_spec.py --out benchmarks/results/fuzz-spec.json
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.spec_fuzz import mutate, random_expression, run_expression, run_spec, spec_sites  # noqa: E402

KINDS = ("spec", "expression", "cli")
DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}  # optiml.errors.ExitCode less INTERNAL


def make_input(kind: str, i: int, sites) -> tuple[str, str, str, str]:
    """Input `i` of `kind`: its text, its fixture file ("" for an expression), the fixture's name
    and the part worth showing (the mutated spec comment, or the expression)."""
    rng = random.Random(f"{kind}-{i}")
    if kind == "expression":
        text = random_expression(rng)
        return text, "", "", text
    site = rng.choice(sites)
    text = mutate(site, rng)
    comment = text[site.start : site.end + len(text) - len(site.text)]
    return text, str(site.path), site.path.relative_to(ROOT / "fixtures").as_posix(), comment


def _stand_in_compile() -> None:
    """`optiml check` without nvcc, as in tests/test_fuzz_spec.py: every kernel compiles."""
    import optiml.api
    import optiml.arch
    from optiml.harness.build import Build
    from optiml.harness.nvcc import Resources

    def build(source, instantiations, *, arch, flags=()):
        found = [
            Resources(
                mangled=k.short_name,
                name=f"void {k.name}()",
                arch=arch,
                registers=40,
                static_smem_bytes=1024,
            )
            for k in source.kernels
        ]
        return Build(
            ok=True, path=Path(os.devnull), messages=[], resources=None, all_resources=found
        )

    optiml.api.build_device_code = build
    optiml.api.find_toolkit = lambda: None
    if hasattr(optiml.arch, "_toolkit"):
        optiml.arch._toolkit = lambda: None


def _run_cli(text: str, path: str) -> list[str]:
    import shutil
    import tempfile

    from click.testing import CliRunner

    from optiml.cli import main

    original = Path(path)
    with tempfile.TemporaryDirectory(prefix="optiml-fuzz-") as tmp:
        for ref in original.parent.glob("*.py"):
            shutil.copy(ref, tmp)
        f = Path(tmp) / original.name
        f.write_text(text, encoding="utf-8")
        r = CliRunner().invoke(main, ["check", "--json", str(f)])
    errors = r.stderr.splitlines()
    problems = []
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        problems.append(
            "".join(traceback.format_exception(r.exception)) if r.exc_info else repr(r.exception)
        )
    if "Traceback" in r.output:
        problems.append("a traceback in the output:\n" + r.output[-2000:])
    if r.exit_code not in DOCUMENTED:
        problems.append(f"exit code {r.exit_code}, not a documented one: {r.stderr[-500:]}")
    if r.exit_code != 0 and (len(errors) != 1 or not errors[0].startswith("optiml: error: ")):
        problems.append(f"stderr is not one `optiml: error:` line: {r.stderr[-500:]!r}")
    if problems:
        raise AssertionError("\n".join(problems))
    return [f"exit {r.exit_code}"]


def worker(conn) -> None:
    """Run the inputs the parent names, one at a time: (kind, i) -> (outcomes, seconds, error)."""
    sites = spec_sites()
    _stand_in_compile()
    _run_cli(sites[0].text, str(sites[0].path))  # imports and first-use costs, not an input's
    while True:
        job = conn.recv()
        if job is None:
            return
        kind, i = job
        text, path, _, _ = make_input(kind, i, sites)
        start = time.perf_counter()
        try:
            if kind == "expression":
                outcomes = [run_expression(text)]
            elif kind == "spec":
                outcomes = run_spec(text, Path(path))
            else:
                outcomes = _run_cli(text, path)
            error = None
        except BaseException as e:  # what the fuzzing is for: anything else is a failure
            outcomes, error = [], _failure(e)
        conn.send((outcomes, time.perf_counter() - start, error))


def _failure(e: BaseException) -> dict[str, str]:
    """An exception as the report keeps it: its type, its message and where it was raised, each
    cut short (a message can quote a 5,000-character input)."""
    frames = traceback.format_tb(e.__traceback__)
    return {
        "type": type(e).__name__,
        "message": _snippet(str(e), 600),
        "traceback": "".join(_snippet(f, 300) for f in frames[-6:]),
    }


class Pool:
    """One worker process, replaced after a hang."""

    def __init__(self):
        self.ctx = mp.get_context("fork")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker, args=(child,), daemon=True)
        self.proc.start()

    def run(self, kind: str, i: int, limit_s: float, first: bool):
        """The worker's answer; "hang" if it gives none in time, "crash" if it dies (both
        replace it)."""
        try:
            self.conn.send((kind, i))
            # the first input of a worker also pays for reading the fixtures
            if self.conn.poll(limit_s + (30 if first else 0)):
                return self.conn.recv()
            failure = "hang"
        except (EOFError, OSError):
            failure = "crash"
        self.proc.kill()
        self.proc.join()
        self._start()
        return failure

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=10)


def _snippet(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _versions() -> dict[str, str]:
    out = {}
    for name in ("tree-sitter", "tree-sitter-cuda", "click", "pydantic"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _command(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return "not found"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--specs", type=int, default=6000, help="mutated specs (parse_spec, case)")
    ap.add_argument("--expressions", type=int, default=6000)
    ap.add_argument("--cli", type=int, default=1000, help="mutated files through optiml check")
    ap.add_argument("--limit", type=float, default=5.0, help="seconds an input may take")
    args = ap.parse_args()
    sites = spec_sites()
    counts = {"spec": args.specs, "expression": args.expressions, "cli": args.cli}
    outcomes: dict[str, collections.Counter] = {k: collections.Counter() for k in KINDS}
    failures, slowest = [], {"seconds": 0.0}
    pool, first = Pool(), True
    start = time.perf_counter()
    for kind in KINDS:
        for i in range(counts[kind]):
            answer = pool.run(kind, i, args.limit, first)
            first = isinstance(answer, str)
            _, _, where, shown = make_input(kind, i, sites)
            if isinstance(answer, str):
                outcomes[kind][answer] += 1
                failures.append(
                    {
                        "kind": kind,
                        "seed": f"{kind}-{i}",
                        "fixture": where,
                        "failure": f"hang: no answer within {args.limit} s"
                        if answer == "hang"
                        else "crash: the worker process died",
                        "input": _snippet(shown),
                    }
                )
                continue
            found, seconds, error = answer
            if error is not None:
                outcomes[kind]["failure"] += 1
                failures.append(
                    {
                        "kind": kind,
                        "seed": f"{kind}-{i}",
                        "fixture": where,
                        "failure": f"{error['type']}: {error['message']}",
                        "traceback": error["traceback"],
                        "input": _snippet(shown),
                    }
                )
            outcomes[kind]["inputs"] += 1
            outcomes[kind].update(found)
            if kind == "spec" and not found and error is None:
                outcomes[kind]["no spec comment left"] += 1
            if seconds > slowest["seconds"]:
                slowest = {
                    "seconds": round(seconds, 4),
                    "kind": kind,
                    "seed": f"{kind}-{i}",
                    "fixture": where,
                    "input": _snippet(shown, 200),
                }
        print(f"{kind}: {dict(outcomes[kind])}", flush=True)
    pool.close()
    nvcc = _command(["nvcc", "--version"]).splitlines()
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"uname": _command(["uname", "-a"]), "cpus": os.cpu_count()},
        "python": platform.python_version(),
        "packages": _versions(),
        "nvcc": nvcc[-1] if nvcc else "not found",
        "commit": _command(["git", "rev-parse", "HEAD"]),
        "inputs": {
            "spec": f"{args.specs} mutations of the {len(sites)} spec comments of fixtures/ "
            "(wild/ included) through parse_spec and Spec.case of every size; the outcomes count "
            "each spec comment of the mutated file",
            "expression": f"{args.expressions} expressions from tests/spec_fuzz.py's grammar "
            "through Expr.parse and evaluate",
            "cli": f"{args.cli} mutations through `optiml check --json` in-process, the compile "
            "stood in for",
            "total": sum(counts.values()),
            "time_limit_s": args.limit,
        },
        "outcomes": {k: dict(v) for k, v in outcomes.items()},
        "slowest": slowest,
        "wall_s": round(time.perf_counter() - start, 1),
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(failures)} failures; slowest input {slowest['seconds']} s ({slowest.get('seed')})")


if __name__ == "__main__":
    main()
