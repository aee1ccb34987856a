"""A tensor-core GEMM for 16-bit operands (half or bf16) with fp32 accumulation: `HELPERS` holds
`optiml_hgemm::Mma`, a block tile of BM x BN in K steps of BK over WARPS_M x WARPS_N warps, each
warp a grid of m16n8k16 `mma.sync` tiles fed by `ldmatrix` (`.trans` for an operand whose M or N
index is the contiguous one) from padded shared memory, filled by a STAGES-deep ring of 16-byte
`cp.async` copies (element copies with zeros past the edges where 16-byte vectors do not apply:
any M, N, K, leading dimension and alignment is correct). `Config` is one choice of its
parameters."""

from __future__ import annotations

from dataclasses import dataclass

HELPERS = r"""#ifndef OPTIML_HGEMM_MMA
#define OPTIML_HGEMM_MMA
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// 16-bit GEMM on the tensor cores: mma.sync.aligned.m16n8k16 with fp32 accumulators, operands
// staged in shared memory by cp.async (STAGES tiles in flight) and read by ldmatrix. Elements are
// moved as raw 16-bit words; only the mma instruction knows whether they are half or bf16.
extern "C++" {
namespace optiml_hgemm {

__device__ __forceinline__ unsigned smem_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes, or (valid false) none read and 16 zero bytes written.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// Four 8 x 8 matrices of 16-bit words; lane l gives the address of row l % 8 of matrix l / 8.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix4(unsigned (&r)[4], const unsigned short* p) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_address(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_address(p)));
}

template <class T>
struct is_bf16 {
    static constexpr bool value = false;
};
template <>
struct is_bf16<__nv_bfloat16> {
    static constexpr bool value = true;
};

// c += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
    if constexpr (is_bf16<T>::value)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One operand's tile of BX (M or N) by BK in shared memory, laid out as in global memory: rows of
// BK along k (K_CONTIGUOUS) or rows of BX along x, each row padded by 8 words (16 bytes) so that
// the 8 rows an ldmatrix reads fall in different banks.
template <int BX, int BK, int THREADS, bool K_CONTIGUOUS>
struct Operand {
    static constexpr int ROWS = K_CONTIGUOUS ? BX : BK, COLS = K_CONTIGUOUS ? BK : BX;
    static constexpr int LD = COLS + 8;
    static constexpr int STAGE = ROWS * LD;  // 16-bit words
    static constexpr int CHUNKS = ROWS * COLS / 8;
    static_assert(COLS % 8 == 0 && CHUNKS % THREADS == 0, "the tile is not shared evenly");

    // The tile at (x0, k0): element (x, k) at base[x * ld + k] (K_CONTIGUOUS) or base[k * ld + x],
    // zeros outside extent x K. `vec`: every 8 words along a row are one aligned 16-byte vector,
    // wholly inside or outside the matrix.
    __device__ __forceinline__ static void load(unsigned short* stage, const unsigned short* base,
                                                long long ld, int extent, int K, int x0, int k0,
                                                bool vec) {
        const int rows = K_CONTIGUOUS ? extent : K, cols = K_CONTIGUOUS ? K : extent;
        const int r0 = K_CONTIGUOUS ? x0 : k0, c0 = K_CONTIGUOUS ? k0 : x0;
#pragma unroll
        for (int i = 0; i < CHUNKS / THREADS; ++i) {
            const int chunk = threadIdx.x + i * THREADS;
            const int r = chunk / (COLS / 8), c = chunk % (COLS / 8) * 8;
            unsigned short* d = stage + r * LD + c;
            const unsigned short* s = base + (long long)(r0 + r) * ld + (c0 + c);
            const bool row_in = r0 + r < rows;
            if (vec) {
                copy16(d, s, row_in && c0 + c < cols);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) d[j] = row_in && c0 + c + j < cols ? s[j] : 0;
            }
        }
    }

    __device__ __forceinline__ static bool vectorizable(const void* base, long long ld,
                                                        int extent, int K) {
        return ld % 8 == 0 && (K_CONTIGUOUS ? K : extent) % 8 == 0 &&
               reinterpret_cast<unsigned long long>(base) % 16 == 0;
    }
};

// C tile (blockIdx.y, blockIdx.x) = A (M x K) * B (K x N); epilogue(row, col, acc) for each of
// the block's elements, bounds left to it.
template <class T, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES,
          bool A_K_CONTIGUOUS, bool B_K_CONTIGUOUS>
struct Mma {
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // a warp's tile
    static constexpr int MI = WM / 16, NI = WN / 8;             // its mma tiles
    static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "warp tiles of m16n8k16");
    static_assert(STAGES >= 2, "a tile is copied while another is multiplied");
    using A = Operand<BM, BK, THREADS, A_K_CONTIGUOUS>;
    using B = Operand<BN, BK, THREADS, B_K_CONTIGUOUS>;
    static constexpr int STAGE = A::STAGE + B::STAGE;
    static constexpr int SMEM_BYTES = 2 * STAGES * STAGE;

    template <class Epilogue>
    __device__ __forceinline__ static void run(void* smem, const void* a_, long long lda,
                                               const void* b_, long long ldb, int M, int N, int K,
                                               Epilogue epilogue) {
        unsigned short* s = static_cast<unsigned short*>(smem);
        const unsigned short* a = static_cast<const unsigned short*>(a_);
        const unsigned short* b = static_cast<const unsigned short*>(b_);
        const bool vec = A::vectorizable(a, lda, M, K) && B::vectorizable(b, ldb, N, K);
        const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int wm = warp / WARPS_N * WM, wn = warp % WARPS_N * WN;
        const int tiles = (K + BK - 1) / BK;
        float acc[MI][NI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

#pragma unroll
        for (int t = 0; t < STAGES - 1; ++t) {
            if (t < tiles) {
                A::load(s + t * STAGE, a, lda, M, K, m0, t * BK, vec);
                B::load(s + t * STAGE + A::STAGE, b, ldb, N, K, n0, t * BK, vec);
            }
            commit();
        }
        for (int t = 0; t < tiles; ++t) {
            wait<STAGES - 2>();
            __syncthreads();  // tile t is in; every warp is done with tile t - 1's stage
            const int next = t + STAGES - 1;
            if (next < tiles) {
                unsigned short* stage = s + next % STAGES * STAGE;
                A::load(stage, a, lda, M, K, m0, next * BK, vec);
                B::load(stage + A::STAGE, b, ldb, N, K, n0, next * BK, vec);
            }
            commit();
            const unsigned short* sa = s + t % STAGES * STAGE;
            const unsigned short* sb = sa + A::STAGE;
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                unsigned fa[MI][4], fb[NI][2];
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    const int m = wm + i * 16;
                    if (A_K_CONTIGUOUS)
                        ldmatrix4<false>(fa[i], sa + (m + lane % 16) * A::LD + kk + lane / 16 * 8);
                    else
                        ldmatrix4<true>(fa[i], sa + (kk + lane % 8 + lane / 16 * 8) * A::LD + m +
                                                   lane / 8 % 2 * 8);
                }
#pragma unroll
                for (int j = 0; j < NI; j += 2) {
                    const int n = wn + j * 8;
                    unsigned r[4];
                    if (B_K_CONTIGUOUS)
                        ldmatrix4<false>(r, sb + (n + lane % 8 + lane / 16 * 8) * B::LD + kk +
                                                lane / 8 % 2 * 8);
                    else
                        ldmatrix4<true>(r, sb + (kk + lane % 8 + lane / 8 % 2 * 8) * B::LD + n +
                                               lane / 16 * 8);
                    fb[j][0] = r[0], fb[j][1] = r[1], fb[j + 1][0] = r[2], fb[j + 1][1] = r[3];
                }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma<T>(acc[i][j], fa[i], fb[j][0], fb[j][1]);
            }
        }
        wait<0>();
        // c0, c1 at (lane / 4, 2 * (lane % 4) + 0, 1) of each m16n8 tile; c2, c3 eight rows down.
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const int row = m0 + wm + i * 16 + lane / 4, col = n0 + wn + j * 8 + lane % 4 * 2;
                epilogue(row, col, acc[i][j][0]);
                epilogue(row, col + 1, acc[i][j][1]);
                epilogue(row + 8, col, acc[i][j][2]);
                epilogue(row + 8, col + 1, acc[i][j][3]);
            }
    }
};

}  // namespace optiml_hgemm
}
#endif
"""


@dataclass(frozen=True)
class Config:
    """Mma's parameters: a BM x BN block tile in K steps of BK, WARPS_M x WARPS_N warps, STAGES
    tiles in flight."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def smem_bytes(self, a_k_contiguous: bool, b_k_contiguous: bool) -> int:
        """Mma::SMEM_BYTES."""

        def stage(bx: int, k_contiguous: bool) -> int:
            return bx * (self.bk + 8) if k_contiguous else self.bk * (bx + 8)

        return 2 * self.stages * (stage(self.bm, a_k_contiguous) + stage(self.bn, b_k_contiguous))

    @property
    def params(self) -> dict[str, int]:
        return {
            "bm": self.bm,
            "bn": self.bn,
            "bk": self.bk,
            "warps": self.warps_m * self.warps_n,
            "threads": self.threads,
            "stages": self.stages,
        }


# 8 warps of 64 x 32 (128 x 128) or 64 x 64 (128 x 256), K steps of 32, 3 or 4 stages: the shapes
# CUTLASS's sm80 16-bit GEMMs use; not yet measured here, so ranked by the tile's reuse (bigger
# first) and then by depth.
CONFIGS = [
    (Config(128, 256, 32, 2, 4, 3), 1.0),
    (Config(128, 128, 32, 2, 4, 4), 0.95),
    (Config(128, 128, 32, 2, 4, 3), 0.9),
]
# Problems with fewer 128 x 128 tiles than SMs: 64 x 64 tiles of 4 warps.
SMALL = [(Config(64, 64, 32, 2, 2, 3), 0.5)]
