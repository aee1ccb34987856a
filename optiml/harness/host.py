"""CUDA kernels run as host C++ at small sizes, without a GPU: one block at a time (the blocks of
a cluster at once); a block's threads one after another where none waits for another, else as
fibers on one OS thread, switched where a thread waits (a barrier, a shuffle, a vote), or as an
OS thread each where a thread may spin on memory another writes (`host_mode`); barriers for
__syncthreads and __syncwarp, warp shuffles through a per-warp exchange, atomics as atomic_ref,
`__shared__` as a function-static array (the block's own arena in a kernel with clusters, which
maps another block's through `__cluster_map_shared_rank`), half as _Float16 and bf16 by its bits.
A CPU check at small sizes: where a GPU is present, the GPU harness (`optiml.harness.evaluate`)
is the authority."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.spec import Case, Spec

HOST_CUDA = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>
using std::fmaf;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// How a launch runs a block's threads, set before it (`host_mode` in host.py): 0 one after
// another on this thread (no thread waits for another), 1 as fibers on this thread, each run
// until it waits at a barrier and resumed once the barrier's phase has passed, 2 as an OS thread
// each (code that may spin on memory another thread writes, which only preemption lets finish).
int host_mode = 2;

// A thread as a fiber: its context, stack, the barrier phase it waits past, and what the OS
// thread's thread_local variables hold for it while another fiber runs.
struct Fiber;
Fiber* current_fiber = nullptr;
ucontext_t scheduler_context;
void fiber_wait(const unsigned long* phase, unsigned long seen);

// A barrier for either: counts of arrivals per phase (fibers), or std::barrier (OS threads).
struct Barrier {
    unsigned expected, arrived = 0;
    unsigned long phase = 0;
    std::optional<std::barrier<>> os;
    explicit Barrier(unsigned n) : expected(n) {
        if (host_mode == 2) os.emplace(n);
    }
    struct Token {
        unsigned long phase = 0;
        std::optional<std::barrier<>::arrival_token> os;
    };
    Token arrive() {
        if (os) return {0, os->arrive()};
        Token t{phase, std::nullopt};
        if (++arrived >= expected) complete();
        return t;
    }
    void wait(Token t) {
        if (os) os->wait(std::move(*t.os));
        else fiber_wait(&phase, t.phase);
    }
    void arrive_and_wait() { wait(arrive()); }
    // One thread fewer from now on: the current phase, and every later one, waits for one less.
    void arrive_and_drop() {
        if (os) return os->arrive_and_drop();
        --expected;
        if (arrived >= expected) complete();
    }
    void complete() {
        arrived = 0;
        ++phase;
    }
};

// Per block (the blocks of a cluster run at once): its barriers, shuffle exchange, vote and
// shared memory, reached through the thread's pointers.
struct Block {
    std::unique_ptr<Barrier> barrier;
    std::vector<std::unique_ptr<Barrier>> warps;
    unsigned long long exchange[1024];
    std::atomic<int> vote{0};
};
thread_local Barrier* block_barrier;
thread_local std::vector<std::unique_ptr<Barrier>>* warp_barriers;
thread_local Block* this_block;
// Clusters (sm_90): a barrier over the cluster's threads, each block's shared memory an arena of
// its own (declarations rewritten to point into it), mapped to another block's by its rank.
constexpr size_t ARENA = 1 << 16;
alignas(16) unsigned char block_arenas[16][ARENA];
thread_local unsigned cluster_rank;
Barrier* cluster_barrier;
thread_local std::optional<Barrier::Token> cluster_token;
dim3 cluster_dim;
std::atomic<size_t> arena_used{0};
inline size_t reserve_shared(size_t bytes) {
    const size_t at = arena_used.fetch_add((bytes + 15) / 16 * 16);
    if (at + bytes > ARENA) std::abort();
    return at;
}
template <class T> T& block_shared(size_t offset) {
    return *reinterpret_cast<T*>(block_arenas[cluster_rank] + offset);
}
inline unsigned __clusterRelativeBlockRank() { return cluster_rank; }
inline unsigned __clusterSizeInBlocks() { return cluster_dim.x * cluster_dim.y * cluster_dim.z; }
template <class T> T* __cluster_map_shared_rank(T* p, unsigned rank) {
    const auto offset = reinterpret_cast<const unsigned char*>(p) - block_arenas[cluster_rank];
    return reinterpret_cast<T*>(block_arenas[rank] + offset);
}
inline void __cluster_barrier_arrive() { cluster_token = cluster_barrier->arrive(); }
inline void __cluster_barrier_arrive_relaxed() { __cluster_barrier_arrive(); }
inline void __cluster_barrier_wait() { cluster_barrier->wait(std::move(*cluster_token)); }

struct Fiber {
    ucontext_t context;
    const unsigned long* phase = nullptr;  // waiting while *phase == seen
    unsigned long seen = 0;
    bool done = false;
    dim3 thread, block;
    Barrier* block_barrier;
    std::vector<std::unique_ptr<Barrier>>* warps;
    Block* home;
    unsigned rank;
    std::optional<Barrier::Token> token;
    void save() {
        thread = threadIdx, block = blockIdx, block_barrier = ::block_barrier;
        warps = warp_barriers, home = this_block, rank = cluster_rank;
        token = std::move(cluster_token);
    }
    void restore() {
        threadIdx = thread, blockIdx = block, ::block_barrier = block_barrier;
        warp_barriers = warps, this_block = home, cluster_rank = rank;
        cluster_token = std::move(token);
    }
};

// The running fiber waits until the barrier's phase is past `seen`: back to the scheduler.
void fiber_wait(const unsigned long* phase, unsigned long seen) {
    if (*phase != seen) return;
    Fiber* f = current_fiber;
    f->phase = phase;
    f->seen = seen;
    f->save();
    swapcontext(&f->context, &scheduler_context);
    f->restore();
}
#define __cluster_dims__(...)
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(...)
unsigned block_threads;
inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { (*warp_barriers)[linear_tid() / 32]->arrive_and_wait(); }
template <class T, class V> T atomicAdd(T* p, V v) { return std::atomic_ref<T>(*p).fetch_add(T(v)); }
// Warp shuffles: every lane of the warp publishes its value, then reads its source lane's; a source
// outside the warp gives the lane its own value, as on the GPU.
template <class T>
T shuffle(T v, long src) {
    static_assert(sizeof(T) <= sizeof(unsigned long long));
    const unsigned t = linear_tid(), w = t / 32;
    unsigned long long* exchange = this_block->exchange;
    std::memcpy(&exchange[t], &v, sizeof(T));
    (*warp_barriers)[w]->arrive_and_wait();
    T out = v;
    if (src >= 0 && src / 32 == w && (unsigned long)src < block_threads)
        std::memcpy(&out, &exchange[src], sizeof(T));
    (*warp_barriers)[w]->arrive_and_wait();
    return out;
}
template <class T> T __shfl_down_sync(unsigned, T v, unsigned d, int = 32) { return shuffle(v, long(linear_tid()) + d); }
template <class T> T __shfl_up_sync(unsigned, T v, unsigned d, int = 32) { return shuffle(v, long(linear_tid()) - long(d)); }
template <class T> T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return shuffle(v, long(linear_tid() ^ unsigned(m))); }
template <class T> T __shfl_sync(unsigned, T v, int lane, int = 32) { return shuffle(v, long(linear_tid() / 32 * 32 + unsigned(lane))); }
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
// sm_90's vector atomics: atomic per element, as on the device
inline float4 atomicAdd(float4* p, float4 v) {
    return {atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y), atomicAdd(&p->z, v.z), atomicAdd(&p->w, v.w)};
}
inline float2 atomicAdd(float2* p, float2 v) { return {atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y)}; }
struct alignas(16) int4 { int x, y, z, w; };
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct alignas(8) int2 { int x, y; };
struct alignas(16) double2 { double x, y; };
#define __host__
#define __noinline__
#define __constant__ static
#define __align__(n) alignas(n)
template <class T> T __ldg(const T* p) { return *p; }
template <class T> T __ldcg(const T* p) { return *p; }
template <class T> void __stcg(T* p, T v) { *p = v; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// The block's threads vote at a barrier: 3 barriers, so that a vote of the next call cannot be
// cleared by this one's reset.
inline int __syncthreads_or(int p) {
    if (p) this_block->vote = 1;
    __syncthreads();
    const int out = this_block->vote;
    __syncthreads();
    if (linear_tid() == 0) this_block->vote = 0;
    __syncthreads();
    return out;
}
template <class A, class B> auto min(A a, B b) { return a < b ? a : b; }
template <class A, class B> auto max(A a, B b) { return a < b ? b : a; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __tanf(float x) { return std::tan(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float sinpif(float x) { return std::sin(float(M_PI) * x); }
inline float cospif(float x) { return std::cos(float(M_PI) * x); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
template <class T, class V> T atomicSub(T* p, V v) { return std::atomic_ref<T>(*p).fetch_sub(T(v)); }
template <class T, class V> T atomicAnd(T* p, V v) { return std::atomic_ref<T>(*p).fetch_and(T(v)); }
template <class T, class V> T atomicOr(T* p, V v) { return std::atomic_ref<T>(*p).fetch_or(T(v)); }
template <class T, class V> T atomicXor(T* p, V v) { return std::atomic_ref<T>(*p).fetch_xor(T(v)); }
template <class T, class V> T atomicExch(T* p, V v) { return std::atomic_ref<T>(*p).exchange(T(v)); }
template <class T, class F> T atomic_update(T* p, F f) {
    std::atomic_ref<T> a(*p);
    T old = a.load();
    while (!a.compare_exchange_weak(old, f(old))) {}
    return old;
}
template <class T, class V> T atomicMax(T* p, V v) { return atomic_update(p, [w = T(v)](T o) { return o < w ? w : o; }); }
template <class T, class V> T atomicMin(T* p, V v) { return atomic_update(p, [w = T(v)](T o) { return w < o ? w : o; }); }
// `extern __shared__` arrays (dynamic shared memory) point here: a block's own by its rank in
// its cluster (a cluster's blocks run at once); other blocks run one at a time.
alignas(16) unsigned char dynamic_smem_of[16][1 << 20];
inline unsigned char* dynamic_smem() { return dynamic_smem_of[cluster_rank]; }


// A fiber's stack: mapped once and reused, its pages taken only as it touches them.
constexpr size_t FIBER_STACK = 256 << 10;
std::vector<void*> fiber_stacks;
std::function<void()> fiber_kernel;
void fiber_start() {
    current_fiber->restore();
    fiber_kernel();
    // A thread that has finished waits at no further barrier.
    (*warp_barriers)[linear_tid() / 32]->arrive_and_drop();
    block_barrier->arrive_and_drop();
    cluster_barrier->arrive_and_drop();
    current_fiber->done = true;  // and back to the scheduler, the context's link
}

// Runs fibers until all are done: each until it waits, again once what it waits for has passed.
// A round in which every fiber still waits is a deadlock (a barrier some thread never reaches).
void run_fibers(std::vector<Fiber>& fibers) {
    for (;;) {
        bool left = false, ran = false;
        for (auto& f : fibers) {
            if (f.done) continue;
            left = true;
            if (f.phase && *f.phase == f.seen) continue;
            f.phase = nullptr;
            current_fiber = &f;
            ran = true;
            swapcontext(&scheduler_context, &f.context);
        }
        current_fiber = nullptr;
        if (!left) return;
        if (!ran) {
            std::fprintf(stderr, "deadlock: every thread left in the block waits at a barrier\n");
            std::abort();
        }
    }
}

template <class F>
void launch(dim3 grid, dim3 block, F kernel, dim3 cluster = {1, 1, 1}) {
    blockDim = block;
    gridDim = grid;
    cluster_dim = cluster;
    const unsigned threads = block.x * block.y * block.z;
    const unsigned blocks = cluster.x * cluster.y * cluster.z;
    block_threads = threads;
    if (host_mode == 0 && blocks == 1) {
        for (unsigned bz = 0; bz < grid.z; ++bz)
            for (unsigned by = 0; by < grid.y; ++by)
                for (unsigned bx = 0; bx < grid.x; ++bx)
                    for (unsigned t = 0; t < threads; ++t) {
                        threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        blockIdx = {bx, by, bz};
                        kernel();
                    }
        return;
    }
    if (grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z || blocks > 16) std::abort();
    const bool fibers = host_mode != 2;
    const unsigned total = threads * blocks;
    while (fibers && fiber_stacks.size() < total) {
        void* stack = mmap(nullptr, FIBER_STACK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stack == MAP_FAILED) std::abort();
        fiber_stacks.push_back(stack);
    }
    fiber_kernel = kernel;
    for (unsigned cz = 0; cz < grid.z; cz += cluster.z)
        for (unsigned cy = 0; cy < grid.y; cy += cluster.y)
            for (unsigned cx = 0; cx < grid.x; cx += cluster.x) {
                Barrier whole(total);
                cluster_barrier = &whole;
                std::vector<std::unique_ptr<Block>> state;
                std::vector<std::thread> pool;
                std::vector<Fiber> lanes(fibers ? total : 0);
                for (unsigned r = 0; r < blocks; ++r) {
                    auto& b = *state.emplace_back(new Block);
                    b.barrier.reset(new Barrier(threads));
                    for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                        b.warps.emplace_back(new Barrier(std::min(32u, threads - w * 32)));
                    const dim3 at = {cx + r % cluster.x, cy + r / cluster.x % cluster.y,
                                     cz + r / (cluster.x * cluster.y)};
                    for (unsigned t = 0; t < threads; ++t) {
                        const dim3 tid = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        if (fibers) {
                            Fiber& f = lanes[r * threads + t];
                            f.thread = tid, f.block = at, f.block_barrier = b.barrier.get();
                            f.warps = &b.warps, f.home = &b, f.rank = r;
                            getcontext(&f.context);
                            f.context.uc_stack.ss_sp = fiber_stacks[r * threads + t];
                            f.context.uc_stack.ss_size = FIBER_STACK;
                            f.context.uc_link = &scheduler_context;
                            makecontext(&f.context, fiber_start, 0);
                            continue;
                        }
                        pool.emplace_back([&, t, r, at, tid, bp = &b] {
                            threadIdx = tid;
                            blockIdx = at;
                            this_block = bp;
                            block_barrier = bp->barrier.get();
                            warp_barriers = &bp->warps;
                            cluster_rank = r;
                            kernel();
                            // A thread that has finished waits at no further barrier.
                            (*warp_barriers)[t / 32]->arrive_and_drop();
                            block_barrier->arrive_and_drop();
                            cluster_barrier->arrive_and_drop();
                        });
                    }
                }
                if (fibers) run_fibers(lanes);
                for (auto& t : pool) t.join();
            }
}

static unsigned state = 12345;
template <class T>
void fill(std::vector<T>& v, double lo, double hi) {
    for (auto& x : v) {
        state = state * 1664525u + 1013904223u;
        x = T(lo + (state >> 8) / double(1 << 24) * (hi - lo));
    }
}

template <class T>
int compare(const std::vector<T>& want, const std::vector<T>& got, double rtol, double atol) {
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        const double w = double(want[i]), g = double(got[i]);
        if (w == g) continue;  // equal infinities too (their difference is NaN)
        if (std::isnan(w) ? !std::isnan(g) : !(std::fabs(w - g) <= atol + rtol * std::fabs(w))) ++bad;
    }
    return bad;
}
"""

# Half and bf16 on the host, and raw files in and out.
HOST_TYPES = """
#include <cstdint>
#include <fstream>
using __half = _Float16;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return (__half)f; }
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = uint32_t(b.bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u);
    return {uint16_t(u >> 16)};
}
template <class T> std::vector<T> load(const char* path, size_t n) {
    std::vector<T> v(n);
    std::ifstream(path, std::ios::binary).read((char*)v.data(), n * sizeof(T));
    return v;
}
template <class T> void save(const char* path, const std::vector<T>& v) {
    std::ofstream(path, std::ios::binary).write((const char*)v.data(), v.size() * sizeof(T));
}
"""

# Element types the host program handles, as C types.
CTYPES = {
    "f32": "float",
    "f64": "double",
    "f16": "__half",
    "bf16": "__nv_bfloat16",
    "i32": "int",
    "u32": "unsigned",
    "i64": "long long",
    "u64": "unsigned long long",
    "u8": "unsigned char",
    "i8": "signed char",
    "i16": "short",
    "u16": "unsigned short",
}
EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([A-Za-z_][\w\s]*?)\s+(\w+)\s*\[\s*\]\s*;"
)
GUARD = re.compile(r"^#define\s+(\w+)\s*$", re.M)
# CUDA's own headers: the host program defines what it supports of them itself.
CUDA_INCLUDE = re.compile(
    r"^\s*#\s*include\s*<(cuda(_runtime|_fp16|_bf16)?|math_constants|device_launch_parameters)\.h>.*$",
    re.M,
)


def device_part(text: str, end: int | None = None) -> str:
    """A file's device code as host C++ can take it: up to the end of its last kernel, or `end`
    (the host code after it, which calls the CUDA runtime, left out), without CUDA's headers."""
    if end is None:
        end = max(k.span.end for k in SourceFile(text, "kernel.cu").kernels)
    return CUDA_INCLUDE.sub("", text[:end]) + "\n"


STATIC_SHARED = re.compile(r"__shared__\s+([A-Za-z_][\w\s]*?)\s+(\w+)((?:\s*\[[^\]]+\])+)\s*;")
CLUSTER_DIMS = re.compile(r"(?:__cluster_dims__|\bcluster_dims)\s*\(([^)]*)\)")


def _shared_per_block(m: re.Match) -> str:
    kind = f"{m.group(1)}{m.group(3)}"
    return (
        f"static const size_t {m.group(2)}_at = reserve_shared(sizeof({kind})); "
        f"auto& {m.group(2)} = block_shared<{kind}>({m.group(2)}_at);"
    )


def per_block_shared(text: str) -> str:
    """In a file with clusters (`__cluster_dims__`, `cluster_dims`), whose blocks run at once,
    each `__shared__` array becomes the block's own."""
    return STATIC_SHARED.sub(_shared_per_block, text) if CLUSTER_DIMS.search(text) else text


# What makes a thread wait for another, or depend on running beside it.
CONCURRENT = re.compile(
    r"__syncthreads|__syncwarp|__shfl|_sync\s*\(|cluster|barrier|\basm\b|cooperative|"
    r"__threadfence|volatile|memory_order|cuda::atomic|__nanosleep"
)
# What may wait without a barrier: a spin on memory another thread writes (a volatile flag, an
# atomic of cuda::std, inline assembly, a sleep), which only a preempting scheduler lets finish.
SPINS = re.compile(r"volatile|memory_order|cuda::atomic|\basm\b|__nanosleep|cooperative")


def sequential_ok(text: str) -> bool:
    """Whether the threads of `text`'s kernels may run one after another on the host."""
    return CONCURRENT.search(text) is None


def host_mode(text: str) -> str:
    """The statement that sets how the host runs the threads of `text`'s kernels (as it is
    compiled there): one after another, as fibers switched at barriers, or as OS threads where
    a thread may spin (HOST_CUDA's `host_mode`)."""
    mode = 0 if sequential_ok(text) else 2 if SPINS.search(text) else 1
    return f"host_mode = {mode};"


def host_text(text: str, end: int | None = None) -> str:
    """A kernel file as host C++: its device part (up to `end` if given), `extern __shared__`
    arrays pointing at the dynamic shared memory, each block's own `__shared__` arrays where
    blocks run at once (clusters), include guards lifted first (each file is one namespace of a
    program)."""
    text = per_block_shared(device_part(text, end))
    lifted = "".join(f"#undef {g}\n" for g in GUARD.findall(text))
    return lifted + EXTERN_SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(dynamic_smem());", text)


@dataclass
class HostRun:
    """A kernel's run on the host: `status` is ok, host_compile_error (g++ cannot build it as
    host C++: a CUDA feature the host program lacks, or an error nvcc would give too),
    runtime_error or timeout; `outputs` holds, per case, each output buffer as float64."""

    status: str
    detail: str = ""
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)


def as_float64(code: str, raw: np.ndarray) -> np.ndarray:
    """A buffer in the runner's representation (bf16 as its bits) as float64."""
    if code == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def _literal(value: int | float) -> str:
    return repr(value) if isinstance(value, int) else repr(float(value))


def _program(source: SourceFile, kernel: str, spec: Spec, cases: list[Case]) -> str:
    params = source.kernel(kernel).params
    body = []
    for n, case in enumerate(cases):
        body.append("{")
        args = []
        for p in params:
            b = spec.buffer(p.name)
            if b is not None:
                ctype = CTYPES[b.dtype]
                length = case.lengths[b.name]
                body.append(
                    f'auto {p.name} = load<{ctype}>((optiml_in_dir + "/{n}.{b.name}").c_str(), {length});'
                )
                args.append(f"{p.name}.data()")
            else:
                args.append(_literal(case.sizes.get(p.name, case.scalars.get(p.name, 0))))
        g, bl = case.grid, case.block
        body.append(host_mode(source.text))
        body.append(
            f"launch({{{g[0]}, {g[1]}, {g[2]}}}, {{{bl[0]}, {bl[1]}, {bl[2]}}}, [&] {{ "
            f"kernel::{kernel}{spec.instantiation}({', '.join(args)}); }});"
        )
        for b in spec.buffers:
            if b.role != "in":
                body.append(f'save((optiml_out_dir + "/{n}.{b.name}").c_str(), {b.name});')
        body.append("}")
    return "\n".join(
        [
            HOST_CUDA,
            HOST_TYPES,
            "#include <string>",
            f"namespace kernel {{\n{host_text(source.text)}\n}}",
            "int main(int argc, char** argv) {",
            "const std::string optiml_in_dir = argv[1], optiml_out_dir = argv[2];",
            *body,
            "}",
        ]
    )


def run_on_host(
    source: SourceFile,
    kernel: str,
    spec: Spec,
    cases: list[Case],
    inputs_dir: Path,
    workdir: Path,
    timeout_s: float = 120.0,
) -> HostRun:
    """Build `kernel` of `source` as host C++ and run it at `cases`, reading each case's buffers
    from `inputs_dir/N.NAME` (raw, in the runner's representation) and returning its outputs.
    Programs are kept in `workdir` by the hash of their text, so a kernel seen again is not
    built again."""
    try:
        program = _program(source, kernel, spec, cases)
    except (KeyError, ValueError) as e:
        return HostRun("host_compile_error", f"cannot set up the host run: {e}")
    digest = hashlib.sha256(program.encode()).hexdigest()[:16]
    build = workdir / f"host-{digest}"
    exe = build / "run"
    if not exe.is_file():
        build.mkdir(parents=True, exist_ok=True)
        (build / "run.cpp").write_text(program)
        built = subprocess.run(
            ["g++", "-std=c++20", "-O1", "-pthread", "-w", "-o", str(exe), str(build / "run.cpp")],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            errors = [line for line in built.stderr.splitlines() if "error" in line]
            first = (errors or built.stderr.splitlines() or ["g++ failed"])[0]
            return HostRun("host_compile_error", first.replace(str(build) + "/", "")[:300])
    out = build / "out"
    out.mkdir(exist_ok=True)
    try:
        ran = subprocess.run(
            [str(exe), str(inputs_dir), str(out)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return HostRun("timeout", f"did not finish within {timeout_s:.0f} s on the host")
    if ran.returncode != 0:
        why = f"signal {-ran.returncode}" if ran.returncode < 0 else f"exit {ran.returncode}"
        said = ran.stderr.strip().splitlines()
        return HostRun(
            "runtime_error",
            f"the host run ended with {why}" + (f": {said[-1][:200]}" if said else ""),
        )
    outputs = []
    for n, case in enumerate(cases):
        got = {}
        for b in spec.buffers:
            if b.role != "in":
                d = DTYPES[b.dtype]
                raw = np.fromfile(out / f"{n}.{b.name}", dtype=d.np_dtype())
                if raw.size != case.lengths[b.name]:
                    return HostRun("runtime_error", f"`{b.name}` was not written in full")
                got[b.name] = as_float64(b.dtype, raw)
        outputs.append(got)
    return HostRun("ok", outputs=outputs)
