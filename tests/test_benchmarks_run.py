"""The CPU-side benchmarks still run, at tiny sizes: a benchmark that nothing runs rots (the large
file's and the language server's latency both broke at the one-door refactor and were found only
when re-measured). Their figures come from full runs; these check that a run completes and writes
what the README cites."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_the_large_file_benchmark_runs(tmp_path):
    out = tmp_path / "large.json"
    done = _run(["benchmarks/large_file.py", "--out", str(out), "--kernels", "12"], 600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["check"]["exit_code"] == 0 and report["check_over_nvcc"] > 0
    assert report["inlay_hints_in_process"]["hints"] == 12
    assert report["inlay_hints_lsp"]["hints"] == 12


def test_the_language_server_latency_benchmark_runs(tmp_path):
    out = tmp_path / "latency.json"
    args = ["--lines", "200", "--requests", "5", "--evaluations", "1"]
    done = _run(["benchmarks/lsp_latency.py", "--out", str(out), *args], 600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    for result in report["results"]:
        assert result["requests"]["textDocument/codeAction"]["n"] > 0
        assert result["while_optimizing"]["evaluated"] == "1/1"


def test_the_catalog_coverage_benchmark_runs(tmp_path):
    out = tmp_path / "coverage.json"
    done = _run(["benchmarks/catalog_coverage.py", "--out", str(out), "--sets", "wild"], 600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    wild = report["sets"]["wild"]
    assert wild["kernels"] == len(wild["rows"]) > 0
    assert wild["with_a_rewrite"] == sum(bool(r["rewrites"]) for r in wild["rows"])
    assert report["date"] and report["commit"]
