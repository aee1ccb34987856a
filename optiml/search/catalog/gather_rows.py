"""A gather by rows scheduled from the lifted model (optiml.lift): for a kernel whose model is one
thread per output element, `g = blockIdx.x * blockDim.x + threadIdx.x` guarded by `g < N`, that
reads a row number from memory at `g / D` (an embedding lookup, `index_select`, plus any other
rows or maps such as a position embedding), each row of D elements goes to a warp: the model's
`g / D` is the warp's row and `g % D` its lanes' column, the row number loaded once per row, the
lanes striding over the row with 16-byte loads and stores where every address of the row allows
(checked at run time per row), element by element otherwise. The values, indices and types are
the model's, written back by optiml.lift.emit with `g` rewritten as `row * D + col`, so the result
is the original's whatever the spelling.
"""

from __future__ import annotations

from dataclasses import fields, replace

from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import affine, describe, global_indices
from optiml.lift.model import (
    LONG,
    Binary,
    Builtin,
    Load,
    LoopOut,
    Select,
    Store,
    Var,
    children,
    merge_complementary,
    walk_expr,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.column_reduce import _SIZES, _VECTOR
from optiml.search.catalog.warp_rows import _check_launch, _NoPlan

THREADS = (256, 128)


class GatherRows(Transformation):
    name = "gather_rows"
    addresses = frozenset({"dram", "uncoalesced", "latency", "l2", "l1_shared"})
    description = "a gather by rows from the lifted model: a warp per row, the row number loaded once, 16-byte copies"

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted) or describe(lifted, ctx.spec).family != "gather":
                return []
            writer = _Writer(lifted)
            body = writer.write()
            rows = f"cdiv({writer.total}, {writer.length})"
            _check_launch(ctx, writer.total)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        out = []
        for threads in THREADS:
            variant = ctx.rewrite(
                head + body, launch=([f"cdiv({rows}, {threads // 32})"], [str(threads)], "0")
            )
            summary = (
                f"gather by rows from the lifted model: a warp per row of {writer.length} "
                f"({threads // 32} rows per block), the row number loaded once"
                + (f", {writer.width}-element vector copies" if writer.width > 1 else "")
            )
            out.append(
                Rewrite(
                    {"threads": threads, "vector": writer.width},
                    summary,
                    variant,
                    1.0 if threads == 256 else 0.8,
                )
            )
        return out


ROW = Var("optiml_row", LONG)
COL = Var("optiml_col", LONG)


def _is_gx(e) -> bool:
    if e.type not in ("int", "long"):
        return False
    f = affine(e)
    return f is not None and global_indices(f) == {("g.x",): 1}


def _substitute(e, length):
    """`e` with the thread's `g / length` as the row, `g % length` as the column and `g` as
    `row * length + col`: the same value for every thread."""
    if isinstance(e, Binary) and e.op in ("/", "%") and e.b == length and _is_gx(e.a):
        return ROW if e.op == "/" else COL
    if _is_gx(e):
        return Binary("+", Binary("*", ROW, length, LONG), COL, LONG)
    if isinstance(e, LoopOut | Var):
        raise _NoPlan("a loop")
    changes = {}
    for f in fields(e):
        v = getattr(e, f.name)
        if isinstance(v, tuple) and f.name == "args":
            changes[f.name] = tuple(_substitute(x, length) for x in v)
        elif f.name in ("index", "a", "b", "cond"):
            changes[f.name] = _substitute(v, length)
    return replace(e, **changes) if changes else e


class _Writer:
    def __init__(self, lifted: Lifted):
        self.m = lifted
        self.names = {ROW.uid: "optiml_row", COL.uid: "optiml_col"}
        self.width = 1

    def write(self) -> str:
        stores = merge_complementary(list(self.m.body))
        if not stores or not all(isinstance(s, Store) and not s.atomic for s in stores):
            raise _NoPlan("a loop, or an atomic")
        guard = stores[0].guard
        if any(s.guard != guard for s in stores):
            raise _NoPlan("stores under different conditions")
        if not (isinstance(guard, Binary) and guard.op == "<" and _is_gx(guard.a)):
            raise _NoPlan("not `g < N`")
        if any(isinstance(x, Builtin) for x in walk_expr(guard.b)):
            raise _NoPlan("a bound that moves with the thread")
        length = self._row_length(stores)
        c = CEmitter(self.names)
        self.total = c.expr(guard.b)
        self.length = c.expr(length)
        stores = [
            Store(
                s.tensor,
                _substitute(s.index, length),
                _substitute(s.value, length),
                s.guard,
                s.op,
                s.atomic,
                s.line,
            )
            for s in stores
        ]
        lines = [
            "{",
            "    const int optiml_lane = threadIdx.x & 31;",
            "    const long long optiml_row = (long long)blockIdx.x * (blockDim.x >> 5) + "
            "(threadIdx.x >> 5);",
            f"    const long long optiml_n = {self.total};",
            f"    const long long optiml_len = {self.length};",
            "    if (optiml_row * optiml_len >= optiml_n) return;  // the row is the warp's",
        ]
        # what depends on the row alone (the row number read from memory), once per row
        hoisted: dict = {}
        for s in stores:
            for x in _unconditional(s.value):
                if isinstance(x, Load) and _row_only(x) and x not in hoisted:
                    hoisted[x] = f"optiml_h{len(hoisted)}"
        # a gather by rows reads its row number once per row: where every row number read from
        # memory moves with the column (torch.gather along a dimension), each element goes its
        # own way and the map's schedules are the ones that fit
        indirect = [
            y
            for s in stores
            for y in walk_expr(s.value, into_loops=False)
            if isinstance(y, Load) and any(isinstance(z, Load) for z in walk_expr(y.index))
        ]
        if not any(x in walk_expr(y.index) for y in indirect for x in hoisted):
            raise _NoPlan("no row number read once per row")
        for x, name in hoisted.items():
            lines.append(f"    const {C_TYPES[x.type]} {name} = {c.expr(x)};")
        body = _Hoisted(self.names, hoisted)
        vector = self._vector(stores)
        guard_at = "optiml_row * optiml_len + optiml_col < optiml_n"
        if vector:
            v = self.width
            checks = [f"optiml_len % {v} == 0", "(optiml_row + 1) * optiml_len <= optiml_n"]
            row_start = _Hoisted({**self.names, COL.uid: "0LL"}, hoisted)
            for x in vector:
                checks.append(f"({row_start.expr(x.index)}) % {v} == 0")
                checks.append(f"((unsigned long long){x.tensor}) % {v * self._size(x)} == 0")
            vector = [x for x in vector if isinstance(x, Load)]
            lines.append(f"    if ({' && '.join(checks)}) {{")
            lines.append(
                f"        for (long long optiml_c0 = optiml_lane * {v}; optiml_c0 < optiml_len; "
                f"optiml_c0 += {32 * v}) {{"
            )
            at = _Hoisted({**self.names, COL.uid: "optiml_c0"}, hoisted)
            loaded = {}
            for x in vector:
                if isinstance(x, Load):
                    name = f"optiml_v{len(loaded)}"
                    loaded[x] = name
                    vt = _VECTOR[v * self._size(x)]
                    lines.append(f"            {C_TYPES[x.type]} {name}[{v}];")
                    lines.append(
                        f"            *reinterpret_cast<{vt}*>({name}) = "
                        f"*reinterpret_cast<const {vt}*>({x.tensor} + {at.expr(x.index)});"
                    )
            per = _Hoisted({**self.names, COL.uid: "(optiml_c0 + optiml_j)"}, hoisted, loaded)
            for n, s in enumerate(stores):
                t = self.m.tensors[s.tensor]
                ct = C_TYPES[t.dtype]
                lines.append(f"            {ct} optiml_o{n}[{v}];")
                lines.append("#pragma unroll")
                lines.append(
                    f"            for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) "
                    f"optiml_o{n}[optiml_j] = {per.cast(per.expr(s.value), s.value.type, t.dtype)};"
                )
                vt = _VECTOR[v * _SIZES[t.code]]
                lines.append(
                    f"            *reinterpret_cast<{vt}*>({s.tensor} + {at.expr(s.index)}) = "
                    f"*reinterpret_cast<const {vt}*>(optiml_o{n});"
                )
            lines += ["        }", "        return;", "    }"]
        lines.append(
            "    for (long long optiml_col = optiml_lane; optiml_col < optiml_len; "
            "optiml_col += 32) {"
        )
        lines.append(f"        if (!({guard_at})) break;")
        for s in stores:
            t = self.m.tensors[s.tensor]
            value = body.cast(body.expr(s.value), s.value.type, t.dtype)
            lines.append(f"        {s.tensor}[{body.expr(s.index)}] = {value};")
        lines += ["    }", "}"]
        return "\n".join(lines)

    def _row_length(self, stores):
        """D of the row number's read at `g / D`."""
        for s in stores:
            for x in walk_expr(s.value, into_loops=False):
                if isinstance(x, Load) and any(
                    isinstance(y, Load) for y in walk_expr(x.index, into_loops=False)
                ):
                    for y in walk_expr(x.index, into_loops=False):
                        if (
                            isinstance(y, Binary)
                            and y.op == "/"
                            and _is_gx(y.a)
                            and not any(isinstance(z, Builtin) for z in walk_expr(y.b))
                        ):
                            return y.b
        raise _NoPlan("no row number read at `g / D`")

    def _size(self, x: Load | Store) -> int:
        return _SIZES[self.m.tensors[x.tensor].code]

    def _vector(self, stores) -> list:
        """Loads and stores that move with the column by one, all widened at once, or none."""
        moving: list = []
        for s in stores:
            if self.m.tensors[s.tensor].code not in _SIZES:
                return []
            moving.append(s)
            for x in walk_expr(s.value, into_loops=False):
                if isinstance(x, Load) and _mentions_col(x.index):
                    moving.append(x)
            # a load a select may skip (a row number out of range) is read only where chosen
            always = set(_unconditional(s.value))
            if any(x not in always for x in moving if isinstance(x, Load)):
                return []
        sizes = set()
        for x in moving:
            code = self.m.tensors[x.tensor].code
            if code not in _SIZES or not _unit_col(x.index):
                return []
            sizes.add(_SIZES[code])
        self.width = 16 // max(sizes)
        return moving if self.width > 1 else []


def _unconditional(e):
    """The expressions under `e` that are evaluated whatever its selects choose."""
    yield e
    if isinstance(e, Select):
        yield from _unconditional(e.cond)
        return
    for x in children(e):
        yield from _unconditional(x)


def _mentions_col(e) -> bool:
    return any(isinstance(x, Var) and x.uid == COL.uid for x in walk_expr(e, into_loops=False))


def _row_only(x: Load) -> bool:
    return not _mentions_col(x.index) and any(
        isinstance(y, Var) and y.uid == ROW.uid for y in walk_expr(x.index, into_loops=False)
    )


def _unit_col(index) -> bool:
    """An index whose column term is `1 * col`, and whose other terms do not move with the
    column (a loaded row number times the row length, for one)."""
    col = f"{COL.name}#{COL.uid}"

    def strip(e):
        # the column term alone must be affine; the rest may be anything free of the column
        if isinstance(e, Binary) and e.op == "+":
            a, b = _mentions_col(e.a), _mentions_col(e.b)
            if a and not b:
                return strip(e.a)
            if b and not a:
                return strip(e.b)
        return e

    term = strip(index)
    f = affine(term)
    return f is not None and f.get((col,), 0) == 1 and all(col not in m or m == (col,) for m in f)


class _Hoisted(CEmitter):
    """Row-only loads by their names; loads of `loaded` from the registers they were read into."""

    def __init__(self, names, hoisted, loaded=None):
        super().__init__(names)
        self.hoisted = hoisted
        self.loaded = loaded or {}

    def expr(self, e) -> str:
        if isinstance(e, Load) and e in self.loaded:
            return self.from_memory(f"{self.loaded[e]}[optiml_j]", e.type)
        if isinstance(e, Load) and e in self.hoisted:
            return self.hoisted[e]
        return super().expr(e)
