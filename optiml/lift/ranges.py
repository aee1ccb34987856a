"""Value ranges of a lifted model's expressions, by interval arithmetic at one problem size.

`interval(e, env)` bounds what `e` can be for any thread: scalars and sizes by their values,
loads by the spec's value range of the tensor (else its element type's), clamps (`min`, `max`,
`x < 0 ? 0 : x`), integer division and remainder, float-to-int conversion. A store's guard
narrows its index (`if (b >= 0 && b < nbins)`). `indices_within(lifted, spec, tensor)` is the
proof a schedule needs before it moves a tensor's updates into a buffer of its own length (a
shared-memory histogram): every index of every store into it lies in [0, length) at every size
of the spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from optiml.cuda.types import DTYPES
from optiml.expr import ExprError
from optiml.lift.model import (
    BOOL,
    INTS,
    Binary,
    Builtin,
    Call,
    Cast,
    Const,
    Expr,
    Lifted,
    Load,
    Param,
    Select,
    Store,
    Unary,
    walk_stmts,
)
from optiml.spec import Case, Spec

INF = math.inf
Interval = tuple[float, float]
ANY: Interval = (-INF, INF)


@dataclass
class Env:
    """What is known at one problem size: scalar and size values, each tensor's element range
    (inclusive) where the spec or the element type bounds it."""

    values: dict[str, float]
    tensors: dict[str, Interval]
    # what a guard says of an expression (`v >= lo && v < hi`): bounds it wherever it appears
    facts: dict = field(default_factory=dict)

    @classmethod
    def of(cls, lifted: Lifted, spec: Spec, case: Case) -> Env:
        values = {**spec.constants, **spec.template_values, **case.sizes, **case.scalars}
        tensors: dict[str, Interval] = {}
        for name, t in lifted.tensors.items():
            dtype = DTYPES[t.code]
            integral = not dtype.is_float
            if name in case.ranges:
                lo, hi = case.ranges[name]
                tensors[name] = (lo, hi - 1) if integral else (lo, hi)
            elif integral:
                info = np.iinfo(dtype.np_dtype())
                tensors[name] = (int(info.min), int(info.max))
        return cls({k: float(v) for k, v in values.items()}, tensors)


def _mul(a: Interval, b: Interval) -> Interval:
    products = []
    for x in a:
        for y in b:
            products.append(0.0 if x == 0 or y == 0 else x * y)
    return (min(products), max(products))


def _trunc(x: float) -> float:
    return x if math.isinf(x) else float(math.trunc(x))


def interval(e: Expr, env: Env) -> Interval:
    """Bounds of `e`'s value for every thread (ANY where nothing is known)."""
    lo, hi = _interval(e, env)
    if e in env.facts:
        flo, fhi = env.facts[e]
        lo, hi = max(lo, flo), min(hi, fhi)
    return (lo, hi)


def _interval(e: Expr, env: Env) -> Interval:
    match e:
        case Const(value=v):
            return (float(v), float(v))
        case Param(name=n):
            v = env.values.get(n)
            return ANY if v is None else (v, v)
        case Builtin(name=n):
            return (0.0, INF) if n.split(".")[0] in ("threadIdx", "blockIdx") else (1.0, INF)
        case Load(tensor=t):
            return env.tensors.get(t, ANY)
        case Unary(op="-", a=a):
            lo, hi = interval(a, env)
            return (-hi, -lo)
        case Unary(op="!"):
            return (0.0, 1.0)
        case Cast(a=a, type=t):
            lo, hi = interval(a, env)
            if t in INTS and a.type not in INTS:
                return (_trunc(lo), _trunc(hi))
            return (lo, hi)
        case Select(cond=c, a=a, b=b):
            # each branch narrowed by what the condition says of it (`x < 0 ? 0 : x`)
            alo, ahi = _narrowed(a, c, interval(a, env), env)
            blo, bhi = _narrowed(b, Unary("!", c, BOOL), interval(b, env), env)
            return (min(alo, blo), max(ahi, bhi))
        case Call(fn=fn, args=args) if fn in ("max", "min") and len(args) == 2:
            (alo, ahi), (blo, bhi) = interval(args[0], env), interval(args[1], env)
            pick = max if fn == "max" else min
            return (pick(alo, blo), pick(ahi, bhi))
        case Call(fn=fn, args=(a,)) if fn in ("floor", "ceil"):
            lo, hi = interval(a, env)
            f = math.floor if fn == "floor" else math.ceil
            return (lo if math.isinf(lo) else f(lo), hi if math.isinf(hi) else f(hi))
        case Binary(op=op) if e.type == BOOL or op in ("<", "<=", ">", ">=", "==", "!="):
            return (0.0, 1.0)
        case Binary(op=op, a=a, b=b):
            return _binary(op, interval(a, env), interval(b, env), e.type in INTS)
    return ANY


def _binary(op: str, a: Interval, b: Interval, integral: bool) -> Interval:
    if op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if op == "-":
        return (a[0] - b[1], a[1] - b[0])
    if op == "*":
        return _mul(a, b)
    if op == "/" and b[0] > 0:
        ends = [x / y for x in a for y in b if not (math.isinf(x) and math.isinf(y))]
        if len(ends) < 4:
            return ANY
        lo, hi = min(ends), max(ends)
        return (_trunc(lo), _trunc(hi)) if integral else (lo, hi)
    if op == "%" and integral and b[0] > 0:
        top = b[1] - 1
        if a[0] >= 0:
            return (0.0, min(a[1], top))
        return (-top, top)
    if op == "&" and integral and (a[0] >= 0 or b[0] >= 0):
        return (0.0, min(x[1] for x in (a, b) if x[0] >= 0))
    if op == ">>" and integral and a[0] >= 0 and b[0] == b[1] and b[0] >= 0:
        s = int(b[0])
        return (float(int(a[0]) >> s), a[1] if math.isinf(a[1]) else float(int(a[1]) >> s))
    return ANY


def _narrowed(index: Expr, guard: Expr, span: Interval, env: Env) -> Interval:
    """`span` narrowed by the guard's conjuncts that compare the index itself with a bound."""
    fact = _facts(guard, env).get(index)
    return span if fact is None else (max(span[0], fact[0]), min(span[1], fact[1]))


def _facts(guard: Expr, env: Env) -> dict:
    """Bounds the guard's conjuncts put on expressions: `x < b` bounds x by b's upper end (less
    one for an integer), `x >= b` by its lower end; on either side of the comparison."""
    facts: dict = {}

    def bound(x: Expr, op: str, other: Expr) -> None:
        lo, hi = facts.get(x, ANY)
        b = interval(other, env)
        step = 1 if x.type in INTS else 0
        if op == "<":
            hi = min(hi, b[1] - step)
        elif op == "<=":
            hi = min(hi, b[1])
        elif op == ">":
            lo = max(lo, b[0] + step)
        elif op == ">=":
            lo = max(lo, b[0])
        facts[x] = (lo, hi)

    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
    for c in _conjuncts(guard):
        if isinstance(c, Binary):
            bound(c.a, c.op, c.b)
            bound(c.b, flip[c.op], c.a)
    return facts


def _conjuncts(g: Expr, negated: bool = False):
    """The comparisons a guard requires (through `&&`, `!` and a negated `||`)."""
    if isinstance(g, Unary) and g.op == "!":
        yield from _conjuncts(g.a, not negated)
    elif isinstance(g, Binary) and g.op == ("||" if negated else "&&"):
        yield from _conjuncts(g.a, negated)
        yield from _conjuncts(g.b, negated)
    elif isinstance(g, Binary) and g.op in ("<", "<=", ">", ">="):
        if negated:
            flipped = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}[g.op]
            yield Binary(flipped, g.a, g.b, BOOL)
        else:
            yield g


def indices_within(lifted: Lifted, spec: Spec, tensor: str) -> bool:
    """Whether every store into `tensor` writes inside it at every size of the spec."""
    stores = [s for s in walk_stmts(lifted.body) if isinstance(s, Store) and s.tensor == tensor]
    if not stores:
        return False
    try:
        cases = spec.cases()
    except ExprError:
        return False
    for case in cases:
        env = Env.of(lifted, spec, case)
        length = case.lengths[tensor]
        for s in stores:
            here = replace(env, facts=_facts(s.guard, env))
            lo, hi = interval(s.index, here)
            if not (lo >= 0 and hi <= length - 1):
                return False
    return True
