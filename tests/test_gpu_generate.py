"""On a GPU: the generated kernels of the notation's shifted subscripts, scans and results of one
number, and of KernelBench's convolutions, poolings, scans and losses (at small sizes), pass
`optiml eval` against their generated NumPy references (every element, ≥ 2 seeds, both sizes of
the spec) — the block-wide tree of a 0-d result and the guards of every shifted read included."""

from __future__ import annotations

import pytest

from optiml.api import evaluate_file
from optiml.generate import generate
from optiml.harness.evaluate import EvalOptions
from optiml.harness.gpu import default_arch
from tests.test_from_torch import SMALL_TASKS, _small, needs_kb
from tests.test_generate import FORMULAS

pytestmark = pytest.mark.gpu

NEW_FORMS = [
    f
    for f in FORMULAS
    if f[0]
    in (
        "conv2d",
        "maxpool1d",
        "conv_transposed1d",
        "cumsum_exclusive",
        "cumprod",
        "cummax",
        "mse",
        "huber",
        "value_range",
    )
]


def _eval(tmp_path, name: str, text: str):
    g = generate(text, name)
    path = tmp_path / f"{name}.cu"
    path.write_text(g.kernel)
    (tmp_path / f"{name}_ref.py").write_text(g.reference)
    return evaluate_file(path, name, options=EvalOptions(arch=default_arch()))


@pytest.mark.parametrize(("name", "text", "sizes"), NEW_FORMS, ids=[f[0] for f in NEW_FORMS])
def test_a_new_form_passes_eval(name, text, sizes, tmp_path):
    verdict = _eval(tmp_path, name, text)
    assert verdict.status == "ok", verdict.message


@needs_kb
@pytest.mark.parametrize("n", sorted(SMALL_TASKS))
def test_a_kernelbench_task_at_small_sizes_passes_eval(n, tmp_path):
    t, _ = _small(n)
    verdict = _eval(tmp_path, t.name, t.formula)
    assert verdict.status == "ok", verdict.message
