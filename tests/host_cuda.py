"""CUDA kernels run as host C++, for checking a rewrite against its original without a GPU: a
std::thread per CUDA thread, one block at a time, barriers for __syncthreads and __syncwarp, warp
shuffles through a per-warp exchange, atomicAdd as an atomic_ref, `__shared__` as a function-static array. Small sizes only;
the GPU's checks stay the authority."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from optiml.search.catalog import Context

HOST_CUDA = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>
using std::fmaf;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* block_barrier;
std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(...)
unsigned block_threads;
inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { warp_barriers[linear_tid() / 32]->arrive_and_wait(); }
template <class T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
// Warp shuffles: every lane of the warp publishes its value, then reads its source lane's; a source
// outside the warp gives the lane its own value, as on the GPU.
unsigned long long exchange[1024];
template <class T>
T shuffle(T v, long src) {
    static_assert(sizeof(T) <= sizeof(unsigned long long));
    const unsigned t = linear_tid(), w = t / 32;
    std::memcpy(&exchange[t], &v, sizeof(T));
    warp_barriers[w]->arrive_and_wait();
    T out = v;
    if (src >= 0 && src / 32 == w && (unsigned long)src < block_threads)
        std::memcpy(&out, &exchange[src], sizeof(T));
    warp_barriers[w]->arrive_and_wait();
    return out;
}
template <class T> T __shfl_down_sync(unsigned, T v, unsigned d, int = 32) { return shuffle(v, long(linear_tid()) + d); }
template <class T> T __shfl_up_sync(unsigned, T v, unsigned d, int = 32) { return shuffle(v, long(linear_tid()) - long(d)); }
template <class T> T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return shuffle(v, long(linear_tid() ^ unsigned(m))); }
template <class T> T __shfl_sync(unsigned, T v, int lane, int = 32) { return shuffle(v, long(linear_tid() / 32 * 32 + unsigned(lane))); }
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

template <class F>
void launch(dim3 grid, dim3 block, F kernel) {
    blockDim = block;
    gridDim = grid;
    const unsigned threads = block.x * block.y * block.z;
    block_threads = threads;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(threads);
                block_barrier = &bar;
                warp_barriers.clear();
                for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                    warp_barriers.emplace_back(new std::barrier<>(std::min(32u, threads - w * 32)));
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        blockIdx = {bx, by, bz};
                        kernel();
                        // A thread that has finished waits at no further barrier.
                        warp_barriers[t / 32]->arrive_and_drop();
                        block_barrier->arrive_and_drop();
                    });
                for (auto& t : pool) t.join();
            }
}

static unsigned state = 12345;
void fill(std::vector<float>& v) {
    for (auto& x : v) {
        state = state * 1664525u + 1013904223u;
        x = (state >> 8) / float(1 << 24) * 2 - 1;
    }
}

int bad = 0;
void compare(const std::vector<float>& want, const std::vector<float>& got) {
    for (size_t i = 0; i < want.size(); ++i)
        if (!(std::fabs(want[i] - got[i]) <= 1e-5f + 1e-5f * std::fabs(want[i]))) ++bad;
}
"""


def launch_text(
    ctx: Context, namespace: str, sizes: dict[str, int], buffers: dict[str, str]
) -> str:
    case = ctx.spec.case(sizes)
    args = []
    for p in ctx.kernel.params:
        value = case.sizes.get(p.name, case.scalars.get(p.name))
        if p.is_pointer:
            args.append(f"{buffers[p.name]}.data()")
        elif isinstance(value, float):
            args.append(f"{value!r}f")
        else:
            args.append(str(value))
    g, b = case.grid, case.block
    return (
        f"launch({{{g[0]}, {g[1]}, {g[2]}}}, {{{b[0]}, {b[1]}, {b[2]}}}, [&] {{ "
        f"{namespace}::{ctx.kernel.name}({', '.join(args)}); }});"
    )


def mismatches(
    original: Context,
    candidate: Context,
    sizes: list[dict[str, int]],
    tmp: Path,
    prepare: Callable[[str], str] = lambda text: text,
) -> int:
    """Elements of the outputs where the candidate differs from the original, at each size."""
    body = []
    for s in sizes:
        case = original.spec.case(s)
        body.append("{")
        for buf in original.spec.buffers:
            body.append(
                f"std::vector<float> {buf.name}({case.lengths[buf.name]}); fill({buf.name});"
            )
            if buf.role != "in":
                body.append(f"std::vector<float> {buf.name}_want = {buf.name};")
        want = {b.name: b.name + ("_want" if b.role != "in" else "") for b in original.spec.buffers}
        body.append(launch_text(original, "original", s, want))
        body.append(launch_text(candidate, "candidate", s, {b: b for b in want}))
        body += [f"compare({b}_want, {b});" for b, w in want.items() if w != b]
        body.append("}")
    program = "\n".join(
        [
            HOST_CUDA,
            "namespace original {",
            original.source.text,
            "}",
            "namespace candidate {",
            prepare(candidate.source.text),
            "}",
            "int main() {",
            *body,
            'std::printf("%d\\n", bad);',
            "}",
        ]
    )
    source, exe = tmp / "emulate.cpp", tmp / "emulate"
    source.write_text(program)
    subprocess.run(
        ["g++", "-std=c++20", "-O0", "-pthread", "-w", "-o", str(exe), str(source)], check=True
    )
    return int(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
