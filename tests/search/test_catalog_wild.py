"""The catalog on kernels written as people write them (fixtures/wild/, written apart from the
catalog, in other names, index types, bounds-check idioms and loop shapes): on each, the
transformations a CUDA developer would reach for propose a variant, and every variant proposed
compiles for sm_90 without spilling. Their results are checked against the originals on a GPU
(tests/search/test_gpu_catalog.py runs these kernels too)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from optiml.harness.build import build_device_code, kernel_resources
from optiml.search.catalog import CATALOG, Context
from optiml.search.variant import Variant
from tests.support import FIXTURES, MANIFEST, WILD, fixture_ids

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def context(entry: dict) -> Context:
    path = FIXTURES / entry["file"]
    return Context.of(Variant(path.read_text()), str(path), entry["kernel"])


def proposals(entry: dict) -> dict[str, list]:
    ctx = context(entry)
    return {name: t.propose(ctx) for name, t in CATALOG.items()}


def test_the_wild_kernels_are_not_the_fixtures():
    """Same kinds of kernel, other texts: no wild kernel's name or file is a fixture's."""
    assert len(WILD) >= 12
    assert not {e["kernel"] for e in WILD} & {e["kernel"] for e in MANIFEST}
    assert {e["category"] for e in WILD} >= {
        "elementwise",
        "transpose",
        "normalization",
        "reduction",
        "histogram",
        "stencil",
        "gemm",
    }


@pytest.mark.parametrize("entry", WILD, ids=fixture_ids(WILD))
def test_expected_transformations_propose(entry):
    got = proposals(entry)
    missing = [name for name in entry["expect"] if not got.get(name)]
    assert not missing, f"{entry['file']}::{entry['kernel']}: nothing from {missing}"


@needs_nvcc
@pytest.mark.parametrize("entry", WILD, ids=fixture_ids(WILD))
def test_every_transformation_compiles_without_spills(entry):
    """The first proposal of each transformation that applies (the one the search tries first)
    compiles for sm_90 with no spill and no stack; the schedules' other configurations have
    tests of their own (register budgets, spills) on these kernels' families."""
    ctx = context(entry)
    variants = [
        (f"{name}:{p.params}", p.variant) for name, ps in proposals(entry).items() for p in ps[:1]
    ]
    assert variants

    def build(item):
        label, variant = item
        out = Context.of(variant, ctx.source.path, ctx.kernel.name)
        # the device code alone (ptxas's report is the same; no host compile or link)
        instantiations = {out.kernel.name: out.spec.instantiation} if out.spec.instantiation else {}
        b = build_device_code(out.source, instantiations, arch="sm_90")
        return label, b, kernel_resources(b.all_resources, out.kernel)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for label, b, r in pool.map(build, variants):
            assert b.ok, f"{label}:\n{b.log}"
            assert r is not None, f"{label}: ptxas reported no resources for the kernel"
            assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0), label
