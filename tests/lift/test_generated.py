"""Two pipelines that must agree: a kernel `optiml generate` writes from a formula, lifted and run
on the host, equals the NumPy reference it writes from the same formula (each emitter on its own
path from the checked formula), and falls in the family of what the formula computes."""

from __future__ import annotations

import types

import numpy as np
import pytest

from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.generate import generate
from optiml.lift import Lifted, lift, run
from optiml.lift.families import describe
from optiml.spec import parse_spec

FORMULAS = [
    ("for i < N: y[i] = max(x[i], 0)", {"N": 1000}, "map"),
    ("float x[R, C]; y[c] = sum(r) x[r, c]", {"R": 37, "C": 45}, "reduction"),
    ("float x[R, C]; y[r] = argmax(c) x[r, c]", {"R": 37, "C": 45}, "reduction"),
    (
        "out[b, i, j] = sum(k) q[b, i, k] * kt[b, j, k] * scale   "
        "for b < B, i < M, j < N, k < K  with scale = 0.125",
        {"B": 3, "M": 9, "N": 11},
        "contraction (matrix-matrix)",
    ),
    ("float x[M, N]; y[j, i] = x[i, j]", {"M": 33, "N": 17}, "permutation"),
    (
        "float x[R, C]\n"
        "m[r] = max(c) x[r, c];  e[r, c] = exp(x[r, c] - m[r]);  y[r, c] = e[r, c] / sum(c2) e[r, c2]",
        {"R": 20, "C": 31},
        "row normalization",
    ),
    (
        "float x[R, C], w[C], b[C]; eps = 1e-5\n"
        "mu[r] = mean(c) x[r, c]\n"
        "var[r] = mean(c) (x[r, c] - mu[r]) ** 2\n"
        "y[r, c] = (x[r, c] - mu[r]) * rsqrt(var[r] + eps) * w[c] + b[c]",
        {"R": 20, "C": 31},
        "row normalization",
    ),
    # a batch norm: the channel between the reduced indices, whose flat counter a read takes
    # apart as a quotient and a remainder of H * W (`_Kernel.offset`)
    (
        "float x[B, F, H, W]; eps = 1e-5\n"
        "mu[f] = mean(b, h, w) x[b, f, h, w]\n"
        "var[f] = mean(b, h, w) (x[b, f, h, w] - mu[f]) ** 2\n"
        "y[b, f, h, w] = (x[b, f, h, w] - mu[f]) * rsqrt(var[f] + eps)",
        {"B": 3, "F": 5, "H": 7, "W": 6},
        "row normalization",
    ),
]


@pytest.mark.parametrize(
    "formula,sizes,family", FORMULAS, ids=[f[2] + str(i) for i, f in enumerate(FORMULAS)]
)
def test_a_generated_kernel_lifts_to_its_generated_reference(formula, sizes, family, tmp_path):
    g = generate(formula, name="gen", ref_file="gen_ref.py")
    (tmp_path / "gen.cu").write_text(g.kernel)
    (tmp_path / "gen_ref.py").write_text(g.reference)
    source = SourceFile.read(tmp_path / "gen.cu")
    kernel = source.kernel("gen")
    spec = parse_spec(source, kernel)
    lifted = lift(source, kernel, spec)
    assert isinstance(lifted, Lifted), lifted.message()
    assert describe(lifted, spec).family == family
    declared = spec.sizes[-1]
    case = spec.case({k: sizes.get(k, v) for k, v in declared.items()})
    rng = np.random.default_rng(5)
    args: dict = {}
    for b in spec.buffers:
        d = DTYPES[b.dtype]
        n = case.lengths[b.name]
        args[b.name] = (
            rng.uniform(-1, 1, n).astype(np.float32).astype(np.float64)
            if d.is_float
            else rng.integers(0, 9, n)
        )
    args.update(case.scalars)
    for p in spec.params:
        if p not in args and p in case.sizes:
            args[p] = case.sizes[p]
    out = run(lifted, args, case.grid, case.block)
    module = types.ModuleType("gen_ref")
    exec(compile(g.reference, "gen_ref.py", "exec"), module.__dict__)
    returned = module.gen(
        *[np.array(args[p]) if isinstance(args[p], np.ndarray) else args[p] for p in spec.params]
    )
    values = returned if isinstance(returned, tuple) else (returned,)
    outputs = [b for b in spec.buffers if b.role != "in"]
    for b, expected in zip(outputs, values, strict=True):
        np.testing.assert_allclose(
            out[b.name], np.asarray(expected, dtype=np.float64).reshape(-1), rtol=1e-9, atol=1e-12
        )
