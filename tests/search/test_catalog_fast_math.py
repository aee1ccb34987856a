"""fast_math writes approximate float math into the kernel's text (what is delivered is the file, not
nvcc flags): float divisions become __fdividef, float math calls the hardware's approximations, and
nothing else changes — double and integer divisions, divisions by a power of two, a `/=` on a target
with side effects."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against

FAST = by_name("fast_math")
ROOT = Path(__file__).resolve().parents[2]

KERNEL = """\
#include <math.h>
/* @optiml
 *   args:   x: in float[n], y: out float[n], s = 3.0
 *   sizes:  n = 4096, 1001
 *   launch: grid = cdiv(n, 256), block = 256
 *   tol:    rtol = RTOL, atol = 1e-6
 */
__global__ void k(const float* x, float* y, int n, float s)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = x[i];
    double d = 3.0;
    float c = (a / s) / (1.5f + expf(-a / (float)n));
    c /= s;
    y[i++ % 1] /= 1.0f;
    float e = a / 2;
    double f = d / a;
    int q = i / 3;
    for (int j = 0; j < 2; ++j) { float t = j / 3.0f; c += t; }
    y[i - 1] = c + e + (float)f + q + logf(a * a + 1.0f) / 7.0f;
}
"""


def context(rtol: str) -> Context:
    return Context.of(Variant(KERNEL.replace("RTOL", rtol)), str(ROOT / "k.cu"), "k")


def body(text: str) -> str:
    return text[text.index("__global__") :]


def test_float_divisions_become_fdividef_and_nothing_else_changes():
    (p,) = FAST.propose(context("1e-5"))  # 1e-5: divisions only, the math calls stay
    assert p.params == {"math": "approx-div"} and p.variant.flags == context("1e-5").variant.flags
    text = body(p.variant.text)
    assert "c = __fdividef((__fdividef(a, s)), (1.5f + expf(__fdividef(-a, (float)n))));" in text
    assert "c = __fdividef(c, s);" in text
    assert "float t = __fdividef(j, 3.0f);" in text  # an int over a float is float arithmetic
    assert "__fdividef(logf(a * a + 1.0f), 7.0f)" in text
    # as written: a power of two, double and integer arithmetic, a target with a side effect
    for kept in ("a / 2;", "d / a;", "i / 3;", "y[i++ % 1] /= 1.0f;"):
        assert kept in text, kept
    assert "expf(" in text and "__expf" not in text


def test_math_calls_become_intrinsics_where_the_tolerance_allows():
    div, fast = FAST.propose(context("1e-4"))
    assert fast.params == {"math": "intrinsics"}
    text = body(fast.variant.text)
    assert "__expf(__fdividef(-a, (float)n))" in text and "__logf(a * a + 1.0f)" in text
    assert "expf(" not in text.replace("__expf(", "")
    assert FAST.propose(context("1e-6")) == []  # tighter than approximate division


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_rewritten_kernels_compute_what_it_does(tmp_path):
    ctx = context("1e-4")
    candidates = [Context.of(p.variant, ctx.source.path, "k") for p in FAST.propose(ctx)]
    assert len(candidates) == 2
    assert run_against(ctx, candidates, [{"n": 4096}, {"n": 1001}], tmp_path) == [0, 0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("which", ["warp", "cluster"])
def test_a_welford_row_norms_division_is_rewritten_and_compiles(which):
    # a row norm's one-pass mean and variance (Welford) divide per element: a warp per row of the
    # layernorm fixture, a block and a cluster per long row
    from tests.search.test_catalog_warp_rows import _long_rows
    from tests.search.test_catalog_warp_rows import context as fixture

    ctx = fixture("layernorm.cu", "layernorm_forward") if which == "warp" else _long_rows("norm")[0]
    rows = by_name("warp_rows").propose(ctx)
    assert rows
    for r in rows:
        inner = Context.of(r.variant, ctx.source.path, ctx.kernel.name)
        (p,) = [p for p in FAST.propose(inner) if p.params == {"math": "approx-div"}]
        assert "optiml_d / " not in p.variant.text and "__fdividef(optiml_d, " in p.variant.text
        v = SourceFile(p.variant.text, ctx.source.path)
        k = v.kernel(ctx.kernel.name)
        b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
        assert b.ok, b.log[-2000:]


MAX_INIT = """\
/* @optiml
 *   args:   x: in float[n * k], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n, k = (1000, 16)
 *   tol:    rtol = 1e-4
 */
__global__ void row_max_over_scale(const float* x, float* y, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float m = -INFINITY;
    for (int j = 0; j < k; ++j) m = fmaxf(m, x[i * k + j] / 3.0f);
    y[i] = m / INFINITY + m / HUGE_VALF + m / 1e400f;
}
"""


def test_infinite_literals_are_no_power_of_two_and_end():
    """`m = -INFINITY` is read as a literal too (Python's float() takes "infinity"): halving it
    never ended, and the search's catalog never came back (KernelBench's max pooling)."""
    import threading

    from optiml.search.catalog.fast_math import _power_of_two

    assert [_power_of_two(t) for t in ("INFINITY", "-INFINITY", "nan", "0.0f", "1e400f")] == [
        False
    ] * 5
    assert [_power_of_two(t) for t in ("2.0f", "0.25", "1024", "-8.0")] == [True] * 4
    assert not _power_of_two("3.0f")
    ctx = Context.of(Variant(MAX_INIT), str(ROOT / "fixtures" / "kernel.cu"), "row_max_over_scale")
    found: list = []
    worker = threading.Thread(target=lambda: found.append(FAST.propose(ctx)), daemon=True)
    worker.start()
    worker.join(30)
    assert found, "fast_math did not come back"
    (text,) = {p.variant.text for p in found[0]}
    assert "__fdividef(x[i * k + j], 3.0f)" in text and "m / INFINITY" in text
