"""`gather_rows`, a gather by rows scheduled from the lifted model: on one-thread-per-element
kernels that read a row number at `g / D` (an embedding plus a position row; a scaled token row
plus a segment row, the column spelled as what is left of the row), it proposes a warp per row with
the row number loaded once and 16-byte copies; each proposal equals its original as host C++ at
sizes with and without whole vectors, compiles for sm_90 without spills, and kernels that gather
nothing by rows get none. On a GPU, tests/search/test_gpu_schedules.py runs them through the
harness."""

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

ROOT = Path(__file__).resolve().parents[2]
GATHER = by_name("gather_rows")
HOST = [
    ("fixtures/corpus/embedding_pos.cu", "encoder_forward_kernel", [(3, 37, 75), (2, 5, 64)]),
    ("tests/data/schedules/embed_scaled.cu", "embed_scaled", [(77, 50, 36), (9, 50, 37)]),
]
NOT_GATHERS = [
    ("fixtures/saxpy.cu", "saxpy"),
    ("fixtures/wild/colsum.cu", "column_sum"),
    ("fixtures/corpus/permute_heads.cu", "unpermute_heads"),
    ("fixtures/corpus/embedding_backward.cu", "encoder_backward_kernel"),
    ("fixtures/histogram.cu", "histogram_global"),
    ("fixtures/softmax.cu", "softmax_rows"),
    # torch.gather along a dimension: the row number read from memory moves with the column, so
    # there is no row to copy (measured on the H200, a warp per row was 0.89x and 0.03x)
    ("fixtures/corpus/gather_dim1.cu", "gather_cols"),
    ("fixtures/holdout/gather_dim1.cu", "gather_dim1"),
]


def context(file: str, kernel: str) -> Context:
    path = ROOT / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


@pytest.mark.parametrize("file,kernel,sizes", HOST, ids=[k for _, k, _ in HOST])
def test_a_gather_gets_a_warp_per_row_with_the_row_number_loaded_once(file, kernel, sizes):
    proposals = GATHER.propose(context(file, kernel))
    assert [p.params["threads"] for p in proposals] == [256, 128]
    text = proposals[0].variant.text
    body = text[text.index(kernel) :]
    # the row number: one load per row, before the loop over the row's columns
    hoisted = re.findall(r"const int optiml_h\d+ = (\w+)\[optiml_row\];", body)
    assert hoisted and body.index("optiml_h0 =") < body.index("for (long long optiml_c")
    assert "optiml_c0 += 128" in body and "reinterpret_cast<const uint4*>" in body
    v = SourceFile(text, str(ROOT / file))
    spec = parse_spec(v, v.kernel(kernel))
    assert spec.launch.block == ["256"] and spec.launch.grid[0].startswith("cdiv(cdiv(")


@pytest.mark.parametrize("file,kernel", NOT_GATHERS, ids=[k for _, k in NOT_GATHERS])
def test_other_kernels_get_none(file, kernel):
    assert GATHER.propose(context(file, kernel)) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,sizes", HOST, ids=[k for _, k, _ in HOST])
def test_proposals_equal_the_original_on_the_host(file, kernel, sizes, tmp_path):
    original = context(file, kernel)
    candidates = [Context.of(p.variant, str(ROOT / file), kernel) for p in GATHER.propose(original)]
    cases = [dict(zip(original.spec.size_vars, s, strict=True)) for s in sizes]
    assert run_against(original, candidates, cases, tmp_path) == [0, 0]
    # and the check can fail: a row number read one row early (in bounds: one row late would read
    # past the index buffer's end, whose outcome is undefined)
    early = run_against(
        original,
        candidates[:1],
        cases,
        tmp_path,
        prepare=lambda t: t.replace("[optiml_row];", "[optiml_row > 0 ? optiml_row - 1 : 0];", 1),
    )
    assert early[0] > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "file,kernel",
    [(f, k) for f, k, _ in HOST],
)
def test_the_first_proposal_compiles_for_sm90_without_spills(file, kernel):
    p = GATHER.propose(context(file, kernel))[0]
    v = SourceFile(p.variant.text, str(ROOT / file))
    k = v.kernel(kernel)
    b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0


# Row numbers out of range give a zero row: two stores under complementary conditions.
CHECKED = """
/* @optiml
 *   args:   ids: in int[T] in [-3, 40), table: in float[V * D], out: out float[T * D], V = 37
 *   launch: grid = cdiv(T * D, 128), block = 128
 *   sizes:  T, D = (4096, 768), (29, 12)
 */
__global__ void checked_lookup(const int* ids, const float* table, float* out, int T, int D,
                               int V)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * D) return;
    int id = ids[i / D];
    if (id < 0 || id >= V) {
        out[i] = 0.0f;
        return;
    }
    out[i] = table[id * D + i % D];
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_bounds_checked_lookup_reads_the_table_only_for_rows_in_range(tmp_path):
    ctx = Context.of(Variant(CHECKED), str(ROOT / "fixtures" / "kernel.cu"), "checked_lookup")
    proposals = GATHER.propose(ctx)
    assert proposals and all(p.params["vector"] == 1 for p in proposals)
    text = proposals[0].variant.text
    assert "reinterpret_cast" not in text  # no wide read of a row that may not exist
    candidates = [Context.of(p.variant, ctx.source.path, "checked_lookup") for p in proposals]
    sizes = [{"T": 29, "D": 12}, {"T": 40, "D": 33}]
    assert run_against(ctx, candidates, sizes, tmp_path) == [0] * len(candidates)
