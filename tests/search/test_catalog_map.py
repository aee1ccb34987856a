"""The 1-D map shape that vectorize and grid_stride rewrite, written as a while loop: proposed where
the loop is exactly a grid-stride loop, refused where it is not (the rewrites' results against the
original: tests/search/test_catalog_host.py, on fixtures/wild/scale_while.cu)."""

from __future__ import annotations

import pytest

from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant

SPEC = """/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = 512, block = 256
 *   sizes:  n = 1 << 22, 1000003
 */
"""
WHILE = """__global__ void twice(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    while (i < n) {
        y[i] = 2.0f * x[i];
        i += blockDim.x * gridDim.x;
    }
}
"""


def proposes(text: str) -> set[str]:
    ctx = Context.of(Variant(SPEC + text), "kernel.cu", "twice")
    return {name for name in ("vectorize", "grid_stride") if by_name(name).propose(ctx)}


def test_a_while_grid_stride_loop_is_a_map():
    assert proposes(WHILE) == {"vectorize", "grid_stride"}
    ctx = Context.of(Variant(SPEC + WHILE), "kernel.cu", "twice")
    (first, *_) = by_name("vectorize").propose(ctx)
    text = first.variant.text
    assert "while" not in text and "optiml_pack<float, 4>" in text
    assert "for (int i = optiml_tail + optiml_first; i < optiml_n; i += optiml_stride)" in text


@pytest.mark.parametrize(
    "why,old,new",
    [
        ("a block stride, not the grid's", "i += blockDim.x * gridDim.x;", "i += blockDim.x;"),
        (
            "the step before the work",
            "        y[i] = 2.0f * x[i];\n        i += blockDim.x * gridDim.x;",
            "        i += blockDim.x * gridDim.x;\n        y[i] = 2.0f * x[i];",
        ),
        (
            "a continue that skips the step",
            "        y[i] = 2.0f * x[i];",
            "        if (x[i] < 0.0f) continue;\n        y[i] = 2.0f * x[i];",
        ),
        ("work after the loop", "    }\n}", "    }\n    if (i == n) y[0] = 0.0f;\n}"),
        ("another bound", "while (i < n)", "while (i <= n - 1)"),
    ],
)
def test_not_a_map(why, old, new):
    assert old in WHILE, why
    assert proposes(WHILE.replace(old, new)) == set(), why
