"""block_reduce and privatize_histogram: they propose on the fixtures and on reductions and
histograms written other ways, every proposal compiles for sm_90 without spills and has the
instructions it is meant to have, and they propose nothing where they cannot prove the rewrite."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from optiml.harness.build import build_device_code, build_kernel, kernel_resources
from optiml.harness.nvcc import find_toolkit
from optiml.search.catalog import Context, Rewrite, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against
from tests.support import FIXTURES

REDUCE = by_name("block_reduce")
HISTOGRAM = by_name("privatize_histogram")


def context(text: str, kernel: str, path: str = "kernel.cu") -> Context:
    return Context.of(Variant(text), path, kernel)


def fixture(name: str, kernel: str) -> Context:
    path = FIXTURES / name
    return context(path.read_text(), kernel, str(path))


def assert_compiles(proposal: Rewrite, kernel: str, *, launcher: bool = False) -> None:
    """nvcc compiles it for sm_90 with no spills: the device code alone, or with the harness's
    launcher as an evaluation builds it."""
    source = proposal.variant.source("candidate.cu")
    k = source.kernel(kernel)
    spec = parse_spec(source, k)
    flags = proposal.variant.flags
    if launcher:
        build = build_kernel(source, k, instantiation=spec.instantiation, arch="sm_90", flags=flags)
        resources = build.resources
    else:
        build = build_device_code(source, {k.name: spec.instantiation}, arch="sm_90", flags=flags)
        resources = kernel_resources(build.all_resources, k)
    assert build.ok, [m.message for m in build.messages]
    assert resources is not None
    spills = (resources.spill_store_bytes, resources.spill_load_bytes)
    assert spills == (0, 0), (proposal.params, resources)


def ptx(proposal: Rewrite, tmp_path) -> str:
    cu = tmp_path / "candidate.cu"
    cu.write_text(proposal.variant.source("candidate.cu").translation_unit())
    out = tmp_path / "candidate.ptx"
    subprocess.run(
        [str(find_toolkit().nvcc), "-arch=sm_90", "-O3", "-ptx", str(cu), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out.read_text()


def atomics(code: str) -> list[str]:
    """The PTX's atomic instructions."""
    return [ln.strip() for ln in code.splitlines() if re.match(r"\s*(@%p\d+\s+)?(atom|red)\.", ln)]


def assert_well_formed(proposals: list[Rewrite], kernel: str) -> None:
    assert 0 < len(proposals) <= 8
    weights = [p.weight for p in proposals]
    assert weights == sorted(weights, reverse=True)
    for p in proposals:
        assert p.summary and "\n" not in p.summary
        assert_compiles(p, kernel)
    assert_compiles(proposals[0], kernel, launcher=True)


# ---- block_reduce ---------------------------------------------------------------------------------


SUM_OF_SQUARES = """
__device__ float square(float v) { return v * v; }

/* @optiml
 *   args:   in: in float[N], out: inout float[1]
 *   launch: grid = cdiv(N, 128), block = 128
 *   sizes:  N = 1 << 20, 4097
 *   tol:    rtol = 1e-4, atol = 1e-2
 */
__global__ void sum_of_squares(const float* in, float* out, int N)
{
    int idx = threadIdx.x + blockIdx.x * blockDim.x;
    if (idx >= N) return;
    float v = in[(size_t)idx];
    atomicAdd(&out[0], square(v));
}
"""

COUNT_POSITIVE = """
/* @optiml
 *   args:   a: in int[n], count: inout unsigned[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 22, 1000003
 */
__global__ void count_positive(const int* a, unsigned int* count, int n)
{
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    if (i < n) {
        if (a[i] > 0)
            atomicAdd(count, 1u);
    }
}
"""

MAX_ABS = """
/* @optiml
 *   args:   v: in int[n], result: inout int[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 999
 */
__global__ void max_abs(const int* v, int* result, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicMax(result, abs(v[i]));
}
"""

MOMENTS = """
/* @optiml
 *   args:   x: in double[n], stats: inout double[2]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1001
 *   tol:    rtol = 1e-9, atol = 1e-9
 */
__global__ void moments(const double* x, double* stats, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        double v = x[i];
        atomicAdd(&stats[0], v);
        atomicAdd(&stats[1], v * v);
    }
}
"""

DOT_GRID_STRIDE = """
/* @optiml
 *   args:   a: in float[n], b: in float[n], result: inout float[1]
 *   launch: grid = 256, block = 256
 *   sizes:  n = 1 << 22, 77777
 *   tol:    rtol = 1e-4, atol = 1e-2
 */
__global__ void dot(const float* __restrict__ a, const float* __restrict__ b, float* result, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(result, a[i] * b[i]);
}
"""

TEMPLATED_SUM = """
/* @optiml
 *   args:   x: in T[n], s: inout T[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1001
 *   template: T = float
 *   tol:    rtol = 1e-4, atol = 1e-2
 */
template <typename T>
__global__ void tsum(const T* x, T* s, int n)
{
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    if (gid < n) {
        T value = x[gid];
        (void)atomicAdd(s, value);
    }
}
"""

MATRIX_SUM = """
/* @optiml
 *   args:   m: in float[rows * cols], total: inout float[1]
 *   launch: grid = cdiv(rows * cols, 256), block = 256
 *   sizes:  rows, cols = (1024, 1024), (1000, 777)
 *   tol:    rtol = 1e-4, atol = 1e-1
 */
extern "C" __global__ void matrix_sum(const float* __restrict__ m, float* __restrict__ total,
                                      int rows, int cols)
{
    const int count = rows * cols;
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < count) {
        const float v = m[k];
        atomicAdd(total, v);
    }
}
"""

REDUCTIONS = {
    "sum_of_squares": SUM_OF_SQUARES,
    "matrix_sum": MATRIX_SUM,
    "count_positive": COUNT_POSITIVE,
    "max_abs": MAX_ABS,
    "moments": MOMENTS,
    "dot": DOT_GRID_STRIDE,
    "tsum": TEMPLATED_SUM,
}


def test_block_reduce_proposes_on_the_fixture_and_compiles(tmp_path):
    proposals = REDUCE.propose(fixture("reduce_sum.cu", "reduce_sum"))
    assert_well_formed(proposals, "reduce_sum")
    best = proposals[0]
    assert best.params == {"block": 512, "unroll": 8, "blocks_per_sm": 2, "vector": True}
    text = best.variant.text
    assert "launch: grid = min(cdiv(n, 16384), 264), block = 512" in text
    assert "__launch_bounds__(512, 2)" in text
    code = ptx(best, tmp_path)
    assert code.count("ld.global.v4.f32") >= 8  # the main loop's 8 loads, then the last round's
    assert "shfl.sync.bfly.b32" in code
    # One atomic in the whole kernel, on the sum: the per-element ones are gone.
    found = atomics(code)
    assert len(found) == 1 and ".global" in found[0] and ".add.f32" in found[0], found


def test_block_reduce_grid_follows_the_device():
    ctx = fixture("reduce_sum.cu", "reduce_sum")
    ctx.sm_count = 78
    assert "min(cdiv(n, 16384), 156)" in REDUCE.propose(ctx)[0].variant.text


@pytest.mark.parametrize("kernel", sorted(REDUCTIONS))
def test_block_reduce_proposes_on_reductions_written_other_ways(kernel):
    proposals = REDUCE.propose(context(REDUCTIONS[kernel], kernel))
    assert_well_formed(proposals, kernel)


def test_block_reduce_vectorizes_only_4_byte_reads_at_the_index(tmp_path):
    dot = REDUCE.propose(context(DOT_GRID_STRIDE, "dot"))[0]
    assert dot.params["vector"]
    assert "reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b)" in (
        dot.variant.text
    )
    # 8 loads in flight: 4 unroll slots of both vectors (then up to 3 slots in the last round)
    assert dot.params["unroll"] == 4
    assert ptx(dot, tmp_path).count("ld.global.v4.f32") == 8 + 6
    moments = REDUCE.propose(context(MOMENTS, "moments"))[0]
    assert not moments.params["vector"]
    assert "atomicAdd(&stats[0], opt_r0)" in moments.variant.text
    assert "atomicAdd(&stats[1], opt_r1)" in moments.variant.text


def test_block_reduce_keeps_the_operator(tmp_path):
    proposal = REDUCE.propose(context(MAX_ABS, "max_abs"))[0]
    assert "atomicMax(result, opt_r0)" in proposal.variant.text
    code = ptx(proposal, tmp_path)
    found = atomics(code)
    assert len(found) == 1 and ".global.max.s32" in found[0], found


NOT_REDUCTIONS = {
    # the address depends on the thread: a scatter, not a reduction
    "scatter": """
/* @optiml
 *   args:   x: in float[n], out: inout float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void scatter(const float* x, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out[i], x[i]);
}
""",
    # the atomic's old value is used
    "ticket": """
/* @optiml
 *   args:   x: in float[n], sum: inout float[1], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void ticket(const float* x, float* sum, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float before = atomicAdd(sum, x[i]);
        y[i] = before;
    }
}
""",
    # another store besides the reduction
    "scale_and_sum": """
/* @optiml
 *   args:   x: in float[n], y: out float[n], sum: inout float[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void scale_and_sum(const float* x, float* y, float* sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = 2.0f * x[i];
        atomicAdd(sum, x[i]);
    }
}
""",
    # the kernel reads the buffer it reduces into
    "reads_sum": """
/* @optiml
 *   args:   x: in float[n], sum: inout float[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void reads_sum(const float* x, float* sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(sum, x[i] - sum[0]);
}
""",
    # already a block reduction
    "block_sum": """
/* @optiml
 *   args:   x: in float[n], sum: inout float[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void block_sum(const float* x, float* sum, int n)
{
    __shared__ float part[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(sum, part[0]);
}
""",
    # the launch covers only part of the data: a grid-stride loop would add the rest
    "partial_launch": """
/* @optiml
 *   args:   x: in float[n], sum: inout float[1]
 *   launch: grid = 16, block = 256
 *   sizes:  n = 1 << 20, 1001
 */
__global__ void partial_launch(const float* x, float* sum, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(sum, x[i]);
}
""",
    # max and add into the same buffer: their order at one address matters
    "mixed_ops": """
/* @optiml
 *   args:   x: in int[n], out: inout int[2], k = 0
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void mixed_ops(const int* x, int* out, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(&out[k], x[i]);
        atomicMax(&out[1], x[i]);
    }
}
""",
}


GRID_STRIDE = """
/* @optiml
 *   args:   x: in float[n], sum: inout float[1]
 *   launch: grid = 64, block = 256
 *   sizes:  n = 1 << 20, 1001
 */
__global__ void KERNEL(const float* x, float* sum, int n)
{
    BODY
}
"""
for name, body in {
    # a value carried from one element to the next: not one element per iteration
    "carried": """float scale = 1.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        scale *= 0.5f;
        atomicAdd(sum, x[i] * scale);
    }""",
    # the return ends all of the thread's elements, not one
    "stops_early": """for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        if (x[i] < 0.0f) return;
        atomicAdd(sum, x[i]);
    }""",
    # a block-stride loop: each block adds the same elements
    "block_stride": """for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x) {
        atomicAdd(sum, x[i]);
    }""",
}.items():
    NOT_REDUCTIONS[name] = GRID_STRIDE.replace("KERNEL", name).replace("BODY", body)


@pytest.mark.parametrize("kernel", sorted(NOT_REDUCTIONS))
def test_block_reduce_refuses_what_it_cannot_prove(kernel):
    assert REDUCE.propose(context(NOT_REDUCTIONS[kernel], kernel)) == []


def test_block_reduce_refuses_histograms_and_its_own_output():
    assert REDUCE.propose(fixture("histogram.cu", "histogram_global")) == []
    done = REDUCE.propose(fixture("reduce_sum.cu", "reduce_sum"))[0].variant
    assert REDUCE.propose(context(done.text, "reduce_sum")) == []


# ---- privatize_histogram --------------------------------------------------------------------------


BYTE_HISTOGRAM = """
/* @optiml
 *   args:   words: in uint32[count], hist: inout unsigned[256]
 *   launch: grid = cdiv(count, 128), block = 128
 *   sizes:  count = 1 << 22, 100003
 */
__global__ void byte_histogram(const unsigned int* words, unsigned int* hist, size_t count)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= count) return;
    unsigned int w = words[idx];
    atomicAdd(hist + ((w >> 24) & 255u), 1u);
}
"""

WEIGHTED_HISTOGRAM = """
/* @optiml
 *   args:   keys: in int[n] in [-10, 300), w: in float[n], out: inout float[nb], nb = 200
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 22, 1000003
 *   tol:    rtol = 1e-4, atol = 1e-3
 */
__global__ void weighted_histogram(const int* keys, const float* w, float* out, int n, int nb)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int k = keys[i];
    if (k < 0 || k >= nb) return;
    atomicAdd(&out[k], w[i]);
}
"""

GRID_STRIDE_HISTOGRAM = """
/* @optiml
 *   args:   data: in int[n] in [-50, 5000), bins: inout int[nbins], nbins = 4096
 *   launch: grid = 512, block = 256
 *   sizes:  n = 1 << 22, 65537
 */
__global__ void hist_gs(const int* data, int* bins, int n, int nbins)
{
    for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += gridDim.x * blockDim.x) {
        int key = data[i];
        if ((unsigned)key < nbins)
            atomicAdd(&bins[key], 1);
    }
}
"""

# The bin through local variables and clamps, proven on the lifted model.
CLAMPED_FLOAT_BINS = """
/* @optiml
 *   args:   x: in float[n], counts: inout int[nb], lo = -2.0, hi = 2.0
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n, nb = (1 << 22, 64), (100003, 9)
 */
__global__ void float_bins(const float* x, int* counts, int n, int nb, float lo, float hi)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float t = (x[i] - lo) / (hi - lo);
        int bin = (int)(t * nb);
        bin = bin < 0 ? 0 : bin;
        bin = min(bin, nb - 1);
        atomicAdd(counts + bin, 1);
    }
}
"""

# A joint histogram: the bin from two inputs' spec ranges.
PAIR_BINS = """
/* @optiml
 *   args:   u: in uint8[n] in [0, A), v: in uint8[n] in [0, B), joint: inout unsigned[A * B]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n, A, B = (1 << 22, 32, 16), (100003, 5, 7)
 */
__global__ void pair_bins(const unsigned char* u, const unsigned char* v, unsigned* joint,
                          int n, int A, int B)
{
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    int cell = u[p] * B + v[p];
    atomicAdd(&joint[cell], 1u);
}
"""

HISTOGRAMS = {
    "float_bins": CLAMPED_FLOAT_BINS,
    "pair_bins": PAIR_BINS,
    "byte_histogram": BYTE_HISTOGRAM,
    "weighted_histogram": WEIGHTED_HISTOGRAM,
    "hist_gs": GRID_STRIDE_HISTOGRAM,
}


def test_privatize_histogram_proposes_on_the_fixture_and_compiles(tmp_path):
    proposals = HISTOGRAM.propose(fixture("histogram.cu", "histogram_global"))
    assert_well_formed(proposals, "histogram_global")
    best = proposals[0]
    assert best.params["layout"] == "lanes" and best.params["copies"] == 32
    text = best.variant.text
    assert "smem = 128 * (nbins)" in text
    # The original's check of the key stays in front of the shared atomic.
    assert "if (b >= 0 && b < nbins)" in text
    code = ptx(best, tmp_path)
    assert "ld.global.v4.u32" in code or "ld.global.v4.b32" in code
    found = atomics(code)
    assert any(".shared.add.u32" in a for a in found), found
    merges = [a for a in found if ".shared" not in a]
    assert len(merges) == 1 and ".global.add.u32" in merges[0], merges
    layouts = {(p.params["layout"], p.params["copies"]) for p in proposals}
    assert {("lanes", 32), ("warps", 1)} <= layouts


@pytest.mark.parametrize("kernel", sorted(HISTOGRAMS))
def test_privatize_histogram_proposes_on_histograms_written_other_ways(kernel):
    proposals = HISTOGRAM.propose(context(HISTOGRAMS[kernel], kernel))
    assert_well_formed(proposals, kernel)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize(
    "kernel,sizes",
    [
        ("float_bins", [{"n": 1000, "nb": 9}, {"n": 77, "nb": 64}]),
        ("pair_bins", [{"n": 1000, "A": 5, "B": 7}, {"n": 77, "A": 3, "B": 4}]),
    ],
)
def test_privatized_bins_proven_on_the_model_count_what_the_original_does(kernel, sizes, tmp_path):
    ctx = context(HISTOGRAMS[kernel], kernel)
    candidates = [
        Context.of(p.variant, ctx.source.path, kernel) for p in HISTOGRAM.propose(ctx)[:3]
    ]
    assert candidates
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)


def test_privatize_histogram_sizes_shared_memory_from_the_spec():
    byte = HISTOGRAM.propose(context(BYTE_HISTOGRAM, "byte_histogram"))[0].variant.text
    assert "__shared__ unsigned int opt_hist[32 * opt_bins];" in byte  # 256 bins: static
    big = HISTOGRAM.propose(context(GRID_STRIDE_HISTOGRAM, "hist_gs"))
    # 4096 bins: lane copies (512 KB, or 128 KB for 8 of them) leave no room for 2 blocks per SM
    assert {(p.params["layout"], p.params["copies"]) for p in big} == {
        ("warps", 4),
        ("warps", 2),
        ("warps", 1),
    }
    assert all(
        "smem = " in p.variant.text and "opt_bins = (int)(nbins)" in p.variant.text for p in big
    )


NOT_HISTOGRAMS = {
    # no check of the key and no range for it in the spec
    "unchecked": """
/* @optiml
 *   args:   data: in int[n], bins: inout unsigned[256]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void unchecked(const int* data, unsigned int* bins, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[data[i]], 1u);
}
""",
    # the check admits keys past the end of the histogram
    "loose_check": """
/* @optiml
 *   args:   data: in int[n], bins: inout unsigned[nbins], nbins = 256
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void loose_check(const int* data, unsigned int* bins, int n, int nbins)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int b = data[i];
        if (b >= 0 && b < 1024) atomicAdd(&bins[b], 1u);
    }
}
""",
    # a float bin clamped only from above
    "half_clamped": """
/* @optiml
 *   args:   x: in float[n], counts: inout int[nb], lo = -2.0, hi = 2.0
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n, nb = (4096, 64), (1001, 9)
 */
__global__ void half_clamped(const float* x, int* counts, int n, int nb, float lo, float hi)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int bin = min((int)((x[i] - lo) / (hi - lo) * nb), nb - 1);
        atomicAdd(counts + bin, 1);
    }
}
""",
    # a spec range wider than the bins
    "range_too_wide": """
/* @optiml
 *   args:   u: in uint8[n] in [0, 9), v: in uint8[n] in [0, 4), joint: inout unsigned[32]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void range_too_wide(const unsigned char* u, const unsigned char* v, unsigned* joint,
                               int n)
{
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n) atomicAdd(&joint[u[p] * 4 + v[p]], 1u);
}
""",
    # too many bins for shared memory
    "too_many_bins": """
/* @optiml
 *   args:   data: in int[n] in [0, nbins), bins: inout unsigned[nbins], nbins = 65536
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void too_many_bins(const int* data, unsigned int* bins, int n, int nbins)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[data[i]], 1u);
}
""",
    # the old count is used
    "ranks": """
/* @optiml
 *   args:   data: in int[n] in [0, 256), bins: inout unsigned[256], rank: out unsigned[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void ranks(const int* data, unsigned int* bins, unsigned int* rank, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) rank[i] = atomicAdd(&bins[data[i]], 1u);
}
""",
    # a second output besides the histogram
    "copy_and_count": """
/* @optiml
 *   args:   data: in int[n] in [0, 256), bins: inout unsigned[256], copy: out int[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 4096, 1001
 */
__global__ void copy_and_count(const int* data, unsigned int* bins, int* copy, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        copy[i] = data[i];
        atomicAdd(&bins[data[i]], 1u);
    }
}
""",
}


@pytest.mark.parametrize("kernel", sorted(NOT_HISTOGRAMS))
def test_privatize_histogram_refuses_what_it_cannot_prove(kernel):
    assert HISTOGRAM.propose(context(NOT_HISTOGRAMS[kernel], kernel)) == []


def test_privatize_histogram_refuses_reductions_and_its_own_output():
    assert HISTOGRAM.propose(fixture("reduce_sum.cu", "reduce_sum")) == []
    done = HISTOGRAM.propose(fixture("histogram.cu", "histogram_global"))[0].variant
    assert HISTOGRAM.propose(context(done.text, "histogram_global")) == []


WHILE_SUM = """
/* @optiml
 *   args:   x: in float[n], total: inout float[1]
 *   launch: grid = min(cdiv(n, 256), 512), block = 256
 *   sizes:  n = 1 << 22, 40001
 *   tol:    rtol = 1e-3
 */
__global__ void while_sum(const float* x, float* total, long long n)
{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    while (i < n) {
        atomicAdd(total, x[i]);
        i += stride;
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_while_grid_stride_loop_is_a_loop_over_elements(tmp_path):
    # the same loop as a `for`, spelled `while` with the step last and the stride in a variable:
    # block_reduce reads it, and so does privatize_histogram (fixtures/holdout/byte_histogram.cu)
    ctx = context(WHILE_SUM, "while_sum")
    proposals = by_name("block_reduce").propose(ctx)
    assert proposals
    candidates = [Context.of(p.variant, ctx.source.path, "while_sum") for p in proposals[:2]]
    sizes = [{"n": 40001}, {"n": 777}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]
    path = FIXTURES / "holdout" / "byte_histogram.cu"
    hist = Context.of(Variant(path.read_text()), str(path), "byte_histogram")
    assert by_name("privatize_histogram").propose(hist)
    # a loop whose index also moves in the body is not one element per step
    moved = WHILE_SUM.replace("atomicAdd(total, x[i]);", "atomicAdd(total, x[i]); i += 1;")
    assert by_name("block_reduce").propose(context(moved, "while_sum")) == []


# 64-bit pair counts (a big volume's can pass 2^32), one at a time, with a 32-bit element index.
WIDE_PAIR_BINS = """
/* @optiml
 *   args:   u: in uint8[n] in [0, A), v: in uint8[n] in [0, B), joint: inout uint64[A * B]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n, A, B = (1 << 22, 64, 64), (100003, 5, 7)
 */
__global__ void wide_pairs(const unsigned char* u, const unsigned char* v,
                           unsigned long long* joint, int n, int A, int B)
{
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < n) {
        int cell = u[p] * B + v[p];
        atomicAdd(&joint[cell], 1ULL);
    }
}
"""


def test_64_bit_bins_counted_by_ones_get_32_bit_private_counts(tmp_path):
    # a block counts at most 2^31 - 1 elements (its index is an int): 32-bit shared counts, each
    # merged once into its 64-bit bin
    proposals = HISTOGRAM.propose(context(WIDE_PAIR_BINS, "wide_pairs"))
    assert_well_formed(proposals, "wide_pairs")
    for p in proposals:
        assert "unsigned int* opt_hist" in p.variant.text
        assert "atomicAdd(&joint[opt_j], (unsigned long long)opt_sum);" in p.variant.text
    found = atomics(ptx(proposals[0], tmp_path))
    assert any(".shared.add.u32" in a for a in found), found
    merges = [a for a in found if ".shared" not in a]  # the merge loop, unrolled by nvcc
    assert merges and all(".global.add.u64" in a for a in merges), merges


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_32_bit_private_counts_of_64_bit_bins_count_what_the_original_does(tmp_path):
    ctx = context(WIDE_PAIR_BINS, "wide_pairs")
    candidates = [
        Context.of(p.variant, ctx.source.path, "wide_pairs") for p in HISTOGRAM.propose(ctx)
    ]
    sizes = [{"n": 3000, "A": 5, "B": 7}, {"n": 77, "A": 3, "B": 4}]
    assert candidates and run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)


@pytest.mark.parametrize(
    "change",
    [
        ("atomicAdd(&joint[cell], 1ULL);", "atomicAdd(&joint[cell], (unsigned long long)u[p]);"),
        ("int p = blockIdx.x", "long long p = (long long)blockIdx.x"),
    ],
    ids=["a weight, not a one", "a 64-bit index"],
)
def test_64_bit_bins_keep_64_bit_counts_or_no_privatization(change):
    # a weighted count, or more elements a block than 32 bits hold: nothing to narrow, no proposal
    text = WIDE_PAIR_BINS.replace(*change)
    assert text != WIDE_PAIR_BINS
    assert HISTOGRAM.propose(context(text, "wide_pairs")) == []
