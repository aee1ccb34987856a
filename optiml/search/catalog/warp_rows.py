"""A warp per row, emitted from the lifted model (optiml.lift) rather than matched in the text:
for a kernel whose model is one thread per row (its only thread index is the row, guarded by
`row < R`), every loop over the row becomes a loop of the warp's lanes striding over it; each
value it carries as a sum, max or min becomes a per-lane partial, all-reduced by shuffles and
then combined with its initial value; every store in such a loop is made by the lane that owns the
element, and a store per row by lane 0. The values, indices and types are the model's, written
back by optiml.lift.emit, so any spelling of the same computation gives the same kernel.

Applies to what `row_parallel` reads in the text and to what it does not (16-bit rows, macros,
`while` loops, a row written and normalized in place); it has no float4 path. Rows too few for
their warps to fill the GPU get a block per row too, and a cluster of up to 8 blocks per row
(sm_90), whose blocks combine their values through distributed shared memory in the same order,
so that each holds the row's value bit for bit. A scan is scanned by a warp. A max and then a
sum of exp(value - max), or a sum and then a sum of squares about its mean, are one pass (online
softmax, Welford). A long row whose elements two passes read is also kept in the shared memory
of a block, or of the fewest blocks of a cluster that hold it (fp32 and fp64 elements, up to
450,560 floats a row): the first pass stores what it reads, the later ones read it there, and a
row longer than the launch's shared memory holds is read as the kernel reads it.
"""

from __future__ import annotations

import re
from dataclasses import replace

from optiml.expr import Expr as SizeExpr
from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.coords import distinct_per_value
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import (
    affine,
    canon,
    counted_reductions,
    global_indices,
    induction_steps,
    sure_loads,
)
from optiml.lift.model import (
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Call,
    Cast,
    Const,
    Load,
    Loop,
    LoopOut,
    Param,
    Select,
    Store,
    Var,
    loop_exprs,
    loops_of,
    walk_expr,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation

THREADS = (256, 128)
# A block (or each block of a cluster) per row: its threads; a GPU is busy with this many threads
# per SM in flight; clusters of at most the portable 8 blocks.
BLOCK_THREADS = 512
BUSY_THREADS_PER_SM = 1024
# Dynamic shared memory a block may give to its part of a kept row (of the 227 KB an sm_90 block
# may have, the reductions' own arrays besides): 110 floats a thread of 512, a row of 56,320
# floats per block, 450,560 per cluster of 8.
KEEP_BYTES = 220 * 1024
# A block whose shared memory holds its part of a row is alone on its SM: with 512 threads, 16
# warps read the row (on KernelBench's LogSoftmax, 32.4x its plain kernel against 37.5x for a warp
# per row reading the row twice: too few loads in flight); with 1024, twice the warps (at most 64
# registers a thread). Both are proposed.
KEEP_THREADS = (BLOCK_THREADS, BUSY_THREADS_PER_SM)
MAX_CLUSTER = 8
_DIVISIONS = ("/", "%")  # a quotient and a remainder, which `_Writer._divisions` carries
LONG_ROW = 4096  # elements: 128 per lane of a warp, a pass of 8 per thread of a block
FULL_MASK = "0xffffffffu"
_IDENTITY = {
    ("sum", FLOAT): "0.0f",
    ("sum", DOUBLE): "0.0",
    ("sum", INT): "0",
    ("sum", LONG): "0LL",
    ("max", FLOAT): "-INFINITY",
    ("max", DOUBLE): "-(double)INFINITY",
    ("max", INT): "(-2147483647 - 1)",
    ("max", LONG): "(-9223372036854775807LL - 1)",
    ("min", FLOAT): "INFINITY",
    ("min", DOUBLE): "(double)INFINITY",
    ("min", INT): "2147483647",
    ("min", LONG): "9223372036854775807LL",
}


class _NoPlan(Exception):
    pass


class WarpRows(Transformation):
    name = "warp_rows"
    addresses = frozenset({"uncoalesced", "l1_shared", "l2", "small_grid", "latency"})
    description = "a warp per row, emitted from the lifted model, with shuffle all-reduces"

    def propose(self, ctx: Context) -> list[Rewrite]:
        plan = _plan(ctx)
        return [] if plan is None else _proposals(ctx, *plan)


def _plan(ctx: Context) -> tuple[Lifted, str, str, int] | None:
    """The kernel's lifted model, its row count's expression, the warp per row's body and the
    row count at the spec's first size; None where it is not one thread per row."""
    try:
        lifted = lift(ctx.source, ctx.kernel, ctx.spec)
        if not isinstance(lifted, Lifted):
            return None
        rows, body = _Writer(lifted).write()
        _check_launch(ctx, rows)
        return lifted, rows, body, _row_count(ctx, rows)
    except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
        return None


def _proposals(ctx: Context, lifted: Lifted, rows: str, body: str, count: int) -> list[Rewrite]:
    """What `propose` makes of a thread-per-row kernel's plan (`_plan`)."""
    # A warp per row pays where each row owns its data (a row to normalize or reduce); where
    # the rows share their inputs (a GEMM's outputs, a stencil's windows) a warp per output
    # loses the reuse between them: measured 0.04x to 0.13x on the H200 and H100
    # (benchmarks/results/schedules). Rows must own a warp's worth of the largest input.
    per_row = _row_elements(ctx, count)
    if per_row < 32:
        return []
    head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
    name_at = head.rindex(ctx.kernel.name)
    few = _few(ctx, count)
    # a long row keeps a warp's lanes walking it pass after pass (a softmax over a
    # vocabulary): a block per row is worth measuring however many rows there are
    long = per_row >= LONG_ROW
    out = []
    for threads in THREADS:
        variant = ctx.rewrite(
            head + body, launch=([f"cdiv({rows}, {threads // 32})"], [str(threads)], "0")
        )
        summary = (
            f"warp per row ({threads // 32} rows per {threads}-thread block), from the lifted "
            "model: lanes stride over the row, shuffle all-reduce"
        )
        weight = (1.0 if threads == 256 else 0.8) * (0.6 if few else 1.0)
        out.append(Rewrite({"threads": threads, "per_row": "warp"}, summary, variant, weight))
    if not (few or long):
        return out
    out += _wide(ctx, lifted, head, rows, count)
    for threads in KEEP_THREADS:
        kept = _kept_row(ctx, lifted, head[:name_at], head[name_at:], rows, per_row, threads)
        out += [kept] if kept is not None else []
    return out


def _few(ctx: Context, count: int) -> bool:
    """Whether `count` rows leave warps idle: a warp each fills fewer than the GPU's SMs at
    `BUSY_THREADS_PER_SM` threads."""
    return count * 32 < ctx.sm_count * BUSY_THREADS_PER_SM


def _wide(ctx: Context, lifted: Lifted, head: str, rows: str, count: int) -> list[Rewrite]:
    """A block per row and, where the rows are few, a cluster of blocks per row: as many (up to
    `MAX_CLUSTER`) as bring the rows' threads to `BUSY_THREADS_PER_SM` a SM. `head`: the kernel's
    definition up to its body."""
    name_at = head.rindex(ctx.kernel.name)
    # (measured against one wave of two blocks a SM: BatchNorm's 64 channels in clusters of 4,
    # 256 blocks, took 1.42 ms on an H100 where 8, 512 blocks in two waves, took 0.905: a thread
    # with twice the elements bound by its division per element; 0.882 with it approximate:
    # kb-33-cluster-4-h100.json, kb-33-34-h100.json)
    cluster = 1
    while (
        _few(ctx, count)
        and cluster < MAX_CLUSTER
        and count * cluster * BLOCK_THREADS < ctx.sm_count * (BUSY_THREADS_PER_SM)
    ):
        cluster *= 2
    out = []
    for kind, cl, weight in (("block", 1, 0.9), ("cluster", cluster, 1.0)):
        if kind == "cluster" and cl == 1:
            continue
        try:
            _, wide_body = _Writer(lifted, BLOCK_THREADS, cl).write()
        except (_NoPlan, NotEmittable):
            continue
        attribute = f"__attribute__((cluster_dims({cl}, 1, 1))) " if cl > 1 else ""
        definition = (
            head[:name_at]
            + attribute
            + f"__launch_bounds__({BLOCK_THREADS}) "
            + head[name_at:]
            + wide_body
        )
        variant = ctx.rewrite(definition, launch=([f"({rows}) * {cl}"], [str(BLOCK_THREADS)], "0"))
        summary = (
            f"a {'cluster of ' + str(cl) + ' blocks' if cl > 1 else 'block'} per row "
            f"({BLOCK_THREADS} threads each), from the lifted model: threads stride over the "
            "row, shuffle and shared-memory all-reduce"
            + (", combined across the cluster in distributed shared memory" if cl > 1 else "")
        )
        out.append(
            Rewrite(
                {"threads": BLOCK_THREADS, "per_row": kind, "cluster": cl},
                summary,
                variant,
                weight,
            )
        )
    return out


# A thread walking its row alone takes about this long an element of each pass over it on an
# H100: KernelBench's plain kernels of a thread per row took 300 ns (BatchNorm, 2 M elements and 3
# passes in 1.88 s), 220 ns (LogSoftmax, 393 K and 3 in 259 ms) and 63 ns (LayerNorm, 4.2 M and 3
# in 792 ms) (benchmarks/results/kernelbench).
SERIAL_NS = 200
# A plain kernel expected to take longer than this a launch is too slow for a search to start
# from within its time: measuring BatchNorm's (1.9 s) left none of 90 s; LayerNorm's (0.8 s)
# left 15 evaluations.
SLOW_INPUT_S = 1.0


def few_rows_schedule(ctx: Context, clusters: bool = True) -> Rewrite | None:
    """For a kernel of one thread per row whose rows are too few for a warp each to fill the GPU
    (`ctx.sm_count` SMs of `BUSY_THREADS_PER_SM` threads) and so long that a thread walking its
    row alone takes `SLOW_INPUT_S` or more (`SERIAL_NS` an element of each loop over it): the
    widest of the block- and cluster-per-row rewrites `propose` makes (a block where not
    `clusters`: before sm_90), the row read as the kernel reads it. None where the rows are
    enough or short, or the kernel is not one this transformation rewrites. `optiml generate`
    writes it for such rows."""
    plan = _plan(ctx)
    if plan is None:
        return None
    lifted, rows, _, count = plan
    per_row = _row_elements(ctx, count)
    serial_s = per_row * len(loops_of(lifted)) * SERIAL_NS * 1e-9
    if per_row < 32 or not _few(ctx, count) or serial_s < SLOW_INPUT_S:
        return None
    head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
    wide = [
        r for r in _wide(ctx, lifted, head, rows, count) if clusters or r.params["cluster"] == 1
    ]
    return max(wide, key=lambda r: r.params["cluster"], default=None)


def _kept_row(
    ctx: Context,
    lifted: Lifted,
    before_name: str,
    from_name: str,
    rows: str,
    length: int,
    threads: int = BLOCK_THREADS,
) -> Rewrite | None:
    """A block of `threads` per row, or the fewest blocks of a cluster whose shared memory holds
    the row at the spec's first size, keeping the elements two passes read: the row crosses DRAM
    once."""
    try:
        probe = _Writer(lifted, threads, 1, keep=1)
        probe.write()
    except (_NoPlan, NotEmittable):
        return None
    per_slot = probe.kept_bytes  # a slot a thread of every kept element
    keep = KEEP_BYTES // per_slot
    cluster = next(
        (cl for cl in (1, 2, 4, MAX_CLUSTER) if -(-length // (threads * cl)) <= keep),
        None,
    )
    if keep < 2 or cluster is None:
        return None
    writer = _Writer(lifted, threads, cluster, keep=keep)
    try:
        _, body = writer.write()
    except (_NoPlan, NotEmittable):
        return None
    stride = threads * cluster
    smem = f"min(cdiv({writer.row_length}, {stride}), {keep}) * {per_slot}"
    try:  # the launch reads it at every size
        for sizes in ctx.spec.sizes:
            case = ctx.spec.case(sizes)
            if not isinstance(SizeExpr.parse(smem).evaluate(ctx.env(case)), int):
                return None
    except (ExprError, KeyError, ValueError):
        return None
    attribute = f"__attribute__((cluster_dims({cluster}, 1, 1))) " if cluster > 1 else ""
    definition = before_name + attribute + f"__launch_bounds__({threads}) " + from_name + body
    variant = ctx.rewrite(definition, launch=([f"({rows}) * {cluster}"], [str(threads)], smem))
    reads = ", ".join(sorted({f"`{a}`" for a in writer.arrays.values()}))
    whose = f"a cluster of {cluster} blocks" if cluster > 1 else "a block"
    summary = (
        f"{whose} per row ({threads} threads each), from the lifted model, the row kept in "
        f"shared memory (up to {keep * stride} elements; {reads}) by the pass that reads it "
        "first: it crosses DRAM once"
    )
    params = {"threads": threads, "per_row": "cluster" if cluster > 1 else "block"}
    params |= {"cluster": cluster, "keep": keep}
    return Rewrite(params, summary, variant, 1.0)


def _online_pairs(items: list) -> dict[int, tuple[Loop, object]]:
    """A max of a float value over the row, then a sum of exp(the same value - that max) over
    the same range: what one pass computes (an online softmax's max and sum)."""
    return _fused_pairs(items, "max", _exp_of_difference)


def _spread_pairs(items: list) -> dict[int, tuple[Loop, object]]:
    """A sum of a float value over the row, then a sum of (the same value - c)^2 over the same
    range, c an expression of that sum and of values that do not change along the row (a mean):
    what Welford's one pass computes (the found value is c)."""
    return _fused_pairs(items, "sum", _square_about)


def _fused_pairs(items: list, op: str, match) -> dict[int, tuple[Loop, object]]:
    """Loops `a` -> (`b`, what `match` found) where `a` only computes one float `op` of a value
    over the row and `b` only one sum over the same range whose operand `match(operand, value,
    k, kb, a, carried)` accepts (not None), `b` reading nothing the kernel stores and no loop's
    result but `a`'s."""
    stored = {s.tensor for x in items for s in ([x] if isinstance(x, Store) else x.body)}
    out: dict[int, tuple[Loop, object]] = {}
    loops = [x for x in items if isinstance(x, Loop) and not x.body]
    taken: set[int] = set()
    for a in loops:
        try:
            k, found = counted_reductions(a, (op,))
        except ValueError:
            continue
        if len(found) != 1 or _arg_pairs(a) or found[0][0].var.type not in (FLOAT, DOUBLE):
            continue
        if not (isinstance(a.cond, Binary) and a.cond.op == "<"):
            continue
        ca, _, value = found[0]
        for b in loops:
            if b.line <= a.line or b.uid in taken:
                continue
            try:
                kb, ((cb, _, operand),) = counted_reductions(b, ("sum",))
                got = match(operand, value, k, kb, a, ca)
                same = (canon(a.cond.b, k.var.uid), canon(k.init, k.var.uid)) == (
                    canon(b.cond.b, kb.var.uid),
                    canon(kb.init, kb.var.uid),
                )
            except ValueError:
                continue
            if got is None or not same or cb.var.type != ca.var.type:
                continue
            exprs = [x for e in loop_exprs(b) for x in walk_expr(e, into_loops=False)]
            reads = {x.tensor for e in loop_exprs(b) for x in walk_expr(e) if isinstance(x, Load)}
            if all(x.loop.uid == a.uid for x in exprs if isinstance(x, LoopOut)) and not (
                reads & stored
            ):
                out[a.uid] = (b, got)
                taken.add(b.uid)
                break
    return out


def _exp_of_difference(operand, value, k, kb, a: Loop, m):
    """True where `operand` (in `b`, counter `kb`) is exp(`value` - `a`'s max `m`), `value` read
    as `a` reads it with counter `k`; else None."""
    if not (isinstance(operand, Call) and operand.fn == "exp" and len(operand.args) == 1):
        return None
    d = operand.args[0]
    if not (isinstance(d, Binary) and d.op == "-" and isinstance(d.b, LoopOut)):
        return None
    if d.b.loop.uid != a.uid or d.b.var.uid != m.var.uid:
        return None
    return True if canon(d.a, kb.var.uid) == canon(value, k.var.uid) else None


def _square_about(operand, value, k, kb, a: Loop, sa):
    """c where `operand` (in `b`, counter `kb`) is (`value` - c) * (`value` - c), `value` read as
    `a` reads it with counter `k` and c an expression of `a`'s sum `sa`, scalar parameters and
    constants; else None."""
    if not (isinstance(operand, Binary) and operand.op == "*"):
        return None
    d1, d2 = operand.a, operand.b
    if canon(d1, kb.var.uid) != canon(d2, kb.var.uid):
        return None
    if not (isinstance(d1, Binary) and d1.op == "-"):
        return None
    if canon(d1.a, kb.var.uid) != canon(value, k.var.uid):
        return None
    center = d1.b
    for x in walk_expr(center, into_loops=False):
        if isinstance(x, Load | Var | Builtin):
            return None
        if isinstance(x, LoopOut) and (x.loop.uid != a.uid or x.var.uid != sa.var.uid):
            return None
    return center


def _exp_of_difference(operand, value, k, kb, a: Loop, m) -> bool:
    """Whether `operand` (in `b`, counter `kb`) is exp(`value` - `a`'s max `m`), `value` read
    as `a` reads it with counter `k`."""
    if not (isinstance(operand, Call) and operand.fn == "exp" and len(operand.args) == 1):
        return False
    d = operand.args[0]
    if not (isinstance(d, Binary) and d.op == "-" and isinstance(d.b, LoopOut)):
        return False
    if d.b.loop.uid != a.uid or d.b.var.uid != m.var.uid:
        return False
    return canon(d.a, kb.var.uid) == canon(value, k.var.uid)


def _row_elements(ctx: Context, count: int) -> int:
    """Elements per row of the largest input at the spec's first size: what a row's loops read."""
    case = ctx.case
    inputs = [case.lengths[b.name] for b in ctx.spec.buffers if b.role != "out"]
    return max(inputs, default=0) // max(count, 1)


def _row_count(ctx: Context, rows: str) -> int:
    case = ctx.case
    value = SizeExpr.parse(rows).evaluate(ctx.env(case))
    if not isinstance(value, int):
        raise _NoPlan("a row count that is not an integer")
    return value


def _check_launch(ctx: Context, rows: str) -> None:
    """A 1-D launch that covers the rows, and a row count the spec can evaluate."""
    expr = SizeExpr.parse(rows)
    for sizes in ctx.spec.sizes:
        case = ctx.spec.case(sizes)
        if case.grid[1:] != (1, 1) or case.block[1:] != (1, 1):
            raise _NoPlan("not a 1-D launch")
        value = expr.evaluate(ctx.env(case))
        if not isinstance(value, int) or value <= 0 or case.grid[0] * case.block[0] < value:
            raise _NoPlan("the launch does not cover the rows")


class _KeptEmitter(CEmitter):
    """The model's C; in a loop over the row (`counter`: its counter's uid), an element the
    block keeps (`kept`: its key -> the shared array) is read from its `slot` there where the
    row fits (`optiml_keep`), else from where the kernel reads it."""

    def __init__(self, names: dict[int, str]):
        super().__init__(names, gx="optiml_row")
        self.kept: dict[str, str] = {}
        self.loaded: dict[str, str] = {}  # key -> the register the loop storing it loaded it to
        self.counter: int | None = None
        self.slot = ""
        # (op, the counter's uid, the divisor's C) -> the register that follows the quotient or
        # remainder of the counter by a loop-invariant divisor from one iteration to the next
        self.divided: dict[tuple[str, int, str], str] = {}

    def expr(self, e) -> str:
        if self.divided and isinstance(e, Binary) and e.op in _DIVISIONS and isinstance(e.a, Var):
            found = self.divided.get((e.op, e.a.uid, super().expr(e.b)))
            if found is not None:
                return found
        if isinstance(e, Load) and self.counter is not None:
            key = canon(e, self.counter)
            if key in self.loaded:
                return self.loaded[key]
            if key in self.kept:
                return f"(optiml_keep ? {self.kept[key]}[{self.slot}] : {super().expr(e)})"
        return super().expr(e)


def _row_counter(lp: Loop):
    """The loop's one induction variable (its counter over the row)."""
    steps = induction_steps(lp)
    counters = [c for c in lp.carried if c.var.uid in steps]
    if len(counters) != 1:
        raise _NoPlan("not one counter")
    return counters[0]


def _row_reads(loops: list[Loop]) -> tuple[dict[str, set[int]], dict[int, dict[str, Load]]]:
    """Of every loop over the row, the elements of inputs no loop stores to that it is sure to
    read (whatever the values) at its counter: by key (`canon`), the loops reading each, and per
    loop its loads by key."""
    stored = {s.tensor for lp in loops for s in lp.body if isinstance(s, Store)}
    readers: dict[str, set[int]] = {}
    loads: dict[int, dict[str, Load]] = {}
    for lp in loops:
        k = _row_counter(lp).var
        exprs = [c.update for c in lp.carried]
        exprs += [x for st in lp.body if isinstance(st, Store) for x in (st.index, st.value)]
        mine = loads.setdefault(lp.uid, {})
        for e in exprs:
            for load in sure_loads(e):
                if load.tensor in stored or load.type not in (FLOAT, DOUBLE):
                    continue
                if not any(isinstance(x, Var) and x.uid == k.uid for x in walk_expr(load.index)):
                    continue
                key = canon(load, k.uid)
                readers.setdefault(key, set()).add(lp.uid)
                mine[key] = load
    return readers, loads


class _Writer:
    """The kernel's body with a warp per row (`threads` None), or a block of `threads` per row,
    or a cluster of `cluster` such blocks per row: the row's loops strided over the lanes, each
    reduction all-reduced so that every lane holds the row's value."""

    def __init__(self, lifted: Lifted, threads: int | None = None, cluster: int = 1, keep: int = 0):
        self.m = lifted
        self.names: dict[int, str] = {}
        self.c = _KeptEmitter(self.names)
        self.lines: list[str] = []
        self.threads, self.cluster = threads, cluster
        self.stride = 32 if threads is None else threads * cluster
        # A block's part of the row kept in shared memory, `keep` elements a thread of each
        # element read by two loops or more (0: none): the loop that reads it first stores it,
        # the later ones read it there, where the row has at most keep x stride elements.
        self.keep = keep
        self.arrays: dict[str, str] = {}  # key -> its shared array
        self.kept_bytes = 0  # a slot of every thread for every kept element: their bytes
        self.row_length = ""  # the C expression of the row's length
        self._loads: dict[int, dict[str, Load]] = {}
        self._filled: dict[str, str] = {}
        self._divided = 0  # the loops' followed divisions so far (`_divisions`)
        self._steps: list[str] = []  # the open loop's steps of them

    def _head(self) -> list[str]:
        if self.threads is None:
            return [
                "    const int optiml_lane = threadIdx.x & 31;",
                "    const long long optiml_row = (long long)blockIdx.x * (blockDim.x >> 5) + "
                "(threadIdx.x >> 5);",
            ]
        if self.cluster == 1:
            return [
                "    const int optiml_lane = threadIdx.x;",
                "    const long long optiml_row = blockIdx.x;",
            ]
        return [
            "    const unsigned optiml_rank = __clusterRelativeBlockRank();",
            f"    const int optiml_lane = optiml_rank * {self.threads} + threadIdx.x;",
            f"    const long long optiml_row = blockIdx.x / {self.cluster};",
        ]

    def _all_reduce(self, op: str, t: str, ct: str, part: str, key: str) -> None:
        """Every lane's `part` combined into the row's value, in every lane."""
        shuffled = f"__shfl_xor_sync({FULL_MASK}, {part}, optiml_o)"
        self.lines.append(
            f"    for (int optiml_o = 16; optiml_o > 0; optiml_o >>= 1) "
            f"{part} = {_combine(op, t, part, shuffled)};"
        )
        if self.threads is None:
            return
        other = f"{part}_other"
        self._across_block(
            [(f"optiml_s_{key}", ct, part, other)],
            [f"        {part} = {_combine(op, t, part, other)};"],
        )

    def _across_block(self, values: list[tuple[str, str, str, str]], combine: list[str]) -> None:
        """The warps' values (`values`: a shared array for them, the C type, the variable holding
        a warp's in its every lane, the name `combine` reads another warp's as) combined across the
        block, warp by warp in order in every thread, then across the cluster."""
        warps = self.threads // 32
        size = warps + (self.cluster > 1)  # and the block's, for the cluster
        own = " ".join(f"{array}[threadIdx.x >> 5] = {part};" for array, _, part, _ in values)
        self.lines += [
            *(f"    __shared__ {ct} {array}[{size}];" for array, ct, _, _ in values),
            f"    if ((threadIdx.x & 31) == 0) {{ {own} }}",
            "    __syncthreads();",
            *(f"    {part} = {array}[0];" for array, _, part, _ in values),
            f"    for (int optiml_w = 1; optiml_w < {warps}; ++optiml_w) {{",
            *(f"        const {ct} {other} = {array}[optiml_w];" for array, ct, _, other in values),
            *combine,
            "    }",
            "    __syncthreads();  // the slots are free for the next value",
        ]
        self._across_cluster(values, combine)

    def _across_cluster(self, values: list[tuple[str, str, str, str]], combine: list[str]) -> None:
        """A block's values (`values`: its shared array, whose last slot takes the block's value,
        the C type, the variable holding it, the name `combine` reads another block's as) combined
        across the cluster, block by block in rank order in every block: the same bits in all."""
        if self.cluster == 1:
            return
        warps = self.threads // 32

        def of(array: str, ct: str, rank: str) -> str:
            return f"*static_cast<{ct}*>(__cluster_map_shared_rank(&{array}[{warps}], {rank}))"

        own = " ".join(f"{array}[{warps}] = {part};" for array, _, part, _ in values)
        self.lines += [
            f"    if (threadIdx.x == 0) {{ {own} }}",
            "    __cluster_barrier_arrive();",
            "    __cluster_barrier_wait();",
            *(f"    {part} = {of(array, ct, '0')};" for array, ct, part, _ in values),
            f"    for (int optiml_b = 1; optiml_b < {self.cluster}; ++optiml_b) {{",
            *(
                f"        const {ct} {other} = {of(array, ct, 'optiml_b')};"
                for array, ct, _, other in values
            ),
            *combine,
            "    }",
            "    __cluster_barrier_arrive();  // no block reuses or leaves its slots while read",
            "    __cluster_barrier_wait();",
        ]

    def write(self) -> tuple[str, str]:
        top = list(self.m.body)
        loops = loops_of(self.m)
        guard = self._guard([s.guard for s in top] + [lp.guard for lp in loops])
        rows = _rows_bound(guard)
        value_loops = [lp for lp in loops if lp not in top]
        for lp in loops:
            own = {c.var.uid for c in lp.carried}
            for e in loop_exprs(lp):
                if any(
                    isinstance(x, Var) and x.uid not in own for x in walk_expr(e, into_loops=False)
                ):
                    raise _NoPlan("a loop inside another loop")
        if not any(isinstance(s, Loop) for s in top) and not value_loops:
            raise _NoPlan("no loop over a row")
        items = sorted(top + value_loops, key=lambda x: x.line)
        whose = (
            "warp's" if self.threads is None else "block's" if self.cluster == 1 else "cluster's"
        )
        self.lines = [
            "{",
            *self._head(),
            f"    if (!(optiml_row < {self.c.expr(guard.b)})) return;  // the row is the {whose}",
        ]
        # a max and then a sum of exp(value - max) over the same row: one pass; and a sum, then
        # a sum of squares about a value of it (a mean): one pass, Welford's
        online = _online_pairs(items)
        spread = _spread_pairs(items)
        merged = {b.uid for b, _ in [*online.values(), *spread.values()]}
        if self.keep:
            fused = {b.uid: a for a, (b, _) in [*online.items(), *spread.items()]}
            self._declare_kept(loops, fused)
        for i, item in enumerate(items):
            if isinstance(item, Store):
                self.lines.append(f"    if (optiml_lane == 0) {self._store(item)}")
            elif item.uid in online:
                self._online(item, online[item.uid][0], i)
            elif item.uid in spread:
                self._welford(item, *spread[item.uid], i)
            elif item.uid not in merged:
                self._loop(item, i)
        self.lines.append("}")
        return rows, "\n".join(self.lines)

    def _declare_kept(self, loops: list[Loop], fused: dict[int, int]) -> None:
        """The shared arrays of the elements read by two passes or more (`fused`: a loop made
        one pass with another, by uid, reads in that one's), and whether this row fits them."""
        if self.threads is None:
            raise _NoPlan("a warp keeps no row")
        ranges = set()
        for lp in loops:
            k = _row_counter(lp)
            ranges.add((canon(k.init, k.var.uid), _upper(lp.cond, k.var)))
        if len(ranges) != 1:
            raise _NoPlan("loops over different ranges of the row")
        readers, self._loads = _row_reads(loops)
        passes = {key: {fused.get(uid, uid) for uid in who} for key, who in readers.items()}
        keys = sorted(key for key, who in passes.items() if len(who) > 1)
        if not keys:
            raise _NoPlan("no element read by two loops")
        ((_, bound),) = ranges
        self.row_length = bound
        self.lines += [
            "    extern __shared__ __align__(16) unsigned char optiml_dyn[];",
            f"    const long long optiml_slots = ({bound} + {self.stride - 1}) / {self.stride};",
            f"    const bool optiml_keep = optiml_slots <= {self.keep};  // the row fits",
        ]
        offset = "0"
        for j, key in enumerate(keys):
            load = next(loads[key] for loads in self._loads.values() if key in loads)
            ct = C_TYPES[load.type]
            self.arrays[key] = f"optiml_keep{j}"
            self.lines.append(
                f"    {ct}* optiml_keep{j} = reinterpret_cast<{ct}*>(optiml_dyn + {offset});"
                f"  // `{load.tensor}` along the row, a slot a thread per pass"
            )
            size = self.threads * (8 if ct == "double" else 4)  # a multiple of 16
            self.kept_bytes += size
            offset = f"optiml_slots * {self.kept_bytes}"

    def _enter(self, loop: Loop, k: Var, name: str, start: str) -> None:
        """In the loop just opened (`k` its counter, `name` its C name): its divisions of the
        counter followed from one iteration to the next (`_divisions`); the kept elements it
        is the first to read stored to their slots, and every kept one read from there."""
        self._divisions(loop, k, start)
        if not self.keep:
            return
        self.c.slot = f"(({name}) - ({start})) / {self.stride} * {self.threads} + threadIdx.x"
        mine = self._loads.get(loop.uid, {})
        self.c.kept, self.c.loaded = dict(self._filled), {}
        for j, (key, array) in enumerate(self.arrays.items()):
            if key in mine and key not in self._filled:
                self._filled[key] = array
                ct = C_TYPES[mine[key].type]
                self.lines += [
                    f"        const {ct} optiml_e{j} = {self.c.expr(mine[key])};",
                    f"        if (optiml_keep) {array}[{self.c.slot}] = optiml_e{j};",
                ]
                self.c.loaded[key] = f"optiml_e{j}"
        self.c.counter = k.uid

    def _leave(self) -> None:
        self.c.counter = None
        self.c.loaded = {}
        self.c.divided = {}
        self.lines[-1:-1] = self._steps  # before the loop's closing brace
        self._steps = []

    def _divisions(self, loop: Loop, k: Var, start: str) -> None:
        """A quotient or remainder of the loop's counter by a divisor the loop does not change
        (a batch norm's element `k / (H * W)` and `k % (H * W)` of its channel): a 64-bit
        division at every element, where the counter's fixed step moves them by a fixed quotient
        and remainder: divided once before the loop, then added and carried at each step."""
        if not re.fullmatch(r"\d+(LL)?", start):
            return
        found: dict[str, None] = {}
        for x in loop_exprs(loop):
            for e in walk_expr(x, into_loops=False):
                if (
                    isinstance(e, Binary)
                    and e.op in _DIVISIONS
                    and e.type in (INT, LONG)
                    and isinstance(e.a, Var)
                    and e.a.uid == k.uid
                    and not any(isinstance(y, Var | Load | LoopOut) for y in walk_expr(e.b))
                ):
                    found[self.c.expr(e.b)] = None
        heads = []
        for divisor in found:
            j = self._divided = self._divided + 1
            d, q, r = f"optiml_dv{j}", f"optiml_q{j}", f"optiml_r{j}"
            at = f"({start} + optiml_lane)"
            heads += [
                f"    const long long {d} = {divisor};",
                f"    long long {q} = {at} / {d}, {r} = {at} % {d};",
                f"    const long long {q}_step = {self.stride} / {d}, "
                f"{r}_step = {self.stride} % {d};",
            ]
            self._steps += [
                f"        {q} += {q}_step;",
                f"        {r} += {r}_step;",
                f"        if ({r} >= {d}) {{ {r} -= {d}; ++{q}; }}",
            ]
            self.c.divided[("/", k.uid, divisor)] = q
            self.c.divided[("%", k.uid, divisor)] = r
        self.lines[-1:-1] = heads  # before the loop's head

    def _online(self, a: Loop, b: Loop, i: int) -> None:
        """`a`'s max and `b`'s sum of exp(value - that max) in one pass over the row: each lane
        keeps its max and its sum scaled to it (a larger value rescales the sum by
        exp(old - new)), the lanes' pairs combined alike by shuffles (each side scaled the same
        way in both lanes: every lane holds the same bits), a block's warps' pairs through
        shared memory in one order; then the initial values."""
        k, ((m, _, value),) = counted_reductions(a, ("max",))
        _, ((s, _, _),) = counted_reductions(b, ("sum",))
        t = m.var.type
        ct, exp, fmax = C_TYPES[t], *(("expf", "fmaxf") if t == FLOAT else ("exp", "fmax"))
        name = f"optiml_k{i}"
        self.names[k.var.uid] = name
        mp, sp = f"{m.var.name}_part{i}", f"{s.var.name}_part{i}"
        mo, so = f"{m.var.name}_other{i}", f"{s.var.name}_other{i}"
        start, bound = self.c.expr(k.init), _upper(a.cond, k.var)

        def scaled(v: str, by: str, to: str) -> str:
            return f"({by} == {to} ? {v} : {v} * {exp}({by} - {to}))"

        self.lines += [
            f"    {ct} {mp} = {_IDENTITY[('max', t)]}, {sp} = {_IDENTITY[('sum', t)]};",
            f"    for (long long {name} = {start} + optiml_lane; {name} < {bound}; "
            f"{name} += {self.stride}) {{",
        ]
        self._enter(a, k.var, name, start)
        self.lines += [
            f"        const {ct} optiml_v = {self.c.expr(value)};",
            f"        const {ct} optiml_m = {fmax}({mp}, optiml_v);",
            f"        {sp} = {scaled(sp, mp, 'optiml_m')} + {exp}(optiml_v - optiml_m);",
            f"        {mp} = optiml_m;",
            "    }",
        ]
        self._leave()
        self.lines += [
            "    for (int optiml_o = 16; optiml_o > 0; optiml_o >>= 1) {",
            f"        const {ct} {mo} = __shfl_xor_sync({FULL_MASK}, {mp}, optiml_o);",
            f"        const {ct} {so} = __shfl_xor_sync({FULL_MASK}, {sp}, optiml_o);",
            f"        const {ct} optiml_m = {fmax}({mp}, {mo});",
            f"        {sp} = {scaled(sp, mp, 'optiml_m')} + {scaled(so, mo, 'optiml_m')};",
            f"        {mp} = optiml_m;",
            "    }",
        ]
        if self.threads is not None:  # the block's warps, in the same order in every thread
            self._across_block(
                [(f"optiml_sm_{i}", ct, mp, mo), (f"optiml_ss_{i}", ct, sp, so)],
                [
                    f"        const {ct} optiml_m = {fmax}({mp}, {mo});",
                    f"        {sp} = {scaled(sp, mp, 'optiml_m')} + {scaled(so, mo, 'optiml_m')};",
                    f"        {mp} = optiml_m;",
                ],
            )
        total_m, total_s = f"{m.var.name}_{i}", f"{s.var.name}_{i}"
        self.lines += [
            f"    const {ct} {total_m} = {fmax}(({self.c.expr(m.init)}), {mp});",
            f"    const {ct} {total_s} = ({self.c.expr(s.init)}) + {scaled(sp, mp, total_m)};",
        ]
        self.names[m.var.uid], self.names[s.var.uid] = total_m, total_s
        del self.names[k.var.uid]

    def _guard(self, guards) -> Binary:
        first = guards[0]
        if any(g != first for g in guards) or not isinstance(first, Binary):
            raise _NoPlan("statements under different conditions")
        return first

    def _loop(self, loop: Loop, i: int) -> None:
        args = _arg_pairs(loop)
        if args and self.threads is not None:
            raise _NoPlan("an argmax is combined by a warp")
        plain = replace(loop, carried=tuple(c for c in loop.carried if c not in args))
        ops = ("sum", "max", "min", "prod")
        step = 1
        try:
            k, reductions = counted_reductions(plain, ops)
        except ValueError as e:
            try:  # a loop down the row: a scan from the end (a reverse cumsum)
                k, reductions = counted_reductions(plain, ops, step=-1)
                step = -1
            except ValueError:
                raise _NoPlan(str(e)) from None
        paired = {best.var.uid: (arg, cmp) for arg, (best, cmp) in args.items()}
        carried = {c.var.uid for c, _, _ in reductions}
        if any(_mentions(x, carried) for s in loop.body for x in _stmt_parts(s)):
            if self.threads is not None:
                raise _NoPlan("a scan is scanned by a warp")
            self._scan(loop, i, k, reductions, step)
            return
        if step != 1:
            raise _NoPlan("a reduction down the row")
        if any(op == "prod" for _, op, _ in reductions):
            raise _NoPlan("a product")
        bound = _upper(loop.cond, k.var)
        name = f"optiml_k{i}"
        self.names[k.var.uid] = name
        t = {c.var.uid: C_TYPES[c.var.type] for c, _, _ in reductions}
        for c, op, _ in reductions:
            part = f"{c.var.name}_part{i}"
            self.lines.append(f"    {t[c.var.uid]} {part} = {_IDENTITY[(op, c.var.type)]};")
            if c.var.uid in paired:
                arg, _ = paired[c.var.uid]
                init = self.c.expr(arg.init)
                self.lines.append(f"    {C_TYPES[arg.var.type]} {arg.var.name}_part{i} = {init};")
                # the iteration that set it: ties go to the earlier one, as in the loop
                self.lines.append(f"    long long {arg.var.name}_k{i} = {_NEVER};")
        start = self.c.expr(k.init)
        self.lines.append(
            f"    for (long long {name} = {start} + optiml_lane; {name} < {bound}; "
            f"{name} += {self.stride}) {{"
        )
        self._enter(loop, k.var, name, start)
        for c, op, operand in reductions:
            part = f"{c.var.name}_part{i}"
            if c.var.uid in paired:
                arg, cmp = paired[c.var.uid]
                ap, kp = f"{arg.var.name}_part{i}", f"{arg.var.name}_k{i}"
                index = self.c.expr(arg.update.a)  # where it was met: the counter, or a form of it
                self.lines.append(
                    f"        {{ const {t[c.var.uid]} optiml_v = {self.c.expr(operand)}; "
                    f"if (optiml_v {cmp} {part}) {{ {part} = optiml_v; {ap} = {index}; "
                    f"{kp} = {name}; }} }}"
                )
                continue
            self.lines.append(
                f"        {part} = {_combine(op, c.var.type, part, self.c.expr(operand))};"
            )
        for s in loop.body:
            if not isinstance(s, Store) or s.atomic:
                raise _NoPlan("a loop inside the row loop, or an atomic")
            # each iteration its own element (lanes write different ones): k with a constant,
            # non-zero coefficient in an affine index
            # (or the digits of k in a row-major layout: a batch norm's element of its channel)
            f = affine(s.index)
            coefficient = [c for m, c in (f or {}).items() if m == (f"{k.var.name}#{k.var.uid}",)]
            if (
                not coefficient or any(k.var.name + "#" in a for m in f for a in m if len(m) > 1)
            ) and not distinct_per_value(s.index, k.var):
                raise _NoPlan("a store that several iterations may share")
            text = self._store(s)
            self.lines.append(
                f"        {text}"
                if s.guard == TRUE
                else f"        if ({self.c.expr(s.guard)}) {text}"
            )
        self.lines.append("    }")
        self._leave()
        for c, op, _ in reductions:
            part = f"{c.var.name}_part{i}"
            total = f"{c.var.name}_{i}"
            if c.var.uid in paired:
                self._arg_all_reduce(c, *paired[c.var.uid], i, t[c.var.uid])
                continue
            self._all_reduce(op, c.var.type, t[c.var.uid], part, f"{c.var.name}{i}")
            init = self.c.expr(c.init)
            self.lines.append(
                f"    const {t[c.var.uid]} {total} = {_combine(op, c.var.type, f'({init})', part)};"
            )
            self.names[c.var.uid] = total
        del self.names[k.var.uid]  # the counter is not a value after the loop

    def _welford(self, a: Loop, b: Loop, center, i: int) -> None:
        """`a`'s sum of a value and `b`'s sum of (the value - c)^2, c a value of that sum (a
        mean), in one pass: each lane keeps the plain sum and Welford's count, mean and sum of
        squares about it; pairs are combined by Chan's formula, the lower lane's (or warp's) as
        the first, so that every lane holds the same bits; then the sum of squares about c is
        M2 + n (mean - c)^2, exactly what the second loop sums."""
        k, ((sa, _, value),) = counted_reductions(a, ("sum",))
        _, ((sq, _, _),) = counted_reductions(b, ("sum",))
        t = sa.var.type
        ct = C_TYPES[t]
        name = f"optiml_k{i}"
        self.names[k.var.uid] = name
        ps, pn, pm, pq = (f"optiml_{x}{i}" for x in ("sum", "n", "mean", "m2"))
        os_, on, om, oq = (f"optiml_{x}_other{i}" for x in ("sum", "n", "mean", "m2"))
        start, bound = self.c.expr(k.init), _upper(a.cond, k.var)

        def chan(first: tuple, second: tuple) -> list[str]:
            (n1, m1, q1), (n2, m2, q2) = first, second
            return [
                f"        const long long optiml_nn = {n1} + {n2};",
                f"        const {ct} optiml_d = {m2} - {m1};",
                f"        const {ct} optiml_f = optiml_nn ? ({ct}){n2} / ({ct})optiml_nn : 0;",
                f"        {pm} = {m1} + optiml_d * optiml_f;",
                f"        {pq} = {q1} + {q2} + optiml_d * optiml_d * ({ct}){n1} * optiml_f;",
                f"        {pn} = optiml_nn;",
            ]

        self.lines += [
            f"    {ct} {ps} = 0, {pm} = 0, {pq} = 0;",
            f"    long long {pn} = 0;",
            f"    for (long long {name} = {start} + optiml_lane; {name} < {bound}; "
            f"{name} += {self.stride}) {{",
        ]
        self._enter(a, k.var, name, start)
        self.lines += [
            f"        const {ct} optiml_v = {self.c.expr(value)};",
            f"        {ps} += optiml_v;",
            f"        {pn} += 1;",
            f"        const {ct} optiml_d = optiml_v - {pm};",
            f"        {pm} += optiml_d / ({ct}){pn};",
            f"        {pq} += optiml_d * (optiml_v - {pm});",
            "    }",
        ]
        self._leave()
        self.lines += [
            "    for (int optiml_o = 16; optiml_o > 0; optiml_o >>= 1) {",
            f"        const {ct} {os_} = __shfl_xor_sync({FULL_MASK}, {ps}, optiml_o);",
            f"        const long long {on} = __shfl_xor_sync({FULL_MASK}, {pn}, optiml_o);",
            f"        const {ct} {om} = __shfl_xor_sync({FULL_MASK}, {pm}, optiml_o);",
            f"        const {ct} {oq} = __shfl_xor_sync({FULL_MASK}, {pq}, optiml_o);",
            f"        {ps} = {ps} + {os_};",
            "        if ((threadIdx.x & optiml_o) == 0) {",
            *[f"    {x}" for x in chan((pn, pm, pq), (on, om, oq))],
            "        } else {",
            *[f"    {x}" for x in chan((on, om, oq), (pn, pm, pq))],
            "        }",
            "    }",
        ]
        if self.threads is not None:  # the block's warps, in the same order in every thread
            self._across_block(
                [
                    (f"optiml_ssum_{i}", ct, ps, os_),
                    (f"optiml_sn_{i}", "long long", pn, on),
                    (f"optiml_smean_{i}", ct, pm, om),
                    (f"optiml_sm2_{i}", ct, pq, oq),
                ],
                [f"        {ps} = {ps} + {os_};", *chan((pn, pm, pq), (on, om, oq))],
            )
        total_sum, total_sq = f"{sa.var.name}_{i}", f"{sq.var.name}_{i}"
        self.lines.append(f"    const {ct} {total_sum} = ({self.c.expr(sa.init)}) + {ps};")
        self.names[sa.var.uid] = total_sum
        c = f"optiml_c{i}"
        self.lines += [
            f"    const {ct} {c} = {self.c.expr(center)};",
            f"    const {ct} {total_sq} = ({self.c.expr(sq.init)}) + ({pq} + ({ct}){pn} * "
            f"({pm} - {c}) * ({pm} - {c}));",
        ]
        self.names[sq.var.uid] = total_sq
        del self.names[k.var.uid]

    def _arg_all_reduce(self, best, arg, cmp: str, i: int, ct: str) -> None:
        """The warp's best value and where it was: a larger (`>`: or smaller) value wins, a tie
        goes to the earlier iteration (`>=`, `<=`: the later), as the loop would have it; then
        the value before the loop, which the loop's first iteration met first."""
        v, a, k = f"{best.var.name}_part{i}", f"{arg.var.name}_part{i}", f"{arg.var.name}_k{i}"
        at = C_TYPES[arg.var.type]
        tie = "<" if cmp in (">", "<") else ">"
        self.lines += [
            "    for (int optiml_o = 16; optiml_o > 0; optiml_o >>= 1) {",
            f"        const {ct} optiml_ov = __shfl_xor_sync({FULL_MASK}, {v}, optiml_o);",
            f"        const {at} optiml_oa = __shfl_xor_sync({FULL_MASK}, {a}, optiml_o);",
            f"        const long long optiml_ok = __shfl_xor_sync({FULL_MASK}, {k}, optiml_o);",
            f"        if (optiml_ok != {_NEVER} && ({k} == {_NEVER} || optiml_ov {cmp[0]} {v} || "
            f"(optiml_ov == {v} && optiml_ok {tie} {k}))) {{",
            f"            {v} = optiml_ov; {a} = optiml_oa; {k} = optiml_ok;",
            "        }",
            "    }",
        ]
        init_v, init_a = self.c.expr(best.init), self.c.expr(arg.init)
        won = f"{k} != {_NEVER} && {v} {cmp} ({init_v})"
        self.lines += [
            f"    const {ct} {best.var.name}_{i} = ({won}) ? {v} : ({ct})({init_v});",
            f"    const {at} {arg.var.name}_{i} = ({won}) ? {a} : ({at})({init_a});",
        ]
        self.names[best.var.uid] = f"{best.var.name}_{i}"
        self.names[arg.var.uid] = f"{arg.var.name}_{i}"

    def _scan(self, loop: Loop, i: int, k, reductions, step: int = 1) -> None:
        """A loop whose stores use its running values (a prefix sum, a running max): the row in
        chunks of 32 elements, a lane each; each running value scanned over the lanes by
        shuffles and carried from chunk to chunk, each lane's store given the value before its
        element, as the original iteration sees it. A loop down the row (`step` -1, a suffix
        scan) takes its chunks from its first element down, lane j at the chunk's j-th element in
        the loop's order."""
        stored = {}
        for s in loop.body:
            if not isinstance(s, Store) or s.atomic:
                raise _NoPlan("a loop inside the row loop, or an atomic")
            stored.setdefault(s.tensor, set()).add(s.index)
            f = affine(s.index)
            if not f or f.get((f"{k.var.name}#{k.var.uid}",)) != 1:
                raise _NoPlan("a scan's store that is not at the running element")
        # iterations share nothing but the running values: no load of what another one stored
        for s in loop.body:
            for part in _stmt_parts(s):
                for x in walk_expr(part):
                    if isinstance(x, Load) and x.index not in stored.get(x.tensor, {x.index}):
                        raise _NoPlan("a load of what another iteration stores")
        name, inside = f"optiml_k{i}", f"optiml_in{i}"
        self.names[k.var.uid] = name
        start = self.c.expr(k.init)
        for c, _, _ in reductions:
            t = C_TYPES[c.var.type]
            self.lines.append(f"    {t} {c.var.name}_carry{i} = {self.c.expr(c.init)};")
        base = f"optiml_base{i}"
        if step == 1:
            bound = _upper(loop.cond, k.var)
            self.lines += [
                f"    for (long long {base} = {start}; {base} < {bound}; {base} += 32) {{",
                f"        const long long {name} = {base} + optiml_lane;",
                f"        const bool {inside} = {name} < {bound};",
            ]
        else:
            low = _lower(loop.cond, k.var)
            self.lines += [
                f"    for (long long {base} = {start}; {base} >= {low}; {base} -= 32) {{",
                f"        const long long {name} = {base} - optiml_lane;",
                f"        const bool {inside} = {name} >= {low};",
            ]
        for c, op, operand in reductions:
            t, v = C_TYPES[c.var.type], c.var.name
            x, incl, excl, carry = f"{v}_x{i}", f"{v}_incl{i}", f"{v}_excl{i}", f"{v}_carry{i}"
            identity = _identity(op, c.var.type)
            shifted = f"__shfl_up_sync({FULL_MASK}, {x}, optiml_o)"
            self.lines += [
                f"        {t} {x} = {inside} ? ({t})({self.c.expr(operand)}) : {identity};",
                "        for (int optiml_o = 1; optiml_o < 32; optiml_o <<= 1) {",
                f"            const {t} optiml_y = {shifted};",
                f"            if (optiml_lane >= optiml_o) "
                f"{x} = {_combine(op, c.var.type, 'optiml_y', x)};",
                "        }",
                f"        const {t} {incl} = {_combine(op, c.var.type, carry, x)};",
                f"        {t} {excl} = __shfl_up_sync({FULL_MASK}, {incl}, 1);",
                f"        if (optiml_lane == 0) {excl} = {carry};",
            ]
            self.names[c.var.uid] = excl
        for s in loop.body:
            guard = inside if s.guard == TRUE else f"{inside} && ({self.c.expr(s.guard)})"
            self.lines.append(f"        if ({guard}) {self._store(s)}")
        for c, _, _ in reductions:
            v = c.var.name
            self.lines.append(f"        {v}_carry{i} = __shfl_sync({FULL_MASK}, {v}_incl{i}, 31);")
        self.lines.append("    }")
        for c, _, _ in reductions:
            self.names[c.var.uid] = f"{c.var.name}_carry{i}"
        del self.names[k.var.uid]

    def _store(self, s: Store) -> str:
        if s.atomic:
            raise _NoPlan("an atomic")
        return f"{s.tensor}[{self.c.expr(s.index)}] = {self.c.expr(s.value)};"


def _rows_bound(guard: Binary) -> str:
    """`row < R` with R a product of scalar parameters and whole numbers: R as a spec
    expression."""
    if guard.op != "<":
        raise _NoPlan("not `row < R`")
    f = affine(guard.a)
    if f is None or global_indices(f) != {("g.x",): 1}:
        raise _NoPlan("the guarded index is not the thread's row")
    return _size_text(guard.b)


def _size_text(e) -> str:
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Param):
        return e.name
    if isinstance(e, Const) and e.type in (INT, LONG) and int(e.value) > 0:
        return str(int(e.value))
    if isinstance(e, Binary) and e.op == "*":
        return f"{_size_text(e.a)} * {_size_text(e.b)}"
    raise _NoPlan("not `row < R` with R a product of sizes")


def _upper(cond, k: Var) -> str:
    """One past the last value of a counter that counts up while `k < bound` (or `k <= bound`)."""
    return _limit(cond, k, ("<", "<="), "not `k < bound`")


def _lower(cond, k: Var) -> str:
    """The least value of a counter that counts down while `k >= bound` (or `k > bound`)."""
    return _limit(cond, k, (">=", ">"), "not `k >= bound`")


def _limit(cond, k: Var, ops: tuple[str, str], what: str) -> str:
    """The bound of `k <op> bound` as C, one added where the op is `ops[1]` (the one that
    includes or excludes it the other way)."""
    if isinstance(cond, Binary) and cond.a == k and cond.op in ops:
        if any(isinstance(x, Var | LoopOut) for x in walk_expr(cond.b)):
            raise _NoPlan("a bound that moves")
        text = CEmitter({}, gx="optiml_row").expr(cond.b)
        return text if cond.op == ops[0] else f"({text}) + 1"
    raise _NoPlan(what)


_NEVER = "9223372036854775807LL"  # an argmax's iteration where no value has won yet


def _arg_pairs(loop: Loop) -> dict:
    """Carried values that record where a max or min was met: `a = cond ? index : a` with the
    same `cond` as the value's `m = cond ? v : m` (`v > m`, `v >= m`, `v < m`, `v <= m`), the
    index free of other carried values: arg -> (value, comparison as `v cmp m`)."""
    own = {c.var.uid for c in loop.carried}
    out = {}
    for a in loop.carried:
        u = a.update
        if not (isinstance(u, Select) and u.b == a.var and isinstance(u.cond, Binary)):
            continue
        cond = u.cond
        for best in loop.carried:
            if best is a or best.update != Select(cond, cond.a, best.var, best.var.type):
                continue
            if cond.b != best.var or cond.op not in (">", ">=", "<", "<="):
                continue
            if any(isinstance(x, Var) and x.uid in own - _counters(loop) for x in walk_expr(u.a)):
                continue
            out[a] = (best, cond.op)
    return out


def _counters(loop: Loop) -> set[int]:
    return set(induction_steps(loop))


def _identity(op: str, t: str) -> str:
    if op == "prod":
        return "1.0f" if t == FLOAT else "1.0" if t == DOUBLE else "1"
    return _IDENTITY[(op, t)]


def _mentions(e, uids: set[int]) -> bool:
    return any(isinstance(x, Var) and x.uid in uids for x in walk_expr(e, into_loops=False))


def _stmt_parts(s) -> list:
    return [s.index, s.value, s.guard] if isinstance(s, Store) else loop_exprs(s)


def _combine(op: str, t: str, a: str, b: str) -> str:
    if op == "sum":
        return f"{a} + {b}"
    if op == "prod":
        return f"{a} * {b}"
    if t in (FLOAT, DOUBLE):
        fn = (
            {"max": "fmaxf", "min": "fminf"}[op]
            if t == FLOAT
            else {"max": "fmax", "min": "fmin"}[op]
        )
        return f"{fn}({a}, {b})"
    return f"{op}({a}, {b})"
