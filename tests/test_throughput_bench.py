"""benchmarks/throughput.py's reading of a trajectory: the search's rate between its first and
last progress point, the evaluations' statuses, and what their steps took, summed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_script

ROOT = Path(__file__).resolve().parent.parent
bench = load_script("benchmarks/throughput.py", "throughput_bench")


def test_a_runs_rate_and_where_its_evaluations_time_went():
    t = json.loads((ROOT / "benchmarks/results/optimize-sgemm-h200-trajectory.json").read_text())
    r = bench.rate(t)
    evaluated = [n["measurement"] for n in t["nodes"] if n.get("edit") and n.get("measurement")]
    assert sum(r["statuses"].values()) == len(evaluated) > 0
    for key in ("compile_s", "run_s", "profile_s"):
        assert r["evaluation_steps_s"][key] == pytest.approx(
            sum(m.get(key) or 0.0 for m in evaluated), abs=0.06
        )
    assert r["evaluation_steps_s"]["run_s"] > 0
    first, last = t["progress"][0], t["progress"][-1]
    span = last["seconds"] - first["seconds"]
    assert r["per_minute"] == pytest.approx(
        60.0 * (last["evaluations"] - first["evaluations"]) / span, abs=0.06
    )
    # each result's time, in order: the gaps between them are where the span went
    assert r["results_at_s"] == [round(p["seconds"], 2) for p in t["progress"]]
    assert r["results_at_s"] == sorted(r["results_at_s"]) and len(r["results_at_s"]) > 1


def test_each_evaluation_is_named_with_its_edit_status_and_steps():
    t = json.loads((ROOT / "benchmarks/results/optimize-sgemm-h200-trajectory.json").read_text())
    r = bench.rate(t)
    nodes = [n for n in t["nodes"] if n.get("edit") and n.get("measurement")]
    assert len(r["evaluated"]) == len(nodes)
    assert {e["edit"] for e in r["evaluated"]} == {n["edit"]["transform"] for n in nodes}
    assert all(e["status"] and e["depth"] >= 1 for e in r["evaluated"])
    started = [e["started_s"] for e in r["evaluated"] if e["started_s"] is not None]
    assert started == sorted(started)
    tiled = next(e for e in r["evaluated"] if e["edit"] == "gemm_tiling")
    assert tiled["params"] and tiled["compile_s"] is not None
