"""Lifting, as a user of `optiml lift` sees it: kernels written the way people write them (none of
them a fixture) lift to a model whose float64 run on the host equals an independent NumPy
computation, and fall in the family of what they compute; what cannot be lifted says where
and why."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optiml.cuda.kernel_ast import walk
from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, Unlifted, lift, run
from optiml.lift.families import describe
from optiml.lift.run import round_bf16
from optiml.lift.symbolic import _disambiguated
from optiml.spec import parse_spec


def lifted_of(text: str, kernel: str | None = None):
    src = SourceFile(text, "k.cu")
    k = src.kernel(kernel) if kernel else src.kernels[0]
    spec = parse_spec(src, k)
    return lift(src, k, spec), spec


def model_outputs(text: str, sizes: dict[str, int], inputs: dict[str, np.ndarray], **kw):
    lifted, spec = lifted_of(text)
    assert isinstance(lifted, Lifted), lifted.message()
    case = spec.case(sizes)
    args: dict = dict(inputs)
    args.update(case.scalars)
    for p in spec.params:
        if p not in args and p in sizes:
            args[p] = sizes[p]
    for b in spec.buffers:
        if b.name not in args:
            args[b.name] = np.zeros(case.lengths[b.name])
    return run(lifted, args, case.grid, case.block, **kw), describe(lifted)


rng = np.random.default_rng(7)


def uniform(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape)


LINEAR_WT_BIAS = r"""
/* @optiml
 *   args:   inp: in float[B * C], weight: in float[OC * C], bias: in float[OC], out: out float[B * OC]
 *   launch: grid = (cdiv(OC, 16), cdiv(B, 16)), block = (16, 16)
 *   sizes:  B, C, OC = (64, 48, 40)
 */
__global__ void linear_fwd(const float* inp, const float* weight, const float* bias,
                           float* out, int B, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y * blockDim.y + threadIdx.y;
    if (b < B && o < OC) {
        float val = bias != nullptr ? bias[o] : 0.0f;
        for (int i = 0; i < C; i++) {
            val += inp[b * C + i] * weight[o * C + i];
        }
        out[b * OC + o] = val;
    }
}
"""


def test_linear_with_transposed_weight_and_bias_is_a_contraction():
    B, C, OC = 37, 29, 21
    x, w, bias = uniform(B * C), uniform(OC * C), uniform(OC)
    text = LINEAR_WT_BIAS.replace("bias != nullptr ? bias[o] : 0.0f", "bias[o]")
    out, d = model_outputs(text, {"B": B, "C": C, "OC": OC}, {"inp": x, "weight": w, "bias": bias})
    expect = x.reshape(B, C) @ w.reshape(OC, C).T + bias
    np.testing.assert_allclose(out["out"].reshape(B, OC), expect, rtol=1e-12)
    assert d.family == "contraction (matrix-matrix)"
    # the weight is walked along its contiguous axis: stored transposed (out = inp . W^T)
    red = d.reductions[0]
    assert red.op == "sum" and red.strides == {"inp": "1", "weight": "1"}


BIAS_GRAD = r"""
/* @optiml
 *   args:   dout: in float[N * OC], dbias: out float[OC]
 *   launch: grid = cdiv(OC, 128), block = 128
 *   sizes:  N, OC = (256, 300)
 */
__global__ void bias_backward(const float* __restrict__ dout, float* __restrict__ dbias, int N, int OC)
{
    const int col = threadIdx.x + blockIdx.x * blockDim.x;
    if (col >= OC) return;
    double sum = 0.0;
    for (int row = 0; row < N; ++row)
        sum += dout[(size_t)row * OC + col];
    dbias[col] = (float)sum;
}
"""


def test_a_column_reduction_walks_the_rows_with_the_column_count_as_stride():
    N, OC = 53, 300
    g = uniform(N * OC)
    out, d = model_outputs(BIAS_GRAD, {"N": N, "OC": OC}, {"dout": g})
    np.testing.assert_allclose(out["dbias"], g.reshape(N, OC).sum(axis=0), rtol=1e-12)
    assert d.family == "reduction"
    assert d.reductions[0].strides == {"dout": "OC"}
    assert d.guards == ["((threadIdx.x + (blockIdx.x * blockDim.x)) < OC)"]  # as written


PERMUTE4 = r"""
#define D 7
/* @optiml
 *   args:   x: in float[N * H * T * 7], y: out float[N * T * H * 7]
 *   launch: grid = cdiv(N * H * T * 7, 256), block = 256
 *   sizes:  N, H, T = (2, 3, 5)
 */
__global__ void permute_0213(const float* x, float* y, int N, int H, int T) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < N * H * T * D) {
        int d = idx % D;
        int rest = idx / D;
        int t = rest % T; rest /= T;
        int h = rest % H;
        int n = rest / H;
        y[((n * T + t) * H + h) * D + d] = x[idx];
    }
}
"""


def test_a_four_dimensional_permute_runs_as_numpy_transposes():
    N, H, T, D = 2, 3, 5, 7
    x = uniform(N * H * T * D)
    out, d = model_outputs(PERMUTE4, {"N": N, "H": H, "T": T}, {"x": x})
    expect = x.reshape(N, H, T, D).transpose(0, 2, 1, 3).reshape(-1)
    np.testing.assert_array_equal(out["y"], expect)
    assert [a.pattern for a in d.accesses if a.kind == "write"] == ["non-affine"]


EMBED = r"""
constexpr int T = 16;
/* @optiml
 *   args:   ids: in int32[BT] in [0, V), wte: in float[V * C], wpe: in float[16 * C], out: out float[BT * C]
 *   launch: grid = cdiv(BT * C, 256), block = 256
 *   sizes:  BT, V, C = (64, 50, 24)
 */
__global__ void encoder_forward(const int* ids, const float* wte, const float* wpe, float* out,
                                int BT, int V, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * C) return;
    int bt = i / C, c = i % C;
    int t = bt % T;
    int tok = ids[bt];
    out[i] = wte[tok * C + c] + wpe[t * C + c];
}
"""


def test_an_embedding_lookup_is_a_gather():
    BT, T, V, C = 64, 16, 50, 24
    ids = rng.integers(0, V, BT)
    wte, wpe = uniform(V * C), uniform(T * C)
    out, d = model_outputs(EMBED, {"BT": BT, "V": V, "C": C}, {"ids": ids, "wte": wte, "wpe": wpe})
    expect = wte.reshape(V, C)[ids] + wpe.reshape(T, C)[np.arange(BT) % T]
    np.testing.assert_allclose(out["out"].reshape(BT, C), expect, rtol=1e-12)
    assert d.family == "gather"
    assert any(a.pattern == "indirect" and a.tensor == "wte" for a in d.accesses)


CONV3 = r"""
/* @optiml
 *   args:   img: in float[H * W], k: in float[9], res: out float[H * W]
 *   launch: grid = (cdiv(W, 16), cdiv(H, 16)), block = (16, 16)
 *   sizes:  H, W = (40, 33)
 */
__global__ void conv3x3(const float *img, const float *k, float *res, int H, int W)
{
    int x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
    if (x >= W || y >= H) return;
    float acc = 0;
    for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++) {
            int yy = y + dy, xx = x + dx;
            if (yy >= 0 && yy < H && xx >= 0 && xx < W)
                acc += img[yy * W + xx] * k[(dy + 1) * 3 + dx + 1];
        }
    res[y * W + x] = acc;
}
"""


def test_a_comparison_the_parser_reads_as_a_template_is_read_again_as_a_comparison():
    # `yy < H && xx >= 0` in an initializer: tree-sitter reads `yy < H && xx >` as a template's
    # argument list; the kernel is read again with `(yy) < H`, which only a comparison can be
    ternary = CONV3.replace(
        """            if (yy >= 0 && yy < H && xx >= 0 && xx < W)
                acc += img[yy * W + xx] * k[(dy + 1) * 3 + dx + 1];""",
        """            float v = (yy >= 0 && yy < H && xx >= 0 && xx < W) ? img[yy * W + xx] : 0.0f;
            acc += v * k[(dy + 1) * 3 + dx + 1];""",
    )
    assert ternary != CONV3
    source = SourceFile(ternary, "conv.cu")
    assert any(n.type == "template_function" for n in walk(source.tree.root_node))
    H, W = 40, 33
    img, k = uniform(H * W), uniform(9)
    out, _ = model_outputs(ternary, {"H": H, "W": W}, {"img": img, "k": k})
    padded = np.pad(img.reshape(H, W), 1)
    kk = k.reshape(3, 3)
    expect = sum(kk[a, b] * padded[a : a + H, b : b + W] for a in range(3) for b in range(3))
    np.testing.assert_allclose(out["res"].reshape(H, W), expect, rtol=1e-12, atol=1e-14)


def test_a_real_templates_arguments_are_not_read_as_a_comparison():
    # `clampv<float>(...)`'s name is no variable of the kernel: the text is left as it is
    text = """
template <typename T> __device__ T clampv(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1000
 */
__global__ void clamp_all(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = clampv<float>(x[i], -0.5f, 0.5f);
}
"""
    source = SourceFile(text, "clamp.cu")
    kernel = source.kernel("clamp_all")
    assert _disambiguated(source, kernel) is None


def test_a_three_by_three_convolution_with_zero_padding():
    H, W = 40, 33
    img, k = uniform(H * W), uniform(9)
    out, d = model_outputs(CONV3, {"H": H, "W": W}, {"img": img, "k": k})
    padded = np.pad(img.reshape(H, W), 1)
    kk = k.reshape(3, 3)
    expect = sum(kk[a, b] * padded[a : a + H, b : b + W] for a in range(3) for b in range(3))
    np.testing.assert_allclose(out["res"].reshape(H, W), expect, rtol=1e-12, atol=1e-14)
    assert d.family == "stencil (convolution)"


GELU_BF16 = r"""
#include <cuda_bf16.h>
#define GELU_SCALE 0.7978845608f
typedef __nv_bfloat16 floatX;
__device__ inline float gelu(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}
/* @optiml
 *   args:   out: out bfloat16[N], inp: in bfloat16[N]
 *   launch: grid = cdiv(N, 512), block = 512
 *   sizes:  N = (1000)
 *   tol:    rtol = 2e-2, atol = 1e-2
 */
__global__ void gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* inp, int N) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += blockDim.x * gridDim.x) {
        out[i] = __float2bfloat16(gelu(__bfloat162float(inp[i])));
    }
}
"""


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def test_a_bf16_map_through_a_device_function_in_a_grid_stride_loop():
    x = round_bf16(uniform(1000, lo=-3, hi=3))
    out, d = model_outputs(GELU_BF16, {"N": 1000}, {"inp": x})
    np.testing.assert_allclose(out["out"], gelu(x.astype(np.float64)), rtol=1e-6)
    native, _ = model_outputs(GELU_BF16, {"N": 1000}, {"inp": x}, precision="native")
    np.testing.assert_array_equal(native["out"], round_bf16(native["out"]))  # rounded to bf16
    np.testing.assert_allclose(native["out"], gelu(x.astype(np.float64)), rtol=1e-2, atol=1e-2)
    assert d.family == "map"
    assert any("(loop at line" in x for x in d.domain)  # the grid-stride loop is the domain


ONLINE_SOFTMAX = r"""
/* @optiml
 *   args:   x: in float[R * C], y: out float[R * C]
 *   launch: grid = cdiv(R, 64), block = 64
 *   sizes:  R, C = (100, 37)
 */
__global__ void softmax_online(const float* x, float* y, int R, int C) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    const float* row = x + r * C;
    float m = -INFINITY, s = 0.0f;
    int j = 0;
    while (j < C) {
        float v = row[j];
        float mn = fmaxf(m, v);
        s = s * expf(m - mn) + expf(v - mn);
        m = mn;
        j++;
    }
    for (int c = 0; c < C; ++c) y[r * C + c] = expf(row[c] - m) / s;
}
"""


def test_an_online_softmax_in_a_while_loop_is_a_row_normalization():
    R, C = 100, 37
    x = uniform(R * C, lo=-5, hi=5)
    out, d = model_outputs(ONLINE_SOFTMAX, {"R": R, "C": C}, {"x": x})
    e = np.exp(x.reshape(R, C) - x.reshape(R, C).max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["y"].reshape(R, C), e / e.sum(axis=1, keepdims=True), rtol=1e-12)
    assert d.family == "row normalization"
    assert {r.op for r in d.reductions} == {"max", "recurrence"}


CROSS_ENTROPY = r"""
/* @optiml
 *   args:   logits: in float[B * V], targets: in int32[B] in [0, V), losses: out float[B]
 *   launch: grid = cdiv(B, 32), block = 32
 *   sizes:  B, V = (64, 50)
 */
__global__ void crossentropy_forward(float* losses, const float* logits, const int* targets, int B, int V) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B) {
        float maxv = logits[b * V];
        for (int v = 1; v < V; v++) if (logits[b * V + v] > maxv) maxv = logits[b * V + v];
        float sum = 0.f;
        for (int v = 0; v < V; v++) sum += expf(logits[b * V + v] - maxv);
        losses[b] = logf(sum) + maxv - logits[b * V + targets[b]];
    }
}
"""


def test_cross_entropy_with_a_max_written_as_an_if():
    B, V = 64, 50
    lg, t = uniform(B * V, lo=-4, hi=4), rng.integers(0, V, B)
    out, d = model_outputs(CROSS_ENTROPY, {"B": B, "V": V}, {"logits": lg, "targets": t})
    L = lg.reshape(B, V)
    expect = np.log(np.exp(L - L.max(1, keepdims=True)).sum(1)) + L.max(1) - L[np.arange(B), t]
    np.testing.assert_allclose(out["losses"], expect, rtol=1e-12)
    assert {r.op for r in d.reductions} == {"max", "sum"}
    # reductions over the row, combined with one of its elements (read at an index loaded from
    # memory): cross-entropy is a row normalization
    assert d.family == "row normalization"


HISTO = r"""
/* @optiml
 *   args:   data: in uint8[n], bins: out uint32[64]
 *   launch: grid = 40, block = 256
 *   sizes:  n = (100000)
 */
__global__ void histo64(const unsigned char* data, unsigned int* bins, int n) {
    int stride = blockDim.x * gridDim.x;
    for (int i = threadIdx.x + blockIdx.x * blockDim.x; i < n; i += stride)
        atomicAdd(&bins[data[i] >> 2], 1u);
}
"""


def test_a_histogram_in_a_grid_stride_loop_with_atomics():
    data = rng.integers(0, 256, 100000)
    out, d = model_outputs(HISTO, {"n": 100000}, {"data": data})
    np.testing.assert_array_equal(out["bins"], np.bincount(data >> 2, minlength=64))
    assert d.family == "histogram"


def test_kernels_that_cooperate_stay_opaque_with_the_line_and_the_reason():
    text = r"""
/* @optiml
 *   args:   x: in float[n], out: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = (1000)
 */
__global__ void k(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.f;
    v += __shfl_down_sync(0xffffffff, v, 1);
    if (i < n) out[i] = v;
}
"""
    lifted, _ = lifted_of(text)
    assert isinstance(lifted, Unlifted)
    assert lifted.reasons == [(10, "a warp shuffle: threads of a warp exchange values")]
    d = describe(lifted)
    assert d.family == "opaque" and d.not_understood == [
        "line 10: a warp shuffle: threads of a warp exchange values"
    ]


def test_c_integer_division_and_remainder_truncate_toward_zero():
    text = r"""
/* @optiml
 *   args:   x: in int32[n], y: out int32[n]
 *   launch: grid = cdiv(n, 64), block = 64
 *   sizes:  n = (200)
 */
__global__ void k(const int* x, int* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / 7 + x[i] % 7 * 100 + (int)(x[i] * 0.5f);
}
"""
    x = rng.integers(-100, 100, 200)
    out, _ = model_outputs(text, {"n": 200}, {"x": x})
    expect = [int(v / 7) + (v - 7 * int(v / 7)) * 100 + math.trunc(v * 0.5) for v in x]
    np.testing.assert_array_equal(out["y"], expect)


def test_a_store_out_of_bounds_is_an_error_that_names_the_line():
    text = r"""
/* @optiml
 *   args:   y: out float[n]
 *   launch: grid = cdiv(n, 64), block = 64
 *   sizes:  n = (100)
 */
__global__ void k(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = 1.0f;
}
"""
    from optiml.lift import ModelError

    with pytest.raises(ModelError, match="line 9: a thread writes y\\[100\\], outside its 100"):
        model_outputs(text, {"n": 100}, {})


def test_the_command_line_reads_a_kernel_as_a_user_sees_it(tmp_path):
    import json
    import subprocess

    f = tmp_path / "bias.cu"
    f.write_text(BIAS_GRAD)
    shown = subprocess.run(
        ["optiml", "lift", str(f), "-k", "bias_backward"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "bias_backward: reduction"
    assert "reduction: sum into `sum` (loop at line 12; dout stride OC)" in shown.stdout
    as_json = subprocess.run(
        ["optiml", "lift", str(f), "-k", "bias_backward", "--json"], capture_output=True, text=True
    )
    d = json.loads(as_json.stdout)
    assert d["family"] == "reduction" and d["reductions"][0]["strides"] == {"dout": "OC"}
    missing = subprocess.run(
        ["optiml", "lift", str(f), "-k", "nope"], capture_output=True, text=True
    )
    assert missing.returncode == 4 and missing.stderr.count("\n") == 1


SEARCH = r"""
/* @optiml
 *   args:   row_ptr: in int32[R + 1] in [0, 4), keys: in int32[N] in [0, 50), first: out int32[R],
 *           total: out float[R]
 *   launch: grid = cdiv(R, 64), block = 64
 *   sizes:  R, N = (300, 1200)
 */
__global__ void first_big(const int* row_ptr, const int* keys, int* first, float* total, int R, int N) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    int found = -1, j = 4 * r;
    float s = 0.f;
    do {
        if (keys[j] % 7 == 0) continue;   // skipped, not counted
        s += keys[j];
        if (keys[j] > 40) { found = j; break; }
    } while (++j < 4 * r + 4 && j < N);
    first[r] = found;
    total[r] = s;
}
"""


def test_break_continue_and_do_while_keep_c_semantics():
    R, N = 300, 1200
    keys = rng.integers(0, 50, N)
    out, _ = model_outputs(SEARCH, {"R": R, "N": N}, {"keys": keys, "row_ptr": np.zeros(R + 1)})
    first, total = [], []
    for r in range(R):
        f, s, j = -1, 0.0, 4 * r
        while True:
            k = keys[j]
            if k % 7 != 0:
                s += k
                if k > 40:
                    f = j
                    break
            j += 1
            if not (j < 4 * r + 4 and j < N):
                break
        first.append(f)
        total.append(s)
    np.testing.assert_array_equal(out["first"], first)
    np.testing.assert_allclose(out["total"], total)


def test_a_buffer_checked_against_null_is_taken_as_allocated():
    B, C, OC = 9, 7, 5
    x, w, bias = uniform(B * C), uniform(OC * C), uniform(OC)
    out, d = model_outputs(
        LINEAR_WT_BIAS, {"B": B, "C": C, "OC": OC}, {"inp": x, "weight": w, "bias": bias}
    )
    np.testing.assert_allclose(
        out["out"].reshape(B, OC), x.reshape(B, C) @ w.reshape(OC, C).T + bias
    )
    assert d.family == "contraction (matrix-matrix)"


INPLACE = r"""
/* @optiml
 *   args:   x: in float[R * C], y: out float[R * C]
 *   launch: grid = cdiv(R, 32), block = 32
 *   sizes:  R, C = (50, 21)
 */
__global__ void softmax_inplace(const float* x, float* y, int R, int C) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    float s = 0.f;
    for (int i = 0; i < C; i++) { y[r * C + i] = expf(x[r * C + i]); s += y[r * C + i]; }
    for (int j = 0; j < C; j++) y[r * C + j] /= s;
}
"""


def test_a_row_written_then_normalized_in_place_reads_back_what_it_wrote():
    R, C = 50, 21
    x = uniform(R * C)
    out, d = model_outputs(INPLACE, {"R": R, "C": C}, {"x": x})
    e = np.exp(x.reshape(R, C))
    np.testing.assert_allclose(out["y"].reshape(R, C), e / e.sum(1, keepdims=True), rtol=1e-12)
    assert d.family == "row normalization"
    # another range in the second loop: what it reads was not all written by the first
    shifted, _ = lifted_of(INPLACE.replace("int j = 0; j < C", "int j = 1; j < C"))
    assert isinstance(shifted, Unlifted) and "read after this thread wrote it" in shifted.message()


def test_a_reduction_read_off_an_if_or_a_subtraction_keeps_its_meaning():
    """What families hand to schedules: `s -= x` sums -x; `if (c) s += x` sums x where c holds."""
    from optiml.lift.families import reduction_of
    from optiml.lift.model import Binary, Const, Load, Select, Unary, Var

    s = Var("s", "float")
    x = Load("x", Var("k", "int"), "float")
    op, operand = reduction_of(s, Binary("-", s, x, "float"))
    assert op == "sum" and operand == Unary("-", x, "float")
    c = Binary(">", x, Const(0.0, "float"), "bool")
    op, operand = reduction_of(s, Select(c, Binary("+", s, x, "float"), s, "float"))
    assert op == "sum" and operand == Select(c, x, Const(0, "float"), "float")


def test_macros_expand_with_their_arguments_and_side_effects():
    text = r"""
#define IDX2(r, c, ld) ((r) * (ld) + (c))
#define SQ(x) ((x) * (x))
#define NEXT(i) (i++)
/* @optiml
 *   args:   a: in float[R * C], y: out float[R]
 *   launch: grid = cdiv(R, 32), block = 32
 *   sizes:  R, C = (40, 9)
 */
__global__ void k(const float* a, float* y, int R, int C) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    float x = 0.f;
    int j = 0;
    while (j < C) { x += SQ(a[IDX2(r, j, C)]); NEXT(j); }
    y[r] = x;
}
"""
    a = uniform(40 * 9)
    out, d = model_outputs(text, {"R": 40, "C": 9}, {"a": a})
    np.testing.assert_allclose(out["y"], (a.reshape(40, 9) ** 2).sum(1), rtol=1e-12)
    assert d.family == "reduction"


def test_a_read_another_iteration_of_the_loop_wrote_is_not_answered_from_an_earlier_loop():
    shifted = INPLACE.replace(
        "for (int j = 0; j < C; j++) y[r * C + j] /= s;",
        "for (int j = 0; j < C; j++) { float v = y[r * C + j]; if (j + 1 < C) y[r * C + j + 1] = v; }",
    )
    lifted, _ = lifted_of(shifted)
    assert isinstance(lifted, Unlifted) and "after this loop wrote it" in lifted.message()


def test_a_cast_to_a_template_type_parameter_written_as_a_call():
    text = """
/* @optiml
 *   args:     x: in float[n], y: out float[n]
 *   launch:   grid = cdiv(n, 64), block = 64
 *   sizes:    n = 100, 7
 *   template: T = float
 */
template <typename T>
__global__ void half_it(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (T)((float)x[i] * 0.5f);
}
"""
    x = uniform(100)
    out, _ = model_outputs(text, {"n": 100}, {"x": x})
    assert np.allclose(out["y"], x * 0.5)
