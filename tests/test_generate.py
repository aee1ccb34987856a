"""optiml generate: formulas become kernels whose spec parses, which compile with nvcc, and which,
run as host C++ (tests/host_cuda.py) at small sizes, agree with their generated NumPy reference
within the spec's tolerance; and bad formulas give one line with their position."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optiml.api import check_file
from optiml.cuda.types import DTYPES, lookup
from optiml.errors import ExitCode, FormulaError
from optiml.generate import FormulaSource, generate
from optiml.harness import inputs
from optiml.harness.host import HOST_TYPES, host_mode
from optiml.spec import load
from tests.host_cuda import HOST_CUDA, host_text

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="nvcc not installed",
)

# name, formula, small sizes for the host run
FORMULAS = [
    ("scale_shift", "for i < N: y[i] = a * x[i] + b  with a = 2.5, b = -0.5", {"N": 1000}),
    ("relu", "for i < N: y[i] = max(x[i], 0)", {"N": 777}),
    ("axpy", "float x[N], y[N]; y[i] = a * x[i] + y[i]   with a = 2.5", {"N": 1000}),
    (
        "gelu_erf",
        "float x[N]\ny[i] = 0.5 * x[i] * (1 + erf(x[i] * 0.7071067811865476))",
        {"N": 600},
    ),
    (
        "gelu_tanh",
        "float x[N]; y[i] = 0.5 * x[i] * (1 + tanh(0.7978845608 * (x[i] + 0.044715 * x[i] ** 3)))",
        {"N": 600},
    ),
    ("row_sum", "float x[R, C]; y[r] = sum(c) x[r, c]", {"R": 37, "C": 53}),
    ("col_sum", "float x[R, C]; y[c] = sum(r) x[r, c]", {"R": 37, "C": 53}),
    ("row_max", "float x[R, C]; y[r] = max(c) x[r, c]", {"R": 37, "C": 53}),
    ("row_mean", "float x[R, C]; y[r] = mean(c) x[r, c]", {"R": 37, "C": 53}),
    ("row_argmax", "float x[R, C]; y[r] = argmax(c) x[r, c]", {"R": 37, "C": 53}),
    (
        "softmax",
        "float x[R, C]\n"
        "m[r] = max(c) x[r, c];  e[r, c] = exp(x[r, c] - m[r]);  y[r, c] = e[r, c] / sum(c2) e[r, c2]",
        {"R": 9, "C": 45},
    ),
    (
        "layernorm",
        "float x[R, C], w[C], b[C]; eps = 1e-5\n"
        "mu[r] = mean(c) x[r, c]\n"
        "var[r] = mean(c) (x[r, c] - mu[r]) ** 2\n"
        "y[r, c] = (x[r, c] - mu[r]) * rsqrt(var[r] + eps) * w[c] + b[c]",
        {"R": 9, "C": 45},
    ),
    (
        "bmm",
        "out[b, i, j] = sum(k) q[b, i, k] * kt[b, j, k] * scale   for b < B, i < M, j < N, k < K\n"
        "scale = 0.125",
        {"B": 3, "M": 5, "N": 7},  # K past the third size: fixed in `args` (128)
    ),
    ("half_map", "half x[N], y[N]; y[i] = x[i] * 2 + 1", {"N": 700}),
    ("bf16_exp", "bf16 x[N]; y[i] = exp(x[i])", {"N": 300}),
    ("transpose", "float x[M, N]; y[j, i] = x[i, j]", {"M": 13, "N": 29}),
    ("causal_mask", "float s[N, N]; y[i, j] = where(j <= i, s[i, j], -1e9)", {"N": 21}),
    # shifted, strided and dilated subscripts: zero padding, -inf padding, an exact division
    (
        "conv2d",
        "float x[B, CI, H, W], w[CO, CI, KH, KW]; int S = 2; int P = 1; int D = 2\n"
        "y[b, co, oh, ow] = sum(ci, kh, kw) x[b, ci, oh * S + kh * D - P, ow * S + kw * D - P]"
        " * w[co, ci, kh, kw]   for oh < OH, ow < OW\n"
        "B = 2; CO = 4; OH = 5; OW = 4; CI = 3; H = 11; W = 9; KH = 3; KW = 2",
        {"B": 2, "CO": 4, "OH": 5, "OW": 4},
    ),
    (
        "maxpool1d",
        "float x[B, C, L]; y[b, c, o] = max(k) pad(x[b, c, o * 2 + k - 1], -inf)"
        "   for o < O, k < 3\nB = 2; C = 3; O = 9; L = 17",
        {"B": 2, "C": 3, "O": 9},
    ),
    (
        "maxpool2d",
        "float x[B, C, H, W]\n"
        "y[b, c, o, o2] = max(k, k2) pad(x[b, c, o + k - 1, o2 + k2 - 1], -inf)"
        "   for o < OH, o2 < OW, k < KH, k2 < KW\nB = 2; C = 3; H = 9; W = 8; OH = 8; OW = 7; KH = 4; "
        "KW = 3",
        {"B": 2, "C": 3, "OH": 8, "OW": 7},
    ),
    (
        "conv_transposed1d",
        "float x[B, CI, L], w[CI, CO, K]\n"
        "y[b, co, o] = sum(ci, k) x[b, ci, (o + 1 - k) / 2] * w[ci, co, k]   for o < O\n"
        "B = 2; CO = 2; O = 13; CI = 3; L = 7; K = 3",
        {"B": 2, "CO": 2, "O": 13},
    ),
    # gathers: subscripts that are elements of an int input
    (
        "embedding",
        "float wte[V, C], wpe[T, C]; int idx[T]; y[t, c] = wte[idx[t], c] + wpe[t, c]\nV = 50",
        {"T": 19, "C": 33, "V": 50},
    ),
    (
        "gather_2d",
        "float x[R, C]; int rows[M], cols[N]; y[i, j] = x[rows[i], cols[j]] * 2\nR = 17; C = 13",
        {"M": 7, "N": 9, "R": 17},
    ),
    (
        "gather_sum",
        "float x[V, C]; int idx[B, L]; y[b, c] = sum(l) x[idx[b, l], c]\nV = 40",
        {"B": 5, "L": 6, "C": 11, "V": 40},
    ),
    # scans along an axis
    (
        "cumsum_exclusive",
        "float x[R, C]; y[r, c] = cumsum(c) x[r, c - 1]   for c < C",
        {"R": 7, "C": 33},
    ),
    ("cumprod", "float x[R, C]; y[r, c] = cumprod(c) (1 + x[r, c] / 8)", {"R": 7, "C": 33}),
    ("cummax", "float x[R, C]; y[r, c] = cummax(c) x[r, c]", {"R": 7, "C": 33}),
    # from the end: suffix scans
    (
        "rcumsum_exclusive",
        "float x[R, C]; y[r, c] = rcumsum(c) x[r, c + 1]   for c < C",
        {"R": 7, "C": 33},
    ),
    ("rcummin", "float x[R, C]; y[r, c] = rcummin(c) x[r, c]", {"R": 7, "C": 33}),
    # a batch norm: the channel's statistics over the indices around it, one flat loop each
    (
        "batchnorm",
        "float x[B, F, H, W]; eps = 1e-5\n"
        "mu[f] = mean(b, h, w) x[b, f, h, w]\n"
        "var[f] = mean(b, h, w) (x[b, f, h, w] - mu[f]) ** 2\n"
        "y[b, f, h, w] = (x[b, f, h, w] - mu[f]) * rsqrt(var[f] + eps)",
        {"B": 3, "F": 5, "H": 7, "W": 6},
    ),
    # divided by the whole tensor's norm: one row, its sum computed once
    (
        "frobenius",
        "float x[B, F]; y[b, f] = x[b, f] / sqrt(sum(b2, f2) x[b2, f2] * x[b2, f2])",
        {"B": 9, "F": 31},
    ),
    # results of one number
    (
        "mse",
        "float p[N, M], t[N, M]; loss = mean(i, j) (p[i, j] - t[i, j]) ** 2",
        {"N": 37, "M": 61},
    ),
    (
        "huber",
        "float p[N], t[N]; loss = mean(i) where(abs(p[i] - t[i]) < 0.5, (p[i] - t[i]) ** 2,"
        " abs(p[i] - t[i]) - 0.25)",
        {"N": 999},
    ),
    # a loss over rows of their own reductions: a warp per row, its lanes splitting the row
    (
        "cosine_loss",
        "float p[B, D], t[B, D]; eps = 1e-8\n"
        "cs[b] = (sum(i) p[b, i] * t[b, i]) / (max(sqrt(sum(i) p[b, i] ** 2), eps) * "
        "max(sqrt(sum(i) t[b, i] ** 2), eps))\n"
        "loss = mean(b) (1 - cs[b])",
        {"B": 45, "D": 77},
    ),
    (
        "row_max_loss",
        "float x[B, D]; loss = sum(b) (max(i) x[b, i] - min(i2) x[b, i2])",
        {"B": 33, "D": 50},
    ),
    (
        "value_range",
        "float x[N, M]; r = max(i, j) x[i, j] - min(i2, j2) x[i2, j2]",
        {"N": 13, "M": 300},
    ),
]
IDS = [f[0] for f in FORMULAS]


def write(tmp: Path, name: str, text: str) -> Path:
    g = generate(text, name)
    path = tmp / f"{name}.cu"
    path.write_text(g.kernel)
    (tmp / f"{name}_ref.py").write_text(g.reference)
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("generated")
    for name, text, _ in FORMULAS:
        write(tmp, name, text)
    return tmp


@pytest.mark.parametrize("name", IDS)
def test_the_spec_parses(generated, name):
    _, kernel, spec = load(generated / f"{name}.cu", name)
    assert spec.reference.kind == "numpy" and spec.reference.function == name
    assert len(spec.sizes) == 2  # the given (or default) size and one not a multiple of 256
    assert [p.name for p in kernel.params] == spec.params


@needs_nvcc
@pytest.mark.parametrize("name", IDS)
def test_it_compiles_with_nvcc(generated, name):
    result = check_file(generated / f"{name}.cu")
    assert not result.spec_failed, [k.spec_error for k in result.kernels]
    assert not result.compile_failed, [str(m) for m in result.kernels[0].messages]
    assert result.kernels[0].report is not None


# ---- the kernels as host C++ against their NumPy references ------------------------------------

HOST_CTYPES = {
    "f32": "float",
    "f64": "double",
    "f16": "__half",
    "bf16": "__nv_bfloat16",
    "i32": "int",
}
FP_HEADERS = re.compile(r"^#include <cuda_(fp16|bf16)\.h>$", re.M)


def _inputs(spec, case, tmp: Path, name: str) -> tuple[dict, dict]:
    """Inputs for every buffer (files for the host program, arrays as the harness passes them)."""
    rng = np.random.default_rng(7)
    files, arrays = {}, {}
    for b in spec.buffers:
        d = DTYPES[b.dtype]
        n = case.lengths[b.name]
        if b.role == "out":
            data = np.zeros(n, dtype=d.np_dtype())
        elif d.is_float:
            values = rng.uniform(-1.0, 1.0, n).astype(np.float32)
            data = (
                inputs._float_to_bf16_bits(values)
                if b.dtype == "bf16"
                else values.astype(d.np_dtype())
            )
        else:  # in the spec's range where it gives one (a gather's indices)
            lo, hi = case.ranges.get(b.name, (-100, 100))
            data = rng.integers(int(lo), int(hi), n).astype(d.np_dtype())
        path = tmp / f"{name}.{b.name}.in"
        data.tofile(path)
        files[b.name] = path
        arrays[b.name] = (
            (data.astype(np.uint32) << 16).view(np.float32) if b.dtype == "bf16" else data.copy()
        )
    return files, arrays


def on_disk(formula: str, name: str, folder: Path) -> tuple[Path, str, dict]:
    """`formula` generated as `name` into `folder` (the kernel and its reference beside it):
    what `run_on_host` takes for it."""
    g = generate(formula, name)
    path = folder / f"{name}.cu"
    path.write_text(g.kernel)
    (folder / f"{name}_ref.py").write_text(g.reference)
    return path, name, {s: v.value for s, v in g.checked.sizes.items()}


def run_on_host(kernels: list[tuple[Path, str, dict]], tmp_path: Path) -> list[str]:
    """Generated kernels (file, name, sizes) in one host program (one g++ run): each at its
    sizes against its NumPy reference; the outputs that differ beyond the spec's tolerance (NaN
    only where the reference has NaN)."""
    parts, body, checks = [], [], []
    for n, (path, name, sizes) in enumerate(kernels):
        source, kernel, spec = load(path, name)
        case = spec.case(sizes)
        files, arrays = _inputs(spec, case, tmp_path, name)
        text = FP_HEADERS.sub("", source.text)
        parts.append(f"namespace k{n} {{\n{host_text(text)}\n}}")
        body.append("{")
        args = []
        for p in kernel.params:
            b = spec.buffer(p.name)
            if b is not None:
                ctype = HOST_CTYPES[b.dtype]
                body.append(
                    f'auto {p.name} = load<{ctype}>("{files[p.name]}", {case.lengths[p.name]});'
                )
                args.append(f"{p.name}.data()")
            else:
                value = case.scalars.get(p.name, case.sizes.get(p.name))
                args.append(f"{value!r}" + ("f" if isinstance(value, float) else ""))
        g, bl = case.grid, case.block
        body.append(host_mode(text))
        body.append(
            f"launch({{{g[0]}, {g[1]}, {g[2]}}}, {{{bl[0]}, {bl[1]}, {bl[2]}}}, [&] {{ "
            f"k{n}::{name}({', '.join(args)}); }});"
        )
        outputs = [b for b in spec.buffers if b.role != "in"]
        for b in outputs:
            body.append(f'save("{tmp_path}/{name}.{b.name}.out", {b.name});')
        body.append("}")
        checks.append((name, spec, case, arrays, outputs))
    program = "\n".join([HOST_CUDA, HOST_TYPES, *parts, "int main() {", *body, "}"])
    (tmp_path / "generated.cpp").write_text(program)
    built = subprocess.run(
        [
            "g++",
            "-std=c++20",
            "-O1",
            "-pthread",
            "-w",
            "-o",
            str(tmp_path / "run"),
            str(tmp_path / "generated.cpp"),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    subprocess.run([str(tmp_path / "run")], check=True, timeout=600)

    failures = []
    for name, spec, case, arrays, outputs in checks:
        module_spec = importlib.util.spec_from_file_location(name, spec.reference.path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        args = [arrays[p] if p in arrays else case.scalars[p] for p in spec.params]
        returned = getattr(module, name)(*args)
        for b, want in zip(outputs, returned, strict=True):
            d = DTYPES[b.dtype]
            raw = np.fromfile(tmp_path / f"{name}.{b.name}.out", dtype=d.np_dtype())
            if b.dtype == "bf16":
                got = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                want = inputs._float_to_bf16_bits(np.asarray(want, dtype=np.float32))
                want = (want.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            else:
                got = raw.astype(np.float64)
                want = np.asarray(want).astype(d.np_dtype()).astype(np.float64)
            rtol, atol = spec.tolerance(d)
            ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True) | (
                np.abs(got - want) <= atol + rtol * np.abs(want)
            )
            if not ok.all():
                i = int(np.argmin(ok))
                failures.append(f"{name}.{b.name}[{i}]: got {got[i]}, want {want[i]}")
    return failures


@needs_gxx
def test_each_kernel_agrees_with_its_numpy_reference_on_the_host(generated, tmp_path):
    kernels = [(generated / f"{name}.cu", name, sizes) for name, _, sizes in FORMULAS]
    failures = run_on_host(kernels, tmp_path)
    assert not failures, failures


def test_the_bf16_and_half_types_are_the_specs():
    assert lookup("bfloat16").code == "bf16" and lookup("half").code == "f16"


# ---- what is generated ---------------------------------------------------------------------------


def test_softmax_is_one_kernel_whose_row_max_and_sum_are_computed_once_per_row():
    g = generate(FORMULAS[10][1], "softmax")
    body = g.kernel.split("__global__", 1)[1]
    # a thread per row: the max, the sum, then the row's elements (`e[r, c]` in both loops)
    assert "grid = cdiv(R, 256)" in g.kernel
    assert body.count("for (") == 3 and body.count("fmaxf") == 1 and body.count("expf") == 2
    # the row's elements at the row's offset plus the column: no division per element
    assert "y[(row1 * ((long long)C) + col2)] = " in body
    assert "sums of up to 1024 terms" in g.kernel  # the sum of exp cannot cancel: a small atol
    _, spec_line = next(
        (line, line) for line in g.kernel.splitlines() if line.lstrip(" *").startswith("tol:")
    )
    assert "atol = 1e-06" in spec_line


def test_a_windows_offsets_are_loops_of_their_own_and_a_rows_elements_one_flat_loop():
    # a reduction over several indices: a window read at `o + k - 1` gets a loop per offset (a flat
    # loop would divide by KW and take a remainder at every step); a norm's row, read at its
    # indices as they are, stays one flat loop whose counter is the address
    pool = dict((n, f) for n, f, _ in FORMULAS)["maxpool2d"]
    window = generate(pool, "maxpool2d").kernel.split("-INFINITY;", 1)[1]
    assert "for (int k_" in window and "for (int k2_" in window
    assert "%" not in window and " / " not in window and "rest" not in window
    norm = generate(
        "float x[B, F, H]; eps = 1e-5\n"
        "mu[b] = mean(f, h) x[b, f, h]\n"
        "y[b, f, h] = (x[b, f, h] - mu[b]) * eps",
        "norm",
    ).kernel.split("__global__", 1)[1]
    assert re.search(r"for \(long long (r\d+) = 0; \1 < \(long long\)F \* H; \+\+\1\)", norm)
    assert "for (int f" not in norm


def test_statistics_around_a_kept_index_are_flat_loops_and_a_whole_norm_one_row():
    # a batch norm's channel statistics over (b, h, w), the channel between them: a thread per
    # channel whose sums each walk one flat counter (the row schedules split one counter)
    norm = generate(dict((n, f) for n, f, _ in FORMULAS)["batchnorm"], "bn").kernel
    body = norm.split("__global__", 1)[1]
    assert "grid = cdiv(F, 256)" in norm
    assert len(re.findall(r"for \(long long r\d+ = 0; r\d+ < \(long long\)B \* H \* W;", body)) == 2
    assert "for (int b" not in body
    # a tensor over its whole norm: one thread computes the sum once, then every element
    whole = generate(dict((n, f) for n, f, _ in FORMULAS)["frobenius"], "fro").kernel
    body = whole.split("__global__", 1)[1]
    assert "grid = cdiv(1, 256)" in whole
    assert body.count("sqrtf") == 1 and body.count("for (") == 2


def test_a_loss_over_rows_of_their_own_reductions_takes_a_warp_per_row():
    formulas = dict((n, f) for n, f, _ in FORMULAS)
    for name in ("cosine_loss", "row_max_loss"):
        kernel = generate(formulas[name], name).kernel
        assert "grid = min(cdiv(B, 32), 4 * sm_count)" in kernel
        body = kernel.split("__global__", 1)[1]
        assert "= optiml_lane; i" in body and "+= 32)" in body
        assert "__shfl_xor_sync" in body and "if (optiml_lane == 0)" in body
    # the cosine's three sums over the same row: one loop of the lanes, three accumulators
    body = generate(formulas["cosine_loss"], "cos").kernel.split("__global__", 1)[1]
    assert len(re.findall(r"for \(int i_\d+ = optiml_lane; ", body)) == 1
    assert len(re.findall(r"float acc\d+ = 0\.0f;", body)) == 3
    # a loss of elements alone keeps a thread per element
    mse = generate(formulas["mse"], "mse").kernel
    assert "optiml_lane" not in mse and "grid = min(cdiv(N * M, 1024), 4 * sm_count)" in mse


def test_defaults_are_said_and_given_sizes_are_used():
    g = generate("for i < N: y[i] = max(x[i], 0)", "relu")
    assert any("not given" in n and "1048576" in n for n in g.notes)
    assert "N = 1048576, 262147" in g.kernel
    g = generate("N = 1 << 16\nfor i < N: y[i] = max(x[i], 0)", "relu")
    assert not g.notes and "N = 65536, 16387" in g.kernel


def test_the_odd_case_of_a_large_task_is_small_enough_for_numpy():
    # 4096 x 393216 (KernelBench's maps): a quarter of each size would be 100 M elements a
    # tensor, minutes of NumPy a seed; the odd case is cut a quarter at a time, largest first.
    from optiml.generate.cuda import CHECK_ELEMENTS

    g = generate("M = 4096\nK = 393216\nfor m < M, k < K: y[m, k] = max(x[m, k], 0)", "relu")
    sizes = re.search(r"sizes: +M, K = \(4096, 393216\), \((\d+), (\d+)\)", g.kernel)
    assert sizes is not None, g.kernel
    m, k = int(sizes[1]), int(sizes[2])
    assert 2 * m * k <= CHECK_ELEMENTS and m == 1027 and k % 256 and k > 1024


def test_the_odd_case_shrinks_past_a_size_the_spec_holds_fixed():
    # The output's sizes vary in the spec; an input's own (a pool's planes, L here) are held.
    # KernelBench's 3-D average pool's odd case held a 323 M-element input that way; the varying
    # sizes shrink further where a quarter of each is not enough.
    from optiml.generate.cuda import CHECK_ELEMENTS

    g = generate(
        "float x[A, B, L]\nA = 256; B = 256; L = 65536; O = 64\n"
        "for a < A, b < B, o < O, k < 4: y[a, b, o] = sum(k) x[a, b, o * 1024 + k]",
        "strided_sum",
    )
    sizes = re.search(r"sizes: +A, B, O = \(256, 256, 64\), \((\d+), (\d+), (\d+)\)", g.kernel)
    assert sizes is not None, g.kernel
    a, b, o = (int(v) for v in sizes.groups())
    assert a * b * 65536 <= CHECK_ELEMENTS
    assert all(v % 256 and v < 67 for v in (a, b))
    assert "L = 65536" in g.kernel  # still held


def test_every_size_of_the_output_varies_in_the_spec():
    # a 2-D pool's four output sizes: a case with fewer outputs reads no element the first
    # does not; the window's and the input's sizes stay as they are
    g = generate(
        "float x[B, C, H, W]\n"
        "y[b, c, o, o2] = max(k, k2) pad(x[b, c, o + k - 1, o2 + k2 - 1], -inf)"
        "   for o < OH, o2 < OW, k < KH, k2 < KW\nB = 2; C = 3; H = 9; W = 8; OH = 8; OW = 7; KH = 4; "
        "KW = 3",
        "maxpool2d",
    )
    assert re.search(r"sizes: +B, C, OH, OW = \(2, 3, 8, 7\)", g.kernel), g.kernel
    assert "H = 9, W = 8, KH = 4, KW = 3" in g.kernel


def test_the_odd_case_counts_a_convolutions_taps():
    # 5 x 7 taps over 64 channels for every output: NumPy gathers the shifted input per tap
    from optiml.generate.cuda import CHECK_WORK

    g = generate(
        "float x[B, CI, H, W], w[CO, CI, KH, KW]\n"
        "y[b, co, oh, ow] = sum(ci, kh, kw) x[b, ci, oh + kh, ow + kw] * w[co, ci, kh, kw]"
        "   for oh < OH, ow < OW\n"
        "B = 8; CO = 128; OH = 508; OW = 250; CI = 64; H = 512; W = 256; KH = 5; KW = 7",
        "conv",
    )
    sizes = re.search(
        r"sizes: +B, CO, OH, OW = \(8, 128, 508, 250\), \((\d+), (\d+), (\d+), (\d+)\)", g.kernel
    )
    assert sizes is not None, g.kernel
    b, co, oh, ow = (int(v) for v in sizes.groups())
    assert b * co * oh * ow * 64 * 5 * 7 <= CHECK_WORK


def test_the_odd_case_counts_each_reduction_as_the_reference_makes_it():
    # A GEMM's sum of plain subscripts is one einsum (BLAS) in the reference: its terms cost
    # nothing there, and its K keeps the odd size a quarter of the first gives (before: K 8192
    # went to 515 as if each of M x N x K terms were gathered).
    g = generate(
        "float a[M, K], b[K, N]\nM = 2048; N = 4096; K = 8192\n"
        "for m < M, n < N: c[m, n] = sum(k) a[m, k] * b[k, n]",
        "gemm",
    )
    assert re.search(r"sizes: +M, N, K = \(2048, 4096, 8192\), \(515, 1027, 2051\)", g.kernel)
    # A row's max and sum are counted once a row, not once for each of the output's elements:
    # the rows' terms are then the input's own elements, and only those bound the odd case
    from optiml.generate.check import check
    from optiml.generate.cuda import _elements, _work
    from optiml.generate.parser import FormulaSource, parse

    def checked(text: str):
        source = FormulaSource(text)
        return check(parse(source), source)

    c = checked(
        "float x[R, C]\nR = 64; C = 4096\nm[r] = max(c) x[r, c]\n"
        "s[r] = sum(c) exp(x[r, c] - m[r])\ny[r, c] = x[r, c] - m[r] - log(s[r])"
    )
    values = {"R": 64, "C": 4096}
    assert _work(c, values) == 2 * 64 * 4096  # two passes over the rows, not 2 x 64 x 4096^2
    # a row's sum inside an elementwise statement (KernelBench's LogSoftmax as translated): the
    # reference reduces x[r, c2] over c2 once a row, whatever the statement's c
    inline = checked(
        "float x[R, C]\nR = 64; C = 4096\nfor c2 < C\n"
        "y[r, c] = x[r, c] - log(sum(c2) exp(x[r, c2]))"
    )
    assert _work(inline, values) == 64 * 4096
    assert _elements(c, values) == 2 * 64 * 4096  # x and y
    # a convolution's shifted input is gathered for every tap: all its terms count
    conv = checked(
        "float x[B, C, H], w[O, C, K]\nB = 2; C = 3; H = 10; O = 4; K = 3\n"
        "for o2 < OH: y[b, o, o2] = sum(c, k) x[b, c, o2 + k] * w[o, c, k]\nOH = 8"
    )
    assert _work(conv, {"B": 2, "C": 3, "H": 10, "O": 4, "K": 3, "OH": 8}) == 2 * 4 * 8 * 3 * 3


def test_a_signed_sum_gets_an_atol_that_grows_with_its_length():
    g = generate("float x[R, C]; y[r] = sum(c) x[r, c]\nC = 4096", "row_sum")
    assert "a sum of up to 4096 terms of either sign" in g.kernel


# ---- bad formulas: one line each, with the position ---------------------------------------------

BAD = [
    ("for i < N: y[i] = x[i, k]", "1:24", "index `k` is not bound"),
    ("float x[N], w[M]; y[i] = x[i] * w[i]", "1:35", "shape mismatch: index `i` runs over `N`"),
    ("for i < N: y[i] = expp(x[i])", "1:19", "unknown function `expp`; did you mean `exp`?"),
    ("flaot x[N]; y[i] = x[i]", "1:1", "unknown element type `flaot`; did you mean `float`?"),
    (
        "float x[R, C]\ny[r] = m[r] * 2\nm[r] = max(c) x[r, c]",
        "2:8",
        "`m` is used before it is defined (at 3:1)",
    ),
    ("for i < N: y[i] = x[i] +", "1:25", "the formula ends too early"),
    ("for i < N: y[i] = x[i] @ 2", "1:24", "unexpected `@`"),
    ("for i < N: y[i] = sum(x[i])", "1:19", "`sum` is a reduction"),
    ("float x[N]; y[i] = x[i, i]", "1:20", "`x` has 1 dimension(s)"),
    ("for i < N: y[i] = y[i] + x[i]", "1:19", "`y` is used before it is defined"),
    ("float x[N]; y[i] = x[i] * a", "1:27", "unknown name `a`"),
    (
        "float x[R, C]; m[r] = max(c) x[r, c]; y[r, c] = x[r, c] - m[r]; z[r] = m[r]",
        "1:65",
        "both results, of different shapes",
    ),
    ("for i < N: y[i] = x[i + 1]", "1:21", "so its shape cannot come from its indices"),
    ("float x[N]; y[i] = sum(k) x[i * k]   for k < 3", "1:29", "at most one index per term"),
    ("float x[N]; a = 0.5; y[i] = x[i * a]", "1:31", "is a float scalar"),
    ("float x[N]; y[i] = x[i + 1.5]", "1:22", "subscripts are whole numbers"),
    ("float x[N]; y[i] = x[(i + 1) / 0]", "1:22", "divides by 0"),
    ("float x[N]; t[i] = x[i]; y[i] = t[i + 1]", "1:35", "a result is read at index names"),
    ("float x[N]; y[i] = pad(x[i], 0)", "1:20", "`pad(ACCESS, VALUE)`"),
    ("float x[N]; y[i] = pad(x[i - 1], x[i])", "1:34", "the padding value is a number"),
    ("float x[R, C]; y[r] = cumsum(c) x[r, c]", "1:23", "scans along one index of the left"),
    ("float x[R, C]; y[r, c] = 2 * cumsum(c) x[r, c]", "1:30", "is the whole right-hand side"),
    ("float x[N]; m = argmax(i) x[i]", "1:17", "of everything is not a result"),
    ("float x[N]; y[i] = cumsun(i) x[i]", "1:20", "did you mean `cumsum`?"),
    ("int idx[T]; y[t, c] = w[idx[t], c]   for c < C", "1:25", "so its shape cannot come from"),
    ("float w[V, C], idx[T]; y[t, c] = w[idx[t], c]", "1:36", "must be an `int` input declared"),
    ("float w[V, C]; y[t, c] = w[idx[t], c]   for t < T", "1:28", "must be an `int` input"),
    ("float w[V, C]; int i2[T]; y[t, c] = w[i2[t + 1], c]", "1:39", "read at index names"),
    ("float w[V, C]; int i2[T]; y[t] = w[i2[t], i2[t]]", "1:43", "indexes extents `V` and `C`"),
    ("float w[V, C]; int i2[T]; y[t, c] = w[i2[t], c - 1]", "1:37", "both gathers and shifts"),
]


@pytest.mark.parametrize(("formula", "where", "what"), BAD, ids=[b[2][:30] for b in BAD])
def test_a_bad_formula_is_one_line_with_its_position(formula, where, what):
    with pytest.raises(FormulaError) as e:
        generate(formula, "k")
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(f"<formula>:{where}: "), line
    assert what in line, line
    assert e.value.exit_code == ExitCode.BAD_FORMULA == 24


def test_a_position_is_the_files_where_the_formula_comes_from_a_file():
    source = FormulaSource("   float x[N]\n   y[i] = x[j]", path="k.cu", first_line=10)
    with pytest.raises(FormulaError) as e:
        generate(source, "k")
    assert str(e.value).startswith("k.cu:11:13: index `j` is not bound")


# ---- the command ---------------------------------------------------------------------------------

OPTIML = [sys.executable, "-m", "optiml.cli"]


def optiml(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OPTIML, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )


@needs_nvcc
def test_generate_writes_the_kernel_and_its_reference_then_checks_them(tmp_path):
    p = optiml("generate", "float x[R, C]; y[r] = sum(c) x[r, c]", "--out", "rowsum", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "rowsum.cu").is_file() and (tmp_path / "rowsum_ref.py").is_file()
    assert "rowsum" in p.stdout and "ok" in p.stdout  # the check's table
    assert "not given: 1024 each by default" in p.stderr
    assert "optimization skipped" in p.stderr  # no GPU here, or --no-optimize on one
    _, _, spec = load(tmp_path / "rowsum.cu", "rowsum")
    assert spec.reference.function == "rowsum"


@needs_nvcc
def test_generate_to_stdout_writes_nothing(tmp_path):
    p = optiml("generate", "for i < N: y[i] = max(x[i], 0)", "--out", "-", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("// generated: ") and "__global__ void generated(" in p.stdout
    assert "compiles and its spec is valid" in p.stderr
    assert list(tmp_path.iterdir()) == []


@needs_nvcc
def test_generate_from_a_comment_writes_a_new_file_and_leaves_the_users_alone(tmp_path):
    user = tmp_path / "attn.cu"
    text = (
        "// scores, softmax over rows:\n"
        "//   float x[R, C]; R = 300; C = 77\n"
        "//   m[r] = max(c) x[r, c]; y[r, c] = exp(x[r, c] - m[r]) / sum(c2) exp(x[r, c2] - m[r])\n"
        "__global__ void other(float* p) { p[0] = 1.0f; }\n"
    )
    user.write_text(text)
    p = optiml(
        "generate", "attn.cu", "--line", "2", "--name", "softmax", "--no-optimize", cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    assert user.read_text() == text
    new = (tmp_path / "attn.softmax.cu").read_text()
    assert new.startswith(text[: text.index("__global__")])  # the comment, then the kernel
    assert new.index("__global__ void softmax") < new.index("__global__ void other")
    assert "optimization skipped (--no-optimize)" in p.stderr
    _, _, spec = load(tmp_path / "attn.softmax.cu", "softmax")
    assert spec.sizes[0] == {"R": 300, "C": 77}


def test_a_bad_formula_in_a_file_is_one_line_at_the_files_position(tmp_path):
    (tmp_path / "k.cu").write_text("#include <math.h>\n\n  // y[i] = x[j]\n")
    p = optiml("generate", "k.cu", "--line", "3", cwd=tmp_path)
    assert p.returncode == 24
    lines = p.stderr.strip().splitlines()
    assert lines == [
        "optiml: error: k.cu:3:15: index `j` is not bound: it is not on the left-hand side "
        "(`y[i]`) and no reduction around it binds it; write `sum(j) ...` or add `j` to the left"
    ]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["k.cu"]


def test_line_must_point_at_a_comment(tmp_path):
    (tmp_path / "k.cu").write_text("int x;\n")
    p = optiml("generate", "k.cu", "--line", "1", cwd=tmp_path)
    assert p.returncode == 2 and "is not a comment" in p.stderr


def test_help_lists_the_bad_formula_exit_code():
    p = subprocess.run([*OPTIML, "generate", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "24 bad formula" in p.stdout and "--no-optimize" in p.stdout


# ---- the new forms' references against NumPy written from their definitions -------------------


def _reference(generated: Path, name: str):
    module_spec = importlib.util.spec_from_file_location(name, generated / f"{name}_ref.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def test_shifted_subscripts_read_padding_outside_the_tensor(generated):
    """conv2d (stride 2, padding 1, dilation 2) through sliding windows; max pooling with -inf
    padding; a transposed convolution as the scatter of each input element."""
    from numpy.lib.stride_tricks import sliding_window_view

    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 3, 11, 9))
    w = rng.uniform(-1, 1, (4, 3, 3, 2))
    (got,) = _reference(generated, "conv2d")(
        x=x.ravel(),
        w=w.ravel(),
        y=None,
        B=2,
        CO=4,
        OH=5,
        OW=4,
        CI=3,
        H=11,
        W=9,
        KH=3,
        KW=2,
        S=2,
        P=1,
        D=2,
    )
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    # windows of the dilated kernel's extent, then every D-th element, every S-th window
    win = sliding_window_view(padded, (5, 3), axis=(2, 3))[:, :, ::2, ::2, ::2, ::2]
    want = np.einsum("bchwij,ocij->bohw", win[:, :, :5, :4], w)
    assert np.allclose(got.reshape(2, 4, 5, 4), want)

    x = rng.uniform(-1, 1, (2, 3, 17))
    (got,) = _reference(generated, "maxpool1d")(x=x.ravel(), y=None, B=2, C=3, O=9, L=17)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1)), constant_values=-np.inf)
    want = sliding_window_view(padded, 3, axis=2)[:, :, ::2].max(axis=-1)[:, :, :9]
    assert np.array_equal(got.reshape(2, 3, 9), want)

    x = rng.uniform(-1, 1, (2, 3, 7))
    w = rng.uniform(-1, 1, (3, 2, 3))
    (got,) = _reference(generated, "conv_transposed1d")(
        x=x.ravel(), w=w.ravel(), y=None, B=2, CO=2, O=13, CI=3, L=7, K=3
    )
    want = np.zeros((2, 2, 2 * 7 + 3))  # y[o] += x[i] w[k] at o = 2 i + k - 1
    for i in range(7):
        for k in range(3):
            want[:, :, 2 * i + k] += np.einsum("bc,cd->bd", x[:, :, i], w[:, :, k])
    assert np.allclose(got.reshape(2, 2, 13), want[:, :, 1:14])


def test_scans_and_results_of_one_number_match_numpy(generated):
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (7, 33))
    (got,) = _reference(generated, "cumsum_exclusive")(x.ravel(), None, 7, 33)
    want = np.concatenate([np.zeros((7, 1)), np.cumsum(x[:, :-1], axis=1)], axis=1)
    assert np.allclose(got.reshape(7, 33), want)
    (got,) = _reference(generated, "cummax")(x.ravel(), None, 7, 33)
    assert np.array_equal(got.reshape(7, 33), np.maximum.accumulate(x, axis=1))
    (got,) = _reference(generated, "cumprod")(x.ravel(), None, 7, 33)
    assert np.allclose(got.reshape(7, 33), np.cumprod(1 + x / 8, axis=1))
    (got,) = _reference(generated, "rcumsum_exclusive")(x.ravel(), None, 7, 33)
    want = np.array([[x[r, c + 1 :].sum() for c in range(33)] for r in range(7)])
    assert np.allclose(got.reshape(7, 33), want)
    (got,) = _reference(generated, "rcummin")(x.ravel(), None, 7, 33)
    want = np.array([[x[r, c:].min() for c in range(33)] for r in range(7)])
    assert np.array_equal(got.reshape(7, 33), want)

    p, t = rng.uniform(-1, 1, (2, 37, 61))
    (got,) = _reference(generated, "mse")(p.ravel(), t.ravel(), None, 37, 61)
    assert got.shape == (1,) and np.isclose(got[0], np.mean((p - t) ** 2))
    p, t = rng.uniform(-1, 1, (2, 999))
    (got,) = _reference(generated, "huber")(p, t, None, 999)
    d = np.abs(p - t)
    assert np.isclose(got[0], np.mean(np.where(d < 0.5, d**2, d - 0.25)))
    x = rng.uniform(-1, 1, (13, 300))
    (got,) = _reference(generated, "value_range")(x.ravel(), None, 13, 300)
    assert np.isclose(got[0], x.max() - x.min())


def test_a_sum_of_everything_is_shared_by_the_grid_and_a_scan_one_thread_per_row(generated):
    mse = (generated / "mse.cu").read_text()
    # one sum over everything: the grid's blocks each add their tree's total (in double); the
    # last to arrive writes the result and resets the state it kept (the spec says so)
    assert "grid = min(cdiv(N * M, 1024), 4 * sm_count), block = 256" in mse
    assert "loss: out float[1]" in mse and "state:     kept" in mse
    assert "__device__ double mse_total = 0.0;" in mse and "atomicAdd(&mse_total, partial" in mse
    assert "mse_total = 0.0;" in mse.split("__global__", 1)[1]  # reset for the next launch
    # anything else of one number (a max, a sum that needs another's result) is one block
    top = generate("float x[N]; m = max(i) x[i]", "top").kernel
    assert "grid = 1, block = 256" in top and "__device__" not in top
    scan = (generated / "cummax.cu").read_text()
    assert "grid = cdiv(R, 256)" in scan  # a thread per row runs along the row
    conv = (generated / "conv2d.cu").read_text()
    assert "(oh * S + kh_4 * D - P) >= 0 && (oh * S + kh_4 * D - P) < H &&" in conv  # guarded


def test_the_generated_kernel_is_optimized_where_executor_says(tmp_path):
    """`--executor` sends the search of the generated kernel elsewhere (here a port that refuses:
    the remote's own one-line error, after the kernel was written and checked)."""
    import socket

    from click.testing import CliRunner

    from optiml.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rowsum"
    r = CliRunner().invoke(
        main,
        [
            "generate",
            "float x[R, C]; y[r] = sum(c) x[r, c]",
            "--out",
            str(out),
            "--executor",
            f"ssh://127.0.0.1:{port}",
        ],
    )
    assert r.exit_code == 17, r.stderr
    assert (tmp_path / "rowsum.cu").exists()
    assert r.stderr.strip().splitlines()[-1].startswith("optiml: error: ")
    assert f"127.0.0.1:{port}" in r.stderr.strip().splitlines()[-1]


def _reference_module(generated: Path, name: str):
    module_spec = importlib.util.spec_from_file_location(name, generated / f"{name}_ref.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", IDS)
def test_a_reference_looped_over_every_reduced_name_computes_the_same(generated, name, tmp_path):
    """Where a factor of a reduction would span more than `_SPAN` elements whole, the reference
    takes the reduced names one value at a time (a convolution's taps): with `_SPAN` at one
    element every reduction of every formula loops, and agrees with the whole computation."""
    _, _, spec = load(generated / f"{name}.cu", name)
    sizes = dict(next(f[2] for f in FORMULAS if f[0] == name))
    case = spec.case(sizes)
    _, arrays = _inputs(spec, case, tmp_path, name)
    args = [
        arrays[p] if p in arrays else case.scalars.get(p, case.sizes.get(p)) for p in spec.params
    ]
    whole = _reference_module(generated, name)
    looped = _reference_module(generated, name)
    looped._SPAN = 1
    for want, got in zip(getattr(whole, name)(*args), getattr(looped, name)(*args), strict=True):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True), name


def test_a_convolutions_reference_gathers_one_tap_at_a_time(tmp_path):
    """A 3-D transposed convolution whose input gathered for every tap would span more than the
    reference's `_SPAN` (here lowered to 2^20 elements: the gather whole is 12.8 M, 102 MB, and an
    int64 index array as large per dimension): the reference reads the input one tap at a time, as
    views of it, its peak well under the whole gather's, and equals a direct sum over the taps."""
    import tracemalloc

    formula = (
        "float x[B, CI, D, H, W], w[CI, CO, KD, KH, KW]\n"
        "y[b, o, d, h, v] = sum(k, k2, k3, i) x[b, i, d - k, h - k2, v - k3] * w[i, o, k, k2, k3]"
        "   for d < OD, h < OH, v < OW\n"
        "B = 2; CI = 8; D = 8; H = 16; W = 32; CO = 4; KD = 3; KH = 5; KW = 7;"
        " OD = 10; OH = 20; OW = 38"
    )
    path, name, _ = on_disk(formula, "conv_t3d", tmp_path)
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 8, 8, 16, 32))
    w = rng.uniform(-1, 1, (8, 4, 3, 5, 7))
    _, _, spec = load(path, name)
    sizes = dict(B=2, CI=8, D=8, H=16, W=32, CO=4, KD=3, KH=5, KW=7, OD=10, OH=20, OW=38)
    arrays = {"x": x.ravel(), "w": w.ravel(), "y": None}
    args = [arrays[p] if p in arrays else sizes[p] for p in spec.params]
    module = _reference_module(tmp_path, name)
    module._SPAN = 1 << 20
    tracemalloc.start()
    try:
        (got,) = getattr(module, name)(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    whole = 2 * 8 * 10 * 20 * 38 * 3 * 5 * 7 * 8
    assert peak < whole / 8, (peak, whole)
    want = np.zeros((2, 4, 10, 20, 38))
    for k in range(3):
        for k2 in range(5):
            for k3 in range(7):
                part = np.einsum("bidhv,io->bodhv", x, w[:, :, k, k2, k3])
                want[:, :, k : k + 8, k2 : k2 + 16, k3 : k3 + 32] += part
    assert np.allclose(got.reshape(want.shape), want)


def test_rows_too_few_and_long_get_a_cluster_each_and_plain_keeps_the_thread(tmp_path):
    """KernelBench's BatchNorm as `--from-torch` translates it: 64 channels of 2 M elements, a
    thread each would walk 6 M reads alone (1.9 s a launch on an H100): the file written holds a
    cluster of 8 blocks per channel and says why; `--plain` writes the thread per channel, and
    `--arch sm_80` a block per channel. LogSoftmax's 4,096 rows of 393 K stay a thread each."""
    from click.testing import CliRunner

    from optiml.cli import main

    root = Path(__file__).resolve().parents[1]
    bn = root / "fixtures" / "kb_extra" / "33_BatchNorm.py"

    def written(task: Path, out: str, *extra: str) -> tuple[str, str]:
        args = ["generate", "--from-torch", str(task), "--out", str(tmp_path / out)]
        r = CliRunner().invoke(main, [*args, "--no-optimize", *extra])
        assert r.exit_code == 0, r.stderr
        return (tmp_path / f"{out}.cu").read_text(), r.stderr

    text, said = written(bn, "bn")
    assert "grid = (features) * 8, block = 512" in text and "cluster_dims(8, 1, 1)" in text
    assert "a cluster of 8 blocks per row" in said
    plain, said = written(bn, "bn_plain", "--plain")
    assert "grid = cdiv(features, 256), block = 256" in plain and "per row:" not in said
    # its reads around the channel take the counter over (b, h, w) apart once: b the quotient,
    # (h, w) the remainder of height * width, where each index taken apart costs a division
    assert "% ((long long)height * width))" in plain and "% width)" not in plain
    block, _ = written(bn, "bn_80", "--arch", "sm_80")
    assert "grid = (features) * 1, block = 512" in block and "cluster_dims" not in block
    # LogSoftmax's size in KernelBench: 4,096 rows of 393 K, a thread each walks 1.2 M reads
    soft = generate(
        "float x[B, D]; B = 4096; D = 393216\ny[b, d] = x[b, d] - log(sum(d2) exp(x[b, d2]))",
        "log_softmax",
    )
    assert "grid = cdiv(B, 256), block = 256" in soft.kernel
    assert not any("per row" in note for note in soft.notes)
