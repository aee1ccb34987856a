"""How a run's result becomes a verdict, from what the runner sends back (no GPU): each verdict names
the check that decided it; a wrong result says where and how far off against what the spec allows;
a result without the run's nonce, or with nothing checked, is never `ok`."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources

import pytest

from optiml.cuda.types import DTYPES
from optiml.harness.evaluate import EvalOptions, _Outcome, _verdict_of
from optiml.harness.verdict import (
    BufferCheck,
    CaseResult,
    CaseTiming,
    FirstBad,
    GuardViolation,
    InputChange,
    LaunchConfig,
    Mismatch,
    OracleCheck,
    SeedCheck,
    TimingStats,
)
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
NONCE = "5f0c"


def case(buffer: BufferCheck | None = None, **more) -> CaseResult:
    ok = BufferCheck(name="y", mismatches=0, unwritten=0, max_abs_error=0.0, max_rel_error=0.0)
    return CaseResult(
        label="M=16384, N=4096",
        launch={"candidate": LaunchConfig(grid=[2048, 1, 1], block=[256, 1, 1], smem=0)},
        seeds=[SeedCheck(seed=1, buffers=[buffer or ok])],
        **more,
    )


def verdict(cases: list[CaseResult], tolerances=None, *, nonce=NONCE, n_cases=None):
    result = json.dumps(
        {"nonce": nonce, "status": "done", "cases": [c.model_dump() for c in cases]}
    )
    return _verdict_of(
        _Outcome(returncode=0, stderr="", stdout="", seconds=1.0, result=result),
        [None] * (len(cases) if n_cases is None else n_cases),
        BASE,
        EvalOptions(),
        tolerances,
        nonce=NONCE,
    )


def stats(ms: float) -> TimingStats:
    return TimingStats(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, reps=20)


def test_a_wrong_result_says_how_far_off_against_the_tolerance():
    y = BufferCheck(
        name="y",
        mismatches=250,
        unwritten=0,
        max_abs_error=2.16e-05,
        max_rel_error=3.7e-05,
        need_atol=1.2e-5,
        need_rtol=2.2e-5,
        first=[Mismatch(index=6, expected="0.588793218", got="0.588771582")],
    )
    v = verdict([case(y)], {"y": (1e-5, 1e-5)})
    assert v.status == "wrong_result" and v.check == "outputs"
    assert v.message.startswith(
        "y[6] is 0.588771582, expected 0.588793218 at M=16384, N=4096, seed 1: 250 of the "
        "elements differ; the largest difference is 2.16e-05, allowed 1e-05 + 1e-05·|expected|"
    )
    assert "it would pass with atol = 1.2e-05 (rtol 1e-05) or rtol = 2.2e-05" in v.message


def test_outside_the_tolerance_says_how_far_both_are_from_the_exact_result():
    y = BufferCheck(
        name="y",
        mismatches=3,
        unwritten=0,
        max_abs_error=0.5,
        max_rel_error=0.5,
        oracle=OracleCheck(candidate=900.0, reference=2.0, accepted=False),
        first=[Mismatch(index=0, expected="1", got="1.5")],
    )
    v = verdict([case(y)], {"y": (1e-5, 1e-5)})
    assert "off by 900 tolerances, the reference by 2" in v.message


def test_unwritten_elements_only_are_not_measured_against_the_tolerance():
    y = BufferCheck(
        name="y",
        mismatches=3,
        unwritten=3,
        max_abs_error="inf",
        max_rel_error="inf",
        first=[Mismatch(index=997, expected="1.5", got="(unwritten)", unwritten=True)],
    )
    v = verdict([case(y)], {"y": (1e-5, 1e-5)})
    assert v.message.endswith("3 of the elements differ (3 unwritten)")


def test_integer_outputs_have_no_tolerance_to_quote():
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
    v = verdict([case(bins)], tolerances)
    assert v.message.endswith("1 of the elements differ")


def test_a_result_without_the_runs_nonce_is_not_the_runners():
    v = verdict([case()], nonce="forged")
    assert v.status == "runtime_error" and v.check == "runner"
    assert "nonce" in v.message


def test_zero_checked_cases_is_never_ok():
    assert verdict([]).status == "runtime_error"
    v = verdict([case()], n_cases=3)  # fewer cases came back than were planned
    assert v.status == "runtime_error" and v.check == "checked cases"


def test_a_changed_input_is_its_own_verdict():
    v = verdict([case(input_changes=[InputChange(buffer="x", when="at timed launch 7")])])
    assert v.status == "modified_input" and v.check == "input checksums"
    assert (
        "changed `x`, which the spec declares `in`" in v.message and "timed launch 7" in v.message
    )


def test_a_write_past_a_buffer_is_caught_by_the_guard_regions():
    v = verdict([case(guard_violations=[GuardViolation(buffer="y", bytes=4, when="at seed 1")])])
    assert v.status == "runtime_error" and v.check == "guard regions"
    assert "wrote outside `y`" in v.message and "4 byte(s)" in v.message


def test_wrong_outputs_of_a_timed_launch_fail_a_candidate_right_when_checked():
    timing = CaseTiming(
        candidate=stats(0.1),
        reference=stats(1.0),
        warmup_rounds=2,
        sm_clock_mhz=[1980, 1980],
        fresh_inputs=True,
        checked_launches=9,
        compared=True,
        mismatches=4096,
        first_bad=FirstBad(launch=6, buffer="y", index=0),
    )
    v = verdict([case(timing=timing)])
    assert v.status == "wrong_result" and v.check == "timed launches' outputs"
    assert "9 checked timed launches" in v.message and "`y`[0] at timed launch 6" in v.message


def test_ok_names_the_checks_it_passed():
    timing = CaseTiming(
        candidate=stats(0.1),
        reference=stats(1.0),
        warmup_rounds=2,
        sm_clock_mhz=[1980, 1980],
        checked_launches=9,
        compared=True,
    )
    v = verdict([case(timing=timing)])
    assert v.ok and v.check == "outputs, guard regions, input checksums, timed launches' outputs"
    assert "(10.00×)" in v.message


def test_a_runner_that_stops_on_its_own_is_a_verdict_on_the_candidate():
    result = json.dumps(
        {"nonce": NONCE, "status": "harness_error", "failed": "", "message": "plan line 3"}
    )
    v = _verdict_of(
        _Outcome(returncode=2, stderr="", stdout="", seconds=1.0, result=result),
        [None],
        BASE,
        EvalOptions(),
        nonce=NONCE,
    )
    assert v.status == "runtime_error" and v.check == "runner" and "plan line 3" in v.message


# The oracle's rule (values.h's `within_exact_error`, what the runner decides with), compiled on
# the host: (candidate's error, reference's error, against the exact result, in tolerances).
RULE = r"""
#include "values.h"
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2)
    std::printf("%d\n", within_exact_error(std::atof(argv[i]), std::atof(argv[i + 1])) ? 1 : 0);
}
"""


def test_the_oracle_holds_a_candidate_to_the_tolerance_or_to_an_unreachable_ones_reference(
    tmp_path,
):
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    (tmp_path / "values.h").write_text(
        resources.files("optiml.harness").joinpath("values.h").read_text()
    )
    (tmp_path / "rule.cpp").write_text(RULE)
    subprocess.run(
        ["g++", "-std=c++17", "-o", str(tmp_path / "rule"), str(tmp_path / "rule.cpp")], check=True
    )
    cases = {
        (0.9, 0.1): 1,  # within the tolerance of the exact result
        (
            1.31,
            0.838,
        ): 0,  # the reference is within it: so must the candidate be (one-pass variance)
        (4.32, 2.6): 1,  # neither is: the same sum in another order (KernelBench 62 on an H100)
        (5.59, 3.44): 1,  # (KernelBench 64)
        (13.9, 5.24): 1,  # (64's 64 x 128 tile, wide inputs)
        (4.71, 1.86): 1,  # (KernelBench 58, spiked inputs)
        (11.0, 2.6): 0,  # more than four times the reference's own error
        (18.7, 0.000226): 0,  # a sum that skips its tail
        (1e6, 2.0): 0,  # a lower precision
        (float("nan"), 2.0): 0,
    }
    args = [f"{x!r}" for pair in cases for x in pair]
    out = subprocess.run(
        [str(tmp_path / "rule"), *args], capture_output=True, text=True, check=True
    )
    assert [int(x) for x in out.stdout.split()] == list(cases.values())
