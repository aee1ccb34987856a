"""What a finished search leaves behind: the saved tree, the trajectory (JSON), the HTML report,
the winner's file and its nvcc flags, in the run's folder; the user's file is not touched here."""

from __future__ import annotations

from pathlib import Path

from optiml.harness.build import DEFAULT_FLAGS
from optiml.search.optimize import Outcome
from optiml.search.report import render
from optiml.search.request import OptimizeRequest, OptimizeResult


def deliver(outcome: Outcome, request: OptimizeRequest, out_dir: Path) -> OptimizeResult:
    """Write the run's files under `out_dir` and return what it found, as plain data."""
    t = outcome.trajectory
    saved = out_dir / "search.json"
    outcome.search.save(saved)
    files = {"trajectory": out_dir / "trajectory.json", "report": out_dir / "report.html"}
    files["trajectory"].write_text(t.model_dump_json(indent=1))
    files["report"].write_text(render(t))
    winner = outcome.winner
    if winner is not None:
        file = Path(request.file)
        optimized = out_dir / f"{file.stem}.optimized{file.suffix or '.cu'}"
        optimized.write_text(winner.text)
        files["optimized"] = optimized
        if winner.flags != DEFAULT_FLAGS:
            files["flags"] = out_dir / "nvcc-flags.txt"
            files["flags"].write_text(" ".join(winner.flags) + "\n")
    files["search"] = saved
    outcome.files = files
    return OptimizeResult(
        trajectory=t,
        winner=winner.text if winner is not None else None,
        flags=list(winner.flags) if winner is not None else [],
        speedup=outcome.speedup,
        baseline_profile=outcome.baseline_profile,
        files=files,
    )
