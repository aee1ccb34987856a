"""Property-based fuzzing of the spec language: whatever a spec comment holds, OptiML answers with
a SpecError or an ExprError (each at a position, on one line), never another exception and never a
hang. Three levels: expressions from a grammar of tokens, mutations of the specs of every fixture
kernel through `parse_spec` and `Spec.case`, and a smaller number of those through `optiml check
--json` in-process (the compile stood in for, so no nvcc is needed).

Bounded for CI (about a minute on two cores); OPTIML_FUZZ=thorough runs ten times as many inputs,
and benchmarks/fuzz_spec.py thousands of seeded ones with a per-input time limit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import optiml.api
import optiml.arch
import optiml.check
from optiml.cli import main
from optiml.errors import ExitCode
from optiml.harness.build import Build
from optiml.harness.nvcc import Resources
from tests.spec_fuzz import mutate, random_expression, run_expression, run_spec, spec_sites
from tests.spec_fuzz import time_limit as within

SITES = spec_sites()
LIMIT_S = 5.0  # a hang, not a slow input: every input here takes milliseconds

_SCALE = 10 if os.environ.get("OPTIML_FUZZ") == "thorough" else 1
for name, examples in (("expressions", 2000), ("specs", 3000), ("cli", 1000)):
    settings.register_profile(
        f"spec-fuzz-{name}",
        max_examples=examples * _SCALE,
        deadline=timedelta(seconds=2),
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )


def test_every_fixture_spec_is_fuzzed():
    files = {s.path.relative_to(s.path.parents[1]).parts[0] for s in SITES}
    assert len(SITES) >= 40 and "wild" in files


@settings(settings.get_profile("spec-fuzz-expressions"))
@given(st.randoms(use_true_random=False))
def test_expressions_fail_only_with_expr_error(rng):
    text = random_expression(rng)
    note(f"expression: {text!r}")
    with within(LIMIT_S):
        assert run_expression(text) in ("ok", "ExprError")


@pytest.mark.parametrize(
    "text", ["10**10**10", "(n + 1) ** 9223372036854775807", "1 << (1 << 62)", "n" + "**n" * 900]
)
def test_expressions_that_would_run_for_ever_fail_at_once(text):
    with within(0.5):
        assert run_expression(text) == "ExprError"


@settings(settings.get_profile("spec-fuzz-specs"))
@given(st.sampled_from(SITES), st.randoms(use_true_random=False))
def test_mutated_specs_fail_only_with_spec_or_expr_error(site, rng):
    text = mutate(site, rng)
    note(f"{site.path.name}, mutated spec: {text[site.start : site.end + 200]!r}")
    with within(LIMIT_S):
        outcomes = run_spec(text, site.path)
    assert set(outcomes) <= {"ok", "SpecError"}  # a spec that parses has evaluated every size


# ---- through the command line ------------------------------------------------------------------

DOCUMENTED = {int(c) for c in ExitCode} - {int(ExitCode.INTERNAL)}


@pytest.fixture(scope="module")
def compile_stood_in():
    """`optiml check` without nvcc: every kernel compiles, with 40 registers and 1 KB of shared
    memory, so that the static report (occupancy, notes) still runs on every mutated spec."""

    def build(source, instantiations, *, arch, flags=()):
        found = [
            Resources(
                mangled=k.short_name,
                name=f"void {k.name}()",
                arch=arch,
                registers=40,
                static_smem_bytes=1024,
            )
            for k in source.kernels
        ]
        return Build(
            ok=True, path=Path(os.devnull), messages=[], resources=None, all_resources=found
        )

    with pytest.MonkeyPatch.context() as m:
        m.setattr(optiml.check, "build_device_code", build)
        m.setattr(optiml.api, "find_toolkit", lambda: None)
        m.setattr(optiml.arch, "_toolkit", lambda: None)
        yield


@settings(
    settings.get_profile("spec-fuzz-cli"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from(SITES), st.randoms(use_true_random=False))
def test_check_json_answers_every_mutated_spec_with_a_documented_exit(compile_stood_in, site, rng):
    text = mutate(site, rng)
    note(f"{site.path.name}, mutated spec: {text[site.start : site.end + 200]!r}")
    with tempfile.TemporaryDirectory(prefix="optiml-fuzz-") as tmp:
        # the file keeps its name and its NumPy references, so a reference can still be found
        for ref in site.path.parent.glob("*.py"):
            shutil.copy(ref, tmp)
        f = Path(tmp) / site.path.name
        f.write_text(text, encoding="utf-8")
        with within(LIMIT_S):
            r = CliRunner().invoke(main, ["check", "--json", str(f)])
    assert "Traceback" not in r.output, r.output
    assert r.exit_code in DOCUMENTED, (r.exit_code, r.stderr)
    json.loads(r.stdout)
    errors = r.stderr.splitlines()
    if r.exit_code == 0:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith("optiml: error: "), r.stderr
