"""How a run's result becomes a verdict, from the runner's result file (no GPU): a wrong result
says where, and how far off against what the spec allows."""

from __future__ import annotations

import json

from optiml.cuda.types import DTYPES
from optiml.harness.evaluate import EvalOptions, _Outcome, _verdict_of
from optiml.harness.verdict import BufferCheck, CaseResult, LaunchConfig, Mismatch, SeedCheck
from optiml.spec import load
from tests.support import FIXTURES

BASE = {
    "file": "gemv.cu",
    "kernel": "gemv",
    "reference": "gemv.cu::gemv",
    "arch": "sm_90",
    "nvcc_version": "13.0.88",
    "date": "2026-12-03T14:00:00+00:00",
}


def result_file(tmp_path, buffer: BufferCheck):
    case = CaseResult(
        label="M=16384, N=4096",
        launch={"candidate": LaunchConfig(grid=[2048, 1, 1], block=[256, 1, 1], smem=0)},
        seeds=[SeedCheck(seed=1, buffers=[buffer])],
    )
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"status": "done", "cases": [case.model_dump()]}))
    return path


def verdict(tmp_path, buffer, tolerances):
    return _verdict_of(
        _Outcome(returncode=0, stderr="", stdout="", seconds=1.0),
        result_file(tmp_path, buffer),
        [],
        BASE,
        EvalOptions(),
        tolerances,
    )


def test_a_wrong_result_says_how_far_off_against_the_tolerance(tmp_path):
    y = BufferCheck(
        name="y",
        mismatches=250,
        unwritten=0,
        max_abs_error=2.16e-05,
        max_rel_error=3.7e-05,
        first=[Mismatch(index=6, expected="0.588793218", got="0.588771582")],
    )
    v = verdict(tmp_path, y, {"y": (1e-5, 1e-5)})
    assert v.status == "wrong_result"
    assert v.message == (
        "y[6] is 0.588771582, expected 0.588793218 at M=16384, N=4096, seed 1: 250 of the "
        "elements differ; the largest difference is 2.16e-05, allowed 1e-05 + 1e-05·|expected|"
    )


def test_unwritten_elements_only_are_not_measured_against_the_tolerance(tmp_path):
    y = BufferCheck(
        name="y",
        mismatches=3,
        unwritten=3,
        max_abs_error="inf",
        max_rel_error="inf",
        first=[Mismatch(index=997, expected="1.5", got="(unwritten)", unwritten=True)],
    )
    v = verdict(tmp_path, y, {"y": (1e-5, 1e-5)})
    assert v.message.endswith("3 of the elements differ (3 unwritten)")


def test_integer_outputs_have_no_tolerance_to_quote(tmp_path):
    _, _, spec = load(FIXTURES / "histogram.cu", "histogram_global")
    tolerances = {b.name: spec.tolerance(DTYPES[b.dtype]) for b in spec.buffers}
    (name,) = [b.name for b in spec.buffers if DTYPES[b.dtype].is_float is False and b.role != "in"]
    bins = BufferCheck(
        name=name,
        mismatches=1,
        unwritten=0,
        max_abs_error=2.0,
        max_rel_error=0.5,
        first=[Mismatch(index=3, expected="4", got="6")],
    )
    v = verdict(tmp_path, bins, tolerances)
    assert v.message.endswith("1 of the elements differ")
