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
from optiml.lift import Lifted, lift
from optiml.lift.emit import C_TYPES, CEmitter, NotEmittable
from optiml.lift.families import affine, global_indices, induction_steps
from optiml.lift.model import (
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
    walk_expr,
)
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
            plan = _Plan.read(lifted)
            body = plan.write()
            bound = _size_text(plan.bound)
            _check(ctx, bound)
        except (_NoPlan, NotEmittable, ExprError, KeyError, ValueError):
            return []
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
        value = expr.evaluate(
            {**ctx.spec.constants, **ctx.spec.template_values, **case.sizes, **case.scalars}
        )
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
        ct = {t.name: C_TYPES[t.dtype] for t in self.m.tensors.values()}
        bound = scalar.expr(self.bound)
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
            text = self.held[e.tensor]
            if e.type == "half":
                return f"__half2float({text})"
            if e.type == "bf16":
                return f"__bfloat162float({text})"
            return text
        if isinstance(e, Var) and e.uid in self.names:
            return self.names[e.uid]
        return super().expr(e)
