"""A NumPy reference runs in a process of its own whose address space is bounded
(optiml/harness/evaluate.py `_numpy_expected`): it gives the outputs it gives in-process; one that
needs more memory than that at a size fails there with `ReferenceTooLarge` naming the size, which
`evaluate` moves to the sizes the kernel as written checks; the optimizer is not what the OOM
killer takes. No GPU."""

from __future__ import annotations

import numpy as np
import pytest

from optiml.harness import evaluate as ev
from optiml.harness.evaluate import (
    CasePlan,
    ReferenceFailed,
    ReferenceTooLarge,
    _numpy_expected,
    _numpy_outputs,
)
from optiml.spec import load

KERNEL = r"""
/* @optiml
 *   args:      x: in float[n], y: out float[n]
 *   launch:    grid = cdiv(n, 256), block = 256
 *   sizes:     n = 4096, 1001
 *   reference: ref.py:{function}
 */
__global__ void twice(const float* x, float* y, int n)
{{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}}
"""

REFERENCE = """
import os
import time

import numpy as np

def twice(x, y, n):
    return (2.0 * np.asarray(x, dtype=np.float64),)

def greedy(x, y, n):
    # a window gathered at once, as a generated transposed convolution's: at 4096, three quarters
    # of the machine's memory (an allocation that succeeds where nothing bounds the process)
    if n > 2000:
        np.empty(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4, dtype=np.uint8)
    return (2.0 * np.asarray(x, dtype=np.float64),)

def slow(x, y, n):
    if n > 2000:
        time.sleep(30)
    return (2.0 * np.asarray(x, dtype=np.float64),)

def broken(x, y, n):
    raise ValueError("no such axis")
"""


def _spec(tmp_path, function: str):
    (tmp_path / "ref.py").write_text(REFERENCE)
    path = tmp_path / f"{function}.cu"
    path.write_text(KERNEL.format(function=function))
    _, _, spec = load(path, "twice")
    plans = [CasePlan(sizes=s) for s in spec.sizes]
    cases = [spec.case(p.sizes) for p in plans]
    return spec, cases, plans


def test_the_outputs_from_the_reference_process_are_those_made_in_process(tmp_path):
    spec, cases, plans = _spec(tmp_path, "twice")
    away = _numpy_expected(spec, cases, plans, (3, 5))
    assert away == _numpy_outputs(spec, cases, plans, (3, 5))
    assert len(away) == 4 and np.frombuffer(away[0], dtype=np.float32).size == 4096


def test_a_reference_that_needs_more_memory_fails_with_its_size_named(tmp_path):
    spec, cases, plans = _spec(tmp_path, "greedy")
    with pytest.raises(ReferenceTooLarge) as e:
        _numpy_expected(spec, cases, plans, (3,))
    assert e.value.label == cases[0].label  # n=4096, not the 1001 after it
    assert "needs more memory" in str(e.value)
    # the smaller size alone is fine
    assert len(_numpy_expected(spec, cases[1:], plans[1:], (3,))) == 1


def test_a_reference_that_raises_is_still_a_reference_failure(tmp_path):
    spec, cases, plans = _spec(tmp_path, "broken")
    with pytest.raises(ReferenceFailed) as e:
        _numpy_expected(spec, cases, plans, (3,))
    assert not isinstance(e.value, ReferenceTooLarge)
    assert "ValueError: no such axis" in str(e.value)


def _ok() -> ev.Verdict:
    return ev.Verdict(
        status="ok",
        check="outputs",
        message="ok",
        file="f",
        kernel="twice",
        reference="r",
        arch="sm_90",
        nvcc_version="13.0",
        date="2026-12-07",
    )


def test_evaluate_moves_a_size_numpy_cannot_hold_to_the_kernels_sizes(tmp_path, monkeypatch):
    spec, cases, _ = _spec(tmp_path, "greedy")
    source, kernel, _ = load(tmp_path / "greedy.cu", "twice")
    calls = []

    def stand_in(source, kernel, spec, candidate, opts):
        sizes = opts.sizes or spec.sizes
        calls.append((tuple(s["n"] for s in sizes), opts.kernel_reference, opts.reference_seconds))
        if not opts.kernel_reference and any(s["n"] > 2000 for s in sizes):
            raise ReferenceTooLarge("needs more memory", cases[0].label)
        return _ok()

    monkeypatch.setattr(ev, "_evaluate", stand_in)
    v = ev.evaluate(source, kernel, spec, options=ev.EvalOptions(time=False))
    assert v.ok
    # every size against NumPy at first (within a time limit: a smaller size is left); then NumPy
    # at 1001 (no limit: nothing smaller to fall back to), the kernel as written at 4096
    assert calls == [
        ((4096, 1001), False, ev.REFERENCE_SECONDS),
        ((1001,), False, None),
        ((4096,), True, None),
    ]


def test_a_reference_slower_than_its_limit_names_the_largest_size(tmp_path):
    spec, cases, plans = _spec(tmp_path, "slow")
    with pytest.raises(ReferenceTooLarge) as e:
        _numpy_expected(spec, cases, plans, (3,), seconds=5.0)
    assert e.value.label == cases[0].label and "did not finish within 5 s" in str(e.value)


def test_optimize_bounds_the_inputs_reference_by_its_wall_time_budget(tmp_path, monkeypatch):
    """`optimize --time 90`: the input's NumPy reference gets a tenth of the budget (9 s) at a
    step's sizes where a smaller size is left, so a slow reference leaves the search its time;
    without a budget, REFERENCE_SECONDS; evaluate's fallback uses the limit it is given."""
    from optiml.search import optimize as opt

    assert opt.reference_limit(90.0, ev.EvalOptions()) == pytest.approx(9.0)
    assert opt.reference_limit(None, ev.EvalOptions()) == ev.REFERENCE_SECONDS
    assert opt.reference_limit(1200.0, ev.EvalOptions()) == ev.REFERENCE_SECONDS

    spec, cases, _ = _spec(tmp_path, "greedy")
    source, kernel, _ = load(tmp_path / "greedy.cu", "twice")
    limits = []

    def stand_in(source, kernel, spec, candidate, opts):
        limits.append(opts.reference_seconds)
        return _ok()

    monkeypatch.setattr(ev, "_evaluate", stand_in)
    ev.evaluate(source, kernel, spec, options=ev.EvalOptions(time=False, reference_limit_s=9.0))
    assert limits == [9.0]
