"""A sliding-window reduction read off the lifted model: a thread per output element of
`epilogue(reduce over a small window of f(inputs))`, where an input is read at the output's
position times a stride plus the window's offset times a dilation, on the output's two fastest
axes (pooling of any dimension, a depthwise or direct convolution, a 1-D filter).

`window(lifted)` takes the flat thread index apart into the output's coordinates and the
reduction's loops into the window's coordinates (as `optiml.lift.implicit` does), then reads each
load of an input that moves with the output's unit-stride coordinate X as an affine function

    index = base + (sx * X + sum dx_k * k) + Q * (sy * Y + sum dy_k * k)

of X, of the output's next coordinate Y (the input's row pitch Q, a form of the kernel's sizes),
of the window's coordinates along each axis (dx_k, dy_k integers) and of `base`, which holds the
rest (the batch, the channel, the window's coordinates on slower axes such as a 3-D pool's depth).
A block of outputs on X and Y then reads one rectangle of that input, which a schedule loads
once into shared memory. Loads that do not move with X or Y (a depthwise convolution's weights)
are read as they are.

The reduction is whatever the loops carry (a sum, a max, a count of the taps inside the padding
beside a sum, an index beside a max): the schedule keeps the original's update expressions and
its order of the window's coordinates, so it computes bit for bit what the original computes. `NotWindow` says why a model is not of this form.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from optiml.lift.coords import Mono
from optiml.lift.families import Affine, affine, induction_steps
from optiml.lift.implicit import (
    Coord,
    Launched,
    NotImplicit,
    output_coords,
    reduction_coords,
)
from optiml.lift.model import (
    Builtin,
    Carried,
    Cast,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Store,
    Var,
    loops_of,
    walk_expr,
)


class NotWindow(Exception):
    """The model is not a window reduction this reading follows; the message says why."""


@dataclass(frozen=True)
class Tiled:
    """One load of an input on the window's axes: `base + sx * X + Q * sy * Y` plus the window's
    offsets `dx[k] * k` (along X) and `dy[k] * k * Q` (along Y), by the coordinates' uids."""

    load: Load
    base: Affine  # over the kernel's sizes, the block's coordinates and the outer window's
    sx: int
    sy: int  # 0 where the output has no Y
    pitch: Affine  # Q: elements between the input's rows ({} where the output has no Y)
    dx: dict[int, int]
    dy: dict[int, int]


@dataclass(frozen=True)
class Window:
    """out[coords] = epilogue(reduce over the window of update(acc, term)).

    `x`, `y`: the output's unit-stride coordinate and the next one on the tiles' rows (None: a
    1-D window); `plane`: the output's other coordinates, fixed within a block. `inner`: the
    window's coordinates that move the tiled loads (each a constant range, fastest first);
    `outer`: its others (slower than every inner one: a 3-D pool's depth, a direct convolution's
    input channel), around the tile. `accs`: what the outermost loop carries besides its counter
    (a sum, a max, and a count or an index beside it), `updates` their new values in the
    innermost loop (all at once, over the old ones: `acc_uids` maps every level's variable of
    each to its place) and `seeds` their values before the loops."""

    x: Coord
    y: Coord | None
    plane: tuple[Coord, ...]
    inner: tuple[Coord, ...]
    outer: tuple[Coord, ...]
    tiled: tuple[Tiled, ...]
    updates: tuple[Expr, ...]
    accs: tuple[Carried, ...]
    acc_uids: dict[int, int]
    seeds: tuple[Expr, ...]
    store: Store
    launch: dict[str, Launched]  # by dimension: how the original launch covers the outputs

    @property
    def tensors(self) -> list[str]:
        return sorted({t.load.tensor for t in self.tiled})


def window(lifted: Lifted, launch: dict[str, Mono] | None = None) -> Window:
    """The model as a window reduction, or `NotWindow` with the reason. The kernel may launch in
    1 to 3 dimensions (`launch`: the grid's extent along y and z, for a kernel that takes a
    dimension's blocks as a coordinate)."""
    try:
        return _window(lifted, launch)
    except NotImplicit as e:
        raise NotWindow(str(e)) from None


def _window(lifted: Lifted, launch: dict[str, Mono] | None) -> Window:
    threads, out_coords, store = output_coords(lifted, "xyz", launch)
    outs = [x for x in walk_expr(store.value, into_loops=False) if isinstance(x, LoopOut)]
    if not outs or len({x.loop.uid for x in outs}) != 1:
        raise NotWindow("the stored value does not read one loop's results")
    chain, accs, updates, acc_uids = _nest(outs[0].loop)
    if len({lp.uid for lp in loops_of(lifted)}) != len(chain):
        raise NotWindow("a loop that is not the reduction's")
    k_coords, updates = reduction_coords(chain, updates)
    updates = tuple(threads.sub(u) for u in updates)
    seeds = tuple(threads.sub(c.init) for c in accs)
    if any(isinstance(x, Builtin) for e in (*updates, *seeds, store.value) for x in walk_expr(e)):
        raise NotWindow("the thread index outside its digits")
    for ld in (x for e in (*updates, *seeds) for x in walk_expr(e) if isinstance(x, Load)):
        if ld.tensor == store.tensor:
            raise NotWindow("the reduction reads the output")

    atoms = {_atom(c.var): c for c in (*out_coords, *k_coords)}
    index = affine(store.index)
    if index is None:
        raise NotWindow("the output's index is not affine in its coordinates")
    unit = [c for c in out_coords if index.get((_atom(c.var),)) == 1]
    if len(unit) != 1:
        raise NotWindow("no output coordinate of unit stride")
    x = unit[0]

    loads = [ld for u in updates for ld in dict.fromkeys(walk_expr(u)) if isinstance(ld, Load)]
    loads = list(dict.fromkeys(loads))
    moving = [ld for ld in loads if _reads(ld, x.var)]
    if not moving:
        raise NotWindow("no load moves with the output's unit-stride coordinate")
    forms = []
    for ld in moving:
        f = affine(ld.index)
        if f is None:
            raise NotWindow(f"{ld.tensor}: an index that is not affine in the coordinates")
        forms.append((ld, f))

    # Y: the output coordinate (not X) with the smallest stride in the store that the moving
    # loads read with one row pitch
    y = _next_axis(out_coords, x, index, forms)
    k_uids = {c.var.uid for c in k_coords}
    tiled = []
    for ld, f in forms:
        tiled.append(_tiled(ld, f, x, y, atoms, k_uids))
    inner_uids = {u for t in tiled for u in (*t.dx, *t.dy)}
    if not inner_uids:
        raise NotWindow("the window's coordinates do not move the loads along X or Y")
    # every tiled load must see the window's inner coordinates on the same axis
    for u in inner_uids:
        axes = {("x" if u in t.dx else "y" if u in t.dy else "none") for t in tiled}
        if len(axes) != 1 or "none" in axes:
            raise NotWindow("the tiled loads read a window coordinate on different axes")
    for ld in loads:
        if ld in moving:
            continue
        if y is not None and _reads(ld, y.var):
            raise NotWindow(f"{ld.tensor}: read along Y but not along X")
    inner_c = tuple(c for c in k_coords if c.var.uid in inner_uids)
    outer_c = tuple(c for c in k_coords if c.var.uid not in inner_uids)
    # k_coords are fastest first: the tile is loaded once per combination of the outer ones,
    # which must all be slower than the inner ones to keep the original's order
    if outer_c and max(k_coords.index(c) for c in inner_c) > min(
        k_coords.index(c) for c in outer_c
    ):
        raise NotWindow("a window coordinate on X or Y is slower than one around the tile")
    plane = tuple(c for c in out_coords if c is not x and c is not y)
    return Window(
        x,
        y,
        plane,
        inner_c,
        outer_c,
        tuple(tiled),
        updates,
        accs,
        acc_uids,
        seeds,
        store,
        threads.launched(),
    )


def _nest(outer: Loop) -> tuple[list[Loop], tuple[Carried, ...], tuple[Expr, ...], dict]:
    """The nest of loops that carries the reduction (outermost first): each loop a counter that
    counts by one and the same accumulators, an inner loop's starting from the outer's; the
    outermost accumulators, the innermost loop's updates of them, and every level's variable of
    each by its place."""
    chain = [outer]
    loop = outer
    counter = _counter_uid(loop)
    accs = tuple(c for c in loop.carried if c.var.uid != counter)
    if not accs:
        raise NotWindow("the loop carries nothing but its counter")
    acc_uids = {c.var.uid: i for i, c in enumerate(accs)}
    level = accs
    while True:
        if loop.body:
            raise NotWindow("a loop of the reduction stores")
        inner = [_strip_cast(c.update) for c in level]
        nested = [u for u in inner if isinstance(u, LoopOut)]
        if not nested:
            break
        if len(nested) != len(inner) or len({u.loop.uid for u in nested}) != 1:
            raise NotWindow("the accumulators are not carried through one inner loop")
        nxt = nested[0].loop
        counter = _counter_uid(nxt)
        carried = {c.var.uid: c for c in nxt.carried if c.var.uid != counter}
        new_level = []
        for i, c in enumerate(level):
            u = _strip_cast(c.update)
            got = carried.get(u.var.uid)
            if got is None or got.init != c.var:
                raise NotWindow("an inner loop's accumulator does not start from the outer's")
            new_level.append(got)
            acc_uids[got.var.uid] = i
        if len(carried) != len(level):
            raise NotWindow("an inner loop carries more than the outer's accumulators")
        chain.append(nxt)
        loop, level = nxt, tuple(new_level)
    own = set(acc_uids)
    counters = {_counter_uid(lp) for lp in chain}
    updates = tuple(c.update for c in level)
    for c in accs:
        if any(isinstance(x, Var) and x.uid in own | counters for x in walk_expr(c.init)):
            raise NotWindow("an accumulator's first value reads the loop")
    for u in updates:
        if any(isinstance(x, LoopOut) for x in walk_expr(u)):
            raise NotWindow("an update reads a loop's result")
    return chain, accs, updates, acc_uids


def _counter_uid(loop: Loop) -> int:
    steps = induction_steps(loop)
    counters = [c for c in loop.carried if c.var.uid in steps]
    if len(counters) != 1:
        raise NotWindow("a loop of the reduction without one counter")
    return counters[0].var.uid


def _strip_cast(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def _atom(v: Var) -> str:
    return f"{v.name}#{v.uid}"


def _reads(ld: Load, v: Var) -> bool:
    return any(isinstance(x, Var) and x.uid == v.uid for x in walk_expr(ld.index))


def _coef(f: Affine, atom: str) -> Affine | None:
    """The coefficient of `atom` in `f` (an affine form of the sizes), None where `atom` appears
    squared."""
    out: Affine = {}
    for mono, c in f.items():
        if mono.count(atom) > 1:
            return None
        if atom in mono:
            rest = tuple(a for a in mono if a != atom)
            out[rest] = out.get(rest, 0) + c
    return {m: c for m, c in out.items() if c}


def _sizes_only(f: Affine) -> bool:
    return all("#" not in a and "." not in a for m in f for a in m)


def _primitive(f: Affine) -> tuple[int, Affine]:
    """`f` as `g * p`, g > 0 the gcd of its coefficients (p's leading one positive)."""
    g = 0
    for c in f.values():
        g = gcd(g, c)
    lead = sorted(f.items())[0][1]
    g = g if lead > 0 else -g
    return abs(g), {m: c // g for m, c in f.items()}


def _ratio(f: Affine, p: Affine) -> int | None:
    """The integer r with f == r * p, if any."""
    if not f:
        return 0
    ((m0, c0),) = sorted(p.items())[:1]
    if m0 not in f or f[m0] % c0:
        return None
    r = f[m0] // c0
    return r if {m: r * c for m, c in p.items()} == f else None


def _next_axis(out_coords, x: Coord, index: Affine, forms) -> Coord | None:
    """The output's coordinate next to X (its stride in the store is X's extent; else the next
    digit of the thread index), where every moving load reads it times a size form (the input's
    row pitch times a stride); None where there is none."""
    rest = [c for c in out_coords if c is not x]
    nxt = [c for c in rest if _coef(index, _atom(c.var)) == x.extent]
    later = out_coords[out_coords.index(x) + 1 :]
    pick = nxt[0] if nxt else (later[0] if later else None)
    if pick is None:
        return None
    coefs = [_coef(f, _atom(pick.var)) for _, f in forms]
    if all(q and _sizes_only(q) and any(m for m in q) for q in coefs):
        return pick
    return None


def _tiled(ld: Load, f: Affine, x: Coord, y: Coord | None, atoms, k_uids) -> Tiled:
    sx_form = _coef(f, _atom(x.var))
    if sx_form is None or set(sx_form) != {()} or sx_form[()] <= 0:
        raise NotWindow(f"{ld.tensor}: X's stride in the load is not a positive constant")
    sx = sx_form[()]
    pitch: Affine = {}
    sy = 0
    if y is not None:
        qy = _coef(f, _atom(y.var))
        if not qy or not _sizes_only(qy):
            raise NotWindow(f"{ld.tensor}: Y's stride in the load is not a size")
        sy, pitch = _primitive(qy)
    dx: dict[int, int] = {}
    dy: dict[int, int] = {}
    moved = {_atom(x.var)} | ({_atom(y.var)} if y is not None else set())
    for atom, coord in atoms.items():
        if coord.var.uid not in k_uids:
            continue
        c = _coef(f, atom)
        if c is None:
            raise NotWindow(f"{ld.tensor}: a window coordinate squared")
        if not c:
            continue
        if not _sizes_only(c):
            raise NotWindow(f"{ld.tensor}: a window coordinate times another coordinate")
        if set(c) == {()}:
            dx[coord.var.uid] = c[()]
            moved.add(atom)
            continue
        r = _ratio(c, pitch) if pitch else None
        if r is not None:
            dy[coord.var.uid] = r
            moved.add(atom)
    base: Affine = {m: c for m, c in f.items() if not (set(m) & moved)}
    for m in f:
        if set(m) & moved and len(set(m) & moved) > 1:
            raise NotWindow(f"{ld.tensor}: a product of two moving coordinates")
        if set(m) & moved and not all(a in moved or ("#" not in a and "." not in a) for a in m):
            raise NotWindow(f"{ld.tensor}: a moving coordinate times a block's coordinate")
    return Tiled(ld, base, sx, sy, pitch, dx, dy)
