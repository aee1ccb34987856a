#define TILE 16

/* @optiml
 *   args:   A: in float[rows * cols], B: in float[rows * cols], C: out float[rows * cols]
 *   launch: grid = ((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block = (TILE, TILE)
 *   sizes:  rows, cols = (2048, 1024), (1025, 513)
 */
__global__ void matAdd(const float* A, const float* B, float* C, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols)
        C[r * cols + c] = A[r * cols + c] + B[r * cols + c];
}

int main()
{
    const int rows = 2048, cols = 1024;
    float *A, *B, *C;
    cudaMalloc((void**)&A, rows * cols * sizeof(float));
    cudaMalloc((void**)&B, rows * cols * sizeof(float));
    cudaMalloc((void**)&C, rows * cols * sizeof(float));
    dim3 block(TILE, TILE);
    dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
    matAdd<<<grid, block>>>(A, B, C, rows, cols);
    return 0;
}
