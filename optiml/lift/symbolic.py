"""From a kernel's tree to its lifted model, by executing the body symbolically for one generic
thread.

Values are expressions (optiml.lift.model) of what they were computed from; local variables
live in an environment that maps names to those expressions, so `float v = x[i]; v = v * a;`
leaves `v` as `Load(x, i) * a`. A pointer value is a tensor and an element offset, so a row
pointer `x = input + row * cols` indexes `input` at `row * cols + j`. `if` runs both branches and
merges the variables they change with `Select`; `return` turns the condition under which the
thread still runs (`live`) false on its path, and every later store is guarded by `live`. A
loop runs its body once with its carried variables (those the body assigns and that were
declared before it) as `Var`s: the model keeps the loop's condition, the carried variables'
initial values and updates, and the stores of its body.

Whatever falls outside this (shared memory, warp shuffles, barriers, local arrays, `break`,
a `return` inside a loop, calls to unknown functions, reads of memory the thread itself
wrote at another address) makes the kernel opaque, with the line and the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tree_sitter import Node

from optiml.cuda import types as ctypes
from optiml.cuda.kernel_ast import KernelAST, walk
from optiml.cuda.source import Kernel, SourceFile, _parser
from optiml.lift.model import (
    BF16,
    BOOL,
    DOUBLE,
    FALSE,
    FLOAT,
    FLOATS,
    HALF,
    INT,
    LONG,
    TRUE,
    Binary,
    Builtin,
    Call,
    Carried,
    Cast,
    Const,
    Expr,
    Lifted,
    Load,
    Loop,
    LoopOut,
    Param,
    Select,
    Stmt,
    Store,
    Tensor,
    Unary,
    Unlifted,
    Var,
    arith_type,
    loop_exprs,
    walk_expr,
    walk_stmts,
)
from optiml.spec import Spec

MAX_INLINE_DEPTH = 8


class Opaque(Exception):
    def __init__(self, node: Node | None, why: str):
        super().__init__(why)
        self.line = node.start_point[0] + 1 if node is not None else 0
        self.why = why


# C spellings of math functions -> (canonical name, arity); the result type follows the
# arguments (float for the `f` spellings, double otherwise) unless the spelling fixes it.
_MATH: dict[str, str] = {}
for _canon, _names in {
    "exp": "exp expf __expf",
    "exp2": "exp2 exp2f __exp2f",
    "log": "log logf __logf",
    "log2": "log2 log2f __log2f",
    "log1p": "log1p log1pf",
    "expm1": "expm1 expm1f",
    "sqrt": "sqrt sqrtf __fsqrt_rn",
    "rsqrt": "rsqrt rsqrtf",
    "tanh": "tanh tanhf",
    "erf": "erf erff",
    "sin": "sin sinf __sinf",
    "cos": "cos cosf __cosf",
    "sinpi": "sinpi sinpif",
    "cospi": "cospi cospif",
    "abs": "fabs fabsf abs",
    "pow": "pow powf __powf",
    "max": "max fmax fmaxf",
    "min": "min fmin fminf",
    "floor": "floor floorf",
    "ceil": "ceil ceilf",
    "fma": "fma fmaf __fmaf_rn",
    "div": "__fdividef __fdiv_rn",
    "rcp": "__frcp_rn",
    "saturate": "__saturatef",
}.items():
    for _n in _names.split():
        _MATH[_n] = _canon
_FLOAT_SPELLING = re.compile(r"(^__.*)|(.*f$)|(^__f.*_rn$)")

_CONVERSIONS = {
    "__half2float": FLOAT,
    "__bfloat162float": FLOAT,
    "__float2half": HALF,
    "__float2half_rn": HALF,
    "__float2bfloat16": BF16,
    "__float2bfloat16_rn": BF16,
    "__int2float_rn": FLOAT,
    "__float2int_rn": INT,
    "__float2int_rz": INT,
    "__double2float_rn": FLOAT,
}
_CACHED_LOADS = ("__ldg", "__ldcs", "__ldca", "__ldcg", "__ldlu", "__ldcv")
# Calls the lifting reads as values (math, conversions, cached loads): none changes anything but
# its result.
PURE_CALLS = frozenset([*_MATH, *_CONVERSIONS, *_CACHED_LOADS])
_ATOMICS = {
    "atomicAdd": "add",
    "atomicSub": "sub",
    "atomicMax": "max",
    "atomicMin": "min",
    "atomicAnd": "and",
    "atomicOr": "or",
    "atomicXor": "xor",
    "atomicExch": "exch",
}
_OPAQUE_CALLS = {
    "__syncthreads": "a barrier (__syncthreads): threads of a block cooperate",
    "__syncwarp": "a barrier (__syncwarp): threads of a warp cooperate",
    "__shfl_sync": "a warp shuffle: threads of a warp exchange values",
    "__shfl_down_sync": "a warp shuffle: threads of a warp exchange values",
    "__shfl_up_sync": "a warp shuffle: threads of a warp exchange values",
    "__shfl_xor_sync": "a warp shuffle: threads of a warp exchange values",
    "atomicCAS": "atomicCAS: a compare-and-swap loop",
}
_BUILTINS = {"threadIdx", "blockIdx", "blockDim", "gridDim"}
_CONSTANTS = {
    "INFINITY": (math.inf, FLOAT),
    "NAN": (math.nan, FLOAT),
    "FLT_MAX": (3.4028234663852886e38, FLOAT),
    "FLT_MIN": (1.1754943508222875e-38, FLOAT),
    "DBL_MAX": (1.7976931348623157e308, DOUBLE),
    "INT_MAX": (2**31 - 1, INT),
    "INT_MIN": (-(2**31), INT),
    "M_PI": (math.pi, DOUBLE),
    "CUDART_INF_F": (math.inf, FLOAT),
}


def model_type(dtype: ctypes.DType | None) -> str | None:
    if dtype is None:
        return None
    if dtype.kind == "float":
        return {"f64": DOUBLE, "f32": FLOAT, "f16": HALF, "bf16": BF16}[dtype.code]
    return LONG if dtype.size == 8 else INT


@dataclass(frozen=True)
class Ptr:
    tensor: str
    offset: Expr


Value = Expr | Ptr | None  # None: declared, never assigned


@dataclass
class _State:
    env: dict[str, Value]
    live: Expr
    stores: list[Stmt] = field(default_factory=list)
    # stores this thread made so far, for forwarding a later read of the same element
    written: dict[tuple[str, Expr], Expr] = field(default_factory=dict)
    # tensors this thread wrote so far (a read of another of their elements is not followed)
    dirty: set[str] = field(default_factory=set)
    # within a loop's body: whether this iteration has left by `break` (brk) or by `break` or
    # `continue` (cut); an assignment after that point changes nothing
    brk: Expr = FALSE
    cut: Expr = FALSE
    # statements of the enclosing code before this block began (for reads of what they stored)
    before: tuple[Stmt, ...] = ()
    # induction variables of the loops being built around this point: uid -> (init, condition)
    counting: dict[int, tuple[Expr, Expr]] = field(default_factory=dict)
    # reads answered from an earlier loop's stores: (tensor, index, counter uid), shared by the
    # states of one kernel (checked against the stores of the loop that reads, once built)
    forwards: list[tuple[str, Expr, int]] = field(default_factory=list)

    def fork(self, live: Expr) -> _State:
        return _State(
            dict(self.env),
            live,
            [],
            dict(self.written),
            set(self.dirty),
            self.brk,
            self.cut,
            self.before + tuple(self.stores),
            dict(self.counting),
            self.forwards,
        )


# ---- boolean and arithmetic simplification (enough to keep guards readable) --------------------


def _not(e: Expr) -> Expr:
    if e == TRUE:
        return FALSE
    if e == FALSE:
        return TRUE
    if isinstance(e, Unary) and e.op == "!":
        return e.a
    flip = {"<": ">=", ">=": "<", ">": "<=", "<=": ">", "==": "!=", "!=": "=="}
    if isinstance(e, Binary) and e.op in flip:
        return Binary(flip[e.op], e.a, e.b, BOOL)
    return Unary("!", _bool(e), BOOL)


def _bool(e: Expr) -> Expr:
    return e if e.type == BOOL else Binary("!=", e, Const(0, e.type), BOOL)


def _and(a: Expr, b: Expr) -> Expr:
    a, b = _bool(a), _bool(b)
    if a in (TRUE, b):
        return b
    if b == TRUE:
        return a
    if FALSE in (a, b):
        return FALSE
    return Binary("&&", a, b, BOOL)


def _or(a: Expr, b: Expr) -> Expr:
    a, b = _bool(a), _bool(b)
    if a in (FALSE, b):
        return b
    if b == FALSE:
        return a
    if TRUE in (a, b):
        return TRUE
    return Binary("||", a, b, BOOL)


def _binary(op: str, a: Expr, b: Expr) -> Expr:
    if op in ("&&", "||"):
        return _and(a, b) if op == "&&" else _or(a, b)
    if op in ("<", "<=", ">", ">=", "==", "!="):
        return Binary(op, a, b, BOOL)
    t = a.type if op in ("<<", ">>") else arith_type(a.type, b.type)
    if t in (INT, LONG) and isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_int(op, int(a.value), int(b.value))
        if folded is not None:
            return Const(folded, t)
    if op == "+" and b == Const(0, b.type) and b.type in (INT, LONG):
        return _cast(a, t)
    if op == "+" and a == Const(0, a.type) and a.type in (INT, LONG):
        return _cast(b, t)
    if op == "*" and b == Const(1, b.type) and b.type in (INT, LONG):
        return _cast(a, t)
    return Binary(op, a, b, t)


def _fold_int(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/" and b:
        return int(a / b)
    if op == "%" and b:
        return a - b * int(a / b)
    if op == "<<" and 0 <= b < 63:
        return a << b
    if op == ">>" and 0 <= b < 63:
        return a >> b
    return None


def _cast(e: Expr, t: str) -> Expr:
    if e.type == t:
        return e
    if isinstance(e, Const) and t in (INT, LONG) and e.type in (INT, LONG, BOOL):
        return Const(int(e.value), t)
    if isinstance(e, Const) and t in (FLOAT, DOUBLE) and e.type in (INT, LONG, FLOAT, DOUBLE):
        return Const(float(e.value), t)
    # widening between integer types changes no value the model computes (it computes in 64 bits)
    if e.type in (INT, LONG) and t in (INT, LONG):
        return e if not isinstance(e, Cast) else Cast(e.a, t)
    return Cast(e, t)


def _merge_flag(c: Expr, a: Expr, b: Expr) -> Expr:
    """`c ? a : b` for conditions, kept in boolean form."""
    if a == b:
        return a
    return _or(_and(c, a), _and(_not(c), b))


def _select(c: Expr, a: Expr, b: Expr) -> Expr:
    if a == b:
        return a
    if c == TRUE:
        return a
    if c == FALSE:
        return b
    t = arith_type(a.type, b.type) if a.type != b.type else a.type
    return Select(_bool(c), _cast(a, t), _cast(b, t), t)


# ---- the executor ------------------------------------------------------------------------------


class Lifter:
    def __init__(self, source: SourceFile, kernel: Kernel, spec: Spec):
        self.source = source
        self.kernel = kernel
        self.spec = spec
        self.ast = KernelAST(source, kernel)
        self.type_args = dict(spec.template)
        self.value_args = dict(spec.template_values)
        self.tensors: dict[str, Tensor] = {}
        self.scalars: dict[str, str] = {}
        self._macros: dict[str, str] | None = None
        self.depth = 0

    # -- entry

    def lift(self) -> Lifted | Unlifted:
        try:
            env = self._parameters()
            st = _State(env, TRUE)
            self._block(self.ast.body, st)
        except Opaque as e:
            return Unlifted(self.kernel.name, [(e.line, e.why)])
        except RecursionError:
            return Unlifted(self.kernel.name, [(0, "expressions nested too deeply to follow")])
        return Lifted(
            kernel=self.kernel.name,
            tensors=self.tensors,
            scalars=self.scalars,
            body=tuple(st.stores),
            params=[p.name for p in self.kernel.params],
        )

    def _parameters(self) -> dict[str, Value]:
        env: dict[str, Value] = {}
        for p in self.kernel.params:
            if p.pointer_depth > 1:
                raise Opaque(None, f"parameter `{p.name}` is a pointer to pointers")
            buf = self.spec.buffer(p.name)
            if p.pointer_depth == 1:
                if buf is None:
                    raise Opaque(None, f"pointer `{p.name}` has no buffer in the spec")
                d = ctypes.DTYPES[buf.dtype]
                self.tensors[p.name] = Tensor(p.name, model_type(d), d.code, buf.role)
                env[p.name] = Ptr(p.name, Const(0, LONG))
            else:
                t = self._type_of(p.type_text, None)
                self.scalars[p.name] = t
                env[p.name] = Param(p.name, t)
        return env

    def _type_of(self, text: str, node: Node | None) -> str:
        text = " ".join(w for w in text.split() if w not in ("const", "volatile", "__restrict__"))
        if text in ("bool",):
            return BOOL
        if text in self.type_args:
            text = self.type_args[text]
        t = model_type(ctypes.lookup(ctypes.normalize_c_type(text)))
        if t is None:
            raise Opaque(node, f"type `{text}` is not one the model computes in")
        return t

    # -- statements

    def _block(self, node: Node, st: _State) -> None:
        for child in node.named_children:
            self._stmt(child, st)

    def _stmt(self, node: Node, st: _State) -> None:
        kind = node.type
        if kind == "compound_statement":
            self._block(node, st)
        elif kind == "declaration":
            self._declaration(node, st)
        elif kind == "expression_statement":
            if node.named_child_count:
                self._expr(node.named_children[0], st)
        elif kind == "if_statement":
            self._if(node, st)
        elif kind in ("for_statement", "while_statement", "do_statement"):
            self._loop(node, st)
        elif kind == "return_statement":
            st.live = FALSE
        elif kind in ("comment", "empty_statement"):
            pass
        elif kind == "preproc_call" or kind.startswith("preproc"):
            text = _t(node)
            if "pragma" not in text:
                raise Opaque(node, "a preprocessor directive inside the kernel")
        elif kind == "break_statement":
            # only where the thread still runs this iteration (not after a `continue`)
            st.brk, st.cut, st.live = _or(st.brk, st.live), _or(st.cut, st.live), FALSE
        elif kind == "continue_statement":
            st.cut, st.live = _or(st.cut, st.live), FALSE
        elif kind == "goto_statement":
            raise Opaque(node, "`goto`")
        else:
            raise Opaque(node, f"a `{kind.replace('_', ' ')}` the model does not follow")

    def _declaration(self, node: Node, st: _State) -> None:
        text = _t(node)
        if "__shared__" in text:
            raise Opaque(node, "shared memory: threads of a block cooperate through it")
        type_node = node.child_by_field_name("type")
        base = _t(type_node) if type_node is not None else "int"
        for decl in node.children_by_field_name("declarator"):
            init = None
            if decl.type == "init_declarator":
                init = decl.child_by_field_name("value")
                decl = decl.child_by_field_name("declarator")
            pointer = False
            while decl.type in ("pointer_declarator", "reference_declarator"):
                pointer = True
                decl = decl.named_children[-1]
            if decl.type == "array_declarator":
                raise Opaque(node, "a local array")
            if decl.type != "identifier":
                raise Opaque(node, "a declaration the model does not follow")
            name = _t(decl)
            if init is None:
                st.env[name] = None
                continue
            if init.type == "initializer_list":
                raise Opaque(init, "an initializer list")
            value = self._value(init, st)
            if pointer or base == "auto" and isinstance(value, Ptr):
                if not isinstance(value, Ptr):
                    raise Opaque(init, f"pointer `{name}` does not point into a parameter")
                st.env[name] = value
            else:
                if isinstance(value, Ptr):
                    raise Opaque(init, f"`{name}` holds a pointer as a number")
                st.env[name] = value if base == "auto" else _cast(value, self._type_of(base, node))

    def _condition(self, node: Node, st: _State) -> Expr:
        """A condition; a pointer parameter in one is never null (the spec allocates it)."""
        v = self._value(node, st)
        return TRUE if isinstance(v, Ptr) else _bool(v)

    def _if(self, node: Node, st: _State) -> None:
        cond = self._condition(node.child_by_field_name("condition"), st)
        then = st.fork(_and(st.live, cond))
        self._stmt(node.child_by_field_name("consequence"), then)
        other = st.fork(_and(st.live, _not(cond)))
        alt = node.child_by_field_name("alternative")
        if alt is not None:
            self._stmt(alt.named_children[-1] if alt.type == "else_clause" else alt, other)
        st.stores += then.stores + other.stores
        for name in list(st.env):  # names declared in a branch end with it
            a, b = then.env.get(name), other.env.get(name)
            if a is b or a == b:
                st.env[name] = a
            elif isinstance(a, Ptr) or isinstance(b, Ptr):
                if not (isinstance(a, Ptr) and isinstance(b, Ptr) and a.tensor == b.tensor):
                    raise Opaque(node, f"pointer `{name}` points into different tensors")
                st.env[name] = Ptr(a.tensor, _select(cond, a.offset, b.offset))
            elif a is None or b is None:
                st.env[name] = a if b is None else b  # unset on one path: that path never reads it
            else:
                st.env[name] = _select(cond, a, b)
        then_same = then.live == _and(st.live, cond)
        other_same = other.live == _and(st.live, _not(cond))
        if not (then_same and other_same):
            st.live = _or(then.live, other.live)
        written = {}
        for key in set(then.written) & set(other.written):
            a, b = then.written[key], other.written[key]
            written[key] = a if a == b else _select(cond, a, b)
        st.written = written
        st.dirty = then.dirty | other.dirty
        st.brk = _merge_flag(cond, then.brk, other.brk)
        st.cut = _merge_flag(cond, then.cut, other.cut)

    def _loop(self, node: Node, st: _State) -> None:
        line = node.start_point[0] + 1
        body = node.child_by_field_name("body")
        for n in walk(body):
            if n.type == "return_statement":
                raise Opaque(n, "a `return` inside a loop")
        update = None
        if node.type == "for_statement":
            init = node.child_by_field_name("initializer")
            if init is not None:
                if init.type == "declaration":
                    self._declaration(init, st)
                else:
                    self._expr(init, st)
            update = node.child_by_field_name("update")
        cond_node = node.child_by_field_name("condition")
        if cond_node is None:
            raise Opaque(node, "a loop without a condition")
        # carried: variables the loop assigns that exist before it
        assigned = self._assigned(body) | (self._assigned(update) if update is not None else set())
        if node.type == "do_statement":
            assigned |= self._assigned(cond_node)  # `while (++j < n)`
        carried_names = sorted(n for n in assigned if n in st.env)
        vars_: dict[str, Var] = {}
        inner = st.fork(TRUE)
        inner.written = {}  # an element written before the loop may be rewritten in it
        inner.brk, inner.cut = FALSE, FALSE
        for name in carried_names:
            value = st.env[name]
            if isinstance(value, Ptr):
                v = Var(name, LONG)
                vars_[name] = v
                inner.env[name] = Ptr(value.tensor, v)
                continue
            if value is None:
                raise Opaque(node, f"`{name}` is read in the loop before it is set")
            v = Var(name, value.type)
            vars_[name] = v
            inner.env[name] = v
        # a `do` loop runs its body, then its condition (with its side effects) says whether to go
        # on: a carried flag holds that answer for the next iteration; a `break` ends the loop
        again = Var("do again", BOOL) if node.type == "do_statement" else None
        broke = Var("break taken", BOOL) if self._breaks(node) else None
        if again is not None:
            self._stmt(body, inner)
            inner.cut = inner.brk  # `continue` goes to the condition, `break` past it
            again_update = self._condition(cond_node, inner)
            cond = again
        else:
            cond = self._condition(cond_node, inner)
            self._count(node, cond, vars_, st, inner)
            self._stmt(body, inner)
        if broke is not None:
            cond = _and(cond, _not(broke))
        # a read answered from an earlier loop holds only if this loop writes that tensor at no
        # other element than the one it read (an iteration may not read what another wrote)
        own = {v.uid for v in vars_.values()}
        for tensor, index, uid in inner.forwards:
            if uid in own and any(
                isinstance(x, Store) and x.tensor == tensor and x.index != index
                for x in walk_stmts(tuple(inner.stores))
            ):
                raise Opaque(
                    node, f"`{tensor}` is read after this loop wrote it at another element"
                )
        if update is not None:
            inner.cut = inner.brk  # `continue` runs the update, `break` does not
            self._expr(update, inner)
        carried = []
        for name, v in vars_.items():
            before, after = st.env[name], inner.env.get(name)
            if isinstance(before, Ptr):
                if not isinstance(after, Ptr) or after.tensor != before.tensor:
                    raise Opaque(node, f"pointer `{name}` moves to another tensor in the loop")
                carried.append(Carried(v, before.offset, after.offset))
            else:
                if after is None or isinstance(after, Ptr):
                    raise Opaque(node, f"`{name}` is not a number after the loop's body")
                carried.append(Carried(v, before, _cast(after, v.type)))
        if again is not None:
            carried.append(Carried(again, TRUE, again_update))
        if broke is not None:
            carried.append(Carried(broke, FALSE, inner.brk))
        loop = Loop(tuple(carried), cond, tuple(inner.stores), st.live, line)
        if inner.stores:
            st.stores.append(loop)
            st.written.clear()
            st.dirty |= inner.dirty
        for c in carried:
            if c.var.name not in st.env:
                continue
            before = st.env[c.var.name]
            out = LoopOut(loop, c.var)
            st.env[c.var.name] = Ptr(before.tensor, out) if isinstance(before, Ptr) else out

    def _count(self, node: Node, cond: Expr, vars_: dict[str, Var], st: _State, inner: _State):
        """Note the loop's counters (`for (int i = a; cond; i++)`, read off its update) for reads,
        in its body, of elements an earlier loop over the same range stored."""
        update = node.child_by_field_name("update") if node.type == "for_statement" else None
        if update is None or update.type != "update_expression":
            return
        target = update.child_by_field_name("argument")
        if _t(update.child_by_field_name("operator")) != "++" or target.type != "identifier":
            return
        v = vars_.get(_t(target))
        if v is not None and not isinstance(st.env[v.name], Ptr):
            inner.counting[v.uid] = (st.env[v.name], cond)

    def _forward(self, tensor: str, index: Expr, st: _State) -> Expr | None:
        """The value an earlier loop of this thread stored at `tensor[index]`, where the read
        runs in a loop over the same range as that loop and at the same index function of its
        counter (`for i: y[r*C + i] = e(i)` ... `for j: ... y[r*C + j] ...`); None otherwise."""
        earlier = [x for x in st.before + tuple(st.stores) if isinstance(x, Loop)]
        if not earlier or not st.counting:
            return None
        loop = earlier[-1]
        writes = [x for x in loop.body if isinstance(x, Store) and x.tensor == tensor]
        later = st.before[st.before.index(loop) + 1 :] if loop in st.before else ()
        if len(writes) != 1 or writes[0].atomic or writes[0].guard != TRUE:
            return None
        if any(isinstance(x, Store | Loop) and _stores_to(x, tensor) for x in later):
            return None
        w = writes[0]
        counters = [c for c in loop.carried if _steps_by_one(c)]
        for c in counters:
            for uid, (init, cond) in st.counting.items():
                mine = _find_var(cond, uid)
                if mine is None or init != c.init:
                    continue
                if _substitute(loop.cond, c.var, mine) != cond:
                    continue
                if _substitute(w.index, c.var, mine) != index:
                    continue
                others = {x.var.uid for x in loop.carried} - {c.var.uid}
                for x in walk_expr(w.value):
                    if isinstance(x, Var) and x.uid in others:
                        return None  # the value depends on what the loop carried
                    if isinstance(x, LoopOut) and any(
                        _find_var(y, c.var.uid) for y in loop_exprs(x.loop)
                    ):
                        return None  # a loop inside this one, which the counter drives
                st.forwards.append((tensor, index, uid))
                return _substitute(w.value, c.var, mine)
        return None

    def _breaks(self, loop: Node) -> bool:
        """Whether a `break` in `loop`'s body ends `loop` (not an inner loop or a switch)."""
        for n in walk(loop.child_by_field_name("body")):
            if n.type == "break_statement":
                p = n.parent
                while p is not None and p.type not in (
                    "for_statement",
                    "while_statement",
                    "do_statement",
                    "switch_statement",
                ):
                    p = p.parent
                if p is loop or (p is not None and p.id == loop.id):
                    return True
        return False

    def _assigned(self, node: Node | None) -> set[str]:
        out: set[str] = set()
        if node is None:
            return out
        for n in walk(node):
            target = None
            if n.type == "assignment_expression":
                target = n.child_by_field_name("left")
            elif n.type == "update_expression":
                target = n.child_by_field_name("argument")
            if target is not None:
                target = _unparen(target)
            if target is not None and target.type == "identifier":
                out.add(_t(target))
            if n.type == "call_expression":
                out |= self._assigned_by_macro(n)
        return out

    def _assigned_by_macro(self, call: Node) -> set[str]:
        """Names a function-like macro's expansion assigns: `NEXT(j)` with `(i++)` assigns j."""
        name = _t(call.child_by_field_name("function"))
        found = self._macros_of_file().get(name)
        if found is None or found[0] is None or self.depth >= MAX_INLINE_DEPTH:
            return set()
        args = call.child_by_field_name("arguments")
        try:
            expr = self._expansion(name, list(args.named_children) if args else [], call)
        except Opaque:
            return set()
        self.depth += 1
        try:
            return self._assigned(expr) if expr is not None else set()
        finally:
            self.depth -= 1

    # -- expressions

    def _scalar(self, node: Node, st: _State) -> Expr:
        v = self._value(node, st)
        if isinstance(v, Ptr):
            raise Opaque(node, "a pointer used as a number")
        return v

    def _value(self, node: Node, st: _State) -> Value:
        if node.type == "condition_clause":
            node = node.named_children[-1]
        return self._expr(node, st)

    def _expr(self, node: Node, st: _State) -> Value:
        kind = node.type
        if kind == "parenthesized_expression":
            return self._expr(node.named_children[-1], st)
        if kind == "number_literal":
            return _literal(_t(node), node)
        if kind in ("true", "false"):
            return TRUE if kind == "true" else FALSE
        if kind == "char_literal":
            raise Opaque(node, "a character literal")
        if kind == "identifier":
            return self._name(node, st)
        if kind == "field_expression":
            return self._field(node, st)
        if kind == "qualified_identifier":
            raise Opaque(node, f"`{_t(node)}` is not a name the model knows")
        if kind == "binary_expression":
            return self._binary_node(node, st)
        if kind == "unary_expression":
            op = _t(node.child_by_field_name("operator"))
            if op == "!" and isinstance(self._expr(node.child_by_field_name("argument"), st), Ptr):
                return FALSE  # `!ptr`: a buffer of the spec is never null
            a = self._scalar(node.child_by_field_name("argument"), st)
            if op == "+":
                return a
            if op == "!":
                return _not(a)
            return Unary(op, a, arith_type(a.type, INT) if op == "-" else a.type)
        if kind == "pointer_expression":
            op = _t(node.child_by_field_name("operator"))
            arg = node.child_by_field_name("argument")
            if op == "&":
                if arg.type != "subscript_expression":
                    raise Opaque(node, "an address taken of something other than an element")
                p, index = self._element(arg, st)
                return Ptr(p.tensor, _binary("+", p.offset, index))
            p = self._expr(arg, st)
            if not isinstance(p, Ptr):
                raise Opaque(node, "`*` on something that is not a pointer into a parameter")
            return self._load(p.tensor, p.offset, st, node)
        if kind == "subscript_expression":
            p, index = self._element(node, st)
            return self._load(p.tensor, _binary("+", p.offset, index), st, node)
        if kind == "conditional_expression":
            c = self._scalar(node.child_by_field_name("condition"), st)
            a = self._scalar(node.child_by_field_name("consequence"), st)
            b = self._scalar(node.child_by_field_name("alternative"), st)
            return _select(c, a, b)
        if kind == "cast_expression":
            t = self._type_of(_t(node.child_by_field_name("type")), node)
            v = self._value(node.child_by_field_name("value"), st)
            if isinstance(v, Ptr):
                raise Opaque(node, "a pointer cast")
            return _cast(v, t)
        if kind == "sizeof_expression":
            t = node.child_by_field_name("type")
            if t is None:
                raise Opaque(node, "sizeof of an expression")
            d = ctypes.lookup(ctypes.normalize_c_type(self._resolve_type_text(_t(t))))
            if d is None:
                raise Opaque(node, f"sizeof({_t(t)})")
            return Const(d.size, LONG)
        if kind == "call_expression":
            return self._call(node, st)
        if kind == "assignment_expression":
            return self._assign(node, st)
        if kind == "update_expression":
            return self._update(node, st)
        if kind == "comma_expression":
            self._expr(node.child_by_field_name("left"), st)
            return self._expr(node.child_by_field_name("right"), st)
        if kind == "null":
            return Const(0, LONG)
        raise Opaque(
            node,
            f"`{_short(_t(node))}`: a {kind.replace('_', ' ')} the model does not follow",
        )

    def _resolve_type_text(self, text: str) -> str:
        return self.type_args.get(text.strip(), text)

    def _name(self, node: Node, st: _State) -> Value:
        name = _t(node)
        if name in st.env:
            v = st.env[name]
            if v is None:
                raise Opaque(node, f"`{name}` is read before it is set")
            return v
        if name in self.value_args:
            return Const(int(self.value_args[name]), INT)
        if name == "NULL":
            return Const(0, LONG)
        if name in _CONSTANTS:
            value, t = _CONSTANTS[name]
            return Const(value, t)
        macro = self._macro(name, st, node)
        if macro is not None:
            return macro
        raise Opaque(node, f"`{name}` is not a name the model knows")

    def _macros_of_file(self) -> dict[str, tuple[list[str] | None, str]]:
        """`#define`s of the file and its file-scope constants: name -> (parameters, or None for
        an object-like macro; the body's text), as the source's scan found them."""
        if self._macros is None:
            self._macros = dict(self.source.macros)
            for name, text in self.source.constants.items():
                self._macros.setdefault(name, (None, text))
        return self._macros

    def _expansion(self, name: str, args: list[Node] | None, node: Node) -> Node | None:
        """A macro's body with each parameter replaced by its argument's text, as C expands it,
        parsed as an expression; None where the file defines no such macro (or the call does not
        match an object-like one)."""
        found = self._macros_of_file().get(name)
        if found is None:
            return None
        params, text = found
        if (params is None) != (args is None):
            return None
        if "#" in text:
            raise Opaque(node, f"macro `{name}` pastes or quotes tokens")
        if params:
            if len(params) != len(args):
                raise Opaque(node, f"macro `{name}` takes {len(params)} arguments")
            given = {p: f"({_t(a)})" for p, a in zip(params, args, strict=True)}
            text = re.sub(
                r"\b(" + "|".join(map(re.escape, params)) + r")\b",
                lambda m: given[m.group(1)],
                text,
            )
        tree = _parser().parse(f"void optiml_macro() {{ ({text}); }}".encode())
        body = tree.root_node.named_children[0].child_by_field_name("body")
        if tree.root_node.has_error or body is None or not body.named_children:
            raise Opaque(node, f"macro `{name}` is not an expression")
        return body.named_children[0].named_children[0]

    def _macro(self, name: str, st: _State, node: Node, args: list[Node] | None = None) -> Value:
        """The value of a macro or file-scope constant used as `name` (or called with `args`, as
        nodes of the call), or None where the file defines none by that name."""
        found = self._macros_of_file().get(name)
        if found is not None and found[0] is None and args is None:
            try:
                return _literal(found[1], None)
            except Opaque:
                pass
        if self.depth >= MAX_INLINE_DEPTH:
            raise Opaque(node, f"macro `{name}` expands too deeply (or recursively)")
        expr = self._expansion(name, args, node)
        if expr is None:
            return None
        self.depth += 1
        try:
            return self._expr(expr, st)
        except Opaque as e:  # said at the use: the expansion's own lines are not the file's
            raise Opaque(node, f"in macro `{name}`: {e.why}") from None
        finally:
            self.depth -= 1

    def _field(self, node: Node, st: _State) -> Expr:
        arg = node.child_by_field_name("argument")
        fld = _t(node.child_by_field_name("field"))
        if arg.type == "identifier" and _t(arg) in _BUILTINS and fld in "xyz":
            return Builtin(f"{_t(arg)}.{fld}")
        raise Opaque(node, f"member access `{_t(node)}` (vector types, structs)")

    def _binary_node(self, node: Node, st: _State) -> Value:
        op = _t(node.child_by_field_name("operator"))
        a = self._expr(node.child_by_field_name("left"), st)
        if op in ("&&", "||"):
            # the right side runs only where the left allows; the model evaluates both (loads
            # are from the snapshot before the kernel, so evaluating one more changes nothing)
            b = self._scalar(node.child_by_field_name("right"), st)
            return _binary(op, _bool(a), _bool(b))
        b = self._expr(node.child_by_field_name("right"), st)
        if op in ("==", "!=") and (isinstance(a, Ptr) or isinstance(b, Ptr)):
            other = b if isinstance(a, Ptr) else a
            if other == Const(0, LONG) or other == Const(0, INT):
                # a buffer of the spec is never null
                return TRUE if op == "!=" else FALSE
        if isinstance(a, Ptr) or isinstance(b, Ptr):
            if op == "+" and isinstance(a, Ptr) and not isinstance(b, Ptr):
                return Ptr(a.tensor, _binary("+", a.offset, b))
            if op == "+" and isinstance(b, Ptr) and not isinstance(a, Ptr):
                return Ptr(b.tensor, _binary("+", b.offset, a))
            if op == "-" and isinstance(a, Ptr) and not isinstance(b, Ptr):
                return Ptr(a.tensor, _binary("-", a.offset, b))
            raise Opaque(node, f"pointer arithmetic `{op}` the model does not follow")
        return _binary(op, a, b)

    def _element(self, node: Node, st: _State) -> tuple[Ptr, Expr]:
        base = self._expr(node.child_by_field_name("argument"), st)
        if not isinstance(base, Ptr):
            raise Opaque(node, "a subscript of something that is not a pointer parameter")
        idx_list = node.child_by_field_name("indices") or next(
            (c for c in node.children if c.type == "subscript_argument_list"), None
        )
        index_node = idx_list.named_children[0] if idx_list is not None else None
        if index_node is None:
            raise Opaque(node, "a subscript the model does not follow")
        index = self._scalar(index_node, st)
        if index.type not in (INT, LONG, BOOL):
            raise Opaque(node, "a subscript that is not an integer")
        return base, index

    def _load(self, tensor: str, index: Expr, st: _State, node: Node) -> Expr:
        t = self.tensors[tensor]
        key = (tensor, index)
        if key in st.written:
            return st.written[key]
        forwarded = self._forward(tensor, index, st) if tensor in st.dirty else None
        if forwarded is not None:
            return forwarded
        if tensor in st.dirty:
            raise Opaque(
                node, f"`{tensor}` is read after this thread wrote it (at another element)"
            )
        return Load(tensor, index, t.dtype)

    def _store(self, p: Ptr, value: Expr, st: _State, node: Node, op: str = "=") -> None:
        t = self.tensors[p.tensor]
        if t.role == "in":
            raise Opaque(node, f"`{p.tensor}` is written but the spec says it is an input")
        value = _cast(value, t.dtype)
        st.stores.append(
            Store(p.tensor, p.offset, value, st.live, op, op != "=", node.start_point[0] + 1)
        )
        st.dirty.add(p.tensor)
        if op == "=":
            st.written[(p.tensor, p.offset)] = value
        else:
            st.written = {k: v for k, v in st.written.items() if k[0] != p.tensor}

    def _assign(self, node: Node, st: _State) -> Value:
        left = _unparen(node.child_by_field_name("left"))
        op = _t(node.child_by_field_name("operator"))
        right = self._expr(node.child_by_field_name("right"), st)
        if left.type == "identifier":
            name = _t(left)
            if name not in st.env:
                raise Opaque(left, f"`{name}` is assigned but is not a local variable")
            old = st.env[name]
            if op == "=":
                new = right
            else:
                if old is None:
                    raise Opaque(left, f"`{name}` is read before it is set")
                if isinstance(old, Ptr) and op in ("+=", "-=") and not isinstance(right, Ptr):
                    new = Ptr(old.tensor, _binary(op[0], old.offset, right))
                elif isinstance(old, Ptr) or isinstance(right, Ptr):
                    raise Opaque(node, "pointer arithmetic the model does not follow")
                else:
                    new = _cast(_binary(op[:-1], old, right), old.type)
            if old is not None and not isinstance(old, Ptr) and not isinstance(new, Ptr):
                new = _cast(new, old.type)
                if st.cut != FALSE:
                    new = _select(st.cut, old, new)
            st.env[name] = new
            return new
        if left.type == "subscript_expression":
            p, index = self._element(left, st)
            p = Ptr(p.tensor, _binary("+", p.offset, index))
        elif left.type == "pointer_expression" and _t(left.child_by_field_name("operator")) == "*":
            p = self._expr(left.child_by_field_name("argument"), st)
            if not isinstance(p, Ptr):
                raise Opaque(left, "`*` on something that is not a pointer into a parameter")
        else:
            misread = next((n for n in walk(left) if n.type == "template_function"), None)
            if misread is not None:
                raise Opaque(
                    left,
                    f"the parser reads `{_short(_t(misread))}` as a template's arguments (C++'s `<` "
                    "ambiguity); parenthesize the comparison, e.g. `(a < b)`",
                )
            raise Opaque(left, "an assignment to something the model does not follow")
        if isinstance(right, Ptr):
            raise Opaque(node, "a pointer stored to memory")
        if op != "=":
            old = self._load(p.tensor, p.offset, st, left)
            right = _binary(op[:-1], old, right)
        self._store(p, right, st, node)
        return _cast(right, self.tensors[p.tensor].dtype)

    def _update(self, node: Node, st: _State) -> Value:
        arg = _unparen(node.child_by_field_name("argument"))
        op = _t(node.child_by_field_name("operator"))
        if arg.type != "identifier":
            raise Opaque(node, "`++`/`--` on something other than a local variable")
        name = _t(arg)
        old = st.env.get(name)
        if old is None:
            raise Opaque(node, f"`{name}` is not a local variable with a value")
        one = Const(1, INT)
        if isinstance(old, Ptr):
            new = Ptr(old.tensor, _binary("+" if op == "++" else "-", old.offset, one))
        else:
            new = _cast(_binary("+" if op == "++" else "-", old, one), old.type)
            if st.cut != FALSE:
                new = _select(st.cut, old, new)
        st.env[name] = new
        prefix = node.children[0].type in ("++", "--")
        return new if prefix else old

    def _call(self, node: Node, st: _State) -> Value:
        fn_node = node.child_by_field_name("function")
        name = _t(fn_node)
        args_node = node.child_by_field_name("arguments")
        arg_nodes = list(args_node.named_children) if args_node is not None else []
        if name in _OPAQUE_CALLS:
            raise Opaque(node, _OPAQUE_CALLS[name])
        if fn_node.type == "parenthesized_expression" and len(arg_nodes) == 1:
            # `(T)(x)` with T a template's type parameter or a typedef: the parser reads a call
            try:
                t = self._type_of(name[1:-1].strip(), node)
            except Opaque:
                pass
            else:
                return _cast(self._scalar(arg_nodes[0], st), t)
        if name in _ATOMICS:
            if node.parent is None or node.parent.type != "expression_statement":
                raise Opaque(node, f"the value `{name}` returns is used")
            p = self._expr(arg_nodes[0], st)
            if not isinstance(p, Ptr):
                raise Opaque(node, f"`{name}` on something that is not a pointer into a parameter")
            value = self._scalar(arg_nodes[1], st)
            self._store(p, value, st, node, _ATOMICS[name])
            return value
        if name in _CACHED_LOADS:
            p = self._expr(arg_nodes[0], st)
            if not isinstance(p, Ptr):
                raise Opaque(node, f"`{name}` of something that is not a pointer into a parameter")
            return self._load(p.tensor, p.offset, st, node)
        if name in self._macros_of_file() and self._macros_of_file()[name][0] is not None:
            return self._macro(name, st, node, arg_nodes)
        if name in ("sincosf", "sincos", "__sincosf") and len(arg_nodes) == 3:
            x = self._scalar(arg_nodes[0], st)
            t = FLOAT if name != "sincos" or x.type != DOUBLE else DOUBLE
            for target, fn in ((arg_nodes[1], "sin"), (arg_nodes[2], "cos")):
                if target.type != "pointer_expression" or _t(target.children[0]) != "&":
                    raise Opaque(node, f"`{name}` into something other than a local's address")
                local = target.child_by_field_name("argument")
                name_ = _t(local)
                if local.type != "identifier" or name_ not in st.env:
                    raise Opaque(node, f"`{name}` into something other than a local variable")
                st.env[name_] = Call(fn, (_cast(x, t),), t)
            return Const(0, INT)
        args = [self._scalar(a, st) for a in arg_nodes]
        if name in _CONVERSIONS and len(args) == 1:
            return _cast(args[0], _CONVERSIONS[name])
        if name in _MATH:
            canon = _MATH[name]
            if canon == "div" and len(args) == 2:
                return _binary("/", _cast(args[0], FLOAT), _cast(args[1], FLOAT))
            if canon == "rcp" and len(args) == 1:
                return _binary("/", Const(1.0, FLOAT), _cast(args[0], FLOAT))
            t = args[0].type
            for a in args[1:]:
                t = arith_type(t, a.type)
            if name in ("max", "min", "abs") and all(a.type in (INT, LONG, BOOL) for a in args):
                t = arith_type(t, INT)
            elif t not in FLOATS or t in (HALF, BF16):
                t = FLOAT if (name.endswith("f") or name.startswith("__")) else DOUBLE
            elif name.endswith("f") and name not in ("erf",) and t == DOUBLE:
                t = FLOAT
            return Call(canon, tuple(_cast(a, t) for a in args), t)
        fn = self._device_function(name)
        if fn is None:
            raise Opaque(node, f"a call to `{name}`, which the model does not know")
        return self._inline(fn, args, node, st)

    def _device_function(self, name: str) -> Node | None:
        return self.source.device_function_nodes.get(name)

    def _inline(self, fn: Node, args: list[Expr], call: Node, st: _State) -> Expr:
        if self.depth >= MAX_INLINE_DEPTH:
            raise Opaque(call, "device functions nested too deeply (or recursive)")
        d = fn.child_by_field_name("declarator")
        while d.type != "function_declarator":
            d = d.child_by_field_name("declarator")
        params = [p for p in d.child_by_field_name("parameters").named_children]
        if len(params) != len(args):
            raise Opaque(call, "a call with another number of arguments than the function has")
        ret_type_node = fn.child_by_field_name("type")
        ret = self._type_of(ret_type_node.text.decode(), call) if ret_type_node else FLOAT
        env: dict[str, Value] = {}
        for p, a in zip(params, args, strict=True):
            pd = p.child_by_field_name("declarator")
            pt = p.child_by_field_name("type")
            if pd is None or pd.type != "identifier" or pt is None:
                raise Opaque(call, "a device function that takes pointers or references")
            env[pd.text.decode()] = _cast(a, self._type_of(pt.text.decode(), call))
        body = fn.child_by_field_name("body")
        stmts = body.named_children
        if not stmts or stmts[-1].type != "return_statement":
            raise Opaque(call, "a device function that does not end in `return`")
        for n in walk(body):
            if n.type == "return_statement" and n is not stmts[-1]:
                raise Opaque(n, "a device function with more than one `return`")
        sub = _State(env, TRUE)
        self.depth += 1
        try:
            for s in stmts[:-1]:
                self._stmt(s, sub)
            value = self._scalar(stmts[-1].named_children[0], sub)
        finally:
            self.depth -= 1
        if sub.stores:
            raise Opaque(call, "a device function that writes memory")
        return _cast(value, ret)


def _walk(e: Expr):
    return walk_expr(e, into_loops=False)


def _find_var(e: Expr, uid: int) -> Var | None:
    return next((x for x in _walk(e) if isinstance(x, Var) and x.uid == uid), None)


def _steps_by_one(c: Carried) -> bool:
    u = c.update
    while isinstance(u, Cast):
        u = u.a
    return (
        isinstance(u, Binary)
        and u.op == "+"
        and u.a == c.var
        and u.b in (Const(1, INT), Const(1, LONG))
    )


def _stores_to(x: Stmt, tensor: str) -> bool:
    return any(isinstance(s, Store) and s.tensor == tensor for s in walk_stmts((x,)))


def _substitute(e: Expr, var: Var, by: Expr) -> Expr:
    """`e` with `var` replaced by `by` (not inside loops: a LoopOut stays as it is)."""
    if e == var:
        return by
    if isinstance(e, Load):
        return Load(e.tensor, _substitute(e.index, var, by), e.type)
    if isinstance(e, Unary):
        return Unary(e.op, _substitute(e.a, var, by), e.type)
    if isinstance(e, Binary):
        return Binary(e.op, _substitute(e.a, var, by), _substitute(e.b, var, by), e.type)
    if isinstance(e, Call):
        return Call(e.fn, tuple(_substitute(a, var, by) for a in e.args), e.type)
    if isinstance(e, Select):
        return Select(*(_substitute(x, var, by) for x in (e.cond, e.a, e.b)), e.type)
    if isinstance(e, Cast):
        return Cast(_substitute(e.a, var, by), e.type)
    return e


def _unparen(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _t(node: Node) -> str:
    """A node's text (from whichever tree it belongs to: the kernel's, or a macro's body)."""
    return node.text.decode("utf-8", errors="replace")


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _literal(text: str, node: Node | None) -> Const:
    t = text.strip().replace("'", "")
    while t.startswith("(") and t.endswith(")"):
        t = t[1:-1].strip()
    low = t.lower()
    try:
        if low.startswith("0x") and not any(c in low for c in ".p"):
            return Const(int(low.rstrip("ul"), 16), LONG if "l" in low else INT)
        if re.fullmatch(r"-?\d+[ul]*", low):
            return Const(int(low.rstrip("ul")), LONG if "l" in low else INT)
        if low.endswith("f") and not low.startswith("0x"):
            return Const(float(low[:-1]), FLOAT)
        return Const(float(low.rstrip("l")), DOUBLE)
    except ValueError:
        raise Opaque(node, f"the literal `{text}`") from None


def lift(source: SourceFile, kernel: Kernel, spec: Spec) -> Lifted | Unlifted:
    """What `kernel` computes, or where and why the model cannot follow it. Where the parser read
    a comparison as a template's arguments (`yy < H && xx >= 0`: C++'s `<` ambiguity, which
    tree-sitter settles for a template), the kernel is read again with the comparison's left side
    parenthesized (`(yy) < H`), which only a comparison can be, on the same lines."""
    lifted = Lifter(source, kernel, spec).lift()
    if isinstance(lifted, Unlifted):
        again = _disambiguated(source, kernel)
        if again is not None:
            relifted = Lifter(again, again.kernel(kernel.name), spec).lift()
            if isinstance(relifted, Lifted):
                return relifted
    return lifted


def _disambiguated(source: SourceFile, kernel: Kernel) -> SourceFile | None:
    """`source` with the name of every template the kernel seems to use parenthesized where that
    name is one of the kernel's variables (a parameter or a local), not a template; None where
    there is none."""
    ast = KernelAST(source, kernel)
    variables = {p.name for p in kernel.params} | set(ast.local_declarations(ast.body))
    names = [
        name
        for n in walk(ast.body)
        if n.type == "template_function"
        and (name := n.child_by_field_name("name")) is not None
        and name.type == "identifier"
        and _t(name) in variables
    ]
    if not names:
        return None
    data = source.text.encode()
    for name in sorted(names, key=lambda x: -x.start_byte):
        data = (
            data[: name.start_byte]
            + b"("
            + data[name.start_byte : name.end_byte]
            + b")"
            + (data[name.end_byte :])
        )
    return SourceFile(data.decode(), source.path)
