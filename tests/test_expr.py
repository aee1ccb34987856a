import pytest
from hypothesis import given
from hypothesis import strategies as st

from optiml.expr import Expr, ExprError


@pytest.mark.parametrize(
    ("text", "env", "value"),
    [
        ("cdiv(n, 256)", {"n": 1000003}, 3907),
        ("(n + 255) / 256", {"n": 1000}, 4),  # C integer division
        ("-7 / 2", {}, -3),  # truncates toward zero, as in C
        ("-7 % 2", {}, -1),
        ("1 << 24", {}, 16777216),
        ("2.5f", {}, 2.5),
        ("10u * 3", {}, 30),
        ("min(rows, 64) * max(1, cols)", {"rows": 100, "cols": 3}, 192),
        ("(cdiv(c, 32), cdiv(r, 8))", {"c": 33, "r": 8}, (2, 1)),
        ("n / 2.0", {"n": 3}, 1.5),
    ],
)
def test_evaluates_like_c(text, env, value):
    assert Expr.parse(text).evaluate(env) == value


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("n ? 1 : 2", "cannot read", 2),
        ("foo(n)", "unknown function `foo`", 0),
        ("x.y", "not allowed", 0),
        ("", "expected an expression", 0),
        ("'a'", "not allowed", 0),
    ],
)
def test_rejects_what_is_not_arithmetic(text, message, column):
    with pytest.raises(ExprError) as e:
        Expr.parse(text)
    assert message in str(e.value)
    assert e.value.column == column


def test_unknown_name_at_evaluation():
    with pytest.raises(ExprError, match="`m` is not a size variable"):
        Expr.parse("m + 1").evaluate({"n": 1})


def test_names_exclude_functions():
    assert Expr.parse("cdiv(n, BLOCK) + min(a, 2)").names() == {"n", "BLOCK", "a"}


@given(st.integers(-(10**9), 10**9), st.integers(-1000, 1000).filter(lambda b: b != 0))
def test_division_and_modulo_match_c(a, b):
    q = Expr.parse("a / b").evaluate({"a": a, "b": b})
    r = Expr.parse("a % b").evaluate({"a": a, "b": b})
    assert q * b + r == a  # C's identity
    assert abs(r) < abs(b) and (r == 0 or (r > 0) == (a > 0))


@given(st.integers(0, 10**12), st.integers(1, 4096))
def test_cdiv_is_ceiling(a, b):
    assert Expr.parse("cdiv(a, b)").evaluate({"a": a, "b": b}) == -(-a // b)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0x1f", 31),  # a hex digit `f` is not a float suffix
        ("0x1fu", 31),
        ("1.f + .5f", 1.5),
        ("1e-5f", 1e-5),
        ("2**62", 1 << 62),
        ("(-2)**63", -(1 << 63)),
        ("-9223372036854775808", -(1 << 63)),  # the smallest int64, although its digits overflow
        ("1 << 62", 1 << 62),
        ("-1 >> 1", -1),
        ("~5", -6),
        ("3 ** -2", 1 / 9),
    ],
)
def test_c_values_at_the_edges(text, value):
    assert Expr.parse(text).evaluate({}) == value


TOO_LARGE = "too large: the value must fit in 64 bits"


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("10**10**10", f"`10**10**10` is {TOO_LARGE}", 0),
        ("n ** 64", f"`n ** 64` is {TOO_LARGE}", 0),
        ("2**63", f"`2**63` is {TOO_LARGE}", 0),
        ("9223372036854775807 + 1", f"is {TOO_LARGE}", 0),
        ("1 + 9223372036854775808", f"`9223372036854775808` is {TOO_LARGE}", 4),
        ("n * (1 << 62) * 4", f"is {TOO_LARGE}", 0),
        ("1 << 64", "`1 << 64` shifts by 64: the count must be below 64", 0),
        ("8 >> 70", "shifts by 70", 0),
        ("1 + (1 << -1)", "`1 << -1` shifts by a negative count", 5),
        ("~2.5", "`~` needs an integer, got 2.5", 0),
        ("n & 2.0", "`&` needs integers: `n & 2.0` has a float operand", 0),
        ("1.5 << 2", "`<<` needs integers", 0),
        ("1e308 * 10", "`1e308 * 10` is too large for a double", 0),
        ("10.0 ** 400", "`10.0 ** 400` is too large for a double", 0),
        ("(-8.0) ** 0.5", "is not a real number", 0),
        ("0 ** -1", "raises zero to a negative power", 0),
        ("n / (n - n)", "`n / (n - n)` divides by zero", 0),
        ("cdiv(n, 0)", "divides by zero", 0),
        ("n % 0", "divides by zero", 0),
    ],
)
def test_values_stay_c_values(text, message, column):
    with pytest.raises(ExprError) as e:
        Expr.parse(text).evaluate({"n": 3})
    assert message in str(e.value)
    assert e.value.column == column


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("1e999", "`1e999` is too large for a double", 0),
        ("9" * 150, f"a number of 150 digits is {TOO_LARGE}", 0),
        ("n + " + "1" * 4300, "characters long; at most 2000", 2000),
        ("n²", "`²` (U+00B2) is not allowed in an expression; use ASCII digits", 1),
        ("١٢", "(U+0661) is not allowed", 0),
        ("ｎ + 1", "(U+FF4E) is not allowed", 0),  # Python would read it as `n`
        ("n +\x00 1", "control character U+0000 is not allowed", 3),
        ("(" * 65 + "n" + ")" * 65, "brackets are nested more than 64 deep", 64),
        ("-" * 100 + "n", "nests more than 64 operations", 64),
        ("+".join(["n"] * 70), "nests more than 64 operations", 0),
        ("min(n)", "`min` takes two or more arguments: min(a, b, ...)", 0),
        ("max()", "`max` takes two or more arguments", 0),
        ("cdiv(n, 2, 3)", "`cdiv` takes two arguments: cdiv(a, b)", 0),
        ("min(a=1, b=2)", "`min` takes two or more arguments", 0),
        ("min((1, 2), 3)", "a tuple (`(1, 2)`) can only be the whole value", 4),
        ("(1, 2) * 3", "a tuple (`(1, 2)`) can only be the whole value", 0),
        ("(1, 2, 3, 4)", "a tuple here has one to 3 values, like (x, y, z); this one has 4", 0),
        ("n < 2", "`n < 2` is not allowed in a spec expression; allowed: numbers", 0),
        ("5(3)", "`5(3)` is not allowed", 0),
        ("lambda: 1", "is not allowed", 0),
        ("True + 1", "`True` is not allowed", 0),
    ],
)
def test_bounded_parse(text, message, column):
    with pytest.raises(ExprError) as e:
        Expr.parse(text)
    assert message in str(e.value)
    assert e.value.column == column


def test_huge_powers_fail_at_once():
    """`10**10**10` would take Python minutes and gigabytes; it is refused before computing."""
    import time

    start = time.perf_counter()
    for text in ("10**10**10", "n ** (1 << 62)", "(n + 1) ** 9223372036854775807"):
        with pytest.raises(ExprError, match=TOO_LARGE):
            Expr.parse(text).evaluate({"n": 7})
    assert time.perf_counter() - start < 0.5


def test_long_messages_are_cut_to_one_short_line():
    text = "n + " * 10 + "m"
    with pytest.raises(ExprError) as e:
        Expr.parse(text).evaluate({"n": 1})
    assert str(e.value) == (
        "`m` is not a size variable, scalar argument, template value or constant of the file"
    )
    with pytest.raises(ExprError) as e:
        Expr.parse("n ? " + "1 + " * 30 + "1")
    assert len(str(e.value)) < 80 and "…" in str(e.value)


def test_unknown_name_is_reported_at_its_column():
    with pytest.raises(ExprError) as e:
        Expr.parse("  cdiv(n, BLOCK)").evaluate({"n": 1})
    assert e.value.column == 10


def test_python_parser_warnings_are_not_printed():
    """`5(3)` and `1if x else y` make Python's parser warn on stderr; a spec error is enough."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for text in ("5(3)", "1if n else 2", "0x1for"):
            with pytest.raises(ExprError):
                Expr.parse(text)
    assert seen == []
