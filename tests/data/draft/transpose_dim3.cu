// naive out-of-place transpose of a height x width matrix
#include <cstdio>

#define BX 32
#define BY 8

/* @optiml
 *   args:   odata: out float[width * height], idata: in float[width * height]
 *   launch: grid = (cdiv(width, BX), cdiv(height, BY)), block = (BX, BY)
 *   sizes:  width, height = (4096, 2048), (1001, 333)
 */
__global__ void transposeNaive(float *odata, const float *idata, int width, int height)
{
    int x = blockIdx.x * BX + threadIdx.x;
    int y = blockIdx.y * BY + threadIdx.y;
    if (x < width && y < height)
        odata[x * height + y] = idata[y * width + x];
}

int main(void)
{
    const int width = 4096, height = 2048;
    const int mem_size = width * height * sizeof(float);
    float *d_idata, *d_odata;
    cudaMalloc(&d_idata, mem_size);
    cudaMalloc(&d_odata, mem_size);
    dim3 dimBlock(BX, BY, 1);
    dim3 dimGrid((width + BX - 1) / BX, (height + BY - 1) / BY, 1);
    transposeNaive<<<dimGrid, dimBlock>>>(d_odata, d_idata, width, height);
    cudaDeviceSynchronize();
    printf("done\n");
    return 0;
}
