"""fixtures/holdout stays what it claims: every kernel passes `optiml check` and computes what its
float64 NumPy reference does, run as host C++ at its small size for two seeds (its own script,
fixtures/holdout/check.py, which exits non-zero on any mismatch)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import FIXTURES, HOLDOUT


@pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("nvcc") is None, reason="needs g++ and nvcc"
)
def test_every_holdout_kernel_computes_its_reference():
    done = subprocess.run(
        [sys.executable, str(FIXTURES / "holdout" / "check.py")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{len(HOLDOUT)} passed, 0 failed" in done.stdout
    assert len(HOLDOUT) >= 30
