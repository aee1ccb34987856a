"""tile_stencil: a 2-D stencil's input goes through a shared-memory tile with its halo. It proposes
on the Jacobi fixture and on stencils written other ways (a padded array, a 9-point stencil, a
template), each proposal compiles for sm_90 without spills and reads its neighbours from shared
memory, and it proposes nothing where the reads are not one grid shifted by small constants or
the input is also written."""

from __future__ import annotations

import re
import shutil

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from tests.support import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

PADDED_9POINT = """
/* @optiml
 *   args:   src: in float[(H + 2) * (W + 2)], dst: out float[H * W], c0 = 0.5, c1 = 0.125
 *   launch: grid = (cdiv(W, 16), cdiv(H, 16)), block = (16, 16)
 *   sizes:  H, W = (2048, 4096), (333, 517)
 */
__global__ void smooth9(const float *src, float *dst, int H, int W, float c0, float c1) {
  const int x = threadIdx.x + blockIdx.x * blockDim.x;
  const int y = threadIdx.y + blockIdx.y * blockDim.y;
  if (x >= W || y >= H) return;
  const int P = W + 2;
  const int c = (y + 1) * P + (x + 1);  // the centre, inside the padding
  float s = 0.f;
  s += src[c - P - 1] + src[c - P] + src[c - P + 1];
  s += src[c - 1] + src[c + 1];
  s += src[c + P - 1] + src[c + P] + src[c + P + 1];
  dst[y * W + x] = c0 * src[c] + c1 * s;
}
"""

TEMPLATED = """
/* @optiml
 *   args:   a: in T[n * n], b: out T[n * n]
 *   launch: grid = (cdiv(n, 32), cdiv(n, 8)), block = (32, 8)
 *   sizes:  n = 4096, 1000
 *   template: T = float
 */
template <typename T>
__global__ void cross5(const T* a, T* b, int n)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < n && c < n) {
        T v = a[r * n + c];
        if (r > 1 && c > 1 && r < n - 2 && c < n - 2)
            v += a[(r - 2) * n + c] + a[(r + 2) * n + c] + a[r * n + c - 2] + a[r * n + c + 2];
        b[r * n + c] = v;
    }
}
"""


def context(text: str, kernel: str) -> Context:
    return Context.of(Variant(text), str(FIXTURES / "kernel.cu"), kernel)


def propose(ctx: Context):
    return by_name("tile_stencil").propose(ctx)


def compiled(ctx: Context, proposal) -> Context:
    out = Context.of(proposal.variant, ctx.source.path, ctx.kernel.name)
    build = build_kernel(out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90")
    assert build.ok, build.log
    r = build.resources
    assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0)
    assert r.static_smem_bytes > 0 and r.barriers == 1
    return out


@needs_nvcc
def test_jacobi_reads_every_neighbour_from_the_tile():
    ctx = context((FIXTURES / "stencil2d.cu").read_text(), "jacobi_step")
    proposals = propose(ctx)
    assert [p.params["block"] for p in proposals] == [(32, 8), (32, 16), (64, 4)]
    for p in proposals:
        out = compiled(ctx, p)
        bx, by = p.params["block"]
        body = out.definition
        assert f"__shared__ float u_tile[{by + 2}][{bx + 2}];" in body
        # Five reads of u served by the tile (centre and four neighbours), one tile store.
        assert len(re.findall(r"u_tile\[threadIdx\.y \+ \d\]\[threadIdx\.x \+ \d\]", body)) == 5
        assert f"grid = (cdiv(cols, {bx}), cdiv(rows, {by})), block = ({bx}, {by})" in out.comment
        # The neighbours that may leave the rectangle keep their global read as the fallback.
        assert "i >= 1 ?" in body and "j + 1 < cols ?" in body


@needs_nvcc
@pytest.mark.parametrize(
    "text,kernel,tile,reads",
    [
        # Offsets 0..2 from (x, y) in a (W + 2)-wide array (the padding's shift of one is part
        # of the offset): a (8 + 2) x (32 + 2) tile, nine reads from it.
        (PADDED_9POINT, "smooth9", "__shared__ float src_tile[10][34];", 9),
        # Radius 2 along both axes, element type a template parameter: centre and four reads.
        (TEMPLATED, "cross5", "__shared__ T a_tile[12][36];", 5),
    ],
    ids=["padded-9-point", "templated-radius-2"],
)
def test_stencils_written_other_ways(text, kernel, tile, reads):
    ctx = context(text, kernel)
    proposals = propose(ctx)
    assert proposals
    out = compiled(ctx, proposals[0])
    assert tile in out.definition
    name = tile.split()[-1].split("[")[0]
    assert out.definition.count(f"{name}[threadIdx.y") == reads


@pytest.mark.parametrize(
    "why,text,kernel",
    [
        (
            "the input is written too (in place)",
            (FIXTURES / "stencil2d.cu")
            .read_text()
            .replace("u: in float", "u: inout float")
            .replace("const float* u", "float* u")
            .replace("u_new[idx] = u[idx];", "u[idx] = u[idx];"),
            "jacobi_step",
        ),
        (
            "a transpose: reads strided along x",
            (FIXTURES / "transpose.cu").read_text(),
            "transpose_naive",
        ),
        (
            "one offset only: an elementwise kernel",
            (FIXTURES / "wild" / "bias_add.cu").read_text(),
            "add_bias_cols",
        ),
        (
            "an offset beyond the radius",
            (FIXTURES / "stencil2d.cu").read_text().replace("u[idx + 1]", "u[idx + 9]"),
            "jacobi_step",
        ),
        (
            "clamped indices through a helper: not affine",
            (FIXTURES / "wild" / "laplacian5.cu").read_text(),
            "laplacian5",
        ),
    ],
)
def test_not_proposed(why, text, kernel):
    assert propose(context(text, kernel)) == [], why
