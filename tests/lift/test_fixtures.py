"""The lifting on every fixture kernel: each lifts and runs on the host at its smallest declared
size, or stays opaque with a line and a reason; the wild fixtures fall in the family their
manifest's category names (the manifest was written before the lifting, by what each kernel
is for)."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from optiml.lift import Lifted, Unlifted, lift, run
from optiml.lift.families import describe
from tests.lift.corpus import ROOT, kernels, label, load, smallest_args

KERNELS = kernels()
OPAQUE = {  # what each cooperates through, or the construct the model does not follow yet
    "bank_conflicts.cu::transpose_smem": "shared memory",
    "multi_kernel_main.cu::block_partial_sums": "shared memory",
    "wild/block_sum_tree.cu::block_sum": "shared memory",
    "spill.cu::batched_matmul8": "a local array",
}


@pytest.mark.parametrize("item", KERNELS, ids=[label(k) for k in KERNELS])
def test_every_fixture_lifts_and_runs_or_says_why_not(item):
    src, k, spec = load(*item)
    lifted = lift(src, k, spec)
    key = label(item)
    if key in OPAQUE:
        assert isinstance(lifted, Unlifted)
        line, why = lifted.reasons[0]
        assert OPAQUE[key] in why and line > 0
        return
    assert isinstance(lifted, Lifted), lifted.message()
    case, args = smallest_args(spec)
    out = run(lifted, args, case.grid, case.block, blocks=64)  # a sample of the grid: it runs
    for b in spec.buffers:
        if b.role != "in":
            assert out[b.name].shape == (case.lengths[b.name],)
            assert np.isfinite(out[b.name]).all()
    d = describe(lifted)
    assert d.family not in ("opaque", "other") and d.evidence


CATEGORY = {
    "elementwise": {"map"},
    "transpose": {"permutation"},
    "normalization": {"row normalization"},
    "reduction": {"reduction"},
    "histogram": {"histogram"},
    "stencil": {"stencil"},
    "gemm": {"contraction (matrix-matrix)"},
}


# where the manifest's category names the fix rather than the computation: copy_strided copies
# element for element (a map whose thread mapping is transposed), gemv is a reduction of products
# of a matrix row and a vector
BY_WHAT_IT_COMPUTES = {"copy_strided.cu": "map", "gemv.cu": "contraction (matrix-vector)"}


def wild():
    manifest = tomllib.loads((ROOT / "wild" / "manifest.toml").read_text())
    return [(f["file"], f["kernel"], f["category"]) for f in manifest["fixture"]]


@pytest.mark.parametrize("file,kernel,category", wild(), ids=[w[0] for w in wild()])
def test_a_wild_fixture_falls_in_the_family_of_its_category(file, kernel, category):
    src, k, spec = load(ROOT / "wild" / file, kernel)
    d = describe(lift(src, k, spec))
    if d.family == "opaque":
        assert category == "reduction" and "shared memory" in d.not_understood[0]
        return
    expected = {BY_WHAT_IT_COMPUTES[file]} if file in BY_WHAT_IT_COMPUTES else CATEGORY[category]
    assert d.family in expected, (d.family, d.evidence)


def test_the_host_model_of_a_naive_softmax_is_a_softmax():
    src, k, spec = load(ROOT / "softmax.cu", "softmax_rows")
    case, args = smallest_args(spec)
    out = run(lift(src, k, spec), args, case.grid, case.block)["output"]
    rows, cols = case.sizes["rows"], case.sizes["cols"]
    x = args["input"].reshape(rows, cols)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        out.reshape(rows, cols), e / e.sum(axis=1, keepdims=True), rtol=1e-12
    )


TRICKS = sorted((ROOT / "tricks").glob("*.cu"))


@pytest.mark.parametrize("path", TRICKS, ids=[p.name for p in TRICKS])
def test_a_trick_lifts_or_says_why_never_crashes(path):
    """Kernels written to cheat (caches, counters, races, side streams, forged results): the
    lifting reads them as it reads any kernel, or says where it cannot; it never fails."""
    from optiml.cuda.source import SourceFile
    from optiml.spec import parse_spec

    source = SourceFile.read(path)
    for k in source.kernels:
        if k.spec_comment is None:
            continue
        spec = parse_spec(source, k)
        d = describe(lift(source, k, spec), spec)
        assert d.family and (d.evidence or d.not_understood)
