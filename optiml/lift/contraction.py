"""A contraction read off the lifted model: which thread index is M, which is N, which is the batch,
the loop's K, each operand's strides as affine forms of the kernel's integer parameters, the
accumulator's seed, the store's guard and value (the epilogue), and the element types.

`contraction(lifted)` gives a `Contraction` for a kernel whose model is one store per thread of
`f(sum over k of a[...] * b[...])` (the sum in one loop that counts k by one, the store outside
it), with every index affine in the thread's global indices, k and the batch, or raises `NotOne`
with the reason. Spellings do not matter: index names, `for` or `while`, x along rows or columns,
int or 64-bit indices, macros, local pointers: the model is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optiml.lift.coords import Flat, NotSplit, delinearize
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
    Binary,
    Carried,
    Cast,
    Const,
    Expr,
    Lifted,
    Load,
    Loop,
    Store,
    Unary,
    Var,
    loops_of,
    walk_expr,
    walk_stmts,
)

# The global thread indices an axis of the output may be: `g.d` for blockIdx.d * blockDim.d +
# threadIdx.d, `blockIdx.z` alone for a batch a block column each.
THREAD_ATOMS = ("g.x", "g.y", "g.z", "blockIdx.z")


class NotOne(Exception):
    """The model is not a contraction this reading follows; the message says why."""


@dataclass(frozen=True)
class Operand:
    """`tensor[offset + sum over axes of axis * strides[axis]]`: an operand's (or the output's)
    element as the contraction reads it. Axes: "m", "n", "k", "batch"; strides and offset are
    affine forms of the kernel's integer parameters."""

    tensor: str
    dtype: str
    offset: Affine
    strides: dict[str, Affine]

    def stride(self, axis: str) -> Affine:
        return self.strides.get(axis, {})

    @property
    def k_contiguous(self) -> bool:
        """Whether k is the unit-stride index (A row-major, B column-major)."""
        return self.stride("k") == {(): 1}

    def leading(self, axis: str) -> Affine | None:
        """The leading dimension of the 2-D matrix over (axis, k): the stride of the index that is
        not unit-stride; None where neither is."""
        if self.k_contiguous:
            return self.stride(axis)
        if self.stride(axis) == {(): 1}:
            return self.stride("k")
        return None


@dataclass(frozen=True)
class Contraction:
    """out[m, n(, batch)] = epilogue(seed + sum over k < K of a[m, k] * b[k, n]); for a
    matrix-vector product there is no n and b is indexed by k alone.

    `atoms`: the model's thread atom of each axis ("m" -> "g.y", "n" -> "g.x", "batch" ->
    "blockIdx.z"); `extents`: M, N and the batch from the guard (the batch's is None where the
    guard leaves it to the launch), K = `k_end` - `k_start`; `block`: a block size the kernel
    spells (`16 * blockIdx.x + threadIdx.x`) per grid dimension."""

    kind: str  # "matrix-matrix" | "matrix-vector"
    atoms: dict[str, str]
    extents: dict[str, Affine | None]
    k_start: Affine
    k_end: Affine
    a: Operand
    b: Operand
    out: Operand
    acc: Carried
    k: Var
    loop: Loop
    store: Store
    seed: Expr | None  # what the sum starts from where it is not 0
    block: dict[str, int]
    # Where the kernel takes a flat thread index apart (`row = i / N; col = i % N`): how its
    # launch covers the virtual 2-D/3-D one that `atoms` name (optiml.lift.coords).
    flat: Flat | None = None

    @property
    def k_extent(self) -> Affine:
        return add_affine(self.k_end, {m: -c for m, c in self.k_start.items()})

    @property
    def input_types(self) -> tuple[str, str]:
        return self.a.dtype, self.b.dtype

    @property
    def acc_type(self) -> str:
        return self.acc.var.type


def contraction(lifted: Lifted) -> Contraction:
    """The model's contraction, or `NotOne`. A kernel that takes a flat thread index apart is read
    with its digits as coordinates (the contraction's `flat` says so)."""
    try:
        return _read(lifted)
    except NotOne as direct:
        try:
            model, flat = delinearize(lifted)
        except NotSplit:
            raise direct from None
        return replace(_read(model), flat=flat)


def _read(lifted: Lifted) -> Contraction:
    stores = [s for s in walk_stmts(lifted.body) if isinstance(s, Store)]
    if len(stores) != 1 or stores[0] not in lifted.body:
        raise NotOne("not one store per thread outside loops")
    store = stores[0]
    if store.atomic:
        raise NotOne("an atomic store")
    loops = loops_of(lifted)
    if len(loops) != 1:
        raise NotOne("not one loop")
    loop = loops[0]
    if loop.body:
        raise NotOne("the loop stores")
    steps = induction_steps(loop)
    if len(loop.carried) != 2 or len(steps) != 1:
        raise NotOne("the loop does not carry one counter and one sum")
    (kc,) = [c for c in loop.carried if c.var.uid in steps]
    (acc,) = [c for c in loop.carried if c.var.uid not in steps]
    if affine(steps[kc.var.uid]) != {(): 1}:
        raise NotOne("the loop does not count by one")
    k_start = _uniform(kc.init)
    k_end = _k_bound(loop.cond, kc.var)
    if k_start is None or k_end is None:
        raise NotOne("the loop's range is not made of the kernel's integer parameters")
    op, term = reduction_of(acc.var, acc.update)
    if op != "sum" or term is None:
        raise NotOne("the loop's value is not a sum")
    term = _strip(term)
    if not (isinstance(term, Binary) and term.op == "*"):
        raise NotOne("the sum's terms are not products")
    factors = [_strip(term.a), _strip(term.b)]
    if not all(isinstance(f, Load) for f in factors):
        raise NotOne("a factor is not a load")
    if any(isinstance(x, Var) and x.uid == acc.var.uid for x in walk_expr(acc.init)):
        raise NotOne("the sum's initial value")

    # the output's axes: its unit-stride thread index is n (m for a vector), the other one m
    out_form = _form(store.index)
    threads = sorted(a for m in out_form for a in m if a in THREAD_ATOMS)
    batch = [a for a in threads if a in ("blockIdx.z", "g.z")]
    rest = [a for a in threads if a not in batch]
    if len(batch) > 1 or not 1 <= len(rest) <= 2:
        raise NotOne("the output is not indexed by one or two thread indices and a batch")
    atoms: dict[str, str] = {}
    unit = [a for a in rest if out_form.get((a,)) == 1]
    if len(rest) == 2:
        if len(unit) != 1:
            raise NotOne("no thread index with unit stride in the output")
        atoms["n"] = unit[0]
        atoms["m"] = next(a for a in rest if a != unit[0])
    else:
        atoms["m"] = rest[0]
    if batch:
        atoms["batch"] = batch[0]
    axes = {v: k for k, v in atoms.items()}
    axes[f"{kc.var.name}#{kc.var.uid}"] = "k"

    out = _operand(store.tensor, lifted.tensors[store.tensor].dtype, store.index, axes)
    if "k" in out.strides:
        raise NotOne("the output moves with k")
    ops = [_operand(f.tensor, f.type, f.index, axes) for f in factors]
    if any("k" not in o.strides for o in ops):
        raise NotOne("a factor does not move with k")
    if "n" in atoms:
        sides = (
            [o for o in ops if "m" in o.strides and "n" not in o.strides],
            [o for o in ops if "n" in o.strides and "m" not in o.strides],
        )
        kind = "matrix-matrix"
    else:
        sides = [o for o in ops if "m" in o.strides], [o for o in ops if "m" not in o.strides]
        kind = "matrix-vector"
    if len(sides[0]) != 1 or len(sides[1]) != 1:
        raise NotOne("the factors are not one per side of the product")
    a, b = sides[0][0], sides[1][0]
    if store.tensor in (a.tensor, b.tensor):
        raise NotOne("the output is a factor")

    # the guard: `axis < extent` for each of m and n, the batch's optional
    bounds = _bounds(store.guard)
    if bounds is None or loop.guard not in (store.guard, Const(True, BOOL)):
        raise NotOne("the guard is not `index < extent` for each index")
    extents: dict[str, Affine | None] = {}
    for axis, atom in atoms.items():
        if atom not in bounds and axis != "batch":
            raise NotOne(f"no bound on the output's {axis} index")
        extents[axis] = bounds.pop(atom, None)
    if bounds:
        raise NotOne("the guard bounds another index")

    # the epilogue reads the output only at the element it writes (a tile's element is its own)
    for e in (store.value, acc.init):
        for ld in (x for x in walk_expr(e, into_loops=False) if isinstance(x, Load)):
            if ld.tensor == store.tensor and _form(ld.index) != out_form:
                raise NotOne("the epilogue reads another element of the output")
    seed = None if acc.init == Const(0.0, acc.var.type) or _zero(acc.init) else acc.init
    return Contraction(
        kind,
        atoms,
        extents,
        k_start,
        k_end,
        a,
        b,
        out,
        acc,
        kc.var,
        loop,
        store,
        seed,
        _spelled_blocks([store.index, *(f.index for f in factors)]),
    )


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def _zero(e: Expr) -> bool:
    e = _strip(e)
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 0


def _form(index: Expr) -> Affine:
    f = affine(index)
    if f is None:
        raise NotOne("an index that is not affine")
    return global_indices(f)


def _uniform(e: Expr) -> Affine | None:
    """`e` as an affine form of integer parameters and constants alone."""
    f = affine(e)
    if f is None or any(
        a.startswith(("g.", "threadIdx", "blockIdx", "stride.")) for m in f for a in m
    ):
        return None
    if any("#" in a or a.startswith(("blockDim", "gridDim")) for m in f for a in m):
        return None
    return f


def _k_bound(cond: Expr, k: Var) -> Affine | None:
    if isinstance(cond, Binary) and cond.a == k and cond.op in ("<", "<="):
        f = _uniform(cond.b)
        return None if f is None else (f if cond.op == "<" else add_affine(f, {(): 1}))
    if isinstance(cond, Binary) and cond.b == k and cond.op in (">", ">="):
        f = _uniform(cond.a)
        return None if f is None else (f if cond.op == ">" else add_affine(f, {(): 1}))
    return None


def _operand(tensor: str, dtype: str, index: Expr, axes: dict[str, str]) -> Operand:
    """`index` split into the axes' strides and a uniform offset."""
    parts: dict[str | None, Affine] = {}
    for mono, coef in _form(index).items():
        hits = [a for a in mono if a in axes]
        if len(hits) > 1:
            raise NotOne(f"{tensor}: a product of two indices")
        rest = [a for a in mono if a not in axes]
        if any(
            a.startswith(("g.", "threadIdx", "blockIdx", "blockDim", "gridDim", "stride."))
            or "#" in a
            for a in rest
        ):
            raise NotOne(f"{tensor}: an index moves with the thread otherwise")
        part = parts.setdefault(axes[hits[0]] if hits else None, {})
        part[tuple(rest)] = part.get(tuple(rest), 0) + coef
    clean = {k: {m: c for m, c in p.items() if c} for k, p in parts.items()}
    offset = clean.pop(None, {})
    return Operand(tensor, dtype, offset, {k: v for k, v in clean.items() if v})


def _bounds(guard: Expr) -> dict[str, Affine] | None:
    """`guard` as a conjunction of `atom < extent` (also `!(atom >= extent || ...)`, `extent >
    atom`): atom -> extent; None where it is anything else."""
    out: dict[str, Affine] = {}

    def visit(e: Expr, negated: bool) -> bool:
        if isinstance(e, Unary) and e.op == "!":
            return visit(e.a, not negated)
        if isinstance(e, Binary) and e.op == ("||" if negated else "&&"):
            return visit(e.a, negated) and visit(e.b, negated)
        if not isinstance(e, Binary):
            return False
        op = e.op
        if negated:
            op = {"<": ">=", ">=": "<", ">": "<=", "<=": ">"}.get(op, "")
        if op == "<":
            index, extent = e.a, e.b
        elif op == ">":
            index, extent = e.b, e.a
        else:
            return False
        f = affine(index)
        bound = _uniform(extent)
        if f is None or bound is None:
            return False
        f = global_indices(f)
        if len(f) != 1 or next(iter(f.values())) != 1:
            return False
        (mono,) = f
        if len(mono) != 1 or mono[0] not in THREAD_ATOMS or mono[0] in out:
            return False
        out[mono[0]] = bound
        return True

    if guard == Const(True, BOOL):
        return {}
    return out if visit(guard, False) else None


def _spelled_blocks(indices: list[Expr]) -> dict[str, int]:
    """Per grid dimension, the block size a kernel spells (`16 * blockIdx.x + threadIdx.x`): the
    ratio of blockIdx.d's coefficient to threadIdx.d's in the raw indices."""
    out: dict[str, int] = {}
    for index in indices:
        raw = affine(index) or {}
        for d in "xyz":
            bi, ti = f"blockIdx.{d}", f"threadIdx.{d}"
            for mono, coef in raw.items():
                if bi not in mono or f"blockDim.{d}" in mono:
                    continue
                local = tuple(sorted([a for a in mono if a != bi] + [ti]))
                if raw.get(local):
                    out[d] = coef // raw[local]
    return out
