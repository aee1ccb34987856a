"""Every transformation's proposals (the first two, as the GPU catalog test takes them) on the
fixtures, the wild kernels and the holdout kernels (written apart from the catalog), run as host
C++ against their originals at small sizes (tests/host_cuda.py): what the GPU's checks will say, known before a GPU is at hand. The GPU's
checks stay the authority (tests/search/test_gpu_catalog.py); this catches a wrong rewrite in CI.
The host code of a file (after its last kernel) is left out; kernels the host cannot run (16-bit
floats, cooperative groups, C linkage) are left to the GPU."""

from __future__ import annotations

import shutil

import pytest

from optiml.search.catalog import CATALOG, Context
from optiml.search.variant import Variant
from tests.host_cuda import run_against
from tests.support import FIXTURES, GOOD, HOLDOUT, WILD

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# What host C++ cannot stand in for.
HOST_ONLY_NOT = (
    "__half",
    "cuda_fp16",
    "__nv_bfloat16",
    "cuda_bf16",
    "cooperative_groups",
    'extern "C"',
)
# Small sizes by the number of size variables: a multiple of 4 (the vector paths) and an odd one
# (the tails), a few blocks each; 2-D kernels also at multiples of 4 along both axes.
SIZES = {
    1: [[1000], [77]],
    2: [[37, 70], [16, 33], [20, 36]],
    3: [[37, 70, 19], [8, 33, 5]],
}
# The gemm category is the SGEMM's (its own host test covers every configuration).
TARGETS = [e for e in GOOD if e.get("category") != "gemm"] + WILD + HOLDOUT


def kernels():
    for e in TARGETS:
        path = FIXTURES / e["file"]
        text = path.read_text()
        if any(word in text for word in HOST_ONLY_NOT):
            continue
        yield pytest.param(e, id=f"{e['file']}::{e['kernel']}")


@pytest.mark.parametrize("entry", list(kernels()))
def test_proposals_compute_what_the_original_does(entry, tmp_path):
    path = FIXTURES / entry["file"]
    original = Context.of(Variant(path.read_text()), str(path), entry["kernel"], sm_count=2)
    proposals = [(name, p) for name, t in CATALOG.items() for p in t.propose(original)[:2]]
    if not proposals:
        pytest.skip("no proposal")
    names = original.spec.size_vars
    if len(names) in SIZES:
        sizes = [dict(zip(names, values, strict=True)) for values in SIZES[len(names)]]
    else:  # four or more sizes (a convolution's): the spec's small, odd one
        sizes = [original.spec.sizes[-1]]
    candidates = [Context.of(p.variant, str(path), entry["kernel"]) for _, p in proposals]
    bad = run_against(original, candidates, sizes, tmp_path)
    wrong = [
        f"{name} {p.params}: {n} elements" for (name, p), n in zip(proposals, bad, strict=True) if n
    ]
    assert not wrong, wrong
