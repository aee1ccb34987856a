"""`permute_tiles`, a permutation of any rank scheduled from the lifted model: the thread index
read as coordinates along axes (divisions and remainders of a 1-D index, or the dimensions of a
2-D/3-D launch), the two axes that trade contiguity tiled through padded shared memory, or 16-byte
copies along a kept fastest axis. Each proposal equals its original as host C++ at sizes with and
without whole tiles and vectors, compiles for sm_90 without spills, and kernels that permute
nothing get none. On a GPU, tests/search/test_gpu_schedules.py runs them through the harness."""

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
from tests.host_cuda import proposals_check

ROOT = Path(__file__).resolve().parents[2]
PERMUTE = by_name("permute_tiles")
# (file, kernel, mode, host sizes): "tile" where the output's and input's fastest axes differ
HOST = [
    ("fixtures/corpus/nchw_to_nhwc.cu", "nchw2nhwc", "tile", [(2, 37, 45), (1, 64, 32)]),
    ("fixtures/corpus/transpose_half.cu", "transposeNaiveHalf", "tile", [(70, 33), (64, 96)]),
    ("tests/data/schedules/permute_021_src.cu", "transpose_last_two", "tile", [(2, 45, 70)]),
    ("tests/data/schedules/nhwc_to_nchw_half.cu", "nhwc_to_nchw", "tile", [(2, 19, 50)]),
    ("fixtures/corpus/permute_heads.cu", "unpermute_heads", "kept", [(2, 3, 5)]),
    ("fixtures/corpus/split_qkv.cu", "permute_qkv", "kept", [(2, 3, 128), (1, 2, 192)]),
    ("fixtures/contract/permute4d.cu", "permute4d", "kept", [(2, 3, 5, 8), (3, 7, 2, 17)]),
    (
        "tests/data/schedules/split_heads_2d.cu",
        "split_heads",
        "kept",
        [(2, 7, 3, 10), (1, 5, 2, 36)],
    ),
]
NOT_PERMUTATIONS = [
    ("fixtures/saxpy.cu", "saxpy"),
    ("fixtures/wild/colsum.cu", "column_sum"),
    ("fixtures/corpus/embedding_pos.cu", "encoder_forward_kernel"),
    ("fixtures/corpus/index_add.cu", "indexAddRows"),
    ("fixtures/histogram.cu", "histogram_global"),
    ("fixtures/softmax.cu", "softmax_rows"),
    ("fixtures/corpus/scale_clamp.cu", "scale_clamp"),
]


def context(file: str, kernel: str) -> Context:
    path = ROOT / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


def body_of(p, kernel: str) -> str:
    text = p.variant.text
    return text[text.index(f"void {kernel}") :]


@pytest.mark.parametrize("file,kernel,mode,sizes", HOST, ids=[k for _, k, _, _ in HOST])
def test_the_schedule_follows_the_axes_that_trade_contiguity(file, kernel, mode, sizes):
    proposals = PERMUTE.propose(context(file, kernel))
    assert proposals, "no proposal"
    body = body_of(proposals[0], kernel)
    v = SourceFile(proposals[0].variant.text, str(ROOT / file))
    spec = parse_spec(v, v.kernel(kernel))
    if mode == "tile":
        assert [p.params["tile"] for p in proposals] == [32, 64]
        # a padded tile per staged load, read with lanes along one axis and written along the other
        assert re.search(r"__shared__ \w+ optiml_s0\[32\]\[33\];", body)
        assert "__syncthreads();" in body and "optiml_s0[optiml_j][optiml_i]" in body
        assert spec.launch.block == ["256"] and spec.launch.grid[0].startswith("cdiv(")
    else:
        assert [p.params["threads"] for p in proposals] == [256, 128]
        assert proposals[0].params["vector"] == 4
        assert "reinterpret_cast<const uint4*>" in body and "__shared__" not in body
    # the index arithmetic is the coordinates': no division of the thread index per element
    per_element = body[body.index("for (int optiml_j") :]
    assert "blockIdx" not in per_element and "threadIdx" not in per_element


@pytest.mark.parametrize("file,kernel", NOT_PERMUTATIONS, ids=[k for _, k in NOT_PERMUTATIONS])
def test_other_kernels_get_none(file, kernel):
    assert PERMUTE.propose(context(file, kernel)) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,mode,sizes", HOST, ids=[k for _, k, _, _ in HOST])
def test_proposals_equal_the_original_on_the_host(file, kernel, mode, sizes, tmp_path):
    # the check can fail: the tile's rows read in swapped pairs, or each thread's vector one
    # element late
    proposals_check(
        PERMUTE,
        context(file, kernel),
        sizes,
        tmp_path,
        lambda t: re.sub(
            r"(optiml_\w+) \*= 4;",
            r"\1 = \1 * 4 + 1;",
            t.replace("optiml_a0 + optiml_i;", "optiml_a0 + (optiml_i ^ 1);", 1),
        ),
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "file,kernel", [HOST[0][:2], HOST[1][:2], HOST[3][:2], HOST[5][:2], HOST[6][:2]]
)
def test_the_proposals_compile_for_sm90_without_spills(file, kernel):
    for p in PERMUTE.propose(context(file, kernel)):
        v = SourceFile(p.variant.text, str(ROOT / file))
        k = v.kernel(kernel)
        b = build_kernel(
            v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90", mode="cubin"
        )
        assert b.ok, b.log[-2000:]
        assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0
