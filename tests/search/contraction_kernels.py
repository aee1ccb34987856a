"""Naive batched GEMMs as people write them, in each of the four layouts, for the contraction
schedules' tests: fp32 with alpha/beta, and 16-bit (half or bf16) operands with an fp32 sum into
an fp32 output, or into a 16-bit output through a bias and a ReLU."""

from __future__ import annotations

LAYOUTS = ["NN", "NT", "TN", "TT"]


def _operands(layout: str) -> tuple[str, str]:
    """A (M x K) row-major ("N": k contiguous) or transposed; B (K x N) row-major ("N": n
    contiguous) or transposed (k contiguous)."""
    a = (
        "A[bz * sA + (size_t)row * K + k]"
        if layout[0] == "N"
        else "A[bz * sA + (size_t)k * M + row]"
    )
    b = (
        "B[bz * sB + (size_t)k * N + col]"
        if layout[1] == "N"
        else "B[bz * sB + (size_t)col * K + k]"
    )
    return a, b


def batched(layout: str) -> str:
    a, b = _operands(layout)
    return f"""
/* @optiml
 *   args:   A: in float[Z * M * K], B: in float[Z * K * N], C: inout float[Z * M * N],
 *           Z = 3, sA = M * K, sB = K * N, alpha = 1.5, beta = -0.5
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16), Z), block = (16, 16)
 *   sizes:  M, N, K = (256, 192, 128), (37, 45, 19)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void bgemm(const float* A, const float* B, float* C, int Z, int M, int N, int K,
                      long long sA, long long sB, float alpha, float beta)
{{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    long long bz = blockIdx.z;
    if (row < M && col < N) {{
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += {a} * {b};
        float* c = C + bz * M * N;
        c[row * N + col] = alpha * acc + beta * c[row * N + col];
    }}
}}
"""


def batched16(layout: str, dtype: str = "half", out16: bool = False) -> str:
    """16-bit operands (`half` or `bfloat16`), the sum in fp32; `out16`: the output in the
    operands' type, through a bias and a ReLU."""
    ctype, to_float, from_float = {
        "half": ("__half", "__half2float", "__float2half"),
        "bfloat16": ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16"),
    }[dtype]
    a, b = _operands(layout)
    if out16:
        out, args, params = ctype, f", bias: in {dtype}[N]", f", const {ctype}* bias"
        store = f"{from_float}(fmaxf(acc + {to_float}(bias[col]), 0.0f))"
        tol = "rtol = 2e-2, atol = 2e-2"
    else:
        out, args, params, store, tol = "float", "", "", "acc", "rtol = 1e-3, atol = 1e-3"
    out_spec = "float" if not out16 else dtype
    return f"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
/* @optiml
 *   args:   A: in {dtype}[Z * M * K], B: in {dtype}[Z * K * N], C: out {out_spec}[Z * M * N]{args},
 *           Z = 2, sA = M * K, sB = K * N
 *   launch: grid = (cdiv(N, 16), cdiv(M, 16), Z), block = (16, 16)
 *   sizes:  M, N, K = (512, 384, 256), (77, 45, 37)
 *   tol:    {tol}
 */
__global__ void hgemm(const {ctype}* A, const {ctype}* B, {out}* C{params}, int Z, int M, int N,
                      int K, long long sA, long long sB)
{{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    long long bz = blockIdx.z;
    if (row < M && col < N) {{
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += {to_float}({a}) * {to_float}({b});
        C[bz * M * N + (long long)row * N + col] = {store};
    }}
}}
"""
