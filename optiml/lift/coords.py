"""A flat thread index taken apart into coordinates.

Naive kernels often launch one thread per output element along x and take the index apart with
`/` and `%` (`row = idx / N; col = idx % N`, or three levels for a batch). The model of such a
kernel is the model of a 2-D or 3-D launch in disguise: `delinearize` finds the place values the
kernel divides the index by (a chain where each divides the next, as `(g / P) % Q` and
`(g % P) / Q` do), the bound `g < B` of its guard, and rewrites every expression with each digit
of the index as a coordinate along a virtual launch dimension (the fastest digit along x, the
next along y, then z). Guards `g < B` become `x < P1 && y < B / P1`; indices become affine in the
coordinates. Readers of 2-D and 3-D kernels (contractions, for one) then read the flat kernel as
they read the same kernel written with a 2-D grid; the `Flat` record says how the original launch
covers the virtual one (`total` threads along `dim`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from optiml.lift.families import Affine, affine, global_indices
from optiml.lift.model import (
    BOOL,
    INT,
    LONG,
    Binary,
    Builtin,
    Call,
    Cast,
    Const,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Param,
    Rewriter,
    Select,
    Stmt,
    Store,
    Unary,
)

DIMS = "xyz"

# A place value or an extent: (integer coefficient, sorted names of the scalar parameters it
# multiplies).
Mono = tuple[int, tuple[str, ...]]
ONE: Mono = (1, ())


class NotSplit(Exception):
    """The kernel's thread index is not taken apart in a way `delinearize` follows; says why."""


def size_mono(e: Expr) -> Mono:
    """A product of integer constants and scalar parameters as a `Mono`."""
    match e:
        case Const(value=v) if e.type in (INT, LONG):
            return (int(v), ())
        case Cast(a=a) if a.type in (INT, LONG, BOOL):
            return size_mono(a)
        case Param(name=n) if e.type in (INT, LONG):
            return (1, (n,))
        case Binary(op="*", a=a, b=b):
            return times(size_mono(a), size_mono(b))
        case Binary(op="<<", a=a, b=Const(value=s)):
            c, m = size_mono(a)
            return (c << int(s), m)
    raise NotSplit("a divisor that is not a product of sizes")


def times(p: Mono, q: Mono) -> Mono:
    return (p[0] * q[0], tuple(sorted(p[1] + q[1])))


def over(p: Mono, q: Mono) -> Mono | None:
    """p / q where q divides p, else None."""
    if q[0] == 0 or p[0] % q[0]:
        return None
    rest = list(p[1])
    for a in q[1]:
        if a not in rest:
            return None
        rest.remove(a)
    return (p[0] // q[0], tuple(rest))


def mono_affine(m: Mono) -> Affine:
    return {m[1]: m[0]} if m[0] else {}


@dataclass(frozen=True)
class Flat:
    """How a flat index along `dim` became coordinates: `places[i]` is the place value of axis i
    (fastest first), `extents[i]` its extent, `axes[i]` the virtual launch dimension it became;
    the original launch must run `total` threads along `dim` (the guard's bound `g < total`).
    Without such a bound the last axis's extent and `total` are None: the kernel's guards bound
    the coordinates themselves (`row < M`), and a reader takes the extent from there."""

    dim: str
    places: tuple[Mono, ...]
    extents: tuple[Mono | None, ...]
    axes: tuple[str, ...]
    total: Mono | None
    block: int | None = None  # a block size the kernel spells (`256 * blockIdx.x + threadIdx.x`)

    def extent(self, axis: str) -> Affine | None:
        m = self.extents[self.axes.index(axis)]
        return None if m is None else mono_affine(m)


def digit_range(
    e: Expr, is_base: Callable[[Expr], bool], what: str
) -> tuple[Mono, Mono | None] | None:
    """(lo, hi) where `e` is (base % hi) / lo for an expression `is_base` accepts; None where it
    is not a digit range of the base; `NotSplit` where a division cuts across digits."""
    if is_base(e):
        return (ONE, None)
    if isinstance(e, Cast) and e.type in (INT, LONG) and e.a.type in (INT, LONG):
        return digit_range(e.a, is_base, what)
    if not (isinstance(e, Binary) and e.op in ("/", "%") and e.type in (INT, LONG)):
        return None
    inner = digit_range(e.a, is_base, what)
    if inner is None:
        return None
    lo, hi = inner
    m = times(lo, size_mono(e.b))
    if hi is not None and over(hi, m) is None:
        raise NotSplit(f"a division that does not split the {what}'s digits")
    return (m, hi) if e.op == "/" else (lo, m)


@dataclass
class _Reader(Rewriter):
    """Finds the flat index's place values and bound (pass 1) and rewrites the model (pass 2)."""

    dim: str
    places: set[Mono] = field(default_factory=lambda: {ONE})
    bounds: set[Mono] = field(default_factory=set)
    chain: list[Mono] = field(default_factory=list)
    extents: list[Mono | None] = field(default_factory=list)  # the last None: no `g < N`
    coord_type: str = INT
    spelled: set[int] = field(default_factory=set)
    memo: dict = field(default_factory=dict)
    loops: dict[int, Loop] = field(default_factory=dict)

    # -- the flat index and its digits ---------------------------------------------------------

    def is_g(self, e: Expr) -> bool:
        if e.type not in (INT, LONG) or not any(isinstance(x, Builtin) for x in _walk(e)):
            return False
        f = affine(e)
        if f is None or global_indices(f) != {(f"g.{self.dim}",): 1}:
            return False
        bi, ti = f"blockIdx.{self.dim}", f"threadIdx.{self.dim}"
        if f.get((bi,)) and f.get((ti,)):
            self.spelled.add(f[(bi,)] // f[(ti,)])
        return True

    def digits(self, e: Expr) -> tuple[Mono, Mono | None] | None:
        """(lo, hi) where `e` is (g % hi) / lo; None where `e` is not a digit range of g."""
        return digit_range(e, self.is_g, "thread index")

    def compared(self, e: Expr) -> tuple[bool, Mono] | None:
        """(`g < B` holds when the comparison does, B) for `g < B`, `g >= B`, `B > g`, `B <= g`."""
        if not (isinstance(e, Binary) and e.op in ("<", ">=", ">", "<=")):
            return None
        if self.is_g(e.a) and not _moves(e.b):
            return (e.op == "<", size_mono(e.b)) if e.op in ("<", ">=") else None
        if self.is_g(e.b) and not _moves(e.a):
            return (e.op == ">", size_mono(e.a)) if e.op in (">", "<=") else None
        return None

    # -- pass 1 -------------------------------------------------------------------------------

    def scan(self, e: Expr) -> None:
        if not _moves(e):
            return
        hit = self.compared(e)
        if hit is not None:
            self.bounds.add(hit[1])
            return
        d = self.digits(e)
        if d is not None:
            self.places.add(d[0])
            if d[1] is not None:
                self.places.add(d[1])
            return
        if isinstance(e, Builtin):
            raise NotSplit(f"`{e.name}` outside the thread's flat index")
        if isinstance(e, LoopOut):
            self.scan_loop(e.loop)
            return
        for x in _children(e):
            self.scan(x)

    def scan_loop(self, loop: Loop) -> None:
        if loop.uid in self.loops:
            return
        self.loops[loop.uid] = loop
        for x in _loop_exprs(loop):
            self.scan(x)

    def settle(self) -> None:
        self.chain = sorted(self.places, key=lambda p: (len(p[1]), p[0]))
        if len(self.chain) < 2:
            raise NotSplit("the thread index is not taken apart")
        if len(self.chain) > len(DIMS):
            raise NotSplit("more digits than launch dimensions")
        for p, q in zip(self.chain, self.chain[1:], strict=False):
            if over(q, p) is None:
                raise NotSplit("place values that do not divide each other")
        if len(self.bounds) > 1:
            raise NotSplit("several bounds `index < N` on the thread's flat index")
        top = None
        for bound in self.bounds:
            top = over(bound, self.chain[-1])
            if top is None:
                raise NotSplit("a bound that is not a multiple of the largest place value")
        self.extents = [over(q, p) for p, q in zip(self.chain, self.chain[1:], strict=False)]
        self.extents.append(top)

    # -- pass 2 -------------------------------------------------------------------------------

    def coord(self, i: int) -> Expr:
        d = DIMS[i]
        t = self.coord_type
        return Binary(
            "+",
            Binary("*", Builtin(f"blockIdx.{d}"), Builtin(f"blockDim.{d}"), INT),
            Builtin(f"threadIdx.{d}"),
            t,
        )

    def value(self, lo: Mono, hi: Mono | None) -> Expr:
        """(g % hi) / lo as a sum of coordinates times their place values over lo."""
        first = self.chain.index(lo)
        last = len(self.chain) if hi is None else self.chain.index(hi)
        total: Expr | None = None
        for i in range(first, last):
            weight = over(self.chain[i], lo)
            assert weight is not None
            term = self.coord(i)
            if weight != ONE:
                term = Binary("*", term, _mono_expr(weight, self.coord_type), self.coord_type)
            total = term if total is None else Binary("+", total, term, self.coord_type)
        return total if total is not None else Const(0, self.coord_type)

    def bounds_expr(self) -> Expr:
        out: Expr | None = None
        for i, extent in enumerate(self.extents):
            assert extent is not None  # a bound `g < N` gives every axis its extent
            c = Binary("<", self.coord(i), _mono_expr(extent, self.coord_type), BOOL)
            out = c if out is None else Binary("&&", out, c, BOOL)
        assert out is not None
        return out

    def _sub(self, e: Expr) -> Expr:
        if not _moves(e):
            return e
        hit = self.compared(e)
        if hit is not None:
            inside = self.bounds_expr()
            return inside if hit[0] else Unary("!", inside, BOOL)
        d = self.digits(e)
        if d is not None:
            v = self.value(*d)
            return v if v.type == e.type else Cast(v, e.type)
        return self.rebuilt(e)


def delinearize(lifted: Lifted) -> tuple[Lifted, Flat]:
    """The model with its flat thread index as coordinates along virtual launch dimensions, and
    how they relate to the original launch; `NotSplit` where the kernel does not take its index
    apart, or does it in a way this reading does not follow."""
    used = {x.name[-1] for s in lifted.body for x in _stmt_walk(s) if isinstance(x, Builtin)}
    if used != {"x"}:
        raise NotSplit("threads along more than x")
    reader = _Reader("x")
    for s in lifted.body:
        for e in _stmt_exprs(s):
            reader.scan(e)
    reader.settle()
    types = {x.type for s in lifted.body for x in _stmt_walk(s) if reader.digits(x) == (ONE, None)}
    reader.coord_type = LONG if LONG in types else INT
    body = tuple(reader.stmt(s) for s in lifted.body)
    axes = tuple(DIMS[: len(reader.chain)])
    flat = Flat(
        "x",
        tuple(reader.chain),
        tuple(reader.extents),
        axes,
        next(iter(reader.bounds), None),
        next(iter(reader.spelled)) if len(reader.spelled) == 1 else None,
    )
    if len(reader.spelled) > 1:
        raise NotSplit("the flat index spells different block sizes")
    return replace(lifted, body=body), flat


def _mono_expr(m: Mono, t: str) -> Expr:
    e: Expr | None = Const(m[0], t) if m[0] != 1 or not m[1] else None
    for name in m[1]:
        p = Cast(Param(name, INT), t) if t == LONG else Param(name, INT)
        e = p if e is None else Binary("*", e, p, t)
    assert e is not None
    return e


def _children(e: Expr) -> tuple[Expr, ...]:
    match e:
        case Load(index=i):
            return (i,)
        case Unary(a=a) | Cast(a=a):
            return (a,)
        case Binary(a=a, b=b):
            return (a, b)
        case Call(args=args):
            return args
        case Select(cond=c, a=a, b=b):
            return (c, a, b)
    return ()


def _walk(e: Expr):
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(_children(x))


def _moves(e: Expr) -> bool:
    """Whether `e` may depend on the thread (a built-in, or a loop's value)."""
    return any(isinstance(x, Builtin | LoopOut) for x in _walk(e))


def _loop_exprs(loop: Loop) -> list[Expr]:
    out: list[Expr] = [loop.cond, loop.guard]
    for c in loop.carried:
        out += [c.init, c.update]
    for s in loop.body:
        out += _stmt_exprs(s)
    return out


def _stmt_exprs(s: Stmt) -> list[Expr]:
    if isinstance(s, Store):
        return [s.index, s.value, s.guard]
    return _loop_exprs(s)


def _stmt_walk(s: Stmt):
    for e in _stmt_exprs(s):
        for x in _walk(e):
            yield x
            if isinstance(x, LoopOut):
                for y in _loop_exprs(x.loop):
                    yield from _walk(y)


def distinct_per_value(index: Expr, var: Expr) -> bool:
    """Whether `index` differs for every two values >= 0 of `var` (the sizes it names taken as
    positive): affine in `var` with a constant non-zero coefficient, or a sum of `var`'s digits
    (`(var % hi) / lo`, as a flat counter taken apart by `/` and `%`) each times a place value,
    the digits chained from the units to the top and each place value a multiple of the span of
    the ones below it (`((b * F + f) * H + h) * W + w` with `(b, h, w)` the digits of `var`: a
    batch norm's element of its channel)."""

    def is_var(e: Expr) -> bool:
        return e == var

    def atom(i: int) -> str:
        return f"optiml.digit{i}"

    digits: list[tuple[Mono, Mono | None]] = []

    def sub(e: Expr) -> Expr:
        try:
            d = digit_range(e, is_var, "counter")
        except NotSplit:
            raise _NotDistinct from None
        if d is not None:
            if d not in digits:
                digits.append(d)
            return Param(atom(digits.index(d)), INT)
        if isinstance(e, Binary):
            return replace(e, a=sub(e.a), b=sub(e.b))
        if isinstance(e, Cast):
            return replace(e, a=sub(e.a))
        return e

    try:
        f = affine(sub(index))
    except _NotDistinct:
        return False
    if f is None:
        return False
    names = {atom(i) for i in range(len(digits))}
    weights: dict[str, Mono] = {}
    for mono, coef in f.items():
        found = [a for a in mono if a in names]
        if len(found) > 1 or (found and mono.count(found[0]) > 1):
            return False
        if found:
            rest = tuple(sorted(a for a in mono if a != found[0]))
            # a place value of sizes alone (a thread's index or a loop's value may be 0)
            if found[0] in weights or any("." in a or "#" in a for a in rest):
                return False
            weights[found[0]] = (coef, rest)
    if len(weights) != len(digits) or not digits:
        return False
    # the units first, each digit's top the next one's unit, the last unbounded
    by_lo = {lo: i for i, (lo, _) in enumerate(digits)}
    order: list[int] = []
    lo: Mono | None = ONE
    while lo is not None and len(order) <= len(digits):
        if lo not in by_lo:
            return False
        order.append(by_lo[lo])
        lo = digits[order[-1]][1]
    if len(order) != len(digits):
        return False
    if len(order) == 1:
        return weights[atom(order[0])][0] != 0
    span: Mono = ONE  # the place value the next digit's weight must be a multiple of
    for i in order:
        lo, hi = digits[i]
        w = weights[atom(i)]
        if w[0] <= 0 or over(w, span) is None:
            return False
        if hi is not None:
            extent = over(hi, lo)
            if extent is None:
                return False
            span = times(w, extent)
    return True


class _NotDistinct(Exception):
    pass
