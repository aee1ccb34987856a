#include <thrust/device_vector.h>

/* @optiml
 *   args:   s = 3.0, in: in float[n], out: out float[n]
 *   launch: grid = (n + 127) / 128, block = 128
 *   sizes:  n = 100000, 50001
 */
__global__ void scale(const float* in, float* out, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = s * in[i];
}

int main()
{
    int n = 100000;
    thrust::device_vector<float> d_in(n, 1.0f);
    thrust::device_vector<float> d_out(n);
    scale<<<(n + 127) / 128, 128>>>(thrust::raw_pointer_cast(d_in.data()),
                                    thrust::raw_pointer_cast(d_out.data()), 3.0f, n);
    return 0;
}
