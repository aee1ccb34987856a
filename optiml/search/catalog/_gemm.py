"""The naive GEMM that `gemm_tiling` rewrites, read off the kernel's tree, and the tiled SGEMM it
becomes: `HELPERS` (a register-blocked, shared-memory tiled SGEMM template, FFMA only: k-contiguous
operands staged through registers with 128-bit loads, the others copied by 16-byte cp.async, word
cp.asyncs in an out-of-line fallback where vectors do not apply; a tile per block, or stream-K for
the last wave), `match` (the analysis) and `definition` (the new kernel: the template's main loop,
the user's epilogue per output element)."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import (
    ATOMIC_FUNCTIONS,
    BARRIERS,
    Affine,
    Guard,
    KernelAST,
    ThreadIndex,
    for_header,
    operator_of,
    unparen,
    walk,
)
from optiml.cuda.types import lookup
from optiml.lift.families import add_affine
from optiml.search.catalog.base import STATIC_SMEM

# Include-guarded, so that a file whose other kernel already has it stays valid.
HELPERS = r"""#ifndef OPTIML_SGEMM_TILING
#define OPTIML_SGEMM_TILING

// Register-blocked, shared-memory tiled SGEMM on the FP32 pipes: FFMA only, no tensor cores, each
// output an fp32 sum over k in increasing order, one fused multiply-add per term (with stream-K, a
// tile split between blocks: such sums over consecutive runs of k, added in order). A block
// computes a BM x BN tile of C from K tiles of BK held in a ring of STAGES shared-memory stages;
// each thread owns TM x TN outputs in registers. On the vector path an operand whose k is
// contiguous in global memory goes through registers (128-bit loads along k, stored transposed
// into the stage a tile later) and the other one by 16-byte cp.async; where vectors do not apply
// (K, a leading dimension or an extent not a multiple of 4, a base not 16-byte aligned) both go by
// 4-byte cp.async, in a copy of the main loop kept out of line.
extern "C++" {  // templates, also where the kernel is inside extern "C"
namespace optiml_sgemm {

// Out of bounds, the source size is 0: nothing is read and the destination is zero-filled.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void copy16(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// 4 words from global memory into registers, zeros out of bounds (the vector is wholly inside or
// outside the matrix).
__device__ __forceinline__ float4 load4(const float* src, bool valid) {
    return valid ? *reinterpret_cast<const float4*>(src) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// One operand as a block stages it: BX rows of the matrix (M for A, N for B) by a K tile of BK,
// stored k-major in shared memory ([BK][BX + PAD]) so that a thread reads its fragment for one k
// with 128-bit loads.
// K_CONTIGUOUS: k is the unit-stride index in global memory (A row-major, B column-major), and the
// tile is transposed on its way in. On the vector path it goes through registers: a lane pair loads
// a row's 8 consecutive k (a whole 32-byte sector) as two 128-bit loads, THREADS / 2 rows at a time,
// and later stores them word by word down the k rows of the stage; PAD = 4 (LD = 4 mod 8) puts the
// two k-quads of a lane pair 16 banks apart, so that a warp's stores (16 rows by 2 k-quads) hit 32
// different banks. Otherwise word cp.asyncs, a warp taking 8 consecutive k of 4 rows per
// instruction (whole sectors again), into the same layout.
// Otherwise: cp.async along the rows, 16 bytes at a time on the vector path, else word by word; no
// transposition, no padding.
template <int BX, int BK, int THREADS, bool K_CONTIGUOUS, bool STAGED>
struct Operand {
    static constexpr int PAD = K_CONTIGUOUS ? 4 : 0;
    static constexpr int LD = BX + PAD;
    static constexpr int STAGE = BK * LD;
    static constexpr int WORDS = BX * BK / THREADS;  // words per thread and tile
    static constexpr int VECS = WORDS / 4;            // 128-bit vectors per thread and tile
    // A K_CONTIGUOUS tile is copied as runs of 4 k, PAIRS rows at a time (vectors), or as runs of
    // 8 k, ROWS rows at a time (words); any other as rows of BX, ROWS4 (ROWS1 for words) at a time.
    static constexpr int PAIRS = THREADS / 2, ROWS = THREADS / 8;
    static constexpr int ROWS4 = 4 * THREADS / BX, ROWS1 = THREADS / BX;
    static_assert(BK % 8 == 0 && BX % 8 == 0 && WORDS % 4 == 0 &&
                      (K_CONTIGUOUS ? BX % ROWS == 0 && (!STAGED || BX % PAIRS == 0)
                                    : THREADS % BX == 0 && BK % ROWS4 == 0),
                  "the tile is not shared evenly by the threads");

    // Whether every 4 words along the unit stride are one aligned 16-byte vector, wholly inside or
    // outside the matrix: the vector path.
    __device__ static bool vectorizable(const float* base, int ld, int extent, int K) {
        return ld % 4 == 0 && (K_CONTIGUOUS ? K : extent) % 4 == 0 &&
               reinterpret_cast<unsigned long long>(base) % 16 == 0;
    }

    // One thread's part of the operand's tiles, taken in order: each copy or load moves on by BK.
    template <bool VEC>
    struct Stream {
        static constexpr bool REGS = K_CONTIGUOUS && STAGED && VEC;  // through registers
        const float* src;  // the thread's first word of the next tile
        int x, k;          // its row and k
        int dst;           // its first word's offset in a stage
        int ld, extent, K;

        __device__ __forceinline__ Stream(const float* base, int ld_, int extent_, int K_, int x0,
                                          int k0, int tid)
            : ld(ld_), extent(extent_), K(K_) {
            const int dx = REGS            ? tid / 2
                           : K_CONTIGUOUS ? tid / 8
                           : VEC          ? tid % (BX / 4) * 4
                                          : tid % BX;
            const int dk = REGS            ? tid % 2 * 4
                           : K_CONTIGUOUS ? tid % 8
                           : VEC          ? tid / (BX / 4)
                                          : tid / BX;
            x = x0 + dx;
            k = k0 + dk;
            dst = dk * LD + dx;
            src = base + (K_CONTIGUOUS ? (long long)x * ld + k : (long long)k * ld + x);
        }

        __device__ __forceinline__ void advance() {
            src += K_CONTIGUOUS ? (long long)BK : (long long)BK * ld;
            k += BK;
        }

        // The next tile's cp.asyncs into `stage` (not REGS).
        __device__ __forceinline__ void copy(float* stage) {
            float* d = stage + dst;
            if (REGS) {
                return;
            } else if (K_CONTIGUOUS) {
                // Word i: row x + i % (BX / ROWS) * ROWS, k + i / (BX / ROWS) * 8.
#pragma unroll
                for (int i = 0; i < WORDS; ++i) {
                    const int dx = i % (BX / ROWS) * ROWS, dk = i / (BX / ROWS) * 8;
                    copy4(d + dk * LD + dx, src + (long long)dx * ld + dk,
                          x + dx < extent && k + dk < K);
                }
            } else if (VEC) {
#pragma unroll
                for (int i = 0; i < VECS; ++i) {
                    const int dk = i * ROWS4;
                    copy16(d + dk * LD, src + (long long)dk * ld, x < extent && k + dk < K);
                }
            } else {
#pragma unroll
                for (int i = 0; i < WORDS; ++i) {
                    const int dk = i * ROWS1;
                    copy4(d + dk * LD, src + (long long)dk * ld, x < extent && k + dk < K);
                }
            }
            advance();
        }

        // The next tile into registers (REGS): vector p is row x + p % (BX / PAIRS) * PAIRS,
        // k + p / (BX / PAIRS) * 8 to + 3.
        __device__ __forceinline__ void load(float4 (&r)[VECS]) {
            if (REGS) {
#pragma unroll
                for (int p = 0; p < VECS; ++p) {
                    const int dx = p % (BX / PAIRS) * PAIRS, dk = p / (BX / PAIRS) * 8;
                    r[p] = load4(src + (long long)dx * ld + dk, x + dx < extent && k + dk < K);
                }
                advance();
            }
        }

        // The registers of `load` into `stage`, transposed (REGS).
        __device__ __forceinline__ void store(float* stage, const float4 (&r)[VECS]) const {
            if (REGS) {
#pragma unroll
                for (int p = 0; p < VECS; ++p) {
                    float* d = stage + dst + p / (BX / PAIRS) * 8 * LD + p % (BX / PAIRS) * PAIRS;
                    d[0] = r[p].x;
                    d[LD] = r[p].y;
                    d[2 * LD] = r[p].z;
                    d[3 * LD] = r[p].w;
                }
            }
        }
    };
};

// The block's threads as warps of WM x WN, each lane holding RM x RN groups of 4 x 4 outputs: a
// lane's groups are 16 rows (32 columns) apart, so that the lanes reading one k row of a stage read
// 4 (8) consecutive 16-byte vectors, served as broadcasts without bank conflicts.
// SK = 0: a 2-D grid, a block per tile of C (blockIdx.x along N). SK > 0: a 1-D grid and stream-K
// (Osama et al., PPoPP 2023) over SK blocks, where the grid is what the launch makes of it (see
// `schedule`); the partial sums of a tile split between blocks go through a static workspace, so
// two launches of the kernel must not run at the same time (on two streams).
template <int BM, int BN, int BK, int RM, int RN, int STAGES, bool A_K_CONTIGUOUS,
          bool B_K_CONTIGUOUS, int REG_VECS, int SK = 0>
struct Tiling {
    static constexpr int LANES_M = 4, LANES_N = 8;
    static constexpr int TM = 4 * RM, TN = 4 * RN;
    static constexpr int GM = LANES_M * 4, GN = LANES_N * 4;  // from one 4 x 4 group to the next
    static constexpr int WM = LANES_M * TM, WN = LANES_N * TN;
    static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static_assert(BM % WM == 0 && BN % WN == 0, "the block tile is not made of warp tiles");
    static_assert(STAGES >= 2, "a tile is copied while another is multiplied");
    // Staged through registers on the vector path: the K_CONTIGUOUS operands, where their 128-bit
    // vectors per thread and tile add up to at most REG_VECS (both or neither where both are: one
    // staged beside the other's word copies costs the staging registers without its gain).
    static constexpr int A_VECS = BM * BK / THREADS / 4, B_VECS = BN * BK / THREADS / 4;
    static constexpr int STAGED_VECS =
        (A_K_CONTIGUOUS ? A_VECS : 0) + (B_K_CONTIGUOUS ? B_VECS : 0);
    static constexpr bool A_STAGED = A_K_CONTIGUOUS && STAGED_VECS <= REG_VECS;
    static constexpr bool B_STAGED = B_K_CONTIGUOUS && STAGED_VECS <= REG_VECS;
    using A = Operand<BM, BK, THREADS, A_K_CONTIGUOUS, A_STAGED>;
    using B = Operand<BN, BK, THREADS, B_K_CONTIGUOUS, B_STAGED>;
    static constexpr int STAGE = A::STAGE + B::STAGE;
    // After the main loop each warp reuses LANES_M x WN floats of the stages to regroup its outputs
    // by rows, so that the epilogue's loads and stores of C are coalesced.
    static constexpr int EPILOGUE = WARPS_M * WARPS_N * LANES_M * WN;
    static constexpr int SMEM_FLOATS = STAGES * STAGE > EPILOGUE ? STAGES * STAGE : EPILOGUE;
    static constexpr int SMEM_VECS = SMEM_FLOATS / 4;  // the kernel's float4 array: 16-byte aligned

    // epilogue(row, col, acc) for every (row, col) of the block's tile; bounds are left to it.
    template <class Epilogue>
    __device__ __forceinline__ static void run(float4* smem4, const float* a, int lda,
                                               const float* b, int ldb, int M, int N, int K,
                                               Epilogue epilogue) {
        float* smem = reinterpret_cast<float*>(smem4);
        if (A::vectorizable(a, lda, M, K) && B::vectorizable(b, ldb, N, K))
            schedule<true>(smem, a, lda, b, ldb, M, N, K, epilogue);
        else
            fallback(smem, a, lda, b, ldb, M, N, K, epilogue);
    }

    // The main loop with word copies, as a call: its registers are allocated apart from the vector
    // path's (inlined together, the two can spill at the register cap of the blocks per SM asked).
    template <class Epilogue>
    __device__ __noinline__ static void fallback(float* smem, const float* a, int lda,
                                                 const float* b, int ldb, int M, int N, int K,
                                                 Epilogue epilogue) {
        schedule<false>(smem, a, lda, b, ldb, M, N, K, epilogue);
    }

    // Split-K over a cluster of S blocks, for a C of fewer tiles than the GPU has SMs and a long K:
    // the kernel is declared with cluster dimensions (1, 1, S) on a grid of S * Z blocks along z
    // (Z batches: batch blockIdx.z / S). Block q of the cluster sums K tiles [I q / S, I (q + 1) / S)
    // of the tile (blockIdx.y, blockIdx.x) and leaves that partial tile in its shared memory; after
    // the cluster's barrier it adds up rows [q BM / S, (q + 1) BM / S) of all S partial tiles, in the
    // order of q (the same sum whichever block does it), and runs the epilogue on them. No
    // workspace, no atomics: launches may overlap. The kernel's float4 array holds SPLIT_VECS.
    static constexpr int SPLIT_VECS = SMEM_VECS > BM * BN / 4 ? SMEM_VECS : BM * BN / 4;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // clusters: sm_90 on
    template <int S, class Epilogue>
    __device__ __forceinline__ static void run_split(float4* smem4, const float* a, int lda,
                                                     const float* b, int ldb, int M, int N,
                                                     int K, Epilogue epilogue) {
        float* smem = reinterpret_cast<float*>(smem4);
        if (A::vectorizable(a, lda, M, K) && B::vectorizable(b, ldb, N, K))
            split<true, S>(smem, a, lda, b, ldb, M, N, K, epilogue);
        else
            split_fallback<S>(smem, a, lda, b, ldb, M, N, K, epilogue);
    }

    template <int S, class Epilogue>
    __device__ __noinline__ static void split_fallback(float* smem, const float* a, int lda,
                                                       const float* b, int ldb, int M, int N,
                                                       int K, Epilogue epilogue) {
        split<false, S>(smem, a, lda, b, ldb, M, N, K, epilogue);
    }

    template <bool VEC, int S, class Epilogue>
    __device__ __forceinline__ static void split(float* smem, const float* a, int lda,
                                                 const float* b, int ldb, int M, int N, int K,
                                                 Epilogue epilogue) {
        static_assert(S >= 1 && BM % S == 0, "the tile's rows are not shared evenly by the cluster");
        const int I = (K + BK - 1) / BK;
        const int q = static_cast<int>(__clusterRelativeBlockRank());
        const int kb = static_cast<int>((long long)I * q / S);
        const int ke = static_cast<int>((long long)I * (q + 1) / S);
        const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
        float acc[TM][TN];
        if (ke > kb) {
            product<VEC>(smem, a, lda, b, ldb, M, N, K, m0, n0, kb, ke, acc);
        } else {  // K shorter than the cluster's K tiles: nothing to add
#pragma unroll
            for (int i = 0; i < TM; ++i) {
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
            }
        }
        wait<0>();
        __syncthreads();  // the stages are free: the partial tile goes there, [BM][BN]
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int wm = warp / WARPS_N * WM, wn = warp % WARPS_N * WN;
        const int lm = lane / LANES_N * 4, ln = lane % LANES_N * 4;
#pragma unroll
        for (int r = 0; r < RM; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int c = 0; c < RN; ++c)
                    *reinterpret_cast<float4*>(smem + (wm + r * GM + lm + i) * BN + wn + c * GN +
                                               ln) =
                        make_float4(acc[r * 4 + i][c * 4], acc[r * 4 + i][c * 4 + 1],
                                    acc[r * 4 + i][c * 4 + 2], acc[r * 4 + i][c * 4 + 3]);
            }
        }
        __cluster_barrier_arrive();
        __cluster_barrier_wait();
        constexpr int ROWS = BM / S;
        for (int e = threadIdx.x; e < ROWS * BN; e += THREADS) {
            const int at = (q * ROWS + e / BN) * BN + e % BN;
            float sum = 0.f;
#pragma unroll
            for (int p = 0; p < S; ++p)
                sum += static_cast<const float*>(__cluster_map_shared_rank(smem, p))[at];
            epilogue(m0 + at / BN, n0 + at % BN, sum);
        }
        // no block leaves (its shared memory) while another may still read it
        __cluster_barrier_arrive();
        __cluster_barrier_wait();
    }
#endif

    // The block's work. Without stream-K, the tile (blockIdx.y, blockIdx.x). With it, on a grid of
    // G blocks for T tiles of I K tiles each: G = T where T < SK or SK divides T, and then a tile
    // per block; else G = T - T % SK (whole waves of SK blocks), the first G - SK blocks a tile
    // each and the last SK blocks the remaining SK + T % SK tiles' K tiles in equal runs, each at
    // most 2 tiles long, so that the last wave ends level instead of leaving T % SK blocks' worth
    // of the GPU idle. Any other grid: tiles blockIdx.x, + G, ... (correct, not balanced).
    template <bool VEC, class Epilogue>
    __device__ __forceinline__ static void schedule(float* smem, const float* a, int lda,
                                                    const float* b, int ldb, int M, int N, int K,
                                                    Epilogue epilogue) {
        const int I = (K + BK - 1) / BK;
        float acc[TM][TN];
        if constexpr (SK == 0) {
            const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
            product<VEC>(smem, a, lda, b, ldb, M, N, K, m0, n0, 0, I, acc);
            store(smem, m0, n0, acc, epilogue);
        } else {
            const int tiles_n = (N + BN - 1) / BN, T = (M + BM - 1) / BM * tiles_n;
            const int G = gridDim.x;
            const bool streamed = I > 0 && G < T && G >= SK && T - (G - SK) <= 2 * SK;
            const int dp = streamed ? G - SK : T;  // tiles taken whole, a block each
            int t = blockIdx.x;
            long long it = 0, end = 0;  // the block's run of K tiles, counted over all tiles
            if (streamed && t >= dp) {
                it = begin(t - dp, dp, T, I);
                end = begin(t - dp + 1, dp, T, I);
                t = T;
            }
            for (;;) {
                int tile, kb, ke;
                if (t < dp) {
                    tile = t, kb = 0, ke = I;
                    t += G;
                } else if (it < end) {
                    tile = static_cast<int>(it / I);
                    kb = static_cast<int>(it - (long long)tile * I);
                    ke = static_cast<int>(min((long long)I, kb + (end - it)));
                    it += ke - kb;
                } else {
                    break;
                }
                const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
                product<VEC>(smem, a, lda, b, ldb, M, N, K, m0, n0, kb, ke, acc);
                if ((kb == 0 && ke == I) || fixup(blockIdx.x - dp, tile, dp, T, I, acc))
                    store(smem, m0, n0, acc, epilogue);
                __syncthreads();  // the stages and rows are free for the next tile
            }
        }
    }

    // Where stream-K block j's run of K tiles starts, counted over all tiles.
    __device__ __forceinline__ static long long begin(int j, int dp, int T, int I) {
        const long long total = (long long)(T - dp) * I;
        return (long long)dp * I + total * j / SK;
    }

    // Partial sums of tiles split between stream-K blocks: 2 slots of BM x BN per block (the part
    // of the first tile it meets, and of its last), each thread's outputs as consecutive vectors.
    static constexpr int TILE_VECS = BM * BN / 4;
    __device__ __forceinline__ static float4* workspace() {
        static float4 partials[2 * (SK > 0 ? SK : 1) * TILE_VECS];
        return partials;
    }
    __device__ __forceinline__ static unsigned* arrivals() {
        static unsigned count[2 * (SK > 0 ? SK : 1)];  // per streamed tile, back to 0 after
        return count;
    }

    // Stream-K block j holds some of the K tiles of `tile`, not all: it leaves its part in its
    // slot; the last of the tile's blocks to arrive adds up all parts in the order of k (the same
    // sum whichever block it is) into acc and returns true, to store the tile; the others, false.
    __device__ __forceinline__ static bool fixup(int j, int tile, int dp, int T, int I,
                                                 float (&acc)[TM][TN]) {
        const int tid = threadIdx.x;
        const long long first = (long long)tile * I, last = first + I;
        int j0 = j, j1 = j;
        while (begin(j0, dp, T, I) > first) --j0;
        while (j1 + 1 < SK && begin(j1 + 1, dp, T, I) < last) ++j1;
        float4* ws = workspace();
        const auto slot = [&](int q) {
            return ws + (2 * q + (begin(q, dp, T, I) >= first ? 0 : 1)) * (long long)TILE_VECS;
        };
        float4* mine = slot(j);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int c = 0; c < RN; ++c)
                __stcg(mine + (i * RN + c) * THREADS + tid,
                       make_float4(acc[i][4 * c], acc[i][4 * c + 1], acc[i][4 * c + 2],
                                   acc[i][4 * c + 3]));
        }
        __threadfence();
        unsigned* count = arrivals() + (tile - dp);
        if (!__syncthreads_or(tid == 0 && atomicAdd(count, 1u) == unsigned(j1 - j0)))
            return false;
        if (tid == 0) *count = 0;
        __threadfence();
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                float4 sum = __ldcg(slot(j0) + (i * RN + c) * THREADS + tid);
                for (int q = j0 + 1; q <= j1; ++q) {
                    const float4 v = __ldcg(slot(q) + (i * RN + c) * THREADS + tid);
                    sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
                }
                acc[i][4 * c] = sum.x, acc[i][4 * c + 1] = sum.y;
                acc[i][4 * c + 2] = sum.z, acc[i][4 * c + 3] = sum.w;
            }
        }
        return true;
    }

    // One k row of a stage: the lane's RM (RN) 4-row groups of A (B), as 128-bit loads.
    __device__ __forceinline__ static void fragments(float4 (&fa)[RM], float4 (&fb)[RN],
                                                     const float* sa, const float* sb) {
#pragma unroll
        for (int r = 0; r < RM; ++r) fa[r] = *reinterpret_cast<const float4*>(sa + r * GM);
#pragma unroll
        for (int c = 0; c < RN; ++c) fb[c] = *reinterpret_cast<const float4*>(sb + c * GN);
    }

    // K tile t, read from stage s (a constant once the tile loop is unrolled, so that every shared
    // address in it is a register plus an immediate): its FFMAs, and at its last k the hand-over to
    // tile t + 1. Register-staged operands run 2 tiles ahead (tile t + 1 in registers during tile
    // t, stored at its end), cp.async ones STAGES - 1.
    template <bool VEC, class SA, class SB>
    __device__ __forceinline__ static void step(
        int s, int t, int tiles, float* smem, const float* sa, const float* sb, SA& ga, SB& gb,
        float4 (&ra)[A::VECS], float4 (&rb)[B::VECS], float4 (&fa)[2][RM], float4 (&fb)[2][RN],
        float (&acc)[TM][TN]) {
        const int read = s * STAGE, next = (s + 1) % STAGES * STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk < BK - 1) {
                fragments(fa[(kk + 1) % 2], fb[(kk + 1) % 2], sa + read + (kk + 1) * A::LD,
                          sb + read + (kk + 1) * B::LD);
            } else if (t + 1 < tiles) {
                // Tile t + 1 from registers into its stage, last read in tile t + 1 - STAGES,
                // before an earlier barrier. Its cp.asyncs have landed for this thread, and after
                // the barrier for all; no thread reads stage s any more, so tile t + STAGES goes
                // there by cp.async (and tile t + 2 into registers, for the end of tile t + 1).
                ga.store(smem + next, ra);
                gb.store(smem + next + A::STAGE, rb);
                wait<STAGES - 2>();
                __syncthreads();
                if (t + STAGES < tiles) {
                    ga.copy(smem + read);
                    gb.copy(smem + read + A::STAGE);
                }
                commit();
                if (t + 2 < tiles) {
                    ga.load(ra);
                    gb.load(rb);
                }
                fragments(fa[0], fb[0], sa + next, sb + next);
            }
#pragma unroll
            for (int r = 0; r < RM; ++r) {
                const float av[4] = {fa[kk % 2][r].x, fa[kk % 2][r].y, fa[kk % 2][r].z,
                                     fa[kk % 2][r].w};
#pragma unroll
                for (int c = 0; c < RN; ++c) {
                    const float bv[4] = {fb[kk % 2][c].x, fb[kk % 2][c].y, fb[kk % 2][c].z,
                                         fb[kk % 2][c].w};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            acc[r * 4 + i][c * 4 + j] =
                                fmaf(av[i], bv[j], acc[r * 4 + i][c * 4 + j]);
                    }
                }
            }
        }
    }

    // acc = the sum over K tiles [kb, ke) of the tile of C at (m0, n0), in increasing k.
    template <bool VEC>
    __device__ __forceinline__ static void product(float* smem, const float* a, int lda,
                                                   const float* b, int ldb, int M, int N, int K,
                                                   int m0, int n0, int kb, int ke,
                                                   float (&acc)[TM][TN]) {
        const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
        const int wm = warp / WARPS_N * WM, wn = warp % WARPS_N * WN;
        const int lm = lane / LANES_N * 4, ln = lane % LANES_N * 4;
        const int tiles = ke - kb;
        typename A::template Stream<VEC> ga(a, lda, M, K, m0, kb * BK, tid);
        typename B::template Stream<VEC> gb(b, ldb, N, K, n0, kb * BK, tid);

#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
        }

        // Register-staged operands: tile 0 into stage 0 and tile 1 into registers. The others:
        // every stage filled ahead, STAGES - 1 tiles in flight while one is multiplied.
        float4 ra[A::VECS], rb[B::VECS];
        ga.load(ra);
        gb.load(rb);
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (s < tiles) {
                ga.copy(smem + s * STAGE);
                gb.copy(smem + s * STAGE + A::STAGE);
            }
            commit();
        }
        ga.store(smem, ra);
        gb.store(smem + A::STAGE, rb);
        if (tiles > 1) {
            ga.load(ra);
            gb.load(rb);
        }
        wait<STAGES - 1>();
        __syncthreads();

        // Fragments double-buffered in registers: the shared loads of k + 1 are in flight during
        // the FFMAs of k, across tiles too.
        float4 fa[2][RM], fb[2][RN];
        const float* sa = smem + wm + lm;
        const float* sb = smem + A::STAGE + wn + ln;
        fragments(fa[0], fb[0], sa, sb);
        // STAGES tiles per iteration, one from each stage.
        for (int t = 0; t < tiles; t += STAGES) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                if (s == 0 || t + s < tiles)
                    step<VEC>(s, t + s, tiles, smem, sa, sb, ga, gb, ra, rb, fa, fb, acc);
            }
        }
    }

    // epilogue(row, col, acc) for the tile of C at (m0, n0), regrouped by rows through shared
    // memory, one row of each lane's 4 x 4 groups at a time: the warp's 32 lanes then handle 32
    // consecutive columns.
    template <class Epilogue>
    __device__ __forceinline__ static void store(float* smem, int m0, int n0,
                                                 const float (&acc)[TM][TN], Epilogue epilogue) {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int wm = warp / WARPS_N * WM, wn = warp % WARPS_N * WN;
        const int lm = lane / LANES_N * 4, ln = lane % LANES_N * 4;
        wait<0>();
        __syncthreads();
        float* rows = smem + warp * (LANES_M * WN);
#pragma unroll
        for (int r = 0; r < RM; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int c = 0; c < RN; ++c)
                    *reinterpret_cast<float4*>(rows + lm / 4 * WN + c * GN + ln) =
                        make_float4(acc[r * 4 + i][c * 4], acc[r * 4 + i][c * 4 + 1],
                                    acc[r * 4 + i][c * 4 + 2], acc[r * 4 + i][c * 4 + 3]);
                __syncwarp();
#pragma unroll
                for (int q = 0; q < TN; ++q) {
                    const int e = q * 32 + lane;
                    epilogue(m0 + wm + r * GM + e / WN * 4 + i, n0 + wn + e % WN, rows[e]);
                }
                __syncwarp();
            }
        }
    }
};

}  // namespace optiml_sgemm
}
#endif
"""

BUILTINS = ("threadIdx", "blockIdx", "blockDim", "gridDim")
FMA_FUNCTIONS = frozenset({"fmaf", "__fmaf_rn", "fma"})
# Statements an epilogue, run once per output element inside a lambda, cannot hold (a `return`
# it can: the epilogue ends the kernel, so returning ends the element's work either way).
UNSAFE = frozenset(
    {
        "for_statement",
        "for_range_loop",
        "while_statement",
        "do_statement",
        "break_statement",
        "continue_statement",
        "goto_statement",
        "labeled_statement",
        "switch_statement",
        "lambda_expression",
    }
)
LANES_M, LANES_N = 4, 8  # a warp's lanes over a warp tile (Tiling::LANES_M, LANES_N)


@dataclass(frozen=True)
class Operand:
    """One factor of the products as the tiles read it: element (x, k) at offset + x * ld + k
    (k contiguous: staged through registers on the template's vector path, where the config's
    reg_vecs allows) or offset + k * ld + x (copied by cp.async)."""

    pointer: str
    offset: Affine  # uniform, in elements
    ld: Affine
    k_contiguous: bool

    @property
    def base(self) -> str:
        return f"{self.pointer} + {render(self.offset, wide=True)}" if self.offset else self.pointer


@dataclass(frozen=True)
class Gemm:
    """C[row, col] = epilogue(sum over k < K of a(row, k) * b(k, col)) for row < M, col < N."""

    ast: KernelAST
    row: ThreadIndex  # C's strided index: the tiles' rows (blockIdx.y)
    col: ThreadIndex  # C's unit-stride index: the tiles' columns (blockIdx.x), coalesced stores
    m: Affine
    n: Affine
    k: Affine
    a: Operand  # indexed by row and k
    b: Operand  # indexed by k and col
    acc: str
    guard: Guard
    before: list[Node]  # declarations the epilogue needs from before the guard, in order
    kept: list[Node]  # those from under the guard, before the loop
    epilogue: list[Node]  # the statements after the loop
    # what the accumulator starts from where it is not 0 (`float acc = bias[col];`): the tiles sum
    # the products from 0 and the epilogue adds it first (a sum in another order, as any tiling)
    seed: str | None = None


@dataclass(frozen=True)
class Config:
    """A block tile of BM x BN in K steps of BK; each thread RM x RN groups of 4 x 4 outputs."""

    bm: int
    bn: int
    bk: int
    rm: int
    rn: int
    stages: int
    min_blocks: int  # blocks per SM that __launch_bounds__ asks registers for
    # 128-bit vectors per thread and K tile that k-contiguous operands may stage through registers
    # on the vector path (Tiling::REG_VECS): the most at which the config compiles without spills.
    reg_vecs: int = 8
    # Whether a twin with stream-K (Tiling::SK) is proposed where the last wave is not whole.
    stream_k: bool = False

    @property
    def tm(self) -> int:
        return 4 * self.rm

    @property
    def tn(self) -> int:
        return 4 * self.rn

    @property
    def params(self) -> dict[str, int]:
        """What a proposal of this config records (min_blocks is not among them)."""
        return {
            "bm": self.bm,
            "bn": self.bn,
            "bk": self.bk,
            "tm": self.tm,
            "tn": self.tn,
            "threads": self.threads,
            "stages": self.stages,
        }

    @property
    def threads(self) -> int:
        return 32 * (self.bm // (LANES_M * self.tm)) * (self.bn // (LANES_N * self.tn))

    def smem_bytes(self, a_k_contiguous: bool, b_k_contiguous: bool) -> int:
        """Tiling::SMEM_FLOATS, in bytes."""
        stage = self.bk * (self.bm + 4 * a_k_contiguous + self.bn + 4 * b_k_contiguous)
        epilogue = (self.threads // 32) * LANES_M * LANES_N * self.tn
        return 4 * max(self.stages * stage, epilogue)

    def staged(self, a_k_contiguous: bool, b_k_contiguous: bool) -> tuple[bool, bool]:
        """Which operands go through registers on the vector path (Tiling::A_STAGED, B_STAGED)."""
        a_vecs, b_vecs = (x * self.bk // self.threads // 4 for x in (self.bm, self.bn))
        fits = a_vecs * a_k_contiguous + b_vecs * b_k_contiguous <= self.reg_vecs
        return a_k_contiguous and fits, b_k_contiguous and fits

    def fits(self, g: Gemm) -> bool:
        """The template's static assertions for this layout, and static shared memory."""
        if self.bm % (LANES_M * self.tm) or self.bn % (LANES_N * self.tn) or self.bk % 8:
            return False
        staged = self.staged(g.a.k_contiguous, g.b.k_contiguous)
        for extent, op, regs in ((self.bm, g.a, staged[0]), (self.bn, g.b, staged[1])):
            t = self.threads
            if extent * self.bk % (4 * t) or extent % 8:
                return False
            if op.k_contiguous and (extent % (t // 8) or regs and extent % (t // 2)):
                return False
            if not op.k_contiguous and (t % extent or self.bk % (4 * t // extent)):
                return False
        return self.smem_bytes(g.a.k_contiguous, g.b.k_contiguous) <= STATIC_SMEM


def match(ast: KernelAST) -> Gemm | None:
    """The kernel as a naive GEMM, or None if it is not one this rewrite keeps exact."""
    indices = ast.thread_indices()
    if len(indices) != 2 or {t.dim for t in indices.values()} != {"x", "y"}:
        return None
    decls = {t.decl.id for t in indices.values()}
    for t in indices.values():
        if any(_name(ast, d) not in indices for d in t.decl.children_by_field_name("declarator")):
            return None
    guard = ast.guard()
    if guard is None or not guard.exact or set(guard.bounds) != set(indices):
        return None
    stmts = ast.statements()
    at = stmts.index(guard.node)
    if any(st.id in decls for st in stmts[at + 1 :]):
        return None
    before = [st for st in stmts[:at] if st.id not in decls]
    flat = before + guard.body
    if any(ast.uses_builtin(st, b) for st in [*flat, guard.condition] for b in BUILTINS):
        return None
    loops = [i for i, st in enumerate(flat) if st.type == "for_statement"]
    if len(loops) != 1:
        return None
    prologue, loop, epilogue = flat[: loops[0]], flat[loops[0]], flat[loops[0] + 1 :]
    found = _accumulation(ast, loop)
    if found is None:
        return None
    acc, k, bound, factors = found
    seed = _seed(ast, prologue, acc)
    if seed is None:
        return None
    if not all(_pure_declaration(ast, st) for st in prologue if st is not seed[0]):
        return None
    # The epilogue sees the sum where the prologue saw 0: nothing before the loop may read acc.
    if sum(acc in ast.identifiers(st) for st in prologue) != 1:
        return None

    ints = _integer_params(ast)
    env = _affine_env(ast, prologue, set(indices))
    k_extent = _uniform(ast.affine(bound, env), ints)
    bounds = _bound_nodes(ast, guard)
    if k_extent is None or bounds is None:
        return None
    operands = []
    for factor in factors:
        form = _index_form(ast, factor, prologue, env)
        op = None if form is None else _operand(form, k, set(indices), ints)
        if op is None:
            return None
        operands.append(op)
    (x1, op1), (x2, op2) = operands
    if x1 == x2:
        return None

    out, c_form = _epilogue_target(ast, flat, epilogue, _affine_env(ast, flat, set(indices)))
    used = set().union(*(ast.identifiers(st) for st in epilogue))
    if out is None or out in (op1.pointer, op2.pointer) or acc not in used:
        return None
    unit = [v for v in indices if c_form.get((v,)) == 1]
    if len(unit) != 1:
        return None
    col = unit[0]
    (row,) = set(indices) - {col}
    a, b = (op1, op2) if x1 == row else (op2, op1)
    m = _uniform(ast.affine(bounds[row], env), ints)
    n = _uniform(ast.affine(bounds[col], env), ints)
    if m is None or n is None:
        return None

    allowed = {acc, row, col} | _declared_names(ast, epilogue) | _declared_names(ast, prologue)
    if any(not _safe_epilogue(ast, st) for st in epilogue):
        return None
    if not set().union(*(ast.assigned(st) for st in epilogue)) <= allowed:
        return None
    seed_value = seed[1]
    users = [guard.condition, *epilogue] + ([seed_value] if seed_value is not None else [])
    needed = _needed(ast, prologue, users, acc)
    outside = {st.id for st in before}
    return Gemm(
        ast,
        indices[row],
        indices[col],
        m,
        n,
        k_extent,
        a,
        b,
        acc,
        guard,
        [st for st in before if st.id in needed],
        [st for st in prologue if st.id in needed and st.id not in outside],
        epilogue,
        ast.text(seed_value) if seed_value is not None else None,
    )


# ---- the accumulation loop ------------------------------------------------------------------


def _accumulation(ast: KernelAST, loop: Node) -> tuple[str, str, Node, list[Node]] | None:
    """`for (int k = 0; k < K; ++k) acc += a * b;` (or `acc = acc + a * b`, `acc = fmaf(a, b,
    acc)`, the factors loaded into locals first): the accumulator, k, the bound and the two
    factors' subscripts."""
    header = for_header(loop)
    if header is None:
        return None
    init, cond, update, body = header
    if init.type != "declaration" or not _integer_type(_type_text(ast, init)):
        return None
    declarators = init.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    k = _name(ast, declarators[0])
    start = declarators[0].child_by_field_name("value")
    if k is None or start is None or ast.affine(start) != {}:
        return None
    bound = _upper_bound(ast, unparen(cond), k)
    if bound is None or not _steps_by_one(ast, unparen(update), k):
        return None

    *loads, last = ast.statements(body)
    values: dict[str, Node] = {}
    for st in loads:
        if st.type != "declaration" or _type_text(ast, st).removeprefix("const ") != "float":
            return None
        for d in st.children_by_field_name("declarator"):
            value = d.child_by_field_name("value") if d.type == "init_declarator" else None
            if value is None:
                return None
            values[_name(ast, d)] = unparen(value)
    if last.type != "expression_statement" or not last.named_children:
        return None
    expr = unparen(last.named_children[0])
    if expr.type != "assignment_expression":
        return None
    target = unparen(expr.child_by_field_name("left"))
    if target.type != "identifier":
        return None
    acc = ast.text(target)
    factors = _product(ast, operator_of(expr), unparen(expr.child_by_field_name("right")), acc)
    if factors is None:
        return None
    named = [ast.text(f) for f in factors if f.type == "identifier"]
    if sorted(named) != sorted(values):
        return None
    subscripts = [values.get(ast.text(f), f) if f.type == "identifier" else f for f in factors]
    if any(s.type != "subscript_expression" for s in subscripts):
        return None
    if acc in ast.identifiers(subscripts[0]) | ast.identifiers(subscripts[1]):
        return None
    if ast.assigned(body) != {acc}:
        return None
    return acc, k, bound, subscripts


def _product(ast: KernelAST, op: str, right: Node, acc: str) -> list[Node] | None:
    """The two factors that `acc op right` adds to acc."""
    if op == "=" and right.type == "binary_expression" and operator_of(right) == "+":
        left, other = (unparen(right.child_by_field_name(f)) for f in ("left", "right"))
        if left.type == "identifier" and ast.text(left) == acc:
            right = other
        elif other.type == "identifier" and ast.text(other) == acc:
            right = left
        else:
            return None
    elif op == "=" and right.type == "call_expression":
        fn, args = right.child_by_field_name("function"), right.child_by_field_name("arguments")
        if fn is None or args is None or ast.text(fn) not in FMA_FUNCTIONS:
            return None
        parts = [unparen(a) for a in args.named_children]
        if len(parts) != 3 or parts[2].type != "identifier" or ast.text(parts[2]) != acc:
            return None
        return parts[:2]
    elif op != "+=":
        return None
    if right.type != "binary_expression" or operator_of(right) != "*":
        return None
    return [unparen(right.child_by_field_name(f)) for f in ("left", "right")]


def _upper_bound(ast: KernelAST, cond: Node, k: str) -> Node | None:
    if cond.type != "binary_expression":
        return None
    left, right = (unparen(cond.child_by_field_name(f)) for f in ("left", "right"))
    if operator_of(cond) == "<" and left.type == "identifier" and ast.text(left) == k:
        return right
    if operator_of(cond) == ">" and right.type == "identifier" and ast.text(right) == k:
        return left
    return None


def _steps_by_one(ast: KernelAST, update: Node, k: str) -> bool:
    """`++k`, `k++`, `k += 1` or `k = k + 1`."""
    if update.type == "update_expression":
        arg = unparen(update.child_by_field_name("argument"))
        return operator_of(update) == "++" and arg.type == "identifier" and ast.text(arg) == k
    if update.type != "assignment_expression":
        return False
    left = unparen(update.child_by_field_name("left"))
    if left.type != "identifier" or ast.text(left) != k:
        return False
    step = ast.affine(update.child_by_field_name("right"))
    return (operator_of(update), step) in (("+=", {(): 1}), ("=", {(k,): 1, (): 1}))


def _seed(ast: KernelAST, prologue: list[Node], acc: str) -> tuple[Node, Node | None] | None:
    """The prologue's `float acc = value;` and its value (None where it is 0): a value that
    changes nothing (no assignment, call with side effects or address taken), reads memory only
    through subscripts; None if acc is declared otherwise."""
    for st in prologue:
        declarators = st.children_by_field_name("declarator")
        if not any(_name(ast, d) == acc for d in declarators):
            continue
        if _zero_float(ast, [st], acc):
            return st, None
        if len(declarators) != 1 or _type_text(ast, st) != "float":
            return None
        value = declarators[0].child_by_field_name("value")
        if value is None or "__shared__" in ast.text(st) or "static" in _type_text(ast, st):
            return None
        if any(n.type in ("assignment_expression", "update_expression") for n in walk(value)):
            return None
        if ast.dereferences(value) or ast.pointer_escapes(value) or ast.calls(value):
            return None
        # it reads only memory the kernel never writes: the tiled kernel reads it later
        written = {a.pointer for a in ast.accesses() if a.write or a.atomic}
        if any(a.pointer in written for a in ast.accesses(value)):
            return None
        return st, value
    return None


def _zero_float(ast: KernelAST, prologue: list[Node], acc: str) -> bool:
    """Whether the prologue declares `float acc = 0` alone in its declaration."""
    for st in prologue:
        declarators = st.children_by_field_name("declarator")
        if not any(_name(ast, d) == acc for d in declarators):
            continue
        if len(declarators) != 1 or _type_text(ast, st) != "float":
            return False
        value = declarators[0].child_by_field_name("value")
        if value is None or unparen(value).type != "number_literal":
            return False
        try:
            return float(ast.text(unparen(value)).rstrip("fF")) == 0.0
        except ValueError:
            return False
    return False


# ---- index expressions ----------------------------------------------------------------------


def _index_form(
    ast: KernelAST, subscript: Node, decls: list[Node], env: dict[str, Affine]
) -> tuple[str, Affine] | None:
    """The parameter a subscript reads or writes and the affine form of the element's offset
    (through a local pointer `p = param + offset` that one of `decls` declares, if that is what it
    subscripts)."""
    base = unparen(subscript.child_by_field_name("argument"))
    args = subscript.child_by_field_name("indices")
    if base.type != "identifier" or args is None or len(args.named_children) != 1:
        return None
    name = ast.text(base)
    offset: Affine | None = {}
    if name not in ast.pointers:
        found = _alias(ast, decls, name)
        if found is None:
            return None
        name, node = found
        offset = {} if node is None else ast.affine(node, env)
    index = ast.affine(args.named_children[0], env)
    if offset is None or index is None:
        return None
    return name, add_affine(offset, index)


def _alias(ast: KernelAST, decls: list[Node], name: str) -> tuple[str, Node | None] | None:
    """`name` declared by one of `decls` as `param` or `param + offset`, and never changed: the
    parameter and the offset."""
    if name in ast.assigned(ast.body):
        return None
    for st in decls:
        for d in st.children_by_field_name("declarator"):
            if d.type != "init_declarator" or _name(ast, d) != name:
                continue
            value = unparen(d.child_by_field_name("value"))
            if value.type == "identifier" and ast.text(value) in ast.pointers:
                return ast.text(value), None
            if value.type == "binary_expression" and operator_of(value) == "+":
                left = unparen(value.child_by_field_name("left"))
                if left.type == "identifier" and ast.text(left) in ast.pointers:
                    return ast.text(left), value.child_by_field_name("right")
    return None


def _operand(
    found: tuple[str, Affine], k: str, indices: set[str], ints: set[str]
) -> tuple[str, Operand] | None:
    """The thread index a factor goes with, and its layout: `x * ld + k` or `k * ld + x`, plus a
    uniform offset, with ld and the offset made of integer parameters."""
    pointer, form = found
    parts = _split(form, {k, *indices})
    if parts is None:
        return None
    xs = [v for v in indices if v in parts]
    if len(xs) != 1 or k not in parts:
        return None
    if any(_uniform(part, ints) is None for part in parts.values()):
        return None
    x = xs[0]
    unit: Affine = {(): 1}
    if parts[k] == unit and _positive(parts[x]):
        return x, Operand(pointer, parts.get(None, {}), parts[x], True)
    if parts[x] == unit and _positive(parts[k]):
        return x, Operand(pointer, parts.get(None, {}), parts[k], False)
    return None


def _epilogue_target(
    ast: KernelAST, flat: list[Node], epilogue: list[Node], env: dict[str, Affine]
) -> tuple[str | None, Affine]:
    """The one pointer the epilogue writes, and the one element of it that it reads and writes
    (its offset's affine form: `row * ldc + col` or `col * ldc + row`, plus a uniform offset)."""
    accesses = [a for st in epilogue for a in ast.accesses(st)]
    pointers = {a.pointer for a in accesses}
    if len(pointers) != 1 or not any(a.write for a in accesses) or any(a.atomic for a in accesses):
        return None, {}
    forms = [_index_form(ast, a.node, flat, env) for a in accesses]
    if any(f is None or f != forms[0] for f in forms):
        return None, {}
    return forms[0][0], forms[0][1]


def _split(form: Affine, variables: set[str]) -> dict[str | None, Affine] | None:
    """`form` as sum over v of v * parts[v] plus parts[None], each part free of the variables; None
    if a monomial has two of them (or one twice)."""
    parts: dict[str | None, Affine] = {}
    for mono, coef in form.items():
        hits = [a for a in mono if a in variables]
        if len(hits) > 1:
            return None
        key = hits[0] if hits else None
        rest = list(mono)
        if key is not None:
            rest.remove(key)
        part = parts.setdefault(key, {})
        part[tuple(rest)] = part.get(tuple(rest), 0) + coef
    return {v: {m: c for m, c in p.items() if c} for v, p in parts.items() if any(p.values())}


def _uniform(form: Affine | None, ints: set[str]) -> Affine | None:
    """`form` if it is made of the kernel's (unmodified) integer parameters alone."""
    if form is None or any(a not in ints for mono in form for a in mono):
        return None
    return form


def _positive(form: Affine) -> bool:
    return bool(form) and all(c > 0 for c in form.values())


def render(form: Affine, wide: bool = False) -> str:
    """An affine form as C (and spec) text; `wide` computes each product in 64 bits."""
    terms = []
    for mono, coef in sorted(form.items(), key=lambda t: (-len(t[0]), t[0])):
        atoms = " * ".join(mono)
        if wide and mono:
            atoms = f"(long long){atoms}"
        if not mono:
            terms.append(str(coef))
        elif coef in (1, -1):
            terms.append(f"{'-' if coef < 0 else ''}{atoms}")
        else:
            terms.append(f"{coef} * {atoms}")
    return " + ".join(terms).replace("+ -", "- ") or "0"


def _affine_env(ast: KernelAST, prologue: list[Node], indices: set[str]) -> dict[str, Affine]:
    """Affine forms of the prologue's integer locals that nothing assigns later."""
    assigned = ast.assigned(ast.body)
    env: dict[str, Affine] = {}
    for st in prologue:
        for d in st.children_by_field_name("declarator"):
            if d.type != "init_declarator":
                continue
            target, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
            if target is None or target.type != "identifier" or value is None:
                continue
            name = ast.text(target)
            if name in assigned or name in indices:
                continue
            form = ast.affine(value, env)
            if form is not None:
                env[name] = form
    return env


def _bound_nodes(ast: KernelAST, guard: Guard) -> dict[str, Node] | None:
    """The nodes of the guard's bounds (`Guard.bounds` has their text)."""
    negated = guard.style == "return"
    joiner, want, flip = ("||", ">=", "<=") if negated else ("&&", "<", ">")
    out: dict[str, Node] = {}
    stack = [unparen(guard.condition)]
    while stack:
        n = stack.pop()
        if n.type != "binary_expression":
            return None
        left, right = (unparen(n.child_by_field_name(f)) for f in ("left", "right"))
        if operator_of(n) == joiner:
            stack += [right, left]
        elif operator_of(n) == want and left.type == "identifier":
            out[ast.text(left)] = right
        elif operator_of(n) == flip and right.type == "identifier":
            out[ast.text(right)] = left
        else:
            return None
    return out if set(out) == set(guard.bounds) else None


# ---- what the epilogue may do ---------------------------------------------------------------


def _pure_declaration(ast: KernelAST, st: Node) -> bool:
    """A declaration of scalars or local pointers that reads no memory and changes nothing."""
    if st.type != "declaration" or "__shared__" in ast.text(st) or "static" in _type_text(ast, st):
        return False
    if ast.accesses(st) or ast.dereferences(st) or ast.pointer_escapes(st):
        return False
    if any(n.type in ("assignment_expression", "update_expression") for n in walk(st)):
        return False
    for d in st.children_by_field_name("declarator"):
        target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
        if target is None or target.type not in ("identifier", "pointer_declarator"):
            return False
    return True


def _safe_epilogue(ast: KernelAST, st: Node) -> bool:
    """Code that runs once per output element from a lambda: no loops, exits or labels, no
    barriers, atomics or shared memory, no pointer but the output's element, no address taken."""
    if st.type not in ("declaration", "expression_statement", "if_statement", "compound_statement"):
        return False
    if any(n.type in UNSAFE for n in walk(st)) or "__shared__" in ast.text(st):
        return False
    if any(name in BARRIERS or name in ATOMIC_FUNCTIONS for name, _ in ast.calls(st)):
        return False
    if ast.dereferences(st) or ast.pointer_escapes(st):
        return False
    return not any(n.type == "pointer_expression" and operator_of(n) == "&" for n in walk(st))


def _needed(ast: KernelAST, prologue: list[Node], users: list[Node], acc: str) -> set[int]:
    """The prologue declarations (ids) that `users` read, directly or through one another."""
    names = set().union(*(ast.identifiers(u) for u in users))
    out: set[int] = set()
    for st in reversed(prologue):
        declared = {_name(ast, d) for d in st.children_by_field_name("declarator")}
        if acc not in declared and declared & names:
            out.add(st.id)
            names |= ast.identifiers(st)
    return out


def _declared_names(ast: KernelAST, stmts: list[Node]) -> set[str]:
    return {name for st in stmts for name in ast.local_declarations(st)}


def _integer_params(ast: KernelAST) -> set[str]:
    assigned = ast.assigned(ast.body)
    return {
        p.name
        for p in ast.kernel.params
        if not p.is_pointer and _integer_type(p.type_text) and p.name not in assigned
    }


def _integer_type(text: str) -> bool:
    dtype = lookup(text.removeprefix("const ").strip())
    return dtype is not None and dtype.kind in ("int", "uint")


def _type_text(ast: KernelAST, decl: Node) -> str:
    """A declaration's qualifiers and type: `const int`, `unsigned int`, `float`."""
    words = []
    for child in decl.children:
        if decl.field_name_for_child(decl.children.index(child)) == "declarator":
            break
        if child.is_named:
            words.append(ast.text(child))
    return " ".join(" ".join(words).split())


def _name(ast: KernelAST, declarator: Node) -> str | None:
    d = declarator
    while d is not None and d.type != "identifier":
        if d.type not in ("init_declarator", "pointer_declarator"):
            return None
        d = d.child_by_field_name("declarator")
    return ast.text(d) if d is not None else None


# ---- the new kernel -------------------------------------------------------------------------


def definition(g: Gemm, c: Config, stream_k: int = 0, split: int = 0) -> str:
    """The kernel with its body replaced by the tiled GEMM (the epilogue, as written, in a lambda
    run for each output element) and `__launch_bounds__` for the config's block; `stream_k` > 0:
    stream-K over that many blocks (a 1-D grid, `stream_k_grid`). The lambda
    captures by value, as the template's out-of-line fallback takes it (by reference, the
    kernel's parameters would go to the stack); that loses nothing: the epilogue assigns only
    its own locals and writes memory through the pointers' copies (`match`). `split` > 1: K split
    over a cluster of that many blocks along z (`Tiling::run_split`; the grid's z is `split`)."""
    ast = g.ast
    unit = _indent_unit(ast)
    taken = ast.identifiers(ast.fn)
    tile, smem = _fresh("Tile", taken), _fresh("smem", taken)
    flags = f"{str(g.a.k_contiguous).lower()}, {str(g.b.k_contiguous).lower()}"
    total = _fresh(f"{g.acc}_sum", taken) if g.seed is not None else g.acc
    params = (
        f"{_index_type(ast, g.row)} {g.row.var}, {_index_type(ast, g.col)} {g.col.var}, "
        f"float {total}"
    )
    args = ", ".join(
        [
            smem,
            g.a.base,
            render(g.a.ld),
            g.b.base,
            render(g.b.ld),
            render(g.m),
            render(g.n),
            render(g.k),
        ]
    )
    inner = unit * 2
    targs = f"{c.bm}, {c.bn}, {c.bk}, {c.rm}, {c.rn}, {c.stages}, {flags}, {c.reg_vecs}"
    streamed = []
    if stream_k:
        targs += f", {stream_k}"
        mib = 2 * stream_k * c.bm * c.bn * 4 / 2**20
        streamed = [
            f"{unit}// The last wave's tiles shared out along K by {stream_k} blocks (stream-K); "
            "their partial sums",
            f"{unit}// go through a static workspace of {mib:.0f} MiB: launches of this kernel "
            "must not overlap.",
        ]
    lines = [
        "{",
        f"{unit}// {c.bm} x {c.bn} tiles of C in K steps of {c.bk}, {c.tm} x {c.tn} outputs per "
        "thread;",
        f"{unit}// tile rows from {_layout(g.a, 'row')}, columns from {_layout(g.b, 'column')}.",
        *streamed,
        *(
            [
                f"{unit}// K split over a cluster of {split} blocks, summed in distributed shared memory."
            ]
            if split
            else []
        ),
        f"{unit}using {tile} = optiml_sgemm::Tiling<{targs}>;",
        f"{unit}__shared__ float4 {smem}[{tile}::{'SPLIT_VECS' if split else 'SMEM_VECS'}];",
        f"{unit}{tile}::{f'run_split<{split}>' if split else 'run'}({args}, [=]({params}) {{",
    ]
    lines += [_reindent(ast, st, inner) for st in g.before]
    if g.guard.style == "return":
        lines.append(_reindent(ast, g.guard.node, inner))
        body, close = inner, []
    else:
        lines.append(f"{inner}if ({ast.text(g.guard.condition)}) {{")
        body, close = inner + unit, [f"{inner}}}"]
    lines += [_reindent(ast, st, body) for st in g.kept]
    if g.seed is not None:
        lines.append(f"{body}float {g.acc} = ({g.seed}) + {total};")
    lines += [_reindent(ast, st, body) for st in g.epilogue]
    lines += close
    lines += [f"{unit}}});", "}"]
    replace = {(ast.body.start_byte, ast.body.end_byte): "\n".join(lines)}
    bounds = f"__launch_bounds__({c.threads}, {c.min_blocks})"
    if split:  # the attribute `__cluster_dims__` stands for, which the grammar reads here
        bounds = f"__attribute__((cluster_dims(1, 1, {split}))) {bounds}"
    existing = next((n for n in ast.fn.children if n.type == "launch_bounds"), None)
    if existing is not None:
        replace[(existing.start_byte, existing.end_byte)] = bounds
    else:
        declarator = ast.fn.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        if declarator is None:
            raise ValueError("a kernel without a function declarator")
        replace[(declarator.start_byte, declarator.start_byte)] = f"{bounds} "
    return ast.definition(replace)


# Split-K (`Tiling::run_split`): a cluster of S blocks per tile of C shares its K, where C has fewer
# tiles than the GPU has SMs; each block's share of K is at least MIN_SPLIT_TILES K tiles.
SPLITS = (2, 4, 8)  # portable cluster sizes
MIN_SPLIT_TILES = 16
STATIC_SHARED = 48 * 1024
MAX_GRID_Z = 65535


def split_count(
    c: Config,
    main: tuple[int, int],
    k: int,
    batches: int,
    sm_count: int,
    k_contiguous: tuple[bool, bool],
) -> tuple[int, bool] | None:
    """The cluster size that splits K for config `c` at the main problem size ((M, N), K and the
    batch count): the smallest that brings the tiles to the SMs' count, else the largest that
    fits; and whether the tiles without it fill at most half the SMs. None where C's tiles fill
    the SMs already, K is too short, or the partial tile does not fit static shared memory."""
    tiles = -(-main[0] // c.bm) * -(-main[1] // c.bn) * batches
    if tiles >= sm_count or 4 * max(c.bm * c.bn, c.smem_bytes(*k_contiguous) // 4) > STATIC_SHARED:
        return None
    fitting = [
        s
        for s in SPLITS
        if c.bm % s == 0 and k >= s * MIN_SPLIT_TILES * c.bk and batches * s <= MAX_GRID_Z
    ]
    if not fitting:
        return None
    enough = [s for s in fitting if tiles * s >= sm_count]
    return (enough[0] if enough else fitting[-1]), 2 * tiles <= sm_count


def stream_k_grid(tiles: str, blocks: int) -> str:
    """The 1-D grid of a stream-K kernel over `blocks` blocks for `tiles` tiles of C (a spec
    expression): the tiles, fewer the last wave's where that wave is not whole
    (`Tiling::schedule`)."""
    return f"{tiles} - {tiles} % {blocks} * min(1, {tiles} / {blocks})"


def _layout(op: Operand, index: str) -> str:
    """`A (k contiguous, ld = K)`: where an operand comes from, for the kernel's comment."""
    unit = "k" if op.k_contiguous else f"{index} index"
    return f"{op.pointer} ({unit} contiguous, ld = {render(op.ld)})"


def _index_type(ast: KernelAST, index: ThreadIndex) -> str:
    """The index's declared type, for the lambda's parameter; `auto` is what it deduced."""
    text = _type_text(ast, index.decl)
    return " ".join("unsigned int" if w == "auto" else w for w in text.split())


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _indent_unit(ast: KernelAST) -> str:
    stmts = ast.statements()
    return (ast.indent_of(stmts[0]) if stmts else "") or "    "


def _reindent(ast: KernelAST, st: Node, indent: str) -> str:
    """A statement's text at `indent`, its inner lines kept where they were relative to it."""
    column = st.start_point[1]
    lines = ast.text(st).split("\n")
    out = [indent + lines[0]]
    for line in lines[1:]:
        lead = len(line) - len(line.lstrip(" "))
        out.append(indent + line[min(lead, column) :] if line.strip() else "")
    return "\n".join(out)
