"""The @optiml spec: what parses, into what, and every error at its position."""

from __future__ import annotations

import textwrap

import pytest

from optiml.cuda.source import SourceFile
from optiml.errors import SpecError
from optiml.spec import parse_spec
from tests.support import FIXTURES, MANIFEST, fixture_ids

SAXPY_SIG = "__global__ void saxpy(int n, float a, const float* x, float* y) { }\n"


def spec_of(text: str, kernel: str = "saxpy"):
    source = SourceFile(textwrap.dedent(text), "k.cu")
    return parse_spec(source, source.kernel(kernel))


def errors_of(text: str, kernel: str = "saxpy") -> list[str]:
    with pytest.raises(SpecError) as e:
        spec_of(text, kernel)
    return [f"{p.line}:{p.column}: {m}" for m, p in e.value.issues]


def test_the_example_from_the_docs():
    spec = spec_of(
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1000003
         */
        """
        + SAXPY_SIG
    )
    assert [(b.name, b.role, b.dtype, b.length) for b in spec.buffers] == [
        ("x", "in", "f32", "n"),
        ("y", "inout", "f32", "n"),
    ]
    assert [(s.name, s.dtype, s.value) for s in spec.scalars] == [
        ("n", "i32", "n"),
        ("a", "f32", "2.5"),
    ]
    assert spec.sizes == [{"n": 16777216}, {"n": 1000003}]
    assert spec.seeds == 2 and spec.reference.kind == "self"
    case = spec.case({"n": 1000003})
    assert case.grid == (3907, 1, 1) and case.block == (256, 1, 1) and case.smem == 0
    assert case.scalars == {"n": 1000003, "a": 2.5} and case.lengths == {"x": 1000003, "y": 1000003}


def test_line_comments_tuples_continuations_remarks_and_every_key():
    spec = spec_of(
        """\
        // @optiml
        //   args:   x: in float[rows * cols] in [-4, 4),  # a remark
        //           y: out float[rows * cols], a = cols / 2
        //   launch: grid = (cdiv(cols, 32), cdiv(rows, 8)), block = (32, 8), smem = 32 * 33 * 4
        //   sizes:  rows, cols = (4096, 4096), (1000, 777)
        //   tol:    rtol = 1e-4, atol = 1e-6
        //   seeds:  3
        //   arch:   sm_80
        __global__ void k(const float* x, float* y, int rows, int cols, float a) { }
        """,
        "k",
    )
    assert spec.buffers[0].value_range == ("-4", "4")
    assert spec.size_vars == ["rows", "cols"]
    case = spec.case({"rows": 1000, "cols": 777})
    assert case.grid == (25, 125, 1) and case.block == (32, 8, 1) and case.smem == 4224
    assert case.scalars["a"] == 388 and case.ranges == {"x": (-4, 4)}
    assert (spec.rtol, spec.atol, spec.seeds, spec.arch) == (1e-4, 1e-6, 3, "sm_80")


def test_templates_resolve_types_and_values():
    spec = spec_of(
        """\
        /* @optiml
         *   args: x: in T[n], y: out T[n]
         *   launch: grid = cdiv(n, BLOCK), block = BLOCK
         *   sizes: n = 1000
         *   template: T = half, BLOCK = 128
         */
        template <typename T, int BLOCK>
        __global__ void copy(int n, const T* x, T* y) { }
        """,
        "copy",
    )
    assert spec.instantiation == "<half, 128>"
    assert spec.buffers[0].dtype == "f16"
    assert spec.case({"n": 1000}).grid == (8, 1, 1)


def test_references():
    text = """\
        /* @optiml
         *   args: x: in float[n], y: out float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes: n = 1000
         *   reference: {ref}
         */
        __global__ void fast(int n, const float* x, float* y) {{ }}
        __global__ void slow(int n, const float* x, float* y) {{ }}
        __global__ void other(int n, const float* x) {{ }}
        """
    assert spec_of(text.format(ref="slow"), "fast").reference.kernel == "slow"
    assert errors_of(text.format(ref="other"), "fast") == [
        "5:17: reference `other` must take the same parameters as `fast`"
    ]
    assert errors_of(text.format(ref="slwo"), "fast") == [
        "5:17: no kernel `slwo` in this file to use as the reference; kernels: slow, other"
    ]
    assert errors_of(text.format(ref="missing.py:ref"), "fast") == [
        "5:17: NumPy reference file `missing.py` not found next to k.cu"
    ]


BAD = [
    (
        "unknown key, with a suggestion",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1000003
         *   seedz:  3
         */
        """,
        ["5:6: unknown spec key `seedz`; did you mean `seeds`?"],
    ),
    (
        "a parameter that is not declared and one that does not exist",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], z: in float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1000003
         */
        """,
        [
            "2:39: `z` is not a parameter of `saxpy(int n, float a, const float* x, float* y)`",
            "2:14: pointer `y` (`float*`) is not declared; add `y: in float[n]` to args",
        ],
    ),
    (
        "the wrong type, a const output, a scalar declared as a buffer",
        """\
        /* @optiml
         *   args:   a: in float[n], x: out float[n], y: inout double[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1000003
         */
        """,
        [
            "2:14: `a` is a scalar (`float`) in the signature; give it a value: `a = ...`",
            "2:33: `x` is `const float*`: a const pointer can only be `in`",
            "2:56: `y` is `float*` in the signature; write `float` here",
        ],
    ),
    (
        "a bad expression, at its column",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n ?], y: inout float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1000003
         */
        """,
        ["2:37: length of `x`: cannot read `n ?` as an expression"],
    ),
    (
        "every size a multiple of the block",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1 << 24, 1024
         */
        """,
        [
            "4:14: every size is a multiple of the block size (256); add one that is not (e.g. 1048579) so bounds checks are tested"
        ],
    ),
    (
        "one seed, a block too large",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 2048), block = 2048
         *   sizes:  n = 1000003
         *   seeds:  1
         */
        """,
        [
            "5:14: seeds must be a whole number from 2 to 64, got `1`",
        ],
    ),
    (
        "missing launch and sizes",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         */
        """,
        [
            "1:1: the spec has no `launch:`; add a line like `launch: grid = cdiv(n, 256), block = 256`",
            "1:1: the spec has no `sizes:`; add a line like `sizes: n = 1 << 24, 1000003`",
            "2:14: scalar `n` (`int`) has no value; add `n = ...` to args or make it a size",
        ],
    ),
    (
        "a size tuple of the wrong arity",
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = (1, 2)
         */
        """,
        ["4:18: this size has 2 value(s) for 1 variable(s); write one number"],
    ),
]


@pytest.mark.parametrize(("what", "spec", "expected"), BAD, ids=[b[0] for b in BAD])
def test_errors_say_where_and_what_would_be_right(what, spec, expected):
    assert errors_of(spec + SAXPY_SIG) == expected


def test_block_too_large_is_reported_at_launch():
    errs = errors_of(
        """\
        /* @optiml
         *   args:   a = 2.5, x: in float[n], y: inout float[n]
         *   launch: grid = cdiv(n, 2048), block = 2048
         *   sizes:  n = 1000003
         */
        """
        + SAXPY_SIG
    )
    assert errs == ["3:14: block (2048, 1, 1) has 2048 threads; at most 1024"]


def test_kernel_without_spec_says_how_to_get_one():
    errs = errors_of(SAXPY_SIG)
    assert errs == [
        "1:17: kernel `saxpy` has no `@optiml` spec above it; `optiml spec k.cu --kernel saxpy` drafts one"
    ]


def test_template_without_instantiation():
    errs = errors_of(
        """\
        /* @optiml
         *   args: x: in T[n]
         *   launch: grid = 1, block = 1
         *   sizes: n = 3
         */
        template <typename T> __global__ void t(int n, const T* x) { }
        """,
        "t",
    )
    assert errs == ["1:1: `t` is a template: give its instantiation, e.g. `template: T = float`"]


@pytest.mark.parametrize("entry", MANIFEST, ids=fixture_ids(MANIFEST))
def test_every_fixture_spec_parses(entry):
    source = SourceFile.read(FIXTURES / entry["file"])
    spec = parse_spec(source, source.kernel(entry["kernel"]))
    assert spec.seeds >= 2
    assert len(spec.sizes) >= 2
    cases = spec.cases()
    assert all(c.grid[0] > 0 and c.block[0] > 0 for c in cases)


def saxpy_with(line: str, **replace: str) -> str:
    """The docs' saxpy spec with one more line, or with keys replaced (`sizes="n = 7"`)."""
    keys = {
        "args": "a = 2.5, x: in float[n], y: inout float[n]",
        "launch": "grid = cdiv(n, 256), block = 256",
        "sizes": "n = 1 << 24, 1000003",
        **replace,
    }
    body = "".join(f" *   {k}: {v}\n" for k, v in keys.items())
    return f"/* @optiml\n{body}{line}*/\n{SAXPY_SIG}"


UNREADABLE = [
    (" *   seeds: ²\n", "5:13: seeds must be a whole number from 2 to 64, got `²`"),
    (" *   seeds: 99999\n", "5:13: seeds must be a whole number from 2 to 64, got `99999`"),
    (" *   seeds: " + "9" * 4400 + "\n", "5:13: seeds must be a whole number from 2 to 64"),
    (" *   tol: rtol = 1e999\n", "5:18: rtol: `1e999` is too large for a double"),
    (" *   tol: rtol = nan\n", "5:18: rtol: `nan` is not a size variable"),
    (" *   tol: atol = (1, 2)\n", "5:18: atol must be a number like 1e-5, not a tuple"),
    (" *   tol: rtol = -1e-5\n", "5:18: rtol must not be negative"),
    (" *   tol: rtol\n", "5:11: tol takes `rtol = ...` and/or `atol = ...`"),
    (" *   seedś: 3\n", "5:6: unknown spec key `seedś`; did you mean `seeds`?"),
    (" *   reference: " + "r" * 300 + "\n", "5:17: reference is `self`, a kernel name"),
    (
        " *   reference: " + "d/" * 2000 + "ref.py:f\n",
        "5:17: reference is `self`, a kernel name, or `file.py:function` (at most 1020",
    ),
    (
        " *   reference: " + "d" * 300 + ".py:f\n",
        "5:17: cannot look up NumPy reference file `ddd",
    ),
    (" *   arch: sm_٩٠\n", "5:12: arch is a target like `sm_90` (sm_XY, sm_XYa or sm_XYf)"),
]


@pytest.mark.parametrize(("line", "expected"), UNREADABLE, ids=[u[1][:40] for u in UNREADABLE])
def test_values_that_python_cannot_read_are_spec_errors(line, expected):
    errs = errors_of(saxpy_with(line))
    assert len(errs) == 1 and errs[0].startswith(expected), errs


OUT_OF_RANGE = [
    ({"sizes": "n = 10**10**10, 7"}, "4:17: sizes are numbers: `10**10**10` is too large"),
    ({"sizes": "n = 1 << 64, 7"}, "4:17: sizes are numbers: `1 << 64` shifts by 64"),
    ({"sizes": "n = 1 << -1, 7"}, "4:17: sizes are numbers: `1 << -1` shifts by a negative count"),
    ({"sizes": "n = ~2.5, 7"}, "4:17: sizes are numbers: `~` needs an integer, got 2.5"),
    ({"sizes": "n = 1e308 * 10, 7"}, "4:17: sizes are numbers: `1e308 * 10` is too large"),
    ({"sizes": "n = " + "9" * 150}, "4:17: size: a number of 150 digits is too large"),
    ({"sizes": "n = " + "9" * 4300}, "4:2017: size: the expression is 4300 characters long"),
    ({"sizes": "n = " + "(" * 80 + "1" + ")" * 80}, "4:81: size: brackets are nested more than"),
    ({"sizes": "n = (1, 2), 7"}, "4:17: this size has 2 value(s) for 1 variable(s)"),
    (
        {"sizes": ", ".join(["n = 3"] + [str(i) for i in range(1, 70)])},
        "4:17: 70 sizes; at most 64",
    ),
    ({"sizes": "n, n = (3, 4)"}, "4:16: size variable `n` is named twice"),
    (
        {"sizes": "n = 1 << 40, 7"},
        "4:13: at size n=1099511627776: `n` = 1099511627776 does not fit in its type `int32` "
        "(-2147483648 to 2147483647)",
    ),
    (
        {"args": "a = 2.5, x: in float[n] in [(1, 2), 3), y: inout float[n]"},
        "2:40: range start is one number, not a tuple",
    ),
    (
        {"args": "a = 2.5, x: in float[n] in [1, 2, 3), y: inout float[n]"},
        "2:40: a range of input values is `in [LO, HI)`, two numbers",
    ),
    (
        {"args": "a = 2.5, x: in float[n] in [5, 2), y: inout float[n]"},
        "4:13: at size n=16777216: the range of `x`, [5, 2), is empty; write LO < HI",
    ),
    (
        {"args": "a = min((1, 2), 3), x: in float[n], y: inout float[n]"},
        "2:20: value of `a`: a tuple (`(1, 2)`) can only be the whole value",
    ),
    ({"launch": "grid = 1 << 40, block = 256"}, "3:14: grid (1099511627776, 1, 1): x is at most"),
    ({"launch": "grid = 1, block = (1, 1, 128)"}, "3:14: block (1, 1, 128): z is at most 64"),
]


@pytest.mark.parametrize(("keys", "expected"), OUT_OF_RANGE, ids=[o[1][:40] for o in OUT_OF_RANGE])
def test_values_out_of_range_are_spec_errors_at_their_place(keys, expected):
    errs = errors_of(saxpy_with("", **keys))
    assert any(e.startswith(expected) for e in errs), errs


def test_an_integer_scalar_must_fit_its_type():
    errs = errors_of(
        """\
        /* @optiml
         *   args:   x: in float[n], y: out float[n], k = 1 << 40
         *   launch: grid = cdiv(n, 256), block = 256
         *   sizes:  n = 1000003
         */
        __global__ void scale(int n, int k, const float* x, float* y) { }
        """,
        "scale",
    )
    assert errs == [
        "4:14: at size n=1000003: `k` = 1099511627776 does not fit in its type `int32` "
        "(-2147483648 to 2147483647)"
    ]


def test_a_buffer_whose_bytes_overflow_64_bits():
    errs = errors_of(
        """\
        /* @optiml
         *   args:   x: in float[n]
         *   launch: grid = 1, block = 256
         *   sizes:  n = 1 << 62, 7
         */
        __global__ void k(long n, const float* x) { }
        """,
        "k",
    )
    assert errs == [
        "4:14: at size n=4611686018427387904: `x` would have 4611686018427387904 elements of 4 "
        "bytes: too large, its size in bytes must fit in 64 bits"
    ]


def test_a_long_value_is_refused_before_it_is_read():
    errs = errors_of(saxpy_with("", args="a = 2.5, " + "x: in float[n], " * 700))
    assert errs == ["2:6: `args` is 11210 characters long; at most 10000"]


def test_long_unclosed_items_parse_in_linear_time():
    """A lazy length and a range split at its last comma once took seconds on such an item."""
    import time

    start = time.perf_counter()
    errors_of(saxpy_with("", args="x: in float[" + "] in [0, n) ," * 700))
    assert time.perf_counter() - start < 1.0


def test_messages_stay_on_one_line():
    errs = errors_of(saxpy_with("", args="a = 2.5, x: in flo\rat[n], y: inout float[n]"))
    assert errs == [
        "2:27: unknown element type `flo\\rat`; use one of: bfloat16, char, double, float, half, "
        "int, int16, int32, int64, int8, long, short, uint16, uint32, uint64, uint8, unsigned"
    ]


def _nvcc_targets():
    from optiml.arch import nvcc_targets

    return nvcc_targets()


needs_nvcc = pytest.mark.skipif(not _nvcc_targets(), reason="needs nvcc to list its targets")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_100", "sm_120", "sm_121", "sm_90a", "sm_100f"])
def test_arch_takes_every_target_nvcc_has(arch):
    if arch not in _nvcc_targets():
        pytest.skip(f"this nvcc has no {arch}")
    assert spec_of(saxpy_with(f" *   arch: {arch}\n")).arch == arch


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_999", "sm_80a", "sm_20"])
def test_arch_names_what_nvcc_accepts(arch):
    errs = errors_of(saxpy_with(f" *   arch: {arch}\n"))
    assert len(errs) == 1
    assert errs[0].startswith("5:12: arch: nvcc ") and f"cannot compile for `{arch}`" in errs[0]
    assert "accepts sm_75, sm_80" in errs[0] and "sm_90a" in errs[0]


def test_state_kept_is_the_kernels_own_declaration():
    assert not spec_of(saxpy_with("")).state_kept
    assert spec_of(saxpy_with(" *   state: kept\n")).state_kept
    errs = errors_of(saxpy_with(" *   state: sometimes\n"))
    assert len(errs) == 1 and "state is `kept` or `none`, got `sometimes`" in errs[0]
