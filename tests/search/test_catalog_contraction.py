"""contraction_tiling: GEMM tiles from the lifted model. Every spelling of a batched GEMM gets the
same kernel; each of the four layouts, a batch with its strides, column-major BLAS and an epilogue
with alpha/beta compute what the original computes (CUDA threads as host threads, sizes with
partial tiles); proposals compile for sm_90 without spills; nothing is proposed outside
contractions or where `gemm_tiling` already matches the text."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from optiml.harness.build import build_kernel
from optiml.lift import lift
from optiml.lift.families import describe
from optiml.search.catalog import Context, _hmma, by_name
from optiml.search.variant import Variant
from tests.host_cuda import mismatches, run_against
from tests.search.contraction_kernels import LAYOUTS, batched, batched16
from tests.support import FIXTURES, GOOD, WILD

CORPUS = FIXTURES / "corpus"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def context(text: str, kernel: str, path: str = "kernel.cu") -> Context:
    return Context.of(Variant(text), str(FIXTURES / path), kernel)


def corpus(file: str, kernel: str) -> Context:
    path = CORPUS / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


def propose(ctx: Context):
    return by_name("contraction_tiling").propose(ctx)


def variant(ctx: Context, proposal) -> Context:
    return Context.of(proposal.variant, ctx.source.path, ctx.kernel.name)


def body(ctx: Context) -> str:
    return ctx.source.text[ctx.kernel.body_span.start : ctx.kernel.body_span.end]


# The NN one spelled otherwise: rows on x, a while loop, fmaf, macros, an early return, size_t.
BATCHED_OTHERWISE = """
#define AT(p, i, j, ld) p[(size_t)(i) * (ld) + (j)]
/* @optiml
 *   args:   A: in float[Z * M * K], B: in float[Z * K * N], C: inout float[Z * M * N],
 *           Z = 3, sA = M * K, sB = K * N, alpha = 1.5, beta = -0.5
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16), Z), block = (16, 16)
 *   sizes:  M, N, K = (256, 192, 128), (37, 45, 19)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void bgemm(const float* A, const float* B, float* C, int Z, int M, int N, int K,
                      long long sA, long long sB, float alpha, float beta)
{
    const size_t j = threadIdx.x + (size_t)blockIdx.x * blockDim.x;
    const size_t i = threadIdx.y + (size_t)blockIdx.y * blockDim.y;
    const float* a = A + blockIdx.z * sA;
    const float* b = B + blockIdx.z * sB;
    if (i >= M || j >= N) return;
    float s = 0;
    int p = 0;
    while (p < K) {
        s = fmaf(AT(a, i, p, K), AT(b, p, j, N), s);
        p += 1;
    }
    const long long at = (long long)blockIdx.z * M * N + i * N + j;
    C[at] = alpha * s + beta * C[at];
}
"""

SIZES = [{"M": 37, "N": 45, "K": 19}, {"M": 68, "N": 136, "K": 24}]

# One GEMM written with a 2-D launch, and with a 1-D launch whose index is taken apart.
GRID_2D = """
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], bias: in float[N], C: out float[M * N]
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16)), block = (16, 16)
 *   sizes:  M, N, K = (256, 192, 128), (37, 45, 19)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void mm(const float* A, const float* B, const float* bias, float* C, int M, int N,
                   int K) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < M && c < N) {
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s += A[r * K + k] * B[k * N + c];
        C[r * N + c] = s + bias[c];
    }
}
"""

FLAT_1D = """
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], bias: in float[N], C: out float[M * N]
 *   launch: grid = cdiv(M * N, 256), block = 256
 *   sizes:  M, N, K = (256, 192, 128), (37, 45, 19)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void mm(const float* A, const float* B, const float* bias, float* C, int M, int N,
                   int K) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    if (tid < M * N) {
        int row = tid / N;
        int col = tid % N;
        float acc = 0;
        for (int k = 0; k < K; k++)
            acc += A[row * K + k] * B[k * N + col];
        C[tid] = acc + bias[col];
    }
}
"""


def test_every_spelling_gets_the_same_kernel():
    one, other = (context(t, "bgemm") for t in (batched("NN"), BATCHED_OTHERWISE))
    a, b = propose(one), propose(other)
    assert a and [p.params for p in a] == [p.params for p in b]
    for p, q in zip(a, b, strict=True):
        assert body(variant(one, p)) == body(variant(other, q))
        assert variant(one, p).spec.launch == variant(other, q).spec.launch


def test_a_flat_index_taken_apart_gets_the_2d_launchs_kernel():
    two_d, flat = context(GRID_2D, "mm"), context(FLAT_1D, "mm")
    a, b = propose(two_d), propose(flat)
    assert a and [p.params for p in a] == [p.params for p in b]
    for p, q in zip(a, b, strict=True):
        assert body(variant(two_d, p)) == body(variant(flat, q))
        assert variant(two_d, p).spec.launch == variant(flat, q).spec.launch


@needs_gxx
def test_a_flat_index_taken_apart_computes_what_the_original_does(tmp_path):
    ctx = context(FLAT_1D, "mm")
    candidates = [variant(ctx, p) for p in propose(ctx)[:3]]
    assert run_against(ctx, candidates, SIZES, tmp_path) == [0] * len(candidates)


def test_a_flat_launch_that_does_not_cover_the_output_is_left_alone():
    short = FLAT_1D.replace("grid = cdiv(M * N, 256)", "grid = cdiv(M * N, 512)")
    assert propose(context(short, "mm")) == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_are_read_off_the_strides(layout):
    ctx = context(batched(layout), "bgemm")
    proposals = propose(ctx)
    assert proposals
    a_k, b_k = layout[0] == "N", layout[1] == "T"
    out = variant(ctx, proposals[0])
    flags = f"{str(a_k).lower()}, {str(b_k).lower()}"
    assert f", {flags}, " in body(out)
    assert "const long long optiml_batch = blockIdx.z;" in body(out)
    assert out.spec.launch.grid[2] == "Z" and out.spec.launch.block == [
        str(proposals[0].params["threads"])
    ]
    assert out.spec.buffers == ctx.spec.buffers and out.spec.sizes == ctx.spec.sizes


@needs_gxx
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_computes_what_the_original_does(layout, tmp_path):
    ctx = context(batched(layout), "bgemm")
    candidates = [variant(ctx, p) for p in propose(ctx)[:3]]
    assert run_against(ctx, candidates, SIZES, tmp_path) == [0] * len(candidates)


@needs_gxx
def test_a_wrong_epilogue_is_caught(tmp_path):
    """The host comparison can fail: the same proposal with beta dropped differs."""
    ctx = context(batched("NT"), "bgemm")
    good = variant(ctx, propose(ctx)[0])
    text = good.source.text.replace(" + (beta * ", " + (0.0f * ")
    assert text != good.source.text
    broken = Context.of(Variant(text), ctx.source.path, "bgemm")
    assert mismatches(ctx, broken, SIZES[:1], tmp_path) > 0


CORPUS_CASES = [
    ("attention_bmm.cu", "bmm_qk", [{"BH": 2, "T": 37, "D": 13}]),
    ("attention_bmm.cu", "bmm_pv", [{"BH": 3, "T": 70, "D": 20}]),
    ("sgemm_colmajor.cu", "sgemm_nn_colmajor", [{"M": 45, "N": 70, "K": 9}]),
    ("linear_fwd.cu", "fc_forward", [{"batch": 37, "in_features": 19, "out_features": 70}]),
]


@needs_gxx
@pytest.mark.parametrize("file,kernel,sizes", CORPUS_CASES, ids=[c[1] for c in CORPUS_CASES])
def test_corpus_contractions_compute_what_the_original_does(file, kernel, sizes, tmp_path):
    ctx = corpus(file, kernel)
    candidates = [variant(ctx, p) for p in propose(ctx)[:2]]
    assert candidates
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)


@needs_nvcc
@pytest.mark.parametrize(
    "ctx",
    [
        pytest.param(lambda: context(batched("TN"), "bgemm"), id="batched-TN"),
        pytest.param(lambda: corpus("attention_bmm.cu", "bmm_qk"), id="bmm_qk"),
    ],
)
def test_proposals_compile_without_spills(ctx):
    ctx = ctx()
    for proposal in propose(ctx)[:2]:
        out = variant(ctx, proposal)
        build = build_kernel(
            out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
        )
        assert build.ok, build.log
        r = build.resources
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0


def compiled_clean(out: Context):
    """`out` built for sm_90 without spills or a stack: its resources."""
    build = build_kernel(
        out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
    )
    assert build.ok, build.log
    r = build.resources
    assert r.spill_store_bytes == 0 and r.stack_bytes == 0
    return r


def _all_kernels():
    for e in GOOD:
        yield FIXTURES / e["file"], e["kernel"]
    for e in WILD:
        yield FIXTURES / e["file"], e["kernel"]
    for e in tomllib.loads((CORPUS / "manifest.toml").read_text())["kernel"]:
        yield CORPUS / e["file"], e["kernel"]


def test_proposes_only_for_contractions_gemm_tiling_leaves():
    proposed = set()
    for path, kernel in _all_kernels():
        ctx = Context.of(Variant(Path(path).read_text()), str(path), kernel)
        if propose(ctx):
            family = describe(lift(ctx.source, ctx.kernel, ctx.spec)).family
            assert family == "contraction (matrix-matrix)", (path, kernel, family)
            assert not by_name("gemm_tiling").propose(ctx), (path, kernel)
            proposed.add(kernel)
    assert {"bmm_qk", "bmm_pv", "sgemm_nn_colmajor"} <= proposed


def test_proposes_nothing_on_its_own_output():
    ctx = corpus("attention_bmm.cu", "bmm_qk")
    assert propose(variant(ctx, propose(ctx)[0])) == []


# ---- the tensor-core schedule ----------------------------------------------------------------


def test_16_bit_operands_get_the_tensor_core_schedule_in_every_layout():
    for layout in LAYOUTS:
        for dtype, ctype in (("half", "__half"), ("bfloat16", "__nv_bfloat16")):
            ctx = context(batched16(layout, dtype), "hgemm")
            proposals = propose(ctx)
            assert proposals, (layout, dtype)
            out = variant(ctx, proposals[0])
            flags = f"{str(layout[0] == 'N').lower()}, {str(layout[1] == 'T').lower()}"
            assert f"optiml_hgemm::Mma<{ctype}, " in body(out) and body(out).count(flags) == 1
            smem = int(out.spec.launch.smem)
            assert 0 < smem <= 227 * 1024 and "mma.sync.aligned.m16n8k16" in out.source.text


def test_tensor_cores_only_where_the_tolerance_admits_them():
    text = batched16("NN", "half").replace("rtol = 1e-3, atol = 1e-3", "rtol = 1e-6, atol = 1e-6")
    assert propose(context(text, "hgemm")) == []
    # 16-bit inputs into fp32 whose sum is kept in 16 bits: not an fp32-accumulated product
    kept = batched16("NN", "half").replace("float acc = 0.0f;", "__half acc = 0.0f;")
    assert propose(context(kept, "hgemm")) == []


@needs_nvcc
@pytest.mark.parametrize("layout,dtype", [("NN", "half"), ("TT", "bfloat16")])
def test_tensor_core_proposals_compile_without_spills(layout, dtype):
    ctx = context(batched16(layout, dtype, out16=dtype == "bfloat16"), "hgemm")
    for proposal in propose(ctx)[:2]:
        r = compiled_clean(variant(ctx, proposal))
        assert r.registers * proposal.params["threads"] <= 65536


# A host model of the fragments: the template's own ldmatrix addresses (read from its text),
# ldmatrix's and mma.m16n8k16's register layouts as the PTX ISA defines them. Every (row, k) of A
# and (k, col) of B must reach the lane and register where mma reads it, in each layout.
def _addresses():
    found = re.findall(
        r"ldmatrix4<(true|false)>\((fa\[i\]|r), (sa|sb) \+ (.*?)\);", _hmma.HELPERS, re.S
    )
    assert len(found) == 4
    out = {}
    for trans, _, which, offset in found:
        text = " ".join(offset.split()).replace("A::LD", "LD").replace("B::LD", "LD")
        out[(which, trans == "true")] = text.replace("/", "//")
    return out


def _ldmatrix(smem: np.ndarray, addresses: list[int], trans: bool) -> np.ndarray:
    """regs[lane][matrix][half]: lane l gives the address of row l % 8 of matrix l // 8."""
    regs = np.zeros((32, 4, 2), dtype=smem.dtype)
    for lane in range(32):
        for j in range(4):
            for h in range(2):
                if trans:  # element (row 2 * (lane % 4) + h, column lane // 4)
                    regs[lane, j, h] = smem[addresses[j * 8 + 2 * (lane % 4) + h] + lane // 4]
                else:  # element (row lane // 4, column 2 * (lane % 4) + h)
                    regs[lane, j, h] = smem[addresses[j * 8 + lane // 4] + 2 * (lane % 4) + h]
    return regs


@pytest.mark.parametrize("k_contiguous", [True, False], ids=["k-contiguous", "x-contiguous"])
def test_ldmatrix_addresses_give_mma_its_fragments(k_contiguous):
    rng = np.random.default_rng(0)
    exprs = _addresses()
    ld = 16 + 8  # one 16-wide tile, padded as Operand pads it
    a = rng.integers(1, 1000, size=(16, 16))  # A[m][k]
    b = rng.integers(1, 1000, size=(16, 16))  # B[k][n], two n8 tiles
    sa, sb = np.zeros(16 * ld, dtype=int), np.zeros(16 * ld, dtype=int)
    for x in range(16):
        for k in range(16):
            sa[x * ld + k if k_contiguous else k * ld + x] = a[x, k]
            sb[x * ld + k if k_contiguous else k * ld + x] = b[k, x]
    env = {"m": 0, "n": 0, "kk": 0, "LD": ld}
    ra = _ldmatrix(
        sa,
        [eval(exprs[("sa", not k_contiguous)], {**env, "lane": lane}) for lane in range(32)],
        not k_contiguous,
    )
    rb = _ldmatrix(
        sb,
        [eval(exprs[("sb", not k_contiguous)], {**env, "lane": lane}) for lane in range(32)],
        not k_contiguous,
    )
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for h in range(2):
            # A: a0 (g, 2c + h), a1 (g + 8, ..), a2 (g, 2c + 8 + h), a3 (g + 8, 2c + 8 + h)
            assert ra[lane, 0, h] == a[g, 2 * c + h] and ra[lane, 1, h] == a[g + 8, 2 * c + h]
            assert ra[lane, 2, h] == a[g, 2 * c + 8 + h]
            assert ra[lane, 3, h] == a[g + 8, 2 * c + 8 + h]
            # B of n tile j: b0 (k = 2c + h, n = g), b1 (k = 2c + 8 + h); r[0..1] tile j, r[2..3] j+1
            for tile in range(2):
                assert rb[lane, 2 * tile, h] == b[2 * c + h, 8 * tile + g]
                assert rb[lane, 2 * tile + 1, h] == b[2 * c + 8 + h, 8 * tile + g]


# KernelBench's large-K GEMM as its formula writes it: C is 4 x 4 tiles of 64, K half a million.
LARGE_K = """
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], out: out float[M * N]
 *   launch: grid = cdiv(M * N, 256), block = 256
 *   sizes:  M, N, K = (256, 256, 524288), (37, 45, 1900)
 *   tol:    rtol = 1e-3, atol = 1e-3
 */
__global__ void mm(const float* A, const float* B, float* out, int M, int K, int N) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)M * N) return;
    const int n = (int)(idx % N), m = (int)(idx / N);
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[(long long)m * K + k] * B[(long long)k * N + n];
    out[idx] = acc;
}
"""


def split_proposals(text: str, kernel: str) -> tuple[Context, list]:
    ctx = context(text, kernel)
    return ctx, [p for p in propose(ctx) if p.params.get("split_k")]


def test_a_c_of_few_tiles_and_a_long_k_gets_k_split_over_a_cluster():
    ctx, split = split_proposals(LARGE_K, "mm")
    assert split, [p.params for p in propose(ctx)]
    best = propose(ctx)[0]
    # 16 tiles of 64 x 64 fill an eighth of 132 SMs: the split is ranked first, 8 blocks a tile
    assert best.params["split_k"] == 8 and (best.params["bm"], best.params["bn"]) == (64, 64)
    out = variant(ctx, best)
    assert "cluster_dims(1, 1, 8)" in out.source.text and "run_split<8>" in body(out)
    assert out.spec.launch.grid[2] == "8"
    # and the same tile with twice the warps (4 x 4 outputs a thread): one block of 4 warps alone
    # on its SM hides little latency
    eight_warps = [p.params for p in split if p.params["threads"] == 256]
    assert eight_warps and eight_warps[0]["split_k"] == 8 and eight_warps[0]["bm"] == 64
    # where C alone fills the GPU (a square 4096 GEMM), nothing is split
    square = LARGE_K.replace("(256, 256, 524288)", "(4096, 4096, 4096)")
    assert split_proposals(square, "mm")[1] == []
    # nor where K is too short for each block of the cluster to have 16 K tiles of its own
    short = LARGE_K.replace("(256, 256, 524288)", "(256, 256, 200)")
    assert split_proposals(short, "mm")[1] == []


@needs_gxx
def test_split_k_computes_what_the_original_does(tmp_path):
    """At sizes with partial tiles, K shorter than the cluster's share (blocks with no K tiles),
    and a batch whose blocks are split too."""
    ctx, split = split_proposals(LARGE_K, "mm")
    candidates = [variant(ctx, p) for p in split[:2]]
    sizes = [{"M": 37, "N": 45, "K": 1900}, {"M": 70, "N": 9, "K": 21}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)
    # the check can fail: the cluster's sum without the last block's part differs
    broken = candidates[0].source.text.replace(
        "for (int p = 0; p < S; ++p)", "for (int p = 0; p + 1 < S; ++p)"
    )
    assert broken != candidates[0].source.text
    wrong = Context.of(Variant(broken), ctx.source.path, "mm")
    assert mismatches(ctx, wrong, sizes[:1], tmp_path) > 0


BATCHED_LARGE_K = batched("NN").replace("Z = 3", "Z = 2")


@needs_gxx
def test_a_batched_split_k_computes_what_the_original_does(tmp_path):
    text = re.sub(
        r"sizes:\s+M, N, K = \([^)]*\)", "sizes:  M, N, K = (128, 64, 65536)", BATCHED_LARGE_K
    )
    ctx, split = split_proposals(text, "bgemm")
    assert split, [p.params for p in propose(ctx)]
    out = variant(ctx, split[0])
    assert f"blockIdx.z / {split[0].params['split_k']}" in body(out)
    assert run_against(ctx, [out], [{"M": 37, "N": 45, "K": 700}], tmp_path) == [0]


@needs_nvcc
def test_split_k_compiles_without_spills_for_sm_90():
    ctx, split = split_proposals(LARGE_K, "mm")
    for proposal in split[:2]:
        compiled_clean(variant(ctx, proposal))
