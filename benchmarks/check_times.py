"""`optiml check` wall time per fixture file, cold compile cache, on the machine it runs on (no GPU
needed): the bar is < 5 s per file.

    python3 benchmarks/check_times.py --out benchmarks/results/check-times.json
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
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    files = sorted(
        {
            e["file"]
            for e in tomllib.loads((ROOT / "fixtures" / "manifest.toml").read_text())["fixture"]
        }
    )
    nvcc = (
        subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    rows = []
    for f in files:
        env = {**os.environ, "OPTIML_CACHE_DIR": tempfile.mkdtemp(prefix="optiml-bench-")}
        start = time.perf_counter()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "optiml.cli",
                "check",
                str(ROOT / "fixtures" / f),
                "--arch",
                "sm_90",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        wall = time.perf_counter() - start
        rows.append({"file": f, "exit_code": p.returncode, "wall_s": round(wall, 2)})
        print(f"{f:34} exit {p.returncode}  {wall:5.2f} s", flush=True)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, no GPU",
        "python": platform.python_version(),
        "nvcc": nvcc,
        "cache": "cold (a new cache directory per file)",
        "files": rows,
        "max_wall_s": max(r["wall_s"] for r in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"slowest: {report['max_wall_s']:.2f} s")


if __name__ == "__main__":
    main()
