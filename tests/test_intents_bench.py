"""benchmarks/intents.py without a GPU: at least 30 formula intents across the families, each
generates; each PyTorch equivalent defines `fn` over exactly the formula's inputs; every generated
kernel, run as host C++ at small sizes, agrees with its float64 NumPy reference; a run without a
GPU writes a row per intent. The GPU steps (optimize, eval with the floor, PyTorch eager and
torch.compile, PyTorch against the reference) run on the H200."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from optiml.generate import generate
from tests.support import load_script

ROOT = Path(__file__).resolve().parents[1]


bench = load_script("benchmarks/intents.py", "intents_bench")
FAMILIES = {
    "map",
    "reduction",
    "loss",
    "normalization",
    "contraction",
    "permutation",
    "stencil",
    "convolution",
    "pooling",
    "scan",
    "gather",
}


def test_thirty_intents_and_more_across_the_families():
    names = [i.name for i in bench.INTENTS]
    assert len(names) >= 30 and len(set(names)) == len(names)
    assert {i.family for i in bench.INTENTS} == FAMILIES
    assert {i.bound for i in bench.INTENTS} == {"memory", "compute"}
    # reductions on the last, the first, a middle and every axis
    reductions = {i.name for i in bench.INTENTS if i.family == "reduction"}
    assert {"row_sum", "column_sum", "middle_sum", "total_sum"} <= reductions


@pytest.mark.parametrize("intent", bench.INTENTS, ids=lambda i: i.name)
def test_each_generates_and_its_pytorch_takes_the_formulas_inputs(intent):
    g = generate(intent.text(), intent.name)
    inputs = {n for n, t in g.checked.tensors.items() if t.role == "in"}
    tree = ast.parse(intent.torch)
    (fn,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["fn"]
    ]
    assert isinstance(fn, ast.Lambda)
    assert {a.arg for a in fn.args.args} == inputs
    for name in intent.small:  # the host check's sizes are the formula's
        assert name in g.checked.sizes


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_every_kernel_agrees_with_its_reference_on_the_host(tmp_path):
    from tests.test_generate import run_on_host

    kernels = []
    for intent in bench.INTENTS:
        row = bench.generate_step(intent, tmp_path / intent.name)
        kernels.append((Path(row["file"]), intent.name, small_case(intent)))
    failures = run_on_host(kernels, tmp_path)
    assert not failures, failures


def small_case(intent) -> dict[str, int]:
    """The intent's small sizes: the spec's size variables (every size of the output's domain,
    others up to three; the rest stay fixed in `args`, at the formula's value)."""
    return dict(intent.small)


def test_a_run_without_a_gpu_writes_a_row_per_intent(tmp_path):
    args = bench.parse_args(["--out", str(tmp_path), "--no-gpu", "--only", "relu,softmax"])
    table = bench.run(args)
    rows = json.loads((tmp_path / "intents.json").read_text())["rows"]
    assert (
        [r["intent"] for r in rows] == ["relu", "softmax"] == [r["intent"] for r in table["rows"]]
    )
    assert all(r["generated"] and Path(r["file"]).is_file() for r in rows)
    assert table["summary"]["generated"] == 2 and table["summary"]["correct"] == 0
    with pytest.raises(SystemExit, match="no intent nope"):
        bench.chosen(bench.parse_args(["--out", "x", "--only", "nope"]))
