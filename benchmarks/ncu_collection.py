"""What ncu's collection costs (on a GPU machine): for a few fixtures, the profile-only runner alone,
under ncu profiling nothing, and under ncu with each way of collecting what the diagnosis reads —
the six sections (with their rules, once more at the end), the sections without rules, without
SchedulerStats, the metrics named one by one (the search set before it left FLOP counts out), with
the pipe breakdown, without the stall reasons, without FLOP counts, with no cache flush between
passes, with no child processes followed, and the search set as it is now — each as wall seconds,
ncu's replay passes and the seconds reading the report back; and the bottleneck each named.

    python3 benchmarks/ncu_collection.py --out FILE.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.harness.build import build_kernel, runner_binary  # noqa: E402
from optiml.harness.evaluate import launch_once  # noqa: E402
from optiml.harness.gpu import default_arch, local_gpus  # noqa: E402
from optiml.profile.model import build_profile  # noqa: E402
from optiml.profile.ncu import (  # noqa: E402
    DIAGNOSIS_METRICS,
    FLOP_METRICS,
    SEARCH_METRICS,
    SEARCH_SECTIONS,
    find_ncu,
    read_report,
    replay_passes,
)
from optiml.spec import load  # noqa: E402

FIXTURES = [("saxpy.cu", "saxpy"), ("sgemm.cu", "sgemm_naive"), ("spill.cu", "batched_matmul8")]
STALLS = SEARCH_METRICS[-1]
PIPES = r"regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active"


def sections(names) -> list[str]:
    return [a for s in names for a in ("--section", s)]


def metrics(*names) -> list[str]:
    return ["--metrics", ",".join(names)]


# FLOP counts were part of every set until the search set left them out; the ways measured before
# keep them, so that their figures stay comparable with the committed ones.
FLOPS = (*DIAGNOSIS_METRICS, *FLOP_METRICS)
NAMED = (*SEARCH_METRICS, *FLOPS)
APP_ONLY = ["--target-processes", "application-only"]
WAYS = {
    "sections": sections(SEARCH_SECTIONS) + metrics(*FLOPS),
    "sections_no_rules": ["--apply-rules", "no"] + sections(SEARCH_SECTIONS) + metrics(*FLOPS),
    "sections_no_scheduler": sections(SEARCH_SECTIONS[:5]) + metrics(*FLOPS),
    "metrics (the search set before FLOPs left it)": metrics(*NAMED),
    "metrics_and_pipes": metrics(*SEARCH_METRICS, PIPES, *FLOPS),
    "metrics_no_stalls": metrics(*SEARCH_METRICS[:-1], *FLOPS),
    "metrics_no_flops": metrics(*SEARCH_METRICS, *DIAGNOSIS_METRICS),
    "metrics_cache_none": ["--cache-control", "none"] + metrics(*NAMED),
    "metrics_application_only": APP_ONLY + metrics(*NAMED),
    "metrics_application_only_cache_none": APP_ONLY + ["--cache-control", "none"] + metrics(*NAMED),
    # What optiml runs now (optiml/profile/ncu.py: collection_args, run_ncu).
    "the search set (no FLOPs, application only)": APP_ONLY
    + metrics(*SEARCH_METRICS, *DIAGNOSIS_METRICS),
    "sections_again": sections(SEARCH_SECTIONS) + metrics(*FLOPS),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tool, arch = find_ncu(), default_arch()
    runner_binary()  # built once, before anything is timed
    rows = {}
    for file, name in FIXTURES:
        source, kernel, spec = load(ROOT / "fixtures" / file, name)
        build = build_kernel(source, kernel, instantiation=spec.instantiation, arch=arch)
        with tempfile.TemporaryDirectory(prefix="optiml-ncu-collection-") as work:
            tmp = Path(work)
            program = launch_once(spec, spec.case(spec.sizes[0]), arch, build.path, tmp)
            base = [
                str(tool.path), "--kernel-name-base", "mangled",
                "--kernel-name", f"regex:^{build.resources.mangled}$", "--launch-count", "1",
                "--clock-control", "none",
            ]  # fmt: skip
            row = {}
            timed(program)  # warm
            row["runner_alone"] = timed(program)
            row["ncu_profiling_nothing"] = timed(
                [str(tool.path), "--kernel-name", "regex:^no_such_kernel$", *program]
            )
            for i, (way, collect) in enumerate(WAYS.items()):
                report = tmp / f"r{i}"
                processes = [] if "--target-processes" in collect else ["--target-processes", "all"]
                row[way] = timed([*base, *processes, *collect, "-f", "-o", str(report), *program])
                t0 = time.perf_counter()
                data = read_report(tool, Path(f"{report}.ncu-rep"))
                row[way]["read_s"] = round(time.perf_counter() - t0, 2)
                p = build_profile(data, user_file=source.path, section_set="search")
                row[way] |= {"bottleneck": p.bottleneck.kind, "rules": len(data.rules)}
        rows[file] = row
        print(file, json.dumps(row), flush=True)
    gpus = local_gpus()
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": gpus[0][0] if gpus else None,
        "ncu": tool.version,
        "note": "wall_s: the ncu command (or the runner alone); read_s: reading its report back",
        "fixtures": rows,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")


def timed(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "passes": replay_passes(p.stdout + p.stderr),
    }


if __name__ == "__main__":
    main()
