"""The lifting on fixtures/corpus/ (47 first-draft kernels written apart from the lifting, each with
an independent float64 NumPy reference): every kernel that lifts computes, run as its model at
its smallest declared size, what its reference computes, within its spec's tolerance; its family
is the manifest's; the kernels that do not lift are the ones listed here, for the reason given."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import numpy as np
import pytest

from optiml.cuda.types import DTYPES
from optiml.lift import Lifted, lift, run
from optiml.lift.families import describe
from optiml.spec import load
from tests.lift.corpus import smallest_args

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
MANIFEST = tomllib.loads((CORPUS / "manifest.toml").read_text())["kernel"]

# What the lifting does not follow yet, and why (a regression or an improvement shows here).
OPAQUE = {
    "row_l2_norm": "shared memory",
    "hgemm_tiled": "shared memory",
    "histogram_privatized": "shared memory",
    "softmaxWarpPerRow": "warp shuffle",
}


def refs():
    spec = importlib.util.spec_from_file_location("corpus_refs", CORPUS / "numpy_refs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["kernel"] for e in MANIFEST])
def test_a_corpus_kernel_lifts_to_what_its_reference_computes(entry):
    source, kernel, spec = load(CORPUS / entry["file"], entry["kernel"])
    lifted = lift(source, kernel, spec)
    d = describe(lifted, spec)
    if entry["kernel"] in OPAQUE:
        assert not isinstance(lifted, Lifted)
        assert OPAQUE[entry["kernel"]] in lifted.message()
        return
    assert isinstance(lifted, Lifted), lifted.message()
    assert d.family.split(" (")[0] == entry["family"], d.evidence
    case, args = smallest_args(spec, seed=3)
    out = run(lifted, args, case.grid, case.block)
    ref_args = [
        np.array(args[p]) if isinstance(args[p], np.ndarray) else args[p] for p in spec.params
    ]
    returned = getattr(refs(), entry["numpy"])(*ref_args)
    values = returned if isinstance(returned, tuple) else (returned,)
    outputs = [b for b in spec.buffers if b.role != "in"]
    assert len(values) == len(outputs)
    for b, expected in zip(outputs, values, strict=True):
        rtol, atol = spec.tolerance(DTYPES[b.dtype])
        np.testing.assert_allclose(
            out[b.name],
            np.asarray(expected, dtype=np.float64).reshape(-1),
            rtol=max(rtol, 1e-6),
            atol=max(atol, 1e-6),
            err_msg=f"{entry['kernel']}: {b.name}",
        )


def test_most_of_the_corpus_lifts():
    lifted = [
        e["kernel"]
        for e in MANIFEST
        if isinstance(lift(*load(CORPUS / e["file"], e["kernel"])), Lifted)
    ]
    assert len(MANIFEST) >= 40 and len(lifted) >= len(MANIFEST) * 5 // 6
