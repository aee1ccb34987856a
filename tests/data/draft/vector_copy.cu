#include <vector>

/* @optiml
 *   args:   src: in float[n], dst: out float[n]
 *   launch: grid = (n + 255) / 256, block = 256
 *   sizes:  n = 300000, 150001
 */
__global__ void copy_kernel(const float* src, float* dst, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

int main()
{
    int n = 300000;
    std::vector<float> h(n, 1.0f);
    float *d_src, *d_dst;
    cudaMalloc(&d_src, h.size() * sizeof(float));
    cudaMalloc(&d_dst, h.size() * sizeof(float));
    cudaMemcpy(d_src, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    copy_kernel<<<(n + 255) / 256, 256>>>(d_src, d_dst, n);
    cudaMemcpy(h.data(), d_dst, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return 0;
}
