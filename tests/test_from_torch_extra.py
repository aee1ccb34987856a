"""--from-torch on level-1-style tasks written for this project (fixtures/kb_extra: the
operations of KernelBench level 1 that are not in the shared set, written apart from the
translator): each translates into a formula whose kernel and spec the generate pipeline makes,
or fails on one line at the task's line and column saying what is not covered."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from optiml.errors import ExitCode, FormulaError
from optiml.generate import generate
from optiml.generate.from_torch import translate
from optiml.spec import load
from tests.test_from_torch import run_reference

EXTRA = Path(__file__).resolve().parents[1] / "fixtures" / "kb_extra"
TASKS = sorted(EXTRA.glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
# task number -> what the one line says
NOT_COVERED: dict[int, str] = {}


def test_the_set_is_the_odd_half_of_level_1():
    assert [int(p.name.split("_")[0]) for p in TASKS] == list(range(1, 100, 2))


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_a_task_translates_or_fails_on_one_line(path, tmp_path):
    n = int(path.name.split("_")[0])
    text = path.read_text()
    if n in NOT_COVERED:
        with pytest.raises(FormulaError) as e:
            translate(text, path.name)
        message = str(e.value)
        assert "\n" not in message and e.value.exit_code == ExitCode.BAD_FORMULA
        where, _, rest = message.partition(": ")
        name, line, column = where.rsplit(":", 2)
        assert name == path.name and 1 <= int(line) <= len(text.splitlines())
        assert NOT_COVERED[n] in rest, message
        return
    t = translate(text, path.name)
    g = generate(t.formula, t.name)
    assert t.output in g.checked.outputs
    cu = tmp_path / f"{t.name}.cu"
    cu.write_text(g.kernel)
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    _, kernel, spec = load(cu, t.name)
    assert [p.name for p in kernel.params] == spec.params


# ---- the tasks that group, mask, gather or scan from the end, at small sizes --------------------


def _group_norm(x, groups, eps=1e-5):
    """torch's GroupNorm (weight 1, bias 0): each group of channels normalized over its channels
    and positions, with the biased variance."""
    b, c = x.shape[:2]
    g = x.reshape(b, groups, -1)
    mu = g.mean(axis=2, keepdims=True)
    var = ((g - mu) ** 2).mean(axis=2, keepdims=True)
    return ((g - mu) / np.sqrt(var + eps)).reshape(x.shape)


def _cross_entropy(logits, targets):
    """The mean over the batch of -log softmax(logits)[n, targets[n]]."""
    m = logits.max(axis=1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    return -np.mean(logp[np.arange(len(targets)), targets])


# task -> (constants at small sizes, torch's semantics in NumPy on forward's inputs)
SMALL = {
    35: (
        {"batch_size": 2, "features": 6, "num_groups": 3, "height": 4, "width": 5},
        lambda x: _group_norm(x, 3),
    ),
    91: ({"batch_size": 3, "input_shape": (7,)}, lambda x: np.flip(np.cumsum(np.flip(x, 1), 1), 1)),
    93: ({"batch_size": 3, "input_shape": (7,)}, lambda x, mask: np.cumsum(x * mask.astype(bool), 1)),
    95: ({"batch_size": 5, "num_classes": 7}, _cross_entropy),
}  # fmt: skip


def _task(n: int) -> Path:
    (path,) = EXTRA.glob(f"{n}_*.py")
    return path


def _inputs(n: int, t) -> dict[str, np.ndarray]:
    """forward's inputs as get_inputs makes them: int class indices in [0, classes), a 0/1
    mask; the values standard normal."""
    g = generate(t.formula, t.name)
    rng = np.random.default_rng(n)
    arrays = {}
    for name in t.inputs:
        tensor = g.checked.tensors[name]
        shape = [g.checked.sizes[d].value for d in tensor.dims]
        if name == "targets":
            arrays[name] = rng.integers(0, t.sizes["input_shape"], shape).astype(np.int32)
        elif name == "mask":
            arrays[name] = rng.integers(0, 2, shape).astype(np.int32)
        else:
            arrays[name] = rng.standard_normal(shape)
    return arrays


@pytest.mark.parametrize("n", sorted(SMALL))
def test_the_reference_computes_what_torch_computes_at_small_sizes(n):
    overrides, expected = SMALL[n]
    t = translate(_task(n).read_text(), _task(n).name, overrides=overrides)
    arrays = _inputs(n, t)
    got = run_reference(t, arrays, t.sizes)
    # the task's own shapes (x declared (batch, groups, channels per group, ...) is the same memory)
    shaped = {k: v.reshape(-1) for k, v in arrays.items()}
    if n == 35:
        shaped["x"] = shaped["x"].reshape(2, 6, 4, 5)
    elif n == 95:
        shaped["predictions"] = shaped["predictions"].reshape(5, 7)
    else:
        shaped = {k: v.reshape(3, 7) for k, v in shaped.items()}
    want = np.asarray(expected(*(shaped[name] for name in t.inputs)))
    assert got.shape == (want.size,)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-9, atol=1e-12)


def test_a_mask_is_true_where_it_is_not_zero():
    """torch's bool(m) is m != 0: the kernel reads the mask as int and tests it so."""
    t = translate(_task(93).read_text(), _task(93).name, overrides=SMALL[93][0])
    x = np.random.default_rng(1).standard_normal((3, 7))
    mask = np.array([0, 1, 2, -3, 0, 5, 1] * 3, dtype=np.int32).reshape(3, 7)
    got = run_reference(t, {"x": x, "mask": mask}, t.sizes)
    np.testing.assert_allclose(got, np.cumsum(np.where(mask != 0, x, 0), 1).reshape(-1))


def test_the_class_indices_range_over_the_classes_in_the_spec(tmp_path):
    t = translate(_task(95).read_text(), _task(95).name)
    g = generate(t.formula, t.name)
    assert "targets: in int[batch_size] in [0, input_shape)" in g.kernel
    assert any("targets.int()" in note for note in t.notes)


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="nvcc not installed",
)
@pytest.mark.parametrize("n", sorted(SMALL))
def test_their_kernels_compile_and_their_specs_check(n, tmp_path):
    from optiml.api import check_file

    t = translate(_task(n).read_text(), _task(n).name)
    g = generate(t.formula, t.name)
    cu = tmp_path / f"{t.name}.cu"
    cu.write_text(g.kernel)
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    result = check_file(cu)
    assert not result.spec_failed, [k.spec_error for k in result.kernels]
    assert not result.compile_failed, [str(m) for m in result.kernels[0].messages]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_their_kernels_agree_with_their_references_on_the_host(tmp_path):
    from tests.test_generate import on_disk, run_on_host

    kernels = []
    for n in sorted(SMALL):
        t = translate(_task(n).read_text(), _task(n).name, overrides=SMALL[n][0])
        kernels.append(on_disk(t.formula, t.name, tmp_path))
    failures = run_on_host(kernels, tmp_path)
    assert not failures, failures
