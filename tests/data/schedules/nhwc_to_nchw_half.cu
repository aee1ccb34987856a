// (N, H*W, C) -> (N, C, H*W) in half: x over channels, y over pixels, z over images; the image
// is a pointer offset. Reads coalesce along C, writes stride by HW.

#include <cuda_fp16.h>

/* @optiml
 *   args:   dst: out half[N * C * HW], src: in half[N * HW * C]
 *   launch: grid = (cdiv(C, 32), cdiv(HW, 8), N), block = (32, 8)
 *   sizes:  N, C, HW = (16, 256, 3136), (2, 19, 50), (1, 64, 33)
 */
__global__ void nhwc_to_nchw(__half* dst, const __half* src, int N, int C, int HW)
{
    const __half* img = src + (size_t)blockIdx.z * HW * C;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int p = blockIdx.y * blockDim.y + threadIdx.y;
    if (c >= C || p >= HW) return;
    dst[(size_t)blockIdx.z * C * HW + (size_t)c * HW + p] = img[(size_t)p * C + c];
}
