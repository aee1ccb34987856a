"""`--executor ray`: a check run as a Ray task on a cluster the command starts on loopback (two CPUs,
no dashboard) prints what a local check prints. One test: each run starts and stops a cluster."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support import FIXTURES

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None,
        reason="ray is not installed (pip install 'optiml[ray]'; the dev extra has it)",
    ),
    pytest.mark.xdist_group("ray"),
]


def optiml(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "optiml.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_check_on_a_ray_cluster_prints_what_a_local_check_prints():
    args = ("check", str(FIXTURES / "saxpy.cu"), "--json", "--arch", "sm_90")
    local = optiml(*args)
    on_ray = optiml(*args, "--executor", "ray")
    assert local.returncode == 0, local.stderr
    assert (on_ray.returncode, on_ray.stdout, on_ray.stderr) == (0, local.stdout, local.stderr)
