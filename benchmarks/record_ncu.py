"""Record Nsight Compute reports of the fixtures on a GPU machine, as text the profile parsers are
tested on: for each fixture kernel, one launch at its first size profiled with the full section set
and source counters, exported and then read back as CSV (details, raw, source pages).

    python3 benchmarks/record_ncu.py --out DIR [--set full|search]

Writes DIR/<fixture>-<kernel>.{details,raw,source}.csv and DIR/ncu-timings.json (wall time of each
profile, and of ncu doing nothing, to tell its start-up from the per-kernel cost).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.harness.build import build_kernel, runner_binary  # noqa: E402
from optiml.harness.evaluate import EvalOptions, write_plan  # noqa: E402
from optiml.harness.gpu import default_arch  # noqa: E402
from optiml.profile.ncu import collection_args  # noqa: E402
from optiml.spec import parse_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="section_set", choices=["full", "search"], default="full")
    ap.add_argument(
        "--only", nargs="*", default=None, help="fixture files to record (default: all good ones)"
    )
    args = ap.parse_args()
    ncu = shutil.which("ncu") or "/opt/nvidia/nsight-compute/2025.3.1/ncu"
    arch = default_arch()
    args.out.mkdir(parents=True, exist_ok=True)
    runner = runner_binary()
    version = (
        subprocess.run([ncu, "--version"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    timings = {"ncu": version, "set": args.section_set, "profiles": []}
    t0 = time.perf_counter()
    subprocess.run([ncu, "--version"], capture_output=True)
    timings["ncu_version_s"] = time.perf_counter() - t0
    entries = [
        e
        for e in tomllib.loads((ROOT / "fixtures" / "manifest.toml").read_text())["fixture"]
        if e["verdict"] == "ok"
    ]
    if args.only:
        entries = [e for e in entries if e["file"] in args.only]
    for e in entries:
        source = SourceFile.read(ROOT / "fixtures" / e["file"])
        kernel = source.kernel(e["kernel"])
        spec = parse_spec(source, kernel)
        if spec.reference.kind == "numpy":
            continue
        build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=arch)
        stem = f"{Path(e['file']).stem}-{kernel.short_name}"
        work = args.out / f".{stem}"
        work.mkdir(exist_ok=True)
        plan = work / "plan.txt"
        plan.write_text(
            write_plan(spec, [spec.case(spec.sizes[0])], (1,), EvalOptions(arch=arch, time=False))
        )
        rep = work / "profile"
        sections = ["--set", "full"] if args.section_set == "full" else collection_args(False)
        cmd = [
            ncu, "--target-processes", "all", "--kernel-name-base", "mangled",
            "--kernel-name", f"regex:^{build.resources.mangled}$", "--launch-count", "1",
            "--clock-control", "none", *sections, "--import-source", "yes", "-f", "-o", str(rep),
            str(runner), str(plan), str(work / "result.json"), str(build.path), str(build.path),
        ]  # fmt: skip
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        ok = p.returncode == 0 and Path(str(rep) + ".ncu-rep").exists()
        timings["profiles"].append(
            {
                "fixture": e["file"],
                "kernel": kernel.name,
                "mangled": build.resources.mangled,
                "wall_s": round(wall, 2),
                "ok": ok,
            }
        )
        print(
            f"{stem:40} {wall:6.2f} s {'ok' if ok else 'FAILED: ' + p.stdout[-300:] + p.stderr[-300:]}",
            flush=True,
        )
        if not ok:
            continue
        for page, extra in (("details", []), ("raw", []), ("source", ["--print-source", "cuda"])):
            out = subprocess.run(
                [
                    ncu,
                    "-i",
                    str(rep) + ".ncu-rep",
                    "--csv",
                    "--page",
                    page,
                    "--print-units",
                    "base",
                    *extra,
                ],
                capture_output=True,
                text=True,
            )
            (args.out / f"{stem}.{page}.csv").write_text(out.stdout)
        shutil.rmtree(work, ignore_errors=True)
    (args.out / "ncu-timings.json").write_text(json.dumps(timings, indent=2) + "\n")


if __name__ == "__main__":
    main()
