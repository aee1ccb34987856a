"""What the checks added to every evaluation cost, on a GPU: the wall time of an evaluation as the
search makes it (compile cached, check every size with two seeds, time the first size) with every
check — timed launches on fresh inputs with their outputs and inputs checked, guard regions, the
dependence probes of the floor, the floor — against the same evaluation without them, for a real
candidate of each search fixture (the catalog's first proposal). Runs alternate, median of five.

    python3 benchmarks/verdict_overhead.py --out benchmarks/results/verdict-overhead-h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.harness.evaluate import evaluate  # noqa: E402
from optiml.harness.gpu import default_arch  # noqa: E402
from optiml.harness.nvcc import find_toolkit  # noqa: E402
from optiml.search.catalog import CATALOG, Context  # noqa: E402
from optiml.search.optimize import OptimizeOptions  # noqa: E402
from optiml.search.variant import Variant  # noqa: E402
from optiml.spec import load  # noqa: E402

FIXTURES = [
    ("saxpy.cu", "saxpy", "vectorize"),
    ("reduce_sum.cu", "reduce_sum", "block_reduce"),
    ("transpose.cu", "transpose_naive", "tile_transpose"),
    ("softmax.cu", "softmax_rows", "row_parallel"),
    ("layernorm.cu", "layernorm_forward", "row_parallel"),
    ("stencil2d.cu", "jacobi_step", "vectorize_2d"),
    ("histogram.cu", "histogram_global", "privatize_histogram"),
    ("sgemm.cu", "sgemm_naive", "gemm_tiling"),
]


def environment() -> dict:
    """Where and with what a GPU benchmark ran: the date, the GPU and driver, nvcc, Python."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nvidia_smi": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip(),
        "nvcc": find_toolkit().version,
        "python": platform.python_version(),
    }


def first_proposal(file: str, kernel_name: str, transformation: str):
    """A fixture's kernel (source, kernel, spec) and the catalog's first proposal of
    `transformation` for it (its file, flags and summary); None where it proposes nothing."""
    path = ROOT / "fixtures" / file
    source, kernel, spec = load(path, kernel_name)
    ctx = Context.of(Variant(source.text), str(path), kernel.name, sm_count=132)
    proposals = CATALOG[transformation].propose(ctx)
    if not proposals:
        return None
    p = proposals[0]
    return source, kernel, spec, SourceFile(p.variant.text, str(path)), p.variant.flags, p.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    arch = default_arch()
    full = replace(OptimizeOptions().search_eval, arch=arch)
    bare = replace(
        full, timed_checks=0.0, fresh_inputs=False, guard_bytes=0, dependence=0, floor=False
    )
    rows = []
    for file, kernel_name, transformation in FIXTURES:
        found = first_proposal(file, kernel_name, transformation)
        if found is None:
            print(f"{file}: no {transformation} proposal", flush=True)
            continue
        source, kernel, spec, cand, flags, summary = found
        flags = tuple(flags) or full.flags
        runs: dict[str, list[float]] = {"full": [], "bare": []}
        statuses = set()
        evaluate(source, kernel, spec, cand, replace(full, candidate_flags=flags))  # compile once
        for _ in range(args.repeats):
            for name, opts in (("bare", bare), ("full", full)):
                v = evaluate(source, kernel, spec, cand, replace(opts, candidate_flags=flags))
                statuses.add(v.status)
                runs[name].append(v.wall_s)
        b, f = statistics.median(runs["bare"]), statistics.median(runs["full"])
        rows.append(
            {
                "fixture": file,
                "candidate": summary,
                "statuses": sorted(statuses),
                "bare_s": runs["bare"],
                "full_s": runs["full"],
                "bare_median_s": b,
                "full_median_s": f,
                "overhead": f / b - 1,
            }
        )
        print(f"{file:<16} bare {b:.3f} s  full {f:.3f} s  +{(f / b - 1) * 100:.1f} %", flush=True)
        args.out.write_text(json.dumps({"rows": rows, "partial": True}, indent=1))
    total_b = sum(r["bare_median_s"] for r in rows)
    total_f = sum(r["full_median_s"] for r in rows)
    report = {
        **environment(),
        "host": platform.node(),
        "rows": rows,
        "overall_overhead": total_f / total_b - 1 if total_b else None,
        "max_overhead": max((r["overhead"] for r in rows), default=None),
    }
    args.out.write_text(json.dumps(report, indent=1))
    print(
        f"overall +{report['overall_overhead'] * 100:.1f} %, worst +{report['max_overhead'] * 100:.1f} %"
    )


if __name__ == "__main__":
    main()
