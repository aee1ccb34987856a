"""A flat thread index taken apart with `/` and `%` read as coordinates (optiml.lift.coords): the
place values, the extents from the guard, and a model that computes what the original computes
when run on the virtual launch it describes."""

from __future__ import annotations

import numpy as np
import pytest

from optiml.cuda.source import SourceFile
from optiml.lift import Lifted, lift
from optiml.lift.coords import NotSplit, delinearize
from optiml.lift.run import run
from optiml.spec import parse_spec


def lifted(text: str) -> Lifted:
    src = SourceFile(text, "k.cu")
    k = src.kernels[0]
    out = lift(src, k, parse_spec(src, k))
    assert isinstance(out, Lifted), out.message()
    return out


FLAT_MM = """
/* @optiml
 *   args:   A: in float[M * K], B: in float[K * N], C: out float[M * N]
 *   launch: grid = cdiv(M * N, 128), block = 128
 *   sizes:  M, N, K = (64, 48, 32), (7, 5, 3)
 */
__global__ void mm(const float* A, const float* B, float* C, int M, int N, int K) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * N) return;
    int row = idx / N, col = idx % N;
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += A[row * K + k] * B[k * N + col];
    C[idx] = s;
}
"""

# Three levels, size_t, the middle digit as (i / N) % M, a broadcast along the batch.
FLAT_BATCHED = """
/* @optiml
 *   args:   X: in float[Z * M * N], b: in float[M], Y: out float[Z * N * M]
 *   launch: grid = cdiv(Z * M * N, 256), block = 256
 *   sizes:  Z, M, N = (4, 64, 48), (3, 5, 7)
 */
__global__ void shift_t(const float* X, const float* b, float* Y, int Z, int M, int N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)Z * M * N) {
        size_t z = i / ((size_t)M * N);
        size_t m = (i / N) % M;
        size_t n = i % N;
        Y[z * N * M + n * M + m] = X[i] + b[m];
    }
}
"""

# No bound on the flat index: the guard bounds the row and the column it yields.
GUARDED_DIGITS = """
/* @optiml
 *   args:   X: in float[R * C], Y: out float[C * R]
 *   launch: grid = cdiv(R * C, 64), block = 64
 *   sizes:  R, C = (64, 48), (7, 5)
 */
__global__ void tr(const float* X, float* Y, int R, int C) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int r = t / C;
    int c = t % C;
    if (r < R && c < C) Y[c * R + r] = X[r * C + c];
}
"""


def _run_both(text: str, sizes: dict[str, int], extents: list[int], block: int):
    """The original model on its 1-D launch and the delinearized one on the virtual launch."""
    model = lifted(text)
    virtual, flat = delinearize(model)
    rng = np.random.default_rng(0)
    args: dict = dict(sizes)
    for name, t in model.tensors.items():
        n = int(np.prod(list(sizes.values())))
        args[name] = rng.standard_normal(n) if t.role == "in" else np.zeros(n)
    if "b" in model.tensors:
        args["b"] = rng.standard_normal(sizes["M"])
    total = int(np.prod(extents))
    want = run(model, args, (-(-total // block), 1, 1), (block, 1, 1))
    grid = (-(-extents[0] // 8), *extents[1:], *[1] * (3 - len(extents)))
    got = run(virtual, args, grid[:3], (8, 1, 1))
    return want, got, flat


def test_a_flat_matmul_reads_as_rows_and_columns():
    _, flat = delinearize(lifted(FLAT_MM))
    assert flat.places == ((1, ()), (1, ("N",)))
    assert flat.extents == ((1, ("N",)), (1, ("M",)))
    assert flat.axes == ("x", "y") and flat.total == (1, ("M", "N"))
    want, got, _ = _run_both(FLAT_MM, {"M": 7, "N": 5, "K": 3}, [5, 7], 128)
    assert np.allclose(want["C"], got["C"]) and np.abs(want["C"]).sum() > 0


def test_three_levels_with_a_middle_digit():
    _, flat = delinearize(lifted(FLAT_BATCHED))
    assert flat.places == ((1, ()), (1, ("N",)), (1, ("M", "N")))
    assert flat.extents == ((1, ("N",)), (1, ("M",)), (1, ("Z",)))
    want, got, _ = _run_both(FLAT_BATCHED, {"Z": 3, "M": 5, "N": 7}, [7, 5, 3], 256)
    assert np.allclose(want["Y"], got["Y"]) and np.abs(want["Y"]).sum() > 0


def test_guards_on_the_digits_leave_the_last_extent_to_the_reader():
    _, flat = delinearize(lifted(GUARDED_DIGITS))
    assert flat.extents == ((1, ("C",)), None) and flat.total is None


@pytest.mark.parametrize(
    "old,new,why",
    [
        ("int idx = blockIdx.x * blockDim.x + threadIdx.x;", "int idx = threadIdx.x;", "outside"),
        ("if (idx >= M * N) return;", "if (idx >= M * K) return;", "multiple"),
        ("int row = idx / N, col = idx % N;", "int row = idx / N, col = idx % K;", "divide"),
        ("int row = idx / N, col = idx % N;", "int row = idx, col = idx;", "not taken apart"),
    ],
    ids=["threadIdx-alone", "bound-not-a-multiple", "unrelated-places", "no-division"],
)
def test_refused(old, new, why):
    assert old in FLAT_MM
    with pytest.raises(NotSplit, match=why):
        delinearize(lifted(FLAT_MM.replace(old, new)))


# ---- distinct_per_value: a store at a counter's digits, one element per value ----------------


def _index(text: str):
    """The model's expression of `text` (Python's `//` and `%`) over a long counter `k`, int
    sizes B, F, H, W and a thread index `t`."""
    import ast

    from optiml.lift.model import LONG, Binary, Builtin, Cast, Const, Param, Var

    k = Var("k", LONG)
    names = {n: Param(n, "int") for n in "BFHW"} | {"k": k, "t": Builtin("threadIdx.x")}
    ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}

    def parse(node):
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.Constant):
            return Const(node.value, LONG)
        a, b = parse(node.left), parse(node.right)
        return Binary(ops[type(node.op)], a, b if b.type == LONG else Cast(b, LONG), LONG)

    return parse(ast.parse(text, mode="eval").body), k


@pytest.mark.parametrize(
    "text,distinct",
    [
        ("k", True),
        ("3 * k + F", True),
        # a batch norm's element of channel F: (b, h, w) the digits of k
        ("((k // W // H * F + 2) * H + k // W % H) * W + k % W", True),
        # the digits' place values not multiples of the spans below them: (h, w) and (h + 1, w - W)
        ("(k // W % H) * W + (k // W // H) * W + k % W", False),
        # a digit left out: every h shares its element
        ("(k // W // H) * H * W + k % W", False),
        # a place value that is a thread's index (it may be 0)
        ("(k // W) * t + k % W", False),
        # a division that cuts across digits
        ("k // 3 % W * 7 + k % 2", False),
    ],
)
def test_a_store_at_a_counters_digits_is_one_element_per_value(text, distinct):
    from optiml.lift.coords import distinct_per_value

    index, k = _index(text)
    assert distinct_per_value(index, k) is distinct
