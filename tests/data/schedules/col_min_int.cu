// The smallest label in every column of an int matrix, seeded with the first row; the loop runs
// from the second row, with unsigned indices.

/* @optiml
 *   args:   labels: in int32[H * W] in [0, 1000), lo: out int32[W]
 *   launch: grid = cdiv(W, 256), block = 256
 *   sizes:  H, W = (4096, 8192), (601, 67)
 */
__global__ void columnMinLabel(const int* labels, int* lo, unsigned H, unsigned W)
{
    unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x < W) {
        int m = labels[x];
        for (unsigned y = 1; y < H; y++) {
            m = min(m, labels[y * W + x]);
        }
        lo[x] = m;
    }
}
