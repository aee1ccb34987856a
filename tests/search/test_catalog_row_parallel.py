"""row_parallel: a warp or a block per row for one-thread-per-row kernels. It proposes on the
normalization fixtures and on row kernels written other ways, every proposal compiles for sm_90
with no spills and carries the float4 accesses and shuffles it is for, the one-pass fusions appear
only where the tree shows the two-loop pattern, and it proposes nothing where a loop carries a
dependence it cannot classify or a write it cannot prove safe."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from tests.support import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
ROW = by_name("row_parallel")

FIXTURE_KERNELS = [
    ("softmax.cu", "softmax_rows"),
    ("layernorm.cu", "layernorm_forward"),
    ("numpy_ref/rmsnorm.cu", "rmsnorm"),
]


def context(text: str, kernel: str, path: str = "kernel.cu") -> Context:
    return Context.of(Variant(text), str(FIXTURES / path), kernel)


def fixture(name: str, kernel: str) -> Context:
    return context((FIXTURES / name).read_text(), kernel, name)


def variant(ctx: Context, proposal) -> Context:
    return Context.of(proposal.variant, ctx.source.path, ctx.kernel.name)


def compiled(ctx: Context, proposal) -> Context:
    """The proposal's context, after checking that it compiles for sm_90 with no spills."""
    out = variant(ctx, proposal)
    build = build_kernel(
        out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
    )
    assert build.ok, build.log
    assert build.resources.spill_store_bytes == 0 and build.resources.spill_load_bytes == 0
    assert build.resources.stack_bytes == 0
    assert not [m for m in build.messages if m.severity == "warning"], build.log
    return out


def ptx(ctx: Context) -> str:
    run = subprocess.run(
        ["nvcc", "-arch=sm_90", "-O3", "-ptx", "-x", "cu", "-", "-o", "-"],
        input=ctx.source.text,
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout


def kernel_text(ctx: Context) -> str:
    return ctx.definition


def pick(proposals, **params):
    found = [p for p in proposals if all(p.params[k] == v for k, v in params.items())]
    assert found, f"no proposal with {params}: {[p.params for p in proposals]}"
    return found[0]


# ---- kernels written other ways --------------------------------------------------------------

# `if (r < rows) {...}`, threadIdx first, direct `in[(size_t)r * cols + j]` indexing, size_t loop
# variables, `j++` / `j += 1` / `cols > j`, `max` and `acc = acc + e`, __expf, a finite initial max.
SOFTMAX_DIRECT = """
/* @optiml
 *   args:   in: in float[rows * cols], out: out float[rows * cols], scale = 0.5
 *   launch: grid = cdiv(rows, 64), block = 64
 *   sizes:  rows, cols = (4096, 512), (333, 101)
 *   tol:    rtol = 1e-4, atol = 1e-6
 */
__global__ void softmax_direct(const float* in, float* out, int rows, int cols, float scale)
{
    int r = threadIdx.x + blockIdx.x * blockDim.x;
    if (r < rows) {
        float m = -3.0e38f;
        for (size_t j = 0; j < cols; j++)
            m = max(m, in[(size_t)r * cols + j] * scale);
        float total = 0.f;
        for (size_t j = 0; cols > j; j += 1) {
            total = total + __expf(in[(size_t)r * cols + j] * scale - m);
        }
        const float inv = 1.0f / total;
        for (size_t j = 0; j < cols; ++j) {
            float e = __expf(in[(size_t)r * cols + j] * scale - m);
            out[(size_t)r * cols + j] = e * inv;
        }
    }
}
"""

# A __device__ helper in the body, an offset local `base`, an accumulator that starts from a loaded
# value, an int counter (`count++`) under a condition, and a per-row statistic stored outside the
# loops (every lane stores the same value).
RMS_GELU = """
__device__ float gelu(float v)
{
    return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

/* @optiml
 *   args:   x: in float[n * d], bias: in float[n], w: in float[d], y: out float[n * d],
 *           stats: out float[n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n, d = (2048, 768), (301, 333)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void rms_gelu(const float* x, const float* bias, const float* w, float* y, float* stats,
                         int n, int d)
{
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n) { return; }
    const size_t base = (size_t)i * d;
    float acc = bias[i];
    int count = 0;
    for (int k = 0; k < d; ++k) {
        const float v = x[base + k];
        if (v > 0.0f) count++;
        acc += v * v;
    }
    const float inv = rsqrtf(acc / d + 1e-6f);
    stats[i] = inv * count;
    for (int k = 0; k < d; ++k) {
        y[base + k] = gelu(x[base + k] * inv) * w[k];
    }
}
"""

# The output written in one loop and normalized in place by the next: the same lane owns each
# element in both loops.
SOFTMAX_INPLACE = """
/* @optiml
 *   args:   src: in float[rows * cols], dst: out float[rows * cols]
 *   launch: grid = cdiv(rows, 256), block = 256
 *   sizes:  rows, cols = (2048, 1024), (1000, 777)
 *   tol:    rtol = 1e-4, atol = 1e-6
 */
__global__ void softmax_two_pass(const float* src, float* dst, int rows, int cols)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* a = src + (size_t)row * cols;
    float* b = dst + (size_t)row * cols;
    float hi = a[0];
    for (int j = 0; j < cols; ++j) hi = fmaxf(hi, a[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) {
        float e = expf(a[j] - hi);
        b[j] = e;
        s += e;
    }
    for (int j = 0; j < cols; ++j) b[j] = b[j] / s;
}
"""

# Mean as `mu = sum / cols`, variance as `ss += (X - mu) * (X - mu)`, int indexing; long rows.
STANDARDIZE = """
/* @optiml
 *   args:   x: in float[rows * cols], y: out float[rows * cols]
 *   launch: grid = cdiv(rows, 128), block = 128
 *   sizes:  rows, cols = (2048, 4096), (100, 1001)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void standardize(const float* x, float* y, int rows, int cols)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float sum = 0.0f;
        for (int j = 0; j < cols; ++j) sum = sum + x[row * cols + j];
        float mu = sum / cols;
        float ss = 0.0f;
        for (int j = 0; j < cols; ++j)
            ss += (x[row * cols + j] - mu) * (x[row * cols + j] - mu);
        float inv = rsqrtf(ss / cols + 1e-5f);
        for (int j = 0; j < cols; ++j) y[row * cols + j] = (x[row * cols + j] - mu) * inv;
    }
}
"""

# The max seeded with the row's first element and folded from the second on, as often written.
SOFTMAX_SEEDED = """
/* @optiml
 *   args:   x: in float[rows * cols], y: out float[rows * cols]
 *   launch: grid = cdiv(rows, 128), block = 128
 *   sizes:  rows, cols = (2048, 1024), (333, 101)
 *   tol:    rtol = 1e-4, atol = 1e-6
 */
__global__ void softmax_seeded(const float* x, float* y, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        const float* row = x + (size_t)r * cols;
        float* out = y + (size_t)r * cols;
        float m = row[0];
        for (int c = 1; c < cols; c++)
            m = fmaxf(m, row[c]);
        float s = 0.f;
        for (int c = 0; c < cols; c++)
            s += expf(row[c] - m);
        for (int c = 0; c < cols; c++)
            out[c] = expf(row[c] - m) / s;
    }
}
"""

OTHERS = [
    (SOFTMAX_DIRECT, "softmax_direct"),
    (SOFTMAX_SEEDED, "softmax_seeded"),
    (RMS_GELU, "rms_gelu"),
    (SOFTMAX_INPLACE, "softmax_two_pass"),
    (STANDARDIZE, "standardize"),
]

SPEC = """/* @optiml
 *   args:   x: in float[rows * cols], y: out float[rows * cols]
 *   launch: grid = cdiv(rows, 128), block = 128
 *   sizes:  rows, cols = (2048, 1024), (100, 777)
 */
"""
HEAD = """__global__ void k(const float* x, float* y, int rows, int cols)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
"""

# Loops this rewrite cannot classify, or writes it cannot prove safe.
REFUSED = {
    "prefix sum": """
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) { s += x[row * cols + j]; y[row * cols + j] = s; }
}""",
    "early exit": """
    for (int j = 0; j < cols; ++j) { if (x[row * cols + j] < 0.0f) break; y[row * cols + j] = 1; }
}""",
    "last value": """
    float last = 0.0f;
    for (int j = 0; j < cols; ++j) last = x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = last;
}""",
    "not a reduction": """
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s = s * 0.5f + x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = s;
}""",
    "product": """
    float p = 1.0f;
    for (int j = 0; j < cols; ++j) p *= x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = p;
}""",
    "neighbour read of the output": """
    for (int j = 0; j < cols; ++j) y[row * cols + j] = x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] += y[row * cols + (j + 1) % cols];
}""",
    "compound store outside the loops": """
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += x[row * cols + j];
    y[row] += s;
}""",
    "atomic": """
    for (int j = 0; j < cols; ++j) atomicAdd(&y[row * cols + j], x[row * cols + j]);
}""",
    "max from 1 not seeded with element 0": """
    float m = -1e30f;
    for (int j = 1; j < cols; ++j) if (x[row * cols + j] > m) m = x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = m;
}""",
    "max from 1 seeded with element 1": """
    float m = x[row * cols + 1];
    for (int j = 1; j < cols; ++j) if (m < x[row * cols + j]) m = x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = m;
}""",
    "sum from 1 seeded with element 0": """
    float s = x[row * cols];
    for (int j = 1; j < cols; ++j) s += x[row * cols + j];
    for (int j = 0; j < cols; ++j) y[row * cols + j] = s;
}""",
    "fmaxf from 1 seeded with element 0 of another value": """
    float m = x[row * cols];
    for (int j = 1; j < cols; ++j) m = fmaxf(m, 2.0f * x[row * cols + j]);
    for (int j = 0; j < cols; ++j) y[row * cols + j] = m;
}""",
    "fmaxf from 1 seeded with element 0, another call inside": """
    float m = x[row * cols];
    for (int j = 1; j < cols; ++j) m = fmaxf(m, x[row * cols + j] + sinf(1.0f));
    for (int j = 0; j < cols; ++j) y[row * cols + j] = m;
}""",
    "if-max with an else": """
    float m = x[row * cols];
    for (int j = 0; j < cols; ++j) {
        if (x[row * cols + j] > m) m = x[row * cols + j];
        else m = m - 1.0f;
    }
    for (int j = 0; j < cols; ++j) y[row * cols + j] = m;
}""",
    "thread per column": """
    float s = 0.0f;
    for (int r = 0; r < cols; ++r) s += x[r * rows + row];
    y[row] = s;
}""",
}

WARP_PER_ROW = (
    SPEC
    + """__global__ void k(const float* x, float* y, int rows, int cols)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += x[row * cols + j];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    for (int j = lane; j < cols; j += 32) y[row * cols + j] = x[row * cols + j] / s;
}
"""
)

ELEMENTWISE = (
    SPEC
    + """__global__ void k(const float* x, float* y, int rows, int cols)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = 2.0f * x[i];
}
"""
)


# ---- fixtures -----------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("name,kernel", FIXTURE_KERNELS, ids=[k for _, k in FIXTURE_KERNELS])
def test_proposes_on_the_fixtures_and_every_proposal_compiles(name, kernel):
    ctx = fixture(name, kernel)
    proposals = ROW.propose(ctx)
    assert 1 < len(proposals) <= 8
    assert [p.weight for p in proposals] == sorted((p.weight for p in proposals), reverse=True)
    best = proposals[0]
    # 1024 floats a row at the first size: 8 float4 per lane for a warp.
    assert best.params == {
        "mapping": "warp",
        "threads": 256,
        "vector": True,
        "chunks": 8,
        "online": False,
    }
    for p in proposals:
        out = compiled(ctx, p)
        grid, block, smem = out.launch
        if p.params["mapping"] == "warp":
            assert grid == [f"cdiv(rows, {p.params['threads'] // 32})"]
        else:
            assert grid == ["rows"]
        assert block == [str(p.params["threads"])] and smem == "0"
        # Every variant keeps a lane-strided scalar path: the second size (cols = 777, 333) and
        # misaligned rows take it.
        stride = "32" if p.params["mapping"] == "warp" else "threads"
        assert f"j < cols; j += {stride})" in kernel_text(out)
        if p.params["vector"]:
            assert "cols % 4 == 0" in kernel_text(out)


@needs_nvcc
def test_the_best_softmax_reads_the_row_once_as_float4_and_all_reduces_with_shuffles():
    ctx = fixture("softmax.cu", "softmax_rows")
    out = compiled(ctx, ROW.propose(ctx)[0])
    text = kernel_text(out)
    assert "optiml_row_ldg4(x_r[k], &x[j0])" in text  # the cache load, once
    assert text.count("x_r[k][c]") == 3  # every pass reads the registers
    assert "max_val = optiml_warp_fmaxf(max_val);" in text
    assert "sum = optiml_warp_sum(sum);" in text
    code = ptx(out)
    assert "ld.global.nc.v4.f32" in code
    assert "st.global.v4.f32" in code
    assert "shfl.sync.bfly.b32" in code


@needs_nvcc
def test_online_softmax_fuses_the_max_and_sum_loops():
    ctx = fixture("softmax.cu", "softmax_rows")
    fused = pick(ROW.propose(ctx), mapping="warp", vector=True, chunks=0, online=True)
    out = compiled(ctx, fused)
    text = kernel_text(out)
    assert "optiml_warp_softmax(max_val, sum);" in text
    assert "fmaxf(max_val," not in text  # the max loop is gone
    assert text.count("expf(") == 2 * 3  # rescale + add in the fused loop, normalize; 2 paths
    assert "online max/sum" in fused.summary


@needs_nvcc
def test_layernorm_one_pass_keeps_the_sum_and_merges_welford_triples():
    ctx = fixture("layernorm.cu", "layernorm_forward")
    fused = pick(ROW.propose(ctx), mapping="warp", vector=True, chunks=0, online=True)
    text = kernel_text(compiled(ctx, fused))
    assert "mean = optiml_warp_sum(mean);" in text
    assert "optiml_warp_welford(row_n, row_mean, row_m2);" in text
    assert "var += row_m2;" in text
    assert "var = optiml_warp_sum(var)" not in text


@needs_nvcc
def test_block_per_row_reduces_across_warps_through_shared_memory():
    ctx = fixture("layernorm.cu", "layernorm_forward")
    block = pick(ROW.propose(ctx), mapping="block", threads=512)
    out = compiled(ctx, block)
    assert "optiml_block_welford(" in kernel_text(out)
    code = ptx(out)
    assert "bar.sync" in code and "st.shared.f32" in code and "shfl.sync.bfly.b32" in code


def test_rmsnorm_has_no_fusion_to_offer():
    ctx = fixture("numpy_ref/rmsnorm.cu", "rmsnorm")
    assert not any(p.params["online"] for p in ROW.propose(ctx))


# ---- other kernels ------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("text,kernel", OTHERS, ids=[k for _, k in OTHERS])
def test_proposes_on_kernels_written_other_ways(text, kernel):
    ctx = context(text, kernel)
    proposals = ROW.propose(ctx)
    assert proposals
    for p in proposals:
        compiled(ctx, p)


def test_fusions_follow_the_tree():
    online = {
        kernel: {p.summary for p in ROW.propose(context(text, kernel)) if p.params["online"]}
        for text, kernel in OTHERS
    }
    assert all("online max/sum" in s for s in online["softmax_direct"])
    assert online["softmax_direct"]
    # the sum loop also stores exp(x - max): not the classic pair
    assert not online["softmax_two_pass"]
    assert not online["rms_gelu"]
    assert online["standardize"] and all("Welford" in s for s in online["standardize"])


def test_no_registers_for_rows_too_long_for_a_warp():
    # 4096 floats: 32 float4 per lane would not fit; a block of 256 holds 4 float4 per thread.
    proposals = ROW.propose(context(STANDARDIZE, "standardize"))
    assert not [p for p in proposals if p.params["mapping"] == "warp" and p.params["chunks"]]
    assert pick(proposals, mapping="block", threads=256).params["chunks"] == 4


def test_a_stored_per_row_value_and_a_loaded_initial_sum():
    ctx = context(RMS_GELU, "rms_gelu")
    text = kernel_text(variant(ctx, pick(ROW.propose(ctx), mapping="warp", vector=False)))
    assert "const float acc_init = acc;" in text
    assert "acc = acc_init + optiml_warp_sum(acc);" in text
    assert "count = optiml_warp_sum(count);" in text
    assert "stats[i] = inv * count;" in text


def test_unproven_fusions_are_not_offered():
    changed = FIXTURES.joinpath("layernorm.cu").read_text()
    changed = changed.replace("mean /= cols;", "mean /= (cols - 1);")
    assert not any(p.params["online"] for p in ROW.propose(context(changed, "layernorm_forward")))
    changed = FIXTURES.joinpath("softmax.cu").read_text()
    changed = changed.replace("sum += expf(x[j] - max_val);", "sum += expf(2.0f * x[j] - max_val);")
    assert not any(p.params["online"] for p in ROW.propose(context(changed, "softmax_rows")))


def test_launch_bounds_cap_the_block():
    text = FIXTURES.joinpath("softmax.cu").read_text()
    text = text.replace(
        "__global__ void softmax_rows", "__global__ void __launch_bounds__(128)\n softmax_rows"
    )
    proposals = ROW.propose(context(text, "softmax_rows"))
    assert proposals and all(p.params["threads"] <= 128 for p in proposals)


# ---- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_proposes_nothing_for_loops_it_cannot_classify(body):
    assert ROW.propose(context(SPEC + HEAD + body, "k")) == []


def test_proposes_nothing_on_a_kernel_that_is_already_warp_per_row():
    assert ROW.propose(context(WARP_PER_ROW, "k")) == []


def test_proposes_nothing_on_an_elementwise_kernel():
    assert ROW.propose(context(ELEMENTWISE, "k")) == []
    saxpy = FIXTURES / "saxpy.cu"
    assert ROW.propose(context(saxpy.read_text(), "saxpy", "saxpy.cu")) == []


MACRO_ROWS = """\
#define ROWS 300
/* @optiml
 *   args:   x: in float[ROWS * cols], y: out float[ROWS]
 *   sizes:  cols = 1024, 77
 *   launch: grid = cdiv(ROWS, 256), block = 256
 */
__global__ void row_sum(const float* x, float* y, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < ROWS) {
        float s = 0.0f;
        for (int c = 0; c < cols; ++c) s += x[r * cols + c];
        y[r] = s;
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_row_count_given_by_a_macro_is_read_with_the_files_constants(tmp_path):
    # the guard's bound is `ROWS`, a macro: evaluated with the file's constants (the launch's
    # coverage was checked without them, and nothing was proposed)
    from tests.host_cuda import run_against

    ctx = context(MACRO_ROWS, "row_sum")
    proposals = ROW.propose(ctx)
    assert proposals
    assert run_against(ctx, [variant(ctx, proposals[0])], [{"cols": 77}], tmp_path) == [0]
