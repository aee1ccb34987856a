"""The contraction read off a lifted model: which thread index is M, N and the batch, each operand's
strides, K's range, the seed and what is refused — the same for every spelling of a GEMM."""

from __future__ import annotations

import pytest

from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, lift
from optiml.lift.contraction import NotOne, contraction
from optiml.spec import load, parse_spec
from tests.support import ROOT

CORPUS = ROOT / "fixtures" / "corpus"


def of_text(text: str):
    src = SourceFile(text, "k.cu")
    k = src.kernels[0]
    lifted = lift(src, k, parse_spec(src, k))
    assert isinstance(lifted, Lifted), lifted.message()
    return contraction(lifted)


def of_file(path, kernel: str):
    src, k, spec = load(path, kernel)
    lifted = lift(src, k, spec)
    assert isinstance(lifted, Lifted)
    return contraction(lifted)


def test_batched_attention_scores():
    c = of_file(CORPUS / "attention_bmm.cu", "bmm_qk")
    assert c.kind == "matrix-matrix"
    assert c.atoms == {"n": "g.x", "m": "g.y", "batch": "blockIdx.z"}
    assert c.extents == {"n": {("T",): 1}, "m": {("T",): 1}, "batch": {("BH",): 1}}
    assert (c.a.tensor, c.b.tensor) == ("Q", "K")
    assert c.a.strides == {"m": {("D",): 1}, "k": {(): 1}, "batch": {("strideQK",): 1}}
    assert c.b.strides == {"n": {("D",): 1}, "k": {(): 1}, "batch": {("strideQK",): 1}}
    assert c.out.strides == {"m": {("T",): 1}, "n": {(): 1}, "batch": {("strideS",): 1}}
    assert c.k_extent == {("D",): 1} and c.seed is None


def test_column_major_blas_names_m_by_the_outputs_unit_stride():
    c = of_file(CORPUS / "sgemm_colmajor.cu", "sgemm_nn_colmajor")
    # C(i, j) at j * ldc + i: i (on x) is the unit-stride index, so the tiles' columns
    assert c.atoms == {"n": "g.x", "m": "g.y"}
    assert (c.a.tensor, c.a.k_contiguous, c.a.leading("m")) == ("B", True, {("ldb",): 1})
    assert (c.b.tensor, c.b.k_contiguous, c.b.leading("n")) == ("A", False, {("lda",): 1})


def test_a_seeded_sum_and_a_vector():
    c = of_file(ROOT / "fixtures" / "wild" / "linear_bias.cu", "matmul_forward_naive")
    assert c.seed is not None and c.a.k_contiguous and c.b.k_contiguous
    v = of_file(CORPUS / "gemv_t.cu", "gemvTranspose")
    assert v.kind == "matrix-vector" and v.atoms == {"m": "g.x"}
    assert v.a.strides == {"m": {(): 1}, "k": {("N",): 1}} and v.b.strides == {"k": {(): 1}}


ROW_X = """
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], C: out float[M * N]
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16)), block = (16, 16)
 *   sizes:  M, N, K = (64, 48, 32), (19, 15, 11)
 */
__global__ void mm(const float* A, const float* B, float* C, int M, int N, int K) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < M && c < N) {
        float s = 0.0f;
        for (int k = 0; k < K; ++k) s += A[r * K + k] * B[k * N + c];
        C[r * N + c] = s;
    }
}
"""

# The same product: size_t indices, a macro, a while loop, fmaf, an early return, y first.
SPELLED_OTHERWISE = """
#define AT(p, i, j, ld) p[(size_t)(i) * (ld) + (j)]
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], C: out float[M * N]
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16)), block = (16, 16)
 *   sizes:  M, N, K = (64, 48, 32), (19, 15, 11)
 */
__global__ void mm(const float* A, const float* B, float* C, int M, int N, int K) {
    size_t col = threadIdx.x + (size_t)blockDim.x * blockIdx.x;
    size_t row = threadIdx.y + (size_t)blockDim.y * blockIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0;
    int p = 0;
    while (p < K) {
        acc = fmaf(AT(A, row, p, K), AT(B, p, col, N), acc);
        p++;
    }
    C[row * N + col] = acc;
}
"""


def test_spellings_read_the_same():
    a, b = of_text(ROW_X), of_text(SPELLED_OTHERWISE)
    for x in (a, b):
        assert x.atoms == {"n": "g.x", "m": "g.y"}
        assert (x.a.strides, x.b.strides) == (
            {"m": {("K",): 1}, "k": {(): 1}},
            {"k": {("N",): 1}, "n": {(): 1}},
        )
        assert x.extents == {"m": {("M",): 1}, "n": {("N",): 1}} and x.k_extent == {("K",): 1}


@pytest.mark.parametrize(
    "old,new,why",
    [
        ("s += A[r * K + k] * B[k * N + c];", "s += A[r * K + k] + B[k * N + c];", "products"),
        ("s += A[r * K + k] * B[k * N + c];", "s += A[r * K + k * k] * B[k * N + c];", "two"),
        ("C[r * N + c] = s;", "C[c * N + r] = s + C[r * N + c];", "another element"),
        (
            "s += A[r * K + k] * B[k * N + c];",
            "s += A[r * K + k] * C[k * N + c];",
            "the output is a factor",
        ),
        ("if (r < M && c < N) {", "if (r < M) {", "no bound"),
        ("for (int k = 0; k < K; ++k)", "for (int k = 0; k < K; k += 2)", "count by one"),
        ("C[r * N + c] = s;", "atomicAdd(&C[r * N + c], s);", None),
    ],
    ids=[
        "sum-of-sums",
        "quadratic",
        "reads-another-output-element",
        "output-as-a-factor",
        "unguarded-column",
        "step-two",
        "atomic",
    ],
)
def test_refused(old, new, why):
    assert old in ROW_X
    text = ROW_X.replace(old, new)
    src = SourceFile(text, "k.cu")
    k = src.kernels[0]
    lifted = lift(src, k, parse_spec(src, k))
    if not isinstance(lifted, Lifted):
        return  # refused earlier, by the lifting
    with pytest.raises(NotOne) as err:
        contraction(lifted)
    if why:
        assert why in str(err.value)
