"""On a GPU: every kernel of fixtures/corpus computes what its NumPy reference (written apart from
it, in float64) computes, through the harness (the runner's inputs, every output element checked
within the spec's tolerance, inputs checked unchanged) at its smallest declared size, two seeds."""

from __future__ import annotations

import numpy as np
import pytest

from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch
from optiml.spec import Reference, load
from tests.lift.test_corpus import CORPUS, MANIFEST

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["kernel"] for e in MANIFEST])
def test_a_corpus_kernel_computes_what_its_reference_does(entry):
    source, kernel, spec = load(CORPUS / entry["file"], entry["kernel"])
    smallest = min(spec.sizes, key=lambda s: int(np.prod(list(s.values()))))
    spec = spec.model_copy(
        update={
            "reference": Reference(
                kind="numpy", path=str(CORPUS / "numpy_refs.py"), function=entry["numpy"]
            ),
            "sizes": [smallest],
        }
    )
    v = evaluate(
        source, kernel, spec, None, EvalOptions(arch=default_arch(), time=False, seeds=(1, 2))
    )
    assert v.status == "ok", v.message
