"""optiml generate --from-torch: KernelBench's level-1 tasks either translate into a formula that
goes through the generate pipeline (its kernel compiles with nvcc and its spec is valid), or fail
on one line at the task's line and column; the generated NumPy references, run at small sizes,
agree with independent NumPy implementations of what torch computes; the file is read, never
run."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from numpy.lib.stride_tricks import sliding_window_view

from optiml.api import check_file
from optiml.cli import main
from optiml.errors import ExitCode, FormulaError
from optiml.generate import generate
from optiml.generate.from_torch import Translation, default_name, translate
from optiml.spec import load

KB = Path(__file__).resolve().parents[1].parent / "shared" / "kernelbench" / "level1"
needs_kb = pytest.mark.skipif(not KB.is_dir(), reason=f"KernelBench's level 1 is not at {KB}")
needs_nvcc = pytest.mark.skipif(
    not any(Path(p, "nvcc").exists() for p in os.environ.get("PATH", "").split(os.pathsep))
    and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="nvcc not installed",
)

NUMBERS = list(range(2, 101, 2))  # the 50 tasks of shared/kernelbench/level1
# every task (92, an exclusive cumsum through narrow and cat, is the scan read one back)
TRANSLATED = set(range(2, 101, 2))
# task -> (what the error says, a text on the line it points at)
NOT_COVERED: dict[int, tuple[str, str]] = {}


def task_file(n: int) -> Path:
    (path,) = KB.glob(f"{n}_*.py")
    return path


def test_every_task_is_expected_to_translate_or_not():
    assert TRANSLATED.isdisjoint(NOT_COVERED)
    assert sorted(TRANSLATED | set(NOT_COVERED)) == NUMBERS


@needs_kb
def test_the_tasks_that_translate_are_exactly_these():
    assert sorted(int(p.name.split("_")[0]) for p in KB.glob("*.py")) == NUMBERS
    translated = set()
    for n in NUMBERS:
        path = task_file(n)
        try:
            translate(path.read_text(), path.name)
        except FormulaError:
            continue
        translated.add(n)
    assert translated == TRANSLATED


@needs_kb
@pytest.mark.parametrize("n", NUMBERS)
def test_a_task_translates_and_passes_the_check_or_fails_on_one_line(n, tmp_path):
    path = task_file(n)
    text = path.read_text()
    if n not in TRANSLATED:
        what, on_line = NOT_COVERED[n]
        with pytest.raises(FormulaError) as e:
            translate(text, path.name)
        message = str(e.value)
        assert "\n" not in message
        assert e.value.exit_code == ExitCode.BAD_FORMULA == 24
        where, _, rest = message.partition(": ")
        name, line, column = where.rsplit(":", 2)
        assert name == path.name and int(column) >= 1
        assert on_line in text.splitlines()[int(line) - 1], message
        assert what in rest, message
        return
    t = translate(text, path.name)
    g = generate(t.formula, t.name)
    assert t.output in g.checked.outputs
    assert {s: g.checked.sizes[s].value for s in t.sizes} == t.sizes  # the task's own sizes
    cu = tmp_path / f"{t.name}.cu"
    cu.write_text(g.kernel)
    (tmp_path / f"{t.name}_ref.py").write_text(g.reference)
    _, kernel, spec = load(cu, t.name)
    assert [p.name for p in kernel.params] == spec.params
    if needs_nvcc.args[0]:
        return
    result = check_file(cu)
    assert not result.spec_failed, [k.spec_error for k in result.kernels]
    assert not result.compile_failed, [str(m) for m in result.kernels[0].messages]


# ---- what the formulas say ----------------------------------------------------------------------

FORMULAS = {
    2: """\
float A[M, K], B[K, N]
M = 2048; K = 8192; N = 4096
for m < M, n < N, k < K
out[m, n] = sum(k) A[m, k] * B[k, n]""",
    24: """\
float x[batch_size, dim]
batch_size = 4096; dim = 393216
for b < batch_size, d < dim, d2 < dim
mx[b] = max(d) x[b, d]
out[b, d] = x[b, d] - mx[b] - log(sum(d2) exp(x[b, d2] - mx[b]))""",
    36: """\
float x[batch_size, features, dim1, dim2]
batch_size = 112; features = 64; dim1 = 512; dim2 = 512
eps = 1e-05
for b < batch_size, f < features, d1 < dim1, d2 < dim2
rms[b, d1, d2] = sqrt((mean(f) x[b, f, d1, d2] ** 2) + eps)
out[b, f, d1, d2] = x[b, f, d1, d2] / rms[b, d1, d2]""",
}


@needs_kb
@pytest.mark.parametrize("n", sorted(FORMULAS))
def test_the_formula_of_a_task(n):
    t = translate(task_file(n).read_text(), task_file(n).name)
    assert t.formula == FORMULAS[n]


@needs_kb
def test_the_task_s_sizes_are_the_spec_s_and_a_name_comes_from_the_file():
    t = translate(task_file(20).read_text(), task_file(20).name)
    assert t.name == "LeakyReLU" and t.sizes == {"batch_size": 4096, "dim": 393216}
    assert t.scalars == {"negative_slope": 0.01}  # __init__'s default, as `self.negative_slope`
    g = generate(t.formula, t.name)
    assert "batch_size, dim = (4096, 393216)" in g.kernel
    assert (
        default_name("10_3D_tensor_matrix_multiplication.py") == "k_3D_tensor_matrix_multiplication"
    )
    assert default_name("2_Standard_matrix_multiplication_.py") == "Standard_matrix_multiplication"


@needs_kb
def test_constants_can_be_given_other_values():
    t = translate(task_file(40).read_text(), "40.py", overrides={"batch_size": 3, "dim1": 5})
    assert t.sizes == {"batch_size": 3, "features": 64, "dim1": 5, "dim2": 256}
    with pytest.raises(FormulaError, match="no module-level constant `batch`"):
        translate(task_file(40).read_text(), "40.py", overrides={"batch": 3})


# ---- the references compute what torch computes ------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _norm(x, axes, eps=1e-5):  # biased variance, as torch's norms
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


SMALL = {"M": 5, "K": 7, "N": 6, "L": 4, "batch_size": 3, "dim": 11, "features": 4, "dim1": 5,
         "dim2": 6}  # fmt: skip
_MM = ({"A": ("M", "K"), "B": ("K", "N")}, lambda A, B: A @ B)
_X2 = {"x": ("batch_size", "dim")}
_X4 = {"x": ("batch_size", "features", "dim1", "dim2")}
# task -> (its inputs' shapes, torch's semantics in NumPy)
NUMPY = {
    2: _MM,
    4: ({"A": ("M", "K"), "B": ("K", 1)}, lambda A, B: A @ B),
    6: _MM,
    8: _MM,
    10: ({"A": ("N", "M", "K"), "B": ("K", "L")}, lambda A, B: A @ B),
    12: ({"A": ("N",), "B": ("N", "M")}, lambda A, B: np.diag(A) @ B),
    14: ({"A": ("N", "N"), "B": ("N", "N")}, lambda A, B: np.triu(A @ B)),
    16: ({"A": ("K", "M"), "B": ("K", "N")}, lambda A, B: A.T @ B),
    18: ({"A": ("K", "M"), "B": ("N", "K")}, lambda A, B: A.T @ B.T),
    20: (_X2, lambda x: np.where(x > 0, x, 0.01 * x)),
    22: (_X2, lambda x: np.tanh(x)),
    24: (_X2, lambda x: _log_softmax(x, 1)),
    26: (_X2, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),  # torch's default: erf
    28: (_X2, lambda x: np.clip(x + 3, 0, 6) / 6),  # relu6(x + 3) / 6
    30: (_X2, lambda x: x / (1 + np.abs(x))),
    32: (_X2, lambda x: np.clip(x, -1, 1)),
    34: (_X4, lambda x: _norm(x, (2, 3))),
    36: (_X4, lambda x: x / np.sqrt((x**2).mean(axis=1, keepdims=True) + 1e-5)),
    38: (_X2, lambda x: x / np.abs(x).mean(axis=1, keepdims=True)),
    40: (_X4, lambda x: _norm(x, (1, 2, 3))),
    48: ({"x": ("batch_size", "dim1", "dim2")}, lambda x: x.mean(axis=1)),
    52: ({"x": ("batch_size", "dim1", "dim2")}, lambda x: x.argmin(axis=1)),
    88: (_X2, _gelu_tanh),
}


def run_reference(t: Translation, arrays: dict[str, np.ndarray], sizes: dict[str, int]):
    """The generated reference of a translation, called as the harness calls it: the kernel's
    arguments in order, arrays flat, at the sizes given."""
    g = generate(t.formula, t.name)
    assert set(sizes) >= set(g.checked.sizes)
    namespace: dict = {}
    exec(compile(g.reference, f"{t.name}_ref.py", "exec"), namespace)
    args = []
    for p in g.param_names:
        if p in arrays:
            args.append(arrays[p].reshape(-1))
        elif p in g.checked.tensors:
            args.append(np.zeros(1, dtype=np.float32))
        elif p in g.checked.sizes:
            args.append(sizes[p])
        else:
            args.append(g.checked.scalars[p].value)
    (out,) = namespace[t.name](*args)
    return out


def test_every_translated_task_has_a_numpy_check():
    assert set(NUMPY) | set(SMALL_TASKS) == TRANSLATED and not set(NUMPY) & set(SMALL_TASKS)


@needs_kb
@pytest.mark.parametrize("n", sorted(NUMPY))
def test_the_reference_computes_what_torch_computes_at_small_sizes(n):
    t = translate(task_file(n).read_text(), task_file(n).name)
    shapes, expected = NUMPY[n]
    rng = np.random.default_rng(n)
    arrays = {}
    for name, shape in shapes.items():
        dims = [SMALL[d] if isinstance(d, str) else d for d in shape]
        arrays[name] = rng.standard_normal(dims).astype(np.float32)
    if n == 14:  # as get_inputs makes them; the kernel computes for any values
        arrays = {k: np.triu(v) for k, v in arrays.items()}
    got = run_reference(t, arrays, SMALL)
    want = expected(**{k: v.astype(np.float64) for k, v in arrays.items()})
    assert got.shape == (want.size,)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-9, atol=1e-12)


HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def module(params: str, body: str, inputs: str, init: str = "", init_inputs: str = "[]") -> str:
    """A task in KernelBench's format: forward(self, PARAMS) with its body, get_inputs' list, and
    __init__'s lines (its parameters before `|`)."""
    init_params, _, init_body = init.rpartition("|")
    return HEAD + (
        "class Model(nn.Module):\n"
        f"    def __init__(self{init_params}):\n"
        "        super().__init__()\n"
        + "".join(f"        {line}\n" for line in init_body.splitlines())
        + f"\n    def forward(self, {params}):\n"
        + "".join(f"        {line}\n" for line in body.splitlines())
        + "\n\nB = 6\nN = 10\nK = 7\n\n\n"
        f"def get_inputs():\n    return {inputs}\n\n\n"
        f"def get_init_inputs():\n    return {init_inputs}\n"
    )


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(x)))


def _elu(x, a):
    return np.where(x > 0, x, a * np.expm1(x))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _leaky(x, slope):
    return np.where(x > 0, x, slope * x)


SELU_SCALE, SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717

# name -> (task, its inputs' shapes, what torch computes, inputs that are not standard normal)
FEATURES = {
    "nn.Softmax": (
        module("x", "return self.sm(x)", "[torch.rand(B, N)]", "self.sm = nn.Softmax(dim=1)"),
        {"x": (6, 10)},
        lambda x: np.exp(_log_softmax(x, 1)),
    ),
    "torch.max(x, dim)[0] and .values": (
        module("x", "return torch.max(x, dim=1)[0] + x.min(1).values", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: x.max(axis=1) + x.min(axis=1),
    ),
    "bmm with transpose(-2, -1)": (
        module(
            "a, b",
            "return torch.bmm(a, b.transpose(-2, -1)) * 0.125",
            "[torch.rand(B, N, K), torch.rand(B, N, K)]",
        ),  # fmt: skip
        {"a": (6, 10, 7), "b": (6, 10, 7)},
        lambda a, b: a @ b.transpose(0, 2, 1) * 0.125,
    ),
    "matrix-vector with a 1-d vector": (
        module("A, v", "return torch.matmul(A, v)", "[torch.rand(N, K), torch.rand(K)]"),
        {"A": (10, 7), "v": (7,)},
        lambda A, v: A @ v,
    ),
    ".t() and @": (
        module("A, C", "return A.t() @ C", "[torch.rand(K, N), torch.rand(K, B)]"),
        {"A": (7, 10), "C": (7, 6)},
        lambda A, C: A.T @ C,
    ),
    "activations": (
        module(
            "x",
            "return (F.gelu(x, approximate='tanh') + F.softplus(x) + F.elu(x, alpha=0.5)\n"
            "        + torch.selu(x) + F.silu(x) + torch.clamp(x, min=-0.5, max=0.5)\n"
            "        + torch.relu(x) + torch.sigmoid(x) * F.softsign(x) + torch.exp(x)\n"
            "        + torch.sqrt(torch.abs(x)) + torch.log(x * x + 1) - x * 2)",
            "[torch.randn(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: (
            _gelu_tanh(x)
            + _softplus(x)
            + _elu(x, 0.5)
            + SELU_SCALE * _elu(x, SELU_ALPHA)
            + x * _sigmoid(x)
            + np.clip(x, -0.5, 0.5)
            + np.maximum(x, 0)
            + _sigmoid(x) * x / (1 + np.abs(x))
            + np.exp(x)
            + np.sqrt(np.abs(x))
            + np.log(x * x + 1)
            - x * 2
        ),
    ),
    "modules and arguments from get_init_inputs": (
        module(
            "x",
            "return self.act(F.hardtanh(x, min_val=self.lo, max_val=self.hi))",
            "[torch.randn(B, N)]",
            ", lo, hi=2.0|self.lo = lo\nself.hi = hi\nself.act = nn.LeakyReLU(negative_slope=0.2)",
            "[-0.25]",
        ),
        {"x": (6, 10)},
        lambda x: _leaky(np.clip(x, -0.25, 2), 0.2),
    ),
    "losses with reduction='none'": (
        module(
            "p, t",
            "return (F.mse_loss(p, t, reduction='none')\n"
            "        + F.smooth_l1_loss(p, t, reduction='none', beta=0.5)\n"
            "        + F.huber_loss(p, t, reduction='none', delta=0.7))",
            "[torch.randn(B, N), torch.randn(B, N)]",
        ),
        {"p": (6, 10), "t": (6, 10)},
        lambda p, t: (
            (p - t) ** 2
            + np.where(np.abs(p - t) < 0.5, 0.5 * (p - t) ** 2 / 0.5, np.abs(p - t) - 0.25)
            + np.where(np.abs(p - t) < 0.7, 0.5 * (p - t) ** 2, 0.7 * (np.abs(p - t) - 0.35))
        ),
    ),
    "kl_div pointwise": (
        module(
            "p, t",
            "return F.kl_div(torch.log(p), t, reduction='none')",
            "[torch.rand(B, N).softmax(dim=-1), torch.rand(B, N).softmax(dim=-1)]",
        ),
        {"p": (6, 10), "t": (6, 10)},
        lambda p, t: t * (np.log(t) - np.log(p)),
        {"p": "positive", "t": "positive"},
    ),
    "hinge loss per row": (
        module(
            "p, t",
            "return torch.mean(torch.clamp(1 - p * t, min=0), dim=1)",
            "[torch.randn(B, N), torch.randint(0, 2, (B, N)).float() * 2 - 1]",
        ),
        {"p": (6, 10), "t": (6, 10)},
        lambda p, t: np.maximum(1 - p * t, 0).mean(axis=1),
        {"t": "sign"},
    ),
    "nn.LayerNorm over the last dimension": (
        module("x", "return self.ln(x)", "[torch.randn(B, K, N)]", "self.ln = nn.LayerNorm(N)"),
        {"x": (6, 7, 10)},
        lambda x: _norm(x, (2,)),
    ),
    "logsumexp, var and std": (
        module(
            "x",
            "return torch.logsumexp(x, dim=1) + x.var(dim=1) + torch.std(x, 1, unbiased=False)",
            "[torch.randn(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: (
            x.max(axis=1)
            + np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1))
            + x.var(axis=1, ddof=1)
            + x.std(axis=1)
        ),
    ),
    "einsum": (
        module(
            "a, b",
            "return torch.einsum('bij,bjk->bik', a, b)",
            "[torch.rand(B, N, K), torch.rand(B, K, N)]",
        ),
        {"a": (6, 10, 7), "b": (6, 7, 10)},
        lambda a, b: a @ b,
    ),
    "torch.where and comparisons": (
        module(
            "x",
            "return torch.where(x > 0, x, 0.1 * x) + ((x < 0.5) & (x > -0.5)).float()",
            "[torch.randn(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: np.where(x > 0, x, 0.1 * x) + ((x < 0.5) & (x > -0.5)),
    ),
    "F.normalize": (
        module("x", "return F.normalize(x, dim=1)", "[torch.randn(B, N)]"),
        {"x": (6, 10)},
        lambda x: x / np.maximum(np.sqrt((x**2).sum(axis=1, keepdims=True)), 1e-12),
    ),
    "broadcasts, view and shape": (
        module(
            "x, w",
            "return x * w.view(1, -1) + w.unsqueeze(0) - x.sum(dim=1, keepdim=True) / x.shape[1]",
            "[torch.randn(B, N), torch.randn(N)]",
        ),
        {"x": (6, 10), "w": (10,)},
        lambda x, w: x * w + w - x.sum(axis=1, keepdims=True) / 10,
    ),
    "BatchNorm2d in training mode": (
        module(
            "x", "return self.bn(x)", "[torch.randn(B, K, N, N)]", "self.bn = nn.BatchNorm2d(K)"
        ),
        {"x": (6, 7, 10, 10)},
        lambda x: _norm(x, (0, 2, 3)),
    ),
    "a Frobenius norm of everything": (
        module("x", "return x / torch.norm(x, p='fro')", "[torch.randn(B, N)]"),
        {"x": (6, 10)},
        lambda x: x / np.sqrt((x**2).sum()),
    ),
    "argmax": (
        module("x", "return torch.argmax(x, dim=2)", "[torch.randn(B, N, K)]"),
        {"x": (6, 10, 7)},
        lambda x: x.argmax(axis=2),
    ),
    "local variables; one with a reduction is a temporary": (
        module(
            "x",
            "ms = (x ** 2).mean(-1, keepdim=True)\ny = x * torch.rsqrt(ms + 1e-6)\n"
            "return y / x.sum(dim=1, keepdim=True) + torch.prod(x, 1, keepdim=True)",
            "[torch.rand(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: (
            x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-6) / x.sum(axis=1, keepdims=True)
            + x.prod(axis=1, keepdims=True)
        ),
    ),
    "nn.Sequential": (
        module(
            "x",
            "return self.f(x)",
            "[torch.randn(B, N)]",
            "self.f = nn.Sequential(nn.ReLU(), nn.Tanh(), nn.Hardsigmoid())",
        ),  # fmt: skip
        {"x": (6, 10)},
        lambda x: np.clip(np.tanh(np.maximum(x, 0)) / 6 + 0.5, 0, 1),
    ),
    "diag and tril": (
        module(
            "A, C",
            "return torch.diag(torch.diag(A)) @ C + torch.tril(A, diagonal=-1) @ C",
            "[torch.rand(N, N), torch.rand(N, K)]",
        ),
        {"A": (10, 10), "C": (10, 7)},
        lambda A, C: np.diag(np.diag(A)) @ C + np.tril(A, -1) @ C,
    ),
    "cosine similarity loss (each norm clamped at eps)": (
        module(
            "p, t",
            "return torch.mean(1 - F.cosine_similarity(p, t, dim=1))",
            "[torch.rand(B, N), torch.rand(B, N)]",
        ),
        {"p": (6, 10), "t": (6, 10)},
        lambda p, t: np.mean(
            1
            - (p * t).sum(1)
            / (
                np.maximum(np.linalg.norm(p, axis=1), 1e-8)
                * np.maximum(np.linalg.norm(t, axis=1), 1e-8)
            )
        ),
    ),
    "nn.TripletMarginLoss (pairwise distances with eps)": (
        module(
            "a, p, n",
            "return self.loss(a, p, n)",
            "[torch.rand(B, N), torch.rand(B, N), torch.rand(B, N)]",
            "self.loss = nn.TripletMarginLoss(margin=0.5)",
        ),
        {"a": (6, 10), "p": (6, 10), "n": (6, 10)},
        lambda a, p, n: np.mean(
            np.maximum(
                np.linalg.norm(a - p + 1e-6, axis=1) - np.linalg.norm(a - n + 1e-6, axis=1) + 0.5,
                0,
            )
        ),
    ),
}


def _softmax_np(x, axis):
    return np.exp(_log_softmax(x, axis))


def _np_group_norm(x, groups, w=None, b=None, eps=1e-5):
    g = x.reshape(x.shape[0], groups, -1)
    mu = g.mean(axis=2, keepdims=True)
    y = ((g - mu) / np.sqrt(((g - mu) ** 2).mean(axis=2, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


_ROWS = np.arange(6)[:, None]
# slices, concatenations, flips, gathers and group norms: name -> as FEATURES
SHIFTS = {
    "x[:, 1:] - x[:, :-1] (slices)": (
        module("x", "return x[:, 1:] - x[:, :-1]", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: x[:, 1:] - x[:, :-1],
    ),
    "x[:, 0] and select(1, -1)": (
        module("x", "return x[:, 0] + x.select(1, -1) * 2", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: x[:, 0] + x[:, -1] * 2,
    ),
    "narrow of a computed value": (
        module("x", "return torch.narrow(x.exp() + 1, 1, 2, 3)", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: np.exp(x[:, 2:5]) + 1,
    ),
    "flip": (
        module("x", "return x.flip(1) * 2 + torch.flip(x, dims=(0,))", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: x[:, ::-1] * 2 + x[::-1],
    ),
    "torch.cat of inputs and computed values": (
        module("x, y", "return torch.cat((x, y.exp(), x * 2), dim=1)", "[torch.rand(B, N), torch.rand(B, K)]"),
        {"x": (6, 10), "y": (6, 7)},
        lambda x, y: np.concatenate([x, np.exp(y), x * 2], axis=1),
    ),
    "an exclusive cumprod (ones before the scan)": (
        module(
            "x",
            "c = torch.cumprod(x[:, :-1], dim=1)\nreturn torch.cat((torch.ones_like(x[:, :1]), c), 1)",
            "[torch.rand(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: np.concatenate([np.ones((6, 1)), np.cumprod(x[:, :-1], axis=1)], axis=1),
    ),
    "a reverse cumprod of a computed value (flip, scan, flip)": (
        module("x", "return torch.cumprod((x / 4 + 1).flip(1), 1).flip(1)", "[torch.rand(B, N)]"),
        {"x": (6, 10)},
        lambda x: np.cumprod((x / 4 + 1)[:, ::-1], axis=1)[:, ::-1],
    ),
    "a reverse exclusive cumsum (zeros after the suffix scan)": (
        module(
            "x",
            "s = torch.cumsum(x[:, 1:].flip(1), 1).flip(1)\n"
            "return torch.cat((s, torch.zeros_like(x[:, :1])), dim=1)",
            "[torch.rand(B, N)]",
        ),
        {"x": (6, 10)},
        lambda x: np.array([[x[r, c + 1 :].sum() for c in range(10)] for r in range(6)]),
    ),
    "torch.gather": (
        module("x, i", "return torch.gather(x, 1, i) * 2", "[torch.rand(B, N), torch.randint(0, N, (B, K))]"),
        {"x": (6, 10), "i": (6, 7)},
        lambda x, i: np.take_along_axis(x, i, axis=1) * 2,
        {"i": "index 10"},
    ),
    "F.nll_loss of log_softmax, reduction='sum'": (
        module(
            "x, t",
            "return F.nll_loss(F.log_softmax(x, dim=1), t, reduction='sum')",
            "[torch.rand(B, N), torch.randint(0, N, (B,))]",
        ),
        {"x": (6, 10), "t": (6,)},
        lambda x, t: -_log_softmax(x, 1)[np.arange(6), t].sum(),
        {"t": "index 10"},
    ),
    "nn.CrossEntropyLoss(label_smoothing, reduction='none')": (
        module(
            "x, t",
            "return self.ce(x, t)",
            "[torch.rand(B, N), torch.randint(0, N, (B,))]",
            "self.ce = nn.CrossEntropyLoss(reduction='none', label_smoothing=0.2)",
        ),
        {"x": (6, 10), "t": (6,)},
        lambda x, t: -(0.8 * _log_softmax(x, 1)[np.arange(6), t] + 0.2 * _log_softmax(x, 1).mean(1)),
        {"t": "index 10"},
    ),
    "F.cross_entropy with class probabilities": (
        module(
            "x, p",
            "return F.cross_entropy(x, p)",
            "[torch.rand(B, N), torch.rand(B, N).softmax(dim=1)]",
        ),
        {"x": (6, 10), "p": (6, 10)},
        lambda x, p: np.mean(-(p * _log_softmax(x, 1)).sum(1)),
        {"p": "positive"},
    ),
    "F.cross_entropy over (batch, classes, length)": (
        module(
            "x, t",
            "return F.cross_entropy(x, t)",
            "[torch.rand(B, N, K), torch.randint(0, N, (B, K))]",
        ),
        {"x": (6, 10, 7), "t": (6, 7)},
        lambda x, t: -np.mean(np.take_along_axis(_log_softmax(x, 1), t[:, None], axis=1)),
        {"t": "index 10"},
    ),
    "F.group_norm with weight and bias": (
        module(
            "x, w, b",
            "return F.group_norm(x, 2, w, b, eps=1e-3)",
            "[torch.rand(B, N, K), torch.rand(N), torch.rand(N)]",
        ),
        {"x": (6, 10, 7), "w": (10,), "b": (10,)},
        lambda x, w, b: _np_group_norm(x, 2, w, b, eps=1e-3),
    ),
    "nn.GroupNorm of a computed value, one group": (
        module("x", "return self.gn(x * 3 + 1)", "[torch.rand(B, N, K)]", "self.gn = nn.GroupNorm(1, N)"),
        {"x": (6, 10, 7)},
        lambda x: _np_group_norm(x * 3 + 1, 1),
    ),
    "nn.GroupNorm of a computed value, five groups": (
        module("x", "return self.gn(x.exp())", "[torch.rand(B, N, K)]", "self.gn = nn.GroupNorm(5, N)"),
        {"x": (6, 10, 7)},
        lambda x: _np_group_norm(np.exp(x), 5),
    ),
    "a boolean mask input (a comparison in get_inputs)": (
        module("x, m", "return torch.where(m, x, 0.0) + x * ~m", "[torch.rand(B, N), torch.rand(B, N) > 0.5]"),
        {"x": (6, 10), "m": (6, 10)},
        lambda x, m: np.where(m != 0, x, 0) + x * (m == 0),
        {"m": "index 2"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FEATURES) + list(SHIFTS))
def test_an_operation_means_what_torch_means(name):
    text, shapes, expected, *kinds = FEATURES.get(name) or SHIFTS[name]
    kinds = kinds[0] if kinds else {}
    t = translate(text, "task.py")
    rng = np.random.default_rng(len(name))
    arrays = {}
    for k, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        if kinds.get(k) == "positive":
            a = np.abs(a) + np.float32(0.1)
        elif kinds.get(k) == "sign":
            a = np.where(a > 0, 1, -1).astype(np.float32)
        elif kinds.get(k, "").startswith("index "):  # int indices in [0, n)
            a = rng.integers(0, int(kinds[k].split()[1]), shape).astype(np.int32)
        arrays[k] = a
    got = run_reference(t, arrays, t.sizes)
    as64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    want = np.asarray(expected(**as64))
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-9, atol=1e-12)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_the_kernels_of_slices_gathers_and_group_norms_agree_with_their_references(tmp_path):
    """The kernels of the tasks above that shift, gather, split or scan from the end, as host
    C++ against their references (which the test above checks against torch's definitions)."""
    from tests.test_generate import on_disk, run_on_host

    kernels = [
        on_disk(translate(SHIFTS[name][0], f"shift{k}.py").formula, f"shift{k}", tmp_path)
        for k, name in enumerate(SHIFTS)
    ]
    failures = run_on_host(kernels, tmp_path)
    assert not failures, failures


# ---- what is not covered: one line, at the task's line and column ------------------------------

BAD = [
    (
        module("x", "return x[:, ::2]", "[torch.rand(B, N)]"),
        "(a slice, an offset or a concatenation)",
    ),
    (
        module("x", "return torch.roll(x, 1, 1)", "[torch.rand(B, N)]"),
        "(a slice, an offset or a concatenation)",
    ),
    (
        module("x", "return torch.cat((torch.cumsum(x, 1), x), 1)", "[torch.rand(B, N)]"),
        "a concatenation with a scan is covered where",
    ),
    (
        module("x", "return torch.cumsum(x, 1)[:, 1:]", "[torch.rand(B, N)]"),
        "a scan read at `",
    ),
    (
        module("x, t", "return F.cross_entropy(x, t.float())", "[torch.rand(B, N), torch.rand(B)]"),
        "the shapes do not broadcast",
    ),
    (
        module(
            "x, t",
            "return F.cross_entropy(x, t, weight=x[0])",
            "[torch.rand(B, N), torch.randint(0, N, (B,))]",
        ),
        "a class weight is not covered",
    ),
    (
        module("x, t", "return torch.gather(x, 1, t)", "[torch.rand(B, N), torch.rand(B, N)]"),
        "the indices are covered as an int input of forward",
    ),
    (module("x", "return x.view(B, -1)", "[torch.rand(B, N, K)]"), "(a reshape that merges or"),
    (
        module("x", "return self.l(x)", "[torch.rand(B, N)]", "self.l = nn.Linear(N, K)"),
        "nn.Linear (a layer with a learned weight) is not covered",
    ),
    (
        module("x", "for i in range(3):\n    x = x * 2\nreturn x", "[torch.rand(B, N)]"),
        "`for` in forward is not covered",
    ),
    (module("x", "return torch.sort(x, dim=1)[0]", "[torch.rand(B, N)]"), "(sorting or selection)"),
    (module("x", "return torch.frobnicate(x)", "[torch.rand(B, N)]"), "`torch.frobnicate` is not"),
    (module("x", "return x, x", "[torch.rand(B, N)]"), "forward returns several results"),
    (
        module("x", "return torch.cumsum(x, 1) * 2", "[torch.rand(B, N)]"),
        "covered as the whole result of forward",
    ),
    (module("x", "return x + torch.rand_like(x)", "[torch.rand(B, N)]"), "(random numbers)"),
    (
        module("x", "return torch.logcumsumexp(x, 1)", "[torch.rand(B, N)]"),
        "(a scan) is not covered",
    ),
    (module("x", "return x", "[torch.rand(B, N), torch.rand(N)]"), "forward takes 1 (x)"),
    (module("x", "return x @ x", "[torch.rand(B, N)]"), "matmul: the inner dimensions differ"),
    (module("x", "return x // 2", "[torch.rand(B, N)]"), "(rounding) is not covered"),
    (module("x", "if x.sum() > 0:\n    x = -x\nreturn x", "[torch.rand(B, N)]"), "a branch on"),
    (module("x", "return x", "[torch.tensor([1.0, 2.0])]"), "cannot tell the shape of input 1"),
    ("import torch\n\nclass Model:\n    pass\n", "`class Model` has no `forward`"),
    ("import torch\nx = 1\n", "no `class Model` in the task"),
    ("class Model(nn.Module:\n    pass\n", "cannot read the task"),
]


@pytest.mark.parametrize(("text", "what"), BAD, ids=[b[1][:40] for b in BAD])
def test_what_is_not_covered_is_one_line_at_its_place(text, what):
    with pytest.raises(FormulaError) as e:
        translate(text, "task.py")
    message = str(e.value)
    assert "\n" not in message and message.startswith("task.py:"), message
    assert what in message, message
    assert e.value.exit_code == ExitCode.BAD_FORMULA


def test_the_task_is_read_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = module("x", "return torch.relu(x)", "[torch.rand(B, N)]")
    text = "open('RAN', 'w').write('x')\nraise SystemExit(3)\n" + text
    t = translate(text, "task.py")
    assert t.formula.endswith("out[b, n] = max(x[b, n], 0)")
    assert not (tmp_path / "RAN").exists()


# ---- the command ---------------------------------------------------------------------------------


def invoke(*args: str):
    result = CliRunner().invoke(main, ["generate", *args], catch_exceptions=False)
    assert "Traceback" not in result.output + result.stderr
    return result


def the_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("optiml: error: "), lines
    return lines[0].removeprefix("optiml: error: ")


def test_a_task_that_is_not_covered_exits_24_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = module("x", "y = x * 2\nreturn torch.roll(y, 1, 1)", "[torch.rand(B, N)]")
    (tmp_path / "task.py").write_text(text)
    result = invoke("--from-torch", "task.py")
    assert result.exit_code == 24
    error = the_error(result)
    what = "`torch.roll` (a slice, an offset or a concatenation) is not covered"
    assert error.startswith("task.py:") and what in error, error
    line = int(error.removeprefix("task.py:").split(":")[0])
    assert "torch.roll" in text.splitlines()[line - 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task.py"]


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (
            "import torch\n\nclass Model(nn.Module):\n    def forward(self, x)\n",
            "4:",
            "cannot read",
        ),
        ("import torch\n\ndef get_inputs():\n    return []\n", "1:1", "no `class Model`"),
    ],
    ids=["syntax error", "no Model"],
)
def test_a_file_that_is_not_a_task_exits_24_with_one_line(text, where, what, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "task.py").write_text(text)
    result = invoke("--from-torch", "task.py")
    assert result.exit_code == 24
    error = the_error(result)
    assert error.startswith(f"task.py:{where}") and what in error, error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task.py"]


def test_usage_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke("--from-torch", "missing.py").exit_code == ExitCode.FILE
    both = invoke("y[i] = x[i]", "--from-torch", "missing.py")
    assert both.exit_code == 2 and "not both" in the_error(both)
    neither = invoke()
    assert neither.exit_code == 2 and "missing FORMULA" in the_error(neither)


@needs_kb
@needs_nvcc
def test_generate_from_torch_writes_the_kernel_and_its_reference_then_checks_them(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "optiml.cli",
            "generate",
            "--from-torch",
            str(task_file(20)),
            "--no-optimize",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["LeakyReLU.cu", "LeakyReLU_ref.py"]
    assert "LeakyReLU" in p.stdout and "ok" in p.stdout  # the check's table
    assert "as a formula: float x[batch_size, dim]; batch_size = 4096" in p.stderr
    _, _, spec = load(tmp_path / "LeakyReLU.cu", "LeakyReLU")
    assert spec.sizes[0] == {"batch_size": 4096, "dim": 393216}
    assert spec.reference.function == "LeakyReLU"


# ---- convolutions, pooling, scans and losses, at small sizes -----------------------------------


def _t(v, r):
    return tuple(v) if isinstance(v, tuple | list) else (v,) * r


def np_conv(x, w, b=None, s=1, p=0, d=1, g=1):
    """torch's convolution: cross-correlation of zero-padded x with w (out, in/groups, k...),
    through sliding windows of the dilated kernel's extent."""
    r = w.ndim - 2
    s, p, d, ks = _t(s, r), _t(p, r), _t(d, r), w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0), *((q, q) for q in p)])
    ext = tuple(dd * (k - 1) + 1 for dd, k in zip(d, ks, strict=True))
    win = sliding_window_view(xp, ext, axis=tuple(range(2, 2 + r)))
    win = win[(slice(None), slice(None), *(slice(None, None, q) for q in s))]
    win = win[(Ellipsis, *(slice(None, None, q) for q in d))]
    ci, co = x.shape[1] // g, w.shape[0] // g
    o, k = "def"[:r], "ijk"[:r]
    y = np.concatenate(
        [
            np.einsum(
                f"bc{o}{k},oc{k}->bo{o}", win[:, i * ci : (i + 1) * ci], w[i * co : (i + 1) * co]
            )
            for i in range(g)
        ],
        axis=1,
    )
    return y if b is None else y + b.reshape(1, -1, *[1] * r)


def np_conv_t(x, w, s=1, p=0, op=0, d=1, g=1):
    """torch's transposed convolution: each input element scatters x·w[:, :, k] to
    i·stride + k·dilation, then `padding` is cropped from both ends (output_padding added)."""
    r = w.ndim - 2
    s, p, op, d, ks = _t(s, r), _t(p, r), _t(op, r), _t(d, r), w.shape[2:]
    n = x.shape[2:]
    ci, co = x.shape[1] // g, w.shape[1]
    full = [
        (a - 1) * q + dd * (k - 1) + 1 + o for a, q, dd, k, o in zip(n, s, d, ks, op, strict=True)
    ]
    y = np.zeros((x.shape[0], co * g, *full))
    for kpos in np.ndindex(*ks):
        at = tuple(
            slice(k * dd, k * dd + (a - 1) * q + 1, q)
            for k, dd, a, q in zip(kpos, d, n, s, strict=True)
        )
        for i in range(g):
            part = np.einsum(
                "bc...,co->bo...",
                x[:, i * ci : (i + 1) * ci],
                w[i * ci : (i + 1) * ci][(slice(None), slice(None), *kpos)],
            )
            y[(slice(None), slice(i * co, (i + 1) * co), *at)] += part
    return y[(slice(None), slice(None), *(slice(q, f - q) for q, f in zip(p, full, strict=True)))]


def np_pool(x, op, r, k, s=None, p=0, d=1):
    """torch's max pooling (padding is -inf) and average pooling (zeros counted)."""
    k, s, p, d = _t(k, r), _t(k if s is None else s, r), _t(p, r), _t(d, r)
    lead = x.ndim - r
    xp = np.pad(
        x, [(0, 0)] * lead + [(q, q) for q in p], constant_values=-np.inf if op == "max" else 0
    )
    ext = tuple(dd * (kk - 1) + 1 for dd, kk in zip(d, k, strict=True))
    win = sliding_window_view(xp, ext, axis=tuple(range(lead, lead + r)))
    win = win[(*[slice(None)] * lead, *(slice(None, None, q) for q in s))]
    win = win[(Ellipsis, *(slice(None, None, q) for q in d))]
    axes = tuple(range(-r, 0))
    return win.max(axis=axes) if op == "max" else win.mean(axis=axes)


def _huber(p, t):
    a = np.abs(p - t)
    return np.mean(np.where(a < 1, 0.5 * a**2, a - 0.5))


def _kl(p, t):  # kl_div(log(p), t, 'batchmean'): sum of t (log t - log p) over the batch size
    return np.sum(np.where(t > 0, t * np.log(t), 0) - t * np.log(p)) / p.shape[0]


_B2 = {"batch_size": 2}
# task -> (constants at small sizes, torch's semantics in NumPy on (x, weights...) in torch's layout)
SMALL_TASKS = {
    42: ({**_B2, "channels": 3, "height": 9, "width": 8}, lambda x: np_pool(x, "max", 2, 4, 1, 1, 1)),
    44: ({**_B2, "in_channels": 3, "input_length": 20}, lambda x: np_pool(x, "avg", 1, 8, 1, 4)),
    46: ({**_B2, "channels": 2, "depth": 5, "height": 6, "width": 7}, lambda x: np_pool(x, "avg", 3, 3, 2, 1)),
    50: (_B2, lambda x, w, b: np_conv(x, w, b, s=4, p=2)),
    54: ({**_B2, "in_channels": 2, "out_channels": 3, "depth": 6, "width": 5, "height": 7}, np_conv),
    56: ({**_B2, "in_channels": 3, "out_channels": 4, "height": 9, "width": 11}, np_conv),
    58: ({**_B2, "in_channels": 3, "out_channels": 2, "depth_in": 3, "height_in": 4, "width_in": 5}, np_conv_t),
    60: ({**_B2, "in_channels": 2, "out_channels": 3, "width": 9, "height": 8, "depth": 7}, np_conv),
    62: ({**_B2, "in_channels": 3, "out_channels": 4, "width": 12, "height": 10}, np_conv),
    64: ({**_B2, "in_channels": 3, "out_channels": 4, "length": 9}, np_conv_t),
    66: ({**_B2, "in_channels": 2, "out_channels": 3, "depth": 5, "height": 7, "width": 9}, np_conv),
    68: ({**_B2, "in_channels": 3, "out_channels": 2, "depth": 3, "width": 4, "height": 5}, np_conv_t),
    70: ({**_B2, "in_channels": 3, "out_channels": 2, "depth": 4, "height": 3, "width": 5}, np_conv_t),
    72: (
        {**_B2, "in_channels": 8, "out_channels": 8, "depth": 3, "height": 4, "width": 5},
        lambda x, w: np_conv_t(x, w, s=2, p=(1, 2, 3), op=1, g=4),
    ),
    74: ({**_B2, "in_channels": 3, "out_channels": 2, "length": 10}, lambda x, w: np_conv_t(x, w, d=3)),
    76: ({**_B2, "in_channels": 3, "out_channels": 2, "length": 30}, lambda x, w: np_conv(x, w, s=3, d=4)),
    78: ({**_B2, "in_channels": 3, "out_channels": 2, "height": 6, "width": 9}, lambda x, w: np_conv_t(x, w, p=(1, 3))),
    80: (
        {**_B2, "in_channels": 3, "out_channels": 2, "width": 20, "height": 16},
        lambda x, w: np_conv(x, w, p=(2, 4), d=(2, 3)),
    ),
    82: ({**_B2, "in_channels": 3, "width": 8, "height": 7}, lambda x, w: np_conv(x, w, g=3)),
    84: ({**_B2, "in_channels": 3, "out_channels": 3, "width_in": 8, "height_in": 7}, lambda x, w: np_conv(x, w, g=3)),
    86: (
        {**_B2, "in_channels": 3, "out_channels": 4, "width": 6, "height": 5},
        lambda x, w, w2: np_conv(np_conv(x, w, p=1, g=3), w2),
    ),
    90: ({"batch_size": 3, "input_shape": (7,)}, lambda x: np.cumprod(x, axis=1)),
    92: (
        {"batch_size": 3, "input_shape": (7,)},
        lambda x: np.concatenate([np.zeros((3, 1)), np.cumsum(x[:, :-1], axis=1)], axis=1),
    ),
    94: ({"batch_size": 3, "input_shape": (7,)}, lambda p, t: np.mean((p - t) ** 2)),
    96: ({"batch_size": 3, "input_shape": (7,)}, _huber),
    98: ({"batch_size": 3, "input_shape": (7,)}, _kl),
    100: ({"batch_size": 6, "input_shape": (6,)}, lambda p, t: np.mean(np.maximum(1 - p * t, 0))),
}  # fmt: skip

# the weights' shapes in torch's layout: conv (out, in / groups, k...), transposed (in, out / groups, k...)
WEIGHTS = {
    50: [(96, 3, 11, 11), (96,)],
    54: [(3, 2, 3, 3, 3)],
    56: [(4, 3, 5, 7)],
    58: [(3, 2, 3, 5, 7)],
    60: [(3, 2, 3, 5, 7)],
    62: [(4, 3, 5, 9)],
    64: [(3, 4, 3)],
    66: [(3, 2, 3, 5, 7)],
    68: [(3, 2, 3, 5, 5)],
    70: [(3, 2, 3, 3, 3)],
    72: [(8, 2, 3, 5, 7)],
    74: [(3, 2, 5)],
    76: [(2, 3, 3)],
    78: [(3, 2, 3, 7)],
    80: [(2, 3, 5, 9)],
    82: [(3, 1, 3, 3)],
    84: [(3, 1, 3, 3)],
    86: [(3, 1, 3, 3), (4, 3, 1, 1)],
}


def _small(n: int) -> tuple[Translation, dict[str, np.ndarray]]:
    """Task n translated at small sizes, and inputs for it: forward's (as get_inputs shapes them:
    positive where torch takes a log, ±1 targets) and the module's weights in torch's layout."""
    overrides, _ = SMALL_TASKS[n]
    path = task_file(n)
    t = translate(path.read_text(), path.name, overrides=overrides)
    rng = np.random.default_rng(n)
    g = generate(t.formula, t.name)
    arrays = {}
    shapes = iter(WEIGHTS.get(n, []))
    for name in t.inputs:
        dims = [
            g.checked.sizes[d].value if d in g.checked.sizes else int(d)
            for d in g.checked.tensors[name].dims
        ]
        if name.startswith("weight") or name == "bias":
            shape = next(shapes)
            assert math.prod(shape) == math.prod(dims), (name, shape, dims)  # the same memory
        else:
            shape = dims
        arrays[name] = rng.uniform(0.05, 1.0, shape) if n == 98 else rng.standard_normal(shape)
    if n == 100:
        arrays["targets"] = np.sign(arrays["targets"])
    return t, arrays


@needs_kb
@pytest.mark.parametrize("n", sorted(SMALL_TASKS))
def test_windows_scans_and_losses_compute_what_torch_computes_at_small_sizes(n):
    t, arrays = _small(n)
    got = run_reference(t, arrays, t.sizes)
    want = np.asarray(SMALL_TASKS[n][1](*(arrays[name] for name in t.inputs)))
    assert got.shape == (want.size,)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-9, atol=1e-12)


@needs_kb
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_their_kernels_agree_with_their_references_on_the_host(tmp_path):
    """The generated kernels of the new tasks, at small sizes, as host C++ against the
    generated references (which the test above checks against torch's definitions)."""
    from tests.test_generate import on_disk, run_on_host

    kernels = [on_disk(t.formula, t.name, tmp_path) for t, _ in map(_small, sorted(SMALL_TASKS))]
    failures = run_on_host(kernels, tmp_path)
    assert not failures, failures
