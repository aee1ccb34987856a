// layernorm_rows.cu - LayerNorm of each row: y = (x - mean) / sqrt(var + eps) * gamma + beta.
//
// Written the straightforward way: a thread per row, mean first, then the
// (biased) variance, then the output.

#ifndef OPTIML_ROW_ALIGNED16
#define OPTIML_ROW_ALIGNED16
__device__ __forceinline__ bool optiml_row_aligned16(const void* p)
{
    return (reinterpret_cast<size_t>(p) & 15) == 0;
}
#endif

#ifndef OPTIML_ROW_LDG4
#define OPTIML_ROW_LDG4
// The kernel never writes this buffer, so the non-coherent (read-only cache) load is safe.
__device__ __forceinline__ void optiml_row_ldg4(float (&v)[4], const float* p)
{
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
#endif

#ifndef OPTIML_ROW_ST4
#define OPTIML_ROW_ST4
__device__ __forceinline__ void optiml_row_st4(float* p, const float (&v)[4])
{
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
#endif

#ifndef OPTIML_ROW_WARP_SUM
#define OPTIML_ROW_WARP_SUM
// Butterfly all-reduce: both partners of every step combine the same two values, so all 32 lanes
// end with the same bits.
template <typename T>
__device__ __forceinline__ T optiml_warp_sum(T v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = v + __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
#endif

/* @optiml
 *   args:   x: in float[rows * cols], gamma: in float[cols], beta: in float[cols],
 *           y: out float[rows * cols], eps = 1e-5
 *   launch: grid = cdiv(rows, 8), block = 256
 *   sizes:  rows, cols = (32768, 1024), (1999, 777)
 *   # the mean and variance may be reduced in another order; outputs near zero need atol.
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void __launch_bounds__(256) layernorm_rows(const float* __restrict__ x, const float* __restrict__ gamma, const float* __restrict__ beta,
                               float* __restrict__ y, int rows, int cols, float eps)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    const float* xr = x + (size_t)r * cols;
    float* yr = y + (size_t)r * cols;

    float sum = 0.0f;
    // float4 accesses need 16-byte aligned rows and a length that is a multiple of 4;
    // other rows take the scalar path.
    const bool row_vec = cols % 4 == 0
        && optiml_row_aligned16(&xr[0])
        && optiml_row_aligned16(&yr[0])
        && optiml_row_aligned16(&gamma[0])
        && optiml_row_aligned16(&beta[0]);
    // The row stays in registers when it fits 8 float4 per thread:
    // every pass after the first reads it from there, not from memory.
    constexpr int kRowChunks = 8;
    const bool row_in_regs = row_vec && cols <= kRowChunks * 4 * 32;
    float xr_r[kRowChunks][4];
    if (row_in_regs) {
        #pragma unroll
        for (int k = 0; k < kRowChunks; ++k) {
            const int j0 = (k * 32 + lane) * 4;
            if (j0 < cols) optiml_row_ldg4(xr_r[k], &xr[j0]);
        }
    }
    if (row_in_regs) {
        #pragma unroll
        for (int k = 0; k < kRowChunks; ++k) {
            const int j0 = (k * 32 + lane) * 4;
            if (j0 < cols) {
                #pragma unroll
                for (int c = 0; c < 4; ++c) {
                    sum += xr_r[k][c];
                }
            }
        }
    } else if (row_vec) {
        #pragma unroll 2
        for (int j0 = lane * 4; j0 < cols; j0 += 4 * 32) {
            float xr_v[4];
            optiml_row_ldg4(xr_v, &xr[j0]);
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                sum += xr_v[c];
            }
        }
    } else {
        for (int i = lane; i < cols; i += 32) {
            sum += xr[i];
        }
    }
    sum = optiml_warp_sum(sum);
    float mean = sum / cols;

    float sq = 0.0f;
    if (row_in_regs) {
        #pragma unroll
        for (int k = 0; k < kRowChunks; ++k) {
            const int j0 = (k * 32 + lane) * 4;
            if (j0 < cols) {
                #pragma unroll
                for (int c = 0; c < 4; ++c) {
                    sq += (xr_r[k][c] - mean) * (xr_r[k][c] - mean);
                }
            }
        }
    } else if (row_vec) {
        #pragma unroll 2
        for (int j0 = lane * 4; j0 < cols; j0 += 4 * 32) {
            float xr_v[4];
            optiml_row_ldg4(xr_v, &xr[j0]);
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                sq += (xr_v[c] - mean) * (xr_v[c] - mean);
            }
        }
    } else {
        for (int i = lane; i < cols; i += 32) {
            sq += (xr[i] - mean) * (xr[i] - mean);
        }
    }
    sq = optiml_warp_sum(sq);
    float inv_std = 1.0f / sqrtf(sq / cols + eps);

    if (row_in_regs) {
        #pragma unroll
        for (int k = 0; k < kRowChunks; ++k) {
            const int j0 = (k * 32 + lane) * 4;
            if (j0 < cols) {
                float yr_o[4];
                float gamma_v[4];
                optiml_row_ldg4(gamma_v, &gamma[j0]);
                float beta_v[4];
                optiml_row_ldg4(beta_v, &beta[j0]);
                #pragma unroll
                for (int c = 0; c < 4; ++c) {
                    yr_o[c] = (xr_r[k][c] - mean) * inv_std * gamma_v[c] + beta_v[c];
                }
                optiml_row_st4(&yr[j0], yr_o);
            }
        }
    } else if (row_vec) {
        #pragma unroll 2
        for (int j0 = lane * 4; j0 < cols; j0 += 4 * 32) {
            float yr_o[4];
            float xr_v[4];
            optiml_row_ldg4(xr_v, &xr[j0]);
            float gamma_v[4];
            optiml_row_ldg4(gamma_v, &gamma[j0]);
            float beta_v[4];
            optiml_row_ldg4(beta_v, &beta[j0]);
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                yr_o[c] = (xr_v[c] - mean) * inv_std * gamma_v[c] + beta_v[c];
            }
            optiml_row_st4(&yr[j0], yr_o);
        }
    } else {
        for (int i = lane; i < cols; i += 32) {
            yr[i] = (xr[i] - mean) * inv_std * gamma[i] + beta[i];
        }
    }
}
