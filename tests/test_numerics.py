"""`optiml check`'s notes on rounding: where the kernel, as the reference its rewrites are checked
against, rounds in a way a correct rewrite need not reproduce."""

from __future__ import annotations

import tomllib

import pytest

from optiml.cuda.kernel_ast import KernelAST
from optiml.cuda.source import SourceFile
from optiml.profile.numerics import rounding_notes
from optiml.spec import parse_spec
from tests.support import FIXTURES


def notes(text: str, kernel: str, path: str = "k.cu") -> list[str]:
    source = SourceFile(text, path)
    k = source.kernel(kernel)
    spec = parse_spec(source, k) if k.spec_comment else None
    return rounding_notes(KernelAST(source, k), spec)


SPEC = """/* @optiml
 *   args:   x: in float[n], out: inout float[1]
 *   launch: grid = cdiv(n, 256), block = 256
 *   sizes:  n = 1 << 20, 1000003
 */
"""


@pytest.mark.parametrize(
    "body",
    [
        "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) atomicAdd(out, x[i]);",
        "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) atomicAdd(&out[0], x[i] * x[i]);",
        "int i = threadIdx.x + blockIdx.x * blockDim.x; float* acc = out; "
        "if (i < n) { float d = x[i]; atomicAdd(acc + 0, d / n); }",
    ],
    ids=["pointer", "element-zero", "alias"],
)
def test_one_float_address_for_every_thread_is_noted(body):
    text = SPEC + f"__global__ void k(const float* x, float* out, int n) {{ {body} }}"
    (note,) = notes(text, "k")
    assert "every thread adds a float into the same address" in note and "reference:" in note


@pytest.mark.parametrize(
    "body",
    [
        # one address per thread: no sum across threads
        "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) atomicAdd(&out[i], x[i]);",
        # one address per block (a per-block slot picked through a thread-dependent name)
        "int b = blockIdx.x; int i = b * blockDim.x + threadIdx.x; if (i < n) atomicAdd(out + b, x[i]);",
    ],
    ids=["per-thread", "per-block"],
)
def test_addresses_that_depend_on_the_thread_are_not(body):
    text = SPEC.replace("inout float[1]", "inout float[n]") + (
        f"__global__ void k(const float* x, float* out, int n) {{ {body} }}"
    )
    assert notes(text, "k") == []


def test_integer_atomics_are_exact():
    text = SPEC.replace("x: in float[n], out: inout float[1]", "x: in int[n], out: inout int[1]")
    text += (
        "__global__ void k(const int* x, int* out, int n) { int i = blockIdx.x * blockDim.x + "
        "threadIdx.x; if (i < n) atomicAdd(out, x[i]); }"
    )
    assert notes(text, "k") == []


GEMV = """/* @optiml
 *   args:   A: in float[M * N], x: in float[N], y: out float[M]
 *   launch: grid = cdiv(M, 256), block = 256
 *   sizes:  M, N = (1024, 4096), (1000, 333)
{tol} */
__global__ void gemv(const float* A, const float* x, float* y, int M, int N) {{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M) {{
        float sum = 0.0f;
        for (int j = 0; j < N; j++) sum += A[row * N + j] * x[j];
        y[row] = sum;
    }}
}}
"""


def test_a_loop_sum_under_the_default_tolerance_is_noted():
    (note,) = notes(GEMV.format(tol=""), "gemv")
    assert note.startswith("`sum` adds a loop's float terms one at a time") and "`tol`" in note


def test_a_loop_sum_with_its_own_tolerance_is_not():
    assert notes(GEMV.format(tol=" *   tol:    rtol = 1e-4, atol = 1e-4\n"), "gemv") == []


def test_a_sum_restarted_inside_the_loop_is_not():
    text = GEMV.format(tol="").replace(
        "float sum = 0.0f;\n        for (int j = 0; j < N; j++) sum += A[row * N + j] * x[j];",
        "for (int j = 0; j < N; j++) { float sum = 0.0f; sum += A[row * N + j] * x[j]; y[row] = sum; }",
    )
    assert notes(text, "gemv") == []


def entries():
    for manifest, folder in (
        (FIXTURES / "manifest.toml", FIXTURES),
        (FIXTURES / "wild" / "manifest.toml", FIXTURES / "wild"),
    ):
        for e in tomllib.loads(manifest.read_text())["fixture"]:
            yield pytest.param(folder / e["file"], e["kernel"], id=f"{e['file']}::{e['kernel']}")


# The fixtures where the notes apply; none of the others gets one.
NOTED = {
    ("reduce_sum.cu", "reduce_sum"): "atomicAdd(sum, ...)",
    ("atomic_sum.cu", "sum_atomic"): "atomicAdd(total, ...)",
    ("mse.cu", "mse_loss"): "atomicAdd(loss, ...)",
    ("gemv.cu", "gemv"): "`sum` adds a loop's float terms",
}


@pytest.mark.parametrize("path,kernel", list(entries()))
def test_fixtures(path, kernel):
    found = notes(path.read_text(), kernel, str(path))
    expected = NOTED.get((path.name, kernel))
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0]
