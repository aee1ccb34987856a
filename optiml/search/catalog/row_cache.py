"""A thread's row kept in registers, emitted from the lifted model: for a kernel whose model is one
thread per row (its only thread index is the row, guarded by `row < R`) whose loops over the row
read the same elements again (a norm's sum of squares, then its scaled writes; a softmax's max,
sum and writes), the first loop that reads an element keeps it in a register array and the later
ones take it from there: the row crosses DRAM once instead of once per loop. The loops run fully
unrolled over the array's length with the row's length as a guard, so the array stays in
registers; a row longer than the array runs the loops as the kernel has them. The values, indices
and types are the model's (optiml.lift.emit), so any spelling of the same computation gets the
same kernel.

It pays where the rows are short and many, each row's elements a stride apart and neighbouring
threads' rows interleaved (an RMSNorm over the channels of an NCHW tensor: every load coalesced
across the warp, but the row read twice). A row as long as a warp's worth goes to `warp_rows`.
"""

from __future__ import annotations

from optiml.expr import ExprError
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import canon, induction_steps, sure_loads
from optiml.lift.model import (
    BF16,
    HALF,
    TRUE,
    Binary,
    Const,
    Load,
    Loop,
    Store,
    Var,
    loop_exprs,
    loops_of,
    walk_expr,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.warp_rows import (
    _check_launch,
    _NoPlan,
    _row_count,
    _rows_bound,
    _upper,
)

# Registers a thread may give to its row: 64 floats keep a 256-thread block at 2 blocks per SM
# with the kernel's own values besides.
MAX_CACHED = 64


class RowCache(Transformation):
    name = "row_cache"
    addresses = frozenset({"dram", "l2", "latency"})
    description = "a thread's row kept in registers across its loops, from the lifted model"

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted):
                return []
            plan = _Plan(lifted)
            _check_launch(ctx, plan.rows)
            length = _row_count(ctx, plan.bound_text)
            if not 2 <= length <= MAX_CACHED:
                return []
            cap = 4
            while cap < length:
                cap *= 2
            if cap * len(plan.keys) > MAX_CACHED:
                return []
            body = _Writer(lifted, plan, cap).write()
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        variant = ctx.rewrite(head + body)
        reads = ", ".join(sorted({plan.tensor_of[k] for k in plan.keys}))
        summary = (
            f"the thread's row of `{reads}` kept in {cap} registers across its "
            f"{len(plan.loops)} loops (read once, not {plan.reads} times), from the lifted model"
        )
        return [Rewrite({"cache": cap, "keys": len(plan.keys)}, summary, variant, 1.0)]


class _Plan:
    """The kernel as rows: its statements in order (every loop over the row from 0 to the same
    length, none inside another), and the elements two or more loops read (`keys`)."""

    def __init__(self, m: Lifted):
        top = list(m.body)
        self.loops = loops_of(m)
        guards = [s.guard for s in top] + [lp.guard for lp in self.loops]
        if any(g != guards[0] for g in guards) or not isinstance(guards[0], Binary):
            raise _NoPlan("statements under different conditions")
        self.guard = guards[0]
        self.rows = _rows_bound(self.guard)
        statements = [*top, *(s for lp in self.loops for s in lp.body)]
        stored = {s.tensor for s in statements if isinstance(s, Store)}
        self.counter: dict[int, Var] = {}
        bounds = set()
        readers: dict[str, set[int]] = {}
        self.tensor_of: dict[str, str] = {}
        self.kept_type: dict[str, str] = {}
        for lp in self.loops:
            k = self._counter(lp)
            own = {c.var.uid for c in lp.carried}
            for e in loop_exprs(lp):
                for x in walk_expr(e, into_loops=False):
                    if isinstance(x, Var) and x.uid not in own:
                        raise _NoPlan("a loop inside another loop")
            bounds.add(canon(lp.cond.b, k.uid))
            self.bound_text = _upper(lp.cond, k)
            for e in _iteration_exprs(lp):
                for load in sure_loads(e):
                    if load.tensor in stored or not any(
                        isinstance(x, Var) and x.uid == k.uid for x in walk_expr(load.index)
                    ):
                        continue
                    key = canon(load, k.uid)
                    readers.setdefault(key, set()).add(lp.uid)
                    self.tensor_of[key] = load.tensor
                    # a 16-bit element is kept as the float the model reads it as
                    self.kept_type[key] = (
                        "float" if load.type in (HALF, BF16) else C_TYPES[load.type]
                    )
        if len(bounds) != 1:
            raise _NoPlan("loops over rows of different lengths")
        self.keys = sorted(key for key, loops in readers.items() if len(loops) > 1)
        if not self.keys:
            raise _NoPlan("no element read by two loops")
        self.reads = max(len(readers[key]) for key in self.keys)

    def _counter(self, lp: Loop) -> Var:
        steps = induction_steps(lp)
        counters = [c for c in lp.carried if c.var.uid in steps]
        if len(counters) != 1:
            raise _NoPlan("not one counter")
        c = counters[0]
        step = steps[c.var.uid]
        if not (isinstance(step, Const) and step.value == 1) or canon(c.init, -1) != "0":
            raise _NoPlan("a counter that is not 0, 1, 2, ...")
        if not (isinstance(lp.cond, Binary) and lp.cond.op == "<" and lp.cond.a == c.var):
            raise _NoPlan("not `k < length`")
        self.counter[lp.uid] = c.var
        return c.var


def _iteration_exprs(lp: Loop) -> list:
    """What an iteration computes: the carried values' updates and the stores."""
    out = [c.update for c in lp.carried]
    for s in lp.body:
        if not isinstance(s, Store):
            raise _NoPlan("a loop inside the row loop")
        out += [s.index, s.value, s.guard]
    return out


class _Emitter(CEmitter):
    """The model's C, an element of the row that is kept read from its register."""

    def __init__(self, names: dict[int, str]):
        super().__init__(names, gx="optiml_row")
        self.kept: dict[str, str] = {}  # key -> the register array's name
        self.counter: tuple[int, str] | None = None  # the loop's counter uid and C name

    def expr(self, e) -> str:
        if isinstance(e, Load) and self.counter is not None:
            uid, name = self.counter
            array = self.kept.get(canon(e, uid))
            if array is not None:
                return f"{array}[{name}]"
        return super().expr(e)


class _Writer:
    """The kernel's body: the row's loops with the kept elements in registers where the row fits
    them, else as the kernel has them."""

    def __init__(self, m: Lifted, plan: _Plan, cap: int):
        self.m, self.plan, self.cap = m, plan, cap
        self.lines: list[str] = []

    def write(self) -> str:
        c = CEmitter({}, gx="optiml_row")
        length = self.plan.bound_text
        self.lines = [
            "{",
            "    const long long optiml_row = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
            f"    if (!(optiml_row < {c.expr(self.plan.guard.b)})) return;",
            f"    if ({length} <= {self.cap}) {{  // the row fits the registers",
        ]
        self._items(cached=True)
        self.lines.append("    } else {")
        self._items(cached=False)
        self.lines += ["    }", "}"]
        return "\n".join(self.lines)

    def _items(self, cached: bool) -> None:
        names: dict[int, str] = {}
        em = _Emitter(names)
        pad = "        "
        if cached:
            for j, key in enumerate(self.plan.keys):
                t = self.plan.kept_type[key]
                tensor = self.plan.tensor_of[key]
                self.lines.append(f"{pad}{t} optiml_r{j}[{self.cap}];  // `{tensor}` along the row")
        filled: dict[str, str] = {}
        values = [lp for lp in self.plan.loops if lp not in self.m.body]
        items = sorted([*self.m.body, *values], key=lambda x: x.line)
        for i, item in enumerate(items):
            if isinstance(item, Store):
                self.lines.append(f"{pad}{self._store(em, item)}")
                continue
            self._loop(em, names, item, i, filled if cached else None, pad)

    def _loop(self, em, names, lp: Loop, i: int, filled: dict | None, pad: str) -> None:
        k = self.plan.counter[lp.uid]
        counter = f"optiml_k{i}"
        names[k.uid] = counter
        carried = [c for c in lp.carried if c.var.uid != k.uid]
        for c in carried:
            names[c.var.uid] = f"{c.var.name}_{i}"
            self.lines.append(f"{pad}{C_TYPES[c.var.type]} {c.var.name}_{i} = {em.expr(c.init)};")
        inner = pad + "    "
        if filled is None:
            self.lines.append(
                f"{pad}for (long long {counter} = 0; {counter} < {self.plan.bound_text}; "
                f"++{counter}) {{"
            )
        else:
            self.lines += [
                f"{pad}#pragma unroll",
                f"{pad}for (int {counter} = 0; {counter} < {self.cap}; ++{counter}) {{",
                f"{inner}if ({counter} >= {self.plan.bound_text}) break;",
            ]
            # the row's elements this loop is the first to read: into their registers
            mine = {canon(x, k.uid): x for e in _iteration_exprs(lp) for x in sure_loads(e)}
            for j, key in enumerate(self.plan.keys):
                if key in mine and key not in filled:
                    filled[key] = f"optiml_r{j}"
                    self.lines.append(f"{inner}optiml_r{j}[{counter}] = {em.expr(mine[key])};")
            em.kept = dict(filled)
            em.counter = (k.uid, counter)
        # every value of the iteration from those at its start, as the model has them
        for c in carried:
            self.lines.append(
                f"{inner}const {C_TYPES[c.var.type]} {c.var.name}_next{i} = {em.expr(c.update)};"
            )
        for s in lp.body:
            text = self._store(em, s)
            self.lines.append(
                f"{inner}{text}"
                if s.guard in (TRUE, self.plan.guard)
                else f"{inner}if ({em.expr(s.guard)}) {text}"
            )
        for c in carried:
            self.lines.append(f"{inner}{c.var.name}_{i} = {c.var.name}_next{i};")
        self.lines.append(f"{pad}}}")
        em.counter = None
        del names[k.uid]

    @staticmethod
    def _store(em: CEmitter, s: Store) -> str:
        if s.atomic:
            raise _NoPlan("an atomic")
        return f"{s.tensor}[{em.expr(s.index)}] = {em.expr(s.value)};"
