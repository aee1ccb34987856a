"""An implicit GEMM read off the lifted model: a thread per output element of
`epilogue(seed + sum over k of A * B)` where the factors are any expressions (a load under a guard,
a select, a value computed by a loop of its own), read by what they depend on rather than by
affine strides.

`implicit(lifted)` takes the kernel's flat thread index apart into the output's coordinates (the
digits of `g = blockIdx.x * blockDim.x + threadIdx.x` under `/` and `%`, as many as the kernel
has: a batch, channels, and one to three spatial axes for a convolution) and the reduction's
loops apart into K's coordinates (the counters of a nest of loops that carries the sum through,
each counter itself or its digits where the kernel takes it apart), and rewrites every expression
with a `Var` per coordinate. The factors then say which output coordinates they read:

- those only A reads are M (a convolution's output channel, A its weights),
- those only B reads are N (the batch and the spatial axes, B the input as im2col reads it),
- those both read (a group) or neither reads are the batch of independent GEMMs.

A is the factor that does not read the output's unit-stride coordinate, so that the tiles' N runs
along the stores. A guard on the term (`if (ih >= 0 && ih < H) acc += x[..] * w[..]`) goes to the
factor whose coordinates it reads (`(guard ? x[..] : 0) * w[..]`); the other factor is then read
where the original did not read it, and the schedule must prove its loads in bounds
(`Implicit.unguarded`). `NotImplicit` says why a model is not of this form.

The reading decides nothing about sizes: whether tiles pay (M or N too small, a depthwise
convolution with no M at all) is the schedule's call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from optiml.lift.coords import ONE, Mono, digit_range, mono_affine, over, size_mono
from optiml.lift.coords import NotSplit as _NotSplit
from optiml.lift.families import (
    Affine,
    add_affine,
    affine,
    global_indices,
    induction_steps,
    reduction_of,
)
from optiml.lift.model import (
    BOOL,
    FALSE,
    FLOAT,
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Carried,
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
    Store,
    Unary,
    Var,
    children,
    loops_of,
    walk_expr,
    walk_stmts,
)


class NotImplicit(Exception):
    """The model is not a sum of products this reading follows; the message says why."""


@dataclass(frozen=True)
class Coord:
    """One coordinate: `var` takes the values start, start + 1, ..., start + extent - 1 (affine
    forms of the kernel's integer parameters)."""

    var: Var
    extent: Affine
    start: Affine = field(default_factory=dict)


@dataclass(frozen=True)
class Launched:
    """How the original kernel indexes one launch dimension: "thread" (its global index, under
    the bound `total`) or "block" (blockIdx alone, `total` blocks), and a block size it spells."""

    kind: str
    total: Mono
    block: int | None


@dataclass(frozen=True)
class Implicit:
    """out[coords] = epilogue(seed + sum over k of a * b) for every combination of the output's
    coordinates, k running over K's coordinates with the fastest one first (the original's order of
    summation: k = sum of (coord - start) times the product of the faster coordinates' extents).

    `m`, `n`, `batch`: the output's coordinates by side, each fastest first (in the output's
    place-value order); `a` reads m's and batch's (and k's), `b` n's and batch's. `store`: the
    store with its index and value over the coordinates, the value reading the sum as
    `LoopOut(loop, acc)`. `unguarded`: the loads of each factor that the original read only under
    a condition this reading moved to the other factor."""

    m: tuple[Coord, ...]
    n: tuple[Coord, ...]
    batch: tuple[Coord, ...]
    k: tuple[Coord, ...]
    a: Expr
    b: Expr
    acc: Carried
    loop: Loop  # the outermost loop of the reduction (its LoopOut of acc is the sum)
    seed: Expr | None  # what the sum starts from where it is not 0
    store: Store
    total: Mono  # the thread guard's bound: the original launch runs at least this many threads
    block: int | None  # a block size the kernel spells (`256 * blockIdx.x + threadIdx.x`)
    unguarded: dict[str, tuple[Load, ...]]  # "a" | "b" -> loads to prove in bounds
    launch: dict[str, Launched] = field(default_factory=dict)  # by dimension

    @property
    def coords(self) -> tuple[Coord, ...]:
        return self.m + self.n + self.batch + self.k

    @property
    def a_tensors(self) -> list[str]:
        return sorted({x.tensor for x in walk_expr(self.a) if isinstance(x, Load)})

    @property
    def b_tensors(self) -> list[str]:
        return sorted({x.tensor for x in walk_expr(self.b) if isinstance(x, Load)})


def implicit(lifted: Lifted, launch: dict[str, Mono] | None = None) -> Implicit:
    """The model as an implicit GEMM, or `NotImplicit` with the reason. The kernel may launch in
    1 to 3 dimensions (`launch`: the grid's extent along y and z, for a kernel that takes a
    dimension's blocks as a coordinate)."""
    threads, out_coords, store = output_coords(lifted, "xyz", launch)
    outer, acc_var = reduction_read(store)
    chain, acc, term, _ = reduction_chain(outer, acc_var)
    if acc.var.type != FLOAT:
        raise NotImplicit("the sum is not accumulated in float")
    k_coords, (term,) = reduction_coords(chain, (term,))

    seed_expr = acc.init
    term = threads.sub(term)
    seed_expr = threads.sub(seed_expr)
    if any(isinstance(x, Builtin) for e in (term, seed_expr, store.value) for x in walk_expr(e)):
        raise NotImplicit("the thread index outside its digits")

    # the term: a product, perhaps under a guard
    guard, product = _guarded(term)
    product = _strip(product)
    if not (isinstance(product, Binary) and product.op == "*" and product.type == FLOAT):
        raise NotImplicit("the sum's terms are not products in float")
    f1, f2 = product.a, product.b
    if f1.type != FLOAT or f2.type != FLOAT:
        raise NotImplicit("a factor is not a float")

    out_uids = {c.var.uid: c for c in out_coords}
    k_uids = {c.var.uid for c in k_coords} | {_counter(lp)[0].uid for lp in chain}
    d1, d2 = _uses(f1, out_uids), _uses(f2, out_uids)
    if not (_uses(f1, k_uids) and _uses(f2, k_uids)):
        raise NotImplicit("a factor does not move with k")
    unit = _unit_stride(store.index, out_coords)
    if unit in d1 and unit not in d2:
        f1, f2, d1, d2 = f2, f1, d2, d1
    a, b, da, db = f1, f2, d1, d2
    m_ids, n_ids = da - db, db - da
    if unit not in n_ids:
        raise NotImplicit("the output's unit-stride coordinate is read by both factors or neither")
    if not m_ids:
        raise NotImplicit(
            "no output coordinate that only one factor reads (a depthwise or per-channel "
            "product: each element of one factor serves a single output row)"
        )

    # the guard's conditions go to the factor whose coordinates they read
    a_conds, b_conds = [], []
    for c in _conjuncts(guard):
        used = _uses(c, out_uids)
        if used & m_ids and used & n_ids:
            raise NotImplicit("a condition on the term that reads both factors' coordinates")
        if used & m_ids:
            a_conds.append(c)
        elif used & n_ids:
            b_conds.append(c)
        else:
            a_conds.append(c)
            b_conds.append(c)
    unguarded = {}
    if b_conds and b_conds != a_conds:
        unguarded["a"] = _exposed(a)
    if a_conds and a_conds != b_conds:
        unguarded["b"] = _exposed(b)
    a, b = _under(a_conds, a), _under(b_conds, b)

    for e in (a, b):
        if any(isinstance(x, Load) and x.tensor == store.tensor for x in walk_expr(e)):
            raise NotImplicit("a factor reads the output")
    for e in (store.value, seed_expr):
        for ld in (x for x in walk_expr(e) if isinstance(x, Load)):
            if ld.tensor == store.tensor and ld.index != store.index:
                raise NotImplicit("the epilogue reads another element of the output")
    # every loop is the sum's or computes a factor's value (emitted where the factor is)
    known = {loop.uid for loop in chain}
    for e in (a, b, seed_expr, store.value):
        for x in walk_expr(e):
            if isinstance(x, LoopOut) and x.loop.uid not in known:
                known.add(x.loop.uid)
                if x.loop.body:
                    raise NotImplicit("a loop inside a factor stores")
    if len(known) != len({lp.uid for lp in loops_of(lifted)}):
        raise NotImplicit("a loop that is neither the sum's nor a factor's")
    for x in walk_expr(store.value, into_loops=False):
        if isinstance(x, LoopOut) and (x.loop.uid, x.var.uid) != (outer.uid, acc_var.uid):
            raise NotImplicit("the epilogue reads another loop value")

    def side(ids: set[int]) -> tuple[Coord, ...]:
        return tuple(c for c in out_coords if c.var.uid in ids)

    rest = {c.var.uid for c in out_coords} - m_ids - n_ids
    seed = None if _zero(seed_expr) else seed_expr
    return Implicit(
        side(m_ids),
        side(n_ids),
        side(rest),
        tuple(k_coords),
        a,
        b,
        acc,
        outer,
        seed,
        store,
        threads.total,
        threads.block,
        unguarded,
        threads.launched(),
    )


@dataclass
class Threads:
    """The launch dimensions a reading takes apart, x first: each one's digits (`_Digits`), and
    how the kernel indexes it (`kinds`: "thread", the global index; "block", blockIdx alone)."""

    dims: list[_Digits]
    kinds: dict[str, str]

    def sub(self, e: Expr) -> Expr:
        for d in self.dims:
            e = d.sub(e)
        return e

    @property
    def total(self) -> Mono | None:
        """The bound on x's flat index."""
        return self.dims[0].total if self.dims[0].base.dim == "x" else None

    @property
    def block(self) -> int | None:
        return self.dims[0].base.block if self.dims[0].base.dim == "x" else None

    def launched(self) -> dict[str, Launched]:
        """How the original launch covers the output, by dimension."""
        out = {}
        for d in self.dims:
            assert d.total is not None
            out[d.base.dim] = Launched(self.kinds[d.base.dim], d.total, d.base.block)
        return out


def output_coords(
    lifted: Lifted, dims: str = "x", launch: dict[str, Mono] | None = None
) -> tuple[Threads, list[Coord], Store]:
    """A thread per output element: the digits of the thread's index along each of `dims` (the
    output's coordinates, fastest first, x's before y's before z's) and the one store, over
    them. A dimension whose blocks alone are a coordinate (`blockIdx.z` as the batch, one thread
    each) takes its extent from `launch` (the grid's extent along it) where no guard bounds it."""
    stores = [s for s in walk_stmts(lifted.body) if isinstance(s, Store)]
    if len(stores) != 1 or stores[0] not in lifted.body:
        raise NotImplicit("not one store per thread outside loops")
    store = stores[0]
    if store.atomic or store.op != "=":
        raise NotImplicit("an atomic store")
    if any(isinstance(s, Loop) for s in lifted.body):
        raise NotImplicit("a loop that stores")

    exprs = (store.index, store.value, store.guard)
    used = {x.name for e in exprs for x in walk_expr(e) if isinstance(x, Builtin)}
    readers: list[_Digits] = []
    kinds: dict[str, str] = {}
    out_coords: list[Coord] = []
    for d in dims:
        mine = {n for n in used if n.endswith("." + d)}
        if not mine and d != "x":
            continue
        block_only = d != "x" and mine == {f"blockIdx.{d}"}
        digits = _Digits(_ThreadBase(d, block_only, others=len(dims) > 1))
        for e in exprs:
            digits.scan(e)
        if block_only and not digits.bounds:
            extent = (launch or {}).get(d)
            if extent is None:
                raise NotImplicit(f"`blockIdx.{d}` with no bound and no known grid extent")
            digits.total = extent
        try:
            digits.settle()
        except _NotSplit as e:
            raise NotImplicit(str(e)) from None
        if digits.total is None:
            raise NotImplicit("no bound `index < N` on the flat thread index")
        readers.append(digits)
        kinds[d] = "block" if block_only else "thread"
        out_coords += digits.coords(f"c{d}" if len(dims) > 1 else "c")
        exprs = tuple(digits.sub(e) for e in exprs)
    threads = Threads(readers, kinds)
    store = Store(
        store.tensor,
        exprs[0],
        exprs[1],
        _simplify(exprs[2]),
        store.op,
        store.atomic,
        store.line,
    )
    if store.guard != TRUE:
        raise NotImplicit("the store's guard is more than the thread index's bound")
    if any(isinstance(x, Builtin) for x in walk_expr(store.index)):
        raise NotImplicit("the thread index outside its digits")
    return threads, out_coords, store


def reduction_read(store: Store) -> tuple[Loop, Var]:
    """The loop whose carried value the stored value reads (one loop, one value)."""
    outs = [x for x in walk_expr(store.value, into_loops=False) if isinstance(x, LoopOut)]
    if not outs or len({(x.loop.uid, x.var.uid) for x in outs}) != 1:
        raise NotImplicit("the stored value does not read one loop's result")
    return outs[0].loop, outs[0].var


def reduction_coords(chain: list[Loop], exprs: tuple[Expr, ...]) -> tuple[list[Coord], tuple]:
    """The coordinates of the reduction's nest (fastest first: each counter, or its digits where
    the loop takes it apart), and `exprs` rewritten over them."""
    for loop in chain:
        if _simplify(loop.guard) != TRUE:
            raise NotImplicit("a loop of the reduction runs under a condition")
    k_coords: list[Coord] = []
    for loop in reversed(chain):
        counter, start, bound = _counter(loop)
        digits = _Digits(_VarBase(counter))
        for e in exprs:
            digits.scan(e)
        if digits.places == {ONE}:
            extent = _sub_affine(bound, start)
            k_coords.append(Coord(counter, extent, start))
            continue
        if start:
            raise NotImplicit("a counter taken apart that does not start at 0")
        try:
            digits.total = size_mono_affine(bound)
            digits.settle()
        except _NotSplit as e:
            raise NotImplicit(str(e)) from None
        exprs = tuple(digits.sub(e) for e in exprs)
        k_coords += digits.coords(f"{counter.name}.")
    return k_coords, exprs


def _unit_stride(index: Expr, coords: list[Coord]) -> int:
    """The output coordinate whose step moves the store by one element (where the index is
    affine in the coordinates and one has coefficient 1), else the fastest digit."""
    f = affine(index) or {}
    unit = [c.var.uid for c in coords if f.get((f"{c.var.name}#{c.var.uid}",)) == 1]
    return unit[0] if len(unit) == 1 else coords[0].var.uid


def size_mono_affine(f: Affine) -> Mono:
    """A one-monomial affine form as a `Mono`."""
    if len(f) != 1:
        raise _NotSplit("a bound that is not a product of sizes")
    ((mono, coef),) = f.items()
    return (coef, tuple(sorted(mono)))


# ---- the reduction's loops ------------------------------------------------------------------


def reduction_chain(
    outer: Loop, acc_var: Var, ops: tuple[str, ...] = ("sum",)
) -> tuple[list[Loop], Carried, Expr, Carried]:
    """The nest of loops that carries a reduction of one of `ops` (outermost first), the
    outermost accumulator, the term the innermost one adds, and the innermost accumulator."""
    chain = [outer]
    loop, var = outer, acc_var
    acc = next((c for c in outer.carried if c.var.uid == acc_var.uid), None)
    if acc is None:
        raise NotImplicit("the stored value reads a loop's counter")
    while True:
        if loop.body:
            raise NotImplicit("a loop of the sum stores")
        carried = next(c for c in loop.carried if c.var.uid == var.uid)
        if len(loop.carried) != 2:
            raise NotImplicit("a loop of the sum carries more than a counter and the sum")
        update = _strip(carried.update)
        if isinstance(update, LoopOut):
            inner = next((c for c in update.loop.carried if c.var.uid == update.var.uid), None)
            if inner is None or inner.init != var:
                raise NotImplicit("the sum is not carried through the inner loop")
            loop, var = update.loop, update.var
            chain.append(loop)
            continue
        op, term = reduction_of(var, carried.update)
        if op not in ops or term is None:
            raise NotImplicit(f"the loop's value is not a {' or '.join(ops)}")
        # the sums of the nest (each loop's non-counter): no term or initial value reads one
        accs = {
            c.var.uid for lp in chain for c in lp.carried if c.var.uid not in induction_steps(lp)
        }
        if any(isinstance(x, Var) and x.uid in accs for x in walk_expr(term)):
            raise NotImplicit("a term reads the sum")
        if any(isinstance(x, Var) and x.uid in accs for x in walk_expr(acc.init)):
            raise NotImplicit("the sum's initial value reads the sum")
        return chain, acc, term, carried


def _counter(loop: Loop) -> tuple[Var, Affine, Affine]:
    """The loop's counter, its first value and its bound (`counter < bound`), counting by one,
    each an affine form of the kernel's integer parameters."""
    steps = induction_steps(loop)
    counters = [c for c in loop.carried if c.var.uid in steps]
    if len(counters) != 1 or affine(steps[counters[0].var.uid]) != {(): 1}:
        raise NotImplicit("a loop of the sum does not count by one")
    c = counters[0]
    start = _uniform(c.init)
    cond = loop.cond
    bound = None
    if isinstance(cond, Binary) and _strip(cond.a) == c.var and cond.op in ("<", "<="):
        bound = _uniform(cond.b)
        if bound is not None and cond.op == "<=":
            bound = add_affine(bound, {(): 1})
    elif isinstance(cond, Binary) and _strip(cond.b) == c.var and cond.op in (">", ">="):
        bound = _uniform(cond.a)
        if bound is not None and cond.op == ">=":
            bound = add_affine(bound, {(): 1})
    if start is None or bound is None:
        raise NotImplicit("a loop of the sum whose range is not made of the kernel's sizes")
    return c.var, start, bound


def _uniform(e: Expr) -> Affine | None:
    f = affine(e)
    if f is None or any("#" in a or "." in a for m in f for a in m):
        return None
    return f


# ---- digits of a flat index -----------------------------------------------------------------


class _ThreadBase:
    """The thread's global index along a dimension (`blockIdx.d * blockDim.d + threadIdx.d`), or
    the block's index alone (`block_only`: a kernel that takes a launch dimension's blocks as a
    coordinate, one thread each along it)."""

    def __init__(self, dim: str = "x", block_only: bool = False, others: bool = False) -> None:
        self.dim = dim
        self.block_only = block_only
        self.others = others  # other dimensions' indices are other coordinates' (not strays)
        self.spelled: set[int] = set()

    @property
    def block(self) -> int | None:
        return next(iter(self.spelled)) if len(self.spelled) == 1 else None

    def __call__(self, e: Expr) -> bool:
        if e.type not in (INT, LONG) or not any(isinstance(x, Builtin) for x in walk_expr(e)):
            return False
        f = affine(e)
        d = self.dim
        if self.block_only:
            return f == {(f"blockIdx.{d}",): 1}
        if f is None or global_indices(f) != {(f"g.{d}",): 1}:
            return False
        if f.get((f"blockIdx.{d}",)) and f.get((f"threadIdx.{d}",)):
            self.spelled.add(f[(f"blockIdx.{d}",)] // f[(f"threadIdx.{d}",)])
        return True

    def stray(self, e: Expr) -> bool:
        return isinstance(e, Builtin) and e.name.endswith("." + self.dim)

    def moves(self, e: Expr) -> bool:
        return any(
            isinstance(x, LoopOut) or (isinstance(x, Builtin) and self._ours(x))
            for x in walk_expr(e, into_loops=False)
        )

    def _ours(self, b: Builtin) -> bool:
        # the 1-D reading reads every built-in (one of another dimension is an error there)
        return not self.others or b.name.endswith("." + self.dim)


class _VarBase:
    """A loop's counter."""

    block = None

    def __init__(self, var: Var) -> None:
        self.var = var

    def __call__(self, e: Expr) -> bool:
        while isinstance(e, Cast) and e.type in (INT, LONG):
            e = e.a
        return e == self.var

    def stray(self, e: Expr) -> bool:
        return e == self.var

    def moves(self, e: Expr) -> bool:
        return any(x == self.var for x in walk_expr(e))


@dataclass
class _Digits(Rewriter):
    """A flat index's digits (`(base % hi) / lo`): their place values, the bound `base < total`,
    and the model rewritten with a coordinate Var per digit (as `optiml.lift.coords` does for up
    to three launch dimensions, here for any number)."""

    base: _ThreadBase | _VarBase
    places: set[Mono] = field(default_factory=lambda: {ONE})
    bounds: set[Mono] = field(default_factory=set)
    chain: list[Mono] = field(default_factory=list)
    extents: list[Mono] = field(default_factory=list)
    total: Mono | None = None
    vars: list[Var] = field(default_factory=list)
    coord_type: str = INT
    memo: dict = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)

    def digits(self, e: Expr) -> tuple[Mono, Mono | None] | None:
        def is_base(x: Expr) -> bool:
            if not self.base(x):
                return False
            if x.type == LONG:
                self.coord_type = LONG
            return True

        return digit_range(e, is_base, "index")

    def compared(self, e: Expr) -> tuple[bool, Mono] | None:
        if not isinstance(self.base, _ThreadBase):
            return None
        if not (isinstance(e, Binary) and e.op in ("<", ">=", ">", "<=")):
            return None
        if self.base(e.a) and not self.base.moves(e.b):
            return (e.op == "<", size_mono(e.b)) if e.op in ("<", ">=") else None
        if self.base(e.b) and not self.base.moves(e.a):
            return (e.op == ">", size_mono(e.a)) if e.op in (">", "<=") else None
        return None

    def scan(self, e: Expr) -> None:
        try:
            self._scan(e)
        except _NotSplit as err:
            raise NotImplicit(str(err)) from None

    def _scan(self, e: Expr) -> None:
        if not self.base.moves(e) and not isinstance(e, LoopOut):
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
        if isinstance(e, Builtin) and not e.name.endswith("." + getattr(self.base, "dim", "x")):
            raise NotImplicit(f"`{e.name}`: only a flat 1-D launch's thread index is read")
        if self.base.stray(e):
            raise NotImplicit("the index is used other than by its digits")
        if isinstance(e, LoopOut):
            if e.loop.uid not in self.seen:
                self.seen.add(e.loop.uid)
                for x in _loop_exprs(e.loop):
                    self._scan(x)
            return
        for x in children(e):
            self._scan(x)

    def settle(self) -> None:
        self.chain = sorted(self.places, key=lambda p: (len(p[1]), p[0]))
        for p, q in zip(self.chain, self.chain[1:], strict=False):
            if over(q, p) is None:
                raise _NotSplit("place values that do not divide each other")
        if len(self.bounds) > 1:
            raise _NotSplit("several bounds `index < N` on the flat index")
        if self.bounds:
            self.total = next(iter(self.bounds))
        if self.total is None:
            raise _NotSplit("no bound on the flat index")
        top = over(self.total, self.chain[-1])
        if top is None:
            raise _NotSplit("a bound that is not a multiple of the largest place value")
        self.extents = [over(q, p) for p, q in zip(self.chain, self.chain[1:], strict=False)]
        self.extents.append(top)

    def coords(self, prefix: str) -> list[Coord]:
        if not self.vars:
            self.vars = [Var(f"{prefix}{i}", self.coord_type) for i in range(len(self.chain))]
        return [Coord(v, mono_affine(ext)) for v, ext in zip(self.vars, self.extents, strict=True)]

    def value(self, lo: Mono, hi: Mono | None) -> Expr:
        self.coords("c")
        first = self.chain.index(lo)
        last = len(self.chain) if hi is None else self.chain.index(hi)
        total: Expr | None = None
        for i in range(first, last):
            weight = over(self.chain[i], lo)
            assert weight is not None
            term: Expr = self.vars[i]
            if weight != ONE:
                term = Binary("*", term, _mono_expr(weight, self.coord_type), self.coord_type)
            total = term if total is None else Binary("+", total, term, self.coord_type)
        return total if total is not None else Const(0, self.coord_type)

    def _sub(self, e: Expr) -> Expr:
        if not self.base.moves(e) and not isinstance(e, LoopOut):
            return e
        hit = self.compared(e)
        if hit is not None:
            return TRUE if hit[0] else FALSE
        d = self.digits(e)
        if d is not None:
            v = self.value(*d)
            return v if v.type == e.type else Cast(v, e.type)
        return self.rebuilt(e)

    def guard(self, e: Expr) -> Expr:
        return _simplify(e)


def _mono_expr(m: Mono, t: str) -> Expr:
    e: Expr | None = Const(m[0], t) if m[0] != 1 or not m[1] else None
    for name in m[1]:
        p: Expr = Cast(Param(name, INT), t) if t == LONG else Param(name, INT)
        e = p if e is None else Binary("*", e, p, t)
    assert e is not None
    return e


def _loop_exprs(loop: Loop) -> list[Expr]:
    out: list[Expr] = [loop.cond, loop.guard]
    for c in loop.carried:
        out += [c.init, c.update]
    for s in walk_stmts(loop.body):
        if isinstance(s, Store):
            out += [s.index, s.value, s.guard]
    return out


# ---- expressions ----------------------------------------------------------------------------


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast) and e.type == e.a.type:
        e = e.a
    return e


def _zero(e: Expr) -> bool:
    while isinstance(e, Cast):
        e = e.a
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0


def _guarded(term: Expr) -> tuple[Expr, Expr]:
    """`cond ? x : 0` as (cond, x); anything else as (TRUE, term)."""
    t = _strip(term)
    if isinstance(t, Select) and _zero(t.b):
        inner_guard, inner = _guarded(t.a)
        return _and(t.cond, inner_guard), inner
    if isinstance(t, Select) and _zero(t.a):
        inner_guard, inner = _guarded(t.b)
        return _and(Unary("!", t.cond, BOOL), inner_guard), inner
    return TRUE, term


def _conjuncts(guard: Expr) -> list[Expr]:
    if isinstance(guard, Binary) and guard.op == "&&":
        return _conjuncts(guard.a) + _conjuncts(guard.b)
    return [] if guard == TRUE else [guard]


def _and(a: Expr, b: Expr) -> Expr:
    if a == TRUE:
        return b
    if b == TRUE:
        return a
    return Binary("&&", a, b, BOOL)


def _under(conds: list[Expr], e: Expr) -> Expr:
    """`e` where every condition holds, 0 elsewhere (`e` evaluated only where they hold)."""
    guard: Expr = TRUE
    for c in conds:
        guard = _and(guard, c)
    return e if guard == TRUE else Select(guard, e, Const(0.0, e.type), e.type)


def _exposed(e: Expr) -> tuple[Load, ...]:
    """The loads of `e` evaluated wherever `e` is: not under a select's branch."""
    out: list[Load] = []

    def visit(x: Expr) -> None:
        if isinstance(x, Load):
            out.append(x)
        if isinstance(x, Select):
            visit(x.cond)
            return
        if isinstance(x, Binary) and x.op in ("&&", "||"):
            visit(x.a)
            return
        if isinstance(x, LoopOut):
            for y in _loop_exprs(x.loop):
                visit(y)
            return
        for y in children(x):
            visit(y)

    visit(e)
    return tuple(dict.fromkeys(out))


def _uses(e: Expr, uids) -> set[int]:
    return {x.uid for x in walk_expr(e) if isinstance(x, Var) and x.uid in uids}


def _simplify(e: Expr) -> Expr:
    """Boolean constants folded through `!`, `&&` and `||`."""
    if isinstance(e, Unary) and e.op == "!":
        a = _simplify(e.a)
        if a in (TRUE, FALSE):
            return FALSE if a == TRUE else TRUE
        return replace(e, a=a)
    if isinstance(e, Binary) and e.op in ("&&", "||"):
        a, b = _simplify(e.a), _simplify(e.b)
        absorbing, neutral = (FALSE, TRUE) if e.op == "&&" else (TRUE, FALSE)
        if absorbing in (a, b):
            return absorbing
        if a == neutral:
            return b
        if b == neutral:
            return a
        return replace(e, a=a, b=b)
    return e


def _sub_affine(a: Affine, b: Affine) -> Affine:
    return add_affine(a, {m: -c for m, c in b.items()})
