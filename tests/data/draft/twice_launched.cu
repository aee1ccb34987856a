/* @optiml
 *   args:   x: inout float[n]
 *   launch: grid = (n + 63) / 64, block = 64
 *   sizes:  n = 4096, 2049
 */
__global__ void twice(float* x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}

int main()
{
    int n = 4096;
    float* x;
    cudaMalloc(&x, n * sizeof(float));
    twice<<<(n + 63) / 64, 64>>>(x, n);
    twice<<<(n + 127) / 128, 128>>>(x, n);
    return 0;
}
