#include <cuda_runtime.h>

/* @optiml
 *   args:   a = 2.0, x: in float[n], y: inout float[n]
 *   launch: grid = (n + 255) / 256, block = 256
 *   sizes:  n = 1 << 20, 524289
 */
__global__ void saxpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

void launch_saxpy(int count, float alpha, const float *dx, float *dy) {
  int threads = 256;
  int blocks = (count + threads - 1) / threads;
  saxpy<<<blocks, threads>>>(count, alpha, dx, dy);
}

int main() {
  int n = 1 << 20;
  size_t bytes = n * sizeof(float);
  float *dx, *dy;
  cudaMalloc(&dx, bytes);
  cudaMalloc(&dy, bytes);
  launch_saxpy(n, 2.0f, dx, dy);
  cudaDeviceSynchronize();
  return 0;
}
