"""`optiml worker` on its own: a hello, then one JSON line per request line (the result as `--json`
prints it, or an error with its exit code), and nothing else on stdout."""

from __future__ import annotations

import json
import subprocess
import sys

from optiml import __version__
from tests.support import FIXTURES

OPTIML = [sys.executable, "-m", "optiml.cli"]


def test_the_worker_answers_each_line_and_prints_nothing_else():
    saxpy = FIXTURES / "saxpy.cu"
    check = {"command": "check", "path": str(saxpy), "text": saxpy.read_text(), "arch": "sm_90"}
    lines = [
        json.dumps(check),
        json.dumps({**check, "kernel": "saxpi"}),
        "not json",
        json.dumps({**check, "optiml": "0.0.1"}),
    ]
    p = subprocess.run(
        [*OPTIML, "worker"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    hello, *replies = [json.loads(line) for line in p.stdout.splitlines()]
    assert hello["optiml"] == __version__ and isinstance(hello["gpus"], list)
    local = subprocess.run(
        [*OPTIML, "check", str(saxpy), "--json", "--arch", "sm_90"], capture_output=True, text=True
    )
    assert replies[0] == json.loads(local.stdout)
    assert replies[1]["error"]["exit_code"] == 4
    assert "did you mean `saxpy`?" in replies[1]["error"]["message"]
    assert replies[2]["error"]["exit_code"] == 1
    assert replies[2]["error"]["message"].startswith("not a request OptiML understands")
    assert replies[3]["error"]["exit_code"] == 19
    assert "0.0.1" in replies[3]["error"]["message"]
    assert len(replies) == 4
