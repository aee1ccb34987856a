"""vector_map: maps emitted from the lifted model with wide accesses, whatever their spelling (an
index through a macro, a grid-stride `for (;;)` or `while` with the stride in a variable, 64-bit
counts, double, half beside float, a broadcast read, a condition on the element). Every proposal
is run as host C++ against the original at sizes with a scalar tail; the refusals are maps that
are not: a read of another element of an output, an atomic, a loop per element."""

from __future__ import annotations

import shutil

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against
from tests.support import FIXTURES

MAP = by_name("vector_map")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# Spellings the text's `vectorize` does not read, each a map.
MAPS = {
    "macro_index": """
#define TID() (blockIdx.x * 128 + threadIdx.x)
/* @optiml
 *   args:   g: in float[n], x: in float[n], dx: out float[n], slope = 0.1
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1 << 22, 1001
 */
__global__ void macro_index(const float* g, const float* x, float* dx, float slope, int n)
{
    int i = TID();
    if (i < n) { dx[i] = x[i] > 0.f ? g[i] : g[i] * slope; }
}
""",
    # an update in place: the second value reads what the first store will have replaced
    "in_place": """
/* @optiml
 *   args:   p: inout float[count], s: inout float[count] in [0, 1), g: in float[count],
 *           lr = 0.01
 *   launch: grid = 40, block = 64
 *   sizes:  count = 1 << 22, 1003
 */
__global__ void in_place(float* p, float* s, const float* g, unsigned long long count, float lr)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (; i < count; i += step) {
        s[i] = s[i] + g[i] * g[i];
        p[i] -= lr * g[i] / (sqrtf(s[i]) + 1e-8f);
    }
}
""",
    # a while loop over 64-bit elements, a broadcast bias read at `i % C`, double
    "broadcast": """
/* @optiml
 *   args:   x: in double[R * C], b: in double[C], y: out double[R * C]
 *   launch: grid = 30, block = 128
 *   sizes:  R, C = (4096, 1024), (37, 13)
 */
__global__ void broadcast(const double* x, const double* b, double* y, int R, int C)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    while (i < (long long)R * C) {
        y[i] = x[i] * 2.0 + b[i % C];
        i += (long long)gridDim.x * blockDim.x;
    }
}
""",
    # bytes in, floats out: the bytes' pack holds bytes (the model computes them in int)
    "bytes": """
/* @optiml
 *   args:   y: out float[n], q: in uint8[n], s = 0.5
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1001
 */
__global__ void bytes(float* y, const unsigned char* q, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (float)q[i] * s;
}
""",
    # a window of taps in a loop (a 1-D stencil with weights, bounds checked per tap): the loop
    # is written out, each tap a read at another index
    "window": """
#define R 3
/* @optiml
 *   args:   y: out float[n], x: in float[n], w: in float[2 * R + 1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 22, 1001
 *   tol:    rtol = 1e-5, atol = 1e-5
 */
__global__ void window(float* y, const float* x, const float* w, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float acc = 0.0f;
        for (int k = -R; k <= R; ++k) {
            int j = i + k;
            if (j >= 0 && j < n) acc += w[k + R] * x[j];
        }
        y[i] = acc;
    }
}
""",
    # a store under a condition of its element: the others keep their values
    "masked": """
/* @optiml
 *   args:   s: inout float[n], m: in int[n] in [0, 2)
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 22, 999
 */
__global__ void masked(float* s, const int* m, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (m[i] == 0) s[i] = -1e9f;
}
""",
}


def context(name: str, text: str | None = None) -> Context:
    return Context.of(Variant(text or MAPS[name]), str(FIXTURES / "kernel.cu"), name)


@needs_gxx
@pytest.mark.parametrize("name", sorted(MAPS))
def test_a_map_spelled_any_way_gets_wide_accesses_that_compute_the_same(name, tmp_path):
    ctx = context(name)
    proposals = MAP.propose(ctx)
    assert [p.weight for p in proposals] == [1.0, 0.8]
    assert "reinterpret_cast<const optiml_pack<" in proposals[0].variant.text
    names = ctx.spec.size_vars
    values = [(1003,), (64,), (5,)] if len(names) == 1 else [(37, 13), (5, 8)]
    sizes = [dict(zip(names, v, strict=True)) for v in values]
    candidates = [Context.of(p.variant, ctx.source.path, name) for p in proposals]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


def test_lanes_follow_the_widest_element():
    assert MAP.propose(context("broadcast"))[0].params["lanes"] == 2  # double: 2 per 16 bytes
    assert MAP.propose(context("masked"))[0].params["lanes"] == 4


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_half_beside_float_compiles_without_spills():
    path = FIXTURES / "holdout" / "clamp_to_half.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "clamp_to_half")
    (p, _) = MAP.propose(ctx)
    assert p.params["lanes"] == 4  # 16 bytes of float, 8 of half
    v = SourceFile(p.variant.text, str(path))
    k = v.kernel("clamp_to_half")
    b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0


@pytest.mark.parametrize(
    "old,new",
    [
        ("if (m[i] == 0) s[i] = -1e9f;", "if (m[i] == 0 && i > 0) s[i] = s[i - 1];"),
        ("if (m[i] == 0) s[i] = -1e9f;", "if (m[i] == 0) atomicAdd(&s[i], 1.0f);"),
        ("if (m[i] == 0) s[i] = -1e9f;", "for (int k = 0; k < 3; ++k) s[i] += (float)k;"),
    ],
    ids=["another-element", "atomic", "loop"],
)
def test_refused(old, new):
    text = MAPS["masked"].replace(old, new)
    assert text != MAPS["masked"]
    assert MAP.propose(context("masked", text)) == []


def test_a_conditional_store_to_an_output_nothing_reads_is_not_read_to_be_written_back():
    # `masked` reads m and writes s under a condition: s is not loaded 16 bytes at a time only
    # to be written back where the condition fails (twice its bytes for a mask)
    text = MAP.propose(context("masked"))[0].variant.text
    wide = text[: text.index("optiml_tail + optiml_t")]
    assert "optiml_p_m" in wide and "optiml_p_s" not in wide
    assert "if ((optiml_p_m.v[optiml_j] == 0)) s[optiml_e] = " in wide
    # with nothing read at the element (a causal mask's fill), nothing is left to widen
    path = FIXTURES / "holdout" / "causal_mask.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "causal_mask_fill")
    assert MAP.propose(ctx) == []


# Maps over 2-D launches: x is the column, y (or y and z) the row.
MAPS_2D = {
    # a bias per column (a pack of its own), a scale per row (read once), rows by blockIdx.y
    "bias_rows": """
/* @optiml
 *   args:   y: out float[R * C], x: in float[R * C], b: in float[C], s: in float[R]
 *   launch: grid = (cdiv(C, 64), R), block = 64
 *   sizes:  R, C = (512, 4096), (7, 1001)
 */
__global__ void bias_rows(float* y, const float* x, const float* b, const float* s, int R, int C)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y;
    if (col < C && row < R) y[row * C + col] = x[row * C + col] * s[row] + b[col];
}
""",
    # rows by blockIdx.y * blockDim.y + threadIdx.y, a leading dimension, a neighbour's read
    "pitched": """
/* @optiml
 *   args:   y: out float[R * C], x: in float[R * ld]
 *   launch: grid = (cdiv(C, 32), cdiv(R, 8)), block = (32, 8)
 *   sizes:  R, C, ld = (1024, 2048, 2056), (9, 37, 41)
 */
__global__ void pitched(float* y, const float* x, int R, int C, int ld)
{
    int c = threadIdx.x + blockDim.x * blockIdx.x;
    int r = threadIdx.y + blockDim.y * blockIdx.y;
    if (r >= R || c >= C) return;
    y[(long long)r * C + c] = 0.5f * x[(long long)r * ld + c] + 0.25f * x[(long long)r * ld + c + 1];
}
""",
    # int8 weights dequantized by a scale per row, rows by g.y, an early return
    "dequant": """
/* @optiml
 *   args:   Wq: in int8[rows * cols], scales: in float[rows], W: out float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 4096), (9, 173)
 */
__global__ void dequant(const signed char* Wq, const float* scales, float* W, int rows, int cols)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= rows || col >= cols) return;
    W[(size_t)row * cols + col] = (float)Wq[(size_t)row * cols + col] * scales[row];
}
""",
    # an update in place over a 3-D launch (batch along z)
    "in_place_3d": """
/* @optiml
 *   args:   a: inout float[B * R * C], g: in float[B * R * C], lr = 0.5
 *   launch: grid = (cdiv(C, 128), R, B), block = 128
 *   sizes:  B, R, C = (4, 256, 1024), (2, 3, 45)
 */
__global__ void in_place_3d(float* a, const float* g, float lr, int B, int R, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    size_t at = ((size_t)blockIdx.z * R + blockIdx.y) * C + c;
    if (c < C) a[at] = a[at] - lr * g[at] * g[at];
}
""",
}


@needs_gxx
@pytest.mark.parametrize("name", sorted(MAPS_2D))
def test_a_map_over_rows_gets_consecutive_columns_per_thread(name, tmp_path):
    ctx = Context.of(Variant(MAPS_2D[name]), str(FIXTURES / "kernel.cu"), name)
    proposals = MAP.propose(ctx)
    assert [p.params["grid"] for p in proposals] == ["columns per thread, rows as launched"]
    text = proposals[0].variant.text
    assert "reinterpret_cast<const optiml_pack<" in text and "optiml_pack<float, 4>" in text
    # past the line that takes the thread's first column, no x index is read as written
    assert "blockIdx.x" not in text[text.index("\n", text.index("optiml_c =")) :]
    names = ctx.spec.size_vars
    small = [
        dict(zip(names, v, strict=True))
        for v in ([7, 45, 49][: len(names)], [2, 5, 9][: len(names)])
    ]
    candidates = [Context.of(p.variant, ctx.source.path, name) for p in proposals]
    assert run_against(ctx, candidates, small, tmp_path) == [0]


def test_a_map_over_rows_that_does_not_move_with_the_column_is_refused():
    for old, new in (
        ("y[row * C + col] =", "y[col * R + row] ="),  # a transpose: permute_tiles' work
        ("if (col < C && row < R)", "if (col < C && row < R && col % 2 == 0)"),  # a column mask
    ):
        text = MAPS_2D["bias_rows"].replace(old, new)
        assert text != MAPS_2D["bias_rows"]
        ctx = Context.of(Variant(text), str(FIXTURES / "kernel.cu"), "bias_rows")
        assert MAP.propose(ctx) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_half_map_over_rows_compiles_without_spills():
    # SwiGLU's second half: the gate and up halves of each row, 8 halves a pack
    path = FIXTURES / "corpus" / "swiglu_fp16.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "siluAndMul")
    (p,) = MAP.propose(ctx)
    assert p.params["lanes"] == 8
    assert "grid = (cdiv(d, 128 * 8), rows), block = 128" in p.variant.text
    v = SourceFile(p.variant.text, str(path))
    k = v.kernel("siluAndMul")
    b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0


def test_the_element_count_is_computed_in_64_bits(tmp_path):
    # `(long long)B * D` in the kernel, B * D in its model: emitted as a product of int sizes it
    # overflowed past 2^31 elements (KernelBench's GELU at the judge's 4895 x 470663: no element
    # written); each size is widened before the product
    from optiml.generate import generate

    g = generate("float x[B, D]; y[b, d] = x[b, d] * 2 + 1", "scale")
    path = tmp_path / "scale.cu"
    path.write_text(g.kernel)
    (tmp_path / "scale_ref.py").write_text(g.reference)  # the spec names it
    ctx = Context.of(Variant(g.kernel), str(path), "scale")
    proposals = by_name("vector_map").propose(ctx)
    assert proposals
    for p in proposals:
        text = p.variant.text
        assert "((long long)(B)) * ((long long)(D))" in text, text
        assert "(B * D)" not in text
