"""Reading a lifted model: its accesses as affine forms of the thread and loop indices, its
reductions, the iteration domain, and the family of computation it belongs to.

Families (what the optimizer's schedules are organized by): map, reduction (whole array, along
rows or columns), row normalization, contraction (matrix-vector or matrix-matrix, with the
layout of each operand), permutation, gather, scatter, histogram, stencil, scan. The family is
decided from what the model computes (where each element comes from and goes to), never from
how the code is spelled; the evidence is kept with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from optiml.expr import ExprError
from optiml.lift.model import (
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    Binary,
    Builtin,
    Call,
    Carried,
    Cast,
    Const,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Param,
    Select,
    Store,
    Unary,
    Unlifted,
    Var,
    children,
    loops_of,
    stmt_exprs,
    walk_expr,
    walk_stmts,
)
from optiml.lift.run import ModelError, Runner

MAX_PROBE_THREADS = 1 << 22

# An affine form: monomial (sorted atom names) -> integer coefficient; () is the constant term.
Affine = dict[tuple[str, ...], int]


def _var_name(v: Var) -> str:
    return f"{v.name}#{v.uid}"


def add_affine(a: Affine, b: Affine) -> Affine:
    """a + b, without the monomials that cancel."""
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c}


def affine(e: Expr) -> Affine | None:
    """`e` as a sum of integer multiples of products of atoms (built-ins, scalar parameters,
    loop variables); None where it is not one (a division, a load, a floating value)."""
    if isinstance(e, _Form):
        return dict(e.f)
    match e:
        case Const(value=v, type=t) if t in ("int", "long", "bool"):
            return {(): int(v)} if v else {}
        case Builtin(name=n):
            return {(n,): 1}
        case Param(name=n, type=t) if t in ("int", "long"):
            return {(n,): 1}
        case Var() as v if v.type in ("int", "long"):
            return {(_var_name(v),): 1}
        case Cast(a=a, type=t) if t in ("int", "long") and a.type in ("int", "long", "bool"):
            return affine(a)
        case Unary(op="-", a=a):
            f = affine(a)
            return None if f is None else {m: -c for m, c in f.items()}
        case Binary(op=op, a=a, b=b) if op in ("+", "-", "*", "<<"):
            fa, fb = affine(a), affine(b)
            if fa is None or fb is None:
                return None
            if op == "<<":
                if set(fb) - {()}:
                    return None
                fb = {(): 1 << fb.get((), 0)}
                op = "*"
            if op == "*":
                return _times(fa, fb)
            sign = 1 if op == "+" else -1
            out = dict(fa)
            for m, c in fb.items():
                out[m] = out.get(m, 0) + sign * c
            return {m: c for m, c in out.items() if c}
    return None


def global_indices(f: Affine) -> Affine:
    """`blockIdx.d * blockDim.d + threadIdx.d` (times any factor) folded into the atom `g.d`,
    the thread's global index along d, and so is `B * blockIdx.d + threadIdx.d` with a constant
    B (a kernel that spells its block size); `gridDim.d * blockDim.d` into `stride.d`."""
    f = dict(f)
    for d in "xyz":
        bi, bd, ti = f"blockIdx.{d}", f"blockDim.{d}", f"threadIdx.{d}"
        for m in list(f):
            if m not in f:
                continue
            if bi in m and bd in m:
                rest = tuple(a for a in m if a not in (bi, bd))
                local = tuple(sorted(rest + (ti,)))
                c = f[m]
                if f.get(local) == c:
                    del f[m], f[local]
                    g = tuple(sorted(rest + (f"g.{d}",)))
                    f[g] = f.get(g, 0) + c
            elif bi in m and bd not in m:
                rest = tuple(a for a in m if a != bi)
                local = tuple(sorted(rest + (ti,)))
                c = f.get(local)
                if c and f[m] % c == 0 and f[m] // c > 1:
                    del f[m], f[local]
                    g = tuple(sorted(rest + (f"g.{d}",)))
                    f[g] = f.get(g, 0) + c
            gd = f"gridDim.{d}"
            if m in f and gd in m and bd in m:
                rest = tuple(a for a in m if a not in (gd, bd))
                s = tuple(sorted(rest + (f"stride.{d}",)))
                f[s] = f.get(s, 0) + f.pop(m)
    return f


def leaves(e: Expr, limit: int = 16) -> list[Affine]:
    """The affine forms an index can take through clamps (`i < 0 ? 0 : i`, `min(i, n - 1)`):
    each branch's form, combined through + - *; [] where a leaf is not affine."""
    match e:
        case Select(a=a, b=b):
            return (leaves(a, limit) + leaves(b, limit))[:limit]
        case Call(fn=fn, args=args) if fn in ("max", "min"):
            out: list[Affine] = []
            for x in args:
                out += leaves(x, limit)
            return out[:limit]
        case Cast(a=a, type=t) if t in ("int", "long"):
            return leaves(a, limit)
        case Binary(op=op, a=a, b=b) if op in ("+", "-", "*"):
            la, lb = leaves(a, limit), leaves(b, limit)
            out = []
            for fa in la:
                for fb in lb:
                    f = affine(
                        Binary(op, _Form(tuple(fa.items())), _Form(tuple(fb.items())), "long")
                    )
                    if f is not None:
                        out.append(f)
            return out[:limit]
    f = affine(e)
    return [] if f is None else [f]


@dataclass(frozen=True)
class _Form:
    """An affine form standing in an expression (for combining the leaves of clamps)."""

    f: tuple
    type: str = "long"


def principal(index: Expr, like: Affine | None) -> Affine | None:
    """The form of a (possibly clamped) index that moves with the thread: the leaf with the same
    thread-dependent terms as `like` where there is one, else the one with the most of them."""
    forms = [global_indices(f) for f in leaves(index)]
    if not forms:
        return None

    def moving(f: Affine) -> frozenset:
        return frozenset(
            m
            for m in f
            if any(a.startswith(("g.", "threadIdx", "blockIdx")) or "#" in a for a in m)
        )

    if like is not None:
        for f in forms:
            if moving(f) == moving(like):
                return f
    return max(forms, key=lambda f: len(moving(f)))


def affine_text(f: Affine) -> str:
    if not f:
        return "0"
    terms = []
    for m, c in sorted(f.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        atoms = [a.split("#")[0] for a in m]
        if not atoms:
            terms.append(str(c))
        elif c == 1:
            terms.append("*".join(atoms))
        else:
            terms.append(f"{c}*" + "*".join(atoms))
    return " + ".join(terms).replace("+ -", "- ")


def text(e: Expr, depth: int = 0) -> str:
    """`e` written back in C-like notation (loop results as `name@line`)."""
    if depth > 40:
        return "…"
    d = depth + 1
    match e:
        case Const(value=v):
            return str(v).lower() if isinstance(v, bool) else repr(v)
        case Builtin(name=n) | Param(name=n):
            return n
        case Var(name=n):
            return n
        case LoopOut(loop=loop, var=v):
            return f"{v.name}@{loop.line}"
        case Load(tensor=t, index=i):
            return f"{t}[{text(i, d)}]"
        case Unary(op=op, a=a):
            return f"{op}{text(a, d)}"
        case Binary(op=op, a=a, b=b):
            return f"({text(a, d)} {op} {text(b, d)})"
        case Call(fn=fn, args=args):
            return f"{fn}({', '.join(text(a, d) for a in args)})"
        case Select(cond=c, a=a, b=b):
            return f"({text(c, d)} ? {text(a, d)} : {text(b, d)})"
        case Cast(a=a, type=t):
            return f"({t}){text(a, d)}"
    return "?"


@dataclass
class AccessInfo:
    tensor: str
    kind: str  # "read" | "write" | "atomic <op>"
    index: str  # the index as text
    pattern: str  # "affine: ..." | "indirect" | "non-affine"
    line: int = 0


@dataclass
class ReductionInfo:
    op: str  # sum | max | min | prod | recurrence
    var: str
    line: int
    strides: dict[str, str]  # tensor -> the reduction index's stride in it ("1", "cols", ...)


@dataclass
class Description:
    kernel: str
    family: str
    lifted: bool
    evidence: list[str] = field(default_factory=list)
    domain: list[str] = field(default_factory=list)
    accesses: list[AccessInfo] = field(default_factory=list)
    reductions: list[ReductionInfo] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)  # tensor -> its value, as text
    not_understood: list[str] = field(default_factory=list)


def _loads(e: Expr) -> list[Load]:
    return [x for x in walk_expr(e) if isinstance(x, Load)]


def _has_load(e: Expr) -> bool:
    return any(isinstance(x, Load) for x in walk_expr(e, into_loops=False))


def _pattern(index: Expr) -> tuple[str, Affine | None]:
    if _has_load(index):
        return "indirect", None
    f = affine(index)
    if f is None:
        return "non-affine", None
    f = global_indices(f)
    return "affine: " + affine_text(f), f


def induction_steps(loop: Loop, down: bool = False) -> dict[int, Expr]:
    """The loop's induction variables (updated by adding a value that does not change in the
    loop) and their steps; `down`: those updated by subtracting such a value, their steps
    negated."""
    own = {c.var.uid for c in loop.carried}
    out: dict[int, Expr] = {}
    for c in loop.carried:
        u = c.update
        while isinstance(u, Cast):
            u = u.a
        if not (isinstance(u, Binary) and u.op == ("-" if down else "+")):
            continue
        if c.var.type not in ("int", "long"):
            continue
        for x, step in ((u.a, u.b),) if down else ((u.a, u.b), (u.b, u.a)):
            if x == c.var and not any(isinstance(y, Var) and y.uid in own for y in walk_expr(step)):
                out[c.var.uid] = Unary("-", step, step.type) if down else step
    return out


_IDENTITIES = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}


def counted_reductions(
    loop: Loop, ops: tuple[str, ...] = ("sum", "max", "min"), step: int = 1
) -> tuple[Carried, list[tuple[Carried, str, Expr]]]:
    """A loop counting by one (`step` -1: counting down by one) and what else it carries, each a
    sum, max or min (or another of `ops`) of a value that depends on no other carried value, in a
    32- or 64-bit type: (its counter, [(carried, op, operand)]); a `ValueError` that says what is
    not so. What a schedule that splits the loop's range among threads and combines the partial
    results needs."""
    steps = induction_steps(loop, down=step == -1)
    counters = [c for c in loop.carried if c.var.uid in steps]
    if len(counters) != 1 or affine(steps[counters[0].var.uid]) != {(): step}:
        raise ValueError("not a loop counting by one" if step == 1 else "not a loop counting down")
    k = counters[0]
    own = {c.var.uid for c in loop.carried}
    found = []
    for c in loop.carried:
        if c is k:
            continue
        op, operand = reduction_of(c.var, c.update)
        if op not in ops or operand is None:
            raise ValueError(f"`{c.var.name}` is not a {', '.join(ops)}")
        if c.var.type not in (FLOAT, DOUBLE, INT, LONG):
            raise ValueError("a 16-bit accumulator")
        if any(isinstance(x, Var) and x.uid in own - {k.var.uid} for x in walk_expr(operand)):
            raise ValueError("a value that depends on another carried value")
        if any(isinstance(x, Var) and x.uid in own for x in walk_expr(c.init)):
            raise ValueError("an initial value inside the loop")
        found.append((c, op, operand))
    return k, found


def reduction_of(var: Var, update: Expr) -> tuple[str, Expr | None]:
    """How a loop's carried value is updated: (op, operand) for `v = v op e` (also through
    `fmaxf`, `fma`, a comparison and select, an `if` that skips some iterations, and nested
    loops that carry it on), ("recurrence", None) otherwise."""

    def mentions(e: Expr) -> bool:
        return any(isinstance(y, Var) and y.uid == var.uid for y in walk_expr(e))

    u = update
    while isinstance(u, Cast):
        u = u.a
    if isinstance(u, LoopOut):
        inner = next((c for c in u.loop.carried if c.var.uid == u.var.uid), None)
        if inner is not None and inner.init == var:
            return reduction_of(inner.var, inner.update)
    if isinstance(u, Select):
        # an `if` that skips some iterations: the operand is the identity where it skips
        for taken, skipped, cond in ((u.a, u.b, u.cond), (u.b, u.a, Unary("!", u.cond, "bool"))):
            if skipped == var and not mentions(u.cond):
                op, operand = reduction_of(var, taken)
                if operand is None or op not in _IDENTITIES:
                    return op, operand
                ident = Const(_IDENTITIES[op], var.type)
                return op, Select(cond, operand, ident, operand.type)
        if isinstance(u.cond, Binary) and u.cond.op in ("<", ">", "<=", ">="):
            a, b = u.cond.a, u.cond.b
            if {a, b} == {u.a, u.b} and var in (u.a, u.b):
                other = u.b if u.a == var else u.a
                op = "max" if (u.cond.op in (">", ">=")) == (u.a == a) else "min"
                return (op, other) if not mentions(other) else ("recurrence", None)
    if isinstance(u, Binary) and u.op in ("+", "-", "*"):
        if u.a == var and not mentions(u.b):
            operand = Unary("-", u.b, u.b.type) if u.op == "-" else u.b
            return {"+": "sum", "-": "sum", "*": "prod"}[u.op], operand
        if u.b == var and u.op != "-" and not mentions(u.a):
            return {"+": "sum", "*": "prod"}[u.op], u.a
    if isinstance(u, Call) and u.fn in ("max", "min") and len(u.args) == 2:
        a, b = u.args
        if a == var and not mentions(b):
            return u.fn, b
        if b == var and not mentions(a):
            return u.fn, a
    if (
        isinstance(u, Call)
        and u.fn == "fma"
        and u.args[2] == var
        and not (mentions(u.args[0]) or mentions(u.args[1]))
    ):
        return "sum", Binary("*", u.args[0], u.args[1], u.type)
    return "recurrence", None


def _reduction_op(var: Var, update: Expr) -> str:
    return reduction_of(var, update)[0]


def describe(lifted: Lifted | Unlifted, spec=None) -> Description:
    """What the model computes. With the kernel's `spec`, index arithmetic the affine forms do not
    follow (divisions, remainders) is probed by running the indices at the smallest size."""
    if isinstance(lifted, Unlifted):
        return Description(
            kernel=lifted.kernel,
            family="opaque",
            lifted=False,
            not_understood=[f"line {line}: {why}" for line, why in lifted.reasons],
        )
    d = Description(kernel=lifted.kernel, family="other", lifted=True)
    stores = [s for s in walk_stmts(lifted.body) if isinstance(s, Store)]
    loops = loops_of(lifted)
    inductions: dict[int, Expr] = {}
    for loop in loops:
        inductions.update(induction_steps(loop))

    # accesses
    seen: set[tuple[str, str, str]] = set()
    for s in stores:
        pat, _ = _pattern(s.index)
        kind = "write" if not s.atomic else f"atomic {s.op}"
        d.accesses.append(AccessInfo(s.tensor, kind, text(s.index), pat, s.line))
        for e in stmt_exprs(s):
            for ld in _loads(e):
                key = (ld.tensor, "read", text(ld.index))
                if key not in seen:
                    seen.add(key)
                    d.accesses.append(AccessInfo(ld.tensor, "read", key[2], _pattern(ld.index)[0]))
        if s.guard != Const(True, "bool"):
            g = text(s.guard)
            if g not in d.guards:
                d.guards.append(g)
        d.outputs.setdefault(s.tensor, text(s.value))

    for loop in (s for s in walk_stmts(lifted.body) if isinstance(s, Loop)):
        if loop.guard != Const(True, "bool") and text(loop.guard) not in d.guards:
            d.guards.append(text(loop.guard))

    # reductions: the carried values of loops that are not induction variables
    for loop in loops:
        for c in loop.carried:
            if c.var.uid in inductions:
                continue
            op = _reduction_op(c.var, c.update)
            strides: dict[str, str] = {}
            k = next(
                (x for x in loop.carried if x.var.uid in inductions),
                None,
            )
            if k is not None:
                for ld in _loads(c.update):
                    f = affine(ld.index)
                    if f is None:
                        continue
                    coef = {
                        tuple(a for a in m if a != _var_name(k.var)): cc
                        for m, cc in f.items()
                        if _var_name(k.var) in m
                    }
                    step = affine(inductions[k.var.uid]) or {}
                    strides[ld.tensor] = affine_text(_times(coef, step)) if coef else "0"
            d.reductions.append(ReductionInfo(op, c.var.name, loop.line, strides))

    d.reductions.sort(key=lambda r: r.line)

    # the domain: global thread indices and induction variables of loops that store
    atoms: set[str] = set()
    for s in stores:
        _, f = _pattern(s.index)
        if f:
            for m in f:
                atoms.update(a.split("#")[0] for a in m)
    d.domain = sorted(a for a in atoms if a.startswith(("g.", "threadIdx", "blockIdx")))
    storing_loops = [s for s in walk_stmts(lifted.body) if isinstance(s, Loop)]
    for loop in storing_loops:
        for uid in induction_steps(loop):
            v = next(c.var for c in loop.carried if c.var.uid == uid)
            d.domain.append(f"{v.name} (loop at line {loop.line})")

    d.family, d.evidence = _family(lifted, d, stores, loops, inductions, spec)
    return d


def _times(a: Affine, b: Affine) -> Affine:
    out: Affine = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return {m: c for m, c in out.items() if c}


def _family(
    lifted: Lifted,
    d: Description,
    stores: list[Store],
    loops: list[Loop],
    inductions: dict[int, Expr],
    spec=None,
) -> tuple[str, list[str]]:
    atomics = [s for s in stores if s.atomic]
    if atomics:
        s = atomics[0]
        if _has_load(s.index):
            if isinstance(s.value, Const):
                return "histogram", [
                    f"line {s.line}: atomic {s.op} of a constant into {s.tensor} at an index loaded from memory"
                ]
            return "scatter", [
                f"line {s.line}: atomic {s.op} into {s.tensor} at an index loaded from memory"
            ]
        f = affine(s.index)
        if f is not None and not any(m for m in f if m):
            return "reduction", [
                f"line {s.line}: every thread adds into {s.tensor}[{text(s.index)}] (atomic {s.op}): the whole array"
            ]
        return "reduction", [f"line {s.line}: atomic {s.op} into {s.tensor} at {text(s.index)}"]

    # a loop that stores values that depend on what it carries from one element to the next
    for loop in (s for s in walk_stmts(lifted.body) if isinstance(s, Loop)):
        carried = {c.var.uid for c in loop.carried if c.var.uid not in inductions}
        extra = [
            c
            for c in loop.carried
            if c.var.uid in carried
            and any(
                isinstance(x, Var) and x.uid in carried
                for st in loop.body
                if isinstance(st, Store)
                for x in walk_expr(st.value)
            )
        ]
        if extra:
            return "scan", [
                f"line {loop.line}: the loop stores while carrying `{extra[0].var.name}` from one element to the next"
            ]

    reds = [r for r in d.reductions if r.op != "recurrence"]
    if d.reductions and not any(_walks_data(loop, inductions) for loop in loops):
        outs = sorted({s.tensor for s in stores})
        lines = sorted({r.line for r in d.reductions})
        return "map", [
            f"{', '.join(outs)}: each element from its own index, through a loop of arithmetic (line {', '.join(map(str, lines))}) that reads no data as it goes"
        ]
    if d.reductions:
        # a sum of products of two different tensors, both walked by the reduction: a contraction
        for loop in loops:
            for c in loop.carried:
                if c.var.uid in inductions or _reduction_op(c.var, c.update) != "sum":
                    continue
                tensors = sorted({ld.tensor for ld in _loads(c.update)})
                if len(tensors) >= 2 and _is_product(c.update, c.var):
                    k = next((x.var for x in loop.carried if x.var.uid in inductions), None)
                    red = next(
                        r for r in d.reductions if r.var == c.var.name and r.line == loop.line
                    )
                    layout = ", ".join(
                        f"{t}: reduction stride {red.strides.get(t, '?')}" for t in tensors
                    )
                    window = _window(c.update, k)
                    if window:
                        return "stencil (convolution)", [
                            f"line {loop.line}: `{c.var.name}` sums {window} over a window that moves with the thread ({layout})"
                        ]
                    sides = [
                        t
                        for t in tensors
                        if any(
                            _thread_dependent(ld.index, k)
                            for ld in _loads(c.update)
                            if ld.tensor == t
                        )
                    ]
                    kind = "matrix-matrix" if len(sides) >= 2 else "matrix-vector"
                    return f"contraction ({kind})", [
                        f"line {loop.line}: `{c.var.name}` sums products of {' and '.join(tensors)} ({layout})"
                    ]
        # a reduction's result used element by element with the data it reduced: a normalization
        reduced_tensors = {
            ld.tensor
            for loop in loops
            for c in loop.carried
            if c.var.uid not in inductions
            for ld in _loads(c.update)
        }
        for s in stores:
            uses_reduction = any(
                isinstance(x, LoopOut) for x in walk_expr(s.value, into_loops=False)
            )
            elementwise = [
                ld
                for ld in _loads(s.value)
                if ld.tensor in reduced_tensors and not _inside_loop(s.value, ld)
            ]
            if uses_reduction and elementwise:
                ops = "/".join(sorted({r.op for r in d.reductions}))
                return "row normalization", [
                    f"line {s.line}: {s.tensor} combines each element of {elementwise[0].tensor} with reductions ({ops}) over it"
                ]
        if reds:
            r = reds[0]
            axis = (
                ", ".join(f"{t} stride {st}" for t, st in r.strides.items()) or "strides not affine"
            )
            return "reduction", [f"line {r.line}: a {r.op} over `{r.var}` ({axis})"]
        return "other", [
            f"line {d.reductions[0].line}: a loop carries `{d.reductions[0].var}` through a recurrence"
        ]

    # no reduction: a gather, stencil, permutation or map
    for s in stores:
        for ld in _loads(s.value) + _loads(s.index):
            if _has_load(ld.index):
                return "gather", [
                    f"line {s.line}: {s.tensor} takes {ld.tensor}[{text(ld.index)}], an index loaded from memory"
                ]

    for s in stores:
        _, fs = _pattern(s.index)
        by_tensor: dict[str, set[str]] = {}
        for ld in _loads(s.value):
            f = principal(ld.index, fs)
            if f is not None:
                by_tensor.setdefault(ld.tensor, set()).add(repr(sorted(f.items())))
        for t, idx in by_tensor.items():
            if len(idx) >= 3:
                return "stencil", [
                    f"line {s.line}: {s.tensor} reads {len(idx)} neighbouring elements of {t}"
                ]
    for s in stores:
        _, fs = _pattern(s.index)
        loads = _loads(s.value)
        if fs is None or not loads:
            continue
        for ld in loads:
            _, fl = _pattern(ld.index)
            if fl is None or fl == fs:
                continue
            if (
                _unit_atoms(fs)
                and _unit_atoms(fl)
                and set(_unit_atoms(fs)) == set(_unit_atoms(fl))
                and _unit_atoms(fs) != _unit_atoms(fl)
            ):
                return "permutation", [
                    f"line {s.line}: {s.tensor}[{affine_text(fs)}] = {ld.tensor}[{affine_text(fl)}]: the same indices, another order of strides"
                ]
    moved = _moves_data(lifted, stores, spec)
    if moved:
        return "permutation", [moved]
    outs = sorted({s.tensor for s in stores})
    inout = [t for t in outs if lifted.tensors[t].role == "inout"]
    if len(inout) >= 2:
        return "multi-buffer update", [
            f"{', '.join(inout)} updated in place, element by element (an optimizer step's shape)"
        ]
    return "map", [f"{', '.join(outs)}: each element from elements at its own index (or broadcast)"]


def _walks_data(loop: Loop, inductions: dict[int, Expr]) -> bool:
    """Whether a loop's carried values read memory at an index that moves with the loop."""
    own = {c.var.uid for c in loop.carried}
    for c in loop.carried:
        if c.var.uid in inductions:
            continue
        for ld in _loads(c.update):
            if any(isinstance(x, Var) and x.uid in own for x in walk_expr(ld.index)):
                return True
    return False


def _thread_dependent(index: Expr, k: Var | None) -> bool:
    """Whether an index moves with the thread (a built-in, or a loop variable other than k)."""
    for x in walk_expr(index):
        if isinstance(x, Builtin) and not x.name.startswith(("blockDim", "gridDim")):
            return True
        if isinstance(x, Var) and (k is None or x.uid != k.uid):
            return True
    return False


def _window(update: Expr, k: Var | None) -> str:
    """A load whose index moves with both the thread and the reduction by the same stride
    (`in[(y + ky) * W + x + kx]`): the operand of a convolution, named; "" if none."""
    if k is None:
        return ""
    for ld in _loads(update):
        f = affine(ld.index)
        if f is None:
            continue
        f = global_indices(f)
        with_k = {
            tuple(a for a in m if not a.startswith(k.name + "#")): c
            for m, c in f.items()
            if any(a.startswith(k.name + "#") for a in m)
        }
        others = {
            tuple(a for a in m if not (a.startswith("g.") or "#" in a)): c
            for m, c in f.items()
            if any(a.startswith("g.") or ("#" in a and not a.startswith(k.name + "#")) for a in m)
        }
        if any(others.get(m) == c for m, c in with_k.items()):
            return ld.tensor
    return ""


def _moves_data(lifted: Lifted, stores: list[Store], spec) -> str:
    """Where every store copies one loaded element (through a cast at most) and, run at the
    spec's smallest size, each store reads distinct elements and not at the index it writes:
    data moved to other places (a permutation however its indices are computed); "" otherwise."""
    if spec is None or not stores or any(s not in lifted.body for s in stores):
        return ""
    for s in stores:
        v = s.value
        while isinstance(v, Cast):
            v = v.a
        if s.atomic or not isinstance(v, Load):
            return ""
    sizes = min(spec.sizes, key=lambda z: math.prod(z.values()))
    try:
        case = spec.case(sizes)
        scalars = {**sizes, **case.scalars}
        zeros = {t: np.zeros(case.lengths[t], dtype=np.float32) for t in lifted.tensors}
        runner = Runner(lifted, zeros, scalars, case.grid, case.block)
        if case.grid[0] * case.grid[1] * case.grid[2] * math.prod(case.block) > MAX_PROBE_THREADS:
            return ""
        pairs = runner.indices([s for s in stores])
    except (ModelError, KeyError, ValueError, ExprError):
        return ""
    moved = 0
    for written, read in pairs:
        if len(read) == 0 or len(np.unique(read)) != len(read):
            return ""
        moved += int(np.any(written != read))
    if not moved:
        return ""
    names = ", ".join(sorted({s.tensor for s in stores}))
    return f"line {stores[0].line}: {names} copy elements of their input to other places, each once (probed at {case.label})"


def _unit_atoms(f: Affine) -> tuple[str, ...]:
    """The index atom that moves by 1 in the address (the contiguous one) first, then the rest."""
    unit = [m[0] for m, c in f.items() if len(m) == 1 and c == 1]
    other = sorted(a for m in f for a in m if m and len(m) > 1)
    atoms = {a for m in f for a in m if a.startswith(("g.", "threadIdx", "blockIdx")) or "#" in a}
    return tuple(a for a in unit if a in atoms) + tuple(
        sorted(a for a in atoms if a not in unit and a in other)
    )


def _is_product(update: Expr, var: Var) -> bool:
    op, term = reduction_of(var, update)
    # through casts, and the select of an `if` that skips some terms (the identity elsewhere)
    while isinstance(term, Cast | Select):
        term = term.a
    return op == "sum" and isinstance(term, Binary) and term.op == "*"


def _inside_loop(value: Expr, ld: Load) -> bool:
    """Whether `ld` is reached only through a loop's result (a reduction's operand)."""
    return all(not (x is ld or x == ld) for x in walk_expr(value, into_loops=False))


def canon(e, counter: int) -> str:
    """`e` as text with the loop counter `counter` written `K` and integer widths ignored: the
    same element read by two loops has the same text."""
    match e:
        case Var(uid=u):
            return "K" if u == counter else f"v{u}"
        case LoopOut(var=Var(uid=u)):
            return f"v{u}"
        case Const(value=v):
            return repr(v)
        case Param(name=n) | Builtin(name=n):
            return n
        case Cast(a=a, type=t):
            return canon(a, counter) if t in ("int", "long") else f"({t}){canon(a, counter)}"
        case Unary(op=op, a=a):
            return f"({op}{canon(a, counter)})"
        case Binary(op=op, a=a, b=b):
            return f"({canon(a, counter)}{op}{canon(b, counter)})"
        case Load(tensor=t, index=i):
            return f"{t}[{canon(i, counter)}]"
        case Call(fn=fn, args=args):
            return f"{fn}({','.join(canon(a, counter) for a in args)})"
        case Select(cond=c, a=a, b=b):
            return f"({canon(c, counter)}?{canon(a, counter)}:{canon(b, counter)})"
    raise ValueError(f"cannot compare {type(e).__name__}")


def sure_loads(e):
    """The loads `e` makes whatever its values: not under one side of a selection, nor the right
    side of `&&` or `||` (a guarded read, which may be out of bounds where it is not made)."""
    match e:
        case Load():
            yield e
            yield from sure_loads(e.index)
        case Select(cond=c):
            yield from sure_loads(c)
        case Binary(op=op, a=a) if op in ("&&", "||"):
            yield from sure_loads(a)
        case LoopOut():
            return
        case _:
            for x in children(e):
                yield from sure_loads(x)
