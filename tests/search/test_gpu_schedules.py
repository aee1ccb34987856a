"""On a GPU: the schedules emitted from the lifted model (column_reduce, gather_rows,
permute_tiles, scatter_rows) are correct on the kernels they apply to, each proposal evaluated by the harness
against its original at every size with two seeds, and timed against it; the speedups are printed
(`-s`) for the record."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from optiml.executors import LocalExecutor
from optiml.executors.base import Job
from optiml.harness.evaluate import EvalOptions
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import load

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {
    "column_reduce": [
        ("fixtures/corpus/bias_grad.cu", "bias_backward_naive"),
        ("fixtures/wild/colsum.cu", "column_sum"),
        ("fixtures/corpus/gemv_t.cu", "gemvTranspose"),
        ("tests/data/schedules/col_stats.cu", "feature_stats"),
        ("tests/data/schedules/col_std.cu", "col_std"),
        ("tests/data/schedules/col_min_int.cu", "columnMinLabel"),
    ],
    "gather_rows": [
        ("fixtures/corpus/embedding_pos.cu", "encoder_forward_kernel"),
        ("tests/data/schedules/embed_scaled.cu", "embed_scaled"),
    ],
    "permute_tiles": [
        ("fixtures/corpus/permute_heads.cu", "unpermute_heads"),
        ("fixtures/corpus/nchw_to_nhwc.cu", "nchw2nhwc"),
        ("fixtures/corpus/transpose_half.cu", "transposeNaiveHalf"),
        ("fixtures/corpus/split_qkv.cu", "permute_qkv"),
        ("fixtures/contract/permute4d.cu", "permute4d"),
        ("tests/data/schedules/permute_021_src.cu", "transpose_last_two"),
        ("tests/data/schedules/nhwc_to_nchw_half.cu", "nhwc_to_nchw"),
        ("tests/data/schedules/split_heads_2d.cu", "split_heads"),
    ],
    "scatter_rows": [
        ("fixtures/corpus/index_add.cu", "indexAddRows"),
        ("fixtures/corpus/embedding_backward.cu", "encoder_backward_kernel"),
        ("tests/data/schedules/embedding_grad_flat.cu", "embedding_grad"),
    ],
}


def proposals():
    for name, kernels in KERNELS.items():
        for file, kernel in kernels:
            path = ROOT / file
            ctx = Context.of(Variant(path.read_text()), str(path), kernel)
            for p in by_name(name).propose(ctx):
                yield pytest.param(
                    file,
                    kernel,
                    p,
                    id=f"{file}::{kernel}::{name}:{json.dumps(p.params, sort_keys=True)}",
                )


@pytest.mark.parametrize("file,kernel,proposal", list(proposals()))
def test_schedule_is_correct_and_timed(file, kernel, proposal):
    source, k, spec = load(ROOT / file, kernel)
    job = Job.of_variant(source, k, spec, proposal.variant)

    async def run():
        ex = LocalExecutor()
        try:
            return await ex.evaluate(job, EvalOptions(timeout_s=300))
        finally:
            await ex.close()

    v = asyncio.run(run())
    assert v.status == "ok", f"{proposal.summary}: {v.message}"
    print(f"{kernel} {proposal.params}: {v.message}")
