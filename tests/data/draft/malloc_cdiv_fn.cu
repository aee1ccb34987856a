#include <cstdlib>

static int div_up(int a, int b) { return (a + b - 1) / b; }

/* @optiml
 *   args:   img: in uint8[w * h], out: out float[w * h]
 *   launch: grid = (cdiv(w, 16), cdiv(h, 16)), block = (16, 16)
 *   sizes:  w, h = (640, 480), (321, 241)
 */
__global__ void to_float(const unsigned char* img, float* out, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = img[y * w + x] / 255.0f;
}

int main()
{
    int w = 640, h = 480;
    unsigned char* host = (unsigned char*)malloc(w * h);
    unsigned char* d_img;
    float* d_out;
    cudaMalloc(&d_img, w * h);
    cudaMalloc(&d_out, w * h * sizeof(float));
    cudaMemcpy(d_img, host, w * h, cudaMemcpyHostToDevice);
    dim3 block(16, 16);
    dim3 grid(cdiv(w, 16), cdiv(h, 16));
    to_float<<<grid, block>>>(d_img, d_out, w, h);
    free(host);
    return 0;
}
