"""The 2-D transformations of the catalog: tile_transpose, smem_padding, coarsen_rows and
flatten_2d. Each proposes on the fixtures it is meant for and on kernels written other ways, every
proposal compiles for sm_90 with no spills and carries the instructions it is for, and each
proposes nothing where it cannot prove its rewrite keeps the kernel's function."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from tests.support import FIXTURES, MANIFEST, fixture_ids

NAMES = ("tile_transpose", "smem_padding", "coarsen_rows", "flatten_2d")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def context(text: str, kernel: str, path: str = "kernel.cu") -> Context:
    return Context.of(Variant(text), str(FIXTURES / path), kernel)


def fixture(name: str, kernel: str) -> Context:
    return context((FIXTURES / name).read_text(), kernel, name)


def propose(name: str, ctx: Context):
    return by_name(name).propose(ctx)


def compiled(ctx: Context, proposal) -> Context:
    """The proposal's context, after checking that it compiles for sm_90 with no spills."""
    out = Context.of(proposal.variant, ctx.source.path, ctx.kernel.name)
    build = build_kernel(
        out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
    )
    assert build.ok, build.log
    assert build.resources.spill_store_bytes == 0 and build.resources.spill_load_bytes == 0
    assert build.resources.stack_bytes == 0
    return out


def ptx(ctx: Context) -> str:
    """The PTX of the variant's file (templated kernels instantiated by the spec's values)."""
    text = ctx.source.text
    if ctx.spec.instantiation:
        text += f"\ntemplate __global__ decltype({ctx.kernel.name}{ctx.spec.instantiation}) "
        text += f"{ctx.kernel.name}{ctx.spec.instantiation};\n"
    run = subprocess.run(
        ["nvcc", "-arch=sm_90", "-O3", "-ptx", "-x", "cu", "-", "-o", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout


# ---- kernels written other ways --------------------------------------------------------------

# Early return, threadIdx first, size_t indices through locals, a __device__ helper, block 16 x 16.
TRANSPOSE_SCALED = """
__device__ float scaled(float v, float a) { return v * a; }

/* @optiml
 *   args:   src: in float[height * width], dst: out float[height * width], alpha = 2.0
 *   launch: grid = (cdiv(width, 16), cdiv(height, 16)), block = (16, 16)
 *   sizes:  height, width = (2048, 1024), (300, 517)
 */
__global__ void transpose_scaled(const float* src, float* dst, int height, int width, float alpha)
{
    const int col = threadIdx.x + blockIdx.x * blockDim.x;
    const int row = threadIdx.y + blockIdx.y * blockDim.y;
    if (row >= height || col >= width) return;
    const size_t in_idx = (size_t)row * width + col;
    size_t out_idx = (size_t)col * height + row;
    dst[out_idx] = scaled(src[in_idx], alpha);
}
"""

# The other way round: x walks the rows of `a`, so the read is strided and the write coalesced;
# doubles, and a read through a row pointer.
TRANSPOSE_GATHER = """
/* @optiml
 *   args:   a: in double[n * m], at: out double[n * m]
 *   launch: grid = (cdiv(n, 32), cdiv(m, 8)), block = (32, 8)
 *   sizes:  n, m = (1024, 2048), (333, 101)
 */
__global__ void transpose_gather(const double* a, double* at, int n, int m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;   // row of a, column of at
    int j = blockIdx.y * blockDim.y + threadIdx.y;   // column of a, row of at
    if (i < n && j < m) {
        const double* a_row = a + i * m;
        at[j * n + i] = a_row[j];
    }
}
"""

# In place: each pair is swapped by the thread below the diagonal, reading what it writes.
TRANSPOSE_IN_PLACE = """
/* @optiml
 *   args:   m: inout float[n * n]
 *   launch: grid = (cdiv(n, 32), cdiv(n, 8)), block = (32, 8)
 *   sizes:  n = 1024, 999
 */
__global__ void transpose_in_place(float* m, int n)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < n && y < n) {
        if (x < y) {
            float t = m[y * n + x];
            m[y * n + x] = m[x * n + y];
            m[x * n + y] = t;
        }
    }
}
"""

# Accumulating into the transpose: `+=` reads only the element it writes.
TRANSPOSE_ACCUMULATE = """
/* @optiml
 *   args:   in: in float[rows * cols], out: inout float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 512), (300, 517)
 */
__global__ void transpose_accumulate(const float* in, float* out, int rows, int cols)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows)
        out[x * rows + y] += 0.5f * in[y * cols + x];
}
"""

# A gather through an index array: the write's element is not an affine function of x and y.
PERMUTE_ROWS = """
/* @optiml
 *   args:   in: in float[rows * cols], perm: in int[cols] in [0, cols), out: out float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void permute_transpose(const float* in, const int* perm, float* out, int rows, int cols)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows) {
        out[perm[x] * rows + y] = in[y * cols + x];
    }
}
"""

# Early return, a __device__ helper, row pointers with size_t offsets, blocks of 16 x 16.
BRIGHTEN = """
__device__ float clamp01(float v) { return fminf(fmaxf(v, 0.0f), 1.0f); }

/* @optiml
 *   args:   img: in float[w * h], out: out float[w * h], gain = 1.5
 *   launch: grid = (cdiv(w, 16), cdiv(h, 16)), block = (16, 16)
 *   sizes:  w, h = (1920, 1080), (641, 363)
 */
__global__ void brighten(const float* img, float* out, int w, int h, float gain)
{
    int x = threadIdx.x + blockIdx.x * blockDim.x;
    int y = threadIdx.y + blockIdx.y * blockDim.y;
    if (x >= w || y >= h)
        return;
    const float* src = img + (size_t)y * w;
    float* dst = out + (size_t)y * w;
    dst[x] = clamp01(src[x] * gain);
}
"""

# In place (read and written at the same element), a vertical blur read clamped at the edges,
# an early return inside the body.
SHARPEN_INPLACE = """
/* @optiml
 *   args:   data: inout float[rows * cols], blur: in float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 4)), block = (32, 4)
 *   sizes:  rows, cols = (1024, 1024), (301, 517)
 */
__global__ void sharpen(float* data, const float* blur, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) {
        int at = r * cols + c;
        if (data[at] == 0.0f)
            return;
        int up = max(r - 1, 0) * cols + c;
        data[at] = 2.0f * data[at] - 0.5f * (blur[at] + blur[up]);
    }
}
"""

# Jacobi in place: a row reads what the rows beside it write.
JACOBI_IN_PLACE = """
/* @optiml
 *   args:   u: inout float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void jacobi_in_place(float* u, int rows, int cols)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i < rows && j < cols) {
        int idx = i * cols + j;
        if (i > 0 && j > 0 && i < rows - 1 && j < cols - 1)
            u[idx] = 0.25f * (u[idx - cols] + u[idx + cols] + u[idx - 1] + u[idx + 1]);
    }
}
"""

COLUMN_SUMS = """
/* @optiml
 *   args:   in: in float[rows * cols], sums: inout float[cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void column_sums(const float* in, float* sums, int rows, int cols)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows)
        atomicAdd(&sums[x], in[y * cols + x]);
}
"""

# x walks rows (a column-major thread mapping), the guard comes as an early return, the body
# uses the column for something else than the index.
CHECKER_COLUMN_MAJOR = """
/* @optiml
 *   args:   in: in float[rows * cols], out: out float[rows * cols]
 *   launch: grid = (cdiv(rows, 32), cdiv(cols, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 2048), (333, 517)
 */
__global__ void checker(const float* in, float* out, int rows, int cols)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= rows || col >= cols) return;
    out[row * cols + col] = (col & 1) ? -in[row * cols + col] : in[row * cols + col];
}
"""

# 64-bit linear index in a local, row pointers, an inout buffer.
ACCUMULATE_WIDE = """
/* @optiml
 *   args:   acc: inout float[h * w], add: in float[h * w], k = 0.5
 *   launch: grid = (cdiv(w, 16), cdiv(h, 16)), block = (16, 16)
 *   sizes:  h, w = (1080, 1920), (361, 643)
 */
__global__ void accumulate(float* acc, const float* add, int h, int w, float k)
{
    const unsigned x = threadIdx.x + blockIdx.x * blockDim.x;
    const unsigned y = threadIdx.y + blockIdx.y * blockDim.y;
    if (x < w && y < h) {
        size_t i = (size_t)y * w + x;
        acc[i] += k * add[i];
    }
}
"""

# A pitched array: the row stride is `ld`, not the width, so the elements are not one range.
PITCHED = """
/* @optiml
 *   args:   in: in float[rows * ld], out: out float[rows * ld], ld = cols + 3
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void pitched_copy(const float* in, float* out, int rows, int cols, int ld)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows)
        out[y * ld + x] = in[y * ld + x];
}
"""

SAXPY = (FIXTURES / "saxpy.cu").read_text()

# A helper that reads the thread index: work cannot move between threads without changing it.
LANE_HELPER = """
__device__ float lane_sign(float v) { return (threadIdx.x & 1) ? -v : v; }

/* @optiml
 *   args:   in: in float[rows * cols], out: out float[rows * cols]
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void lane_signs(const float* in, float* out, int rows, int cols)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows)
        out[x * rows + y] = lane_sign(in[y * cols + x]);
}
"""

# A third test in the guard: the column is also bounded by `limit`.
GUARD_THREE = """
/* @optiml
 *   args:   in: in float[rows * cols], out: out float[rows * cols], limit = cols / 2
 *   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8)
 *   sizes:  rows, cols = (1024, 1024), (300, 517)
 */
__global__ void left_half(const float* in, float* out, int rows, int cols, int limit)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < cols && y < rows && x < limit)
        out[x * rows + y] = in[y * cols + x];
}
"""

# Both indices in one declaration after a local of the sizes, an unsigned guard.
ONE_DECLARATION = """
/* @optiml
 *   args:   a: in float[rows * cols], b: in float[rows * cols], out: out float[rows * cols]
 *   launch: grid = (cdiv(cols, 64), cdiv(rows, 4)), block = (64, 4)
 *   sizes:  rows, cols = (1024, 1024), (301, 519)
 */
__global__ void blend(const float* a, const float* b, float* out, int rows, int cols)
{
    const float w = 0.25f;
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (y < rows && x < cols) {
        int at = y * cols + x;
        out[at] = w * a[at] + (1.0f - w) * b[at];
    }
}
"""

# Doubles, locals for the thread indices: a column read is 16-way conflicted per half warp.
DOUBLE_TILE = """
#define TILE 32

/* @optiml
 *   args:   in: in double[n * n], out: out double[n * n]
 *   launch: grid = (cdiv(n, 32), cdiv(n, 32)), block = (32, 8)
 *   sizes:  n = 1024, 1000
 */
__global__ void transpose_double(const double* in, double* out, int n)
{
    __shared__ double tile[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int bx = blockIdx.x * TILE, by = blockIdx.y * TILE;
    for (int k = 0; k < TILE; k += 8)
        if (bx + tx < n && by + ty + k < n)
            tile[ty + k][tx] = in[(by + ty + k) * n + bx + tx];
    __syncthreads();
    for (int k = 0; k < TILE; k += 8)
        if (by + tx < n && bx + ty + k < n)
            out[(bx + ty + k) * n + by + tx] = tile[tx][ty + k];
}
"""

# A templated tile size and 16 x 16 blocks: a warp spans two rows of threads.
TEMPLATED_TILE = """
/* @optiml
 *   args:   in: in float[n * n], out: out float[n * n]
 *   launch: grid = (cdiv(n, B), cdiv(n, B)), block = (B, B)
 *   sizes:  n = 1024, 1001
 *   template: B = 16
 */
template <int B>
__global__ void transpose_tpl(const float* in, float* out, int n)
{
    __shared__ float s[B][B];
    int x = blockIdx.x * B + threadIdx.x;
    int y = blockIdx.y * B + threadIdx.y;
    if (x < n && y < n)
        s[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    int ox = blockIdx.y * B + threadIdx.x;
    int oy = blockIdx.x * B + threadIdx.y;
    if (ox < n && oy < n)
        out[oy * n + ox] = s[threadIdx.x][threadIdx.y];
}
"""

PADDED = (
    (FIXTURES / "bank_conflicts.cu")
    .read_text()
    .replace("tile[TILE_DIM][TILE_DIM];", "tile[TILE_DIM][TILE_DIM + 1];")
)

# Row reads only: every lane of a warp reads its own bank already.
ROW_ONLY = """
/* @optiml
 *   args:   in: in float[n * 32], out: out float[n * 32]
 *   launch: grid = cdiv(n, 8), block = (32, 8)
 *   sizes:  n = 1024, 1001
 */
__global__ void row_reverse(const float* in, float* out, int n)
{
    __shared__ float rows[8][32];
    int r = blockIdx.x * 8 + threadIdx.y;
    if (r < n)
        rows[threadIdx.y][threadIdx.x] = in[r * 32 + threadIdx.x];
    __syncthreads();
    if (r < n)
        out[r * 32 + threadIdx.x] = rows[threadIdx.y][31 - threadIdx.x];
}
"""

# The tile is also read through a flat pointer: a longer row would move what it reads.
FLAT_POINTER = """
/* @optiml
 *   args:   in: in float[n * 32], out: out float[n * 32]
 *   launch: grid = cdiv(n, 32), block = (32, 8)
 *   sizes:  n = 1024, 1001
 */
__global__ void flat_reader(const float* in, float* out, int n)
{
    __shared__ float tile[32][32];
    for (int k = 0; k < 32; k += 8)
        tile[threadIdx.y + k][threadIdx.x] = in[(blockIdx.x * 32 + threadIdx.y + k) % n * 32 + threadIdx.x];
    __syncthreads();
    const float* flat = &tile[0][0];
    for (int k = 0; k < 32; k += 8)
        if (blockIdx.x * 32 + threadIdx.y + k < n)
            out[(blockIdx.x * 32 + threadIdx.y + k) * 32 + threadIdx.x] = tile[threadIdx.x][threadIdx.y + k] + flat[threadIdx.x * 32];
}
"""

# The column index depends on the lane through a remainder: not an affine form, no proof.
LANE_MODULO = """
/* @optiml
 *   args:   in: in float[n * 32], out: out float[n * 32]
 *   launch: grid = cdiv(n, 32), block = (32, 8)
 *   sizes:  n = 1024, 1001
 */
__global__ void rotate(const float* in, float* out, int n)
{
    __shared__ float tile[32][32];
    int base = blockIdx.x * 32;
    for (int k = 0; k < 32; k += 8)
        if (base + threadIdx.y + k < n)
            tile[threadIdx.y + k][threadIdx.x] = in[(base + threadIdx.y + k) * 32 + threadIdx.x];
    __syncthreads();
    for (int k = 0; k < 32; k += 8)
        if (base + threadIdx.y + k < n)
            out[(base + threadIdx.y + k) * 32 + threadIdx.x] = tile[(threadIdx.x * 5) % 32][threadIdx.y + k];
}
"""


# ---- tile_transpose ---------------------------------------------------------------------------


@needs_nvcc
def test_tile_transpose_on_the_fixture_compiles_with_shared_tiles():
    ctx = fixture("transpose.cu", "transpose_naive")
    proposals = propose("tile_transpose", ctx)
    assert [p.params["block"] for p in proposals] == [(64, 8), (32, 8), (32, 16)]
    assert proposals[0].weight == max(p.weight for p in proposals)
    for p in proposals:
        out = compiled(ctx, p)
        tile = p.params["tile"]
        assert out.spec.launch.grid == [f"cdiv(cols, {tile})", f"cdiv(rows, {tile})"]
        assert f"[{tile}][{tile} + 1]" in p.variant.text
    code = ptx(compiled(ctx, proposals[0]))
    assert "bar.sync" in code and "st.shared.f32" in code and "ld.shared.f32" in code


@needs_nvcc
@pytest.mark.parametrize(
    ("text", "kernel", "side", "shared"),
    [
        (TRANSPOSE_SCALED, "transpose_scaled", "write", "st.shared.f32"),
        (TRANSPOSE_GATHER, "transpose_gather", "read", "st.shared.f64"),
        (TRANSPOSE_ACCUMULATE, "transpose_accumulate", "write", "st.shared.f32"),
    ],
)
def test_tile_transpose_on_other_kernels(text, kernel, side, shared):
    ctx = context(text, kernel)
    proposals = propose("tile_transpose", ctx)
    assert proposals and all(f"strided {side}" in p.summary for p in proposals)
    for p in proposals:
        compiled(ctx, p)
    assert shared in ptx(compiled(ctx, proposals[0]))


def test_tile_transpose_applies_a_compound_assignment_where_it_writes():
    ctx = context(TRANSPOSE_ACCUMULATE, "transpose_accumulate")
    text = propose("tile_transpose", ctx)[0].variant.text
    assert "tile[r][threadIdx.x] = 0.5f * in[y * cols + x];" in text
    assert "out[x * rows + y] += tile[threadIdx.x][r];" in text


def test_tile_transpose_keeps_the_helper_call_and_the_guard():
    text = propose("tile_transpose", context(TRANSPOSE_SCALED, "transpose_scaled"))[0].variant.text
    body = text[text.index("void transpose_scaled") :]
    assert body.count("scaled(src[in_idx], alpha)") == 1
    assert body.count("if (row < height && col < width)") == 2
    assert "dst[out_idx] = tile[threadIdx.x][r];" in body


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        ((FIXTURES / "scale2d.cu").read_text(), "scale2d"),
        ((FIXTURES / "bank_conflicts.cu").read_text(), "transpose_smem"),
        (TRANSPOSE_IN_PLACE, "transpose_in_place"),
        (PERMUTE_ROWS, "permute_transpose"),
        (LANE_HELPER, "lane_signs"),
        (GUARD_THREE, "left_half"),
        (SAXPY, "saxpy"),
    ],
)
def test_tile_transpose_refuses(text, kernel):
    assert propose("tile_transpose", context(text, kernel)) == []


# ---- smem_padding -----------------------------------------------------------------------------


@needs_nvcc
def test_smem_padding_pads_the_fixture_tile():
    ctx = fixture("bank_conflicts.cu", "transpose_smem")
    (p,) = propose("smem_padding", ctx)
    assert "tile[TILE_DIM][TILE_DIM + 1]" in p.variant.text
    assert "32-way -> 1-way" in p.summary
    out = compiled(ctx, p)
    build = build_kernel(out.source, out.kernel, instantiation="", arch="sm_90", mode="cubin")
    assert build.resources.static_smem_bytes == 32 * 33 * 4


@needs_nvcc
@pytest.mark.parametrize(
    ("text", "kernel", "padded", "size"),
    [
        (DOUBLE_TILE, "transpose_double", "tile[TILE][TILE + 1]", 32 * 33 * 8),
        # A warp covers two 16-wide rows: +2 frees the column read, the row write stays 2-way.
        (TEMPLATED_TILE, "transpose_tpl", "s[B][B + 2]", 16 * 18 * 4),
    ],
)
def test_smem_padding_on_other_kernels(text, kernel, padded, size):
    ctx = context(text, kernel)
    (p,) = propose("smem_padding", ctx)
    assert padded in p.variant.text
    out = compiled(ctx, p)
    build = build_kernel(
        out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
    )
    assert build.resources.static_smem_bytes == size


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        (PADDED, "transpose_smem"),
        (ROW_ONLY, "row_reverse"),
        (FLAT_POINTER, "flat_reader"),
        (LANE_MODULO, "rotate"),
        ((FIXTURES / "transpose.cu").read_text(), "transpose_naive"),
    ],
)
def test_smem_padding_refuses(text, kernel):
    assert propose("smem_padding", context(text, kernel)) == []


# ---- coarsen_rows -----------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize(
    ("name", "kernel"), [("stencil2d.cu", "jacobi_step"), ("scale2d.cu", "scale2d")]
)
def test_coarsen_rows_on_the_fixtures(name, kernel):
    ctx = fixture(name, kernel)
    proposals = propose("coarsen_rows", ctx)
    assert proposals[0].params == {"rows": 4, "block": (32, 8)}
    assert {p.params["rows"] for p in proposals} == {2, 4, 8}
    assert len(proposals) <= 8
    for p in proposals:
        out = compiled(ctx, p)
        (bx, by), rows = p.params["block"], p.params["rows"]
        assert out.spec.launch.grid == [f"cdiv(cols, {bx})", f"cdiv(rows, {by * rows})"]
    # __restrict__ on both pointers: the loads take the read-only path and may pass the stores.
    assert "ld.global.nc.f32" in ptx(compiled(ctx, proposals[0]))


@needs_nvcc
def test_coarsen_rows_issues_the_loads_of_all_rows_together():
    ctx = fixture("scale2d.cu", "scale2d")
    p = propose("coarsen_rows", ctx)[0]
    blocks = re.split(r"\n\$L__BB\w+:|\bbra(?:\.uni)?\b", ptx(compiled(ctx, p)))
    assert max(b.count("ld.global.nc.f32") for b in blocks) == p.params["rows"]


@needs_nvcc
@pytest.mark.parametrize(("text", "kernel"), [(BRIGHTEN, "brighten"), (SHARPEN_INPLACE, "sharpen")])
def test_coarsen_rows_on_other_kernels(text, kernel):
    ctx = context(text, kernel)
    proposals = propose("coarsen_rows", ctx)
    assert proposals
    for p in proposals:
        compiled(ctx, p)


def test_coarsen_rows_turns_a_return_into_the_next_row():
    text = propose("coarsen_rows", context(SHARPEN_INPLACE, "sharpen"))[0].variant.text
    body = text[text.index("void sharpen") :]
    assert body.count("return;") == 1  # the column guard's; each row's becomes a continue
    assert body.count("continue;") == 2
    assert "float* __restrict__ data" in text and "const float* __restrict__ blur" in text


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        (JACOBI_IN_PLACE, "jacobi_in_place"),
        (COLUMN_SUMS, "column_sums"),
        ((FIXTURES / "bank_conflicts.cu").read_text(), "transpose_smem"),
        (LANE_HELPER, "lane_signs"),
        (GUARD_THREE, "left_half"),
        (SAXPY, "saxpy"),
    ],
)
def test_coarsen_rows_refuses(text, kernel):
    assert propose("coarsen_rows", context(text, kernel)) == []


# ---- flatten_2d -------------------------------------------------------------------------------


@needs_nvcc
def test_flatten_2d_on_the_fixture():
    ctx = fixture("scale2d.cu", "scale2d")
    (p,) = propose("flatten_2d", ctx)
    out = compiled(ctx, p)
    assert out.spec.launch.grid == ["cdiv(rows * cols, 256)"]
    assert out.spec.launch.block == ["256"]
    assert "if (idx < rows * cols)" in p.variant.text
    assert "out[idx] = alpha * in[idx] + beta;" in p.variant.text
    code = ptx(out)
    assert "%ctaid.y" not in code and "%tid.y" not in code


@needs_nvcc
@pytest.mark.parametrize(
    ("text", "kernel", "expected"),
    [
        (CHECKER_COLUMN_MAJOR, "checker", "int col = idx % cols;"),
        (BRIGHTEN, "brighten", "dst[idx] = clamp01(src[idx] * gain);"),
        (ACCUMULATE_WIDE, "accumulate", "if (i < static_cast<size_t>(h) * w)"),
        (ONE_DECLARATION, "blend", "out[at] = w * a[at] + (1.0f - w) * b[at];"),
    ],
)
def test_flatten_2d_on_other_kernels(text, kernel, expected):
    ctx = context(text, kernel)
    (p,) = propose("flatten_2d", ctx)
    assert expected in p.variant.text
    out = compiled(ctx, p)
    assert "%ctaid.y" not in ptx(out)


def test_flatten_2d_drops_the_row_offsets_of_aliases():
    text = propose("flatten_2d", context(BRIGHTEN, "brighten"))[0].variant.text
    assert "const float* src = img;" in text and "float* dst = out;" in text
    assert "int y =" not in text


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        ((FIXTURES / "stencil2d.cu").read_text(), "jacobi_step"),
        ((FIXTURES / "transpose.cu").read_text(), "transpose_naive"),
        (PITCHED, "pitched_copy"),
        (COLUMN_SUMS, "column_sums"),
        (SAXPY, "saxpy"),
    ],
)
def test_flatten_2d_refuses(text, kernel):
    assert propose("flatten_2d", context(text, kernel)) == []


# ---- all four ---------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", MANIFEST, ids=fixture_ids(MANIFEST))
def test_every_fixture_gets_a_list_never_an_exception(entry):
    ctx = fixture(entry["file"], entry["kernel"])
    for name in NAMES:
        assert isinstance(propose(name, ctx), list)
