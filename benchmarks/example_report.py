"""The example report of the documentation, made from a committed trajectory (no GPU):

    python3 benchmarks/example_report.py [TRAJECTORY] [--out docs/example-report.html]

By default the H200 SGEMM search (benchmarks/results/optimize-sgemm-h200-trajectory.json). The
report is what `optiml optimize` writes next to its trajectory, rendered by the same function.
Exit codes as the CLI's: 3 for a missing file, 2 for a file that is not a trajectory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pydantic import ValidationError  # noqa: E402

from optiml.errors import ExitCode  # noqa: E402
from optiml.search.report import render  # noqa: E402
from optiml.search.trajectory import Trajectory  # noqa: E402

DEFAULT = ROOT / "benchmarks" / "results" / "optimize-sgemm-h200-trajectory.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trajectory", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "example-report.html")
    args = ap.parse_args(argv)
    try:
        text = args.trajectory.read_text(encoding="utf-8")
    except OSError as e:
        return _fail(f"{args.trajectory}: {e.strerror or e}", ExitCode.FILE)
    try:
        t = Trajectory.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            try:
                json.loads(text)
            except json.JSONDecodeError as j:
                return _fail(f"{args.trajectory}:{j.lineno}:{j.colno}: not JSON: {j.msg}")
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        return _fail(f"{args.trajectory}: not a trajectory: {where}: {first['msg']}")
    html = render(t)  # before anything is written: a failure leaves the old report as it was
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(html, encoding="utf-8")
    print(f"{args.out}: the report of {t.kernel} ({t.evaluations} evaluations, {t.outcome})")
    return 0


def _fail(message: str, code: ExitCode = ExitCode.USAGE) -> int:
    print(message, file=sys.stderr)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
