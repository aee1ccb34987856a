// scale each row of a matrix by its own factor: one block per row, threads stride the row

/* @optiml
 *   args:   M: inout float[nrows * ncols], f: in float[nrows]
 *   launch: grid = nrows, block = 256
 *   sizes:  nrows, ncols = (4096, 1024), (77, 1001)
 */
__global__ void scale_rows(float* M, const float* f, int nrows, int ncols)
{
    float s = f[blockIdx.x];
    for (int j = threadIdx.x; j < ncols; j += blockDim.x)
        M[blockIdx.x * ncols + j] *= s;
}
