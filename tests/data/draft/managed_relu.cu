#include <cstdio>

/* @optiml
 *   args:   data: inout float[N]
 *   launch: grid = (N + 511) / 512, block = 512
 *   sizes:  N = 1000000, 500001
 */
__global__ void relu_inplace(float *data, int N) {
    int idx = threadIdx.x + blockIdx.x * blockDim.x;
    if (idx >= N) return;
    data[idx] = data[idx] > 0.f ? data[idx] : 0.f;
}

int main() {
    int N = 1000000;
    float *data;
    cudaMallocManaged(&data, N * sizeof(float));
    for (int i = 0; i < N; i++) data[i] = i % 3 - 1.0f;
    relu_inplace<<<(N + 511) / 512, 512>>>(data, N);
    cudaDeviceSynchronize();
    printf("%f\n", data[1]);
    cudaFree(data);
}
