"""On a GPU: contraction_tiling's proposals compute what their originals compute, checked by the
harness at every size of the spec (partial tiles, sizes where 16-byte copies do not apply) with two
seeds: the fp32 tiles in the four layouts with a batch and alpha/beta, the corpus's batched and
column-major GEMMs, and the tensor-core schedule for half and bf16 in the four layouts, into fp32
or into a 16-bit output through a bias and a ReLU."""

from __future__ import annotations

import asyncio

import pytest

from optiml.cuda.source import SourceFile
from optiml.executors import LocalExecutor
from optiml.executors.base import Job
from optiml.harness.evaluate import EvalOptions
from optiml.search.catalog import Context, by_name
from optiml.search.variant import Variant
from optiml.spec import parse_spec
from tests.search.contraction_kernels import LAYOUTS, batched, batched16
from tests.support import FIXTURES

pytestmark = pytest.mark.gpu

KERNELS = (
    [(f"fp32-{lay}", batched(lay), "bgemm") for lay in LAYOUTS]
    + [(f"half-{lay}", batched16(lay, "half"), "hgemm") for lay in LAYOUTS]
    + [(f"bf16-{lay}", batched16(lay, "bfloat16"), "hgemm") for lay in LAYOUTS]
    + [(f"bf16-bias-relu-{lay}", batched16(lay, "bfloat16", True), "hgemm") for lay in LAYOUTS]
    + [
        (f"corpus-{k}", (FIXTURES / "corpus" / f).read_text(), k)
        for f, k in (
            ("attention_bmm.cu", "bmm_qk"),
            ("attention_bmm.cu", "bmm_pv"),
            ("sgemm_colmajor.cu", "sgemm_nn_colmajor"),
        )
    ]
)


def proposals():
    for label, text, kernel in KERNELS:
        ctx = Context.of(Variant(text), str(FIXTURES / "kernel.cu"), kernel)
        found = by_name("contraction_tiling").propose(ctx)
        assert found, label
        for p in found:
            yield pytest.param(text, kernel, p, id=f"{label}-{p.params['bm']}x{p.params['bn']}")


@pytest.mark.parametrize("text,kernel,proposal", list(proposals()))
def test_proposal_is_correct(text, kernel, proposal):
    source = SourceFile(text, str(FIXTURES / "kernel.cu"))
    k = source.kernel(kernel)
    job = Job.of_variant(source, k, parse_spec(source, k), proposal.variant)

    async def run():
        ex = LocalExecutor()
        try:
            return await ex.evaluate(job, EvalOptions(time=False, timeout_s=120))
        finally:
            await ex.close()

    v = asyncio.run(run())
    assert v.status == "ok", f"{proposal.summary}: {v.message}"
