"""The contract's forms for real kernels, without a GPU: every fixture of fixtures/contract/ is
accepted by `optiml check`; typedefs, vector types, structs, structured inputs, the file's macros
and constants, any number of size variables and device values parse into what the runner gets;
bad forms are one error at file:line:column with the spec's exit code; the launcher's struct
layout is the compiler's; the judge's unseen sizes keep structured inputs and device values."""

from __future__ import annotations

import os
import random
import subprocess

import numpy as np
import pytest

from optiml.cuda.source import SourceFile
from optiml.errors import SpecError
from optiml.harness.build import build_kernel
from optiml.harness.evaluate import EvalOptions, default_dist, write_plan
from optiml.harness.inputs import Mode, generate
from optiml.search.judge import unseen_sizes
from optiml.spec import Device, load, parse_spec
from tests.support import FIXTURES, ROOT

CONTRACT = FIXTURES / "contract"
FIXTURE_FILES = sorted(CONTRACT.glob("*.cu"))


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_optiml_check_accepts_each_fixture(path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["optiml", "check", str(path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _spec(text: str, kernel: str = "k"):
    source = SourceFile(text, "k.cu")
    return source, parse_spec(source, source.kernel(kernel))


def _error(text: str, kernel: str = "k") -> str:
    with pytest.raises(SpecError) as e:
        _spec(text, kernel)
    return str(e.value)


def test_typedef_and_using_types_are_their_element_types():
    _, spec = _spec(
        "typedef float floatX;\nusing idx_t = unsigned int;\ntypedef floatX real;\n"
        "/* @optiml\n * args: out: out real[n], i: in idx_t[n], a = 2\n"
        " * launch: grid = cdiv(n, 256), block = 256\n * sizes: n = 1000\n */\n"
        "__global__ void k(floatX* out, const idx_t* i, real a, int n) {}\n"
    )
    assert [(b.name, b.dtype) for b in spec.buffers] == [("out", "f32"), ("i", "u32")]
    assert spec.scalars[0].dtype == "f32"


def test_a_typedef_of_another_type_is_refused_at_its_column():
    message = _error(
        "typedef double floatX;\n/* @optiml\n * args: out: out float[n]\n"
        " * launch: grid = cdiv(n, 256), block = 256\n * sizes: n = 1000\n */\n"
        "__global__ void k(floatX* out, int n) {}\n"
    )
    assert message.startswith("k.cu:3:19: `out` is `floatX*` in the signature; write `floatX`")


def test_vector_lengths_count_vectors_and_the_runner_gets_components():
    source, kernel, spec = load(CONTRACT / "vector_float4.cu", "saxpy4")
    case = spec.case({"n": 1000})
    assert case.lengths == {"x": 4000, "y": 4000}
    assert [(b.dtype, b.lanes, b.ctype) for b in spec.buffers] == [("f32", 4, "float4")] * 2
    plan = write_plan(spec, [case], (1,), EvalOptions(time=False))
    assert "buffer x in f32" in plan and "length 4000 " in plan


def test_a_vector_type_must_be_written_as_declared():
    message = _error(
        "/* @optiml\n * args: v: in float2[n]\n * launch: grid = cdiv(n, 256), block = 256\n"
        " * sizes: n = 1000\n */\n__global__ void k(const float4* v, int n) {}\n"
    )
    assert message.startswith("k.cu:2:16: `v` is `const float4*` in the signature")


def test_a_struct_is_packed_as_the_compiler_lays_it_out(tmp_path):
    source, kernel, spec = load(CONTRACT / "struct_param.cu", "scale_shift_struct")
    case = spec.case({"rows": 333, "cols": 517})
    assert case.structs == {"p": {"rows": 333, "cols": 517, "scale": 0.5, "shift": -1.25}}
    plan = write_plan(spec, [case], (1,), EvalOptions(time=False))
    packed = np.zeros(
        (), dtype=[("r", "<i4"), ("c", "<i4"), ("s", "<f4"), ("pad", "<i4"), ("h", "<f8")]
    )
    packed["r"], packed["c"], packed["s"], packed["h"] = 333, 517, 0.5, -1.25
    assert "param bytes 24" in plan
    assert f"scalar x{packed.tobytes().hex()}" in plan
    build = build_kernel(source, kernel, instantiation="", arch="sm_90")
    assert build.ok, build.log
    # the same struct laid out otherwise: the launcher's assertion stops it at compile time
    packed_src = SourceFile(
        (CONTRACT / "struct_param.cu")
        .read_text()
        .replace("struct Params {", "#pragma pack(push, 1)\nstruct Params {", 1)
        .replace("};", "};\n#pragma pack(pop)", 1),
        str(tmp_path / "packed.cu"),
    )
    bad = build_kernel(
        packed_src, packed_src.kernel("scale_shift_struct"), instantiation="", arch="sm_90"
    )
    assert not bad.ok and "laid out otherwise" in bad.log


def test_a_struct_needs_every_field_and_numbers_only():
    head = "struct P { int n; float s; };\nstruct Q { float* p; };\n/* @optiml\n * args: "
    tail = "\n * launch: grid = 1, block = 1\n * sizes: n = 1000\n */\n"
    missing = _error(head + "p = {.n = n}" + tail + "__global__ void k(P p, int n) {}\n")
    assert missing.startswith("k.cu:4:14: `p` gives no value to field(s) s of `P`")
    pointer = _error(head + "q = {.p = 0}" + tail + "__global__ void k(Q q, int n) {}\n")
    assert "struct of numbers only; field `p` of `Q` is `float`" in pointer
    plain = _error(head + "p = 3" + tail + "__global__ void k(P p, int n) {}\n")
    assert "give its fields: `p = {.n = ..., .s = ...}`" in plain


def test_macros_and_constants_are_usable_in_expressions():
    source, kernel, spec = load(CONTRACT / "typedef_element.cu", "add_bias")
    assert spec.constants == {"SECTION_SIZE": 256, "UNROLL": 2}
    case = spec.case({"n": 77777})
    assert case.block == (256, 1, 1) and case.grid == (-(-77777 // 512), 1, 1)


def test_a_macro_that_is_not_an_expression_stays_unknown():
    message = _error(
        "#define BLOCK dim3(32)\n/* @optiml\n * args: x: in float[n]\n"
        " * launch: grid = cdiv(n, 256), block = BLOCK\n * sizes: n = 1000\n */\n"
        "__global__ void k(const float* x, int n) {}\n"
    )
    assert "`BLOCK` is not a size variable, scalar argument, template value or constant" in message


def test_four_and_more_size_variables():
    source, kernel, spec = load(CONTRACT / "attention_scores.cu", "attention_scores")
    assert spec.size_vars == ["B", "T", "NH", "HS"]
    _, six = _spec(
        "/* @optiml\n * args: x: in float[a * b * c * d * e * f]\n"
        " * launch: grid = cdiv(a * b, 256), block = 256\n"
        " * sizes: a, b, c, d, e, f = (1, 2, 3, 4, 5, 6), (7, 5, 3, 2, 1, 1)\n */\n"
        "__global__ void k(const float* x, int a, int b, int c, int d, int e, int f) {}\n"
    )
    assert six.case(six.sizes[0]).lengths == {"x": 720}
    wide = _error(
        "/* @optiml\n * args: x: in float[n]\n * launch: grid = (1, 1, 1, 1), block = 256\n"
        " * sizes: n = 1000\n */\n__global__ void k(const float* x, int n) {}\n"
    )
    assert "k.cu:3:19: grid: a tuple here has one to 3 values" in wide


def test_structured_inputs_reach_the_plan_and_numpy():
    source, kernel, spec = load(CONTRACT / "spmv_csr.cu", "spmv_csr")
    case = spec.case({"rows": 1000, "cols": 777, "nnz": 9001})
    dist = default_dist(spec, case, "row_ptr")
    assert (dist.mode, dist.extra) == (Mode.OFFSETS, 9001.0)
    rows = generate("i32", 0, case.lengths["row_ptr"], 5, dist.lo, dist.hi, dist.mode, dist.extra)
    assert rows[0] == 0 and rows[-1] == 9001 and np.all(np.diff(rows) >= 0)
    assert case.ranges["col_idx"] == (0, 777)
    plan = write_plan(spec, [case], (5,), EvalOptions(time=False))
    assert "length 1001 0 9002 4 9001.0 0.0 9001.0" in plan  # mode 4, probes within [0, nnz]


@pytest.mark.parametrize(
    ("arg", "error"),
    [
        ("p: in int[n] = shuffle()", "k.cu:2:25: a structured input is one of: offsets(TOTAL)"),
        ("p: in int[n] = sorted(1)", "k.cu:2:25: `sorted` takes 2 argument(s): sorted(LO, HI)"),
        ("p: in float[n] = permutation()", "`permutation` makes integers; `p` holds `float`"),
        ("p: out int[n] = offsets(n)", "`p` is `out`: only inputs have structured values"),
        ("p: in int[n] in [0, 4) = sorted(0, 9)", "`p` has a range and `sorted`: give one"),
        ("p: in int[n] = sorted(0, n / )", "k.cu:2:35: argument of `sorted`: cannot read"),
    ],
)
def test_bad_structured_inputs_are_one_error_at_their_column(arg, error):
    ptype = "const float*" if "float" in arg else "int*" if "out" in arg else "const int*"
    message = _error(
        f"/* @optiml\n * args: {arg}\n * launch: grid = cdiv(n, 256), block = 256\n"
        f" * sizes: n = 1000\n */\n__global__ void k({ptype} p, int n) {{}}\n"
    )
    assert error in message and message.count("\n") == 0


def test_bad_input_exits_with_the_spec_code(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text(
        "/* @optiml\n * args: p: in int[n] = offsets()\n * launch: grid = 1, block = 256\n"
        " * sizes: n = 1000\n */\n__global__ void k(const int* p, int n) {}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["optiml", "check", str(bad)], capture_output=True, text=True, env=env)
    assert proc.returncode == 5
    assert f"{bad}:2:25: spec error: `offsets` takes 1 argument(s)" in proc.stdout + proc.stderr


def test_device_values_in_the_launch_and_their_fallback():
    source, kernel, spec = load(CONTRACT / "sm_count_launch.cu", "scale_stride")
    assert spec.uses_device
    assert spec.case({"n": 1000}).grid == (132 * 8, 1, 1)  # an H200 where no GPU is asked
    assert spec.case({"n": 1000}, Device(sm_count=80, max_threads_per_sm=1536)).grid == (480, 1, 1)
    message = _error(
        "/* @optiml\n * args: x: in float[sm_count]\n * launch: grid = 1, block = 256\n"
        " * sizes: n = 1000\n */\n__global__ void k(const float* x, int n) {}\n"
    )
    assert "`sm_count` is a device value: only `launch:` may use it" in message


@pytest.mark.parametrize(
    ("name", "kernel"),
    [
        ("spmv_csr.cu", "spmv_csr"),
        ("sm_count_launch.cu", "scale_stride"),
        ("permute4d.cu", "permute4d"),
    ],
)
def test_unseen_sizes_keep_structure_and_device_values(name, kernel):
    source, k, spec = load(CONTRACT / name, kernel)
    sizes = unseen_sizes(spec, random.Random(3))
    assert sizes and all(s not in spec.sizes for s in sizes)
    for s in sizes:
        case = spec.case(s, Device(sm_count=100))
        if name == "spmv_csr.cu":
            assert case.structures["row_ptr"] == ("offsets", float(s["nnz"]))
            assert case.lengths["row_ptr"] == s["rows"] + 1
        if name == "sm_count_launch.cu":
            assert case.grid[0] == 100 * 8


def test_the_plan_says_from_how_long_a_round_is_its_own_warm_up():
    source, kernel, spec = load(CONTRACT / "vector_float4.cu", "saxpy4")
    case = spec.case({"n": 1000})
    assert "\nslow_round 20.0\n" in write_plan(spec, [case], (1,), EvalOptions())
    assert "\nslow_round 0\n" in write_plan(spec, [case], (1,), EvalOptions(slow_round_ms=None))
