"""Where one evaluation's wall time goes, on a GPU: for a real candidate of each fixture (the
catalog's first proposal of the named transformation), evaluated as the search evaluates it (compile
cached), the runner's phases with the milliseconds at which each began (OPTIML_PHASE_TIMES), grouped
into starting the process and the GPU, loading the kernels, each case's checked runs, the oracle,
the dependence probes and the timing; and the wall time of a bare runner process (`--device`: start,
open the GPU, exit); each evaluation in a runner started for it and in one started ahead
(`EvalOptions.ahead`), alternately.

    python3 benchmarks/eval_phases.py --out benchmarks/results/eval-phases-h100.json [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from verdict_overhead import environment, first_proposal  # noqa: E402

import optiml.harness.evaluate as ev  # noqa: E402
from optiml.harness.build import runner_binary  # noqa: E402
from optiml.harness.gpu import default_arch  # noqa: E402
from optiml.search.optimize import OptimizeOptions  # noqa: E402

FIXTURES = [
    ("saxpy.cu", "saxpy", "vectorize"),
    ("softmax.cu", "softmax_rows", "row_parallel"),
    ("transpose.cu", "transpose_naive", "tile_transpose"),
    ("sgemm.cu", "sgemm_naive", "gemm_tiling"),
]


def group(label: str) -> str:
    """A phase's line (`case=0 seed=3 kernel=candidate`, `case=1 timing reps=40`, ...) as the
    part of the run it belongs to."""
    if "=" not in label:
        return label
    if "timing" in label or "warmup" in label:
        return "timing"
    if "dependence" in label:
        return "dependence probes"
    if "kernel=oracle" in label:
        return "oracle"
    return "checked runs"


def spans(stderr: str, total_ms: float) -> dict[str, float]:
    """Milliseconds per group: each phase lasts until the next one begins (the last until the
    process ended)."""
    points = []
    for line in stderr.splitlines():
        if line.startswith("phase-time "):
            _, ms, label = line.split(" ", 2)
            points.append((float(ms), group(label)))
    out: dict[str, float] = {"process start": points[0][0] if points else total_ms}
    for (t0, name), (t1, _) in zip(points, points[1:] + [(total_ms, "")], strict=True):
        out[name] = out.get(name, 0.0) + max(t1 - t0, 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    arch = default_arch()
    opts = replace(OptimizeOptions().search_eval, arch=arch, env={"OPTIML_PHASE_TIMES": "1"})
    ev._tail = lambda path, limit=0: path.read_bytes().decode("utf-8", errors="replace")
    seen: list[ev._Outcome] = []
    run_isolated = ev._run_isolated

    def keep(*a, **k):
        outcome = run_isolated(*a, **k)
        seen.append(outcome)
        return outcome

    ev._run_isolated = keep
    runner = runner_binary()
    bare = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([str(runner), "--device", os.path.join(tmp, "d.json")], check=True)
            bare.append(time.perf_counter() - t)
    rows = []
    for file, kernel_name, transformation in FIXTURES:
        found = first_proposal(file, kernel_name, transformation)
        if found is None:
            continue
        source, kernel, spec, cand, flags, summary = found
        flags = tuple(flags) or opts.flags
        ev.evaluate(source, kernel, spec, cand, replace(opts, candidate_flags=flags))
        for _, ahead in itertools.product(range(args.repeats), (False, True)):
            seen.clear()
            v = ev.evaluate(
                source, kernel, spec, cand, replace(opts, candidate_flags=flags, ahead=ahead)
            )
            outcome = seen[-1]
            rows.append(
                {
                    "fixture": file,
                    "ahead": ahead,
                    "candidate": summary,
                    "status": v.status,
                    "wall_s": round(v.wall_s, 3),
                    "compile_s": round(v.compile_s or 0.0, 3),
                    "run_s": round(v.run_s or 0.0, 3),
                    "cases": len(v.cases),
                    "runner_ms": spans(outcome.stderr, outcome.seconds * 1e3),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    report = {
        **environment(),
        "bare_runner_s": [round(b, 3) for b in bare],
        "bare_runner_median_s": round(statistics.median(bare), 3),
        "rows": rows,
        # the evaluation's wall time, in a runner started for it and in one started ahead
        "median_wall_s": {
            f"{file} {'ahead' if ahead else 'cold'}": round(
                statistics.median(
                    r["wall_s"] for r in rows if r["fixture"] == file and r["ahead"] == ahead
                ),
                3,
            )
            for file in sorted({r["fixture"] for r in rows})
            for ahead in (False, True)
        },
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
