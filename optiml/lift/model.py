"""What a kernel computes, as plain data: the lifted model.

A lifted kernel is a small program over one generic thread: expressions over the thread's
built-in indices (`threadIdx.x`, `blockIdx.y`, `blockDim.x`, `gridDim.x`), the scalar parameters
and loads from the pointer parameters; stores guarded by the condition under which the thread
reaches them; and loops, which carry values from one iteration to the next (an induction
variable, an accumulator) and may store. Local variables are gone: every value is an expression
tree of what it was computed from. A value read after a loop is `LoopOut`, the final value of
one of the loop's carried variables.

Every node is a frozen dataclass, so structurally equal expressions compare and hash equal.
`optiml.lift.run` executes the model on the host with NumPy; `optiml.lift.families` reads its
structure (accesses, reductions, the iteration domain).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

# Scalar types of values: what C's usual arithmetic conversions need, and what NumPy computes in.
BOOL, INT, LONG, FLOAT, DOUBLE, HALF, BF16 = (
    "bool",
    "int",
    "long",
    "float",
    "double",
    "half",
    "bf16",
)
FLOATS = (HALF, BF16, FLOAT, DOUBLE)
INTS = (BOOL, INT, LONG)


def arith_type(a: str, b: str) -> str:
    """The type `a op b` is computed in (C's usual arithmetic conversions; 16-bit floats are
    computed in float)."""
    if DOUBLE in (a, b):
        return DOUBLE
    if a in FLOATS or b in FLOATS:
        return FLOAT
    return LONG if LONG in (a, b) else INT


_ids = itertools.count(1)


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    type: str


@dataclass(frozen=True)
class Builtin:
    """`threadIdx.x`, `blockIdx.y`, `blockDim.z`, `gridDim.x`."""

    name: str
    type: str = INT


@dataclass(frozen=True)
class Param:
    """A scalar parameter of the kernel."""

    name: str
    type: str


@dataclass(frozen=True)
class Var:
    """A value carried by a loop: its value in the current iteration (inside the loop's body)."""

    name: str
    type: str
    uid: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True)
class Load:
    tensor: str
    index: Expr  # in elements of the tensor
    type: str


@dataclass(frozen=True)
class Unary:
    op: str  # "-" | "!" | "~"
    a: Expr
    type: str


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / % << >> & | ^ < <= > >= == != && ||
    a: Expr
    b: Expr
    type: str


@dataclass(frozen=True)
class Call:
    """A math function by its canonical name: exp, log, sqrt, rsqrt, tanh, erf, abs, max, min,
    pow, fma, floor, ceil, sin, cos, exp2, log2, ..."""

    fn: str
    args: tuple[Expr, ...]
    type: str


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr
    type: str


@dataclass(frozen=True)
class Cast:
    a: Expr
    type: str


@dataclass(frozen=True)
class Carried:
    var: Var
    init: Expr  # the value before the loop
    update: Expr  # the value at the end of an iteration, in terms of the loop's Vars


@dataclass(frozen=True)
class Loop:
    """`for`/`while`: while `cond` holds (in terms of the carried Vars), run the body's stores and
    update every carried variable at once. `guard`: the condition under which the thread reaches
    the loop. `line`: where the loop starts in the file (1-based)."""

    carried: tuple[Carried, ...]
    cond: Expr
    body: tuple[Stmt, ...]
    guard: Expr
    line: int
    uid: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True)
class LoopOut:
    """The value of a loop's carried variable once the loop is done."""

    loop: Loop
    var: Var

    @property
    def type(self) -> str:
        return self.var.type


Expr = Const | Builtin | Param | Var | Load | Unary | Binary | Call | Select | Cast | LoopOut


@dataclass(frozen=True)
class Store:
    """`tensor[index] = value` where `guard` holds; `op` "=" or, for an atomic, its reduction
    ("add", "max", "min", "sub", "and", "or", "xor", "exch")."""

    tensor: str
    index: Expr
    value: Expr
    guard: Expr
    op: str
    atomic: bool
    line: int


Stmt = Store | Loop

TRUE = Const(True, BOOL)
FALSE = Const(False, BOOL)


@dataclass
class Tensor:
    name: str
    dtype: str  # the model's scalar type of an element: float, double, half, bf16, int, long, bool
    code: str  # the type code of optiml.cuda.types ("f32", "u8", ...)
    role: str  # "in" | "out" | "inout" (from the spec)


@dataclass
class Lifted:
    kernel: str
    tensors: dict[str, Tensor]
    scalars: dict[str, str]  # name -> type
    body: tuple[Stmt, ...]
    params: list[str]  # every parameter in signature order


@dataclass
class Unlifted:
    """A kernel that stays opaque: what was not understood, and where (1-based lines)."""

    kernel: str
    reasons: list[tuple[int, str]]

    def message(self) -> str:
        return "; ".join(f"line {line}: {why}" for line, why in self.reasons)


def children(e: Expr) -> tuple[Expr, ...]:
    """The expressions directly under `e` (a LoopOut's loop is not an expression child)."""
    match e:
        case Load(index=i):
            return (i,)
        case Unary(a=a) | Cast(a=a):
            return (a,)
        case Binary(a=a, b=b):
            return (a, b)
        case Call(args=args):
            return args
        case Select(cond=c, a=a, b=b):
            return (c, a, b)
    return ()


class Rewriter:
    """A rewrite of a model's expressions, statements and loops: `sub` of an expression is the
    subclass's `_sub` (which rebuilds what it does not change itself with `rebuilt`), each
    expression and loop rewritten once (`memo`, which a subclass holds), `guard` applied to a
    rewritten loop's guard."""

    memo: dict

    def sub(self, e: Expr) -> Expr:
        if e in self.memo:
            return self.memo[e]
        out = self._sub(e)
        self.memo[e] = out
        return out

    def _sub(self, e: Expr) -> Expr:
        return self.rebuilt(e)

    def rebuilt(self, e: Expr) -> Expr:
        """`e` with each operand rewritten (a loop's value from its rewritten loop)."""
        match e:
            case Load():
                return replace(e, index=self.sub(e.index))
            case Unary() | Cast():
                return replace(e, a=self.sub(e.a))
            case Binary():
                return replace(e, a=self.sub(e.a), b=self.sub(e.b))
            case Call():
                return replace(e, args=tuple(self.sub(x) for x in e.args))
            case Select():
                return replace(e, cond=self.sub(e.cond), a=self.sub(e.a), b=self.sub(e.b))
            case LoopOut():
                return LoopOut(self.loop(e.loop), e.var)
        return e

    def guard(self, e: Expr) -> Expr:
        return e

    def loop(self, loop: Loop) -> Loop:
        key = ("loop", loop.uid)
        if key not in self.memo:
            self.memo[key] = replace(
                loop,
                carried=tuple(
                    Carried(c.var, self.sub(c.init), self.sub(c.update)) for c in loop.carried
                ),
                cond=self.sub(loop.cond),
                body=tuple(self.stmt(s) for s in loop.body),
                guard=self.guard(self.sub(loop.guard)),
            )
        return self.memo[key]

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Loop):
            return self.loop(s)
        return replace(s, index=self.sub(s.index), value=self.sub(s.value), guard=self.sub(s.guard))


def walk_expr(e: Expr, into_loops: bool = True):
    """Every expression under `e`, itself first; with `into_loops`, also those of the loops whose
    results it uses (their conditions, initial values, updates and stores), each loop once."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(children(x))
        if into_loops and isinstance(x, LoopOut) and x.loop.uid not in seen:
            seen.add(x.loop.uid)
            stack.extend(loop_exprs(x.loop))


def loop_exprs(loop: Loop) -> list[Expr]:
    out: list[Expr] = [loop.cond, loop.guard]
    for c in loop.carried:
        out += [c.init, c.update]
    for s in loop.body:
        out += stmt_exprs(s)
    return out


def stmt_exprs(s: Stmt) -> list[Expr]:
    if isinstance(s, Store):
        return [s.index, s.value, s.guard]
    return loop_exprs(s)


def walk_stmts(body: tuple[Stmt, ...]):
    """Every statement, loops' bodies included, in program order."""
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from walk_stmts(s.body)


def loops_of(lifted: Lifted) -> list[Loop]:
    """Every loop of the model, whether it stores or only computes values, each once."""
    found: dict[int, Loop] = {}
    for s in walk_stmts(lifted.body):
        if isinstance(s, Loop):
            found.setdefault(s.uid, s)
        for e in stmt_exprs(s):
            for x in walk_expr(e):
                if isinstance(x, LoopOut):
                    found.setdefault(x.loop.uid, x.loop)
    return list(found.values())


def conjuncts(guard: Expr) -> list[Expr]:
    """The conditions a guard's `&&` requires, in order."""
    if isinstance(guard, Binary) and guard.op == "&&":
        return conjuncts(guard.a) + conjuncts(guard.b)
    return [] if guard == TRUE else [guard]


_NEGATED = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "=="}


def required(guard: Expr) -> list[Expr]:
    """The conditions a guard requires, as `conjuncts`, with a negation pushed through `||` and
    into comparisons: `!(r >= R || c >= C)` (an early return's) requires `r < R` and `c < C`.
    (Integer comparisons: a float comparison's negation also holds for NaN, so it stays.)"""
    if isinstance(guard, Unary) and guard.op == "!":
        a = guard.a
        if isinstance(a, Unary) and a.op == "!":
            return required(a.a)
        if isinstance(a, Binary) and a.op == "||":
            return required(Unary("!", a.a, BOOL)) + required(Unary("!", a.b, BOOL))
        if isinstance(a, Binary) and a.op in _NEGATED and a.a.type in INTS and a.b.type in INTS:
            return [Binary(_NEGATED[a.op], a.a, a.b, BOOL)]
    if isinstance(guard, Binary) and guard.op == "&&":
        return required(guard.a) + required(guard.b)
    return [] if guard == TRUE else [guard]


def merge_complementary(stores: list[Store]) -> list[Store]:
    """Two plain stores to the same element under conditions that differ in one conjunct, `c` for
    one and `!c` for the other (`if (bad) { out[i] = 0; return; } out[i] = v;`), as one store of
    `c ? first : second` under what they share: exactly one of them ran, and the select evaluates
    only the value it picks."""
    out = list(stores)
    i = 0
    while i < len(out):
        a = out[i]
        for j in range(i + 1, len(out)):
            b = out[j]
            if not (isinstance(a, Store) and isinstance(b, Store)) or a.atomic or b.atomic:
                continue
            if (a.tensor, a.index) != (b.tensor, b.index):
                continue
            ca, cb = conjuncts(a.guard), conjuncts(b.guard)
            shared = [c for c in ca if c in cb]
            ra, rb = [c for c in ca if c not in shared], [c for c in cb if c not in shared]
            if len(ra) != 1 or len(rb) != 1:
                continue
            if rb[0] == Unary("!", ra[0], BOOL):
                cond = ra[0]
            elif ra[0] == Unary("!", rb[0], BOOL):
                cond = rb[0]
                a, b = b, a
            else:
                continue
            guard: Expr = TRUE
            for c in shared:
                guard = c if guard == TRUE else Binary("&&", guard, c, BOOL)
            t = arith_type(a.value.type, b.value.type) if a.value.type != b.value.type else None
            va = a.value if t is None else Cast(a.value, t)
            vb = b.value if t is None else Cast(b.value, t)
            value = Select(cond, va, vb, t or a.value.type)
            out[i] = Store(a.tensor, a.index, value, guard, "=", False, min(a.line, b.line))
            del out[j]
            break
        else:
            i += 1
    return out
