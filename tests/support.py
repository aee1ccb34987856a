"""What several test modules share: the fixtures folder and its manifest, and the `optiml` command
run as a user runs it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
MANIFEST: list[dict] = tomllib.loads((FIXTURES / "manifest.toml").read_text())["fixture"]
GOOD = [e for e in MANIFEST if e["verdict"] == "ok"]
BROKEN = [e for e in MANIFEST if e["verdict"] != "ok"]


def load_script(relative: str, name: str) -> ModuleType:
    """A script of the tree that is not a package (`benchmarks/kernelbench.py`,
    `tools/cli_reference.py`) as a module named `name`, registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fixture_ids(entries: list[dict]) -> list[str]:
    return [f"{e['file']}::{e['kernel']}" for e in entries]


# Kernels written as people write them, not in the catalog's style (fixtures/wild/): `file` is made
# relative to fixtures/ like the others'.
WILD: list[dict] = [
    {**e, "file": f"wild/{e['file']}", "verdict": "ok"}
    for e in tomllib.loads((FIXTURES / "wild" / "manifest.toml").read_text())["fixture"]
]

# Kernels written apart from the catalog, to measure it on code it was not shaped to
# (fixtures/holdout/): `file` relative to fixtures/.
HOLDOUT: list[dict] = [
    {**e, "file": f"holdout/{e['file']}", "verdict": "ok"}
    for e in tomllib.loads((FIXTURES / "holdout" / "manifest.toml").read_text())["kernel"]
]


# `optiml` as a user runs it: this checkout's package, in a process of its own.
OPTIML = [sys.executable, "-m", "optiml.cli"]


def run_optiml(
    *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None, timeout=120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OPTIML, *args],
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        cwd=cwd,
        timeout=timeout,
    )


def the_one_line(stderr: str) -> str:
    """The one line a failure prints on stderr: exactly one that is not blank, and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


def norm_rows(sizes: str) -> str:
    """A layer norm a thread per row (B rows of L floats, `sizes` its spec's): over few long rows,
    a slow kernel with passes that read the row again."""
    return NORM_ROWS.replace("{sizes}", sizes)


NORM_ROWS = """
/* @optiml
 *   args:   x: in float[B * L], y: out float[B * L]
 *   launch: grid = cdiv(B, 64), block = 64
 *   sizes:  B, L = {sizes}
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void norm_rows(const float* x, float* y, int B, int L)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const float* r = x + (size_t)b * L;
    float s = 0.f;
    for (int i = 0; i < L; i++) s += r[i];
    float mean = s / L, q = 0.f;
    for (int i = 0; i < L; i++) q += (r[i] - mean) * (r[i] - mean);
    float inv = rsqrtf(q / L + 1e-5f);
    for (int i = 0; i < L; i++) y[(size_t)b * L + i] = (r[i] - mean) * inv;
}
"""
