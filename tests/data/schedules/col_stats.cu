// Per-feature statistics of a batch (rows x features, row-major): the mean and the largest value
// of every feature, one thread per feature, a while loop down the column.

#include <cstddef>

/* @optiml
 *   args:   feats: in float[n_rows * n_feat], mean_out: out float[n_feat], max_out: out float[n_feat]
 *   launch: grid = cdiv(n_feat, 128), block = 128
 *   sizes:  n_rows, n_feat = (16384, 2048), (601, 77)
 *   tol:    rtol = 1e-4, atol = 1e-5
 */
__global__ void feature_stats(const float* __restrict__ feats, float* __restrict__ mean_out,
                              float* __restrict__ max_out, int n_rows, int n_feat)
{
    size_t f = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (f < (size_t)n_feat) {
        float total = 0.f;
        float best = -INFINITY;
        size_t r = 0;
        while (r < (size_t)n_rows) {
            float v = feats[r * n_feat + f];
            total += v;
            if (v > best) best = v;
            r++;
        }
        mean_out[f] = total / n_rows;
        max_out[f] = best;
    }
}
