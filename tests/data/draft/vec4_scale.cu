// scale a float buffer four elements at a time (n4 = n / 4 vectors)
#include <cuda_runtime.h>

/* @optiml
 *   args:   s = 3.0, v: inout float4[n4]
 *   launch: grid = (n4 + 127) / 128, block = 128
 *   sizes:  n4 = 1 << 20, 524289
 */
__global__ void scale4(float4* v, float s, int n4)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 a = v[i];
        a.x *= s; a.y *= s; a.z *= s; a.w *= s;
        v[i] = a;
    }
}

int main()
{
    int n4 = 1 << 20;
    float4* d;
    cudaMalloc(&d, n4 * sizeof(float4));
    scale4<<<(n4 + 127) / 128, 128>>>(d, 3.0f, n4);
    cudaDeviceSynchronize();
}
