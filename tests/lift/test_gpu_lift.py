"""On a GPU: the lifted model is what the kernel computes. Every fixture kernel that lifts is run
by the harness against its own model (run on the host in float64, as a NumPy reference) on the
runner's inputs at its smallest declared size, at two seeds: the kernel's outputs must equal the
model's within the spec's tolerance."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from optiml.harness.evaluate import EvalOptions, evaluate
from optiml.harness.gpu import default_arch
from optiml.lift import Lifted, lift
from optiml.spec import Reference
from tests.lift.corpus import kernels, label, load

pytestmark = pytest.mark.gpu
KERNELS = kernels()

MODULE = """
import numpy as np
from optiml.cuda.source import SourceFile
from optiml.lift import lift, run
from optiml.spec import parse_spec

SRC = SourceFile.read({path!r})
KERNEL = SRC.kernel({name!r})
SPEC = parse_spec(SRC, KERNEL)
MODEL = lift(SRC, KERNEL, SPEC)


def reference(*args):
    named = dict(zip(SPEC.params, args))
    for sizes in SPEC.sizes:
        case = SPEC.case(sizes)
        if all(np.asarray(named[b.name]).size == case.lengths[b.name] for b in SPEC.buffers):
            break
    else:
        raise ValueError("no declared size has these lengths")
    for v, value in sizes.items():
        named.setdefault(v, value)
    out = run(MODEL, named, case.grid, case.block, precision="float64")
    return tuple(out[b.name] for b in SPEC.buffers if b.role != "in")
"""


@pytest.mark.parametrize("item", KERNELS, ids=[label(k) for k in KERNELS])
def test_the_kernel_computes_what_its_model_says(item, tmp_path):
    src, k, spec = load(*item)
    if not isinstance(lift(src, k, spec), Lifted):
        pytest.skip("opaque: no model to check")
    ref = tmp_path / "model_ref.py"
    ref.write_text(textwrap.dedent(MODULE.format(path=str(item[0]), name=k.name)))
    smallest = min(spec.sizes, key=lambda s: int(np.prod(list(s.values()))))
    spec = spec.model_copy(
        update={
            "reference": Reference(kind="numpy", path=str(ref), function="reference"),
            "sizes": [smallest],
        }
    )
    v = evaluate(
        src, k, spec, None, EvalOptions(arch=default_arch(), time=False, floor=False, seeds=(1, 2))
    )
    assert v.status == "ok", v.message
