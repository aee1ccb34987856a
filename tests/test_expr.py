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
