// sums[s] += vals[i] for seg[i] == s, rows of width D

/* @optiml
 *   args:   vals: in float[n * D], seg: in int[n] in [0, nseg), sums: inout float[nseg * D]
 *   launch: grid = (cdiv(D, 32), cdiv(n, 8)), block = (32, 8)
 *   sizes:  n, nseg, D = (65536, 512, 128), (1001, 13, 33)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void segment_add(const float* vals, const int* seg, float* sums, int n, int nseg, int D)
{
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i < n && d < D)
        atomicAdd(&sums[seg[i] * D + d], vals[i * D + d]);
}
