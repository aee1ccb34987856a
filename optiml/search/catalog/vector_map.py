"""A map with wide accesses, emitted from the lifted model (optiml.lift) rather than matched in
the text: for a kernel whose model writes each element of its outputs from elements at the same
index (a thread per element guarded by `i < N`, or a grid-stride loop over `i < N`), whatever the
spelling (macros for the index, `while` loops, a stride kept in a variable, 64-bit indices, any
mix of float, half, bf16 and integer tensors, scalars, broadcast reads such as `b[i % C]`), each
thread takes V consecutive elements per step of a grid-stride loop: one 16-byte access per
tensor read or written at the element (8 bytes for a narrower tensor beside a wider one), the
other reads element by element. A run-time check of the pointers' alignment falls back to the
element loop, which also takes the tail past the last whole vector, so any size and offset stays
correct. The values are the model's, written back by optiml.lift.emit.
"""

from __future__ import annotations

from dataclasses import replace

from optiml.expr import Expr as SizeExpr
from optiml.expr import ExprError
from optiml.harness.host import CTYPES
from optiml.lift import Lifted, lift
from optiml.lift.emit import CEmitter, NotEmittable
from optiml.lift.families import affine, global_indices, induction_steps
from optiml.lift.model import (
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Cast,
    Const,
    Expr,
    Load,
    Loop,
    LoopOut,
    Param,
    Store,
    Var,
    conjuncts,
    required,
    walk_expr,
)
from optiml.lift.unroll import NotUnrollable, has_loops, unrolled, written_size
from optiml.search.catalog.base import Context, Rewrite, Transformation
from optiml.search.catalog.vectorize import ensure_pack_helper

# bytes of an element by the model's type codes (optiml.cuda.types)
SIZES = {
    "f64": 8,
    "i64": 8,
    "u64": 8,
    "f32": 4,
    "i32": 4,
    "u32": 4,
    "f16": 2,
    "bf16": 2,
    "i16": 2,
    "u16": 2,
    "u8": 1,
    "i8": 1,
}
THREADS = 256
ELEMENT = "optiml_e"
# a tensor's element as stored (the model computes an int8 in int, but its pack holds int8s)
STORAGE = {**CTYPES, "f16": "__half", "bf16": "__nv_bfloat16"}


class _NoPlan(Exception):
    pass


class VectorMap(Transformation):
    name = "vector_map"
    addresses = frozenset({"dram", "l2", "l1_shared", "latency"})
    description = (
        "a map from the lifted model: V elements per thread, 16-byte accesses, a scalar tail"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            lifted = lift(ctx.source, ctx.kernel, ctx.spec)
            if not isinstance(lifted, Lifted):
                return []
        except (NotEmittable, ExprError, KeyError, ValueError):
            return []
        lifted = _windows_written_out(lifted)
        try:
            plan = _Plan.read(lifted)
            body = plan.write()
            bound = _size_text(plan.bound)
            _check(ctx, bound)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return self._propose_2d(ctx, lifted)
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        helpers = ensure_pack_helper(ctx.source.text)
        per = THREADS * plan.lanes
        names = ", ".join(sorted(plan.wide))
        out = []
        for grid, weight, what in (
            (f"cdiv({bound}, {per})", 1.0, "a vector per thread"),
            (
                f"min(cdiv({bound}, {per}), 8 * sm_count)",
                0.8,
                "a grid-stride loop over 8 blocks/SM",
            ),
        ):
            variant = ctx.rewrite(
                head + body, launch=([grid], [str(THREADS)], "0"), helpers=helpers
            )
            summary = (
                f"map from the lifted model: {plan.lanes} elements per step, wide accesses to "
                f"{names}, {what}, scalar tail"
            )
            out.append(Rewrite({"lanes": plan.lanes, "grid": what}, summary, variant, weight))
        return out

    def _propose_2d(self, ctx: Context, lifted: Lifted) -> list[Rewrite]:
        try:
            plan = _Plan2D(lifted, ctx)
            body = plan.write()
            bound = _size_text(plan.bound)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
        head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
        launch = ctx.spec.launch
        grid = [f"cdiv({bound}, {plan.threads} * {plan.lanes})", *launch.grid[1:]]
        variant = ctx.rewrite(
            head + body,
            launch=(grid, list(launch.block), launch.smem),
            helpers=ensure_pack_helper(ctx.source.text),
        )
        names = ", ".join(sorted({x.tensor for x in plan.wide} | {s.tensor for s in plan.stores}))
        summary = (
            f"2-D map from the lifted model: {plan.lanes} consecutive columns per thread, "
            f"16-byte accesses to {names} where aligned, element by element otherwise"
        )
        return [
            Rewrite(
                {"lanes": plan.lanes, "grid": "columns per thread, rows as launched"},
                summary,
                variant,
                1.0,
            )
        ]


def _windows_written_out(m: Lifted) -> Lifted:
    """The model with loops of a few constant iterations in its stores' values written out (a
    stencil's taps: each a read at another index, element by element), where they all can be."""
    if not all(isinstance(s, Store) for s in m.body):
        return m
    try:
        body = tuple(
            replace(s, value=unrolled(s.value), guard=unrolled(s.guard))
            if has_loops(s.value) or has_loops(s.guard)
            else s
            for s in m.body
        )
    except (NotUnrollable, RecursionError):
        return m
    # a window whose taps each hold the sum so far twice (a select between `s + tap` and `s`)
    # doubles with every tap: past a few thousand nodes it is no longer a window to write out
    if sum(written_size(e) for st in body for e in (st.value, st.guard)) > 4000:
        return m
    return replace(m, body=body)


def widened(e: Expr) -> Expr:
    """`e` with its integer sums and products in 64 bits, each int leaf cast first: the count of
    a tensor's elements past 2^31 (`batch_size * dim` of two int sizes; the model keeps no cast
    the kernel wrote on it, and a 32-bit product overflows before a 64-bit variable takes it)."""
    if isinstance(e, Binary) and e.op in ("+", "-", "*") and e.type in (INT, LONG):
        return Binary(e.op, widened(e.a), widened(e.b), LONG)
    if isinstance(e, Param | Var) and e.type == INT:
        return Cast(e, LONG)
    return e


def _size_text(e: Expr) -> str:
    while isinstance(e, Cast):
        e = e.a
    if isinstance(e, Param):
        return e.name
    if isinstance(e, Const) and e.type in ("int", "long") and int(e.value) > 0:
        return str(int(e.value))
    if isinstance(e, Binary) and e.op == "*":
        return f"{_size_text(e.a)} * {_size_text(e.b)}"
    raise _NoPlan("an element count that is not a product of sizes")


def _check(ctx: Context, bound: str) -> None:
    expr = SizeExpr.parse(bound)
    for sizes in ctx.spec.sizes:
        case = ctx.spec.case(sizes)
        if case.grid[1:] != (1, 1) or case.block[1:] != (1, 1):
            raise _NoPlan("not a 1-D launch")
        value = expr.evaluate(ctx.env(case))
        if not isinstance(value, int) or value <= 0:
            raise _NoPlan("an element count the spec cannot evaluate")


class _Plan:
    """The model as `out[e] = f(e)` for every element e < bound."""

    def __init__(self, lifted: Lifted, stores: list[Store], bound: Expr, element, names):
        self.m = lifted
        self.stores = stores
        self.bound = bound
        self.element = element  # is this index expression the element's?
        self.names = names  # Var uid -> C name (the loop's counter is the element)
        codes = {t.name: t.code for t in lifted.tensors.values()}
        self.wide: dict[str, int] = {}
        for s in stores:
            self.wide[s.tensor] = SIZES.get(codes[s.tensor], 0)
            for x in _element_loads(s, self.element):
                self.wide[x.tensor] = SIZES.get(codes[x.tensor], 0)
        if not self.wide or 0 in self.wide.values():
            raise _NoPlan("an element type without a wide access")
        self.lanes = 16 // max(self.wide.values())
        if self.lanes < 2:
            raise _NoPlan("elements as wide as a vector")

    @classmethod
    def read(cls, m: Lifted) -> _Plan:
        body = list(m.body)
        if len(body) == 1 and isinstance(body[0], Loop):
            return cls._grid_stride(m, body[0])
        if not body or not all(isinstance(s, Store) for s in body):
            raise _NoPlan("not stores per element")
        # every store under `i < N`, some also under a condition of their element
        first = conjuncts(body[0].guard)
        if not first or not (
            isinstance(first[0], Binary) and first[0].op == "<" and _is_g(first[0].a)
        ):
            raise _NoPlan("not `i < N`")
        bound = first[0]
        stores = []
        for s in body:
            rest = conjuncts(s.guard)
            if not rest or rest[0] != bound:
                raise _NoPlan("a store outside `i < N`")
            cond = TRUE
            for c in rest[1:]:
                cond = c if cond == TRUE else Binary("&&", cond, c, "bool")
            stores.append(replace(s, guard=cond))
        plan = cls(m, stores, bound.b, _is_g, {})
        plan._validate()
        return plan

    @classmethod
    def _grid_stride(cls, m: Lifted, loop: Loop) -> _Plan:
        steps = induction_steps(loop)
        if len(loop.carried) != 1 or loop.carried[0].var.uid not in steps:
            raise _NoPlan("a loop that carries values")
        c = loop.carried[0]
        step = affine(steps[c.var.uid])
        if not _is_g(c.init) or step is None or global_indices(step) != {("stride.x",): 1}:
            raise _NoPlan("not a grid-stride loop")
        cond = loop.cond
        if not (isinstance(cond, Binary) and cond.op == "<" and cond.a == c.var):
            raise _NoPlan("not `i < N`")
        if loop.guard != TRUE or not all(
            isinstance(s, Store) and s.guard == TRUE for s in loop.body
        ):
            raise _NoPlan("a condition in the loop")
        uid = c.var.uid

        def element(index: Expr) -> bool:
            return affine(index) == {(f"{c.var.name}#{uid}",): 1}

        plan = cls(m, list(loop.body), cond.b, element, {uid: ELEMENT})
        plan._validate()
        return plan

    def _validate(self) -> None:
        written = set()
        for s in self.stores:
            if s.atomic or not self.element(s.index):
                raise _NoPlan("a store at another element")
            if s.tensor in written:
                raise _NoPlan("two stores to one element")
            written.add(s.tensor)
        if any(isinstance(x, Builtin | LoopOut) for x in walk_expr(self.bound, False)):
            raise _NoPlan("a bound that moves")
        for s in self.stores:
            for x in (y for e in (s.value, s.guard) for y in walk_expr(e, into_loops=False)):
                if isinstance(x, LoopOut):
                    raise _NoPlan("a loop inside the element's value")
                if isinstance(x, Load) and x.tensor in written and not self.element(x.index):
                    raise _NoPlan("a read of another element of an output")

    # -- the kernel ---------------------------------------------------------------------------

    def write(self) -> str:
        v = self.lanes
        written = {s.tensor for s in self.stores}
        # an output read at the element is read before any store, as the model's values are
        reread = sorted(
            {x.tensor for s in self.stores for x in _element_loads(s, self.element)} & written
        )
        scalar = _Emitter(self.names, self.element, {t: f"optiml_l_{t}" for t in reread})
        lane = _Emitter(
            self.names, self.element, {t: f"optiml_p_{t}.v[optiml_j]" for t in self.wide}
        )
        packs = {t: f"optiml_p_{t}" for t in self.wide}
        ct = {t.name: STORAGE[t.code] for t in self.m.tensors.values()}
        bound = scalar.expr(widened(self.bound))
        aligned = " && ".join(
            f"reinterpret_cast<unsigned long long>({t}) % {size * v} == 0"
            for t, size in sorted(self.wide.items())
        )
        read = {x.tensor for s in self.stores for x in _element_loads(s, self.element)}
        # A conditional store to an output the element's values read anyway is a select between
        # the new value and the one read, stored whole; one to an output nothing reads stays a
        # store per element under its condition (reading the output only to write it back would
        # move its bytes twice where the condition is often false: a mask, a fill).
        merged = {s.tensor for s in self.stores if s.guard != TRUE and s.tensor in read}
        loads = sorted(read | merged)
        lines = [
            "{",
            f"    const long long optiml_n = {bound};",
            "    const long long optiml_t = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
            "    const long long optiml_s = (long long)gridDim.x * blockDim.x;",
            "    long long optiml_tail = 0;",
            f"    if ({aligned}) {{",
            f"        optiml_tail = optiml_n - optiml_n % {v};",
            f"        for (long long optiml_b = optiml_t * {v}; optiml_b < optiml_tail; "
            f"optiml_b += optiml_s * {v}) {{",
        ]
        for t in loads:
            pack = f"optiml_pack<{ct[t]}, {v}>"
            lines.append(
                f"            const {pack} {packs[t]} = "
                f"*reinterpret_cast<const {pack}*>({t} + optiml_b);"
            )
        whole = [s for s in self.stores if s.guard == TRUE or s.tensor in merged]
        if not whole and not loads:
            raise _NoPlan("nothing to move 16 bytes at a time: only conditional stores")
        for s in whole:
            lines.append(f"            optiml_pack<{ct[s.tensor]}, {v}> optiml_q_{s.tensor};")
        lines += [
            "#pragma unroll",
            f"            for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) {{",
            f"                const long long {ELEMENT} = optiml_b + optiml_j;",
        ]
        dtype = {t.name: t.dtype for t in self.m.tensors.values()}
        for s in self.stores:
            value = lane.cast(lane.expr(s.value), s.value.type, dtype[s.tensor])
            if s not in whole:
                lines.append(
                    f"                if ({lane.expr(s.guard)}) {s.tensor}[{ELEMENT}] = {value};"
                )
                continue
            if s.guard != TRUE:
                value = f"({lane.expr(s.guard)}) ? {value} : {packs[s.tensor]}.v[optiml_j]"
            lines.append(f"                optiml_q_{s.tensor}.v[optiml_j] = {value};")
        lines.append("            }")
        for s in whole:
            pack = f"optiml_pack<{ct[s.tensor]}, {v}>"
            lines.append(
                f"            *reinterpret_cast<{pack}*>({s.tensor} + optiml_b) = "
                f"optiml_q_{s.tensor};"
            )
        lines += [
            "        }",
            "    }",
            f"    for (long long {ELEMENT} = optiml_tail + optiml_t; {ELEMENT} < optiml_n; "
            f"{ELEMENT} += optiml_s) {{",
        ]
        for t in reread:
            lines.append(f"        const {ct[t]} optiml_l_{t} = {t}[{ELEMENT}];")
        for s in self.stores:
            value = scalar.cast(scalar.expr(s.value), s.value.type, dtype[s.tensor])
            store = f"{s.tensor}[{ELEMENT}] = {value};"
            if s.guard != TRUE:
                store = f"if ({scalar.expr(s.guard)}) {store}"
            lines.append(f"        {store}")
        lines += ["    }", "}"]
        return "\n".join(lines)


def _is_g(e: Expr) -> bool:
    if e.type not in ("int", "long"):
        return False
    f = affine(e)
    return f is not None and global_indices(f) == {("g.x",): 1}


def _element_loads(s: Store, element) -> list[Load]:
    """The store's reads at the element, in its value and its condition."""
    return [
        x
        for e in (s.value, s.guard)
        for x in walk_expr(e, into_loops=False)
        if isinstance(x, Load) and element(x.index)
    ]


class _Emitter(CEmitter):
    """The model's values at element `optiml_e`: a read at the element from where `held` holds
    it (a pack's lane, a local read before the stores), the element's index by name."""

    def __init__(self, names, element, held: dict[str, str]):
        super().__init__({**names}, gx=ELEMENT)
        self.element = element
        self.held = held

    def expr(self, e: Expr) -> str:
        if isinstance(e, Load) and e.tensor in self.held and self.element(e.index):
            return self.from_memory(self.held[e.tensor], e.type)
        if isinstance(e, Var) and e.uid in self.names:
            return self.names[e.uid]
        return super().expr(e)


# -- a map over a 2-D or 3-D launch: consecutive columns along x, rows along y and z -----------

_X_ATOMS = frozenset({"blockIdx.x", "threadIdx.x", "blockDim.x", "gridDim.x", "stride.x"})
COL = "optiml_c"  # the thread's first column
LANE_COL = "(optiml_c + optiml_j)"
# the row's indices in 64 bits: an index is written from its affine form with them
_ROW_ATOMS = (
    {
        f"{name}.{d}": f"(long long){name}.{d}"
        for name in ("blockIdx", "threadIdx", "blockDim", "gridDim")
        for d in "yz"
    }
    | {f"g.{d}": f"((long long)blockIdx.{d} * blockDim.{d} + threadIdx.{d})" for d in "yz"}
    | {f"stride.{d}": f"((long long)gridDim.{d} * blockDim.{d})" for d in "yz"}
)


def _form(e: Expr) -> dict | None:
    f = affine(e) if e.type in ("int", "long") else None
    return None if f is None else global_indices(f)


def _column_unit(e: Expr) -> bool:
    """An index whose column term is `1 * g.x` and whose other terms read no x index."""
    f = _form(e)
    return (
        f is not None
        and f.get(("g.x",)) == 1
        and not any(a in _X_ATOMS or a == "g.x" for m in f if m != ("g.x",) for a in m)
    )


def _reads_x(e: Expr) -> bool:
    return any(
        isinstance(x, Builtin) and x.name.endswith(".x") for x in walk_expr(e, into_loops=False)
    )


def column_bound(guard: list[Expr]) -> tuple[Expr, list[Expr]]:
    """A guard's `column < N` (the column the x index, N free of thread indices) and the rest of
    its conditions, which read no x index (the row's); `_NoPlan` otherwise."""
    cols = [c for c in guard if _reads_x(c)]
    if len(cols) != 1:
        raise _NoPlan("not one `column < N` condition")
    bound = cols[0]
    if not (
        isinstance(bound, Binary)
        and bound.op == "<"
        and _form(bound.a) == {("g.x",): 1}
        and not any(isinstance(x, Builtin) for x in walk_expr(bound.b, into_loops=False))
    ):
        raise _NoPlan("not `column < N`")
    return bound.b, [c for c in guard if not _reads_x(c)]


class _Plan2D:
    """The model as `out[A(rows) + c] = f(rows, c)` for every column c < bound of a launch whose
    x index is the column (`g.x`) and whose y and z indices pick the row: each thread takes V
    consecutive columns of its row, 16 bytes at a time where its addresses are aligned."""

    def __init__(self, lifted: Lifted, ctx: Context):
        self.m = lifted
        body = list(lifted.body)
        if not body or not all(isinstance(s, Store) and not s.atomic for s in body):
            raise _NoPlan("not stores per element")
        guard = required(body[0].guard)
        if any(required(s.guard) != guard for s in body):
            raise _NoPlan("stores under different conditions")
        self.bound, self.row_guard = column_bound(guard)
        if not any(_reads_x(s.index) or _reads_x(s.value) for s in body) or not any(
            isinstance(x, Builtin) and not x.name.endswith(".x")
            for s in body
            for x in walk_expr(s.index, into_loops=False)
        ):
            raise _NoPlan("not a 2-D map (a 1-D one is vector_map's other plan)")
        self.stores = body
        written: dict[str, Expr] = {}
        for s in body:
            if not _column_unit(s.index):
                raise _NoPlan("a store that does not move with the column")
            if s.tensor in written:
                raise _NoPlan("two stores to one tensor")
            written[s.tensor] = s.index
        loads = [x for s in body for x in walk_expr(s.value, into_loops=False)]
        for x in loads:
            if isinstance(x, LoopOut | Var):
                raise _NoPlan("a loop inside the element's value")
            if isinstance(x, Load) and x.tensor in written and x.index != written[x.tensor]:
                raise _NoPlan("a read of another element of an output")
        codes = {t.name: t.code for t in lifted.tensors.values()}
        self.wide = sorted(
            {x for x in loads if isinstance(x, Load) and _column_unit(x.index)},
            key=lambda x: (x.tensor, str(x.index)),
        )
        sizes = [SIZES.get(codes[x.tensor], 0) for x in self.wide]
        sizes += [SIZES.get(codes[s.tensor], 0) for s in body]
        if 0 in sizes:
            raise _NoPlan("an element type without a wide access")
        self.lanes = 16 // max(sizes)
        if self.lanes < 2:
            raise _NoPlan("elements as wide as a vector")
        # a read a constant number of columns off the stores' (a stencil's neighbour) can never
        # be aligned with them: it is read element by element
        anchor = _form(body[0].index).get((), 0)
        self.wide = [x for x in self.wide if (_form(x.index).get((), 0) - anchor) % self.lanes == 0]
        self.size = {t: SIZES[codes[t]] for t in {x.tensor for x in self.wide} | set(written)}
        block = ctx.spec.launch.block
        self.threads = block[0]
        if len(ctx.spec.launch.grid) < 2:
            raise _NoPlan("a 1-D launch")
        for sizes_ in ctx.spec.sizes:
            case = ctx.spec.case(sizes_)
            n = SizeExpr.parse(_size_text(self.bound)).evaluate(ctx.env(case))
            if not isinstance(n, int) or case.grid[0] * case.block[0] < n:
                raise _NoPlan("the launch does not cover the columns")

    def write(self) -> str:
        v = self.lanes
        atoms = {**_ROW_ATOMS, "g.x": LANE_COL}
        held = {x: f"optiml_p{i}.v[optiml_j]" for i, x in enumerate(self.wide)}
        lane = _Emitter2D({}, LANE_COL, atoms, held)
        scalar = _Emitter2D({}, LANE_COL, atoms, {})
        first = _Emitter2D({}, COL, {**_ROW_ATOMS, "g.x": COL}, {})
        ct = {t.name: STORAGE[t.code] for t in self.m.tensors.values()}
        dtype = {t.name: t.dtype for t in self.m.tensors.values()}
        bound = first.expr(widened(self.bound))
        lines = [
            "{",
            f"    const long long {COL} = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * {v};",
        ]
        if self.row_guard:
            rows = " && ".join(f"({first.expr(c)})" for c in self.row_guard)
            lines.append(f"    if (!({rows})) return;")
        lines.append(f"    if ({COL} >= {bound}) return;")
        aligned = [f"{COL} + {v} <= {bound}"]
        for x in self.wide:
            aligned.append(
                f"reinterpret_cast<unsigned long long>({x.tensor} + {first.expr(x.index)}) "
                f"% {self.size[x.tensor] * v} == 0"
            )
        for s in self.stores:
            aligned.append(
                f"reinterpret_cast<unsigned long long>({s.tensor} + {first.expr(s.index)}) "
                f"% {self.size[s.tensor] * v} == 0"
            )
        lines.append(f"    if ({' && '.join(dict.fromkeys(aligned))}) {{")
        for i, x in enumerate(self.wide):
            pack = f"optiml_pack<{ct[x.tensor]}, {v}>"
            lines.append(
                f"        const {pack} optiml_p{i} = "
                f"*reinterpret_cast<const {pack}*>({x.tensor} + {first.expr(x.index)});"
            )
        for n, s in enumerate(self.stores):
            lines.append(f"        optiml_pack<{ct[s.tensor]}, {v}> optiml_q{n};")
        lines += [
            "#pragma unroll",
            f"        for (int optiml_j = 0; optiml_j < {v}; ++optiml_j) {{",
        ]
        for n, s in enumerate(self.stores):
            value = lane.cast(lane.expr(s.value), s.value.type, dtype[s.tensor])
            lines.append(f"            optiml_q{n}.v[optiml_j] = {value};")
        lines.append("        }")
        for n, s in enumerate(self.stores):
            pack = f"optiml_pack<{ct[s.tensor]}, {v}>"
            lines.append(
                f"        *reinterpret_cast<{pack}*>({s.tensor} + {first.expr(s.index)}) = "
                f"optiml_q{n};"
            )
        lines += [
            "    } else {",
            f"        for (int optiml_j = 0; optiml_j < {v} && {LANE_COL} < {bound}; ++optiml_j) {{",
        ]
        # an output read at its own element is read before any store, as the model's values are
        written = {s.tensor for s in self.stores}
        outputs_read = dict.fromkeys(
            x
            for s in self.stores
            for x in walk_expr(s.value, into_loops=False)
            if isinstance(x, Load) and x.tensor in written
        )
        reread = {x: f"optiml_l{i}" for i, x in enumerate(outputs_read)}
        for x, name in reread.items():
            lines.append(f"            const {ct[x.tensor]} {name} = {scalar.expr(x)};")
        element = _Emitter2D({}, LANE_COL, atoms, reread)
        for s in self.stores:
            value = element.cast(element.expr(s.value), s.value.type, dtype[s.tensor])
            lines.append(f"            {s.tensor}[{scalar.expr(s.index)}] = {value};")
        lines += ["        }", "    }", "}"]
        return "\n".join(lines)


class _Emitter2D(CEmitter):
    """The model's values at column `col` of the thread's row: the column index by name (from
    any affine spelling), reads held in packs or locals where `held` names them."""

    def __init__(self, names, col: str, atoms: dict[str, str], held: dict):
        super().__init__(names, gx=col, atoms=atoms)
        self.held = held

    def expr(self, e: Expr) -> str:
        if isinstance(e, Builtin) and not e.name.endswith(".x"):
            return e.name  # the row's indices stay as launched
        if isinstance(e, Load) and e in self.held:
            return self.from_memory(self.held[e], e.type)
        return super().expr(e)
