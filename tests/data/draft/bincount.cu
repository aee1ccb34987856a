// counts[k] = number of i with keys[i] == k; keys are assumed to lie in [0, nbins)

/* @optiml
 *   args:   keys: in int[n] in [0, nbins), counts: inout int[nbins]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n, nbins = (1 << 22, 4096), (100003, 17)
 */
__global__ void bincount(const int* keys, int* counts, int n, int nbins)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(&counts[keys[i]], 1);
    }
}
