// y[b] += alpha * x[b] for a batch of vectors stored back to back
#include <cuda_runtime.h>

/* @optiml
 *   args:   alpha = 0.5, x: in float[batch * n], y: inout float[batch * n]
 *   launch: grid = (cdiv(n, 256), batch), block = 256
 *   sizes:  batch, n = (64, 65536), (3, 1001)
 */
__global__ void batched_axpy(float alpha, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float* xb = x + (size_t)blockIdx.y * n;
    float* yb = y + (size_t)blockIdx.y * n;
    if (i < n) yb[i] += alpha * xb[i];
}

void run(float alpha, const float* dx, float* dy, int batch, int n)
{
    dim3 grid((n + 255) / 256, batch);
    batched_axpy<<<grid, 256>>>(alpha, dx, dy, n);
}

int main()
{
    int batch = 64, n = 65536;
    float *dx, *dy;
    cudaMalloc(&dx, (size_t)batch * n * sizeof(float));
    cudaMalloc(&dy, (size_t)batch * n * sizeof(float));
    run(0.5f, dx, dy, batch, n);
    return 0;
}
