"""Loops of a constant trip count, written out: a loop's result (`LoopOut`) whose loop stores
nothing, starts from values that do not depend on it, and runs a number of iterations its
condition settles on constants (a window of taps `for (k = -R; k <= R; ++k)`) becomes the
expression its carried values reach, iteration by iteration. Schedules that take one value per
element (a map) can then take a stencil's or a small convolution's window as they take any other
reads at other indices."""

from __future__ import annotations

import operator
from dataclasses import fields, replace

from optiml.lift.model import (
    BOOL,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    Binary,
    Cast,
    Const,
    Expr,
    Loop,
    LoopOut,
    Select,
    Unary,
    Var,
    children,
    walk_expr,
)

MAX_TRIPS = 32  # iterations worth writing out: a window, not a row

_COMPARE = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class NotUnrollable(Exception):
    pass


def unrolled(e: Expr) -> Expr:
    """`e` with every loop result under it written out; `NotUnrollable` where one cannot be."""
    return _walk(e, {})


def _walk(e: Expr, env: dict[int, Expr]) -> Expr:
    if isinstance(e, Var):
        return env.get(e.uid, e)
    if isinstance(e, LoopOut):
        return _unroll(e.loop, env)[e.var.uid]
    changes = {}
    for f in fields(e):
        v = getattr(e, f.name)
        if isinstance(v, tuple):
            if v and all(_is_expr(x) for x in v):
                changes[f.name] = tuple(_walk(x, env) for x in v)
        elif _is_expr(v):
            changes[f.name] = _walk(v, env)
    return _fold(replace(e, **changes)) if changes else e


def _is_expr(v) -> bool:
    return hasattr(v, "type") and not isinstance(v, str)


def _unroll(loop: Loop, outer: dict[int, Expr]) -> dict[int, Expr]:
    if loop.body:
        raise NotUnrollable("a loop that stores")
    updates = {c.var.uid: _linear(c.var, c.update) for c in loop.carried}
    values = {c.var.uid: _walk(c.init, outer) for c in loop.carried}
    for _ in range(MAX_TRIPS + 1):
        env = {**outer, **values}
        cond = _walk(loop.cond, env)
        if not isinstance(cond, Const):
            raise NotUnrollable("a trip count that is not a constant")
        if not cond.value:
            return values
        values = {c.var.uid: _walk(updates[c.var.uid], env) for c in loop.carried}
    raise NotUnrollable(f"more than {MAX_TRIPS} iterations")


def _linear(v: Var, update: Expr) -> Expr:
    """A skipped step of a running sum or product, `c ? s + t : s`, as `s + (c ? t : 0)` (and
    `s * (c ? t : 1)`): the same value (but the sign of a zero sum), with `s` written once, so
    that writing out the iterations does not double the expression at every step."""
    if not isinstance(update, Select) or update.type not in (FLOAT, DOUBLE):
        return update
    for grown, kept, flip in ((update.a, update.b, False), (update.b, update.a, True)):
        if kept == v and isinstance(grown, Binary) and grown.op in ("+", "*") and grown.a == v:
            unit = Const(0.0 if grown.op == "+" else 1.0, grown.b.type)
            a, b = (grown.b, unit) if not flip else (unit, grown.b)
            return Binary(grown.op, v, Select(update.cond, a, b, grown.b.type), update.type)
    return update


def _fold(e: Expr) -> Expr:
    """Integer constants folded (the loop counter's arithmetic and comparisons)."""
    ints = (INT, LONG, BOOL)
    if (
        isinstance(e, Binary)
        and isinstance(e.a, Const)
        and isinstance(e.b, Const)
        and e.a.type in ints
        and e.b.type in ints
    ):
        a, b = int(e.a.value), int(e.b.value)
        if e.op in _COMPARE:
            return Const(_COMPARE[e.op](a, b), BOOL)
        if e.op in _ARITH:
            return Const(_ARITH[e.op](a, b), e.type)
        if e.op in ("&&", "||"):
            return Const(bool(a and b) if e.op == "&&" else bool(a or b), BOOL)
    if isinstance(e, Unary) and isinstance(e.a, Const) and e.a.type in (INT, LONG, BOOL):
        if e.op == "-":
            return Const(-int(e.a.value), e.type)
        if e.op == "!":
            return Const(not e.a.value, BOOL)
    if (
        isinstance(e, Cast)
        and isinstance(e.a, Const)
        and e.type in (INT, LONG)
        and e.a.type
        in (
            INT,
            LONG,
            BOOL,
        )
    ):
        return Const(int(e.a.value), e.type)
    return e


def has_loops(e: Expr) -> bool:
    return any(isinstance(x, LoopOut) for x in walk_expr(e, into_loops=False))


def written_size(e: Expr) -> int:
    """How many nodes `e` has written out as a tree (as C text writes it): counted over the
    shared subexpressions once each, so that a window whose steps share the sum so far costs
    no more to measure than it is to build."""
    memo: dict[int, int] = {}

    def size(x) -> int:
        if id(x) not in memo:
            memo[id(x)] = 1 + sum(size(c) for c in children(x))
        return memo[id(x)]

    return size(e)
