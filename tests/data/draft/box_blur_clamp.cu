// 3x3 box blur with clamp-to-edge addressing, one thread per pixel

/* @optiml
 *   args:   src: in float[w * h], dst: out float[w * h]
 *   launch: grid = (cdiv(w, 16), cdiv(h, 16)), block = (16, 16)
 *   sizes:  w, h = (1920, 1080), (333, 101)
 */
__global__ void box_blur(const float* src, float* dst, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) return;
    float acc = 0.f;
    for (int dy = -1; dy <= 1; ++dy) {
        for (int dx = -1; dx <= 1; ++dx) {
            int xx = min(max(x + dx, 0), w - 1);
            int yy = min(max(y + dy, 0), h - 1);
            acc += src[yy * w + xx];
        }
    }
    dst[y * w + x] = acc / 9.f;
}
