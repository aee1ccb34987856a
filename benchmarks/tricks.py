"""The corpus of tricks and honest controls (fixtures/tricks/manifest.toml) through what
`optiml optimize` does with a candidate, on a GPU: the screen and one evaluation as the search
makes it, then, for what passes, the confirmation's evaluation and the judge. A trick must be
rejected (where its manifest says, or earlier); an honest control must be accepted.

    python3 benchmarks/tricks.py --out benchmarks/results/tricks-h200.json [--only NAME ...]
        [--shard K/N] [--jobs J]

Everything is compiled first, J at a time on the CPUs (into OptiML's compile cache); then the
cases run one after another, so that no two measurements share the GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.executors.base import Job  # noqa: E402
from optiml.executors.local import LocalExecutor  # noqa: E402
from optiml.harness.evaluate import (  # noqa: E402
    Target,
    _build,
    _oracle,
    build_candidate,
    evaluate,
)
from optiml.harness.gpu import default_arch  # noqa: E402
from optiml.harness.nvcc import find_toolkit  # noqa: E402
from optiml.search.judge import judge  # noqa: E402
from optiml.search.optimize import OptimizeOptions  # noqa: E402
from optiml.search.trajectory import Measurement  # noqa: E402
from optiml.spec import load  # noqa: E402

TRICKS = ROOT / "fixtures" / "tricks"
STAGES = ("screen", "compile", "eval", "judge")


def prebuild(manifest: list[dict], arch: str, jobs: int) -> None:
    """Compile every original (and its float64 oracle) and every candidate, `jobs` at a time."""
    opts = replace(OptimizeOptions().search_eval, arch=arch)
    originals = {(e["original"], e["kernel"]) for e in manifest}

    def original(key):
        source, kernel, spec = load(TRICKS / key[0], key[1])
        _build(Target(source, kernel), spec, opts)
        _oracle(Target(source, kernel), spec, opts)

    def candidate(entry):
        source, kernel, spec = load(TRICKS / entry["original"], entry["kernel"])
        build_candidate(source, kernel, spec, SourceFile.read(TRICKS / entry["file"]), opts)

    with ThreadPoolExecutor(jobs) as pool:
        done = [pool.submit(original, k) for k in sorted(originals)]
        done += [pool.submit(candidate, e) for e in manifest]
        for f in done:
            with contextlib.suppress(Exception):  # the case itself reports it when it runs
                f.result()


def run_case(entry: dict, executor: LocalExecutor, arch: str) -> dict:
    start = time.perf_counter()
    source, kernel, spec = load(TRICKS / entry["original"], entry["kernel"])
    candidate = SourceFile.read(TRICKS / entry["file"])
    opts = OptimizeOptions()
    search = evaluate(source, kernel, spec, candidate, replace(opts.search_eval, arch=arch))
    row = {
        "file": entry["file"],
        "class": entry["class"],
        "expect": entry["expect"],
        "expected_stage": entry.get("stage", "-"),
        "search_eval": {"status": search.status, "check": search.check, "message": search.message},
    }
    if not search.ok:
        stage = {"forbidden_code": "screen", "compile_error": "compile"}.get(search.status, "eval")
        row.update(outcome="rejected", stage=stage, by=f"{search.status}: {search.check}")
    else:
        confirm_opts = replace(opts.confirm_eval, arch=arch)
        job = Job(source, kernel, spec, candidate=candidate)
        confirmed = asyncio.run(executor.evaluate(job, confirm_opts, pinned=True))
        row["confirm_eval"] = {
            "status": confirmed.status,
            "check": confirmed.check,
            "message": confirmed.message,
            "speedup": confirmed.speedup,
        }
        if not confirmed.ok:
            row.update(
                outcome="rejected", stage="eval", by=f"{confirmed.status}: {confirmed.check}"
            )
        else:
            verdict = asyncio.run(judge(executor, job, confirm_opts, Measurement.of(confirmed)))
            row["judge"] = [c.model_dump() for c in verdict.checks]
            if verdict.accepted:
                row.update(outcome="accepted", stage="-", by="-")
            else:
                failed = [c.name for c in verdict.checks if not c.ok]
                row.update(outcome="rejected", stage="judge", by="; ".join(failed))
    row["as_expected"] = row["outcome"] == entry["expect"]
    row["wall_s"] = round(time.perf_counter() - start, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="only these files")
    ap.add_argument("--shard", default="1/1", help="K/N: the K-th of N interleaved parts")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    args = ap.parse_args()
    manifest = tomllib.loads((TRICKS / "manifest.toml").read_text())["case"]
    if args.only:
        manifest = [e for e in manifest if e["file"] in args.only]
    k, n = (int(x) for x in args.shard.split("/"))
    manifest = manifest[k - 1 :: n]
    arch = default_arch()
    t0 = time.perf_counter()
    prebuild(manifest, arch, args.jobs)
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "nvidia_smi": smi,
        "nvcc": find_toolkit().version,
        "python": platform.python_version(),
        "rows": [],
    }
    executor = LocalExecutor()
    for entry in manifest:
        try:
            row = run_case(entry, executor, arch)
        except Exception as e:  # a crash of the tool is a finding, recorded as such
            row = {
                "file": entry["file"],
                "class": entry["class"],
                "expect": entry["expect"],
                "outcome": "crashed",
                "by": f"{type(e).__name__}: {e}",
                "as_expected": False,
            }
        report["rows"].append(row)
        mark = "ok " if row["as_expected"] else "BAD"
        print(
            f"{mark} {row['file']:<44} {row['outcome']:<9} {row.get('stage', ''):<8} {row['by'][:90]}",
            flush=True,
        )
        args.out.write_text(json.dumps(report, indent=1))
    tricks = [r for r in report["rows"] if r["expect"] == "rejected"]
    honest = [r for r in report["rows"] if r["expect"] == "accepted"]
    report["summary"] = {
        "tricks": len(tricks),
        "tricks_rejected": sum(r["outcome"] == "rejected" for r in tricks),
        "controls": len(honest),
        "controls_accepted": sum(r["outcome"] == "accepted" for r in honest),
        "by_stage": {s: sum(r.get("stage") == s for r in tricks) for s in STAGES},
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"]))


if __name__ == "__main__":
    main()
