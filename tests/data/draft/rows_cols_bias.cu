// y = x + b (per column), with the host's sizes in other names

/* @optiml
 *   args:   x: in float[nrow * ncol], b: in float[ncol], y: out float[nrow * ncol]
 *   launch: grid = (cdiv(ncol, 32), cdiv(nrow, 8)), block = (32, 8)
 *   sizes:  nrow, ncol = (512, 768), (257, 385)
 */
__global__ void add_bias(const float* x, const float* b, float* y, int nrow, int ncol)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < nrow && col < ncol) y[row * ncol + col] = x[row * ncol + col] + b[col];
}

int main()
{
    int rows = 512;
    int cols = 768;
    float *x, *b, *y;
    cudaMalloc(&x, rows * cols * sizeof(float));
    cudaMalloc(&b, cols * sizeof(float));
    cudaMalloc(&y, rows * cols * sizeof(float));
    dim3 threads(32, 8);
    dim3 blocks((cols + threads.x - 1) / threads.x, (rows + threads.y - 1) / threads.y);
    add_bias<<<blocks, threads>>>(x, b, y, rows, cols);
    return 0;
}
