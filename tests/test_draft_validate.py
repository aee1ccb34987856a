"""A drafted spec is checked before it is shown: it parses, the file compiles with it, and every
access the lifted model makes stays inside its drafted length at the smallest size; what fails
is a guess line of the draft. On a GPU, every output element is shown to be written."""

from __future__ import annotations

import warnings

import pytest

from optiml.cuda.draft import draft
from optiml.cuda.source import SourceFile
from optiml.cuda.validate import outputs_written, validate
from optiml.errors import SourceWarning, ToolMissing

DIFF = """
__global__ void diff(const float* x, float* d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = x[i + 1] - x[i];
}
int main() {
    int n = 1000; float *x, *d;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&d, n * sizeof(float));
    diff<<<(n + 255) / 256, 256>>>(x, d, n);
}
"""

COPY = """
__global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def drafted(text: str, kernel: str, compile: bool = False):
    source = SourceFile(text, "k.cu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SourceWarning)
        return source, draft(source, source.kernel(kernel), compile=compile)


def have_nvcc() -> bool:
    from optiml.harness.nvcc import find_toolkit

    try:
        find_toolkit()
    except ToolMissing:
        return False
    return True


def test_an_allocation_shorter_than_the_kernel_reads_is_said():
    _, d = drafted(DIFF, "diff")
    assert "x: in float[n]" in d.text  # what the host allocated: the strongest evidence
    failed = [g for g in d.guesses if "check failed" in g]
    assert len(failed) == 1, d.text
    assert "`x` is accessed up to element 501 at n = 501" in failed[0]
    assert "beyond its 501 drafted elements" in failed[0]


def test_a_draft_read_from_the_accesses_passes_its_check():
    _, d = drafted(COPY, "copy")
    assert not [g for g in d.guesses if "check failed" in g], d.text


def test_a_draft_that_does_not_parse_is_a_problem():
    source = SourceFile(COPY, "k.cu")
    k = source.kernel("copy")
    result = validate(source, k, "/* @optiml\n *   args: x: in float[n]\n */\n", compile=False)
    assert not result.ok
    assert result.problems[0].startswith("the draft does not parse: ")


def test_a_kernel_that_does_not_lift_says_its_accesses_are_not_checked():
    _, d = drafted(
        """
        __global__ void bsum(const float* x, float* part, int n) {
            __shared__ float s[256];
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            s[threadIdx.x] = i < n ? x[i] : 0.0f;
            __syncthreads();
            if (threadIdx.x == 0) part[blockIdx.x] = s[0];
        }
        """,
        "bsum",
    )
    assert "not checked: accesses not checked against the lengths" in d.text


@pytest.mark.skipif(not have_nvcc(), reason="needs nvcc")
def test_the_draft_is_compiled_with_the_file():
    _, good = drafted(COPY, "copy", compile=True)
    assert not [g for g in good.guesses if "check failed" in g or "not compiled" in g], good.text
    _, bad = drafted(COPY.replace("y[i] = x[i];", "y[i] = x[i] + undeclared;"), "copy", True)
    failed = [g for g in bad.guesses if "check failed" in g]
    assert len(failed) == 1 and "does not compile with the draft" in failed[0], bad.text
    assert "undeclared" in failed[0]


@pytest.mark.gpu
def test_every_output_element_is_written_where_the_draft_is_right():
    source, d = drafted(COPY, "copy")
    verdict = outputs_written(source, source.kernel("copy"), d.text)
    assert verdict.status == "ok", verdict.message


@pytest.mark.gpu
def test_an_output_longer_than_the_kernel_writes_is_caught():
    source = SourceFile(COPY, "k.cu")
    k = source.kernel("copy")
    wrong = (
        "/* @optiml\n *   args:   x: in float[n], y: out float[2 * n]\n"
        " *   launch: grid = cdiv(n, 256), block = 256\n *   sizes:  n = 4096, 1001\n */\n"
    )
    verdict = outputs_written(source, k, wrong)
    assert verdict.status == "wrong_result", verdict.message
    assert "was not written" in verdict.message
