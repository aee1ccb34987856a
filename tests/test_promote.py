"""The double-precision copy of a kernel (optiml/harness/promote.py): every fixture and wild kernel
promotes and compiles, or gives up for a stated reason; the copy holds no float type and the
original is untouched; run as host C++ (tests/host_cuda.py), the copy computes the kernel's
formula to double precision where the original, in float, does not; and code whose meaning
depends on float's 32 bits, or on code the file does not show, is refused with the reason."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.harness.build import build_kernel
from optiml.harness.promote import (
    NAMESPACE,
    NotPromotable,
    Promoted,
    copy_namespaces,
    float_types_left,
    promote,
    promote_to_double,
)
from optiml.spec import load, parse_spec
from tests.host_cuda import CTYPES, HOST_CUDA, host_mode, host_text
from tests.support import FIXTURES, MANIFEST, WILD, fixture_ids

# On one worker: the module's fixture compiles every kernel's copy (on all cores), once.
pytestmark = pytest.mark.xdist_group("promote")

ARCH = "sm_90"
ENTRIES = MANIFEST + WILD
# Fixtures the promotion refuses, and a word of the reason.
GIVES_UP = {"broken/compile_error.cu::leaky_relu": 'identifier "idx" is undefined'}


def _promote(entry: dict) -> Promoted | NotPromotable:
    source, _, spec = load(FIXTURES / entry["file"], entry["kernel"])
    try:
        return promote(source, entry["kernel"], spec, arch=ARCH)
    except NotPromotable as e:
        return e


@pytest.fixture(scope="module")
def promoted() -> dict[str, Promoted | NotPromotable]:
    """Every fixture and wild kernel promoted and compiled, the compiles in parallel."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_promote, ENTRIES))
    return dict(zip(fixture_ids(ENTRIES), results, strict=True))


# ---- every fixture and wild kernel -----------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=fixture_ids(ENTRIES))
def test_every_kernel_promotes_and_its_copy_compiles(entry, promoted):
    key = f"{entry['file']}::{entry['kernel']}"
    result = promoted[key]
    if key in GIVES_UP:
        assert isinstance(result, NotPromotable)
        assert GIVES_UP[key] in str(result)
        return
    assert isinstance(result, Promoted), str(result)
    source, original, spec = load(FIXTURES / entry["file"], entry["kernel"])
    # The promotion's own build of the device code, from the cache.
    build = build_kernel(
        result.source,
        result.definition,
        instantiation=result.instantiation,
        arch=ARCH,
        mode="cubin",
    )
    assert build.ok, build.log[-2000:]
    assert build.cached
    assert build.resources is not None and result.kernel in build.resources.name
    assert build.resources.static_smem_bytes == result.static_smem
    # The copy is the original's signature in double: float buffers and scalars become f64.
    for b in spec.buffers:
        assert result.buffers[b.name] == ("f64" if DTYPES[b.dtype].is_float else b.dtype)
    for s in spec.scalars:
        assert result.scalars[s.name] == ("f64" if DTYPES[s.dtype].is_float else s.dtype)
    copy = {p.name: p for p in result.definition.params}
    for name, code in result.buffers.items():
        declared = result.instantiation and copy[name].type_text in spec.template
        if code == "f64" and not declared:
            assert copy[name].type_text == "double", copy[name].declared


@pytest.mark.parametrize("entry", ENTRIES, ids=fixture_ids(ENTRIES))
def test_the_copy_holds_no_float_and_the_original_is_untouched(entry, promoted):
    result = promoted[f"{entry['file']}::{entry['kernel']}"]
    if isinstance(result, NotPromotable):
        pytest.skip(str(result))
    source, original, _ = load(FIXTURES / entry["file"], entry["kernel"])
    assert float_types_left(result) == []
    # The promoted file is the original with one insertion right after the kernel.
    start, end = result.inserted
    text = result.source.text
    assert text[:start] + text[end:] == source.text
    assert start == original.span.end
    namespaces = copy_namespaces(result)
    assert len(namespaces) == 1
    assert start <= result.source.span(namespaces[0]).start < end
    again = [k for k in result.source.kernels if k.name == original.name]
    assert len(again) == 1 and again[0].span == original.span
    assert result.definition.name == result.kernel
    assert result.kernel.endswith(f"{NAMESPACE}::{original.short_name}")


def test_what_the_fixtures_promote():
    """A few fixtures' copies in detail: helpers, half precision, templates, vectors, C linkage."""
    half = _promote_file(FIXTURES / "half_helpers.cu", "bias_gelu_fp16")
    copy = _copy_text(half)
    assert "__device__ __forceinline__ double gelu_tanh(double x)" in copy
    assert "const double kSqrt2OverPi = 0.7978845608028654;" in copy
    assert "return 0.5 * x * (1.0 + tanh(inner));" in copy
    assert "__device__ double bias_gelu(double x, double b)" in copy
    assert "double v = (x) + (b);" in copy and "return (gelu_tanh(v));" in copy
    assert half.buffers == {"input": "f64", "bias": "f64", "output": "f64"}

    templated = _promote_file(FIXTURES / "templated.cu", "axpby")
    assert templated.instantiation == "<double, 256>"
    assert templated.scalars == {"n": "i32", "alpha": "f64", "beta": "f64"}

    vectors = _promote_file(FIXTURES / "broken/unwritten_output.cu", "relu_vec4")
    assert "double4 v = reinterpret_cast<const double4*>(x)[i];" in _copy_text(vectors)
    assert "v.x = fmax(v.x, 0.0);" in _copy_text(vectors)

    linkage = _promote_file(FIXTURES / "multi_kernel_main.cu", "vec_add")
    assert not linkage.definition.extern_c  # the copy must not clash with the C symbol
    assert linkage.kernel == "optiml_f64::vec_add"

    clamp = _promote_file(FIXTURES / "multi_kernel_main.cu", "clamp_inplace")
    assert "__device__ __forceinline__ double clamp_value(double v, double lo, double hi)" in (
        _copy_text(clamp)
    )
    assert "return fmin(fmax(v, lo), hi);" in _copy_text(clamp)

    integers = _promote_file(FIXTURES / "histogram.cu", "histogram_global")
    assert integers.buffers == {"data": "i32", "bins": "u32"}
    assert any("nothing to promote" in n for n in integers.notes)


# ---- numerics, as host C++ ---------------------------------------------------------------------

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def host_run(
    promoted: Promoted,
    spec,
    sizes: dict[str, int],
    inputs: dict[str, np.ndarray],
    tmp: Path,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run the original kernel on `inputs` and the copy on the same values as doubles (exact
    conversions), as host C++ (tests/host_cuda.py); every buffer of each afterwards, as float64."""
    case = spec.case(sizes)
    original = next(k for k in promoted.source.kernels if k.name == spec.kernel)
    lines = []
    for b in spec.buffers:
        ctype, copy_ctype = CTYPES[b.dtype], CTYPES[promoted.buffers[b.name]]
        n = case.lengths[b.name]
        inputs[b.name].astype(DTYPES[b.dtype].np_dtype()).tofile(tmp / f"{b.name}.in")
        lines.append(f'auto {b.name}_orig = load<{ctype}, {ctype}>("{tmp}/{b.name}.in", {n});')
        lines.append(f'auto {b.name}_copy = load<{ctype}, {copy_ctype}>("{tmp}/{b.name}.in", {n});')
    for which, kernel, inst in (
        ("orig", spec.kernel, spec.instantiation),
        ("copy", promoted.kernel, promoted.instantiation),
    ):
        args = []
        for p in original.params:
            value = case.sizes.get(p.name, case.scalars.get(p.name))
            if p.is_pointer:
                args.append(f"{p.name}_{which}.data()")
            elif isinstance(value, float):
                args.append(f"{value!r}f" if which == "orig" else f"double({value!r}f)")
            else:
                args.append(str(value))
        g, b = case.grid, case.block
        lines.append(host_mode(promoted.source.text))
        lines.append(
            f"launch({{{g[0]}, {g[1]}, {g[2]}}}, {{{b[0]}, {b[1]}, {b[2]}}}, [&] {{ "
            f"file::{kernel}{inst}({', '.join(args)}); }});"
        )
    for b in spec.buffers:
        for which in ("orig", "copy"):
            lines.append(f'save("{tmp}/{b.name}.{which}", {b.name}_{which});')
    program = "\n".join(
        [
            HOST_CUDA,
            "#include <cfloat>",
            "#include <fstream>",
            "namespace file {",
            host_text(promoted.source.text, promoted.inserted[1]),
            "}",
            "template <class T, class U> std::vector<U> load(const char* path, size_t n) {",
            "    std::vector<T> raw(n);",
            "    std::ifstream(path, std::ios::binary).read((char*)raw.data(), n * sizeof(T));",
            "    return std::vector<U>(raw.begin(), raw.end());",
            "}",
            "template <class T> void save(const char* path, const std::vector<T>& v) {",
            "    std::vector<double> out(v.begin(), v.end());",
            "    std::ofstream(path, std::ios::binary).write((char*)out.data(), out.size() * 8);",
            "}",
            "int main() {",
            *lines,
            "}",
        ]
    )
    (tmp / "promoted.cpp").write_text(program)
    built = subprocess.run(
        [
            "g++",
            "-std=c++20",
            "-O1",
            "-pthread",
            "-w",
            "-o",
            str(tmp / "run"),
            str(tmp / "promoted.cpp"),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    subprocess.run([str(tmp / "run")], check=True, timeout=300)
    read = lambda name: np.fromfile(tmp / name, dtype=np.float64)  # noqa: E731
    return (
        {b.name: read(f"{b.name}.orig") for b in spec.buffers},
        {b.name: read(f"{b.name}.copy") for b in spec.buffers},
    )


def uniform(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, n).astype(np.float32)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@needs_gxx
def test_a_sum_of_floats_in_double_is_exact_where_the_float_one_is_not(tmp_path):
    """reduce_sum: every thread's float atomicAdd into one address; the copy adds doubles."""
    source, _, spec = load(FIXTURES / "reduce_sum.cu", "reduce_sum")
    copy = promote(source, "reduce_sum", spec, compile=False)
    n = 100_000
    x = uniform(n, 1)
    orig, promoted = host_run(copy, spec, {"n": n}, {"x": x, "sum": np.zeros(1)}, tmp_path)
    exact = np.sum(x.astype(np.float64))
    assert abs(promoted["sum"][0] - exact) <= 1e-9 * abs(exact)
    assert abs(orig["sum"][0] - exact) > 1e-9 * abs(exact)
    assert np.array_equal(promoted["x"], x.astype(np.float64))  # the inputs, converted exactly


@needs_gxx
def test_the_atomic_mse_loss_in_double(tmp_path):
    """The wild MSE loss: 4096 same-address float atomics of d * d / n."""
    source, _, spec = load(FIXTURES / "wild/mse.cu", "mse_loss")
    copy = promote(source, "mse_loss", spec, compile=False)
    n = 4096
    pred, target = uniform(n, 2), uniform(n, 3)
    inputs = {"pred": pred, "target": target, "loss": np.zeros(1)}
    orig, promoted = host_run(copy, spec, {"n": n}, inputs, tmp_path)
    d = pred.astype(np.float64) - target.astype(np.float64)
    exact = np.sum(d * d / n)
    assert abs(promoted["loss"][0] - exact) <= 1e-12 * exact
    assert abs(orig["loss"][0] - exact) > 1e-9 * exact


@needs_gxx
@pytest.mark.parametrize(
    ("file", "kernel", "sizes"),
    [
        ("saxpy.cu", "saxpy", {"n": 1000}),
        ("softmax.cu", "softmax_rows", {"rows": 7, "cols": 100}),
        ("wild/gemv.cu", "gemv", {"M": 37, "N": 333}),
        ("wild/row_mean.cu", "row_mean", {"rows": 9, "cols": 777}),
    ],
)
def test_the_copy_computes_the_formula_in_double(file, kernel, sizes, tmp_path):
    source, _, spec = load(FIXTURES / file, kernel)
    copy = promote(source, kernel, spec, compile=False)
    case = spec.case(sizes)
    inputs = {b.name: uniform(case.lengths[b.name], i) for i, b in enumerate(spec.buffers)}
    orig, promoted = host_run(copy, spec, sizes, inputs, tmp_path)
    x = {name: v.astype(np.float64) for name, v in inputs.items()}
    if kernel == "saxpy":
        name, want = "y", np.float64(np.float32(2.5)) * x["x"] + x["y"]
    elif kernel == "softmax_rows":
        rows = x["input"].reshape(sizes["rows"], sizes["cols"])
        e = np.exp(rows - rows.max(axis=1, keepdims=True))
        name, want = "output", (e / e.sum(axis=1, keepdims=True)).ravel()
    elif kernel == "gemv":
        name, want = "y", x["A"].reshape(sizes["M"], sizes["N"]) @ x["x"]
    else:
        name, want = "means", x["A"].reshape(sizes["rows"], sizes["cols"]).mean(axis=1)
    assert relative(promoted[name], want) <= 1e-13
    # The float original is further off, by float's rounding.
    assert relative(orig[name], want) > 1e-9 or kernel == "saxpy"
    assert relative(orig[name], want) <= 1e-5


# A kernel that exercises the rules together: a typedef, a struct with a method, macros (one
# with a float literal), a helper in another namespace called by its qualified name (and using a
# constant of its namespace by its plain name), a host function of the same name, templated
# warp reductions with shuffles, dynamic shared memory, FLT_MAX, fast intrinsics, and names that
# merely contain "float". After it, a check that the macro is float again.
ROW_SOFTMAX = r"""
#include <cfloat>
#define SCALE 0.5f
#define SQR(v) ((v) * (v))
typedef float real;

namespace detail {
constexpr int kTwo = 2;
__device__ __forceinline__ real squash(real v) { return __saturatef(v * SCALE + 1.0f / kTwo); }
}

template <typename T>
__device__ T warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T>
__device__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

float squash(float v);  // host code that shares a name with the device helper: never copied

struct Acc {
    real total;
    __device__ void add(real v) { total += v; }
};

/* @optiml
 *   args:   x: in float[rows * cols], y: out float[rows * cols], stats: out float[rows]
 *   launch: grid = rows, block = 32, smem = cols * 4
 *   sizes:  rows, cols = (64, 1000), (5, 77)
 */
__global__ void row_softmax(const float* x, float* y, float* stats, int rows, int cols)
{
    extern __shared__ float row[];
    const int float_count = cols;  // a name with "float" in it, not a type
    int r = blockIdx.x, lane = threadIdx.x;
    real m = -FLT_MAX;
    for (int c = lane; c < float_count; c += 32) {
        row[c] = x[r * cols + c];
        m = fmaxf(m, row[c]);
    }
    m = warp_max(m);
    Acc acc = {0.0f};
    for (int c = lane; c < cols; c += 32) {
        row[c] = __expf(row[c] - m);
        acc.add(row[c]);
    }
    real s = warp_sum(acc.total);
    for (int c = lane; c < cols; c += 32) y[r * cols + c] = __fdividef(row[c], s);
    if (lane == 0) stats[r] = detail::squash(SQR(m)) + logf(s);
}

static_assert(sizeof(SCALE) == sizeof(float), "the macro is float again after the copy");
"""


def _source(text: str, tmp: Path, name: str = "kernel.cu") -> SourceFile:
    path = tmp / name
    path.write_text(text)
    return SourceFile.read(path)


def _promote_text(text: str, kernel: str, tmp: Path, **kw) -> Promoted:
    source = _source(text, tmp)
    return promote(source, kernel, parse_spec(source, source.kernel(kernel)), **kw)


def _promote_file(path: Path, kernel: str) -> Promoted:
    source, _, spec = load(path, kernel)
    return promote(source, kernel, spec, compile=False)


def _copy_text(promoted: Promoted) -> str:
    start, end = promoted.inserted
    return promoted.source.text[start:end]


def test_the_rules_together(tmp_path):
    copy = _promote_text(ROW_SOFTMAX, "row_softmax", tmp_path, arch=ARCH)
    text = _copy_text(copy)
    assert copy.smem_scale == 2
    assert copy.static_smem == 0
    assert '#pragma push_macro("SCALE")\n#undef SCALE\n#define SCALE 0.5\n' in text
    assert 'pragma push_macro("SQR")' not in text  # nothing to promote in it
    assert text.rstrip().endswith('#pragma pop_macro("SCALE")')
    assert "typedef double real;" in text
    assert "return fmin(fmax(v * SCALE + 1.0 / kTwo, 0.0), 1.0);" in text
    assert "constexpr int kTwo = 2;" in text  # unseen from the copy's namespace: copied
    assert "double squash(double v);" not in text  # the host function
    assert "stats[r] = squash(SQR(m)) + log(s);" in text  # the copied helper, not detail::
    assert "v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));" in text
    assert "__device__ T warp_sum" not in text  # no float in it: the original serves doubles
    assert "extern __shared__ double row[];" in text
    assert "const int float_count = cols;" in text
    assert "real m = -DBL_MAX;" in text
    assert "row[c] = exp(row[c] - m);" in text
    assert "y[r * cols + c] = ((row[c]) / (s));" in text
    assert float_types_left(copy) == []


@needs_gxx
def test_the_rules_together_compute_in_double(tmp_path):
    source = _source(ROW_SOFTMAX, tmp_path)
    spec = parse_spec(source, source.kernel("row_softmax"))
    copy = promote(source, "row_softmax", spec, compile=False)
    rows, cols = 5, 77
    inputs = {"x": uniform(rows * cols, 7), "y": np.zeros(rows * cols), "stats": np.zeros(rows)}
    orig, promoted = host_run(copy, spec, {"rows": rows, "cols": cols}, inputs, tmp_path)
    x = inputs["x"].astype(np.float64).reshape(rows, cols)
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1)
    want_y = (e / s[:, None]).ravel()
    want_stats = np.clip(m[:, 0] ** 2 * 0.5 + 0.5, 0.0, 1.0) + np.log(s)
    assert relative(promoted["y"], want_y) <= 1e-13
    assert relative(promoted["stats"], want_stats) <= 1e-13
    assert 1e-9 < relative(orig["y"], want_y) <= 1e-5  # __expf and __fdividef in float


def test_c_linkage_constant_memory_integer_ptx_and_templates_compile(tmp_path):
    text = r"""
#include <cuda_fp16.h>
__constant__ float coeffs[4];
extern "C" {
/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 */
__global__ void poly(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = coeffs[0] + x[i] * (coeffs[1] + x[i] * coeffs[2]);
}
}
__device__ unsigned lane_id()
{
    unsigned id;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(id));
    return id;
}
/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 */
__global__ void by_lane(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned warp;
    asm("mov.u32 %0, %%warpid;" : "=r"(warp));
    if (i < n) y[i] = x[i] * (lane_id() + 1) + 0.0f * warp;
}
/* @optiml
 *   args:     x: inout T[n], a = 0.5
 *   launch:   grid = cdiv(n, 128), block = 128
 *   sizes:    n = 1000, 77
 *   template: T = half
 */
template <typename T>
__global__ void scale(T* x, T a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2half(__half2float(x[i]) * __half2float(a));
}
"""
    source = _source(text, tmp_path)
    poly = promote(source, "poly", parse_spec(source, source.kernel("poly")), arch=ARCH)
    copy = _copy_text(poly)
    assert copy.startswith("\n\n//") and 'extern "C++" {' in copy  # inside the C block
    assert "coeffs" in copy and "__constant__" not in copy  # read from the original's memory
    lanes = promote(source, "by_lane", parse_spec(source, source.kernel("by_lane")), arch=ARCH)
    copy = _copy_text(lanes)
    assert 'asm("mov.u32 %0, %%warpid;" : "=r"(warp));' in copy  # integer PTX stays as written
    assert "lane_id" in copy and "laneid" not in copy  # no float in it: called as it is
    half = promote(source, "scale", parse_spec(source, source.kernel("scale")), arch=ARCH)
    assert half.instantiation == "<double>"
    assert half.buffers == {"x": "f64"} and half.scalars == {"a": "f64", "n": "i32"}
    assert "x[i] = ((x[i]) * (a));" in _copy_text(half)


# Namespaces (the copy goes into the kernel's own), a helper in an anonymous namespace, a file-scope
# constant, a lambda, casts; float2 with sincosf; a float4 operator; a template kernel with dynamic
# shared memory of its type; half and bfloat16 intrinsics.
VARIETY = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

constexpr float kEps = 1e-6f;

namespace {
__device__ float sq(float v) { return v * v; }
}

namespace ns {
__device__ inline float twice(float v) { return 2.0f * v; }

/* @optiml
 *   args:   x: in float[n], y: out float[n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 */
__global__ void in_namespace(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    auto f = [&](float v) { return twice(sq(v)) + kEps; };
    if (i < n) y[i] = f(__ldg(&x[i])) + static_cast<float>(i) * 0.f + float(1) - 1.0f;
}
}

/* @optiml
 *   args:   x: in float[2 * n], y: out float[2 * n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 */
__global__ void rotate(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float2 p = reinterpret_cast<const float2*>(x)[i];
    float s, c;
    sincosf(0.5f * i, &s, &c);
    reinterpret_cast<float2*>(y)[i] = make_float2(c * p.x - s * p.y, s * p.x + c * p.y);
}

__device__ inline float4 operator*(float4 a, float s)
{
    return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}

/* @optiml
 *   args:   x: in float[4 * n], y: out float[4 * n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 */
__global__ void scale4(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) reinterpret_cast<float4*>(y)[i] = reinterpret_cast<const float4*>(x)[i] * 2.0f;
}

/* @optiml
 *   args:     x: in T[n], y: out T[cdiv(n, 128)]
 *   launch:   grid = cdiv(n, 128), block = 128, smem = 4 * 4
 *   sizes:    n = 1000, 77
 *   template: T = float
 */
template <typename T>
__global__ void block_sums(const T* x, T* y, int n)
{
    extern __shared__ T s[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    T v = i < n ? x[i] : T(0);
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) y[blockIdx.x] = s[0] + s[1] + s[2] + s[3];
}

/* @optiml
 *   args:   x: in half[n], y: out bfloat16[n]
 *   launch: grid = cdiv(n, 128), block = 128
 *   sizes:  n = 1000, 77
 *   tol:    rtol = 2e-2, atol = 1e-3
 */
__global__ void sixteen_bits(const half* x, __nv_bfloat16* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __half2float(__hadd(hexp(x[i]), __hmul(x[i], __float2half(0.25f))));
        y[i] = __float2bfloat16(0.5f * v * (1.0f + erff(v * 0.70710678f)));
    }
}
"""


def test_namespaces_templates_vectors_operators_and_16_bit_types(tmp_path):
    source = _source(VARIETY, tmp_path)
    kernels = ["in_namespace", "rotate", "scale4", "block_sums", "sixteen_bits"]

    def promoted(kernel: str) -> Promoted:
        return promote(source, kernel, parse_spec(source, source.kernel(kernel)), arch=ARCH)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        copies = dict(zip(kernels, pool.map(promoted, kernels), strict=True))
    assert all(float_types_left(c) == [] for c in copies.values())
    in_namespace = _copy_text(copies["in_namespace"])
    assert copies["in_namespace"].kernel == "ns::optiml_f64::in_namespace"
    assert "constexpr double kEps = 1e-6;" in in_namespace
    assert "__device__ double sq(double v)" in in_namespace
    assert "auto f = [&](double v) { return twice(sq(v)) + kEps; };" in in_namespace
    assert "static_cast<double>(i) * 0. + double(1) - 1.0;" in in_namespace
    sums = copies["block_sums"]
    assert (sums.instantiation, sums.smem_scale) == ("<double>", 2)
    assert "extern __shared__ T s[];" in _copy_text(sums)  # T is double in the instantiation
    rotate = _copy_text(copies["rotate"])
    assert "double2 p = reinterpret_cast<const double2*>(x)[i];" in rotate
    assert "sincos(0.5 * i, &s, &c);" in rotate and "make_double2(" in rotate
    scale4 = _copy_text(copies["scale4"])
    assert "__device__ inline double4 operator*(double4 a, double s)" in scale4
    assert "reinterpret_cast<const double4*>(x)[i] * 2.0;" in scale4
    sixteen = copies["sixteen_bits"]
    assert sixteen.buffers == {"x": "f64", "y": "f64"}
    assert "double v = (((exp(x[i])) + (((x[i]) * ((0.25))))));" in _copy_text(sixteen)
    assert "y[i] = (0.5 * v * (1.0 + erf(v * 0.70710678)));" in _copy_text(sixteen)


# ---- what gives up, and why --------------------------------------------------------------------

SPEC = """/* @optiml
 *   args:   x: in float[n], y: inout float[n]
 *   launch: grid = cdiv(n, 128), block = 128{smem}
 *   sizes:  n = 1000, 77
 */"""

REFUSED = {
    "bit reinterpretation": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) y[i] = __int_as_float(__float_as_int(x[i]) & 0x7fffffff);\n}",
        "reinterprets a float's bits",
    ),
    "float atomicMax via an integer CAS": (
        "__device__ float atomic_max_float(float* address, float value) {\n"
        "    int* a = (int*)address;\n"
        "    int old = *a, assumed;\n"
        "    do {\n"
        "        assumed = old;\n"
        "        old = atomicCAS(a, assumed, __float_as_int(fmaxf(value, __int_as_float(assumed))));\n"
        "    } while (assumed != old);\n"
        "    return __int_as_float(old);\n}\n"
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) atomic_max_float(y, x[i]);\n}",
        "reinterprets float memory as `int*`",
    ),
    "a reference to a float's bits": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    float v = x[i];\n"
        "    int bits = reinterpret_cast<int&>(v) & 0x7fffffff;\n"
        "    if (i < n) y[i] = bits;\n}",
        "reinterprets float memory as `int&`",
    ),
    "float atomicMax through integer ordering": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) atomicMax((int*)y, __float_as_int(fmaxf(x[i], 0.0f)));\n}",
        "`__float_as_int` in `k` reinterprets a float's bits",
    ),
    "atomicExch on floats": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) atomicExch(&y[i], x[i]);\n}",
        "`atomicExch` on float memory in `k` has no double form",
    ),
    "packed half2": (
        "#include <cuda_fp16.h>\n"
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    half2 h = __floats2half2_rn(x[i], x[i]);\n"
        "    if (i < n) y[i] = __low2float(__hadd2(h, h));\n}",
        "uses `half2`: two packed 16-bit values have no double form",
    ),
    "a function declared elsewhere": (
        '#include "vendor_math.h"\n'
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) y[i] = vendor_fast_exp(x[i]);\n}",
        "`k` calls `vendor_fast_exp`, which is declared outside this file",
    ),
    "a type declared elsewhere": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    vendor_real v = x[i];\n"
        "    if (i < n) y[i] = v;\n}",
        "the type `vendor_real` is declared outside this file",
    ),
    "an unmapped intrinsic": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) y[i] = __fmaf_ieee_rn(x[i], x[i], y[i]);\n}",
        "`k` calls `__fmaf_ieee_rn`, which is declared outside this file",
    ),
    "inline PTX": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    float r;\n"
        '    asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x[i]));\n'
        "    if (i < n) y[i] = r;\n}",
        'has inline PTX (`asm`) on a float operand: `"=f"(r)`',
    ),
    "a __device__ float": (
        "__device__ float total;\n"
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) { atomicAdd(&total, x[i]); y[i] = x[i]; }\n}",
        "uses the float `__device__` variable `total`",
    ),
    "shared bytes seen as floats": (
        "__global__ void k(const float* x, float* y, int n) {\n"
        "    extern __shared__ unsigned char smem[];\n"
        "    float* s = reinterpret_cast<float*>(smem);\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    s[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
        "    if (i < n) y[i] = s[threadIdx.x];\n}",
        "casts memory that is not float to `float*`",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_code_that_depends_on_float_bits_or_unseen_code_is_refused(case, tmp_path, caplog):
    body, reason = REFUSED[case]
    smem = ", smem = 512" if "extern __shared__" in body else ""
    head, _, kernel = body.rpartition("__global__")
    text = f"{head}{SPEC.format(smem=smem)}\n__global__{kernel}\n"
    source = _source(text, tmp_path)
    spec = parse_spec(source, source.kernel("k"))
    with pytest.raises(NotPromotable) as refused:
        promote(source, "k", spec, compile=False)
    assert reason in str(refused.value)
    with caplog.at_level(logging.INFO, logger="optiml.harness.promote"):
        assert promote_to_double(source, "k", spec, compile=False) is None
    assert reason in caplog.text


def test_static_shared_memory_that_no_longer_fits_is_refused(tmp_path):
    """32 KiB of floats is 64 KiB of doubles: more than a block may declare."""
    text = SPEC.format(smem="") + (
        "\n__global__ void k(const float* x, float* y, int n) {\n"
        "    __shared__ float tile[64][128];\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    tile[threadIdx.x % 64][threadIdx.x] = i < n ? x[i] : 0.0f;\n"
        "    __syncthreads();\n"
        "    if (i < n) y[i] = tile[(threadIdx.x + 1) % 64][threadIdx.x];\n}\n"
    )
    source = _source(text, tmp_path)
    original = build_kernel(source, source.kernel("k"), instantiation="", arch=ARCH)
    assert original.ok and original.resources.static_smem_bytes == 32768
    with pytest.raises(NotPromotable, match="65536 bytes of static shared memory"):
        promote(source, "k", parse_spec(source, source.kernel("k")), arch=ARCH)


def test_dynamic_shared_memory_doubles_and_must_fit(tmp_path):
    kernel = (
        "\n__global__ void k(const float* x, float* y, int n) {\n"
        "    extern __shared__ float s[];\n"
        "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    s[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
        "    __syncthreads();\n"
        "    if (i < n) y[i] = s[threadIdx.x];\n}\n"
    )
    fits = _promote_text(SPEC.format(smem=", smem = 100 * 1024") + kernel, "k", tmp_path)
    assert fits.smem_scale == 2
    with pytest.raises(NotPromotable, match=r"needs 245760 bytes of dynamic shared memory"):
        _promote_text(SPEC.format(smem=", smem = 120 * 1024") + kernel, "k", tmp_path)


def test_a_float_left_in_a_macro_used_as_a_type_is_redefined(tmp_path):
    text = (
        "#define REAL float\n#define HALF_OF(v) ((v) * 0.5f)\n"
        + SPEC.format(smem="")
        + (
            "\n__global__ void k(const float* x, float* y, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    REAL v = HALF_OF(x[i]);\n"
            "    if (i < n) y[i] = v;\n}\n"
        )
    )
    copy = _promote_text(text, "k", tmp_path, arch=ARCH)
    inserted = _copy_text(copy)
    assert "#define REAL double" in inserted
    assert "#define HALF_OF(v) ((v) * 0.5)" in inserted
    assert re.search(r"pop_macro\(\"HALF_OF\"\)\n#pragma pop_macro\(\"REAL\"\)$", inserted.rstrip())
