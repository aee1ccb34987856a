"""stride_taps: transposed convolutions with a stride, written three ways (the generated formula's
guarded term, a hand-written `continue` on a local, a literal stride under an `if`), step their tap
loops by the stride and compute exactly what the originals do (host C++); loops where a skipped
iteration would have done something, or whose test is not one a step can follow, are left."""

from __future__ import annotations

import shutil

import pytest

from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from tests.host_cuda import run_against
from tests.support import FIXTURES

STRIDE_TAPS = by_name("stride_taps")

KERNELS = {
    # as `optiml generate` writes a 2-D transposed convolution (stride 2, padding 1): every guard
    # on the term, the taps' loops outermost
    "generated": """
/* @optiml
 *   args:   x: in float[B * C * H * W], w: in float[C * K * KH * KW], out: out float[B * K * OH * OW], H = 9, W = 11
 *   launch: grid = cdiv(B * K * OH * OW, 128), block = 128
 *   sizes:  B, C, K, KH, KW, OH, OW = (2, 3, 4, 3, 4, 18, 22), (1, 2, 3, 3, 3, 17, 21)
 */
__global__ void generated(const float* x, const float* w, float* out, int B, int C, int H, int W,
                          int K, int KH, int KW, int OH, int OW)
{
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)B * K * OH * OW) return;
    long long rest = idx;
    const int ow = (int)(rest % OW); rest /= OW;
    const int oh = (int)(rest % OH); rest /= OH;
    const int k = (int)(rest % K);
    const int b = (int)(rest / K);
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        for (int kw = 0; kw < KW; ++kw) {
            for (int c = 0; c < C; ++c) {
                acc += (((oh + 1 - kh) % 2 == 0 && ((oh + 1 - kh) / 2) >= 0 && ((oh + 1 - kh) / 2) < H
                         && (ow + 1 - kw) % 2 == 0 && ((ow + 1 - kw) / 2) >= 0 && ((ow + 1 - kw) / 2) < W)
                        ? x[(((long long)b * C + c) * H + (oh + 1 - kh) / 2) * W + (ow + 1 - kw) / 2]
                        : 0.0f) * w[((c * K + k) * KH + kh) * KW + kw];
            }
        }
    }
    out[idx] = acc;
}
""",
    # by hand: a 2-D launch, the stride a parameter, `continue` on a local, the channel loop
    # outermost
    "by_hand": """
/* @optiml
 *   args:   x: in float[N * C * H * W], w: in float[C * F * R * R], y: out float[N * F * OH * OW], stride = 3, pad = 2
 *   launch: grid = (cdiv(OW, 16), cdiv(OH, 16), N * F), block = (16, 16)
 *   sizes:  N, C, F, H, W, R, OH, OW = (2, 3, 2, 7, 6, 5, 21, 18), (1, 2, 3, 5, 4, 4, 13, 11)
 */
__global__ void by_hand(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                        int N, int C, int F, int H, int W, int R, int OH, int OW, int stride, int pad)
{
    int ox = blockIdx.x * blockDim.x + threadIdx.x;
    int oy = blockIdx.y * blockDim.y + threadIdx.y;
    int n = blockIdx.z / F, f = blockIdx.z % F;
    if (ox >= OW || oy >= OH) return;
    float sum = 0.f;
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < R; r++) {
            int ty = oy + pad - r;
            if (ty < 0 || ty % stride != 0) continue;
            int iy = ty / stride;
            if (iy >= H) continue;
            for (int s = 0; s < R; s++) {
                int tx = ox + pad - s;
                if (tx < 0 || tx % stride) continue;
                int ix = tx / stride;
                if (ix < W)
                    sum += x[((n * C + c) * H + iy) * W + ix] * w[((c * F + f) * R + r) * R + s];
            }
        }
    }
    y[((n * F + f) * OH + oy) * OW + ox] = sum;
}
""",
    # 1-D, a literal stride of 3 under an `if`, the tap counted from 1 and the test's sign flipped
    "one_d": """
/* @optiml
 *   args:   x: in float[C * L], w: in float[C * K], y: out float[OL]
 *   launch: grid = cdiv(OL, 64), block = 64
 *   sizes:  C, L, K, OL = (3, 20, 7, 64), (2, 9, 5, 30)
 */
__global__ void one_d(const float* x, const float* w, float* y, int C, int L, int K, int OL)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < OL) {
        float acc = 0.0f;
        for (int c = 0; c < C; ++c) {
            for (int j = 1; j <= K; j++) {
                if ((j - o - 2) % 3 == 0 && (o + 2 - j) / 3 >= 0 && (o + 2 - j) / 3 < L) {
                    acc += x[c * L + (o + 2 - j) / 3] * w[c * K + j - 1];
                }
            }
        }
        y[o] = acc;
    }
}
""",
    # dilated: rows stride 2 dilation 2 (a row either has every tap or none), columns stride 4
    # dilation 2 (every other tap), the tests in the loops' own `if`s
    "dilated": """
/* @optiml
 *   args:   x: in float[H * W], w: in float[KH * KW], y: out float[OH * OW]
 *   launch: grid = (cdiv(OW, 32), OH), block = 32
 *   sizes:  H, W, KH, KW, OH, OW = (6, 5, 3, 4, 15, 23), (4, 3, 2, 5, 9, 14)
 */
__global__ void dilated(const float* x, const float* w, float* y, int H, int W, int KH, int KW,
                        int OH, int OW)
{
    int ow = blockIdx.x * blockDim.x + threadIdx.x, oh = blockIdx.y;
    if (ow >= OW) return;
    float acc = 0.0f;
    for (int kh = 0; kh < KH; ++kh) {
        if ((oh + 1 - 2 * kh) % 2 == 0 && (oh + 1 - 2 * kh) / 2 >= 0 && (oh + 1 - 2 * kh) / 2 < H) {
            for (int kw = 0; kw < KW; ++kw) {
                if ((ow + 3 - 2 * kw) % 4 == 0 && (ow + 3 - 2 * kw) / 4 >= 0 && (ow + 3 - 2 * kw) / 4 < W)
                    acc += x[(oh + 1 - 2 * kh) / 2 * W + (ow + 3 - 2 * kw) / 4] * w[kh * KW + kw];
            }
        }
    }
    y[oh * OW + ow] = acc;
}
""",
}

SIZES = {
    "generated": [(2, 3, 4, 3, 4, 18, 22), (1, 2, 3, 3, 3, 17, 21)],
    "by_hand": [(2, 3, 2, 7, 6, 5, 21, 18), (1, 2, 3, 5, 4, 4, 13, 11)],
    "one_d": [(3, 20, 7, 64), (2, 9, 5, 30)],
    "dilated": [(6, 5, 3, 4, 15, 23), (4, 3, 2, 5, 9, 14)],
}

STEPPED = {
    "generated": ["kh", "kw"],
    "by_hand": ["r", "s"],
    "one_d": ["j"],
    "dilated": ["kh", "kw"],
}
# the step each loop takes
STEPS = {
    "generated": ["2", "2"],
    "by_hand": ["(stride > 0 ? stride : 1)"] * 2,
    "one_d": ["3"],
    "dilated": [None, "2"],  # rows: every tap or none
}


def context(name: str, text: str | None = None) -> Context:
    return Context.of(Variant(text or KERNELS[name]), str(FIXTURES / "kernel.cu"), name)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_tap_loops_step_by_the_stride_and_compute_exactly_the_same(name, tmp_path):
    ctx = context(name)
    (proposal,) = STRIDE_TAPS.propose(ctx)
    assert proposal.params["loops"] == len(STEPPED[name])
    for v in STEPPED[name]:
        assert f"{v} by" in proposal.summary or f"{v} only where a tap passes" in proposal.summary
    text = proposal.variant.text
    for v, step in zip(STEPPED[name], STEPS[name], strict=True):
        assert (f"{v} += {step}" in text) if step else (f"++{v}" in text)
    cand = Context.of(proposal.variant, ctx.source.path, name)
    cases = [dict(zip(ctx.spec.size_vars, s, strict=True)) for s in SIZES[name]]
    # bit for bit: the skipped terms were exact zeros
    assert run_against(ctx, [cand], cases, tmp_path, exact=True) == [0]
    # and the check can fail: a step one past the right start misses every tap
    broken = Context.of(
        Variant(text.replace(f"{STEPPED[name][0]} = ", f"{STEPPED[name][0]} = 1 + ", 1)),
        ctx.source.path,
        name,
    )
    assert run_against(ctx, [broken], cases, tmp_path, exact=True)[0] > 0


@pytest.mark.parametrize(
    "name,old,new",
    [
        # a term added whether or not the test holds: a skipped iteration would have added it
        ("one_d", "% 3 == 0 &&", "% 3 == 0 ||"),
        (
            "one_d",
            "if ((j - o - 2) % 3 == 0 &&",
            "acc += w[j - 1];\n                if ((j - o - 2) % 3 == 0 &&",
        ),
        # the loop does not count by one, or its bound is `!=`
        ("one_d", "j <= K; j++", "j <= K; j += 2"),
        ("one_d", "j <= K; j++", "j != K + 1; j++"),
        # a coefficient the loop's tree does not give as a number
        ("one_d", "(j - o - 2) % 3", "(L * j - o - 2) % 3"),
        # the test reads what the loop changes
        ("one_d", "(j - o - 2) % 3", "(j * j - o - 2) % 3"),
        # a break: the loop ends where a skipped iteration would have ended it
        (
            "one_d",
            "if ((j - o - 2) % 3 == 0 &&",
            "if (j == 4) break;\n                if ((j - o - 2) % 3 == 0 &&",
        ),
        ("by_hand", "int tx = ox", "if (s > W) break;\n                int tx = ox"),
    ],
    ids=[
        "or",
        "effect-before",
        "step-2",
        "not-equal",
        "coefficient-L",
        "quadratic",
        "break",
        "break-in-loop",
    ],
)
def test_left_alone(name, old, new):
    text = KERNELS[name].replace(old, new)
    assert text != KERNELS[name]
    proposals = STRIDE_TAPS.propose(context(name, text))
    loops = STEPPED[name]
    if name == "by_hand":
        # only the loop whose body ends early is left; the other still steps
        (p,) = proposals
        assert "r by" in p.summary and "s by" not in p.summary
    else:
        assert proposals == [] or all(f"{v} by" not in p.summary for p in proposals for v in loops)


def test_a_kernel_with_no_stride_is_left_alone():
    path = FIXTURES / "saxpy.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "saxpy")
    assert STRIDE_TAPS.propose(ctx) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_generated_strided_dilated_grouped_transposed_convolution_steps_exactly(tmp_path):
    """fixtures/kb_extra's task 75 as `optiml generate --from-torch` writes it: rows at stride 2
    under a dilation of 2 (every tap or none), columns at stride 3; at the spec's second size the
    stepped kernel computes bit for bit what the generated one does."""
    from optiml.generate import generate
    from optiml.generate.from_torch import translate

    task = next((FIXTURES / "kb_extra").glob("75_*.py"))
    t = translate(task.read_text(), str(task))
    g = generate(t.formula, t.name, ref_file=f"{t.name}_ref.py")
    path = tmp_path / f"{t.name}.cu"
    path.write_text(g.kernel)
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    ctx = Context.of(Variant(g.kernel), str(path), t.name)
    (proposal,) = STRIDE_TAPS.propose(ctx)
    assert "only where a tap passes" in proposal.summary and "by 3" in proposal.summary
    cand = Context.of(proposal.variant, str(path), t.name)
    assert run_against(ctx, [cand], [dict(ctx.spec.sizes[1])], tmp_path, exact=True) == [0]
