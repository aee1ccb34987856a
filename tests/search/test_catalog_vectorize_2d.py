"""vectorize_2d: 4 columns x R rows per thread, each input row segment one 16-byte load shared by
the elements that read it, each output row of 4 one 16-byte store. It proposes on the Jacobi
fixture and on 2-D kernels written other ways (a padded 9-point stencil, a templated radius-2
stencil, an elementwise matrix add), every proposal compiles for sm_90 without spills or warnings
and computes what the original computes (run as host C++, at sizes that take the vector path and
sizes that don't), and it proposes nothing where an output could be left unwritten, is read, or is
written elsewhere than (x, y)."""

from __future__ import annotations

import re
import shutil

import pytest

from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from tests.host_cuda import run_against
from tests.search.test_catalog_stencil import PADDED_9POINT, TEMPLATED
from tests.support import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

JACOBI = (FIXTURES / "stencil2d.cu").read_text()
MATADD = (FIXTURES / "wild" / "matadd.cu").read_text()


def context(text: str, kernel: str) -> Context:
    return Context.of(Variant(text), str(FIXTURES / "kernel.cu"), kernel)


def propose(ctx: Context):
    return by_name("vectorize_2d").propose(ctx)


@needs_nvcc
def test_jacobi_loads_each_row_segment_once():
    ctx = context(JACOBI, "jacobi_step")
    proposals = propose(ctx)
    assert [(p.params["rows"], p.params["block"]) for p in proposals] == [
        (2, (32, 8)),
        (1, (32, 8)),
        (4, (64, 4)),
        (4, (32, 8)),
    ]
    for p in proposals:
        out = Context.of(p.variant, ctx.source.path, ctx.kernel.name)
        build = build_kernel(
            out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
        )
        assert build.ok, build.log
        assert "warning" not in build.log.lower(), build.log
        r = build.resources
        assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0)
        rows, (bx, by) = p.params["rows"], p.params["block"]
        assert f"grid = (cdiv(cols, {4 * bx}), cdiv(rows, {by * rows}))" in out.comment
        body = out.definition
        split = body.index("\n    } else {")  # the kernel's own level: fast path, then the rest
        fast = body[:split]
        # Rows i0 - 1 .. i0 + rows, each one vector; the left and right neighbours of the
        # thread's own rows single loads; one vector store per row; no other access of u.
        assert len(re.findall(r"const float4 u_r\w+ = \*reinterpret_cast", fast)) == rows + 2
        assert len(re.findall(r"const float u_r\w+_c(m1|4) = ", fast)) == 2 * rows
        assert fast.count("*reinterpret_cast<float4*>(u_new + ") == rows
        assert "u[" not in fast and "u_new[" not in fast
        # The original's statements, unchanged, on the other path.
        assert (
            "u_new[idx] = 0.25f * (u[idx - cols] + u[idx + cols] + u[idx - 1] + u[idx + 1]);"
            in (body[body.index("} else {") :])
        )


# Weights read at fixed indices (the same in every thread) stay as written; the image is vectorized.
WEIGHTED = """
/* @optiml
 *   args:   img: in float[h * w], wts: in float[3], out: out float[h * w]
 *   launch: grid = (cdiv(w, 16), cdiv(h, 16)), block = (16, 16)
 *   sizes:  h, w = (1024, 2048), (100, 77)
 */
__global__ void smooth_rows(const float* img, const float* wts, float* out, int h, int w)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) {
        float s = wts[1] * img[y * w + x];
        if (x > 0) s += wts[0] * img[y * w + x - 1];
        if (x < w - 1) s += wts[2] * img[y * w + x + 1];
        out[y * w + x] = s;
    }
}
"""

CASES = [
    # (text, kernel, sizes: some take the vector path (x bound a multiple of 4), some not)
    (JACOBI, "jacobi_step", [(20, 36), (37, 70), (9, 12), (16, 33)]),
    (PADDED_9POINT, "smooth9", [(12, 38), (17, 30), (20, 36)]),
    (TEMPLATED, "cross5", [(36,), (40,), (37,)]),
    (MATADD, "matAdd", [(36, 20), (20, 36), (13, 7)]),
    (WEIGHTED, "smooth_rows", [(12, 40), (9, 30)]),
]


@needs_gxx
@pytest.mark.parametrize(
    "text,kernel,sizes",
    CASES,
    ids=["jacobi", "padded-9-point", "templated-radius-2", "matadd", "weights"],
)
def test_every_proposal_computes_what_the_original_does(text, kernel, sizes, tmp_path):
    original = context(text, kernel)
    proposals = propose(original)
    assert proposals
    names = original.spec.size_vars
    if sizes is None:
        sizes = [(36, 20), (20, 36), (13, 7)][:3] if len(names) == 2 else [(64,), (37,)]
    cases = [dict(zip(names, s, strict=True)) for s in sizes]
    candidates = [Context.of(p.variant, original.source.path, kernel) for p in proposals]
    assert run_against(original, candidates, cases, tmp_path) == [0] * len(proposals)


@needs_nvcc
@pytest.mark.parametrize(
    "text,kernel",
    [(c[0], c[1]) for c in CASES[1:]],
    ids=["padded-9-point", "templated-radius-2", "matadd", "weights"],
)
def test_every_proposal_compiles_clean(text, kernel):
    """No spills and no warnings: an element's x or y that its statements no longer read (the
    loads that used it are registers now) is not declared."""
    original = context(text, kernel)
    for p in propose(original):
        out = Context.of(p.variant, original.source.path, kernel)
        build = build_kernel(
            out.source, out.kernel, instantiation=out.spec.instantiation, arch="sm_90", mode="cubin"
        )
        assert build.ok, build.log
        assert "warning" not in build.log.lower(), build.log
        assert build.resources.spill_store_bytes == build.resources.stack_bytes == 0


@needs_gxx
def test_a_wrong_lane_is_caught(tmp_path):
    """The host check above can fail: a proposal whose second column reads its left neighbour
    from the wrong lane differs from the original wherever the vector path runs."""
    original = context(JACOBI, "jacobi_step")
    p = propose(original)[0]
    broken = p.variant.text.replace(
        "(u_rm1.y + u_r1.y + u_r0.x + u_r0.z)", "(u_rm1.y + u_r1.y + u_r0.w + u_r0.z)"
    )
    assert broken != p.variant.text
    candidate = Context.of(Variant(broken, p.variant.flags), original.source.path, "jacobi_step")
    [bad] = run_against(original, [candidate], [{"rows": 20, "cols": 36}], tmp_path)
    assert bad > 0


@pytest.mark.parametrize(
    "why,text,kernel",
    [
        (
            "an output written on one branch only",
            JACOBI.replace("u_new[idx] = u[idx];", "/* left alone */"),
            "jacobi_step",
        ),
        (
            "an output also read (accumulated into)",
            JACOBI.replace("u_new: out float", "u_new: inout float").replace(
                "u_new[idx] = 0.25f *", "u_new[idx] += 0.25f *"
            ),
            "jacobi_step",
        ),
        (
            "an output written at a neighbour",
            JACOBI.replace("u_new[idx] = u[idx];", "u_new[idx + 1] = u[idx];"),
            "jacobi_step",
        ),
        (
            "a write that returns early",
            JACOBI.replace("u_new[idx] = u[idx];", "u_new[idx] = u[idx];\n        return;"),
            "jacobi_step",
        ),
        (
            "weights read at an index that differs between threads",
            WEIGHTED.replace("wts[1] * img", "wts[x % 3] * img"),
            "smooth_rows",
        ),
        (
            "a transpose: reads strided along x",
            (FIXTURES / "transpose.cu").read_text(),
            "transpose_naive",
        ),
        (
            "8-byte elements",
            JACOBI.replace("float", "double").replace("0.25f", "0.25"),
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
