"""Search throughput: evaluated candidates a minute (compiled, checked at every size and seed,
timed; profiled where the profile can change a decision) during `optiml optimize`'s search, at
several numbers of evaluations in flight (`--parallel`), on the fixtures. Run it on a GPU machine.

The rate is taken between the search's first and last result (its progress points), so that the
input's own measurement (full profile) and the confirmation and judge after the search do not
count; the run's whole wall time is recorded beside it.

    python3 benchmarks/throughput.py --out benchmarks/results/throughput-h100.json \
        [--fixtures saxpy.cu:saxpy,...] [--parallel 2,8] [--budget 24] [--ahead off|on|both]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernelbench import _optiml  # noqa: E402  (`optiml ... --json` in a process of its own)

FIXTURES = (
    "saxpy.cu:saxpy,softmax.cu:softmax_rows,transpose.cu:transpose_naive,sgemm.cu:sgemm_naive"
)


STEPS = ("compile_s", "run_s", "profile_s")
WAITS = ("build_s", "gpu_wait_s")  # an evaluation's build (nvcc and its queue), its GPU wait


def rate(trajectory: dict) -> dict:
    """Evaluations a minute between the search's first and last progress point, and what the
    evaluations ended as."""
    points = trajectory.get("progress") or []
    measured = [
        n["measurement"]
        for n in trajectory.get("nodes", [])
        if n.get("edit") is not None and n.get("measurement") is not None
    ]
    statuses = Counter(m.get("status", "unevaluated") for m in measured)
    profiled = sum(1 for m in measured if m.get("profile"))
    # what the evaluations' own steps took, summed (they overlap: 8 in flight): nvcc, the
    # checked and timed run, ncu
    steps = {k: round(sum(m.get(k) or 0.0 for m in measured), 1) for k in STEPS}
    out = {
        "evaluations": trajectory.get("evaluations"),
        "evaluation_steps_s": steps,
        "statuses": dict(statuses),
        "profiled": profiled,
        "stop": trajectory.get("stop"),
        "wall_s": round(trajectory.get("wall_s") or 0.0, 1),
        # where the rest of the run's wall time went: the input's measurement, the search, the
        # confirmation and each of the judge's checks
        "phase_s": trajectory.get("phase_s"),
        "judge_s": {
            c["name"]: c.get("seconds")
            for c in ((trajectory.get("judge") or {}).get("checks") or [])
        },
    }
    # when each result came in (seconds into the run): where the span's time goes between them
    out["results_at_s"] = [round(p["seconds"], 2) for p in points]
    # each evaluation's start, verdict and end, in the order they started: how many were in
    # flight, and where one waited (for a compile, for the GPU, for its profile)
    out["evaluations_s"] = sorted(
        [m.get("started_s"), m.get("verdict_s"), m.get("ended_s")]
        for m in measured
        if m.get("started_s") is not None
    )
    # which evaluation each was (the edit from its parent, its depth), what it ended as and its
    # steps: a straggler named, not only timed
    out["evaluated"] = sorted(
        (
            {
                "started_s": n["measurement"].get("started_s"),
                "verdict_s": n["measurement"].get("verdict_s"),
                "ended_s": n["measurement"].get("ended_s"),
                "edit": n["edit"].get("transform"),
                "params": n["edit"].get("params"),
                "depth": n.get("depth"),
                "status": n["measurement"].get("status"),
                **{k: n["measurement"].get(k) for k in (*STEPS, *WAITS)},
                "message": (n["measurement"].get("message") or "")[:200],
            }
            for n in trajectory.get("nodes", [])
            if n.get("edit") is not None and n.get("measurement") is not None
        ),
        key=lambda e: (e["started_s"] is None, e["started_s"] or 0.0),
    )
    if len(points) >= 2:
        first, last = points[0], points[-1]
        span = last["seconds"] - first["seconds"]
        done = last["evaluations"] - first["evaluations"]
        out["search_span_s"] = round(span, 1)
        out["per_minute"] = round(60.0 * done / span, 1) if span > 0 else None
    return out


def run(file: str, kernel: str, parallel: int, budget: int, out: Path, ahead: bool) -> dict:
    row: dict = {"fixture": f"{file}::{kernel}", "parallel": parallel, "budget": budget}
    row["ahead"] = ahead
    os.environ["OPTIML_RUNNER_AHEAD"] = "1" if ahead else "0"  # read by `optiml optimize`
    started = time.monotonic()
    payload, error = _optiml(
        ["optimize", str(ROOT / "fixtures" / file), "--kernel", kernel]
        + ["--budget", str(budget), "--time", "0", "--parallel", str(parallel)]
        + ["--no-sanitize", "--out", str(out)],
        timeout=900,
    )
    row["process_s"] = round(time.monotonic() - started, 1)
    if payload is None:
        row["error"] = error
        return row
    row.update(rate(payload))
    row["outcome"] = payload.get("outcome")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fixtures", default=FIXTURES, help="FILE:KERNEL,... under fixtures/")
    ap.add_argument("--parallel", default="2,8", help="evaluations in flight, comma-separated")
    ap.add_argument("--budget", type=int, default=24)
    ap.add_argument(
        "--ahead",
        default="off",
        choices=("off", "on", "both"),
        help="the search's runners started ahead (OPTIML_RUNNER_AHEAD); both: each run twice",
    )
    args = ap.parse_args()
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "nvcc": nvcc.strip().splitlines()[-1] if nvcc.strip() else None,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "bar_per_minute": 40,
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.fixtures.split(","):
            file, kernel = spec.split(":")
            for p in (int(x) for x in args.parallel.split(",")):
                for ahead in {"off": [False], "on": [True], "both": [False, True]}[args.ahead]:
                    out = Path(tmp) / f"{kernel}-{p}-{int(ahead)}"
                    row = run(file, kernel, p, args.budget, out, ahead)
                    report["rows"].append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps(report, indent=1) + "\n")
    for p, ahead in {(r["parallel"], r["ahead"]) for r in report["rows"]}:
        rates = [
            r["per_minute"]
            for r in report["rows"]
            if (r["parallel"], r["ahead"]) == (p, ahead) and r.get("per_minute")
        ]
        if rates:
            key = f"{p}{' ahead' if ahead else ''}"
            report.setdefault("mean_per_minute", {})[key] = round(sum(rates) / len(rates), 1)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report.get("mean_per_minute")))


if __name__ == "__main__":
    main()
