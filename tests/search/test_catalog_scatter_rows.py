"""`scatter_rows`, a scatter-add by rows scheduled from the lifted model: on kernels that add a
source row into a row chosen by an index loaded from memory (index_add in 2-D, an embedding's
backward with a second, positional add, a flat 64-bit spelling), it proposes the row's elements
along consecutive threads with float4 atomics where the addresses allow, and scalar atomics for
GPUs before sm_90; each proposal equals its original as host C++ (repeated indices, rows with and
without whole vectors; sums within the spec's tolerance), compiles for sm_90 without spills, and
kernels that scatter-add nothing by rows get none. On a GPU, tests/search/test_gpu_schedules.py
runs them through the harness."""

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
SCATTER = by_name("scatter_rows")
HOST = [
    ("fixtures/corpus/index_add.cu", "indexAddRows", [(7, 40, 64), (5, 31, 67)]),
    ("fixtures/corpus/embedding_backward.cu", "encoder_backward_kernel", [(2, 5, 36), (3, 4, 10)]),
    ("tests/data/schedules/embedding_grad_flat.cu", "embedding_grad", [(77, 13, 36), (40, 7, 33)]),
]
NOT_SCATTERS = [
    ("fixtures/saxpy.cu", "saxpy"),
    ("fixtures/histogram.cu", "histogram_global"),
    ("fixtures/corpus/embedding_pos.cu", "encoder_forward_kernel"),
    ("fixtures/corpus/permute_heads.cu", "unpermute_heads"),
    ("fixtures/wild/colsum.cu", "column_sum"),
]


def context(file: str, kernel: str) -> Context:
    path = ROOT / file
    return Context.of(Variant(path.read_text()), str(path), kernel)


@pytest.mark.parametrize("file,kernel,sizes", HOST, ids=[k for _, k, _ in HOST])
def test_a_scatter_add_gets_vector_atomics_along_the_row(file, kernel, sizes):
    proposals = SCATTER.propose(context(file, kernel))
    assert [(p.params["vector"], p.params["threads"]) for p in proposals] == [
        (4, 256),
        (4, 128),
        (1, 256),
    ]
    text = proposals[0].variant.text
    body = text[text.index(f"void {kernel}") :]
    assert re.search(r"atomicAdd\(reinterpret_cast<float4\*>\(\w+ \+ ", body)
    assert "make_float4(" in body and "reinterpret_cast<const uint4*>" in body
    scalar = proposals[2].variant.text
    assert "float4" not in scalar[scalar.index(f"void {kernel}") :]
    v = SourceFile(text, str(ROOT / file))
    assert parse_spec(v, v.kernel(kernel)).launch.block == ["256"]


@pytest.mark.parametrize("file,kernel", NOT_SCATTERS, ids=[k for _, k in NOT_SCATTERS])
def test_other_kernels_get_none(file, kernel):
    assert SCATTER.propose(context(file, kernel)) == []


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("file,kernel,sizes", HOST, ids=[k for _, k, _ in HOST])
def test_proposals_equal_the_original_on_the_host(file, kernel, sizes, tmp_path):
    # the check can fail: each thread's elements one late
    proposals_check(
        SCATTER,
        context(file, kernel),
        sizes,
        tmp_path,
        lambda t: re.sub(r"(optiml_\w+) \*= 4;", r"\1 = \1 * 4 + 1;", t),
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("file,kernel", [h[:2] for h in HOST])
def test_the_vector_proposal_compiles_for_sm90_without_spills(file, kernel):
    p = SCATTER.propose(context(file, kernel))[0]
    v = SourceFile(p.variant.text, str(ROOT / file))
    k = v.kernel(kernel)
    b = build_kernel(v, k, instantiation=parse_spec(v, k).instantiation, arch="sm_90")
    assert b.ok, b.log[-2000:]
    assert b.resources.spill_store_bytes == 0 and b.resources.spill_load_bytes == 0
