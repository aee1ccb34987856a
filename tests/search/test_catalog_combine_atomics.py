"""combine_atomics: a thread's closing atomics into one address, combined by the block first (warp
shuffles, shared memory, one atomic per block). Read on the lifted model; checked against the
original as host C++ (sums, maxima, two totals at once) and compiled with nvcc; refused where a
thread may not reach the barrier, a warp is partial, or the address moves."""

from __future__ import annotations

import shutil

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against
from tests.support import FIXTURES

COMBINE = by_name("combine_atomics")

DOT = """
/* @optiml
 *   args:   a: in float[n], b: in float[n], out: inout float[1]
 *   launch: grid = min(cdiv(n, 128), 64), block = 128
 *   sizes:  n = 1 << 20, 1001
 *   tol:    rtol = 1e-4, atol = 1e-3
 */
__global__ void dot(const float* a, const float* b, float* out, int n)
{
    float s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        s += a[i] * b[i];
    atomicAdd(&out[0], s);
}
"""

# Only positive partial sums are added: the others give the identity.
GUARDED = DOT.replace("    atomicAdd(&out[0], s);", "    if (s > 0.0f) atomicAdd(&out[0], s);")

# Two totals per thread (a mean and a variance's sums), an int max, a while loop.
MOMENTS = """
/* @optiml
 *   args:   x: in int[n] in [0, 1000), sums: inout uint64[2], top: inout int[1]
 *   launch: grid = 40, block = 256
 *   sizes:  n = 1 << 20, 777
 */
__global__ void moments(const int* x, unsigned long long* sums, int* top, int n)
{
    unsigned long long s = 0, q = 0;
    int m = -2147483647 - 1;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    while (i < n) {
        s += x[i];
        q += (unsigned long long)x[i] * x[i];
        m = max(m, x[i]);
        i += gridDim.x * blockDim.x;
    }
    atomicAdd(&sums[0], s);
    atomicAdd(sums + 1, q);
    atomicMax(top, m);
}
"""


def context(text: str, kernel: str) -> Context:
    return Context.of(Variant(text), str(FIXTURES / "kernel.cu"), kernel)


def test_proposes_on_the_corpus_reduction():
    path = FIXTURES / "corpus" / "sum_squares.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "sum_of_squares")
    (p,) = COMBINE.propose(ctx)
    text = p.variant.text
    assert text.count("atomicAdd(") == 1 and "__shfl_down_sync" in text
    assert "if (threadIdx.x == 0) atomicAdd(acc, optiml_v0);" in text


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize(
    "text,kernel,sizes",
    [
        (DOT, "dot", [{"n": 1001}, {"n": 64}]),
        (GUARDED, "dot", [{"n": 1001}, {"n": 64}]),
        (MOMENTS, "moments", [{"n": 777}, {"n": 5000}]),
    ],
    ids=["dot", "guarded", "moments"],
)
def test_combined_totals_equal_the_originals(text, kernel, sizes, tmp_path):
    ctx = context(text, kernel)
    (p,) = COMBINE.propose(ctx)
    assert p.params == {"atomics": 1 if kernel == "dot" else 3}
    candidate = Context.of(p.variant, ctx.source.path, kernel)
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_compiles():
    ctx = context(MOMENTS, "moments")
    (p,) = COMBINE.propose(ctx)
    source = p.variant.source("candidate.cu")
    k = source.kernel("moments")
    built = build_kernel(source, k, instantiation=parse_spec(source, k).instantiation, arch="sm_90")
    assert built.ok, [m.message for m in built.messages]


@pytest.mark.parametrize(
    "old,new",
    [
        (
            "    atomicAdd(&out[0], s);",
            "    if (s > 0) atomicAdd(&out[0], s);\n    else atomicAdd(&out[0], -s);",
        ),  # two atomics under if / else
        ("    float s = 0;", "    float s = 0;\n    if (n == 0) return;"),  # a return
        ("block = 128", "block = 100"),  # a partial warp
        ("block = 128", "block = (32, 4)"),  # a 2-D block
        ("atomicAdd(&out[0], s);", "atomicAdd(&out[blockIdx.x % 1], s);"),  # the address moves
        ("    atomicAdd(&out[0], s);", "    atomicAdd(&out[0], s);\n    s = 0;"),  # not last
    ],
    ids=["if-else", "return", "partial-warp", "2d-block", "moving-address", "not-last"],
)
def test_refused(old, new):
    assert old in DOT
    assert COMBINE.propose(context(DOT.replace(old, new), "dot")) == []
