"""The evaluation pipeline's benchmark (run it on a GPU machine):

1. every fixture of fixtures/manifest.toml evaluated: verdict against the expected one, wall time;
2. a good fixture evaluated right after the faulting ones still passes;
3. timing stability: the same kernel timed in two separate runs, medians compared;
4. parallel compiles: N independent candidates compiled one after another, then all at once;
5. static occupancy against the CUDA runtime's occupancy API for every good fixture.

    python3 benchmarks/pipeline.py --out benchmarks/results/pipeline-h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optiml.cuda.source import SourceFile  # noqa: E402
from optiml.harness.build import build_kernel, cache_dir  # noqa: E402
from optiml.harness.evaluate import EvalOptions, evaluate  # noqa: E402
from optiml.harness.gpu import default_arch  # noqa: E402
from optiml.harness.nvcc import find_toolkit  # noqa: E402
from optiml.profile.static import occupancy  # noqa: E402
from optiml.spec import load  # noqa: E402


def fixtures() -> list[dict]:
    return tomllib.loads((ROOT / "fixtures" / "manifest.toml").read_text())["fixture"]


def eval_fixture(f: dict, arch: str, **kw) -> tuple[dict, float]:
    path = ROOT / "fixtures" / f["file"]
    start = time.perf_counter()
    if f["verdict"] == "compile_error":
        source = SourceFile.read(path)
        kernel = source.kernel(f["kernel"])
        from optiml.spec import parse_spec

        spec = parse_spec(source, kernel)
    else:
        source, kernel, spec = load(path, f["kernel"])
    timeout = 10.0 if f["verdict"] == "timeout" else 120.0
    verdict = evaluate(source, kernel, spec, None, EvalOptions(arch=arch, timeout_s=timeout, **kw))
    return verdict.model_dump(), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compile-jobs", type=int, default=8)
    args = ap.parse_args()
    arch = default_arch()
    tk = find_toolkit()
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "nvidia_smi": smi,
        "nvcc": tk.version,
        "python": platform.python_version(),
        "arch": arch,
    }

    # 1 + 5: every fixture, then occupancy for the good ones.
    rows, occ_rows = [], []
    for f in fixtures():
        v, wall = eval_fixture(f, arch)
        rows.append(
            {
                "file": f["file"],
                "kernel": f["kernel"],
                "expected": f["verdict"],
                "got": v["status"],
                "right": v["status"] == f["verdict"],
                "message": v["message"],
                "wall_s": round(wall, 2),
                "compile_s": round(v["compile_s"], 2),
                "run_s": round(v["run_s"], 2),
                "median_ms": v["cases"][0]["timing"]["candidate"]["median_ms"]
                if v["cases"] and v["cases"][0]["timing"]
                else None,
                "sm_clock_mhz": v["cases"][0]["timing"]["sm_clock_mhz"]
                if v["cases"] and v["cases"][0]["timing"]
                else None,
            }
        )
        print(
            f"{f['file']:32} {f['kernel']:24} expected {f['verdict']:14} got {v['status']:14} {wall:6.2f} s  {v['message'][:90]}",
            flush=True,
        )
        if v["status"] == "ok":
            source, kernel, spec = load(ROOT / "fixtures" / f["file"], f["kernel"])
            for c in v["cases"]:
                attrs = c["attributes"].get("candidate")
                if not attrs:
                    continue
                launch = c["launch"]["candidate"]
                threads = launch["block"][0] * launch["block"][1] * launch["block"][2]
                smem = attrs["static_smem"] + launch["smem"]
                predicted = occupancy(arch, threads, attrs["registers"], smem)
                occ_rows.append(
                    {
                        "kernel": f["kernel"],
                        "case": c["label"],
                        "threads": threads,
                        "registers": attrs["registers"],
                        "smem": smem,
                        "static_blocks_per_sm": predicted.blocks_per_sm,
                        "cuda_blocks_per_sm": attrs["blocks_per_sm"],
                        "agree": predicted.blocks_per_sm == attrs["blocks_per_sm"],
                    }
                )
    report["verdicts"] = rows
    report["occupancy"] = occ_rows

    # 2: a good fixture right after the faulting ones.
    good = next(f for f in fixtures() if f["file"] == "saxpy.cu")
    after = []
    for f in fixtures():
        if f["verdict"] in ("runtime_error", "timeout"):
            eval_fixture(f, arch)
            v, _ = eval_fixture(good, arch, time=False)
            after.append({"after": f["file"], "status": v["status"]})
    report["good_after_fault"] = after

    # 3: timing stability, two separate runs of the same evaluation.
    stability = []
    for name in ("saxpy.cu", "transpose.cu", "sgemm.cu", "softmax.cu"):
        f = next(x for x in fixtures() if x["file"] == name)
        runs = [eval_fixture(f, arch)[0] for _ in range(2)]
        m = [r["cases"][0]["timing"]["candidate"]["median_ms"] for r in runs]
        stability.append(
            {"file": name, "median_ms": m, "diff_pct": round(abs(m[0] - m[1]) / min(m) * 100, 3)}
        )
        print(f"stability {name}: {m} -> {stability[-1]['diff_pct']} %", flush=True)
    report["stability"] = stability

    # 4: parallel compiles of independent candidates (distinct texts, so nothing is cached).
    source = SourceFile.read(ROOT / "fixtures" / "saxpy.cu")
    kernel = source.kernel("saxpy")
    stamp = time.time_ns()

    def variant(i: int) -> SourceFile:
        return SourceFile(source.text + f"\n// variant {stamp}-{i}\n", source.path)

    jobs = args.compile_jobs
    t0 = time.perf_counter()
    for i in range(jobs):
        assert build_kernel(variant(i), kernel, instantiation="", arch=arch).ok
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        assert all(
            b.ok
            for b in pool.map(
                lambda i: build_kernel(variant(jobs + i), kernel, instantiation="", arch=arch),
                range(jobs),
            )
        )
    parallel = time.perf_counter() - t0
    report["parallel_compile"] = {
        "jobs": jobs,
        "serial_s": round(serial, 2),
        "parallel_s": round(parallel, 2),
        "speedup": round(serial / parallel, 2),
    }
    print(f"compiles: {jobs} serial {serial:.2f} s, parallel {parallel:.2f} s", flush=True)
    report["cache_dir"] = str(cache_dir())

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    right = sum(r["right"] for r in rows)
    worst = max(r["wall_s"] for r in rows)
    print(
        f"\nverdicts right: {right}/{len(rows)}; slowest eval {worst:.1f} s; occupancy agrees: "
        f"{sum(o['agree'] for o in occ_rows)}/{len(occ_rows)}; max stability diff "
        f"{max(s['diff_pct'] for s in stability):.2f} %; good after faults: {[a['status'] for a in after]}"
    )


if __name__ == "__main__":
    main()
