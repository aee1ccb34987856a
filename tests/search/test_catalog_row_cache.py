"""`row_cache`: a thread's row read by several loops is kept in registers by the first, from the
lifted model. On OptiML-G's RMSNorm over the channels of an NCHW tensor (KernelBench 36's form)
and on hand-written norms (a strided row, 16-bit inputs, a guarded read, three loops) it proposes
one variant that computes what the original does where the row fits the registers and where it
does not (host C++ at several sizes); its registers are registers (no stack for sm_90); kernels
with nothing read twice, or rows too long for registers, get none."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
CACHE = by_name("row_cache")

# RMSNorm over the channels: rms[b, p] from F elements F apart... a stride of P apart.
CHANNELS = (
    "float x[B, F, P]\nB = 8; F = 48; P = 300\neps = 1e-05\nfor b < B, f < F, p < P\n"
    "rms[b, p] = sqrt((mean(f) x[b, f, p] ** 2) + eps)\n"
    "out[b, f, p] = x[b, f, p] / rms[b, p]"
)

# A layer norm over a strided row of half values, written by hand: three loops read the row, one
# of them also reads `w` only where x is positive (a guarded read, never kept).
STRIDED = """
#include <cuda_fp16.h>
/* @optiml
 *   args:   x: in half[N * C * S], w: in float[N * C * S], y: out float[N * C * S]
 *   launch: grid = cdiv(N * S, 128), block = 128
 *   sizes:  N, C, S = (16, 24, 4096), (3, 7, 50), (2, 70, 33)
 *   tol:    rtol = 1e-3, atol = 1e-4
 */
__global__ void norm_channels(const __half* x, const float* w, float* y, int N, int C, int S)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * S) return;
    int n = t / S, s = t % S;
    float sum = 0.f;
    for (int c = 0; c < C; ++c) sum += __half2float(x[(n * C + c) * S + s]);
    float mean = sum / C, sq = 0.f;
    for (int c = 0; c < C; ++c) {
        float d = __half2float(x[(n * C + c) * S + s]) - mean;
        sq += d * d;
    }
    float inv = rsqrtf(sq / C + 1e-5f);
    for (int c = 0; c < C; ++c) {
        float v = __half2float(x[(n * C + c) * S + s]);
        y[(n * C + c) * S + s] = (v - mean) * inv + (v > 0.f ? w[(n * C + c) * S + s] : 0.f);
    }
}
"""

NONE = [
    ("saxpy.cu", "saxpy"),
    ("sgemm.cu", "sgemm_naive"),
    ("transpose.cu", "transpose_naive"),
    ("softmax.cu", "softmax_rows"),  # rows of thousands: not for registers
]


def generated(tmp_path: Path) -> Context:
    from optiml.generate import generate

    g = generate(CHANNELS, "rms_channels", ref_file="rms_channels_ref.py")
    path = tmp_path / "rms_channels.cu"
    path.write_text(g.kernel)
    (tmp_path / "rms_channels_ref.py").write_text(g.reference)
    return Context.of(Variant(g.kernel), str(path), "rms_channels")


def tails(text: str) -> str:
    """The loops over a row's elements past the registers, together."""
    return "".join(re.findall(r"for \(long long optiml_t\d+ = .*?\n    \}\n", text, re.S))


def strided() -> Context:
    return Context.of(Variant(STRIDED), str(ROOT / "kernel.cu"), "norm_channels")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_generated_rmsnorm_over_channels_keeps_its_row_and_computes_the_same(tmp_path):
    ctx = generated(tmp_path)
    (p,) = CACHE.propose(ctx)
    assert p.params == {"cache": 64, "keys": 1}
    text = p.variant.text
    assert "float optiml_r0[64];" in text
    # the second loop reads the register, not x; past 64 channels it goes on from memory
    second = text.split("optiml_k1 = 0; optiml_k1 < 64")[1].split("optiml_t1 = 64;")[0]
    assert "optiml_r0[optiml_k1]" in second and "x[" not in second
    assert "for (long long optiml_t1 = 64; optiml_t1 < F; ++optiml_t1) {" in text
    assert "x[" in tails(text)
    # the row is read by a loop of loads alone, each at a base plus the counter times a stride
    # computed once (no division by a size in 64 unrolled iterations), all in flight together;
    # the scale (1 / rms) is computed once too, before the writes
    fill = text.split("optiml_k = 0; optiml_k < 64; ++optiml_k) {")[1].split("float acc")[0]
    assert (
        "optiml_r0[optiml_k] = x[(optiml_at_r0 + (((long long)(optiml_k)) * optiml_step_r0))]"
        in fill
    )
    assert "acc" not in fill and "/" not in fill
    assert "sqrtf" not in second and "/ " not in second.replace("optiml_r0[optiml_k1] / ", "")
    candidate = Context.of(p.variant, ctx.source.path, "rms_channels")
    # rows that fit the registers (48, 19) and one that does not (80: 16 from memory)
    sizes = [{"B": 3, "F": 48, "P": 37}, {"B": 2, "F": 19, "P": 5}, {"B": 2, "F": 80, "P": 9}]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_strided_half_row_read_by_three_loops_is_read_once(tmp_path):
    ctx = strided()
    (p,) = CACHE.propose(ctx)
    assert p.params == {"cache": 32, "keys": 1}  # C = 24: 32 registers
    text = p.variant.text
    assert "float optiml_r0[32];  // `x` along the row" in text
    # read once by the fill; the loops past 32 channels read it as the kernel does (5 times)
    assert text.count("__half2float(x[") == 6 and tails(text).count("__half2float(x[") == 5
    # `w`, read only where x > 0, is read where it was, never kept or read ahead
    assert "optiml_r1" not in text and "? w[" in text
    candidate = Context.of(p.variant, ctx.source.path, "norm_channels")
    sizes = [{"N": 3, "C": 7, "S": 50}, {"N": 2, "C": 32, "S": 3}, {"N": 2, "C": 70, "S": 33}]
    assert run_against(ctx, [candidate], sizes, tmp_path) == [0]


@pytest.mark.parametrize("file,kernel", NONE, ids=[k for _, k in NONE])
def test_kernels_with_nothing_to_keep_get_none(file, kernel):
    path = ROOT / file
    assert CACHE.propose(Context.of(Variant(path.read_text()), str(path), kernel)) == []


def test_a_row_longer_than_the_registers_gets_none():
    longer = STRIDED.replace("(16, 24, 4096)", "(16, 96, 4096)")
    assert (
        CACHE.propose(Context.of(Variant(longer), str(ROOT / "kernel.cu"), "norm_channels")) == []
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_kept_row_is_in_registers_for_sm90(tmp_path):
    for ctx in (generated(tmp_path), strided()):
        (p,) = CACHE.propose(ctx)
        v = SourceFile(p.variant.text, ctx.source.path)
        k = v.kernel(ctx.kernel.name)
        b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
        assert b.ok, b.log[-2000:]
        r = b.resources
        assert (r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes) == (0, 0, 0), r
