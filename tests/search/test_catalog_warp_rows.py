"""`warp_rows`, the first schedule emitted from the lifted model: on kernels that compute one row
per thread, whatever their spelling (16-bit types, macros, a row written and normalized in place,
loops from 1, a per-row output besides the row), it proposes a warp per row whose values are the
model's; its first proposal compiles for sm_90 without spilling; kernels that are not one row per
thread get none. Results are checked against the originals on a GPU
(tests/search/test_gpu_catalog.py runs every transformation on the fixtures)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against
from tests.support import norm_rows

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
WARP = by_name("warp_rows")
ROWS = [
    ("softmax.cu", "softmax_rows"),
    ("layernorm.cu", "layernorm_forward"),
    ("numpy_ref/rmsnorm.cu", "rmsnorm"),
    ("wild/l2_normalize.cu", "l2_normalize_rows"),
    ("wild/gemv.cu", "gemv"),
    ("corpus/rmsnorm_fp16.cu", "rmsnorm_kernel"),
    ("corpus/layernorm_bf16.cu", "layernorm_forward_bf16"),
    ("corpus/cross_entropy.cu", "softmax_forward_kernel"),
    ("corpus/cross_entropy.cu", "crossentropy_forward_kernel"),
    ("corpus/log_softmax.cu", "log_softmax_fwd"),
]
NOT_ROWS = [
    ("saxpy.cu", "saxpy"),
    ("sgemm.cu", "sgemm_naive"),
    ("transpose.cu", "transpose_naive"),
    ("histogram.cu", "histogram_global"),
    ("bank_conflicts.cu", "transpose_smem"),
    ("corpus/cumsum_time_fp16.cu", "cumsum_dim1_half"),  # a scan down columns, thread per column
]
# Scans along a row, a thread per row: inclusive, exclusive, a running max, in float and int.
SCANS = [
    ("tricks/originals/cumsum_rows.cu", "cumsum_rows", ["rows", "cols"]),
    ("corpus/cumsum_exclusive.cu", "exclusive_scan_rows", ["rows", "cols"]),
    ("corpus/cummax_rows.cu", "cummaxRows", ["R", "L"]),
]
# A running product, a total per row besides the scan, a row that starts at an offset.
PRODUCT = """
/* @optiml
 *   args:   x: in float[R * L] in [0.5, 1.5), y: out float[R * L], last: out float[R]
 *   launch: grid = cdiv(R, 64), block = 64
 *   sizes:  R, L = (4096, 256), (37, 70)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void cumprod_rows(const float* x, float* y, float* last, int R, int L)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < R) {
        float p = 1.0f;
        for (int j = 0; j < L; j++) {
            p = p * x[r * L + j];
            y[r * L + j] = p;
        }
        last[r] = p;
    }
}
"""


def context(file: str, kernel: str) -> Context:
    path = ROOT / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


@pytest.mark.parametrize("file,kernel", ROWS, ids=[k for _, k in ROWS])
def test_a_row_kernel_gets_a_warp_per_row(file, kernel):
    proposals = WARP.propose(context(file, kernel))
    warps = [p for p in proposals if p.params["per_row"] == "warp"]
    assert [p.params["threads"] for p in warps] == [256, 128]
    text = warps[0].variant.text
    # every one of these reduces over its row: lanes stride over it, partials are all-reduced
    assert "optiml_k0 += 32" in text and "__shfl_xor_sync" in text
    v = SourceFile(text, str(ROOT / file))
    spec = parse_spec(v, v.kernel(kernel))
    assert spec.launch.grid[0].startswith("cdiv(") and spec.launch.block == ["256"]


@pytest.mark.parametrize("file,kernel", NOT_ROWS, ids=[k for _, k in NOT_ROWS])
def test_other_kernels_get_none(file, kernel):
    assert WARP.propose(context(file, kernel)) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,names", SCANS, ids=[k for _, k, _ in SCANS])
def test_a_scan_along_rows_is_scanned_by_a_warp(file, kernel, names, tmp_path):
    ctx = context(file, kernel)
    proposals = WARP.propose(ctx)
    assert [p.params["threads"] for p in proposals] == [256, 128]
    assert "__shfl_up_sync" in proposals[0].variant.text
    candidates = [Context.of(p.variant, ctx.source.path, kernel) for p in proposals]
    sizes = [dict(zip(names, v, strict=True)) for v in ((37, 70), (8, 33), (5, 64))]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_running_product_and_the_rows_total(tmp_path):
    ctx = Context.of(Variant(PRODUCT), str(ROOT / "kernel.cu"), "cumprod_rows")
    (first, _) = WARP.propose(ctx)
    text = first.variant.text
    assert "if (optiml_lane == 0) last[" in text  # the row's total, once, after the scan
    candidate = Context.of(first.variant, ctx.source.path, "cumprod_rows")
    sizes = [{"R": 37, "L": 70}, {"R": 8, "L": 32}]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


# A running max from the end of each row, written by hand: `j--` down to `j > -1`, the value
# stored before the row's own element is taken in (an exclusive suffix scan).
SUFFIX = """
/* @optiml
 *   args:   x: in float[R * L], y: out float[R * L]
 *   launch: grid = cdiv(R, 128), block = 128
 *   sizes:  R, L = (8192, 512), (37, 70)
 *   tol:    rtol = 1e-5, atol = 1e-6
 */
__global__ void suffix_max(const float* __restrict__ x, float* __restrict__ y, int R, int L)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    float m = -INFINITY;  // each row's last element stores it (equal infinities compare equal)
    for (int j = L - 1; j > -1; j--) {
        y[r * L + j] = m;
        m = fmaxf(m, x[r * L + j]);
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_scan_from_the_end_of_the_row_is_scanned_by_a_warp_from_the_end(tmp_path):
    ctx = Context.of(Variant(SUFFIX), str(ROOT / "kernel.cu"), "suffix_max")
    proposals = WARP.propose(ctx)
    assert [p.params["threads"] for p in proposals] == [256, 128]
    text = proposals[0].variant.text
    assert "-= 32" in text and "- optiml_lane" in text and "__shfl_up_sync" in text
    candidates = [Context.of(p.variant, ctx.source.path, "suffix_max") for p in proposals]
    sizes = [{"R": 37, "L": 70}, {"R": 8, "L": 32}, {"R": 5, "L": 1}]
    assert run_against(ctx, candidates, sizes, tmp_path, exact=True) == [0, 0]
    # a loop down the row that only reduces (no store of the running value) is not taken
    total = SUFFIX.replace("y[r * L + j] = m;\n", "").replace("    }\n}", "    }\n    y[r] = m;\n}")
    assert WARP.propose(Context.of(Variant(total), str(ROOT / "kernel.cu"), "suffix_max")) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_reverse_cumsum_as_generated_is_scanned_from_the_end(tmp_path):
    """KernelBench-format task 91 (fixtures/kb_extra) as `optiml generate --from-torch` writes it:
    `for (int i = input_shape - 1; i >= 0; --i)`."""
    from optiml.generate import generate
    from optiml.generate.from_torch import translate

    (path,) = (ROOT / "kb_extra").glob("91_*.py")
    t = translate(path.read_text(), path.name)
    g = generate(t.formula, t.name, ref_file=f"{t.name}_ref.py")
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    ctx = Context.of(Variant(g.kernel), str(tmp_path / f"{t.name}.cu"), t.name)
    proposals = WARP.propose(ctx)
    assert [p.params["threads"] for p in proposals] == [256, 128]
    candidates = [Context.of(p.variant, ctx.source.path, t.name) for p in proposals]
    sizes = [{"batch_size": 9, "input_shape": 101}, {"batch_size": 3, "input_shape": 32}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


def test_a_scan_that_reads_what_an_earlier_iteration_stored_is_refused():
    text = PRODUCT.replace("p = p * x[r * L + j];", "p = p * x[r * L + j] + y[r * L + j - 1];")
    text = text.replace("for (int j = 0;", "for (int j = 1;")
    assert WARP.propose(Context.of(Variant(text), str(ROOT / "kernel.cu"), "cumprod_rows")) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("file,kernel", ROWS, ids=[k for _, k in ROWS])
def test_the_first_proposal_compiles_without_spills(file, kernel):
    for p in WARP.propose(context(file, kernel))[:1]:
        v = SourceFile(p.variant.text, str(ROOT / file))
        k = v.kernel(kernel)
        b = build_kernel(
            v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90", mode="cubin"
        )
        assert b.ok, b.log[-2000:]
        assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_generated_instance_norm_gets_a_warp_per_row_of_two_indices(tmp_path):
    """OptiML-G's plain kernel of a norm over the last two axes: a thread per (n, c), the row
    count a product of sizes; a warp per row computes what it does."""
    from optiml.generate import generate

    g = generate(
        "float x[N, C, H, W]; mu[n, c] = mean(h, w) x[n, c, h, w]; "
        "v[n, c] = mean(h2, w2) (x[n, c, h2, w2] - mu[n, c]) ** 2; "
        "y[n, c, h, w] = (x[n, c, h, w] - mu[n, c]) / sqrt(v[n, c] + 1e-5)",
        "inorm",
        ref_file="inorm_ref.py",
        schedule=False,  # the thread per row; by default too few rows get a cluster each
    )
    path = tmp_path / "inorm.cu"
    path.write_text(g.kernel)
    (tmp_path / "inorm_ref.py").write_text(g.reference)
    ctx = Context.of(Variant(g.kernel), str(path), "inorm")
    assert "cdiv(N * C, 256)" in g.kernel
    proposals = [p for p in WARP.propose(ctx) if p.params["per_row"] == "warp"]
    assert [p.params["threads"] for p in proposals] == [256, 128]
    assert "cdiv(N * C, 8)" in proposals[0].variant.text
    candidates = [Context.of(p.variant, str(path), "inorm") for p in proposals]
    sizes = [{"N": 2, "C": 3, "H": 5, "W": 7}, {"N": 3, "C": 2, "H": 4, "W": 9}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize(
    "name,formula,sizes",
    [
        # a channel's statistics over the batch and the pixels around it: its elements are the
        # flat counter's digits in a row-major layout, each stored once
        (
            "bnorm",
            "float x[B, F, H, W]; B = 32; F = 64; H = 256; W = 256; eps = 1e-5\n"
            "mu[f] = mean(b, h, w) x[b, f, h, w]\n"
            "var[f] = mean(b, h, w) (x[b, f, h, w] - mu[f]) ** 2\n"
            "y[b, f, h, w] = (x[b, f, h, w] - mu[f]) * rsqrt(var[f] + eps)",
            [{"B": 3, "F": 2, "H": 5, "W": 7}, {"B": 2, "F": 3, "H": 4, "W": 9}],
        ),
        # a tensor over its whole norm: one row
        (
            "whole",
            "float x[B, F]; B = 4096; F = 2048\n"
            "y[b, f] = x[b, f] / sqrt(sum(b2, f2) x[b2, f2] * x[b2, f2])",
            [{"B": 3, "F": 37}, {"B": 5, "F": 70}],
        ),
    ],
)
def test_a_batch_norm_and_a_whole_norm_as_generated_get_a_warp_block_and_cluster(
    name, formula, sizes, tmp_path
):
    from optiml.generate import generate

    g = generate(formula, name, ref_file=f"{name}_ref.py", schedule=False)
    path = tmp_path / f"{name}.cu"
    path.write_text(g.kernel)
    (tmp_path / f"{name}_ref.py").write_text(g.reference)
    ctx = Context.of(Variant(g.kernel), str(path), name, sm_count=132)
    by = {p.params["per_row"]: p for p in WARP.propose(ctx)}
    assert set(by) == {"warp", "block", "cluster"}
    assert by["cluster"].params["cluster"] == 8
    candidates = [Context.of(by[k].variant, str(path), name) for k in by]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0, 0]
    # the batch norm's element of its channel, the quotient and remainder of the counter by
    # H * W, divided before each loop and carried from step to step: no division in a loop
    for p in by.values():
        assert not re.search(r"optiml_k\d+ [/%]", p.variant.text), p.variant.text
    assert ("optiml_q1_step" in by["cluster"].variant.text) == (name == "bnorm")
    # what `optiml generate` writes by default: its rows (64 channels of 2 M elements, one of 8 M)
    # too few for a warp each to fill 132 SMs and too long for a thread to walk in a second, the
    # cluster per row; before sm_90, the block per row
    for arch, kind in ((None, "cluster"), ("sm_80", "block")):
        scheduled = generate(formula, name, ref_file=f"{name}_ref.py", arch=arch)
        lines = scheduled.kernel.split("\n")
        (why,) = [line for line in lines if line.startswith("// Its rows are too few")]
        assert "\n".join(line for line in lines if line != why) == by[kind].variant.text
        assert any(kind in note for note in scheduled.notes)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_batch_norms_carried_division_holds_in_every_schedule_and_a_kept_row(tmp_path):
    """A batch norm short enough per channel (8 x 32 x 33 elements) for the row to be kept in
    shared memory: each of warp_rows' six schedules carries the quotient and remainder of its
    counter by H * W from step to step, and each equals the plain kernel where the plane is
    shorter than a warp's step (3 x 5), between a warp's and a block's (5 x 7) and longer."""
    from optiml.generate import generate

    g = generate(
        "float x[B, F, H, W]; B = 8; F = 64; H = 32; W = 33; eps = 1e-5\n"
        "mu[f] = mean(b, h, w) x[b, f, h, w]\n"
        "var[f] = mean(b, h, w) (x[b, f, h, w] - mu[f]) ** 2\n"
        "y[b, f, h, w] = (x[b, f, h, w] - mu[f]) * rsqrt(var[f] + eps)",
        "bn",
        ref_file="bn_ref.py",
        schedule=False,
    )
    path = tmp_path / "bn.cu"
    path.write_text(g.kernel)
    (tmp_path / "bn_ref.py").write_text(g.reference)
    ctx = Context.of(Variant(g.kernel), str(path), "bn", sm_count=132)
    proposals = WARP.propose(ctx)
    assert sum("keep" in p.params for p in proposals) == 2 and len(proposals) == 6
    assert all("optiml_q1_step" in p.variant.text for p in proposals)
    candidates = [Context.of(p.variant, str(path), "bn") for p in proposals]
    sizes = [
        {"B": 3, "F": 2, "H": 3, "W": 5},
        {"B": 2, "F": 3, "H": 5, "W": 7},
        {"B": 2, "F": 2, "H": 23, "W": 29},
    ]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * 6


def test_a_store_that_two_of_the_counters_values_share_is_refused(tmp_path):
    # the batch norm's output element (b, h, w) of its channel, from the counter over them as
    # the quotient and remainder of H * W, moved to the remainder of H: the iterations along w
    # share one element, and the row may not be split over lanes
    from optiml.generate import generate

    g = generate(
        "float x[B, F, H, W]\nmu[f] = mean(b, h, w) x[b, f, h, w]\n"
        "y[b, f, h, w] = x[b, f, h, w] - mu[f]",
        "bn",
        ref_file="bn_ref.py",
    )
    (tmp_path / "bn_ref.py").write_text(g.reference)
    path = str(tmp_path / "bn.cu")
    assert WARP.propose(Context.of(Variant(g.kernel), path, "bn", sm_count=132))
    store = "* ((long long)H * W) + (col2 % ((long long)H * W)))] = (x["
    assert store in g.kernel, g.kernel
    text = g.kernel.replace(store, store.replace("% ((long long)H * W)", "% H"))
    assert WARP.propose(Context.of(Variant(text), path, "bn", sm_count=132)) == []


# Few, long rows (a layer norm over all but the batch axis): warps would leave the GPU idle.
FEW_ROWS = """
/* @optiml
 *   args:   x: in float[B * L], y: out float[B * L]
 *   launch: grid = cdiv(B, 64), block = 64
 *   sizes:  B, L = (16, 1 << 22), (3, 4099)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void norm_rows(const float* x, float* y, int B, int L)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const float* r = x + (size_t)b * L;
    float s = 0.f, m = -INFINITY;
    for (int i = 0; i < L; i++) { s += r[i]; m = fmaxf(m, r[i]); }
    float mean = s / L, q = 0.f;
    for (int i = 0; i < L; i++) q += (r[i] - mean) * (r[i] - mean);
    float inv = rsqrtf(q / L + 1e-5f);
    for (int i = 0; i < L; i++) y[(size_t)b * L + i] = (r[i] - mean) * inv + 0.01f * m;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_few_long_rows_get_a_block_and_a_cluster_per_row(tmp_path):
    ctx = Context.of(Variant(FEW_ROWS), str(ROOT / "kernel.cu"), "norm_rows", sm_count=132)
    by = {p.params["per_row"]: p for p in WARP.propose(ctx)}
    assert set(by) == {"warp", "block", "cluster"}
    assert by["cluster"].params["cluster"] == 8 and by["cluster"].weight > by["warp"].weight
    text = by["cluster"].variant.text
    assert "cluster_dims(8, 1, 1)" in text and "grid = (B) * 8, block = 512" in text
    candidates = [Context.of(by[k].variant, ctx.source.path, "norm_rows") for k in by]
    sizes = [{"B": 3, "L": 4099}, {"B": 2, "L": 37}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0, 0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_cluster_per_row_compiles_for_sm90_without_spills():
    ctx = Context.of(Variant(FEW_ROWS), str(ROOT / "kernel.cu"), "norm_rows", sm_count=132)
    (p,) = [p for p in WARP.propose(ctx) if p.params["per_row"] == "cluster"]
    v = SourceFile(p.variant.text, str(ROOT / "kernel.cu"))
    k = v.kernel("norm_rows")
    b = build_kernel(v, k, instantiation="", arch="sm_90", mode="cubin")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0


# Where a row's max (first) and min (last, `<=`) are met, over values with many ties.
ARG = """
/* @optiml
 *   args:   x: in int[R * C] in [0, 3), first_max: out int[R], last_min: out int[R]
 *   launch: grid = cdiv(R, 128), block = 128
 *   sizes:  R, C = (1 << 16, 1024), (37, 70)
 */
__global__ void arg_rows(const int* x, int* first_max, int* last_min, int R, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    float hi = -1.0f, lo = 1e9f;
    int at_hi = -1, at_lo = -1;
    for (int c = 0; c < C; ++c) {
        float v = (float)x[r * C + c];
        if (v > hi) { hi = v; at_hi = c; }
        if (v <= lo) { lo = v; at_lo = c; }
    }
    first_max[r] = at_hi;
    last_min[r] = at_lo;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_argmax_and_argmin_keep_the_loops_choice_among_ties(tmp_path):
    ctx = Context.of(Variant(ARG), str(ROOT / "kernel.cu"), "arg_rows")
    proposals = WARP.propose(ctx)
    assert [p.params["per_row"] for p in proposals] == ["warp", "warp"]
    candidates = [Context.of(p.variant, ctx.source.path, "arg_rows") for p in proposals]
    sizes = [{"R": 37, "C": 70}, {"R": 9, "C": 33}, {"R": 5, "C": 1}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]
    # the check can fail: ties taken the other way differ
    wrong = proposals[0].variant.text.replace("optiml_ok < at_hi_k0", "optiml_ok > at_hi_k0")
    assert wrong != proposals[0].variant.text
    broken = Context.of(Variant(wrong), ctx.source.path, "arg_rows")
    assert run_against(ctx, [broken], sizes[:1], tmp_path) != [0]


def test_many_long_rows_also_get_a_block_per_row_and_short_ones_do_not():
    # 16384 rows fill the GPU with warps, but rows of 8192 keep each warp's lanes walking them
    # pass after pass: a block per row is proposed beside the warps (after them, no cluster),
    # and blocks of 512 and of 1024 threads that keep the row in shared memory (8192 floats)
    many = FEW_ROWS.replace("(16, 1 << 22)", "(16384, 8192)")
    ctx = Context.of(Variant(many), str(ROOT / "kernel.cu"), "norm_rows", sm_count=132)
    found = WARP.propose(ctx)
    assert [(p.params["per_row"], "keep" in p.params) for p in found] == [
        ("warp", False),
        ("warp", False),
        ("block", False),
        ("block", True),
        ("block", True),
    ]
    assert [p.params["threads"] for p in found[3:]] == [512, 1024]
    assert found[2].weight < found[0].weight
    short = FEW_ROWS.replace("(16, 1 << 22)", "(16384, 1024)")
    ctx = Context.of(Variant(short), str(ROOT / "kernel.cu"), "norm_rows", sm_count=132)
    assert [p.params["per_row"] for p in WARP.propose(ctx)] == ["warp", "warp"]


# A max over the row, then a sum of exp(value - max): one pass (an online softmax's pair).
ONLINE = [
    ("softmax.cu", "softmax_rows", {"rows": 37, "cols": 70}),
    ("corpus/log_softmax.cu", "log_softmax_fwd", None),
    ("corpus/cross_entropy.cu", "crossentropy_forward_kernel", None),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,size", ONLINE, ids=[k for _, k, _ in ONLINE])
def test_a_max_and_a_sum_of_exp_from_it_are_one_pass(file, kernel, size, tmp_path):
    # (not cross_entropy.cu's softmax_forward_kernel: its sum's loop also stores each exp)
    ctx = context(file, kernel)
    (warp, *_) = [p for p in WARP.propose(ctx) if p.params["per_row"] == "warp"]
    text = warp.variant.text
    body = text[text.index(f"void {kernel}(") :]
    loops = body.count("+= 32)")
    assert "expf(optiml_v - optiml_m)" in body and "_other0" in body
    original_loops = ctx.source.text[ctx.kernel.span.start : ctx.kernel.span.end].count("for (")
    assert loops == original_loops - 1  # the max's and the sum's loops are one
    candidate = Context.of(warp.variant, ctx.source.path, kernel)
    sizes = [size] if size else [ctx.spec.sizes[-1]]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_one_pass_holds_on_values_far_apart(tmp_path):
    # values over [-40, 40): exp of their differences spans 35 orders of magnitude, and each
    # lane's sum is rescaled whenever its max grows
    text = (ROOT / "softmax.cu").read_text()
    wide = text.replace("input: in float[rows * cols]", "input: in float[rows * cols] in [-40, 40)")
    assert wide != text
    ctx = Context.of(Variant(wide), str(ROOT / "softmax.cu"), "softmax_rows")
    (warp, *_) = [p for p in WARP.propose(ctx) if p.params["per_row"] == "warp"]
    candidate = Context.of(warp.variant, ctx.source.path, "softmax_rows")
    sizes = [{"rows": 37, "cols": 70}, {"rows": 5, "cols": 1000}, {"rows": 3, "cols": 7}]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


def _softmax_with_rows(sizes: str) -> Context:
    text = (ROOT / "softmax.cu").read_text()
    changed = text.replace("(32768, 1024), (1000, 777)", sizes)
    assert changed != text
    return Context.of(Variant(changed), str(ROOT / "softmax.cu"), "softmax_rows", sm_count=132)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_block_per_long_row_makes_the_one_pass_too(tmp_path):
    ctx = _softmax_with_rows("(64, 8192), (5, 4099)")
    (block,) = [
        p for p in WARP.propose(ctx) if p.params["per_row"] == "block" and "keep" not in p.params
    ]
    v = block.variant.source("softmax.cu")
    k = v.kernel("softmax_rows")
    body = v.text[k.span.start : k.span.end]
    assert body.count("+= 512)") == 2 and "optiml_sm_0[16]" in body  # 16 warps' pairs
    candidate = Context.of(block.variant, ctx.source.path, "softmax_rows")
    sizes = [{"rows": 5, "cols": 4099}, {"rows": 3, "cols": 70}]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


# A sum, then a sum of squares about a value of it (a mean): Welford's one pass.
SPREAD = [
    ("layernorm.cu", "layernorm_forward"),
    ("corpus/layernorm_bf16.cu", "layernorm_forward_bf16"),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel", SPREAD, ids=[k for _, k in SPREAD])
def test_a_sum_and_the_squares_about_its_mean_are_one_pass(file, kernel, tmp_path):
    ctx = context(file, kernel)
    proposals = [p for p in WARP.propose(ctx) if p.params["per_row"] in ("warp", "block")]
    assert proposals
    original = ctx.source.text[ctx.kernel.span.start : ctx.kernel.span.end]
    for p in proposals:
        v = p.variant.source(file)
        k = v.kernel(kernel)
        body = v.text[k.span.start : k.span.end]
        loops = body.count(f"+= {32 if p.params['per_row'] == 'warp' else 512})")
        assert "optiml_m20" in body and loops == original.count("for (") - 1
    if kernel.endswith("bf16"):
        return  # the host's emulation compares no bf16 outputs; the GPU catalog run checks it
    candidates = [Context.of(p.variant, ctx.source.path, kernel) for p in proposals]
    sizes = [ctx.spec.sizes[-1]]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_one_pass_spread_is_nearer_the_exact_result_far_from_zero(tmp_path):
    # values in [lo, lo + 1): the mean is far from zero, where a float sum loses digits. Against
    # the kernel computing its statistics in double (what the GPU harness's oracle does), the one
    # pass is within the tolerance where the float kernel is not, and never further off.
    text = (ROOT / "layernorm.cu").read_text()
    exact = {
        "float mean = 0.0f;": "double mean = 0.0;",
        "float var = 0.0f;": "double var = 0.0;",
        "float d = xr[j] - mean;": "double d = xr[j] - mean;",
        "float rstd = 1.0f / sqrtf(var + eps);": "double rstd = 1.0 / sqrt(var + eps);",
    }
    sizes = [{"rows": 7, "cols": 1000}, {"rows": 3, "cols": 33}]
    for lo in (10, 1000):
        shifted = text.replace(
            "x: in float[rows * cols]", f"x: in float[rows * cols] in [{lo}, {lo + 1})"
        )
        double = shifted
        for a, b in exact.items():
            assert a in double
            double = double.replace(a, b)
        ctx = Context.of(Variant(shifted), str(ROOT / "layernorm.cu"), "layernorm_forward")
        ref = Context.of(Variant(double), str(ROOT / "layernorm.cu"), "layernorm_forward")
        (warp, *_) = WARP.propose(ctx)
        candidate = Context.of(warp.variant, ctx.source.path, "layernorm_forward")
        as_written, one_pass = run_against(ref, [ctx, candidate], sizes, tmp_path)
        assert one_pass <= as_written and as_written > 0
        if lo == 10:
            assert one_pass == 0


# Few long rows: a block and a cluster of blocks per row make both one-pass forms too.
LONG_NORM = norm_rows("(16, 1 << 22), (3, 4099)")


def _long_rows(kind: str) -> tuple[Context, str]:
    if kind == "norm":
        return Context.of(Variant(LONG_NORM), str(ROOT / "kernel.cu"), "norm_rows", sm_count=132), (
            "optiml_m20"
        )
    return _softmax_with_rows("(16, 1 << 22), (5, 4099)"), "expf(optiml_v - optiml_m)"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("kind", ["norm", "softmax"])
def test_a_block_and_a_cluster_per_long_row_make_the_one_pass(kind, tmp_path):
    ctx, mark = _long_rows(kind)
    by = {p.params["per_row"]: p for p in WARP.propose(ctx)}
    assert {"block", "cluster"} <= set(by) and by["cluster"].params["cluster"] == 8
    original = ctx.source.text[ctx.kernel.span.start : ctx.kernel.span.end].count("for (")
    for per_row, stride in (("block", 512), ("cluster", 4096)):
        v = by[per_row].variant.source(ctx.source.path)
        k = v.kernel(ctx.kernel.name)
        body = v.text[k.span.start : k.span.end]
        assert mark in body and body.count(f"+= {stride})") == original - 1
    assert "__cluster_map_shared_rank(&optiml_s" in by["cluster"].variant.text
    candidates = [Context.of(by[k].variant, ctx.source.path, ctx.kernel.name) for k in by]
    sizes = [ctx.spec.sizes[-1], {n: 2 if i == 0 else 37 for i, n in enumerate(ctx.spec.sizes[0])}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("kind", ["norm", "softmax"])
def test_the_one_pass_per_block_and_cluster_compiles_for_sm90_without_spills(kind):
    ctx, _ = _long_rows(kind)
    for p in WARP.propose(ctx):
        if p.params["per_row"] == "warp":
            continue
        v = SourceFile(p.variant.text, ctx.source.path)
        b = build_kernel(v, v.kernel(ctx.kernel.name), instantiation="", arch="sm_90", mode="cubin")
        assert b.ok, b.log[-2000:]
        assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0


def test_a_long_row_is_kept_in_the_shared_memory_of_a_block_or_a_cluster():
    # KernelBench's LogSoftmax rows (393,216 floats, 1.5 MB): a cluster of 8 blocks holds one
    # (110 floats a thread of 512 each, or 55 of 1024); a vocabulary's 50,000 fit one block
    for sizes, cluster in (("(4096, 393216), (5, 4099)", 8), ("(512, 50000), (5, 4099)", 1)):
        ctx = _softmax_with_rows(sizes)
        found = [p for p in WARP.propose(ctx) if "keep" in p.params]
        assert [p.params for p in found] == [
            {
                "threads": threads,
                "per_row": "cluster" if cluster > 1 else "block",
                "cluster": cluster,
                "keep": keep,
            }
            for threads, keep in ((512, 110), (1024, 55))
        ]
        for kept, (threads, keep) in zip(found, ((512, 110), (1024, 55)), strict=True):
            text = kept.variant.text
            slots = f"min(cdiv(cols, {threads * cluster}), {keep}) * {threads * 4}"
            assert f"block = {threads}, smem = {slots}" in text
            body = text[text.index("softmax_rows(const") :]
            # read from DRAM by the first pass only; the output's pass reads the kept row
            assert body.count("input[") == 2 and "optiml_keep0[" in body
    # a row longer than 8 blocks hold, or a warp per row: nothing kept
    assert not [
        p
        for p in WARP.propose(_softmax_with_rows("(16, 1 << 22), (5, 4099)"))
        if "keep" in p.params
    ]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("kind", ["norm", "softmax"])
def test_a_kept_row_computes_what_the_kernel_does_and_a_longer_one_too(kind, tmp_path, monkeypatch):
    # room for 2 passes of the cluster's threads: rows of up to 8,192 are kept, longer ones
    # read as the kernel reads them
    import optiml.search.catalog.warp_rows as module

    monkeypatch.setattr(module, "KEEP_BYTES", 2 * 4096)
    text = LONG_NORM if kind == "norm" else (ROOT / "softmax.cu").read_text()
    text = text.replace("(16, 1 << 22), (3, 4099)", "(16, 8000), (3, 4099)")
    text = text.replace("(32768, 1024), (1000, 777)", "(16, 8000), (3, 4099)")
    kernel = "norm_rows" if kind == "norm" else "softmax_rows"
    ctx = Context.of(Variant(text), str(ROOT / "kernel.cu"), kernel, sm_count=132)
    found = [p for p in WARP.propose(ctx) if "keep" in p.params]
    # 4 slots a thread of 512 or 2 of 1024, in a cluster of 4: rows of up to 8,192 kept
    assert [(p.params["threads"], p.params["cluster"], p.params["keep"]) for p in found] == [
        (512, 4, 4),
        (1024, 4, 2),
    ]
    candidates = [Context.of(p.variant, ctx.source.path, kernel) for p in found]
    names = list(ctx.spec.sizes[0])
    sizes = [dict(zip(names, v, strict=True)) for v in ((2, 8000), (2, 8193), (3, 37))]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_a_kept_row_compiles_for_sm90_without_spills():
    ctx = _softmax_with_rows("(4096, 393216), (5, 4099)")
    found = [p for p in WARP.propose(ctx) if "keep" in p.params]
    assert len(found) == 2
    for kept in found:
        v = SourceFile(kept.variant.text, ctx.source.path)
        b = build_kernel(v, v.kernel("softmax_rows"), instantiation="", arch="sm_90", mode="cubin")
        assert b.ok, b.log[-2000:]
        assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0
