"""The long-lived report reader: one worker for many reports, and a report that it cannot read, or
that takes the worker down, costs that report only (the caller falls back on the CSV pages).

The worker runs the real reader program; `ncu_report` (Nsight Compute's module, absent here) is
replaced by a small module with its interface that reads a JSON file, so that the protocol and the
worker's life are what is tested. On a GPU machine the profile tests read real reports with it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from optiml.profile.ncu import _ReaderProcess

MODULE = textwrap.dedent(
    """
    import json, os

    class Metric:
        def __init__(self, value):
            self._value = value
        def has_correlation_ids(self):
            return False
        def value(self):
            return self._value
        def unit(self):
            return "ns"

    class Action:
        def __init__(self, data):
            self._data = data
        def metric_names(self):
            return list(self._data["metrics"])
        def metric_by_name(self, name):
            return Metric(self._data["metrics"][name])
        def name(self):
            return self._data["kernel"]
        def rule_results_as_dicts(self):
            if self._data.get("rules") == "broken":
                raise KeyError("layout")
            return []

    class Range:
        def __init__(self, data):
            self._data = data
        def action_by_idx(self, i):
            return Action(self._data)

    class Context:
        def __init__(self, data):
            self._data = data
        def range_by_idx(self, i):
            return Range(self._data)

    def load_report(path):
        with open(path) as f:
            data = json.load(f)
        if data.get("exit"):
            os._exit(3)
        data["metrics"]["worker.pid"] = os.getpid()
        return Context(data)
    """
)


@pytest.fixture
def module_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ncu_python"
    d.mkdir()
    (d / "ncu_report.py").write_text(MODULE)
    return d


def report(tmp_path: Path, name: str, **data) -> Path:
    p = tmp_path / f"{name}.ncu-rep"
    p.write_text(json.dumps({"kernel": name, "metrics": {"gpu__time_duration.sum": 1.5}, **data}))
    return p


@pytest.fixture
def read(module_dir):
    """Read reports with one worker, closed after the test."""
    reader = _ReaderProcess()
    yield lambda path: reader.read(module_dir, path)
    reader.close()


def test_one_worker_reads_many_reports(tmp_path, read):
    first, rules_read = read(report(tmp_path, "saxpy"))
    second, _ = read(report(tmp_path, "axpby"))
    assert (first.kernel, second.kernel) == ("saxpy", "axpby") and rules_read
    assert first.number("gpu__time_duration.sum") == 1.5
    assert first.metrics["gpu__time_duration.sum"].unit == "ns"
    assert first.number("worker.pid") == second.number("worker.pid")


def test_a_report_it_cannot_read_costs_that_report_only(tmp_path, read):
    before, _ = read(report(tmp_path, "a"))
    assert read(tmp_path / "missing.ncu-rep") is None
    after, _ = read(report(tmp_path, "b"))
    assert before.number("worker.pid") == after.number("worker.pid")


def test_a_worker_that_dies_is_replaced(tmp_path, read):
    before, _ = read(report(tmp_path, "a"))
    assert read(report(tmp_path, "fatal", exit=True)) is None
    after, _ = read(report(tmp_path, "b"))
    assert after.kernel == "b" and before.number("worker.pid") != after.number("worker.pid")


def test_unreadable_rules_are_said_so(tmp_path, read):
    data, rules_read = read(report(tmp_path, "k", rules="broken"))
    assert data.kernel == "k" and data.rules == [] and not rules_read


def test_what_the_module_prints_does_not_break_a_reply(tmp_path, module_dir, read):
    (module_dir / "ncu_report.py").write_text(
        "print('ncu_report loaded')\n"
        + MODULE.replace(
            "def load_report(path):", "def load_report(path):\n    print('loading', path)"
        )
    )
    first, _ = read(report(tmp_path, "a"))
    second, _ = read(report(tmp_path, "b"))
    assert (first.kernel, second.kernel) == ("a", "b")
    assert first.number("worker.pid") == second.number("worker.pid")
