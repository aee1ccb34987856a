"""`column_reduce`, a column reduction scheduled from the lifted model: on kernels that reduce down
columns one thread per column, whatever their spelling (a `while` loop, `size_t` or unsigned
indices, a pointer to the column, two passes where the second uses the first's result, several
outputs, int min, half inputs, a matrix-vector product down the columns), it proposes columns along
x with 16-byte loads and the rows split over the block and a cluster; each proposal equals its
original when run as host C++ (clusters' blocks at once, shared memory per block), compiles for
sm_90 without spills, and kernels that are not column reductions get none. On a GPU,
tests/search/test_gpu_schedules.py runs them through the harness."""

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
COLUMNS = by_name("column_reduce")
# (file, kernel, host sizes): rows past every cluster's share (8 blocks x 64 rows of threads), a
# column count that is not a multiple of the vector and one that is
HOST = [
    ("fixtures/wild/colsum.cu", "column_sum", [(601, 77), (40, 64)]),
    ("fixtures/corpus/gemv_t.cu", "gemvTranspose", [(601, 77), (40, 64)]),
    ("tests/data/schedules/col_stats.cu", "feature_stats", [(601, 77), (40, 64)]),
    ("tests/data/schedules/col_std.cu", "col_std", [(601, 70), (40, 64)]),
    ("tests/data/schedules/col_min_int.cu", "columnMinLabel", [(601, 67), (40, 64)]),
    # over the middle axis of [B, K, C], batches on z (sizes B, K, C)
    ("tests/data/schedules/middle_axis.cu", "mean_dim1", [(3, 601, 77), (2, 40, 64)]),
    ("tests/data/schedules/middle_axis.cu", "max_dim1", [(2, 900, 37), (3, 40, 64)]),
]
BATCHED = [("tests/data/schedules/middle_axis.cu", k) for k in ("mean_dim1", "max_dim1")]
COLUMN_KERNELS = [(f, k) for f, k, _ in HOST if (f, k) not in BATCHED] + [
    ("fixtures/corpus/bias_grad.cu", "bias_backward_naive")
]
NOT_COLUMNS = [
    ("fixtures/saxpy.cu", "saxpy"),
    ("fixtures/softmax.cu", "softmax_rows"),
    ("fixtures/wild/row_mean.cu", "row_mean"),
    ("fixtures/wild/gemv.cu", "gemv"),
    ("fixtures/sgemm.cu", "sgemm_naive"),
    ("fixtures/transpose.cu", "transpose_naive"),
    ("fixtures/histogram.cu", "histogram_global"),
    ("fixtures/corpus/stencil1d.cu", "stencil_1d"),
    ("fixtures/corpus/cumsum_exclusive.cu", "exclusive_scan_rows"),
    ("fixtures/corpus/embedding_pos.cu", "encoder_forward_kernel"),
]


def context(file: str, kernel: str) -> Context:
    path = ROOT / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


@pytest.mark.parametrize("file,kernel", COLUMN_KERNELS, ids=[k for _, k in COLUMN_KERNELS])
def test_a_column_reduction_gets_coalesced_columns_and_split_rows(file, kernel):
    proposals = COLUMNS.propose(context(file, kernel))
    assert [p.params["cluster"] > 1 for p in proposals] == [True, True, False]
    first = proposals[0]
    text = first.variant.text
    v = SourceFile(text, str(ROOT / file))
    spec = parse_spec(v, v.kernel(kernel))
    # a 2-D launch: column tiles along x, the cluster's blocks along y
    assert spec.launch.grid[0].startswith("cdiv(") and spec.launch.grid[1] == str(
        first.params["cluster"]
    )
    assert f"cluster_dims(1, {first.params['cluster']}, 1)" in text
    assert "__cluster_map_shared_rank" in text and "atomic" not in text
    # coalesced: the widened load's address moves with the thread's first column by one
    assert first.params["vector"] > 1
    load = re.search(r"reinterpret_cast<const \w+\*>\((\w+) \+ \((.*)\)\);", text)
    assert load is not None and "1LL * optiml_c0" in load.group(2)


@pytest.mark.parametrize("file,kernel", BATCHED, ids=[k for _, k in BATCHED])
def test_a_reduction_over_the_middle_axis_gets_its_batches_on_z(file, kernel):
    """One thread per (batch, column) on a flat index taken apart by / and %: the columns go
    along x as in a matrix, a batch per blockIdx.z, the index rebuilt as batch * C + column."""
    proposals = COLUMNS.propose(context(file, kernel))
    assert proposals
    text = proposals[0].variant.text
    v = SourceFile(text, str(ROOT / file))
    spec = parse_spec(v, v.kernel(kernel))
    assert spec.launch.grid[0] == f"cdiv(C, {proposals[0].params['tx'] * 4})"
    assert spec.launch.grid[2] == "B" and "const int optiml_batch = blockIdx.z;" in text
    # 16-byte loads along the column, the batch's offset beside them
    load = re.search(r"reinterpret_cast<const \w+\*>\((\w+) \+ \((.*)\)\);", text)
    assert load is not None and "1LL * optiml_c0" in load.group(2)
    assert "optiml_batch" in load.group(2)
    # the few long columns of max_dim1 (2 x 64) are split over a cluster; mean_dim1's 128
    # batches of 4095 columns fill the GPU without one
    assert (proposals[0].params["cluster"] > 1) == (kernel == "max_dim1")
    # more batches than a grid's z holds: none
    path = ROOT / file
    many = path.read_text().replace("(2, 1 << 20, 64)", "(70000, 64, 64)")
    many = many.replace("(128, 4096, 4095)", "(70000, 64, 64)")
    assert COLUMNS.propose(Context.of(Variant(many), str(path), kernel)) == []


@pytest.mark.parametrize("file,kernel", NOT_COLUMNS, ids=[k for _, k in NOT_COLUMNS])
def test_other_kernels_get_none(file, kernel):
    assert COLUMNS.propose(context(file, kernel)) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,sizes", HOST, ids=[k for _, k, _ in HOST])
def test_proposals_equal_the_original_on_the_host(file, kernel, sizes, tmp_path):
    original = context(file, kernel)
    proposals = COLUMNS.propose(original)
    assert proposals
    candidates = [Context.of(p.variant, str(ROOT / file), kernel) for p in proposals]
    names = original.spec.size_vars
    cases = [dict(zip(names, s, strict=True)) for s in sizes]
    assert run_against(original, candidates, cases, tmp_path) == [0] * len(proposals)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_host_check_sees_a_block_left_out(tmp_path):
    """The host run can fail: where the cluster's last block is left out of the combination, its
    rows are missing from every column."""
    file, kernel, sizes = HOST[0]
    original = context(file, kernel)
    proposal = COLUMNS.propose(original)[0]
    cluster = proposal.params["cluster"]
    candidate = Context.of(proposal.variant, str(ROOT / file), kernel)
    bad = run_against(
        original,
        [candidate],
        [dict(zip(original.spec.size_vars, sizes[0], strict=True))],
        tmp_path,
        prepare=lambda text: text.replace(f"optiml_r < {cluster}", f"optiml_r < {cluster - 1}"),
    )
    assert bad[0] > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "file,kernel", COLUMN_KERNELS + BATCHED, ids=[k for _, k in COLUMN_KERNELS + BATCHED]
)
def test_proposals_compile_for_sm90_without_spills(file, kernel):
    for p in COLUMNS.propose(context(file, kernel))[:1]:
        v = SourceFile(p.variant.text, str(ROOT / file))
        k = v.kernel(kernel)
        b = build_kernel(
            v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90", mode="cubin"
        )
        assert b.ok, b.log[-2000:]
        assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0
