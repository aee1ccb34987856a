// Token plus segment embedding, the token's row scaled: y[i, :] = scale * E[ids[i], :] + S[seg[i], :]
// One thread per output float, 64-bit flat index, the column as what is left of the row.

/* @optiml
 *   args:   ids: in int32[n_tok] in [0, vocab), seg: in int32[n_tok] in [0, 2),
 *           E: in float[vocab * dim], S: in float[2 * dim], y: out float[n_tok * dim],
 *           scale = 0.125
 *   launch: grid = cdiv(n_tok * dim, 128), block = 128
 *   sizes:  n_tok, vocab, dim = (16384, 32000, 1024), (77, 50, 36)
 */
__global__ void embed_scaled(const int* ids, const int* seg, const float* E, const float* S,
                             float* y, float scale, int n_tok, int vocab, int dim)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * dim) return;
    long long t = i / dim;
    long long d = i - t * dim;
    const float* e = E + (long long)ids[t] * dim;
    y[i] = scale * e[d] + S[seg[t] * dim + d];
}
