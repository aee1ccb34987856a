"""What a kernel's lifted model says about the buffers and the launch it needs: which pointers it
reads and writes, the largest element each access can reach (as a polynomial of the scalar
parameters, from the guards and loop conditions that bound the thread and loop indices), and the
thread indices its guards bound (the iteration domain a launch must cover).

Indices are the affine forms of `optiml.lift.families` (`g.x` the thread's global index along x,
`blockIdx.x`, loop variables `i#uid`); a bound `g.x < n` gives `g.x` at most `n - 1`, and an
access `row * K + i` with `row < M` and `i < K` reaches `(M - 1) * K + K - 1`, so its buffer
needs `M * K` elements. An index is followed through `?:` (each branch under its condition: a
clamp `r > n - 1 ? n - 1 : r` stays below n), `/` and `%` by a size (`(i / C) % T` is below T),
and `min`/`max`. What the model cannot bound becomes an unknown of the polynomial (`?blockIdx.z`
for a block index no guard limits, `?idx` for an index loaded from the buffer `idx`), resolved
by `optiml.cuda.unknowns`; an access that stays unbounded is counted and left to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optiml.lift.families import Affine, affine, global_indices, leaves
from optiml.lift.model import (
    Binary,
    Call,
    Cast,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Select,
    Unary,
    Var,
    children,
    loops_of,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)

Poly = dict[tuple[str, ...], int]  # monomial (sorted parameter names) -> coefficient


@dataclass
class Extents:
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    rmw: set[str] = field(default_factory=set)  # atomics: read-modify-write
    lengths: dict[str, list[Poly]] = field(default_factory=dict)  # one per bounded access
    unbounded: dict[str, int] = field(default_factory=dict)  # accesses with no bound
    domain: dict[str, Poly] = field(default_factory=dict)  # "g.x", "blockIdx.y" -> count
    spelled_block: dict[str, int] = field(default_factory=dict)  # `blockIdx.x * 16 + threadIdx.x`


def poly_add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
    return {m: c for m, c in out.items() if c}


def poly_mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def _is_index(atom: str) -> bool:
    return not atom.startswith("?") and ("#" in atom or "." in atom)


def unknown(atom: str) -> bool:
    """`?blockIdx.z` (the largest block index of a dimension no guard bounds: the launch's),
    `?g.x` (likewise a thread index), `?idx` (the largest value loaded from the buffer `idx`, an
    indirect index): what the model alone cannot bound, left for the caller to resolve."""
    return atom.startswith("?")


def _params_only(f: Affine) -> bool:
    return all(not _is_index(a) for m in f for a in m)


def poly_text(p: Poly) -> str:
    if not p:
        return "0"
    terms = []
    for m, c in sorted(p.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        body = " * ".join(m)
        if not m:
            terms.append(str(abs(c)))
        elif abs(c) == 1:
            terms.append(body)
        else:
            terms.append(f"{abs(c)} * {body}")
        terms[-1] = ("- " if c < 0 else "+ ") + terms[-1]
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def poly_value(p: Poly, env: dict[str, int]) -> int | None:
    total = 0
    for m, c in p.items():
        v = c
        for a in m:
            if a not in env:
                return None
            v *= env[a]
        total += v
    return total


_NEGATED = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "=="}


def _conjuncts(e: Expr) -> list[Expr]:
    """The conditions that all hold where `e` holds: `a && b`, and `!(a || b)` as `!a`, `!b`
    (an early `return` of `row >= rows || col >= cols`)."""
    if isinstance(e, Binary) and e.op == "&&":
        return _conjuncts(e.a) + _conjuncts(e.b)
    if isinstance(e, Unary) and e.op == "!":
        return _negated(e.a)
    return [e]


def _negated(e: Expr) -> list[Expr]:
    """The conjuncts of `!e` (none where it is a disjunction: nothing holds for sure)."""
    if isinstance(e, Binary) and e.op == "||":
        return _negated(e.a) + _negated(e.b)
    if isinstance(e, Binary) and e.op in _NEGATED:
        return [Binary(_NEGATED[e.op], e.a, e.b, e.type)]
    if isinstance(e, Unary) and e.op == "!":
        return _conjuncts(e.a)
    return []


class _Bounds:
    def __init__(
        self, lifted: Lifted, guards: list[Expr], sample: dict[str, int], widest: bool = False
    ):
        self.widest = widest
        self.upper: dict[str, Poly] = {}  # index atom -> its largest value
        self.forms: list[tuple[Affine, Poly]] = []  # a whole form -> its largest value
        self.sample = sample
        for loop in loops_of(lifted):
            self._loop(loop)
        conjuncts = [c for g in guards for c in _conjuncts(g)]
        for c in conjuncts:
            self._bound(c)
        for c in conjuncts:  # `j < ny && j != ny - 1`: j stops at ny - 2
            if isinstance(c, Binary) and c.op == "!=":
                for x, y in ((c.a, c.b), (c.b, c.a)):
                    fx, fy = affine(x), affine(y)
                    if fx is None or fy is None or not _params_only(fy):
                        continue
                    fx = global_indices(fx)
                    if len(fx) == 1 and list(fx.values()) == [1]:
                        ((atom,),) = fx
                        if self.upper.get(atom) == fy:
                            self.upper[atom] = poly_add(fy, {(): 1}, -1)

    def _set(self, atom: str, top: Poly) -> None:
        """The tighter of two bounds of one index (compared at the sample sizes)."""
        old = self.upper.get(atom)
        new_v, old_v = (poly_value(q, self.sample) or 0 for q in (top, old or {}))
        if old is None or (new_v > old_v if self.widest else new_v < old_v):
            self.upper[atom] = top

    def _loop(self, loop: Loop) -> None:
        own = {c.var.uid: c for c in loop.carried}
        for c in _conjuncts(loop.cond):
            if not isinstance(c, Binary):
                continue
            for var_side, other, op in ((c.a, c.b, c.op), (c.b, c.a, _flip(c.op))):
                v = var_side
                while isinstance(v, Cast):
                    v = v.a
                if isinstance(v, Var) and v.uid in own and op in ("<", "<="):
                    f = affine(other)
                    if f is not None:
                        f = global_indices(f)
                        if _params_only(f):
                            self._set(
                                f"{v.name}#{v.uid}", poly_add(f, {(): 1}, -1) if op == "<" else f
                            )

    def _bound(self, c: Expr) -> None:
        if not isinstance(c, Binary) or c.op not in ("<", "<=", ">", ">="):
            return
        a, b, op = c.a, c.b, c.op
        if op in (">", ">="):
            a, b, op = b, a, _flip(op)
        fa, fb = affine(a), affine(b)
        if fa is None or fb is None:
            return
        fa, fb = global_indices(fa), global_indices(fb)
        if not _params_only(fb) or _params_only(fa):
            return
        top = poly_add(fb, {(): 1}, -1) if op == "<" else fb
        # `i + 1 < n`: move the constant over
        const = fa.get((), 0)
        if const:
            fa = {m: k for m, k in fa.items() if m}
            top = poly_add(top, {(): const}, -1)
        if len(fa) == 1:
            ((m, k),) = fa.items()
            if len(m) == 1 and k == 1:
                self._set(m[0], top)
                return
        self.forms.append((fa, top))

    def reach(self, f: Affine) -> Poly | None:
        """The largest value of the form `f` over the bounded indices (None: unbounded)."""
        for form, top in self.forms:
            rest = poly_add(f, form, -1)
            if _params_only(rest) and all(c >= 0 for c in rest.values()):
                return poly_add(top, rest)
        out: Poly = {}
        for m, c in f.items():
            term: Poly = {(): c}
            for a in m:
                if not _is_index(a):
                    term = poly_mul(term, {(a,): 1})
                elif c < 0:
                    term = {}  # an index at its smallest, 0, for a term that lowers the reach
                    break
                elif a in self.upper:
                    term = poly_mul(term, self.upper[a])
                elif a.startswith(("blockIdx.", "g.")):
                    term = poly_mul(term, {(f"?{a}",): 1})
                else:
                    return None
            out = poly_add(out, term)
        return out


def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[op]


def extents(lifted: Lifted, sample: dict[str, int]) -> Extents:
    """What the model reads, writes and reaches; `sample`: distinct values of the scalar
    parameters, to tell the tighter of two bounds."""
    out = Extents()
    accesses: list[tuple[str, Expr, tuple]] = []
    all_guards: list[Expr] = []
    seen_loops: set[int] = set()

    def visit(e: Expr, conds: tuple) -> None:
        """Every load under `e`, with the conditions under which it is evaluated (a `?:`'s
        condition for its first branch, the negation for its second)."""
        match e:
            case Load(tensor=t, index=i):
                out.reads.add(t)
                accesses.append((t, i, conds))
                visit(i, conds)
            case Select(cond=c, a=a, b=b):
                visit(c, conds)
                visit(a, (*conds, c))
                visit(b, (*conds, Unary("!", c, "bool")))
            case LoopOut(loop=loop):
                in_loop(loop, conds)
            case _:
                for x in children(e):
                    visit(x, conds)

    def in_loop(loop: Loop, conds: tuple) -> None:
        if loop.uid in seen_loops:
            return
        seen_loops.add(loop.uid)
        inner = (*conds, loop.guard)
        all_guards.append(loop.guard)
        visit(loop.cond, inner)
        for c in loop.carried:
            visit(c.init, inner)
            visit(c.update, inner)
        for st in loop.body:
            statement(st, inner)

    def statement(st, conds: tuple) -> None:
        if isinstance(st, Loop):
            in_loop(st, conds)
            return
        inner = (*conds, st.guard)
        all_guards.append(st.guard)
        out.writes.add(st.tensor)
        if st.atomic and st.op != "exch":
            out.rmw.add(st.tensor)
        accesses.append((st.tensor, st.index, inner))
        visit(st.index, inner)
        visit(st.value, inner)

    for st in lifted.body:
        statement(st, ())
    for loop in loops_of(lifted):
        in_loop(loop, (loop.guard,))
    reach = _Reach(lifted, sample)
    done = set()
    for tensor, index, conds in accesses:
        if (tensor, index, conds) in done:
            continue
        done.add((tensor, index, conds))
        for f in leaves(index):
            _spelled_block(f, out.spelled_block)
        top = reach.top(index, conds)
        if top is None:
            out.unbounded[tensor] = out.unbounded.get(tensor, 0) + 1
        else:
            out.lengths.setdefault(tensor, []).append(poly_add(top, {(): 1}))
    # the domain: what every guard together bounds (the widest of what each store needs)
    for atom, top in _Bounds(lifted, all_guards, sample, widest=True).upper.items():
        if atom.startswith(("g.", "blockIdx.")):
            out.domain[atom] = poly_add(top, {(): 1})
    return out


class _Reach:
    """The largest value an index expression takes, as a polynomial of the parameters (and of
    unknowns, `?...`), under the conditions that hold where it is evaluated."""

    def __init__(self, lifted: Lifted, sample: dict[str, int]):
        self.lifted, self.sample = lifted, sample
        self.cache: dict[tuple, _Bounds] = {}

    def bounds(self, conds: tuple) -> _Bounds:
        if conds not in self.cache:
            self.cache[conds] = _Bounds(self.lifted, list(conds), self.sample)
        return self.cache[conds]

    def larger(self, a: Poly, b: Poly) -> Poly:
        va, vb = (poly_value(_known(q), self.sample) or 0 for q in (a, b))
        return a if va >= vb else b

    def top(self, e: Expr, conds: tuple) -> Poly | None:
        f = affine(e)
        if f is not None:
            return self.bounds(conds).reach(global_indices(f))
        match e:
            case Cast(a=a):
                return self.top(a, conds)
            case Select(cond=c, a=a, b=b):
                ta = self.top(a, (*conds, c))
                tb = self.top(b, (*conds, Unary("!", c, "bool")))
                return None if ta is None or tb is None else self.larger(ta, tb)
            case Call(fn=fn, args=args) if fn in ("max", "min") and args:
                tops = [self.top(x, conds) for x in args]
                known = [t for t in tops if t is not None]
                if fn == "max" and len(known) < len(tops) or not known:
                    return None
                best = known[0]
                for t in known[1:]:
                    if fn == "max":
                        best = self.larger(best, t)
                    elif self.larger(best, t) is best:
                        best = t
                return best
            case Load(tensor=t):
                return self._loaded(e, t, conds)
            case Binary(op=op, a=a, b=b):
                return self._binary(op, a, b, conds)
        return None

    def _binary(self, op: str, a: Expr, b: Expr, conds: tuple) -> Poly | None:
        d = _positive(b)
        if op in ("/", ">>", "%", "&") and d is None and op != "&":
            return None
        if op == ">>":
            if set(d) - {()}:
                return None
            op, d = "/", {(): 1 << d[()]}
        if op == "%":
            return poly_add(d, {(): 1}, -1)  # below the divisor
        if op == "&":
            m = affine(b)
            if m is not None and set(m) <= {()} and (m.get((), 0) + 1) & m.get((), 0) == 0:
                return m  # `i & 255`: at most 255
            return None
        ta = self.top(a, conds)
        if ta is None:
            return None
        if op == "/":
            return _divided(ta, d)
        if op == "+":
            tb = self.top(b, conds)
            return None if tb is None else poly_add(ta, tb)
        if op == "-":
            lb = _positive(b)  # a parameter or a constant: subtract it whole
            return None if lb is None else poly_add(ta, lb, -1)
        if op == "*":
            tb = self.top(b, conds)
            return None if tb is None else poly_mul(ta, tb)
        return None

    def _loaded(self, load: Load, tensor: str, conds: tuple) -> Poly | None:
        """A value loaded from memory used as an index: bounded where a condition compares it
        with the parameters (`ix >= V ? V - 1 : ix`), else the unknown `?tensor`."""
        best = None
        for g in conds:
            for c in _conjuncts(g):
                if not isinstance(c, Binary) or c.op not in ("<", "<=", ">", ">="):
                    continue
                x, y, op = (c.a, c.b, c.op) if c.a == load else (c.b, c.a, _flip(c.op))
                if x != load or op not in ("<", "<="):
                    continue
                f = affine(y)
                if f is not None and _params_only(f):
                    top = poly_add(f, {(): 1}, -1) if op == "<" else f
                    best = top if best is None else self.larger(top, best)
        return best if best is not None else {(f"?{tensor}",): 1}


def _known(p: Poly) -> Poly:
    """`p` with its unknowns at 1 (to compare two reaches at the sample sizes)."""
    out: Poly = {}
    for m, c in p.items():
        k = tuple(a for a in m if not unknown(a))
        out[k] = out.get(k, 0) + c
    return out


def _positive(e: Expr) -> Poly | None:
    """`e` as a polynomial of parameters with positive coefficients (a size or a constant)."""
    f = affine(e)
    if f is None or not _params_only(f) or not f or any(c <= 0 for c in f.values()):
        return None
    return f


def _divided(p: Poly, d: Poly) -> Poly | None:
    """The largest value of `x / d` (integer division) where `x` is at most `p`: `(n*C - 1) / C`
    is `n - 1`; None where `d` does not divide `p + 1` or `p` term by term."""
    if len(d) != 1:
        return None
    ((dm, dc),) = d.items()
    for shift in (1, 0):
        q = poly_add(p, {(): 1}) if shift else p
        out: Poly = {}
        for m, c in q.items():
            rest = list(m)
            for a in dm:
                if a not in rest:
                    break
                rest.remove(a)
            else:
                if c % dc == 0:
                    out[tuple(rest)] = c // dc
                    continue
            break
        else:
            return poly_add(out, {(): shift}, -1)
    return None


def _spelled_block(f: Affine, found: dict[str, int]) -> None:
    """`blockIdx.x * 16 + threadIdx.x` folded into g.x leaves no trace in the form; the raw
    index does: read it before folding."""
    for d in "xyz":
        k = f.get((f"blockIdx.{d}",))
        if k and k > 1 and f.get((f"threadIdx.{d}",)) == 1:
            found.setdefault(d, k)


def raw_spelled_block(lifted: Lifted) -> dict[str, int]:
    """The block size a kernel spells (`blockIdx.x * 16 + threadIdx.x`), by dimension."""
    found: dict[str, int] = {}
    for s in walk_stmts(lifted.body):
        for e in stmt_exprs(s):
            for x in walk_expr(e):
                if isinstance(x, Binary) and x.op == "+":
                    f = affine(x)
                    if f is not None:
                        _spelled_block(f, found)
    return found
