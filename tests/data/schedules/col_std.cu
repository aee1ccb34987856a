// Column standard deviation in two passes (mean first, then the squared deviations), the column
// reached through a pointer to its first element; the block size is spelled in the index.

#define BLOCK 64

/* @optiml
 *   args:   X: in float[N * D], sd: out float[D], eps = 1e-5
 *   launch: grid = cdiv(D, 64), block = 64
 *   sizes:  N, D = (8192, 4096), (601, 70)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void col_std(const float* X, float* sd, float eps, int N, int D)
{
    int j = blockIdx.x * BLOCK + threadIdx.x;
    if (j >= D) return;
    const float* col = X + j;
    float mu = 0.0f;
    for (int i = 0; i < N; ++i) mu += col[i * D];
    mu = mu / N;
    float ss = 0.0f;
    for (int i = 0; i < N; ++i) {
        float d = col[i * D] - mu;
        ss = fmaf(d, d, ss);
    }
    sd[j] = sqrtf(ss / N + eps);
}
