// relu6 over a big activation buffer, grid-stride loop, launched on a fixed number of blocks
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>

/* @optiml
 *   args:   out: out float[N], in: in float[N]
 *   launch: grid = 1024, block = 256
 *   sizes:  N = 1 << 22, 2097153
 */
__global__ void relu6_kernel(float* __restrict__ out, const float* __restrict__ in, size_t N)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (size_t)blockDim.x * gridDim.x) {
        float v = in[i];
        out[i] = fminf(fmaxf(v, 0.0f), 6.0f);
    }
}

int main()
{
    const size_t N = 1 << 22;
    std::vector<float> h(N, 1.0f);
    float *d_in = nullptr, *d_out = nullptr;
    cudaMalloc(&d_in, N * sizeof(float));
    cudaMalloc(&d_out, N * sizeof(float));
    cudaMemcpy(d_in, h.data(), N * sizeof(float), cudaMemcpyHostToDevice);
    relu6_kernel<<<1024, 256>>>(d_out, d_in, N);
    cudaMemcpy(h.data(), d_out, N * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(d_in);
    cudaFree(d_out);
    return 0;
}
