"""Implicit GEMM from the lifted model (optiml.lift.implicit): a kernel whose model is a thread per
output element of `epilogue(seed + sum over k of A * B)`, where the factors are whatever the kernel
computes (a convolution's input under its padding and stride guards, as im2col would read it, and
its weights; a transposed convolution's gather with `(oh + pad - kh) % stride == 0`; a value of a
loop of its own), becomes a tiled kernel: a block computes a BM x BN tile of one batch's outputs,
walks K in steps of BK, and its threads evaluate the A expression for (m, k) and the B expression
for (k, n) into shared memory (each element's coordinates taken back from m, n and k by division
and remainder, once per element loaded rather than once per product), then multiply the tiles from
registers, TM x TN outputs per thread, in fp32 FFMA. The epilogue (bias, activation, scaling, the
output's type) is the model's store value; every expression is written from the model, never from
the kernel's text, so any spelling of a convolution gets the same kernel.

Each output's sum starts from the model's seed and adds its terms in the original's order of k
(one multiply-add each), so results match the original where it contracts `acc += a * b` into an
FMA (nvcc does by default) — except where A's elements are consecutive along some coordinates of
k and not along m (a convolution's weights summed with the input channel innermost): K then runs
in A's memory order and the threads load A's tile along k, a sector for 8 elements rather than
one each (`_along_a`; the sum's rounding then differs from the original's, within the spec's
tolerance). Tiles of 256 threads are bounded to 128 registers (two blocks an SM).

Nothing is proposed where the reading does not apply, where the plain contraction reading
(contraction_tiling, gemm_tiling) does, or where tiles would not pay: M (the outputs that share an
element of B: a convolution's output channels per group) under 8, as in a depthwise convolution,
where the reading finds no M at all; N under 32; K under 8.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from optiml.lift import Lifted, lift
from optiml.lift.coords import Mono
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import Affine, affine
from optiml.lift.implicit import Coord, Implicit, Launched, NotImplicit, implicit
from optiml.lift.model import (
    INTS,
    TRUE,
    Binary,
    Cast,
    Expr,
    Load,
    Loop,
    LoopOut,
    Select,
    Var,
    walk_expr,
)
from optiml.lift.ranges import Env, interval
from optiml.search.catalog import contraction_tiling
from optiml.search.catalog._gemm import match, render
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation

# Where tiles stop paying: each element of B serves M outputs of a tile (a depthwise convolution
# has M = 1), each element of A serves N; a K this short leaves the element evaluations to dominate.
# M = 8 (KernelBench's grouped transposed 3-D convolution, 8 output channels a group) fills half
# of a 16-row tile: its plain kernel ran 9.3x slower than PyTorch eager on an H100, a thread per
# output reading every element of its window from memory (kb-72-74-76-h100.json).
MIN_M, MIN_N, MIN_K = 8, 32, 8
INT_MAX = 2**31 - 1
MAX_GRID_YZ = 65535
# The judge runs proposals at sizes past the spec's (up to 1.5 times its largest work): integer
# arithmetic is kept in 32 bits, and extents in the grid's y and z, only where every size of the
# spec leaves this factor of room.
HEADROOM = 8


class _NoPlan(Exception):
    pass


@dataclass(frozen=True)
class Config:
    """A block tile of BM x BN outputs in K steps of BK, TM x TN outputs per thread."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def params(self) -> dict[str, int]:
        return {
            "bm": self.bm,
            "bn": self.bn,
            "bk": self.bk,
            "tm": self.tm,
            "tn": self.tn,
            "threads": self.threads,
        }

    @property
    def smem_bytes(self) -> int:
        return 2 * self.bk * (self.bm + self.bn + 2 * PAD) * 4


# The tiles' shared rows are padded by this many floats: a tile loaded along k (`_k_major`) stores
# a warp's 8 k x 4 rows to 32 distinct banks; a multiple of 4 keeps the rows' float4 reads
# aligned.
PAD = 4
# The threads an SM is asked to hold at once (`__launch_bounds__`' minimum blocks): 65536
# registers over 512 threads leave 128 a thread.
REGISTER_THREADS = 512


# (config, weight): the weight is the schedule's preference where M fills the tile; a tile taller
# than M (rounded up to 16) is not proposed, and the weight is scaled by the share of the tile's
# rows that hold outputs.
CONFIGS = [
    (Config(128, 128, 8, 8, 8), 1.0),
    (Config(64, 128, 8, 8, 8), 0.95),
    (Config(64, 64, 8, 4, 4), 0.8),
    (Config(32, 128, 8, 4, 8), 0.75),
    (Config(16, 128, 8, 4, 4), 0.7),
]
PROPOSED = 3


class ImplicitGemm(Transformation):
    name = "implicit_gemm"
    addresses = frozenset({"l1_shared", "l2", "dram", "uncoalesced", "compute", "latency"})
    description = (
        "implicit GEMM from the lifted model: convolutions (any dimension, stride, dilation, "
        "padding, groups, transposed) and other sums of products of guarded expressions, tiled "
        "through shared memory with register-blocked FFMA"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            return _propose(ctx)
        except (_NoPlan, NotImplicit, NotEmittable, KeyError, ValueError, ZeroDivisionError):
            return []


def read(ctx: Context) -> tuple[Lifted, Implicit] | None:
    """The kernel's implicit GEMM, or None where the reading does not apply."""
    lifted = lift(ctx.source, ctx.kernel, ctx.spec)
    if not isinstance(lifted, Lifted):
        return None
    try:
        return lifted, implicit(lifted, grid_extents(ctx))
    except NotImplicit:
        return None


def why_not(ctx: Context) -> str | None:
    """Why nothing is proposed for the kernel (None where something is)."""
    try:
        _propose(ctx)
        return None
    except (_NoPlan, NotImplicit, NotEmittable, KeyError, ValueError) as e:
        return str(e) or type(e).__name__


def _propose(ctx: Context) -> list[Rewrite]:
    lifted = lift(ctx.source, ctx.kernel, ctx.spec)
    if not isinstance(lifted, Lifted):
        raise _NoPlan("the kernel does not lift: " + lifted.message())
    imp = implicit(lifted, grid_extents(ctx))
    if contraction_tiling.read(ctx) is not None or match(ctx.ast) is not None:
        raise _NoPlan("a plain contraction: contraction_tiling's or gemm_tiling's")
    sizes = _sizes(ctx, lifted, imp)
    m_main, n_main, k_main = sizes[0][:3]
    if m_main < MIN_M:
        raise _NoPlan(f"M = {m_main} (the outputs that share an element of B): tiles do not pay")
    if n_main < MIN_N:
        raise _NoPlan(f"N = {n_main}: tiles do not pay")
    if k_main < MIN_K:
        raise _NoPlan(f"K = {k_main}: tiles do not pay")
    envs = [env for *_, env in sizes]
    _prove_in_bounds(ctx, lifted, imp, envs)
    imp = _along_a(imp, envs[0].values)

    out = []
    for config, weight in _ranked(sizes):
        text = _kernel(ctx, lifted, imp, config, envs)
        grid = [f"cdiv({_text(imp.n)}, {config.bn})", f"cdiv({_text(imp.m)}, {config.bm})"]
        if imp.batch:
            grid.append(_text(imp.batch))
        variant = ctx.rewrite(text, launch=(grid, [str(config.threads)], "0"))
        summary = (
            f"implicit GEMM from the lifted model: {config.bm}x{config.bn}x{config.bk} tiles of "
            f"M = {_text(imp.m)} by N = {_text(imp.n)} over K = {_text(imp.k)}, "
            f"{config.tm}x{config.tn} FFMA per thread "
            f"({config.threads} threads); A = {', '.join(imp.a_tensors)}, B = "
            f"{', '.join(imp.b_tensors)} evaluated into shared memory"
            + (f", batch {_text(imp.batch)} on blockIdx.z" if imp.batch else "")
        )
        out.append(Rewrite(config.params, summary, variant, weight))
    if not out:
        raise _NoPlan("no tile fits")
    return out


def _ranked(sizes: list[tuple]) -> list[tuple[Config, float]]:
    """The configs to propose, best first: those no taller than M (rounded up to 16), their
    weights scaled by the share of the tiles' rows that hold outputs at the main size."""
    m_main = sizes[0][0]
    ranked = []
    for config, weight in CONFIGS:
        if config.bm > -(-m_main // 16) * 16:
            continue
        if any(HEADROOM * -(-m // config.bm) > MAX_GRID_YZ for m, *_ in sizes):
            continue
        if config.smem_bytes > STATIC_SMEM:
            continue
        used = m_main / (-(-m_main // config.bm) * config.bm)
        ranked.append((config, weight * used))
    ranked.sort(key=lambda t: -t[1])
    return ranked[:PROPOSED]


# ---- the order of k ---------------------------------------------------------------------------


def _strides(factor: Expr, coord: Coord, values: dict[str, float]) -> list[int | None]:
    """For each load of `factor`, how far its address moves when `coord` steps by one (None where
    its index is not affine)."""
    key = f"{coord.var.name}#{coord.var.uid}"
    out: list[int | None] = []
    for ld in (x for x in walk_expr(factor) if isinstance(x, Load)):
        f = affine(ld.index)
        if f is None:
            out.append(None)
            continue
        step = 0
        for mono, coef in f.items():
            if key in mono:
                rest = [a for a in mono if a != key]
                if len(rest) + 1 != len(mono) or any(a not in values for a in rest):
                    step = None
                    break
                term = coef
                for a in rest:
                    term *= int(values[a])
                step += term
        out.append(step)
    return out


def _along(factor: Expr, coord: Coord, values: dict[str, float]) -> bool:
    """Whether every load of `factor` moves by one element as `coord` steps."""
    strides = _strides(factor, coord, values)
    return bool(strides) and all(st == 1 for st in strides)


def _along_a(imp: Implicit, values: dict[str, float]) -> Implicit:
    """K's coordinates in the order of A's memory (the one A's loads step through by one element
    first, then by their strides) where that makes A's tile a run of consecutive elements along k
    and it does not lie so along m: a convolution's weights [out][in][kh][kw] summed with the input
    channel fastest are read 4 bytes of every sector, one sector per output channel; in their own
    order a warp's loads take 4 sectors. The sum then adds its terms in that order (its rounding
    differs from the original's, within the spec's tolerance); elsewhere the original's order."""
    if not imp.m or _along(imp.a, imp.m[0], values):
        return imp

    def key(c: Coord) -> int:
        steps = _strides(imp.a, c, values)
        if any(st is None for st in steps):
            return INT_MAX
        return min((abs(st) for st in steps if st), default=INT_MAX)

    order = tuple(sorted(imp.k, key=key))
    if order == imp.k or not _along(imp.a, order[0], values):
        return imp
    return replace(imp, k=order)


def _k_major(imp: Implicit, side: str, values: dict[str, float]) -> bool:
    """Whether the side's tile is loaded along k (threads on consecutive k): its loads step by one
    element along k's fastest coordinate and not along the side's own fastest."""
    factor, coords = (imp.a, imp.m) if side == "a" else (imp.b, imp.n)
    return (
        bool(imp.k and coords)
        and _along(factor, imp.k[0], values)
        and not _along(factor, coords[0], values)
    )


# ---- sizes ----------------------------------------------------------------------------------


def _product(coords: tuple[Coord, ...]) -> Affine:
    out: Affine = {(): 1}
    for c in coords:
        nxt: Affine = {}
        for m1, c1 in out.items():
            for m2, c2 in c.extent.items():
                key = tuple(sorted(m1 + m2))
                nxt[key] = nxt.get(key, 0) + c1 * c2
        out = {m: v for m, v in nxt.items() if v}
    return out


def _value(f: Affine, values: dict[str, float]) -> int:
    total = 0
    for mono, coef in f.items():
        term = coef
        for a in mono:
            v = values[a]
            if v != int(v):
                raise _NoPlan(f"`{a}` is not an integer")
            term *= int(v)
        total += term
    return total


def grid_extents(ctx: Context) -> dict[str, Mono]:
    """The launch's grid along y and z where it is a product of the kernel's integer parameters
    and constants (the extent of a coordinate a kernel takes as blockIdx alone)."""
    params = {p.name for p in ctx.kernel.params}
    out: dict[str, Mono] = {}
    for d, text in zip("yz", ctx.spec.launch.grid[1:], strict=False):
        coef, names = 1, []
        try:
            nodes = [ast.parse(str(text), mode="eval").body]
        except SyntaxError:
            continue
        ok = True
        while nodes and ok:
            n = nodes.pop()
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
                nodes += [n.left, n.right]
            elif isinstance(n, ast.Constant) and isinstance(n.value, int):
                coef *= n.value
            elif isinstance(n, ast.Name) and n.id in params:
                names.append(n.id)
            else:
                ok = False
        if ok:
            out[d] = (coef, tuple(sorted(names)))
    return out


def uncovered(launch: dict[str, Launched], case, values: dict[str, float]) -> str | None:
    """Why the original launch at `case` does not run a thread for every output as the reading
    takes them (None where it does): along each dimension the kernel indexes, its grid and block
    cover the bound (blockIdx alone: one thread a block); no threads along the others."""
    for i, d in enumerate("xyz"):
        how = launch.get(d)
        if how is None:
            if (case.grid[i], case.block[i]) != (1, 1):
                return "threads along a dimension the output does not use"
            continue
        if how.block is not None and how.block != case.block[i]:
            return "a block size the kernel spells differs from the launch's"
        if how.kind == "block" and case.block[i] != 1:
            return f"threads along {d} compute the same outputs"
        if case.grid[i] * case.block[i] < _value({how.total[1]: how.total[0]}, values):
            return f"the launch does not cover the output along {d}"
    return None


def _sizes(ctx: Context, lifted: Lifted, imp: Implicit) -> list[tuple[int, int, int, int, Env]]:
    """(M, N, K, batch, the ranges' environment) at every size of the spec, where the original
    launch runs a thread for every output (a flat 1-D grid that covers the guard's bound) and
    every index fits the tile's 32-bit arithmetic."""
    out = []
    for case in ctx.spec.cases():
        env = Env.of(lifted, ctx.spec, case)
        values = env.values
        why = uncovered(imp.launch, case, values)
        if why:
            raise _NoPlan(why)
        facts = {}
        for c in imp.coords:
            start, extent = _value(c.start, values), _value(c.extent, values)
            if extent <= 0:
                raise _NoPlan("an empty coordinate")
            facts[c.var] = (float(start), float(start + extent - 1))
        m, n, k, z = (_value(_product(x), values) for x in (imp.m, imp.n, imp.k, imp.batch))
        if HEADROOM * max(m, n, k) > INT_MAX or HEADROOM * z > MAX_GRID_YZ:
            raise _NoPlan("an extent too close to the grid's or a 32-bit index's range")
        env.facts = facts
        out.append((m, n, k, z, env))
    return out


def _prove_in_bounds(ctx: Context, lifted: Lifted, imp: Implicit, envs: list[Env]) -> None:
    """The loads a factor now makes where the original made them only under a condition (moved to
    the other factor) lie inside their tensors at every size."""
    for side, loads in imp.unguarded.items():
        for ld in loads:
            if any(isinstance(x, Var) and x not in envs[0].facts for x in walk_expr(ld.index)):
                raise _NoPlan(f"{ld.tensor}: a load moved out of its guard reads a loop's value")
            for env, case in zip(envs, ctx.spec.cases(), strict=True):
                lo, hi = interval(ld.index, env)
                if not (lo >= 0 and hi <= case.lengths[ld.tensor] - 1):
                    raise _NoPlan(
                        f"{ld.tensor}: factor {side.upper()} would read it where the original "
                        "does not, and its index is not proven in bounds"
                    )


def _text(coords: tuple[Coord, ...]) -> str:
    """The product of the coordinates' extents, slowest first, as C and spec text."""
    parts = [render(c.extent) for c in reversed(coords)]
    return " * ".join(p if " " not in p else f"({p})" for p in parts) or "1"


# ---- the kernel -----------------------------------------------------------------------------


class _Emitter(CEmitter):
    """The model's expressions with coordinates and loop values by the schedule's names; integer
    arithmetic in 32 bits where every size of the spec keeps it (and each step of it) within
    int's range, else in 64 bits."""

    def __init__(self, names: dict[int, str], envs: list[Env]):
        super().__init__(dict(names))
        self.envs = envs
        self._fits: dict = {}

    def fits(self, e: Expr) -> bool:
        if e not in self._fits:
            ok = all(
                HEADROOM * lo >= -(2**31) and HEADROOM * hi <= INT_MAX
                for lo, hi in (interval(e, env) for env in self.envs)
            )
            if ok and isinstance(e, Binary):
                ok = all(self.fits(x) for x in (e.a, e.b) if x.type in INTS)
            if ok and isinstance(e, Cast) and e.a.type in INTS:
                ok = self.fits(e.a)
            self._fits[e] = ok
        return self._fits[e]

    def expr(self, e: Expr) -> str:
        if (
            isinstance(e, Binary)
            and e.type in INTS
            and e.type != "bool"
            and e.op in ("+", "-", "*", "/", "%")
        ):
            a, b = self.expr(e.a), self.expr(e.b)
            if self.fits(e):
                return f"({a} {e.op} {b})"
            return f"((long long){a} {e.op} (long long){b})"
        if isinstance(e, Cast) and e.type in INTS and e.a.type in INTS:
            return (
                self.expr(e.a) if self.fits(e.a) or e.type != "int" else f"((int){self.expr(e.a)})"
            )
        return super().expr(e)


class _Writer:
    """The new kernel's body, line by line."""

    def __init__(self, imp: Implicit, envs: list[Env], lifted: Lifted):
        self.imp = imp
        self.envs = envs
        self.lifted = lifted
        self.lines: list[str] = []
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"optiml_{stem}{self.count}"

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def decompose(self, coords: tuple[Coord, ...], flat: str, depth: int) -> dict[int, str]:
        """Declarations of `coords` (fastest first) taken back from the flat index `flat`: C names
        by Var uid."""
        names: dict[int, str] = {}
        if not coords:
            return names
        rest = self.fresh("t")
        self.emit(f"int {rest} = {flat};", depth)
        for i, c in enumerate(coords):
            name = self.fresh("c")
            names[c.var.uid] = name
            start = f"{render(c.start)} + " if c.start else ""
            if i + 1 < len(coords):
                ext = f"({render(c.extent)})"
                self.emit(f"const int {name} = {start}{rest} % {ext};", depth)
                self.emit(f"{rest} /= {ext};", depth)
            else:
                self.emit(f"const int {name} = {start}{rest};", depth)
        return names

    def value(self, em: _Emitter, e: Expr, depth: int) -> str:
        """`e` as C, the loops whose values it reads written first as statements."""
        for loop in _loops_read(e, self.imp.loop.uid):
            self.loop(em, loop, depth)
        return em.expr(e)

    def loop(self, em: _Emitter, loop: Loop, depth: int) -> None:
        if loop.body or loop.guard != TRUE:
            raise NotEmittable("a factor's loop that stores or runs under a condition")
        names = {}
        for c in loop.carried:
            names[c.var.uid] = self.fresh("v")
        for c in loop.carried:
            init = self.value(em, c.init, depth)
            self.emit(f"{C_TYPES[c.var.type]} {names[c.var.uid]} = {init};", depth)
        em.names.update(names)
        if _loops_read(loop.cond, self.imp.loop.uid):
            raise NotEmittable("a loop condition that reads a loop's value")
        self.emit(f"while ({em.expr(loop.cond)}) {{", depth)
        temps = []
        for c in loop.carried:
            text = self.value(em, c.update, depth + 1)
            tmp = self.fresh("u")
            self.emit(f"const {C_TYPES[c.var.type]} {tmp} = {text};", depth + 1)
            temps.append((names[c.var.uid], tmp))
        for name, tmp in temps:
            self.emit(f"{name} = {tmp};", depth + 1)
        self.emit("}", depth)


def _loops_read(e: Expr, skip: int) -> list[Loop]:
    """The loops whose results `e` reads (outside loops of its own), each once, in order, but
    the loop `skip` (the sum, whose value is the accumulators)."""
    found: dict[int, Loop] = {}
    for x in walk_expr(e, into_loops=False):
        if isinstance(x, LoopOut) and x.loop.uid != skip:
            found.setdefault(x.loop.uid, x.loop)
    for x in walk_expr(e, into_loops=False):
        # a loop's value under a select would be computed where the original does not compute it
        if isinstance(x, Select) and any(
            isinstance(y, LoopOut) and y.loop.uid in found
            for b in (x.a, x.b)
            for y in walk_expr(b, into_loops=False)
        ):
            raise NotEmittable("a loop's value under a condition")
    return list(found.values())


def _kernel(ctx: Context, lifted: Lifted, imp: Implicit, cfg: Config, envs: list[Env]) -> str:
    bm, bn, bk, tm, tn, threads = cfg.bm, cfg.bn, cfg.bk, cfg.tm, cfg.tn, cfg.threads
    w = _Writer(imp, envs, lifted)
    out_type = lifted.tensors[imp.store.tensor].dtype
    acc_name = "optiml_acc[optiml_i][optiml_j]"

    m_text, n_text, k_text = (_text(x) for x in (imp.m, imp.n, imp.k))
    w.emit("{", 0)
    w.emit(
        f"// Implicit GEMM from the lifted model: {imp.store.tensor} = epilogue(sum over k of "
        f"A[m, k] * B[k, n]), A from {', '.join(imp.a_tensors)}, B from "
        f"{', '.join(imp.b_tensors)};",
        1,
    )
    w.emit(
        f"// M = {m_text}, N = {n_text}, K = {k_text}"
        + (f", batch {_text(imp.batch)} on blockIdx.z" if imp.batch else "")
        + f". {bm} x {bn} tiles in K steps of {bk}, {tm} x {tn} outputs per thread.",
        1,
    )
    am, an = bm + PAD, bn + PAD
    w.emit(f"__shared__ float4 optiml_smem[2 * {bk} * ({am} + {an}) / 4];", 1)
    w.emit(
        f"float (*optiml_sa)[{bk}][{am}] = reinterpret_cast<float (*)[{bk}][{am}]>(optiml_smem);",
        1,
    )
    w.emit(
        f"float (*optiml_sb)[{bk}][{an}] = reinterpret_cast<float (*)[{bk}][{an}]>("
        f"optiml_smem + 2 * {bk} * {am} / 4);",
        1,
    )
    w.emit(f"const int optiml_M = {m_text};", 1)
    w.emit(f"const int optiml_N = {n_text};", 1)
    w.emit(f"const int optiml_K = {k_text};", 1)
    w.emit("const int optiml_tid = threadIdx.x;", 1)
    w.emit(f"const int optiml_m0 = blockIdx.y * {bm}, optiml_n0 = blockIdx.x * {bn};", 1)
    w.emit(
        f"const int optiml_tm = optiml_tid / {bn // tn}, optiml_tn = optiml_tid % {bn // tn};", 1
    )
    batch = w.decompose(imp.batch, "blockIdx.z", 1)

    # the tile loaders: each thread's rows (columns) of A (B) and its k rows of each
    loaders = []
    values = envs[0].values

    def position(side: str, x: str, coords: tuple[Coord, ...], ext_name: str) -> tuple:
        """A row (column) of the side's tile this thread loads: its index in the tile, whether it
        lies inside the problem, and its coordinates' names."""
        xname = w.fresh(f"{side}x")
        w.emit(f"const int {xname} = {x};", 1)
        flat = w.fresh(f"{side}flat")
        w.emit(f"const int {flat} = optiml_{'m' if side == 'a' else 'n'}0 + {xname};", 1)
        ok = w.fresh(f"{side}ok")
        w.emit(f"const bool {ok} = {flat} < {ext_name};", 1)
        return xname, ok, w.decompose(coords, f"({ok} ? {flat} : 0)", 1)

    for side, coords, extent, ext_name, factor in (
        ("a", imp.m, bm, "optiml_M", imp.a),
        ("b", imp.n, bn, "optiml_N", imp.b),
    ):
        if _k_major(imp, side, values) and threads % bk == 0 and extent % (threads // bk) == 0:
            # threads on consecutive k, each at extent / (threads / bk) rows of the side
            across = threads // bk
            kk0 = w.fresh(f"{side}k")
            w.emit(f"const int {kk0} = optiml_tid % {bk};", 1)
            pos = [
                position(side, f"optiml_tid / {bk} + {p * across}", coords, ext_name)
                for p in range(extent // across)
            ]
            loaders.append((side, factor, pos, [kk0]))
            continue
        positions = max(1, extent // threads)
        rows = extent * bk // threads // positions
        if threads >= extent:
            assert threads % extent == 0 and bk % (threads // extent) == 0
        else:
            assert extent % threads == 0
        pos = []
        for p in range(positions):
            x = (
                f"optiml_tid % {extent}"
                if threads >= extent
                else f"optiml_tid + {p} * (int)blockDim.x"
            )
            pos.append(position(side, x, coords, ext_name))
        if threads >= extent:
            kk0 = w.fresh(f"{side}k")
            w.emit(f"const int {kk0} = optiml_tid / {extent};", 1)
            step = threads // extent
            krow = [f"{kk0} + {r * step}" for r in range(rows)]
        else:
            krow = [str(r) for r in range(rows)]
        loaders.append((side, factor, pos, krow))

    # K's coordinates, taken back from k once per K tile into shared memory (a row per k of the
    # tile) rather than once per element loaded
    table = len(imp.k) > 1
    if table:
        w.emit(f"__shared__ int optiml_kt[2][{bk}][{len(imp.k)}];", 1)

    def fill(k0: str, buf: str, depth: int) -> None:
        if not table:
            return
        w.emit(f"if (optiml_tid < {bk}) {{", depth)
        names = w.decompose(imp.k, f"{k0} + optiml_tid", depth + 1)
        for i, c in enumerate(imp.k):
            w.emit(f"optiml_kt[{buf}][optiml_tid][{i}] = {names[c.var.uid]};", depth + 1)
        w.emit("}", depth)

    def k_names(k: str, buf: str, kk: str, depth: int) -> dict[int, str]:
        if not table:
            return w.decompose(imp.k, k, depth)
        names = {}
        for i, c in enumerate(imp.k):
            names[c.var.uid] = w.fresh("c")
            w.emit(f"const int {names[c.var.uid]} = optiml_kt[{buf}][{kk}][{i}];", depth)
        return names

    def load(k0: str, buf: str, depth: int) -> None:
        for side, factor, pos, krow in loaders:
            for p, (_, ok, names) in enumerate(pos):
                for r, kk in enumerate(krow):
                    reg = f"optiml_r{side}[{p * len(krow) + r}]"
                    w.emit("{", depth)
                    k = w.fresh("k")
                    w.emit(f"const int {k} = {k0} + {kk};", depth + 1)
                    w.emit("float optiml_v = 0.0f;", depth + 1)
                    w.emit(f"if ({ok} && {k} < optiml_K) {{", depth + 1)
                    knames = k_names(k, buf, kk, depth + 2)
                    em = _Emitter({**names, **batch, **knames}, envs)
                    text = w.value(em, factor, depth + 2)
                    w.emit(f"optiml_v = {text};", depth + 2)
                    w.emit("}", depth + 1)
                    w.emit(f"{reg} = optiml_v;", depth + 1)
                    w.emit("}", depth)

    def store(buf: str, depth: int) -> None:
        for side, _, pos, krow in loaders:
            for p, (xname, _, _) in enumerate(pos):
                for r, kk in enumerate(krow):
                    w.emit(
                        f"optiml_s{side}[{buf}][{kk}][{xname}] = optiml_r{side}[{p * len(krow) + r}];",
                        depth,
                    )

    def outputs(body, depth: int) -> None:
        """`body(depth)` for each of the thread's outputs inside the problem, its coordinates
        declared (optiml_i, optiml_j index the accumulators)."""
        w.emit("#pragma unroll", depth)
        w.emit(f"for (int optiml_j = 0; optiml_j < {tn}; ++optiml_j) {{", depth)
        n = w.fresh("n")
        w.emit(
            f"const int {n} = optiml_n0 + optiml_j / 4 * {4 * (bn // tn)} + optiml_tn * 4 + "
            "optiml_j % 4;",
            depth + 1,
        )
        w.emit(f"if ({n} < optiml_N) {{", depth + 1)
        nnames = w.decompose(imp.n, n, depth + 2)
        w.emit("#pragma unroll", depth + 2)
        w.emit(f"for (int optiml_i = 0; optiml_i < {tm}; ++optiml_i) {{", depth + 2)
        m = w.fresh("m")
        w.emit(f"const int {m} = optiml_m0 + optiml_tm * {tm} + optiml_i;", depth + 3)
        w.emit(f"if ({m} < optiml_M) {{", depth + 3)
        mnames = w.decompose(imp.m, m, depth + 4)
        body({**nnames, **mnames, **batch}, depth + 4)
        w.emit("}", depth + 3)
        w.emit("}", depth + 2)
        w.emit("}", depth + 1)
        w.emit("}", depth)

    w.emit(f"float optiml_acc[{tm}][{tn}];", 1)
    w.emit("#pragma unroll", 1)
    w.emit(f"for (int optiml_i = 0; optiml_i < {tm}; ++optiml_i) {{", 1)
    w.emit("#pragma unroll", 2)
    w.emit(
        f"for (int optiml_j = 0; optiml_j < {tn}; ++optiml_j) optiml_acc[optiml_i][optiml_j] = 0.0f;",
        2,
    )
    w.emit("}", 1)
    if imp.seed is not None:

        def seed(names: dict[int, str], depth: int) -> None:
            em = _Emitter(names, envs)
            text = w.value(em, imp.seed, depth)
            w.emit(f"{acc_name} = {text};", depth)

        w.emit("// each sum starts from the model's initial value, as the original's does", 1)
        outputs(seed, 1)

    pa = len(loaders[0][2]) * len(loaders[0][3])
    pb = len(loaders[1][2]) * len(loaders[1][3])
    w.emit(f"float optiml_ra[{pa}], optiml_rb[{pb}];", 1)
    if table:
        fill("0", "0", 1)
        w.emit("__syncthreads();", 1)
    load("0", "0", 1)
    w.emit(f"const int optiml_tiles = (optiml_K + {bk - 1}) / {bk};", 1)
    w.emit("for (int optiml_t = 0; optiml_t < optiml_tiles; ++optiml_t) {", 1)
    w.emit("const int optiml_buf = optiml_t & 1;", 2)
    store("optiml_buf", 2)
    # the next tile's k coordinates go to the table's other half, last read before the previous
    # barrier; the barrier makes both the stored tile and them visible
    fill(f"(optiml_t + 1) * {bk}", "optiml_buf ^ 1", 2)
    w.emit("__syncthreads();", 2)
    w.emit("if (optiml_t + 1 < optiml_tiles) {", 2)
    load(f"(optiml_t + 1) * {bk}", "optiml_buf ^ 1", 3)
    w.emit("}", 2)
    w.emit("#pragma unroll", 2)
    w.emit(f"for (int optiml_kk = 0; optiml_kk < {bk}; ++optiml_kk) {{", 2)
    w.emit(f"float optiml_fa[{tm}], optiml_fb[{tn}];", 3)
    for q in range(tm // 4):
        w.emit(
            f"const float4 optiml_a{q} = *reinterpret_cast<const float4*>("
            f"&optiml_sa[optiml_buf][optiml_kk][optiml_tm * {tm} + {4 * q}]);",
            3,
        )
        w.emit(
            f"optiml_fa[{4 * q}] = optiml_a{q}.x; optiml_fa[{4 * q + 1}] = optiml_a{q}.y; "
            f"optiml_fa[{4 * q + 2}] = optiml_a{q}.z; optiml_fa[{4 * q + 3}] = optiml_a{q}.w;",
            3,
        )
    for q in range(tn // 4):
        w.emit(
            f"const float4 optiml_b{q} = *reinterpret_cast<const float4*>("
            f"&optiml_sb[optiml_buf][optiml_kk][{q * 4 * (bn // tn)} + optiml_tn * 4]);",
            3,
        )
        w.emit(
            f"optiml_fb[{4 * q}] = optiml_b{q}.x; optiml_fb[{4 * q + 1}] = optiml_b{q}.y; "
            f"optiml_fb[{4 * q + 2}] = optiml_b{q}.z; optiml_fb[{4 * q + 3}] = optiml_b{q}.w;",
            3,
        )
    w.emit("#pragma unroll", 3)
    w.emit(f"for (int optiml_i = 0; optiml_i < {tm}; ++optiml_i) {{", 3)
    w.emit("#pragma unroll", 4)
    w.emit(f"for (int optiml_j = 0; optiml_j < {tn}; ++optiml_j)", 4)
    w.emit("optiml_acc[optiml_i][optiml_j] += optiml_fa[optiml_i] * optiml_fb[optiml_j];", 5)
    w.emit("}", 3)
    w.emit("}", 2)
    w.emit("}", 1)

    def epilogue(names: dict[int, str], depth: int) -> None:
        em = _Emitter({**names, imp.acc.var.uid: acc_name}, envs)
        value = w.value(em, imp.store.value, depth)
        if imp.store.value.type != out_type:
            value = em.cast(value, imp.store.value.type, out_type)
        index = em.expr(imp.store.index)
        w.emit(f"{imp.store.tensor}[{index}] = {value};", depth)

    outputs(epilogue, 1)
    w.emit("}", 0)
    # a block of 256 threads at most 128 registers a thread, two blocks an SM (a 128 x 128 tile of
    # 8 x 8 a thread took 141 registers, one block of 8 warps an SM; 127 at this bound, without
    # spills); 128-thread tiles keep theirs (at 128, KernelBench 50's 64 x 128 spilled 40 bytes)
    min_blocks = max(1, REGISTER_THREADS // threads) if threads >= 256 else 1
    return contraction_tiling.head(ctx, threads, min_blocks) + "\n".join(w.lines)
