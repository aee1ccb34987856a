// token embedding lookup: out[t, :] = table[ids[t], :]
#include <cuda_runtime.h>
#include <cstdint>

/* @optiml
 *   args:   table: in float[vocab * dim], ids: in int64[ntok] in [0, vocab), out: out float[ntok * dim]
 *   launch: grid = ntok, block = 128
 *   sizes:  vocab, ntok, dim = (32000, 2048, 512), (1001, 77, 129)
 */
__global__ void embed_lookup(const float* table, const int64_t* ids, float* out, int vocab, int ntok, int dim)
{
    int t = blockIdx.x;
    if (t >= ntok) return;
    int64_t row = ids[t];
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        out[(size_t)t * dim + j] = table[row * dim + j];
}

int main()
{
    int vocab = 32000, ntok = 2048, dim = 512;
    float *table, *out;
    int64_t* ids;
    cudaMalloc((void**)&table, sizeof(float) * vocab * dim);
    cudaMalloc((void**)&ids, sizeof(int64_t) * ntok);
    cudaMalloc((void**)&out, sizeof(float) * ntok * dim);
    embed_lookup<<<ntok, 128>>>(table, ids, out, vocab, ntok, dim);
    cudaDeviceSynchronize();
    return 0;
}
