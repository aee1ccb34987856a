// Embedding backward, scaled: grad_w[ids[i], :] += scale * grad_out[i, :]. One thread per
// element of grad_out with a 64-bit flat index; the column is what is left of the row. Ids repeat.

/* @optiml
 *   args:   grad_w: inout float[V * D], grad_out: in float[N * D], ids: in int64[N] in [0, V),
 *           scale = 0.25
 *   launch: grid = cdiv(N * D, 128), block = 128
 *   sizes:  N, V, D = (16384, 5000, 512), (77, 13, 36), (40, 7, 33)
 *   # float atomics land in any order
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void embedding_grad(float* grad_w, const float* grad_out, const long long* ids,
                               float scale, int N, int V, int D)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * D) return;
    long long row = i / D;
    long long d = i - row * D;
    atomicAdd(grad_w + ids[row] * D + d, scale * grad_out[i]);
}
