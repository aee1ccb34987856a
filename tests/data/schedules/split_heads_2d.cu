// (B, T, NH, HS) -> (B, NH, T, HS): x over the head's elements, y over the source rows (b, t, h)
// taken apart with `/` and `%`. The fastest axis is kept.

/* @optiml
 *   args:   out: out float[B * T * NH * HS], in: in float[B * T * NH * HS]
 *   launch: grid = (cdiv(HS, 64), cdiv(B * T * NH, 4)), block = (64, 4)
 *   sizes:  B, T, NH, HS = (4, 256, 16, 64), (2, 7, 3, 10), (1, 5, 2, 36)
 */
__global__ void split_heads(float* out, const float* in, int B, int T, int NH, int HS)
{
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (d < HS && r < B * T * NH) {
        int h = r % NH;
        int t = (r / NH) % T;
        int b = r / (NH * T);
        out[((b * NH + h) * T + t) * HS + d] = in[(size_t)r * HS + d];
    }
}
