"""window_tile: sliding-window reductions read off the lifted model (optiml.lift.window) and tiled
through shared memory. KernelBench's pooling and depthwise convolutions as `optiml generate
--from-torch` writes them and hand-written windows spelled otherwise compute, at sizes with
partial tiles, exactly what the original computes (CUDA threads as host threads); proposals
compile for sm_90; kernels of other forms get nothing."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from optiml.generate import generate
from optiml.generate.from_torch import translate
from optiml.harness.build import build_kernel
from optiml.lift import lift
from optiml.lift.window import NotWindow, window
from optiml.search.catalog import Context, by_name
from optiml.search.catalog import implicit_gemm as ig
from optiml.search.catalog import window_tile as wt
from optiml.search.judge import hardcoded_constants
from optiml.search.variant import Variant
from tests.host_cuda import run_against
from tests.support import FIXTURES

KB = Path(__file__).resolve().parents[2].parent / "shared" / "kernelbench" / "level1"
needs_kb = pytest.mark.skipif(not KB.is_dir(), reason=f"KernelBench's level 1 is not at {KB}")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# KernelBench's windows at small sizes: outputs that fill no tile exactly.
SMALL = {
    42: {"batch_size": 2, "channels": 3, "height": 13, "width": 37},  # 4 x 4 max, padding 1
    44: {"batch_size": 2, "in_channels": 11, "input_length": 300},  # 1-D average, padding 4
    46: {"batch_size": 2, "channels": 2, "depth": 5, "height": 19, "width": 23},  # 3-D, stride 2
    82: {"batch_size": 2, "in_channels": 3, "width": 41, "height": 11},  # depthwise 3 x 3
    84: {"batch_size": 2, "in_channels": 3, "out_channels": 3, "width_in": 35, "height_in": 10},
}

_made: dict = {}
_dir: list[str] = []


def task(n: int) -> Context:
    if n not in _made:
        if not _dir:
            _dir.append(tempfile.mkdtemp(prefix="optiml-window-"))
        (path,) = KB.glob(f"{n}_*.py")
        t = translate(path.read_text(), path.name, overrides=SMALL[n])
        g = generate(t.formula, t.name, ref_file=f"{t.name}_ref.py")
        root = Path(_dir[0]) / str(n)
        root.mkdir(parents=True, exist_ok=True)
        (root / f"{t.name}_ref.py").write_text(g.reference)
        cu = root / f"{t.name}.cu"
        cu.write_text(g.kernel)
        _made[n] = Context.of(Variant(g.kernel), str(cu), t.name)
    return _made[n]


def inline(text: str, kernel: str) -> Context:
    return Context.of(Variant(text), str(FIXTURES / "kernel.cu"), kernel)


def propose(ctx: Context):
    return by_name("window_tile").propose(ctx)


def variant(ctx: Context, proposal) -> Context:
    return Context.of(proposal.variant, ctx.source.path, ctx.kernel.name)


def reading(ctx: Context):
    return window(lift(ctx.source, ctx.kernel, ctx.spec), ig.grid_extents(ctx))


# A max pool spelled by hand: 2 x 2 windows at stride 2 with a comparison, not fmaxf, and the
# output's coordinates taken apart one division at a time.
MAXPOOL = """
/* @optiml
 *   args:   in: in float[N * C * H * W], out: out float[N * C * OH * OW], OH = H / 2, OW = W / 2
 *   launch: grid = cdiv(N * C * (H / 2) * (W / 2), 128), block = 128
 *   sizes:  N, C, H, W = (8, 16, 64, 96), (2, 3, 10, 22)
 */
__global__ void maxpool2x2(const float* in, float* out, int N, int C, int H, int W, int OH, int OW)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C * OH * OW) return;
    int x = i % OW;
    int t = i / OW;
    int y = t % OH;
    int nc = t / OH;
    float m = -INFINITY;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {
            float v = in[(nc * H + 2 * y + dy) * W + 2 * x + dx];
            m = v > m ? v : m;
        }
    out[i] = m;
}
"""

# A 3 x 3 average pool that leaves the padding out of the count (count_include_pad=False): a sum
# and a count carried through the window, the division after it.
AVGPOOL = """
/* @optiml
 *   args:   x: in float[N * C * H * W], y: out float[N * C * H * W]
 *   launch: grid = cdiv(N * C * H * W, 256), block = 256
 *   sizes:  N, C, H, W = (8, 32, 64, 64), (2, 3, 11, 37)
 *   tol:    rtol = 1e-5, atol = 1e-6
 */
__global__ void avgpool3x3_exclude_pad(const float* x, float* y, int N, int C, int H, int W)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * C * H * W) return;
    const int w = idx % W, h = (idx / W) % H, nc = idx / (W * H);
    float sum = 0.0f;
    int count = 0;
    for (int i = -1; i <= 1; ++i) {
        for (int j = -1; j <= 1; ++j) {
            const int hh = h + i, ww = w + j;
            if (hh >= 0 && hh < H && ww >= 0 && ww < W) {
                sum += x[(nc * H + hh) * W + ww];
                count++;
            }
        }
    }
    y[idx] = sum / count;
}
"""

# Launched in three dimensions as people often write it: x and y over the output's columns and
# rows, each (batch, channel) plane a block along z; a 3 x 3 max at stride 2 through a pointer to
# the plane.
GRID_3D = """
#include <cfloat>

/* @optiml
 *   args:   in: in float[NC * H * W], out: out float[NC * OH * OW],
 *           OH = (H - 3) / 2 + 1, OW = (W - 3) / 2 + 1
 *   launch: grid = (cdiv((W - 3) / 2 + 1, 16), cdiv((H - 3) / 2 + 1, 16), NC), block = (16, 16)
 *   sizes:  NC, H, W = (256, 128, 128), (3, 19, 37)
 */
__global__ void maxpool3x3s2(const float* in, float* out, int NC, int H, int W, int OH, int OW)
{
    int ox = blockIdx.x * blockDim.x + threadIdx.x;
    int oy = blockIdx.y * blockDim.y + threadIdx.y;
    int nc = blockIdx.z;
    if (ox >= OW || oy >= OH) return;
    const float* p = in + (size_t)nc * H * W;
    float m = -FLT_MAX;
    for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx)
            m = fmaxf(m, p[(oy * 2 + ky) * W + ox * 2 + kx]);
    out[((size_t)nc * OH + oy) * OW + ox] = m;
}
"""

# A 1-D filter of 7 taps with its weights, clamped at the ends: no Y axis.
FILTER = """
/* @optiml
 *   args:   x: in float[n], w: in float[7], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1000000, 1001
 *   tol:    rtol = 1e-5, atol = 1e-5
 */
__global__ void fir7(const float* __restrict__ x, const float* __restrict__ w, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float s = 0.0f;
        for (int k = -3; k <= 3; k++) {
            int j = i + k;
            if (j >= 0 && j < n) s += w[k + 3] * x[j];
        }
        y[i] = s;
    }
}
"""

# A direct 3 x 3 convolution whose input channel is the slowest loop: the tile is loaded once per
# channel, the channel's 9 taps from it.
DIRECT = """
/* @optiml
 *   args:   in: in float[B * C * H * W], w: in float[F * C * 9], out: out float[B * F * H * W]
 *   launch: grid = cdiv(B * F * H * W, 256), block = 256
 *   sizes:  B, C, F, H, W = (4, 8, 8, 64, 64), (1, 3, 2, 9, 37)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void conv3x3_same(const float* in, const float* w, float* out,
                             int B, int C, int F, int H, int W)
{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)B * F * H * W) return;
    int x = i % W, y = (i / W) % H, f = (i / ((long long)W * H)) % F;
    int b = i / ((long long)W * H * F);
    float s = 0.f;
    for (int c = 0; c < C; c++)
        for (int ky = 0; ky < 3; ky++)
            for (int kx = 0; kx < 3; kx++) {
                int yy = y + ky - 1, xx = x + kx - 1;
                if (yy >= 0 && yy < H && xx >= 0 && xx < W)
                    s += in[((long long)(b * C + c) * H + yy) * W + xx] * w[(f * C + c) * 9 + ky * 3 + kx];
            }
    out[i] = s;
}
"""


# ---- what the reading finds -------------------------------------------------------------------


@needs_kb
def test_a_3d_pool_tiles_height_and_width_and_loops_over_depth():
    win = reading(task(46))
    assert [m for c in (win.x, win.y) for m in c.extent] == [("OW",), ("OH",)]
    assert [t.sx for t in win.tiled] == [2] and [t.sy for t in win.tiled] == [2]
    assert len(win.inner) == 2 and len(win.outer) == 1  # KH x KW on the tile, KD around it


@needs_kb
def test_a_1d_pool_takes_the_channels_as_rows_without_a_halo():
    win = reading(task(44))
    assert win.y is not None and [m for m in win.y.extent] == [("in_channels",)]
    (t,) = win.tiled
    assert t.dy == {} and list(t.dx.values()) == [1]


def test_the_weights_of_a_filter_are_read_as_they_are():
    win = reading(inline(FILTER, "fir7"))
    assert win.tensors == ["x"] and win.y is None


def test_a_count_beside_the_sum_is_carried_too():
    win = reading(inline(AVGPOOL, "avgpool3x3_exclude_pad"))
    assert sorted(c.var.type for c in win.accs) == ["float", "int"]


def test_a_3d_launch_reads_each_dimension_as_coordinates():
    win = reading(inline(GRID_3D, "maxpool3x3s2"))
    assert {d: h.kind for d, h in win.launch.items()} == {
        "x": "thread",
        "y": "thread",
        "z": "block",
    }
    assert [m for m in win.x.extent] == [("OW",)] and [m for m in win.y.extent] == [("OH",)]
    assert [t.sx for t in win.tiled] == [2] and [t.sy for t in win.tiled] == [2]


def test_a_map_is_not_a_window():
    text = """
/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1000
 */
__global__ void twice(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
    with pytest.raises(NotWindow):
        reading(inline(text, "twice"))
    assert propose(inline(text, "twice")) == []


def test_a_channel_loop_inside_the_window_keeps_the_original_order():
    """Taps outside, the channel innermost: a tile per channel would reorder the sum."""
    text = DIRECT.replace(
        "for (int c = 0; c < C; c++)\n        for (int ky = 0; ky < 3; ky++)\n            for (int kx = 0; kx < 3; kx++) {",
        "for (int ky = 0; ky < 3; ky++)\n        for (int kx = 0; kx < 3; kx++)\n            for (int c = 0; c < C; c++) {",
    )
    assert text != DIRECT
    with pytest.raises(NotWindow, match="slower"):
        reading(inline(text, "conv3x3_same"))


def test_a_window_whose_extent_is_a_size_gets_nothing():
    text = FILTER.replace("w: in float[7]", "w: in float[2 * r + 1]").replace(
        "sizes:  n = 1000000, 1001", "sizes:  n, r = (1000000, 3), (1001, 2)"
    )
    text = text.replace("int n)", "int n, int r)").replace(
        "for (int k = -3; k <= 3; k++)", "for (int k = -r; k <= r; k++)"
    )
    text = text.replace("w[k + 3]", "w[k + r]")
    ctx = inline(text, "fir7")
    assert propose(ctx) == []
    assert "differs between sizes" in wt.why_not(ctx)


# ---- what it computes -------------------------------------------------------------------------


@needs_kb
@needs_gxx
@pytest.mark.parametrize("n", sorted(SMALL))
def test_kernelbench_windows_compute_what_the_original_does(n, tmp_path):
    ctx = task(n)
    proposals = propose(ctx)
    assert proposals, wt.why_not(ctx)
    # beside the tiles, one schedule that reads each window from global memory
    direct = [p for p in proposals if p.params.get("tile") is False]
    assert len(direct) == 1 and "__shared__" not in direct[0].variant.text
    candidates = [variant(ctx, p) for p in proposals]
    # bit for bit: the same update in the same order from the same elements
    assert run_against(ctx, candidates, ctx.spec.sizes, tmp_path, exact=True) == [0] * len(
        candidates
    )


@needs_gxx
@pytest.mark.parametrize(
    "text,kernel,sizes",
    [
        (
            MAXPOOL,
            "maxpool2x2",
            [{"N": 2, "C": 3, "H": 10, "W": 22}, {"N": 1, "C": 1, "H": 37, "W": 70}],
        ),
        (FILTER, "fir7", [{"n": 1001}, {"n": 7}]),
        (AVGPOOL, "avgpool3x3_exclude_pad", [{"N": 2, "C": 3, "H": 11, "W": 37}]),
        (GRID_3D, "maxpool3x3s2", [{"NC": 3, "H": 19, "W": 37}, {"NC": 2, "H": 40, "W": 7}]),
        (DIRECT, "conv3x3_same", [{"B": 1, "C": 3, "F": 2, "H": 9, "W": 37}]),
    ],
    ids=["maxpool-compare", "fir-1d", "avgpool-count", "grid-3d", "direct-conv"],
)
def test_hand_written_windows_compute_what_the_original_does(text, kernel, sizes, tmp_path):
    ctx = inline(text, kernel)
    proposals = propose(ctx)
    assert proposals, wt.why_not(ctx)
    candidates = [variant(ctx, p) for p in proposals]
    assert run_against(ctx, candidates, sizes, tmp_path, exact=True) == [0] * len(candidates)


@needs_gxx
@pytest.mark.parametrize(
    "file,kernel,sizes",
    [
        ("corpus/stencil1d.cu", "stencil_1d", [{"n": 1001}]),
        ("holdout/box_blur.cu", "box_blur_1d", [{"n": 10007}]),
        (
            "holdout/conv2d_3x3.cu",
            "conv2d_3x3_nchw",
            [{"N": 2, "C_in": 3, "C_out": 5, "H": 13, "W": 17}],
        ),
    ],
)
def test_the_repositorys_windows_compute_what_the_original_does(file, kernel, sizes, tmp_path):
    path = FIXTURES / file
    ctx = Context.of(Variant(path.read_text()), str(path), kernel)
    proposals = propose(ctx)
    assert proposals, wt.why_not(ctx)
    candidates = [variant(ctx, p) for p in proposals]
    assert run_against(ctx, candidates, sizes, tmp_path, exact=True) == [0] * len(candidates)


@needs_gxx
def test_a_3d_convolution_loops_over_two_window_coordinates_around_the_tile(tmp_path):
    """The input channel and the depth offset both run around the tile (each a loop of its own,
    named apart from the taps' loops inside), the height and width offsets on it."""
    g = generate(
        "float x[B, CI, D, H, W], w[CO, CI, KD, KH, KW]\n"
        "y[b, co, od, oh, ow] = sum(ci, kd, kh, kw)"
        " pad(x[b, ci, od + kd - 1, oh + kh - 1, ow + kw - 1], 0) * w[co, ci, kd, kh, kw]"
        "   for od < D, oh < H, ow < W\n"
        "B = 2; CO = 3; D = 5; H = 7; W = 37; CI = 2; KD = 3; KH = 3; KW = 3",
        "conv3d",
        ref_file="conv3d_ref.py",
    )
    (tmp_path / "conv3d_ref.py").write_text(g.reference)
    cu = tmp_path / "conv3d.cu"
    cu.write_text(g.kernel)
    ctx = Context.of(Variant(g.kernel), str(cu), "conv3d")
    win = reading(ctx)
    assert len(win.outer) == 2 and len(win.inner) == 2
    proposals = propose(ctx)
    assert proposals, wt.why_not(ctx)
    for p in proposals:
        loops = re.findall(r"for \(int (optiml_k\d+)", p.variant.text)
        assert len(loops) == 4 == len(set(loops))
    candidates = [variant(ctx, p) for p in proposals]
    sizes = [{"B": 1, "CO": 2, "D": 4, "H": 9, "W": 35}]
    assert run_against(ctx, candidates, sizes, tmp_path, exact=True) == [0] * len(candidates)


@needs_gxx
def test_a_pool_at_a_large_stride_takes_flat_tiles(tmp_path):
    """KernelBench's 11 x 11 average pool at stride 11: 32 x 8 outputs would read 352 x 88 floats."""
    (path,) = (FIXTURES / "kb_extra").glob("45_*.py")
    t = translate(
        path.read_text(),
        path.name,
        overrides={"batch_size": 2, "channels": 3, "height": 40, "width": 370},
    )
    g = generate(t.formula, t.name, ref_file=f"{t.name}_ref.py")
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    cu = tmp_path / f"{t.name}.cu"
    cu.write_text(g.kernel)
    ctx = Context.of(Variant(g.kernel), str(cu), t.name)
    proposals = propose(ctx)
    # the tile depends on the window and stride only: 32 x 2 outputs read 352 x 33 floats
    assert [p.params["block"] for p in proposals] == [(32, 2), (32, 1), (32, 8)]
    assert proposals[-1].params["tile"] is False  # beside them, the window from global memory
    candidates = [variant(ctx, p) for p in proposals]
    assert run_against(ctx, candidates, ctx.spec.sizes, tmp_path, exact=True) == [0] * len(
        candidates
    )


def test_the_block_shape_is_no_wired_in_size():
    """A 1-D window in rows of 256 where a problem size is 256: the judge takes a literal equal to
    a size for a size the variant was tested at, so the shape is read from blockDim."""
    ctx = inline(FILTER.replace("n = 1000000, 1001", "n = 1000000, 256"), "fir7")
    proposals = propose(ctx)
    assert proposals[0].params["block"] == (256, 1)
    for p in proposals:
        cand = variant(ctx, p)
        assert hardcoded_constants(ctx.source, cand.source, "fir7", ctx.spec) == []


@needs_gxx
def test_the_check_catches_a_tile_read_one_cell_off(tmp_path):
    ctx = inline(MAXPOOL, "maxpool2x2")
    (first, *_) = propose(ctx)
    broken = first.variant.text.replace("[threadIdx.x + (", "[threadIdx.x + 1 + (", 1)
    assert broken != first.variant.text
    cand = Context.of(Variant(broken), ctx.source.path, ctx.kernel.name)
    assert run_against(ctx, [cand], [{"N": 2, "C": 3, "H": 10, "W": 22}], tmp_path)[0] > 0


def test_a_strided_windows_tile_keeps_its_columns_by_phase():
    """A 2 x 2 pool at stride 2: a warp's threads read columns 2 apart at each tap, a 2-way bank
    conflict in a plain row; the tile keeps each row's even and odd columns apart, and each tap
    reads one phase's consecutive words."""
    ctx = inline(MAXPOOL, "maxpool2x2")
    (first, *_) = propose(ctx)
    text = first.variant.text
    assert re.search(r"__shared__ float optiml_tile0\[\d+\]\[2\]\[\d+\];", text), text
    assert "[optiml_c % 2][optiml_c / 2] = " in text
    assert re.search(r"\[\(1 \* optiml_k\d+ \+ 0\) % 2\]\[threadIdx\.x \+ \(", text), text
    # a window at stride 1 keeps plain rows
    stride_1 = inline(FILTER, "fir7")
    assert "% 1]" not in propose(stride_1)[0].variant.text


@needs_kb
@needs_nvcc
@pytest.mark.parametrize("n", [42, 46, 82])
def test_proposals_compile_for_sm_90(n):
    ctx = task(n)
    for p in propose(ctx):
        out = variant(ctx, p)
        build = build_kernel(
            out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
        )
        assert build.ok, build.log
        r = build.resources
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0
