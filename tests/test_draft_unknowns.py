"""What a drafted spec takes for what the accesses leave unknown: a block index no guard bounds,
an index loaded from memory, a condition on a `?:` branch, a dim3 component, default sizes."""

from __future__ import annotations

import warnings

import pytest

from optiml.cuda.draft import draft
from optiml.cuda.source import SourceFile
from optiml.errors import SourceWarning
from optiml.spec import parse_spec


def drafted(text: str, kernel: str):
    """The draft's text and the spec it parses to."""
    source = SourceFile(text, "k.cu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SourceWarning)
        d = draft(source, source.kernel(kernel))
    at = text.index("__global__")
    placed = SourceFile(text[:at] + d.text + text[at:], "k.cu")
    return d, parse_spec(placed, placed.kernel(kernel))


def lengths(spec, **sizes):
    case = spec.case({v: sizes[v] for v in spec.size_vars})
    return case.lengths


def test_an_indirect_row_index_is_paired_with_the_parameter_the_body_never_reads():
    d, spec = drafted(
        """
        __global__ void lookup(float* out, const float* table, const int* ids, int nrows,
                               int n, int width) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n * width) out[i] = table[ids[i / width] * width + i % width];
        }
        """,
        "lookup",
    )
    assert lengths(spec, nrows=50, n=7, width=3) == {"out": 21, "table": 150, "ids": 7}
    ids = next(b for b in spec.buffers if b.name == "ids")
    assert "in [0, nrows)" in d.text and ids.value_range is not None
    assert "`nrows`, a parameter the body does not otherwise use" in d.text


def test_an_indirect_column_index_runs_along_the_row_stride():
    d, spec = drafted(
        """
        __global__ void pick(float* out, const float* x, const int* col, int rows, int cols) {
            int r = blockIdx.x * blockDim.x + threadIdx.x;
            if (r < rows) out[r] = x[r * cols + col[r]];
        }
        """,
        "pick",
    )
    assert lengths(spec, rows=10, cols=4) == {"out": 10, "x": 40, "col": 10}
    assert "col: in int[rows] in [0, cols)" in d.text


def test_an_8_bit_index_reaches_255():
    _, spec = drafted(
        """
        __global__ void hist(const unsigned char* v, unsigned int* h, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) atomicAdd(&h[v[i]], 1u);
        }
        """,
        "hist",
    )
    assert lengths(spec, n=1000) == {"v": 1000, "h": 256}


def test_a_clamped_index_is_bounded_by_its_clamp():
    _, spec = drafted(
        """
        __global__ void emb(float* out, const int* tok, const float* w, int n, int V) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) { int t = tok[i]; t = t >= V ? V - 1 : t; out[i] = w[t < 0 ? 0 : t]; }
        }
        """,
        "emb",
    )
    assert lengths(spec, n=9, V=11)["w"] == 11


def test_an_unguarded_batch_index_is_the_unused_parameter_and_the_grid_covers_it():
    _, spec = drafted(
        """
        __global__ void bscale(float* y, const float* x, int batch, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[blockIdx.y * n + i] = 2.0f * x[blockIdx.y * n + i];
        }
        """,
        "bscale",
    )
    case = spec.case({"batch": 3, "n": 100})
    assert case.lengths == {"y": 300, "x": 300}
    assert case.grid[1] == 3


def test_an_unguarded_block_index_takes_the_hosts_grid():
    _, spec = drafted(
        """
        __global__ void partial(const float* x, float* part, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) atomicAdd(&part[blockIdx.x], x[i]);
        }
        int main() {
            int n = 1 << 20; float *x, *p;
            cudaMalloc(&x, n * sizeof(float));
            partial<<<(n + 127) / 128, 128>>>(x, p, n);
        }
        """,
        "partial",
    )
    assert lengths(spec, n=1000) == {"x": 1000, "part": 8}


@pytest.mark.parametrize(
    "clamp",
    [
        "int r = i + 1; if (r > n - 1) r = n - 1; y[i] = x[r];",
        "int r = i + 1 < n ? i + 1 : n - 1; y[i] = x[r];",
        "float s = 0; for (int k = -2; k <= 2; k++) if (i + k >= 0 && i + k < n) s += x[i + k]; y[i] = s;",
    ],
)
def test_a_neighbour_under_its_condition_stays_in_the_buffer(clamp):
    _, spec = drafted(
        f"""
        __global__ void nb(const float* x, float* y, int n) {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i >= n) return;
            {clamp}
        }}
        """,
        "nb",
    )
    assert lengths(spec, n=77) == {"x": 77, "y": 77}


def test_an_early_return_of_a_disjunction_bounds_both_indices():
    _, spec = drafted(
        """
        __global__ void rs(const float* s, float* w, int rows, int cols) {
            int c = blockIdx.x * blockDim.x + threadIdx.x;
            int r = blockIdx.y * blockDim.y + threadIdx.y;
            if (r >= rows || c >= cols) return;
            w[r * cols + c] *= s[r];
        }
        """,
        "rs",
    )
    assert lengths(spec, rows=5, cols=6) == {"s": 5, "w": 30}


def test_a_dim3_component_is_read():
    _, spec = drafted(
        """
        __global__ void k(float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = 0;
        }
        int main() {
            int n = 5000; float* y; cudaMalloc(&y, n * sizeof(float));
            dim3 t(64);
            dim3 g((n + t.x - 1) / t.x);
            k<<<g, t>>>(y, n);
        }
        """,
        "k",
    )
    case = spec.case({"n": 5000})
    assert (case.grid[0], case.block[0]) == (79, 64)


def test_default_sizes_keep_every_buffer_and_the_grid_in_bounds():
    d, spec = drafted(
        """
        __global__ void p4(float* y, const float* x, int a, int b, int c, int e) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < a * b * c * e) y[i] = x[i];
        }
        """,
        "p4",
    )
    first = spec.case(spec.sizes[0])
    assert max(first.lengths.values()) <= 1 << 26
    assert "the file gives no constant value" in d.text
