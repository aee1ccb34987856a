#define BLOCK 256

/* @optiml
 *   args:   in: in float[n], out: out float[cdiv(n, BLOCK)]
 *   launch: grid = (n + BLOCK - 1) / BLOCK, block = BLOCK, smem = BLOCK * 4
 *   sizes:  n = 1 << 20, 524289
 */
__global__ void block_sums(const float* in, float* out, int n)
{
    extern __shared__ float buf[];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    buf[t] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

int main()
{
    int n = 1 << 20;
    int nblocks = (n + BLOCK - 1) / BLOCK;
    float *in, *out;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaMallocAsync(&in, n * sizeof(float), stream);
    cudaMallocAsync(&out, nblocks * sizeof(float), stream);
    block_sums<<<nblocks, BLOCK, BLOCK * sizeof(float), stream>>>(in, out, n);
    return 0;
}
