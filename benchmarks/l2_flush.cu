// l2_flush.cu - what the harness's L2 flush costs a read-only kernel (reduce_sum's confirmed best,
// as the search found it at 2^24 floats; the kernel below is that variant's text).
//
// The harness flushes the L2 before each timed launch by writing a buffer of twice its size
// (cudaMemsetAsync, as nvbench and Triton's do_bench do). The lines it leaves are dirty, and the
// timed kernel's own traffic evicts them: a kernel that only reads pays for writing back up to an
// L2's worth of someone else's data. This times the same kernel after that flush, after a flush
// that also reads the buffer (leaving the L2 clean and cold), after the read alone, and with no
// flush, at 2^24, 2^26 and 2^28 floats, median of 50 CUDA-event timings each.
//
//   nvcc -arch=sm_90 -O3 -o l2_flush benchmarks/l2_flush.cu && ./l2_flush
//   (output: benchmarks/results/l2-flush-h200.txt)

// reduce_sum.cu - naive sum of a float array.
//
// Every thread adds its element straight into the global accumulator with
// atomicAdd. Simple and correct, but all the atomics hit the same address.
//
// NOTE: the result is ADDED to *sum (it is not overwritten), so the caller has to
// zero it first (cudaMemset) if it wants the plain sum. Because float atomics
// complete in no particular order, the last bits of the result vary from run to run.

/* @optiml
 *   args:   x: in float[n], sum: inout float[1]
 *   launch: grid = min(cdiv(n, 8192), 528), block = 256
 *   sizes:  n = 1 << 24, 1000003
 *   # |sum| is about sqrt(n/3) ~ 2400 for n = 2^24; the atomics' arbitrary order alone
 *   # moves the result by ~0.1 between runs, so atol sits well above that.
 *   tol:    rtol = 1e-4, atol = 1.0
 */
__global__ void __launch_bounds__(256, 4) reduce_sum(const float* __restrict__ x, float* __restrict__ sum, int n)
{
    // 8 independent partial results per thread, in registers.
    float opt_acc0_0 = 0.0f;
    float opt_acc0_1 = 0.0f;
    float opt_acc0_2 = 0.0f;
    float opt_acc0_3 = 0.0f;
    float opt_acc0_4 = 0.0f;
    float opt_acc0_5 = 0.0f;
    float opt_acc0_6 = 0.0f;
    float opt_acc0_7 = 0.0f;
    const long long opt_n = (long long)(n);
    const long long opt_threads = (long long)gridDim.x * 256;
    const long long opt_tid = (long long)blockIdx.x * 256 + threadIdx.x;
    long long opt_e = opt_tid;
    // Four elements per 16-byte load where every pointer read as p[i] is aligned;
    // the rest (all of it if one is not) goes one element at a time below.
    if (((reinterpret_cast<unsigned long long>(x)) & 15) == 0) {
        const long long opt_nv = opt_n / 4;
        long long opt_v = opt_tid;
        for (; opt_v + 7 * opt_threads < opt_nv; opt_v += 8 * opt_threads) {
            const float4 opt_x0 = reinterpret_cast<const float4*>(x)[opt_v];
            const float4 opt_x1 = reinterpret_cast<const float4*>(x)[opt_v + 1 * opt_threads];
            const float4 opt_x2 = reinterpret_cast<const float4*>(x)[opt_v + 2 * opt_threads];
            const float4 opt_x3 = reinterpret_cast<const float4*>(x)[opt_v + 3 * opt_threads];
            const float4 opt_x4 = reinterpret_cast<const float4*>(x)[opt_v + 4 * opt_threads];
            const float4 opt_x5 = reinterpret_cast<const float4*>(x)[opt_v + 5 * opt_threads];
            const float4 opt_x6 = reinterpret_cast<const float4*>(x)[opt_v + 6 * opt_threads];
            const float4 opt_x7 = reinterpret_cast<const float4*>(x)[opt_v + 7 * opt_threads];
            opt_acc0_0 += static_cast<float>(opt_x0.x);
            opt_acc0_0 += static_cast<float>(opt_x0.y);
            opt_acc0_0 += static_cast<float>(opt_x0.z);
            opt_acc0_0 += static_cast<float>(opt_x0.w);
            opt_acc0_1 += static_cast<float>(opt_x1.x);
            opt_acc0_1 += static_cast<float>(opt_x1.y);
            opt_acc0_1 += static_cast<float>(opt_x1.z);
            opt_acc0_1 += static_cast<float>(opt_x1.w);
            opt_acc0_2 += static_cast<float>(opt_x2.x);
            opt_acc0_2 += static_cast<float>(opt_x2.y);
            opt_acc0_2 += static_cast<float>(opt_x2.z);
            opt_acc0_2 += static_cast<float>(opt_x2.w);
            opt_acc0_3 += static_cast<float>(opt_x3.x);
            opt_acc0_3 += static_cast<float>(opt_x3.y);
            opt_acc0_3 += static_cast<float>(opt_x3.z);
            opt_acc0_3 += static_cast<float>(opt_x3.w);
            opt_acc0_4 += static_cast<float>(opt_x4.x);
            opt_acc0_4 += static_cast<float>(opt_x4.y);
            opt_acc0_4 += static_cast<float>(opt_x4.z);
            opt_acc0_4 += static_cast<float>(opt_x4.w);
            opt_acc0_5 += static_cast<float>(opt_x5.x);
            opt_acc0_5 += static_cast<float>(opt_x5.y);
            opt_acc0_5 += static_cast<float>(opt_x5.z);
            opt_acc0_5 += static_cast<float>(opt_x5.w);
            opt_acc0_6 += static_cast<float>(opt_x6.x);
            opt_acc0_6 += static_cast<float>(opt_x6.y);
            opt_acc0_6 += static_cast<float>(opt_x6.z);
            opt_acc0_6 += static_cast<float>(opt_x6.w);
            opt_acc0_7 += static_cast<float>(opt_x7.x);
            opt_acc0_7 += static_cast<float>(opt_x7.y);
            opt_acc0_7 += static_cast<float>(opt_x7.z);
            opt_acc0_7 += static_cast<float>(opt_x7.w);
        }
        if (opt_v < opt_nv) {
            const float4 opt_x0 = reinterpret_cast<const float4*>(x)[opt_v];
            float4 opt_x1 = {};
            if (opt_v + 1 * opt_threads < opt_nv) {
                opt_x1 = reinterpret_cast<const float4*>(x)[opt_v + 1 * opt_threads];
            }
            float4 opt_x2 = {};
            if (opt_v + 2 * opt_threads < opt_nv) {
                opt_x2 = reinterpret_cast<const float4*>(x)[opt_v + 2 * opt_threads];
            }
            float4 opt_x3 = {};
            if (opt_v + 3 * opt_threads < opt_nv) {
                opt_x3 = reinterpret_cast<const float4*>(x)[opt_v + 3 * opt_threads];
            }
            float4 opt_x4 = {};
            if (opt_v + 4 * opt_threads < opt_nv) {
                opt_x4 = reinterpret_cast<const float4*>(x)[opt_v + 4 * opt_threads];
            }
            float4 opt_x5 = {};
            if (opt_v + 5 * opt_threads < opt_nv) {
                opt_x5 = reinterpret_cast<const float4*>(x)[opt_v + 5 * opt_threads];
            }
            float4 opt_x6 = {};
            if (opt_v + 6 * opt_threads < opt_nv) {
                opt_x6 = reinterpret_cast<const float4*>(x)[opt_v + 6 * opt_threads];
            }
            opt_acc0_0 += static_cast<float>(opt_x0.x);
            opt_acc0_0 += static_cast<float>(opt_x0.y);
            opt_acc0_0 += static_cast<float>(opt_x0.z);
            opt_acc0_0 += static_cast<float>(opt_x0.w);
            if (opt_v + 1 * opt_threads < opt_nv) {
                opt_acc0_1 += static_cast<float>(opt_x1.x);
                opt_acc0_1 += static_cast<float>(opt_x1.y);
                opt_acc0_1 += static_cast<float>(opt_x1.z);
                opt_acc0_1 += static_cast<float>(opt_x1.w);
            }
            if (opt_v + 2 * opt_threads < opt_nv) {
                opt_acc0_2 += static_cast<float>(opt_x2.x);
                opt_acc0_2 += static_cast<float>(opt_x2.y);
                opt_acc0_2 += static_cast<float>(opt_x2.z);
                opt_acc0_2 += static_cast<float>(opt_x2.w);
            }
            if (opt_v + 3 * opt_threads < opt_nv) {
                opt_acc0_3 += static_cast<float>(opt_x3.x);
                opt_acc0_3 += static_cast<float>(opt_x3.y);
                opt_acc0_3 += static_cast<float>(opt_x3.z);
                opt_acc0_3 += static_cast<float>(opt_x3.w);
            }
            if (opt_v + 4 * opt_threads < opt_nv) {
                opt_acc0_4 += static_cast<float>(opt_x4.x);
                opt_acc0_4 += static_cast<float>(opt_x4.y);
                opt_acc0_4 += static_cast<float>(opt_x4.z);
                opt_acc0_4 += static_cast<float>(opt_x4.w);
            }
            if (opt_v + 5 * opt_threads < opt_nv) {
                opt_acc0_5 += static_cast<float>(opt_x5.x);
                opt_acc0_5 += static_cast<float>(opt_x5.y);
                opt_acc0_5 += static_cast<float>(opt_x5.z);
                opt_acc0_5 += static_cast<float>(opt_x5.w);
            }
            if (opt_v + 6 * opt_threads < opt_nv) {
                opt_acc0_6 += static_cast<float>(opt_x6.x);
                opt_acc0_6 += static_cast<float>(opt_x6.y);
                opt_acc0_6 += static_cast<float>(opt_x6.z);
                opt_acc0_6 += static_cast<float>(opt_x6.w);
            }
        }
        opt_e = 4 * opt_nv + opt_tid;
    }
    for (; opt_e + 7 * opt_threads < opt_n; opt_e += 8 * opt_threads) {
        {
            int i = (int)(opt_e);
            opt_acc0_0 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 1 * opt_threads);
            opt_acc0_1 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 2 * opt_threads);
            opt_acc0_2 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 3 * opt_threads);
            opt_acc0_3 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 4 * opt_threads);
            opt_acc0_4 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 5 * opt_threads);
            opt_acc0_5 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 6 * opt_threads);
            opt_acc0_6 += static_cast<float>(x[i]);
        }
        {
            int i = (int)(opt_e + 7 * opt_threads);
            opt_acc0_7 += static_cast<float>(x[i]);
        }
    }
    if (opt_e < opt_n) {
        int i = (int)(opt_e);
        opt_acc0_0 += static_cast<float>(x[i]);
    }
    if (opt_e + 1 * opt_threads < opt_n) {
        int i = (int)(opt_e + 1 * opt_threads);
        opt_acc0_1 += static_cast<float>(x[i]);
    }
    if (opt_e + 2 * opt_threads < opt_n) {
        int i = (int)(opt_e + 2 * opt_threads);
        opt_acc0_2 += static_cast<float>(x[i]);
    }
    if (opt_e + 3 * opt_threads < opt_n) {
        int i = (int)(opt_e + 3 * opt_threads);
        opt_acc0_3 += static_cast<float>(x[i]);
    }
    if (opt_e + 4 * opt_threads < opt_n) {
        int i = (int)(opt_e + 4 * opt_threads);
        opt_acc0_4 += static_cast<float>(x[i]);
    }
    if (opt_e + 5 * opt_threads < opt_n) {
        int i = (int)(opt_e + 5 * opt_threads);
        opt_acc0_5 += static_cast<float>(x[i]);
    }
    if (opt_e + 6 * opt_threads < opt_n) {
        int i = (int)(opt_e + 6 * opt_threads);
        opt_acc0_6 += static_cast<float>(x[i]);
    }
    // One value per thread, then per warp (shuffles), then per block (shared memory):
    // one atomic per block and address.
    const int opt_lane = threadIdx.x & 31;
    const int opt_warp = threadIdx.x >> 5;
    __shared__ float opt_part0[8];
    float opt_r0 = opt_acc0_0 + opt_acc0_1 + opt_acc0_2 + opt_acc0_3 + opt_acc0_4 + opt_acc0_5 + opt_acc0_6 + opt_acc0_7;
#pragma unroll
    for (int opt_o = 16; opt_o > 0; opt_o >>= 1) {
        opt_r0 = opt_r0 + __shfl_xor_sync(0xffffffffu, opt_r0, opt_o);
    }
    if (opt_lane == 0) {
        opt_part0[opt_warp] = opt_r0;
    }
    __syncthreads();
    if (opt_warp == 0) {
        opt_r0 = opt_lane < 8 ? opt_part0[opt_lane] : 0.0f;
#pragma unroll
        for (int opt_o = 4; opt_o > 0; opt_o >>= 1) {
            opt_r0 = opt_r0 + __shfl_xor_sync(0xffffffffu, opt_r0, opt_o);
        }
        if (opt_lane == 0) {
            atomicAdd(sum, opt_r0);
        }
    }
}

#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
__global__ void read_flush(const float4* p, size_t n, float* sink) {
  float s = 0; for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { float4 v = p[i]; s += v.x + v.y + v.z + v.w; }
  if (s == 1234.5f) *sink = s;
}
int main() {
  int dev; cudaGetDevice(&dev); cudaDeviceProp prop; cudaGetDeviceProperties(&prop, dev);
  size_t fb = 2 * (size_t)prop.l2CacheSize; void* flush; cudaMalloc(&flush, fb);
  float* sink; cudaMalloc(&sink, 4);
  cudaStream_t st; cudaStreamCreate(&st);
  printf("# %s L2 %d MiB\n", prop.name, prop.l2CacheSize >> 20);
  for (int lg : {24, 26, 28}) {
    size_t n = (size_t)1 << lg; float* x; float* sum; cudaMalloc(&x, n * 4); cudaMalloc(&sum, 4);
    std::vector<float> h(n); for (size_t i = 0; i < n; ++i) h[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
    cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice);
    int grid = std::min<long long>((n + 8191) / 8192, 528);
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<float> t;
      for (int r = 0; r < 60; ++r) {
        cudaMemsetAsync(sum, 0, 4, st);
        if (mode == 0 || mode == 1) cudaMemsetAsync(flush, r & 0xFF, fb, st);
        if (mode == 1 || mode == 2) read_flush<<<528, 256, 0, st>>>((const float4*)flush, fb / 16, sink);
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        cudaEventRecord(a, st); reduce_sum<<<grid, 256, 0, st>>>(x, sum, (int)n); cudaEventRecord(b, st);
        cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 10) t.push_back(ms);
      }
      std::sort(t.begin(), t.end()); float med = t[t.size() / 2];
      const char* names[] = {"memset flush (harness)", "memset + read flush (clean L2)", "read flush only", "no flush (warm L2)"};
      printf("n=2^%d %-32s median %.4f ms  %.3f TB/s  (%.1f %% of 4.3)\n", lg, names[mode], med, n * 4 / med / 1e9, 100 * n * 4 / med / 1e9 / 4.3);
    }
    // empty-ish: launch overhead of a trivial kernel
    cudaFree(x); cudaFree(sum);
  }
  std::vector<float> t;
  for (int r = 0; r < 60; ++r) { cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a, st); read_flush<<<528, 256, 0, st>>>((const float4*)flush, 0, sink); cudaEventRecord(b, st);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); if (r >= 10) t.push_back(ms); }
  std::sort(t.begin(), t.end()); printf("empty kernel (528x256) between events: median %.4f ms\n", t[t.size()/2]);
}
