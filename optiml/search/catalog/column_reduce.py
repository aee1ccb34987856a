"""A column reduction scheduled from the lifted model (optiml.lift): for a kernel whose model is
one thread per column (its only thread index is the column `c`, guarded by `c < C`) whose loops
reduce down the column (a sum, max or min of any expression of elements `in[k * stride + c]`,
any number of values, loops that use an earlier loop's result, any epilogue per column), the
columns go along x, each thread taking V adjacent ones (one 16-byte load per row where the
addresses allow, checked at run time; scalar loads otherwise), and the reduced axis is split over
the block's TY rows of threads and over a cluster of CL blocks (sm_90). Each block combines its
rows' partials in shared memory; the cluster's blocks then read each other's through distributed
shared memory (`__cluster_map_shared_rank`), every block in the same order, so that each holds the
columns' totals (a later loop may use them) and the cluster's first block stores the outputs. No
atomics (every output is written once, whatever the operation) and no state across launches.

The values, indices and types are the model's, written back by optiml.lift.emit, so any spelling
of the same computation gives the same kernel. The parameters come from the problem's first size:
the cluster is as wide as it takes for the grid to fill the GPU (at most 8, the portable limit);
a cluster of one is proposed too, for GPUs before sm_90.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import affine, counted_reductions, describe, global_indices
from optiml.lift.model import (
    BF16,
    DOUBLE,
    FLOAT,
    HALF,
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Cast,
    Const,
    Load,
    Loop,
    LoopOut,
    Param,
    Rewriter,
    Store,
    Var,
    loop_exprs,
    loops_of,
    stmt_exprs,
    walk_expr,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.warp_rows import _IDENTITY, _check_launch, _combine, _NoPlan

# Bytes of an element, for the tensors whose loads may be widened.
_SIZES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8}
_VECTOR = {16: "uint4", 8: "uint2", 4: "unsigned int"}
FAMILIES = ("reduction", "contraction (matrix-vector)")
MAX_CLUSTER = 8
MAX_GRID_Z = 65535
FULL_THREADS_PER_SM = 2048


@dataclass
class _Reduction:
    var: Var
    op: str
    operand: object
    init: object


@dataclass
class _Loop:
    loop: Loop
    counter: Var
    start: object
    bound: object
    reductions: list[_Reduction]


@dataclass
class _Plan:
    bound: object  # C in `c < C`
    loops: list[_Loop]
    stores: list[Store]
    vector_bytes: int  # the widest element of a widened load; 0: no widening


class ColumnReduce(Transformation):
    name = "column_reduce"
    addresses = frozenset({"dram", "uncoalesced", "small_grid", "latency", "l2", "occupancy"})
    description = (
        "a column reduction from the lifted model: columns along x with 16-byte loads, the "
        "reduced axis split over the block and a cluster, combined in distributed shared memory"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted):
                return []
            if describe(lifted, ctx.spec).family not in FAMILIES:
                return []
            batches, lifted = _batched(lifted)
            plan = _analyse(lifted)
            bound = CEmitter({}).expr(plan.bound)
            _check_launch(ctx, bound if batches is None else f"({batches}) * ({bound})")
            columns = _value(ctx, bound)
            count = 1 if batches is None else _value(ctx, batches)
            if count > MAX_GRID_Z:
                raise _NoPlan("more batches than a grid has blocks along z")
            width = 16 // plan.vector_bytes if plan.vector_bytes else 1
            configs = [
                (
                    tx,
                    ty,
                    cluster,
                    weight,
                    _Writer(lifted, plan, tx, ty, width, cluster, batches is not None).write(),
                )
                for tx, ty, cluster, weight in _configurations(columns, width, ctx.sm_count, count)
            ]
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        name_at = head.rindex(ctx.kernel.name)
        out = []
        for tx, ty, cluster, weight, body in configs:
            # the cluster's dimensions as the attribute `__cluster_dims__` stands for, which the
            # C++ grammar reads in this place
            definition = (
                head[:name_at]
                + (f"__attribute__((cluster_dims(1, {cluster}, 1))) " if cluster > 1 else "")
                + f"__launch_bounds__({tx * ty}) "
                + head[name_at:]
                + body
            )
            per_block = tx * width
            grid = [f"cdiv({bound}, {per_block})", str(cluster)]
            if batches is not None:
                grid.append(batches)
            variant = ctx.rewrite(definition, launch=(grid, [str(tx), str(ty)], "0"))
            where = (
                f"a cluster of {cluster} blocks in distributed shared memory"
                if cluster > 1
                else "one block per column tile"
            )
            summary = (
                ("batched on blockIdx.z: " if batches is not None else "")
                + f"column reduction from the lifted model: {per_block} columns per block "
                f"({width} per thread{', 16-byte loads' if width > 1 else ''}), rows over "
                f"{ty} threads and {where}"
            )
            out.append(
                Rewrite(
                    {"tx": tx, "ty": ty, "vector": width, "cluster": cluster},
                    summary,
                    variant,
                    weight,
                )
            )
        return out


def _value(ctx: Context, text: str) -> int:
    value = ctx.value(text)
    if not isinstance(value, int):
        raise _NoPlan("a column count that is not an integer")
    return value


def _configurations(
    columns: int, width: int, sm_count: int, batches: int = 1
) -> list[tuple[int, int, int, float]]:
    """(threads along x, along the rows, cluster size, prior): x wide enough for a warp's row
    segment to be whole 32-byte sectors (a 128-byte line where the columns, of all `batches`
    together, allow and a batch has that many), the cluster the narrowest that fills every SM with
    threads (at most 8); then a block of twice the rows, and a cluster of one (any GPU)."""
    wide = columns * batches >= 32 * width * sm_count and columns >= 32 * width
    tx = 32 if wide else 8
    ty = 256 // tx
    tiles = -(-columns // (tx * width)) * batches
    cluster = 1
    while cluster < MAX_CLUSTER and tiles * cluster * tx * ty < sm_count * FULL_THREADS_PER_SM:
        cluster *= 2
    configs = [(tx, ty, cluster, 1.0), (tx, 2 * ty, cluster, 0.7)]
    if cluster > 1:
        configs.append((tx, ty, 1, 0.4))
    return configs


class _Delinearize(Rewriter):
    """A flat thread index `i < B * C` used as `i / C` (the batch) and `i % C` (the column): the
    batch becomes `BATCH` (blockIdx.z, a value like a parameter's to every thread of a block), the
    column the thread's index along x (`i < C`), and `i` itself `batch * C + column`."""

    def __init__(self, flat, columns, total):
        self.memo = {}
        self.flat, self.columns, self.total = flat, columns, total
        self.batch = Param(BATCH, flat.type)

    def _sub(self, e):
        if isinstance(e, Binary) and e.a == self.flat:
            if e.op == "<" and e.b == self.total:
                return Binary("<", self.flat, self.columns, e.type)
            if e.b == self.columns and e.op in ("/", "%"):
                return Cast(self.batch, e.type) if e.op == "/" else self.flat
        if e == self.flat:
            at = Binary("*", self.batch, self.columns, self.flat.type)
            return Binary("+", at, self.flat, self.flat.type)
        return self.rebuilt(e)


BATCH = "optiml_batch"


def _batched(lifted: Lifted) -> tuple[str | None, Lifted]:
    """A reduction down the middle axis of [B, K, C], one thread per (batch, column) on a flat
    index (KernelBench's reductions over a dimension, a bias gradient per group): the batch count
    B as C and the model with the batch on blockIdx.z and the column on x; (None, the model) for
    any other kernel."""
    stores = list(lifted.body)
    guard = stores[0].guard if stores and isinstance(stores[0], Store) else None
    if not isinstance(guard, Binary) or guard.op != "<" or not _thread_free(guard.b):
        return None, lifted
    f = affine(guard.a)
    if f is None or global_indices(f) != {("g.x",): 1}:
        return None, lifted
    flat = guard.a
    split = [
        x
        for s in stores
        for e in stmt_exprs(s)
        for x in walk_expr(e)
        if isinstance(x, Binary) and x.op in ("/", "%") and x.a == flat
    ]
    divisors = {x.b for x in split}
    if len(divisors) != 1 or not isinstance(guard.b, Binary) or guard.b.op != "*":
        return None, lifted
    (columns,) = divisors
    if not _thread_free(columns) or columns not in (guard.b.a, guard.b.b):
        return None, lifted
    batches = guard.b.b if guard.b.a == columns else guard.b.a
    r = _Delinearize(flat, columns, guard.b)
    body = tuple(r.stmt(s) for s in lifted.body)
    return CEmitter({}).expr(batches), replace(lifted, body=body)


def _thread_free(e) -> bool:
    return not any(isinstance(x, Builtin | Var | LoopOut) for x in walk_expr(e, into_loops=False))


def _column_bound(guard) -> object:
    """`c < C` with c the thread's global index along x and C free of thread indices: C."""
    if not isinstance(guard, Binary) or guard.op != "<" or not _thread_free(guard.b):
        raise _NoPlan("not `column < C`")
    f = affine(guard.a)
    if f is None or global_indices(f) != {("g.x",): 1}:
        raise _NoPlan("the guarded index is not the thread's column")
    return guard.b


def _analyse(lifted: Lifted) -> _Plan:
    stores = list(lifted.body)
    if not stores or not all(isinstance(s, Store) and not s.atomic for s in stores):
        raise _NoPlan("a loop that stores, or an atomic")
    guard = stores[0].guard
    if any(s.guard != guard for s in stores):
        raise _NoPlan("stores under different conditions")
    bound = _column_bound(guard)
    loops = sorted(loops_of(lifted), key=lambda lp: lp.line)
    if not loops:
        raise _NoPlan("no loop")
    planned = [_plan_loop(lp, guard) for lp in loops]
    widths = [_load_width(ld, lifted, p.counter) for p in planned for ld in _loads(p)]
    # widened only where every load that moves with the column can be
    vector_bytes = 0 if None in widths else max(widths, default=0)
    walks = 0
    for p in planned:
        for ld in _loads(p):
            if not (_mentions(ld.index, p.counter) and _moves_with_column(ld.index)):
                continue
            coefficient, f = _coefficients(ld.index, p.counter)
            if coefficient != 1:
                raise _NoPlan("a read down the reduced axis that is not along the column")
            step = {
                m: c for m, c in f.items() if any(a.split("#")[-1] == str(p.counter.uid) for a in m)
            }
            if (
                set(step) == {(f"{p.counter.name}#{p.counter.uid}",)}
                and abs(next(iter(step.values()))) == 1
            ):
                raise _NoPlan("a window that slides along the row, not a column")
            walks += 1
    if not walks:
        raise _NoPlan("no loop walks down the columns")
    return _Plan(bound, planned, stores, vector_bytes)


def _plan_loop(loop: Loop, guard) -> _Loop:
    if loop.guard not in (guard, TRUE):
        raise _NoPlan("a loop under another condition")
    own = {c.var.uid for c in loop.carried}
    for e in loop_exprs(loop):
        if any(isinstance(x, Var) and x.uid not in own for x in walk_expr(e, into_loops=False)):
            raise _NoPlan("a loop inside another loop")
    if loop.body:
        raise _NoPlan("a loop that stores")
    try:
        k, found = counted_reductions(loop)
    except ValueError as e:
        raise _NoPlan(str(e)) from None
    cond = loop.cond
    if not (isinstance(cond, Binary) and cond.a == k.var and cond.op in ("<", "<=")):
        raise _NoPlan("not `k < bound`")
    if not _thread_free(cond.b) or not _thread_free(k.init):
        raise _NoPlan("a reduced range that moves with the thread")
    bound = cond.b if cond.op == "<" else Binary("+", cond.b, Const(1, cond.b.type), cond.b.type)
    reductions = [_Reduction(c.var, op, operand, c.init) for c, op, operand in found]
    if not reductions:
        raise _NoPlan("a loop that reduces nothing")
    return _Loop(loop, k.var, k.init, bound, reductions)


def _loads(p: _Loop) -> list[Load]:
    seen: dict[Load, None] = {}
    for r in p.reductions:
        for x in walk_expr(r.operand, into_loops=False):
            if isinstance(x, Load):
                seen.setdefault(x)
    return list(seen)


def _mentions(e, v: Var) -> bool:
    return any(isinstance(x, Var) and x.uid == v.uid for x in walk_expr(e, into_loops=False))


def _coefficients(index, k: Var) -> tuple[int | None, dict]:
    """The column's coefficient in an index (None where it is not affine), and the form."""
    f = affine(index)
    if f is None:
        return None, {}
    f = global_indices(f)
    if any("g.x" in m and m != ("g.x",) for m in f) or any(
        a.startswith(("threadIdx", "blockIdx", "g.", "stride.")) and a != "g.x"
        for m in f
        for a in m
    ):
        return None, f
    return f.get(("g.x",), 0), f


def _load_width(ld: Load, lifted: Lifted, k: Var) -> int | None:
    """The bytes of an element of a load that moves with the column by one (0: one that does
    not move with the column, None: one that cannot be widened)."""
    if _has_load(ld.index):
        return None if _moves_with_column(ld.index) else 0
    coefficient, f = _coefficients(ld.index, k)
    if coefficient is None:
        return None if _moves_with_column(ld.index) else 0
    if coefficient == 0:
        return 0
    size = _SIZES.get(lifted.tensors[ld.tensor].code)
    if coefficient != 1 or size is None or ld.type not in (FLOAT, DOUBLE, HALF, BF16, INT, LONG):
        return None
    return size


def _has_load(e) -> bool:
    return any(isinstance(x, Load) for x in walk_expr(e, into_loops=False))


def _moves_with_column(e) -> bool:
    return any(isinstance(x, Builtin) for x in walk_expr(e, into_loops=False))


class _Emitter(CEmitter):
    """The model's C with the loads of `vector` read from registers instead of memory."""

    def __init__(self, names, atoms, vector: dict[Load, str]):
        super().__init__(names, atoms=atoms)
        self.vector = vector

    def expr(self, e) -> str:
        if isinstance(e, Load) and e in self.vector:
            return self.from_memory(f"{self.vector[e]}[optiml_j]", e.type)
        return super().expr(e)


class _Writer:
    def __init__(
        self,
        lifted: Lifted,
        plan: _Plan,
        tx: int,
        ty: int,
        width: int,
        cluster: int,
        batched: bool = False,
    ):
        self.m, self.plan, self.batched = lifted, plan, batched
        self.tx, self.ty, self.v, self.cl = tx, ty, width, cluster
        self.names: dict[int, str] = {}
        self.lines: list[str] = []

    def emit(self, column: str, vector: dict[Load, str] | None = None) -> _Emitter:
        return _Emitter(self.names, {"g.x": column}, vector or {})

    def write(self) -> str:
        tx, ty, v, cl = self.tx, self.ty, self.v, self.cl
        per_block = tx * v
        bound = CEmitter({}).expr(self.plan.bound)
        self.lines = [
            "{",
            f"    // {per_block} columns per block, {v} per thread; the reduced axis over the "
            f"block's {ty} rows of threads" + (f" and a cluster of {cl} blocks" if cl > 1 else ""),
            f"    const int optiml_tid = threadIdx.y * {tx} + threadIdx.x;",
            f"    const long long optiml_first = (long long)blockIdx.x * {per_block};",
            f"    const long long optiml_c0 = optiml_first + threadIdx.x * {v};",
            "    const unsigned optiml_rank = "
            + ("__clusterRelativeBlockRank();" if cl > 1 else "0;"),
            f"    const long long optiml_columns = {bound};",
        ]
        if self.batched:
            self.lines.append(f"    const int {BATCH} = blockIdx.z;  // the batch of columns")
        for i, p in enumerate(self.plan.loops):
            self._loop(i, p)
        self.lines.append("    if (optiml_rank == 0) {")
        self.lines.append(
            f"        for (int optiml_t = optiml_tid; optiml_t < {per_block}; "
            f"optiml_t += {tx * ty}) {{"
        )
        self.lines.append("            const long long optiml_col = optiml_first + optiml_t;")
        self.lines.append("            if (optiml_col < optiml_columns) {")
        self._totals("optiml_t")
        for s in self.plan.stores:
            e = self.emit("optiml_col")
            self.lines.append(f"                {s.tensor}[{e.expr(s.index)}] = {e.expr(s.value)};")
        self.lines += ["            }", "        }", "    }"]
        if cl > 1:
            self.lines.append(
                "    // no block leaves while another may still read its shared memory"
            )
            self.lines.append("    __cluster_barrier_arrive();")
            self.lines.append("    __cluster_barrier_wait();")
        self.lines.append("}")
        return "\n".join(self.lines)

    def _totals(self, slot: str) -> None:
        """Loop results by the column's slot in the block's totals."""
        for i, p in enumerate(self.plan.loops):
            for n, r in enumerate(p.reductions):
                self.names[r.var.uid] = f"optiml_total{i}_{n}[{slot}]"

    def _loop(self, i: int, p: _Loop) -> None:
        tx, ty, v, cl = self.tx, self.ty, self.v, self.cl
        per_block = tx * v
        L = self.lines
        L.append(f"    // the loop at line {p.loop.line}")
        for n, r in enumerate(p.reductions):
            t = C_TYPES[r.var.type]
            L.append(f"    __shared__ {t} optiml_part{i}_{n}[{ty}][{per_block + 1}];")
            L.append(f"    __shared__ {t} optiml_total{i}_{n}[{per_block}];")
        L.append("    {")
        for n, r in enumerate(p.reductions):
            t = C_TYPES[r.var.type]
            L.append(f"        {t} optiml_acc{n}[{v}];")
            L.append(
                f"        for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) "
                f"optiml_acc{n}[optiml_j] = {_IDENTITY[(r.op, r.var.type)]};"
            )
        self._totals(f"threadIdx.x * {v} + optiml_j")
        k = f"optiml_k{i}"
        start = CEmitter(self.names).expr(p.start)
        end = CEmitter(self.names).expr(p.bound)
        head = (
            f"for (long long {k} = ({start}) + (long long)optiml_rank * {ty} + threadIdx.y; "
            f"{k} < ({end}); {k} += {cl * ty})"
        )
        self.names[p.counter.uid] = k
        vector = {ld: f"optiml_v{i}_{m}" for m, ld in enumerate(self._widened(p))}
        column = "(optiml_c0 + optiml_j)"
        if vector:
            checks = [f"optiml_c0 + {v} <= optiml_columns"]
            for ld in vector:
                size = _SIZES[self.m.tensors[ld.tensor].code]
                checks.append(f"((unsigned long long){ld.tensor}) % {size * v} == 0")
                for shift in ("", " + 1"):
                    self.names[p.counter.uid] = f"(({start}){shift})"
                    checks.append(f"{self.emit('0LL').expr(ld.index)} % {v} == 0")
            self.names[p.counter.uid] = k
            L.append(f"        if ({' && '.join(checks)}) {{")
            L.append(f"            {head} {{")
            for ld, name in vector.items():
                size = _SIZES[self.m.tensors[ld.tensor].code]
                index = self.emit("optiml_c0").expr(ld.index)
                L.append(f"                {C_TYPES[ld.type]} {name}[{v}];")
                L.append(
                    f"                *reinterpret_cast<{_VECTOR[size * v]}*>({name}) = "
                    f"*reinterpret_cast<const {_VECTOR[size * v]}*>({ld.tensor} + {index});"
                )
            L.append("#pragma unroll")
            L.append(f"                for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) {{")
            self._accumulate(p, self.emit(column, vector), "                    ")
            L += ["                }", "            }", "        } else {"]
        else:
            L.append("        {")
        L.append(f"            if (optiml_c0 < optiml_columns) {head} {{")
        L.append("#pragma unroll")
        L.append(f"                for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) {{")
        L.append("                    if (optiml_c0 + optiml_j >= optiml_columns) break;")
        self._accumulate(p, self.emit(column), "                    ")
        L += ["                }", "            }", "        }"]
        del self.names[p.counter.uid]
        for n, _ in enumerate(p.reductions):
            L.append(
                f"        for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) "
                f"optiml_part{i}_{n}[threadIdx.y][threadIdx.x * {v} + optiml_j] = "
                f"optiml_acc{n}[optiml_j];"
            )
        L.append("    }")
        L.append("    __syncthreads();")
        # the block's rows of threads, then the cluster's blocks, each in a fixed order
        L.append(
            f"    for (int optiml_t = optiml_tid; optiml_t < {per_block}; optiml_t += {tx * ty}) {{"
        )
        for n, r in enumerate(p.reductions):
            part = f"optiml_part{i}_{n}"
            a = f"optiml_a{n}"
            L.append(f"        {C_TYPES[r.var.type]} {a} = {part}[0][optiml_t];")
            L.append(
                f"        for (int optiml_y = 1; optiml_y < {ty}; ++optiml_y) "
                f"{a} = {_combine(r.op, r.var.type, a, f'{part}[optiml_y][optiml_t]')};"
            )
            L.append(f"        {part}[0][optiml_t] = {a};")
        L.append("    }")
        if cl > 1:
            L.append("    __cluster_barrier_arrive();")
            L.append("    __cluster_barrier_wait();")
        else:
            L.append("    __syncthreads();")
        L.append(
            f"    for (int optiml_t = optiml_tid; optiml_t < {per_block}; optiml_t += {tx * ty}) {{"
        )
        L.append("        const long long optiml_col = optiml_first + optiml_t;")
        e = self.emit("optiml_col")
        for n, r in enumerate(p.reductions):
            part = f"optiml_part{i}_{n}"
            t = C_TYPES[r.var.type]
            a = f"optiml_a{n}"
            L.append(f"        {t} {a} = {_IDENTITY[(r.op, r.var.type)]};")
            if cl > 1:
                L.append(
                    f"        for (unsigned optiml_r = 0; optiml_r < {cl}; ++optiml_r) {a} = "
                    + _combine(
                        r.op,
                        r.var.type,
                        a,
                        f"static_cast<{t}*>(__cluster_map_shared_rank(&{part}[0][0], "
                        "optiml_r))[optiml_t]",
                    )
                    + ";"
                )
            else:
                L.append(f"        {a} = {part}[0][optiml_t];")
            init = e.expr(r.init)
            if not _thread_free(r.init):
                init = f"(optiml_col < optiml_columns ? ({init}) : {_IDENTITY[(r.op, r.var.type)]})"
            L.append(
                f"        optiml_total{i}_{n}[optiml_t] = "
                f"{_combine(r.op, r.var.type, f'({init})', a)};"
            )
        L.append("    }")
        L.append("    __syncthreads();")

    def _widened(self, p: _Loop) -> list[Load]:
        if not self.v or self.v == 1:
            return []
        return [
            ld
            for ld in _loads(p)
            if _load_width(ld, self.m, p.counter) and _mentions(ld.index, p.counter)
        ]

    def _accumulate(self, p: _Loop, e: CEmitter, indent: str) -> None:
        for n, r in enumerate(p.reductions):
            acc = f"optiml_acc{n}[optiml_j]"
            self.lines.append(
                f"{indent}{acc} = {_combine(r.op, r.var.type, acc, e.expr(r.operand))};"
            )
