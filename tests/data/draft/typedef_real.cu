typedef double real;
using index_t = int;

/* @optiml
 *   args:   x: in real[len], y: out real[len]
 *   launch: grid = (len + 255) / 256, block = 256
 *   sizes:  len = 65536, 32769
 */
__global__ void square(const real* x, real* y, index_t len)
{
    index_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) y[i] = x[i] * x[i];
}

int main()
{
    index_t len = 65536;
    real *x, *y;
    cudaMalloc(&x, sizeof(real) * len);
    cudaMalloc(&y, sizeof(real) * len);
    square<<<(len + 255) / 256, 256>>>(x, y, len);
    return 0;
}
