"""A permutation of any rank scheduled from the lifted model (optiml.lift): for a kernel whose
model copies elements to other places (the family `permutation`; or a map `out[perm(i)] =
f(in[i])` whose output and input trade their fastest axes),
with its index arithmetic as people write it (a 1-D launch whose index is taken apart with `/`
and `%`, or a 2-D/3-D launch), the thread's index is read as coordinates along axes:

- each division or remainder of the thread's global index g (`g / P`, `g % P`, `(g / P) % Q`,
  `(g % P) / Q`, any nesting) names a place value of g, and the place values along each launch
  dimension form a chain (each divides the next) whose quotients are the axes' extents; a
  dimension no division reads is one axis, its extent from the guard (`g < N`) or, for a
  dimension of one thread per block, from the grid;
- every index of the model is rewritten with each `g / P` and `g % P` as the sum of the
  coordinates of the axes between, so the index arithmetic is affine in the coordinates and costs
  a few multiply-adds, whatever the spelling.

From the coefficients of the coordinates: the output's fastest axis A (coefficient 1 in the
store's index) and the input's fastest axis B (coefficient 1 in its load's index). Where A and B
differ, a T x T tile of (A, B) goes through shared memory (T = 32 or 64, a padded row against
bank conflicts, several elements per thread): read with the lanes along B, written with the lanes
along A; the other axes go over the grid. Where they are the same axis (a permutation that keeps
the fastest axis), each thread moves V elements along it with 16-byte loads and stores where the
addresses allow (checked at run time), element by element otherwise. Every element is guarded by
the model's own guard and the axes' extents, so a thread computes exactly what the original
thread of the same coordinates computed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from optiml.expr import Expr as SizeExpr
from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import affine, describe, global_indices, text
from optiml.lift.model import (
    LONG,
    Binary,
    Builtin,
    Cast,
    Const,
    Expr,
    Load,
    LoopOut,
    Param,
    Store,
    Unary,
    Var,
    walk_expr,
)
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation
from optiml.search.catalog.column_reduce import _SIZES, _VECTOR
from optiml.search.catalog.warp_rows import _NoPlan

ROWS = 8  # a block is 32 lanes x ROWS rows of threads
TILES = ((32, 1.0), (64, 0.8))
VECTOR_THREADS = ((256, 1.0), (128, 0.8))
DIMS = "xyz"

# A place value: (integer coefficient, sorted names of the size atoms it multiplies).
Mono = tuple[int, tuple[str, ...]]
ONE: Mono = (1, ())


class PermuteTiles(Transformation):
    name = "permute_tiles"
    addresses = frozenset({"dram", "uncoalesced", "l2", "l1_shared", "latency"})
    description = (
        "a permutation of any rank from the lifted model: the two axes that trade contiguity "
        "tiled through padded shared memory, or 16-byte copies along a kept fastest axis"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted):
                return []
            family = describe(lifted, ctx.spec).family
            if family not in ("permutation", "map"):
                return []
            plan = Axes(lifted, ctx).plan()
            if family == "map" and not plan.tiled:
                # a map whose output and input trade their fastest axes is a permutation with
                # arithmetic on the way (`out[perm(i)] = f(in[i])`); any other map is not one
                return []
            bodies = [(p, w, _write(lifted, plan, p), grid) for p, w, grid in _choices(plan)]
            for _, _, _, grid in bodies:
                _evaluates(ctx, grid)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError, ZeroDivisionError):
            return []
        return _proposals(ctx, plan, bodies, _summary)


def _proposals(ctx: Context, plan: Plan, bodies, summary) -> list[Rewrite]:
    """One proposal per (params, prior, kernel body, grid)."""
    head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
    out = []
    for params, weight, body, grid in bodies:
        threads = params.get("threads", 32 * ROWS)
        variant = ctx.rewrite(head + body, launch=([grid], [str(threads)], "0"))
        out.append(Rewrite(params, summary(plan, params), variant, weight))
    return out


def _summary(plan: Plan, params: dict) -> str:
    if plan.tiled:
        axes = f"axes {plan.names[plan.a]} (out) and {plan.names[plan.b]} (in)"
        return (
            f"permutation from the lifted model: {params['tile']}x{params['tile']} tiles "
            f"of the {axes} through padded shared memory, {len(plan.axes) - 2} other axes "
            "over the grid"
        )
    return (
        f"permutation from the lifted model: the fastest axis {plan.names[plan.a]} "
        f"is kept; {params['vector']} elements per thread with 16-byte copies, "
        f"{params['threads']} threads per block"
    )


def _evaluates(ctx: Context, grid: str) -> None:
    """The grid expression evaluates, to a positive integer within the grid's limit, at every
    size of the spec."""
    expr = SizeExpr.parse(grid)
    for sizes in ctx.spec.sizes:
        case = ctx.spec.case(sizes)
        value = expr.evaluate(ctx.env(case))
        if not isinstance(value, int) or not 0 < value < 2**31:
            raise _NoPlan("a grid the spec cannot launch")


# -- place values --------------------------------------------------------------------------------


def _thread_free(e: Expr) -> bool:
    return not any(isinstance(x, Builtin | Var | LoopOut | Load) for x in walk_expr(e, False))


def _mono(e: Expr, atoms: dict[str, Expr]) -> Mono:
    """A thread-free integer expression as a coefficient times a product of size atoms (a
    parameter, or any other thread-free expression taken whole)."""
    if e.type not in ("int", "long") or not _thread_free(e):
        raise _NoPlan("a divisor that is not a size")
    match e:
        case Const(value=v):
            return (int(v), ())
        case Cast(a=a) if a.type in ("int", "long"):
            return _mono(a, atoms)
        case Binary(op="*", a=a, b=b):
            (ca, ma), (cb, mb) = _mono(a, atoms), _mono(b, atoms)
            return (ca * cb, tuple(sorted(ma + mb)))
        case Binary(op="<<", a=a, b=Const(value=s)):
            ca, ma = _mono(a, atoms)
            return (ca << int(s), ma)
        case Param(name=n):
            atoms[n] = e
            return (1, (n,))
    key = text(e)
    atoms[key] = e
    return (1, (key,))


def _times(p: Mono, q: Mono) -> Mono:
    return (p[0] * q[0], tuple(sorted(p[1] + q[1])))


def _over(p: Mono, q: Mono) -> Mono | None:
    """p / q where q divides p, else None."""
    if q[0] == 0 or p[0] % q[0]:
        return None
    rest = list(p[1])
    for a in q[1]:
        if a not in rest:
            return None
        rest.remove(a)
    return (p[0] // q[0], tuple(rest))


@dataclass(frozen=True)
class _Digits:
    """(g_d % hi) / lo: the digits of the thread's global index along d between two place
    values (hi None: all of them above lo)."""

    dim: str
    lo: Mono
    hi: Mono | None
    type: str = LONG


@dataclass
class Plan:
    axes: list[Var]  # one coordinate per axis, innermost first within each dimension
    names: list[str]  # how each axis is named in summaries
    extents: list[Expr]  # each axis's extent
    spec_extents: list[str]  # the same, in the spec's expression language
    stores: list[Store]  # the model's stores, indices in the coordinates
    a: int  # the output's fastest axis
    b: int  # the input's fastest axis (== a: kept)
    staged: list[Load]  # loads that move with A or B
    widths: dict[str, int]  # tensor -> bytes of an element (for 16-byte copies)

    @property
    def tiled(self) -> bool:
        return self.a != self.b


class Axes:
    """The model's thread index as coordinates along axes."""

    def __init__(self, lifted: Lifted, ctx: Context, scatter: bool = False):
        """`scatter`: the stores are atomic adds, at indices that may be loaded from memory."""
        self.scatter = scatter
        self.m = lifted
        self.ctx = ctx
        self.atoms: dict[str, Expr] = {}
        launch = ctx.spec.launch
        self.unit = {
            d for d, b in zip(DIMS, list(launch.block) + ["1"] * 3, strict=False) if b == "1"
        }
        self.grid = list(launch.grid) + ["1"] * (3 - len(launch.grid))

    # rewriting g / P and g % P as digits
    def sub(self, e: Expr):
        if isinstance(e, Var | LoopOut):
            raise _NoPlan("a loop")
        if isinstance(e, _Digits):
            return e
        moving = any(isinstance(x, Builtin) for x in walk_expr(e, False))
        if moving and e.type in ("int", "long"):
            if isinstance(e, Binary) and e.op in ("/", "%"):
                a = self.sub(e.a)
                if not isinstance(a, _Digits) or not _thread_free(e.b):
                    raise _NoPlan("a division of the thread index that is not by a size")
                m = _times(a.lo, _mono(e.b, self.atoms))
                if a.hi is not None and _over(a.hi, m) is None:
                    raise _NoPlan("a division that does not split the thread index's digits")
                if e.op == "/":
                    return Const(0, LONG) if a.hi == m else _Digits(a.dim, m, a.hi)
                return _Digits(a.dim, a.lo, m)
            f = affine(e)
            if f is not None:
                return self._form(global_indices(f))
            if isinstance(e, Builtin):
                raise _NoPlan(f"`{e.name}` where the thread's index is taken apart")
        if (
            isinstance(e, Load)
            and not self.scatter
            and not _thread_free(e.index)
            and any(isinstance(x, Load) for x in walk_expr(e.index, False))
        ):
            raise _NoPlan("an index loaded from memory")
        changes = {}
        for f in fields(e):
            v = getattr(e, f.name)
            if f.name == "args":
                changes[f.name] = tuple(self.sub(x) for x in v)
            elif f.name in ("index", "a", "b", "cond"):
                changes[f.name] = self.sub(v)
        return replace(e, **changes) if changes else e

    def _form(self, f) -> Expr:
        """An affine form of g.x, g.y, g.z (and the block index along a dimension of one thread
        per block) and sizes, with each g as all of its digits."""
        if len(f) == 1:
            ((monomial, c),) = f.items()
            if c == 1 and len(monomial) == 1 and self._is_g(monomial[0]):
                return _Digits(monomial[0][-1], ONE, None)
        total: Expr | None = None
        for monomial, c in sorted(f.items()):
            term: Expr = Const(c, LONG)
            for atom in monomial:
                if self._is_g(atom):
                    factor: Expr = _Digits(atom[-1], ONE, None)
                elif atom.startswith("threadIdx.") and atom[-1] in self.unit:
                    factor = Const(0, LONG)
                elif atom in self.m.scalars:
                    factor = Param(atom, self.m.scalars[atom])
                else:
                    raise _NoPlan(f"`{atom}` where the thread's index is taken apart")
                term = Binary("*", term, factor, LONG)
            total = term if total is None else Binary("+", total, term, LONG)
        return total if total is not None else Const(0, LONG)

    def _is_g(self, atom: str) -> bool:
        """g.d, or the block index along a dimension of one thread per block."""
        return atom in ("g.x", "g.y", "g.z") or (
            atom.startswith("blockIdx.") and atom[-1] in self.unit
        )

    def plan(self) -> Plan:
        body = list(self.m.body)
        if not body or not all(
            isinstance(s, Store) and (s.atomic and s.op == "add") == self.scatter for s in body
        ):
            raise _NoPlan(
                "a loop, or stores other than " + ("atomic adds" if self.scatter else "plain")
            )
        stores = [
            replace(s, index=self.sub(s.index), value=self.sub(s.value), guard=self.sub(s.guard))
            for s in body
        ]
        digits = [
            x
            for s in stores
            for e in (s.index, s.value, s.guard)
            for x in _walk(e)
            if isinstance(x, _Digits)
        ]
        axes, names, extents, spec_extents = [], [], [], []
        where: dict[tuple[str, Mono], int] = {}
        for d in DIMS:
            places = {ONE}
            for x in digits:
                if x.dim == d:
                    places.add(x.lo)
                    if x.hi is not None:
                        places.add(x.hi)
            if not any(x.dim == d for x in digits):
                continue
            chain = sorted(places, key=lambda p: (len(p[1]), p[0]))
            for p, q in zip(chain, chain[1:], strict=False):
                if _over(q, p) is None:
                    raise _NoPlan("place values that do not divide each other")
            bound = self._bound(d, stores)
            for i, p in enumerate(chain):
                where[(d, p)] = len(axes)
                axes.append(Var(f"optiml_{d}{i}", LONG))
                names.append(f"{d}{i}" if len(chain) > 1 else d)
                if i + 1 < len(chain):
                    extent = _over(chain[i + 1], p)
                else:
                    extent = _over(bound, p) if bound is not None else None
                    if extent is None and p == ONE and bound is None:
                        extent = self._grid_extent(d)
                if extent is None:
                    raise _NoPlan(f"no extent for an axis of {d}")
                extents.append(self._expr(extent))
                spec_extents.append(self._spec_text(extent))
            where[(d, None)] = len(axes)

        def coords(x: _Digits) -> Expr:
            lo = where[(x.dim, x.lo)]
            hi = where[(x.dim, x.hi)] if x.hi is not None else where[(x.dim, None)]
            total: Expr | None = None
            for i in range(lo, hi):
                place = next(p for (dd, p), j in where.items() if dd == x.dim and j == i)
                weight = _over(place, x.lo)
                term = axes[i] if weight == ONE else Binary("*", axes[i], self._expr(weight), LONG)
                total = term if total is None else Binary("+", total, term, LONG)
            return total if total is not None else Const(0, LONG)

        stores = [
            replace(
                s,
                index=_expand(s.index, coords),
                value=_expand(s.value, coords),
                guard=_expand(s.guard, coords),
            )
            for s in stores
        ]
        a = _unit_axis(stores[0].index, axes)
        if a is None or any(_unit_axis(s.index, axes) != a for s in stores):
            raise _NoPlan("no output axis of stride one")
        loads = [x for s in stores for x in walk_expr(s.value, False) if isinstance(x, Load)]
        moving = [x for x in loads if _mentions(x.index, axes)]
        if not moving:
            raise _NoPlan("no load that moves with the thread")
        units = [u for u in (_unit_axis(x.index, axes) for x in moving) if u is not None]
        b = a if units and all(u == a for u in units) else next((u for u in units if u != a), None)
        if b is None:
            raise _NoPlan("no input axis of stride one")
        staged = [x for x in dict.fromkeys(moving) if _mentions(x.index, [axes[a], axes[b]])]
        widths = {t.name: _SIZES.get(t.code, 0) for t in self.m.tensors.values()}
        return Plan(axes, names, extents, spec_extents, stores, a, b, staged, widths)

    def _bound(self, d: str, stores: list[Store]) -> Mono | None:
        """N of a guard `g_d < N` that every store has, if any."""
        found = None
        for s in stores:
            here = None
            for c in _conjuncts(s.guard):
                if (
                    isinstance(c, Binary)
                    and c.op == "<"
                    and c.a == _Digits(d, ONE, None)
                    and _thread_free(c.b)
                ):
                    here = _mono(c.b, self.atoms)
            if here is None or (found is not None and here != found):
                return None
            found = here
        return found

    def _grid_extent(self, d: str) -> Mono | None:
        """The grid along a dimension of one thread per block, where it names a size."""
        if d not in self.unit:
            return None
        name = self.grid[DIMS.index(d)].strip()
        if name.isdigit():
            return (int(name), ())
        if name in self.m.scalars:
            self.atoms[name] = Param(name, self.m.scalars[name])
            return (1, (name,))
        return None

    def _expr(self, m: Mono) -> Expr:
        e: Expr | None = Const(m[0], LONG) if m[0] != 1 or not m[1] else None
        for a in m[1]:
            factor = Cast(self.atoms[a], LONG)
            e = factor if e is None else Binary("*", e, factor, LONG)
        assert e is not None
        return e

    def _spec_text(self, m: Mono) -> str:
        parts = [str(m[0])] if m[0] != 1 or not m[1] else []
        parts += [a if isinstance(self.atoms[a], Param) else f"({a})" for a in m[1]]
        return " * ".join(parts)


def _walk(e):
    yield e
    if isinstance(e, _Digits):
        return
    for f in fields(e):
        v = getattr(e, f.name)
        if f.name == "args":
            for x in v:
                yield from _walk(x)
        elif f.name in ("index", "a", "b", "cond"):
            yield from _walk(v)


def _expand(e, coords):
    if isinstance(e, _Digits):
        return coords(e)
    changes = {}
    for f in fields(e):
        v = getattr(e, f.name)
        if f.name == "args":
            changes[f.name] = tuple(_expand(x, coords) for x in v)
        elif f.name in ("index", "a", "b", "cond"):
            changes[f.name] = _expand(v, coords)
    return replace(e, **changes) if changes else e


def _conjuncts(g: Expr, negated: bool = False):
    """The conditions a guard's `&&` (or a negated `||`) requires, each `a < b` where it is a
    bound (`a >= b` negated, `b > a`)."""
    if isinstance(g, Unary) and g.op == "!":
        yield from _conjuncts(g.a, not negated)
    elif isinstance(g, Binary) and g.op == ("||" if negated else "&&"):
        yield from _conjuncts(g.a, negated)
        yield from _conjuncts(g.b, negated)
    elif isinstance(g, Binary) and g.op in ("<", ">", "<=", ">="):
        if (g.op, negated) in ((">=", True), ("<", False)):
            yield Binary("<", g.a, g.b, "bool")
        elif (g.op, negated) in (("<=", True), (">", False)):
            yield Binary("<", g.b, g.a, "bool")
    elif not negated:
        yield g


def _atom(v: Var) -> str:
    return f"{v.name}#{v.uid}"


def _mentions(e: Expr, axes: list[Var]) -> bool:
    uids = {v.uid for v in axes}
    return any(isinstance(x, Var) and x.uid in uids for x in walk_expr(e, False))


def _sized(e):
    """`e` with each thread-free integer term that is not affine (`C / NH`) as one size atom."""
    if e.type in ("int", "long") and _thread_free(e) and affine(e) is None:
        return Param(text(e), e.type)
    changes = {}
    for f in fields(e):
        v = getattr(e, f.name)
        if f.name == "args":
            changes[f.name] = tuple(_sized(x) for x in v)
        elif f.name in ("index", "a", "b", "cond"):
            changes[f.name] = _sized(v)
    return replace(e, **changes) if changes else e


def _moving_terms(index: Expr) -> Expr:
    """The terms of a sum that read no memory: a row number loaded from memory (times the row's
    length) is where a row starts, not how the index moves along it."""
    if isinstance(index, Cast) and index.type in ("int", "long"):
        return _moving_terms(index.a)
    if isinstance(index, Binary) and index.op == "+":
        loads = [any(isinstance(x, Load) for x in walk_expr(t, False)) for t in (index.a, index.b)]
        if loads == [True, False]:
            return _moving_terms(index.b)
        if loads == [False, True]:
            return _moving_terms(index.a)
        return Binary("+", _moving_terms(index.a), _moving_terms(index.b), index.type)
    return index


def _unit_axis(index: Expr, axes: list[Var]) -> int | None:
    """The axis whose coordinate moves the index by exactly one element (and appears in no other
    term), if the index is affine in the coordinates."""
    f = affine(_sized(_moving_terms(index)))
    if f is None:
        return None
    for i, v in enumerate(axes):
        at = _atom(v)
        if f.get((at,)) == 1 and all(at not in m for m in f if m != (at,)):
            return i
    return None


# -- the kernels ---------------------------------------------------------------------------------


def _choices(plan: Plan) -> list[tuple[dict, float, str]]:
    others = " * ".join(
        f"({plan.spec_extents[i]})" for i in range(len(plan.axes)) if i not in (plan.a, plan.b)
    )
    out = []
    if plan.tiled:
        smem_per = sum(C_SIZE[x.type] for x in plan.staged)
        for tile, weight in TILES:
            if tile * (tile + 1) * smem_per > STATIC_SMEM:
                continue
            grid = f"cdiv({plan.spec_extents[plan.a]}, {tile}) * cdiv({plan.spec_extents[plan.b]}, {tile})"
            out.append(
                (
                    {"tile": tile, "threads": 32 * ROWS},
                    weight,
                    grid + (f" * {others}" if others else ""),
                )
            )
        return out
    return _kept_choices(plan, _vector_width(plan), VECTOR_THREADS)


def _kept_choices(plan: Plan, vector: int, threads_weights) -> list[tuple[dict, float, str]]:
    others = " * ".join(f"({plan.spec_extents[i]})" for i in range(len(plan.axes)) if i != plan.a)
    out = []
    for threads, weight in threads_weights:
        per = f"cdiv({plan.spec_extents[plan.a]}, {vector})" + (f" * {others}" if others else "")
        out.append(({"vector": vector, "threads": threads}, weight, f"cdiv({per}, {threads})"))
    return out


C_SIZE = {"float": 4, "double": 8, "half": 2, "bf16": 2, "int": 4, "long": 8, "bool": 1}


def _vector_width(plan: Plan) -> int:
    """Elements per thread along the kept axis: one 16-byte access of the widest tensor moved."""
    sizes = [plan.widths.get(s.tensor, 0) for s in plan.stores]
    sizes += [plan.widths.get(x.tensor, 0) for x in plan.staged]
    if not sizes or 0 in sizes:
        return 1
    return 16 // max(sizes)


class _Emitter(CEmitter):
    """Staged loads from the registers or shared memory they were read into."""

    def __init__(self, names, staged: dict[Load, str] | None = None):
        super().__init__(names)
        self.staged = staged or {}

    def expr(self, e) -> str:
        if isinstance(e, Load) and e in self.staged:
            return self.from_memory(self.staged[e], e.type)
        return super().expr(e)


def _write(lifted: Lifted, plan: Plan, params: dict) -> str:
    return (
        _tiled(lifted, plan, params["tile"])
        if plan.tiled
        else _kept(lifted, plan, params["vector"])
    )


def _store_line(lifted: Lifted, c: CEmitter, s: Store) -> str:
    t = lifted.tensors[s.tensor]
    if s.atomic:
        value = c.cast(c.expr(s.value), s.value.type, t.dtype)
        return f"atomicAdd(&{s.tensor}[{c.expr(s.index)}], {value});"
    return f"{s.tensor}[{c.expr(s.index)}] = {c.cast(c.expr(s.value), s.value.type, t.dtype)};"


def _decompose(
    plan: Plan,
    names: dict[int, str],
    order: list[int],
    source: str,
    ctype: str,
    lines: list[str],
    indent: str,
    first: str | None = None,
) -> None:
    """Coordinates of `order`'s axes from a linear index, the last one taking what is left;
    `first`: the extent to use for the first axis (its count of chunks)."""
    c = CEmitter(names)
    lines.append(f"{indent}{ctype} optiml_q = {source};")
    for n, i in enumerate(order):
        name = names[plan.axes[i].uid]
        if n + 1 < len(order):
            extent = first if n == 0 and first is not None else c.expr(plan.extents[i])
            e = f"({ctype})({extent})"
            lines.append(f"{indent}{name} = optiml_q % {e}; optiml_q /= {e};")
        else:
            lines.append(f"{indent}{name} = optiml_q;")


def _names(plan: Plan) -> dict[int, str]:
    return {v.uid: v.name for v in plan.axes}


def _tiled(lifted: Lifted, plan: Plan, tile: int) -> str:
    names = _names(plan)
    c = CEmitter(names)
    a, b = plan.axes[plan.a], plan.axes[plan.b]
    others = [i for i in range(len(plan.axes)) if i not in (plan.a, plan.b)]
    lines = ["{"]
    staged = {}
    for n, x in enumerate(plan.staged):
        lines.append(f"    __shared__ {C_TYPES[x.type]} optiml_s{n}[{tile}][{tile + 1}];")
        staged[x] = n
    ea, eb = c.expr(plan.extents[plan.a]), c.expr(plan.extents[plan.b])
    lines += [
        "    const int optiml_lane = threadIdx.x & 31, optiml_r = threadIdx.x >> 5;",
        f"    const long long optiml_na = ({ea} + {tile - 1}) / {tile};",
        f"    const long long optiml_nb = ({eb} + {tile - 1}) / {tile};",
        "    " + " ".join(f"long long {names[v.uid]};" for v in plan.axes),
        "    unsigned optiml_blk = blockIdx.x;",
        f"    const long long optiml_a0 = (long long)(optiml_blk % (unsigned)optiml_na) * {tile};",
        "    optiml_blk /= (unsigned)optiml_na;",
        f"    const long long optiml_b0 = (long long)(optiml_blk % (unsigned)optiml_nb) * {tile};",
        "    optiml_blk /= (unsigned)optiml_nb;",
    ]
    if others:
        _decompose(plan, names, others, "optiml_blk", "unsigned", lines, "    ")
    guard = [f"{names[a.uid]} < {ea}", f"{names[b.uid]} < {eb}"]
    # read: lanes along the input's fastest axis
    lines += [
        f"    for (int optiml_i = optiml_r; optiml_i < {tile}; optiml_i += {ROWS}) {{",
        f"        for (int optiml_j = optiml_lane; optiml_j < {tile}; optiml_j += 32) {{",
        f"            {names[a.uid]} = optiml_a0 + optiml_i; {names[b.uid]} = optiml_b0 + optiml_j;",
        f"            if (!({' && '.join(guard)})) continue;",
    ]
    for x, n in staged.items():
        g = next(s.guard for s in plan.stores if x in list(walk_expr(s.value, False)))
        lines.append(
            f"            if ({c.expr(g)}) optiml_s{n}[optiml_i][optiml_j] = {x.tensor}[{c.expr(x.index)}];"
        )
    lines += ["        }", "    }", "    __syncthreads();"]
    # write: lanes along the output's fastest axis
    reg = _Emitter(names, {x: f"optiml_s{n}[optiml_j][optiml_i]" for x, n in staged.items()})
    lines += [
        f"    for (int optiml_i = optiml_r; optiml_i < {tile}; optiml_i += {ROWS}) {{",
        f"        for (int optiml_j = optiml_lane; optiml_j < {tile}; optiml_j += 32) {{",
        f"            {names[a.uid]} = optiml_a0 + optiml_j; {names[b.uid]} = optiml_b0 + optiml_i;",
        f"            if (!({' && '.join(guard)})) continue;",
    ]
    for s in plan.stores:
        lines.append(f"            if ({reg.expr(s.guard)}) {_store_line(lifted, reg, s)}")
    lines += ["        }", "    }", "}"]
    return "\n".join(lines)


def _kept(lifted: Lifted, plan: Plan, v: int) -> str:
    names = _names(plan)
    c = CEmitter(names)
    a = plan.axes[plan.a]
    ca = names[a.uid]
    others = [i for i in range(len(plan.axes)) if i != plan.a]
    ea = c.expr(plan.extents[plan.a])
    outer = others[-1] if others else plan.a
    lines = [
        "{",
        "    " + " ".join(f"long long {names[x.uid]};" for x in plan.axes),
        f"    const long long optiml_na = ({ea} + {v - 1}) / {v};",
        "    const unsigned long long optiml_t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "    if (optiml_t < 0xffffffffull) {",
    ]
    order = [plan.a] + others
    # the thread's coordinates, in 32-bit arithmetic where its index allows
    small = []
    _decompose(plan, names, order, "(unsigned)optiml_t", "unsigned", small, "        ", "optiml_na")
    big = []
    _decompose(plan, names, order, "optiml_t", "unsigned long long", big, "        ", "optiml_na")
    lines += small + ["    } else {"] + big + ["    }"]
    lines.append(f"    {ca} *= {v};")
    if outer != plan.a:
        lines.append(
            f"    if ({names[plan.axes[outer].uid]} >= {c.expr(plan.extents[outer])}) return;"
        )
    else:
        lines.append(f"    if ({ca} >= {ea}) return;")
    if v > 1:
        vec = [x for x in plan.staged if _unit_axis(x.index, plan.axes) == plan.a]
        checks = [f"{ea} % {v} == 0"]
        base = CEmitter(names)
        for s in plan.stores:
            checks.append(f"({base.expr(s.index)}) % {v} == 0")
            checks.append(f"((unsigned long long){s.tensor}) % {v * plan.widths[s.tensor]} == 0")
        for x in vec:
            checks.append(f"({base.expr(x.index)}) % {v} == 0")
            checks.append(f"((unsigned long long){x.tensor}) % {v * plan.widths[x.tensor]} == 0")
        lines.append(f"    bool optiml_whole = {' && '.join(checks)};")
        lines.append("    const long long optiml_first = " + ca + ";")
        for guard in dict.fromkeys(s.guard for s in plan.stores):
            lines.append("#pragma unroll")
            lines.append(
                f"    for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) {{ {ca} = optiml_first + optiml_j; "
                f"optiml_whole = optiml_whole && ({c.expr(guard)}); }}"
            )
        lines.append(f"    {ca} = optiml_first;")
        lines.append("    if (optiml_whole) {")
        loaded = {}
        for n, x in enumerate(vec):
            vt = _VECTOR[v * plan.widths[x.tensor]]
            lines.append(f"        {C_TYPES[x.type]} optiml_v{n}[{v}];")
            lines.append(
                f"        *reinterpret_cast<{vt}*>(optiml_v{n}) = "
                f"*reinterpret_cast<const {vt}*>({x.tensor} + {c.expr(x.index)});"
            )
            loaded[x] = f"optiml_v{n}[optiml_j]"
        per = _Emitter({**names, a.uid: f"({ca} + optiml_j)"}, loaded)
        for n, s in enumerate(plan.stores):
            t = lifted.tensors[s.tensor]
            vt = _VECTOR[v * plan.widths[s.tensor]]
            lines.append(f"        {C_TYPES[t.dtype]} optiml_o{n}[{v}];")
            lines.append("#pragma unroll")
            lines.append(
                f"        for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) "
                f"optiml_o{n}[optiml_j] = {per.cast(per.expr(s.value), s.value.type, t.dtype)};"
            )
            if s.atomic:
                # one atomic per vector (sm_90's float2/float4 atomicAdd, atomic per element)
                kind = f"float{v}"
                parts = ", ".join(f"optiml_o{n}[{j}]" for j in range(v))
                lines.append(
                    f"        atomicAdd(reinterpret_cast<{kind}*>({s.tensor} + {c.expr(s.index)}), "
                    f"make_{kind}({parts}));"
                )
            else:
                lines.append(
                    f"        *reinterpret_cast<{vt}*>({s.tensor} + {c.expr(s.index)}) = "
                    f"*reinterpret_cast<const {vt}*>(optiml_o{n});"
                )
        lines += ["        return;", "    }"]
    lines.append(f"    for (int optiml_j = 0; optiml_j < {v}; ++optiml_j, ++{ca}) {{")
    lines.append(f"        if ({ca} >= {ea}) break;")
    for s in plan.stores:
        lines.append(f"        if ({c.expr(s.guard)}) {_store_line(lifted, c, s)}")
    lines += ["    }", "}"]
    return "\n".join(lines)
