// y = A x, A row-major rows x cols, one thread per row
#include <cuda_runtime.h>

/* @optiml
 *   args:   A: in float[rows * cols], x: in float[cols], y: out float[rows]
 *   launch: grid = cdiv(rows, 128), block = 128
 *   sizes:  rows, cols = (8192, 4096), (1001, 333)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void matvec(const float* A, const float* x, float* y, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) {
        float sum = 0.0f;
        for (int c = 0; c < cols; ++c)
            sum += A[r * cols + c] * x[c];
        y[r] = sum;
    }
}

static void matvec_gpu(const float* dA, const float* dx, float* dy, int m, int k)
{
    const int threads = 128;
    matvec<<<(m + threads - 1) / threads, threads>>>(dA, dx, dy, m, k);
}

int main()
{
    int rows = 8192, cols = 4096;
    float *dA, *dx, *dy;
    cudaMalloc(&dA, rows * cols * sizeof(float));
    cudaMalloc(&dx, cols * sizeof(float));
    cudaMalloc(&dy, rows * sizeof(float));
    matvec_gpu(dA, dx, dy, rows, cols);
    return 0;
}
