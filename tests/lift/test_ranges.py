"""Value ranges on the lifted model (optiml.lift.ranges): clamps, selects, the spec's input
ranges, guards and integer arithmetic bound an index; what is not bounded stays unbounded."""

from __future__ import annotations

import math

import pytest

from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, lift
from optiml.lift.model import Store
from optiml.lift.ranges import Env, indices_within, interval
from optiml.spec import parse_spec

TEMPLATE = """
/* @optiml
 *   args:   x: in float[n], k: in int[n] in [-5, 40), out: inout int[m], m = 32
 *   launch: grid = cdiv(n, 64), block = 64
 *   sizes:  n = 1000, 77
 */
__global__ void f(const float* x, const int* k, int* out, int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    BODY
}
"""


def model(body: str):
    text = TEMPLATE.replace("BODY", body)
    src = SourceFile(text, "k.cu")
    kern = src.kernels[0]
    spec = parse_spec(src, kern)
    lifted = lift(src, kern, spec)
    assert isinstance(lifted, Lifted), lifted.message()
    return lifted, spec


def span(body: str) -> tuple[float, float]:
    lifted, spec = model(body)
    (store,) = [s for s in lifted.body if isinstance(s, Store)]
    return interval(store.index, Env.of(lifted, spec, spec.cases()[0]))


@pytest.mark.parametrize(
    "body,lo,hi",
    [
        ("atomicAdd(&out[k[i]], 1);", -5, 39),  # the spec's range, half-open for integers
        ("atomicAdd(&out[k[i] % m], 1);", -31, 31),  # a remainder of what may be negative
        ("atomicAdd(&out[(k[i] + 5) / 2], 1);", 0, 22),
        ("int b = (int)(x[i] * m); b = b < 0 ? 0 : b; atomicAdd(&out[min(b, m - 1)], 1);", 0, 31),
        ("atomicAdd(&out[max(0, min((int)floorf(x[i]), m - 1))], 1);", 0, 31),
        ("atomicAdd(&out[i & 15], 1);", 0, 15),
    ],
)
def test_bounded(body, lo, hi):
    assert span(body) == (lo, hi)


def test_a_float_bin_without_a_clamp_is_unbounded():
    lo, hi = span("atomicAdd(&out[(int)(x[i] * m)], 1);")
    assert math.isinf(lo) and math.isinf(hi)


def test_a_guard_narrows_the_index_and_proves_the_stores():
    lifted, spec = model("int b = k[i]; if (b >= 0 && b < m) atomicAdd(&out[b], 1);")
    assert indices_within(lifted, spec, "out")
    lifted, spec = model("int b = k[i]; if (b < m) atomicAdd(&out[b], 1);")
    assert not indices_within(lifted, spec, "out")
