"""What a kernel's lifted model says about the buffers and the launch it needs: which pointers it
reads and writes, the largest element each access can reach (as a polynomial of the scalar
parameters, from the guards and loop conditions that bound the thread and loop indices), and the
thread indices its guards bound (the iteration domain a launch must cover).

Indices are the affine forms of `optiml.lift.families` (`g.x` the thread's global index along x,
`blockIdx.x`, loop variables `i#uid`); a bound `g.x < n` gives `g.x` at most `n - 1`, and an
access `row * K + i` with `row < M` and `i < K` reaches `(M - 1) * K + K - 1`, so its buffer
needs `M * K` elements. Accesses the model cannot bound (an indirect index, a thread index no
guard limits) are counted and left to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optiml.lift.families import Affine, affine, global_indices, leaves
from optiml.lift.model import (
    Binary,
    Cast,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Store,
    Var,
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


def _add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
    return {m: c for m, c in out.items() if c}


def _mul(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def _is_index(atom: str) -> bool:
    return "#" in atom or "." in atom


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


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "&&":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


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
        for g in guards:
            for c in _conjuncts(g):
                self._bound(c)

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
                            self._set(f"{v.name}#{v.uid}", _add(f, {(): 1}, -1) if op == "<" else f)

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
        top = _add(fb, {(): 1}, -1) if op == "<" else fb
        # `i + 1 < n`: move the constant over
        const = fa.get((), 0)
        if const:
            fa = {m: k for m, k in fa.items() if m}
            top = _add(top, {(): const}, -1)
        if len(fa) == 1:
            ((m, k),) = fa.items()
            if len(m) == 1 and k == 1:
                self._set(m[0], top)
                return
        self.forms.append((fa, top))

    def reach(self, f: Affine) -> Poly | None:
        """The largest value of the form `f` over the bounded indices (None: unbounded)."""
        for form, top in self.forms:
            rest = _add(f, form, -1)
            if _params_only(rest) and all(c >= 0 for c in rest.values()):
                return _add(top, rest)
        out: Poly = {}
        for m, c in f.items():
            term: Poly = {(): c}
            for a in m:
                if not _is_index(a):
                    term = _mul(term, {(a,): 1})
                elif c < 0:
                    term = {}  # an index at its smallest, 0, for a term that lowers the reach
                    break
                elif a in self.upper:
                    term = _mul(term, self.upper[a])
                else:
                    return None
            out = _add(out, term)
        return out


def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}[op]


def extents(lifted: Lifted, sample: dict[str, int]) -> Extents:
    """What the model reads, writes and reaches; `sample`: distinct values of the scalar
    parameters, to tell the tighter of two bounds."""
    out = Extents()
    accesses: list[tuple[str, Expr, tuple]] = []
    all_guards: list[Expr] = []
    for s in walk_stmts(lifted.body):
        guards = [s.guard]
        found = []
        if isinstance(s, Store):
            out.writes.add(s.tensor)
            if s.atomic and s.op != "exch":
                out.rmw.add(s.tensor)
            found.append((s.tensor, s.index))
        for e in stmt_exprs(s):
            for x in walk_expr(e):
                if isinstance(x, Load):
                    out.reads.add(x.tensor)
                    found.append((x.tensor, x.index))
                elif isinstance(x, LoopOut):
                    guards.append(x.loop.guard)
        all_guards += guards
        accesses += [(t, i, tuple(guards)) for t, i in found]
    for loop in loops_of(lifted):
        all_guards.append(loop.guard)
        for c in loop.carried:
            for x in walk_expr(c.init):
                if isinstance(x, Load):
                    out.reads.add(x.tensor)
                    accesses.append((x.tensor, x.index, (loop.guard,)))
    seen = set()
    cache: dict[tuple, _Bounds] = {}
    for tensor, index, guards in accesses:
        if (tensor, index, guards) in seen:
            continue
        seen.add((tensor, index, guards))
        if guards not in cache:
            cache[guards] = _Bounds(lifted, list(guards), sample)
        bounds = cache[guards]
        forms = [global_indices(f) for f in leaves(index)]
        if not forms:
            out.unbounded[tensor] = out.unbounded.get(tensor, 0) + 1
            continue
        for f in forms:
            _spelled_block(f, out.spelled_block)
            top = bounds.reach(f)
            if top is None:
                out.unbounded[tensor] = out.unbounded.get(tensor, 0) + 1
            else:
                out.lengths.setdefault(tensor, []).append(_add(top, {(): 1}))
    # the domain: what every guard together bounds (the widest of what each store needs)
    for atom, top in _Bounds(lifted, all_guards, sample, widest=True).upper.items():
        if atom.startswith(("g.", "blockIdx.")):
            out.domain[atom] = _add(top, {(): 1})
    return out


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
