"""A scan down the columns scheduled from the lifted model (optiml.lift): for a kernel whose model
is one thread per column `c` (guarded by `c < C`; the rows it works on picked by blockIdx.y and
blockIdx.z) running one loop down the column that carries a running sum, product, max or min and
stores what it has so far at each step (a cumulative sum along a leading axis: `cumsum(x, dim=1)`
of a (B, T, C) tensor), the loop's steps are split into P chunks: a block is 32 columns by P
chunks, each thread folds its chunk, the block's threads of a column combine the totals of the
chunks before theirs in shared memory, and each thread then scans its chunk again from that
offset, storing as the original does. P times the threads of the original, every element still
written once, in the column's order within each chunk; the order of the sum between chunks
changes, as any parallel scan's does (the spec's tolerance, or the oracle in double, decides).

The values, indices and types are the model's, written back by optiml.lift.emit."""

from __future__ import annotations

from optiml.expr import Expr as SizeExpr
from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, NotEmittable
from optiml.lift.families import induction_steps
from optiml.lift.model import (
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Call,
    Const,
    Load,
    Loop,
    Store,
    Var,
    loop_exprs,
    required,
    stmt_exprs,
    walk_expr,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.vector_map import (
    _ROW_ATOMS,
    _column_unit,
    _Emitter2D,
    _size_text,
    column_bound,
)
from optiml.search.catalog.warp_rows import _IDENTITY, _combine, _NoPlan

CHUNKS = (8, 16)
COLUMNS = 32
COL = "optiml_cx"
_OWN_Y = frozenset({"threadIdx.y", "blockDim.y", "threadIdx.z", "blockDim.z", "gridDim.x"})


class ColumnScan(Transformation):
    name = "column_scan"
    addresses = frozenset({"latency", "small_grid", "dram"})
    description = (
        "a scan down the columns from the lifted model: the steps split into chunks over the "
        "block's y threads, chunk totals combined in shared memory"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted):
                return []
            plan = _Plan(lifted, ctx)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        launch = ctx.spec.launch
        out = []
        for rank, chunks in enumerate(CHUNKS):
            try:
                body = plan.write(chunks)
            except (_NoPlan, NotEmittable, KeyError):
                return out
            grid = [f"cdiv({plan.bound_text}, {COLUMNS})", *launch.grid[1:]]
            variant = ctx.rewrite(
                head + body, launch=(grid, [str(COLUMNS), str(chunks)], launch.smem)
            )
            summary = (
                f"scan down the columns from the lifted model (a running {plan.op}): {COLUMNS} "
                f"columns by {chunks} chunks a block, chunk totals combined in shared memory"
            )
            out.append(Rewrite({"chunks": chunks}, summary, variant, 1.0 - 0.2 * rank))
        return out


class _Plan:
    def __init__(self, m: Lifted, ctx: Context):
        self.m = m
        body = list(m.body)
        if len(body) != 1 or not isinstance(body[0], Loop):
            raise _NoPlan("not one loop")
        loop = body[0]
        self.loop = loop
        for x in (x for st in m.body for e in stmt_exprs(st) for x in walk_expr(e, False)):
            if isinstance(x, Builtin) and x.name in _OWN_Y:
                raise _NoPlan("the kernel's own y threads")
        self.bound, self.row_guard = column_bound(required(loop.guard))
        self.bound_text = _size_text(self.bound)
        # the step: `t = t0; t < T; t += 1`, and one value carried beside it
        if len(loop.carried) != 2:
            raise _NoPlan("not a counter and one running value")
        steps = induction_steps(loop)
        step = next((c for c in loop.carried if _one(steps.get(c.var.uid))), None)
        if step is None:
            raise _NoPlan("no counter")
        acc = next(c for c in loop.carried if c is not step)
        self.step, self.acc = step, acc
        cond = loop.cond
        if not (
            isinstance(cond, Binary)
            and cond.op == "<"
            and cond.a == step.var
            and not any(isinstance(x, Var | Builtin | Load) for x in walk_expr(cond.b, False))
        ):
            raise _NoPlan("not `t < T`")
        if any(isinstance(x, Builtin | Load | Var) for x in walk_expr(step.init, False)):
            raise _NoPlan("a start that moves")
        self.end = cond.b
        self.op, self.term = _running(acc)
        if acc.var.type not in (FLOAT, DOUBLE, INT, LONG):
            raise _NoPlan("a running value of another type")
        # every access moves with the column one for one, and no output is read
        stores = [s for s in loop.body if isinstance(s, Store)]
        if len(stores) != len(loop.body) or not stores or any(s.atomic for s in stores):
            raise _NoPlan("not plain stores")
        if any(s.guard != TRUE for s in stores):
            raise _NoPlan("a store under a condition of its own")
        written = {s.tensor for s in stores}
        for s in stores:
            if not _column_unit(s.index):
                raise _NoPlan("a store that does not move with the column")
        for e in [*loop_exprs(loop)]:
            for x in walk_expr(e, into_loops=False):
                if isinstance(x, Load) and (x.tensor in written or not _column_unit(x.index)):
                    raise _NoPlan("a read of an output, or one across columns")
        self.stores = stores
        # the launch covers the columns as the original's does
        for sizes in ctx.spec.sizes:
            case = ctx.spec.case(sizes)
            n = SizeExpr.parse(self.bound_text).evaluate(ctx.env(case))
            if not isinstance(n, int) or case.grid[0] * case.block[0] < n:
                raise _NoPlan("the launch does not cover the columns")

    def write(self, chunks: int) -> str:
        names = {self.step.var.uid: "optiml_t", self.acc.var.uid: "optiml_s"}
        atoms = {**_ROW_ATOMS, "g.x": COL}
        e = _Emitter2D(names, COL, atoms, {})
        t = C_TYPES[self.acc.var.type]
        it = C_TYPES[self.step.var.type]
        identity = _IDENTITY[(self.op, self.acc.var.type)]
        update = e.expr(self.acc.update)
        lines = [
            "{",
            f"    __shared__ {t} optiml_tot[{chunks}][{COLUMNS}];",
            f"    const long long {COL} = (long long)blockIdx.x * {COLUMNS} + threadIdx.x;",
        ]
        if self.row_guard:
            rows = " && ".join(f"({e.expr(c)})" for c in self.row_guard)
            lines.append(f"    if (!({rows})) return;  // the block's rows: the same for all")
        start, end = e.expr(self.step.init), e.expr(self.end)
        lines += [
            f"    const bool optiml_in = {COL} < {e.expr(self.bound)};",
            f"    const {it} optiml_t0 = {start}, optiml_t1 = {end};",
            f"    const {it} optiml_len = (optiml_t1 - optiml_t0 + {chunks - 1}) / {chunks};",
            f"    const {it} optiml_lo = optiml_t0 + ({it})threadIdx.y * optiml_len;",
            f"    const {it} optiml_hi = optiml_lo + optiml_len < optiml_t1 "
            "? optiml_lo + optiml_len : optiml_t1;",
            "    // the chunk's total",
            f"    {t} optiml_s = {identity};",
            "    if (optiml_in)",
            f"        for ({it} optiml_t = optiml_lo; optiml_t < optiml_hi; ++optiml_t) "
            f"optiml_s = {update};",
            "    optiml_tot[threadIdx.y][threadIdx.x] = optiml_s;",
            "    __syncthreads();",
            "    // the column's value where the chunk starts: the start, then the chunks before",
            f"    optiml_s = {e.expr(self.acc.init)};",
            "    for (int optiml_q = 0; optiml_q < (int)threadIdx.y; ++optiml_q)",
            f"        optiml_s = {_combine(self.op, self.acc.var.type, 'optiml_s', 'optiml_tot[optiml_q][threadIdx.x]')};",
            "    if (!optiml_in) return;",
            f"    for ({it} optiml_t = optiml_lo; optiml_t < optiml_hi; ++optiml_t) {{",
        ]
        for s in self.stores:
            value = e.cast(e.expr(s.value), s.value.type, self.m.tensors[s.tensor].dtype)
            lines.append(f"        {s.tensor}[{e.expr(s.index)}] = {value};")
        lines += [f"        optiml_s = {update};", "    }", "}"]
        return "\n".join(lines)


def _one(step) -> bool:
    return isinstance(step, Const) and int(step.value) == 1


def _running(acc) -> tuple[str, object]:
    """(op, term) of `s = s op term` (term free of s); `_NoPlan` otherwise."""
    u, v = acc.update, acc.var

    def free(x) -> bool:
        return not any(y == v for y in walk_expr(x, into_loops=False))

    if isinstance(u, Binary) and u.op in ("+", "*"):
        op = "sum" if u.op == "+" else "prod"
        if u.a == v and free(u.b):
            return op, u.b
        if u.b == v and free(u.a):
            return op, u.a
    if isinstance(u, Call) and u.fn in ("max", "min") and len(u.args) == 2:
        a, b = u.args
        if a == v and free(b):
            return u.fn, b
        if b == v and free(a):
            return u.fn, a
    raise _NoPlan("not a running sum, product, max or min")
