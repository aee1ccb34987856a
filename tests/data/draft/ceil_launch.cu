#include <cmath>
#define THREADS 128

/* @optiml
 *   args:   v: in float[n], out: out float[n]
 *   launch: grid = cdiv(n, THREADS), block = THREADS
 *   sizes:  n = 1 << 18, 131073
 */
__global__ void negate(const float *v, float *out, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x;
  if (i < n) out[i] = -v[i];
}

int main() {
  int n = 1 << 18;
  float *h = new float[n];
  float *dv, *dout;
  cudaMalloc(&dv, n * sizeof(float));
  cudaMalloc(&dout, n * sizeof(float));
  cudaMemcpy(dv, h, n * sizeof(float), cudaMemcpyHostToDevice);
  negate<<<(int)ceil(n / (float)THREADS), THREADS>>>(dv, dout, n);
  delete[] h;
  return 0;
}
