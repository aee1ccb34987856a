"""column_scan: a running sum, product, max or min down the columns of a leading axis (one thread
per column walking the rows), split into chunks over the block's y threads — checked against the
originals as host C++, and refused where the loop is not such a scan."""

from __future__ import annotations

import shutil

import pytest

from optiml.cuda.source import SourceFile
from optiml.harness.build import build_kernel
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.host_cuda import run_against
from tests.support import FIXTURES

SCAN = by_name("column_scan")

SCANS = {
    # torch.cumsum(x, dim=1) of a (B, T, C) tensor, as fixtures/corpus's half one, in float
    "cumsum_dim1": """
/* @optiml
 *   args:   x: in float[B * T * C], y: out float[B * T * C]
 *   launch: grid = (cdiv(C, 128), B), block = 128
 *   sizes:  B, T, C = (8, 1024, 512), (3, 37, 45)
 *   tol:    rtol = 1e-4, atol = 1e-4
 */
__global__ void cumsum_dim1(const float* x, float* y, int B, int T, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (c >= C) return;
    float s = 0.f;
    for (int t = 0; t < T; t++) {
        long long off = ((long long)b * T + t) * C + c;
        s += x[off];
        y[off] = s;
    }
}
""",
    # a running maximum down the rows of a (T, C) matrix, 1-D launch, stored before the update
    "cummax_dim0": """
/* @optiml
 *   args:   x: in float[T * C], y: out float[T * C]
 *   launch: grid = cdiv(C, 256), block = 256
 *   sizes:  T, C = (2048, 4096), (29, 70)
 */
__global__ void cummax_dim0(const float* x, float* y, int T, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        float m = -INFINITY;
        for (int t = 0; t < T; ++t) {
            m = fmaxf(m, x[t * C + c]);
            y[t * C + c] = 2.0f * m;
        }
    }
}
""",
}


def context(name: str, text: str | None = None) -> Context:
    return Context.of(Variant(text or SCANS[name]), str(FIXTURES / "kernel.cu"), name)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("name", sorted(SCANS))
def test_a_scan_down_the_columns_is_split_into_chunks_that_compute_the_same(name, tmp_path):
    ctx = context(name)
    proposals = SCAN.propose(ctx)
    assert [p.params["chunks"] for p in proposals] == [8, 16]
    text = proposals[0].variant.text
    assert "__syncthreads();" in text and "block = (32, 8)" in text
    names = ctx.spec.size_vars
    sizes = [
        dict(zip(names, v, strict=True))
        for v in (([3, 37, 45], [2, 5, 33]) if len(names) == 3 else ([29, 70], [9, 31]))
    ]
    candidates = [Context.of(p.variant, ctx.source.path, name) for p in proposals]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0, 0]


@pytest.mark.parametrize(
    "old,new",
    [
        # the running value read back from the output: not a scan of the input alone
        ("s += x[off];", "s += x[off] + (t > 0 ? y[off - C] : 0.f);"),
        # a store at another column
        ("y[off] = s;", "y[off - c] = s;"),
        # a loop that does not step by one
        ("t++", "t += 2"),
        # a store of every other step only
        ("y[off] = s;", "if (t % 2 == 0) y[off] = s;"),
    ],
    ids=["reads-output", "other-column", "stride-2", "some-steps"],
)
def test_refused(old, new):
    text = SCANS["cumsum_dim1"].replace(old, new)
    assert text != SCANS["cumsum_dim1"]
    assert SCAN.propose(context("cumsum_dim1", text)) == []


def test_scans_along_the_row_are_warp_rows_work():
    # one thread per row walking its contiguous row: the column does not move one for one
    path = FIXTURES / "holdout" / "cumsum_rows.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "cumsum_rows")
    assert SCAN.propose(ctx) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_half_cumsum_of_the_corpus_compiles_without_spills():
    path = FIXTURES / "corpus" / "cumsum_time_fp16.cu"
    ctx = Context.of(Variant(path.read_text()), str(path), "cumsum_dim1_half")
    p = SCAN.propose(ctx)[0]
    v = SourceFile(p.variant.text, str(path))
    k = v.kernel("cumsum_dim1_half")
    b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0
