"""What `row_parallel` reads on the tree of a one-thread-per-row kernel: the row index and its guard,
the loops over a row and what each one reduces, the buffers they stream (and which of those can move
as float4 or stay in registers), and the two-loop patterns that fuse into one pass (max then sum of
exponentials; mean then sum of squared deviations). Anything it cannot classify makes it answer None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tree_sitter import Node

from optiml.cuda.kernel_ast import (
    Access,
    KernelAST,
    ThreadIndex,
    for_header,
    operator_of,
    unparen,
    walk,
)

# Accumulator types `__shfl_xor_sync` takes.
SHUFFLE_TYPES = frozenset(
    {
        "float",
        "double",
        "int",
        "unsigned",
        "unsigned int",
        "long",
        "unsigned long",
        "long long",
        "unsigned long long",
        "size_t",
    }
)
MINMAX = frozenset({"fmaxf", "fminf", "fmax", "fmin", "max", "min"})
MAXES = frozenset({"fmaxf", "fmax", "max"})
EXPS = frozenset({"expf", "__expf", "exp"})
INDEX_TYPES = frozenset(
    {"int", "unsigned", "unsigned int", "long", "long long", "size_t", "int64_t", "ptrdiff_t"}
)
# Builtins and intrinsics whose meaning depends on which thread runs the code, or that synchronize:
# a kernel using them is not "one thread per row" and a helper using them cannot be replicated.
THREAD_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})
FORBIDDEN_CALL_PREFIXES = (
    "__shfl",
    "__sync",
    "__ballot",
    "__any",
    "__all",
    "__activemask",
    "__match",
    "__reduce",
    "__threadfence",
    "__nanosleep",
    "atomic",
    "clock",
    "printf",
    "this_thread_block",
    "tiled_partition",
    "this_grid",
)
_LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")
_CONDITIONAL = ("if_statement", "conditional_expression", "switch_statement", *_LOOPS)

Form = tuple[tuple[tuple[str, ...], int], ...]  # an affine form, hashable


@dataclass(frozen=True)
class Reduction:
    """An accumulator declared outside a row loop that the loop only updates by one associative
    operator: `op` is "+" or the min/max function as written (`fmaxf`, `max`...)."""

    var: str
    type: str
    op: str
    zero_init: bool  # a literal zero right before the loop, so lanes may start from it


@dataclass(frozen=True)
class Stream:
    """The elements `base + j` of one pointer parameter, whichever name (parameter or alias) and
    index text the loops use for them."""

    pointer: str
    base: Form
    element: str  # the parameter's element type
    read_only: bool  # never written by the kernel
    by_row: bool  # the base moves with the row index: the one-thread-per-row pattern
    stable: bool  # the base and array can be evaluated before the first row loop
    access: Access  # one access to it, to render addresses from
    var: str  # that access's loop variable

    @property
    def vectorizable(self) -> bool:
        constant = dict(self.base).get((), 0)
        return self.element == "float" and self.stable and constant % 4 == 0


@dataclass(frozen=True)
class LoopAccess:
    access: Access
    stream: Stream | None  # None: not `base + j` with j's coefficient 1
    unconditional: bool  # evaluated on every iteration (a load of it may be hoisted)
    store: Node | None = None  # the `p[i] = e;` statement when it may become a float4 store


@dataclass
class RowLoop:
    """`for (T j = 0; j < bound; ++j) body` at the top level of the guarded body."""

    node: Node
    var: str
    var_type: str
    bound: Node
    body: Node
    reductions: list[Reduction]
    accesses: list[LoopAccess]
    has_continue: bool


@dataclass(frozen=True)
class OnlineSoftmax:
    """`m = fmaxf(m, X)` over the row, then `s += expf(X - m)`: one pass with rescaling."""

    first: RowLoop
    second: RowLoop
    m: str
    s: str
    value: Node  # X in the first loop
    exp: str


@dataclass(frozen=True)
class Welford:
    """`a += X` over the row, `a /= n` (or `mu = a / n`), then `v += (X - mean)^2`: one pass that
    keeps the sum and Welford's (count, mean, M2)."""

    first: RowLoop
    second: RowLoop
    acc: str
    var: str
    value: Node  # X in the first loop


@dataclass
class RowKernel:
    ast: KernelAST
    index: ThreadIndex
    rows: str  # the guard's bound on the row index, as written
    loops: list[RowLoop]
    identifiers: set[str]
    softmax: list[OnlineSoftmax] = field(default_factory=list)
    welford: list[Welford] = field(default_factory=list)

    @property
    def first(self) -> RowLoop:
        return self.loops[0]


def analyse(ast: KernelAST) -> RowKernel | None:
    """The kernel as one thread per row, or None if it is not one this rewrite handles."""
    indices = ast.thread_indices()
    if len(indices) != 1:
        return None
    (index,) = indices.values()
    if index.dim != "x" or not _thread_free(ast, index):
        return None
    if ast.dereferences() or ast.pointer_escapes() or ast.shared_declarations():
        return None
    guard = ast.guard(index.decl)
    if guard is None or index.var not in guard.bounds:
        return None
    assigned = ast.assigned(ast.body)
    if index.var in assigned or assigned & set(ast.aliases):
        return None
    if ast.has(ast.body, "gnu_asm_expression", "asm_statement", "lambda_expression"):
        return None

    scope = _scope_names(ast, guard.body)
    loops: list[RowLoop] = []
    for st in guard.body:
        if st.type == "for_statement" and _header(ast, st) is not None:
            loop = _row_loop(ast, st, scope)
            if loop is None:
                return None
            loops.append(loop)
        elif _has_loop_with_memory(ast, st):
            return None
    if not loops:
        return None
    env = _affine_env(ast, assigned)
    stable = _stable_names(ast, guard.body, loops[0].node, assigned)
    streams = _streams(ast, loops, env, stable, index.var, assigned)
    if streams is None:
        return None
    if not any(s.by_row for s in streams):
        return None
    rk = RowKernel(ast, index, guard.bounds[index.var], loops, ast.identifiers(ast.fn))
    rk.softmax, rk.welford = _fusions(ast, guard.body, loops)
    return rk


# ---- kernel-wide checks ---------------------------------------------------------------------------


def _thread_free(ast: KernelAST, index: ThreadIndex) -> bool:
    """Builtins only in the row index's declaration; no warp/block intrinsics, atomics or barriers,
    in the kernel or in the file's functions it calls."""
    decl = index.decl
    for n in walk(ast.body):
        inside = decl.start_byte <= n.start_byte < decl.end_byte
        if n.type == "identifier" and ast.text(n) in THREAD_BUILTINS and not inside:
            return False
    names = [name for name, _ in ast.calls(ast.body)]
    if any(name.startswith(FORBIDDEN_CALL_PREFIXES) for name in names):
        return False
    helpers = _file_functions(ast)
    seen: set[str] = set()
    todo = [name for name in names if name in helpers]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        fn = helpers[name]
        if any(
            n.type == "identifier" and ast.text(n) in THREAD_BUILTINS for n in walk(fn)
        ) or ast.has(fn, "gnu_asm_expression"):
            return False
        called = [c for c, _ in ast.calls(fn)]
        if any(c.startswith(FORBIDDEN_CALL_PREFIXES) for c in called):
            return False
        todo.extend(c for c in called if c in helpers)
    return True


def _file_functions(ast: KernelAST) -> dict[str, Node]:
    out: dict[str, Node] = {}
    for n in walk(ast.source.tree.root_node):
        if n.type != "function_definition" or n == ast.fn:
            continue
        d = n.child_by_field_name("declarator")
        while d is not None and d.type != "function_declarator":
            d = d.child_by_field_name("declarator")
        name = d.child_by_field_name("declarator") if d is not None else None
        if name is not None:
            out[ast.text(name).rsplit("::", 1)[-1]] = n
    return out


def _scope_names(ast: KernelAST, body: list[Node]) -> dict[str, Node]:
    """Names a top-level row loop sees from outside: parameters are left to the caller; these are
    the declarations at the top level of the kernel body and of the guarded body."""
    out: dict[str, Node] = {}
    for st in [*ast.statements(), *body]:
        if st.type == "declaration":
            for d in st.children_by_field_name("declarator"):
                name = _declared(ast, d)
                if name:
                    out[name] = st
    return out


def _declared(ast: KernelAST, d: Node | None) -> str | None:
    while d is not None and d.type != "identifier":
        if d.type in ("init_declarator", "pointer_declarator", "array_declarator"):
            d = d.child_by_field_name("declarator")
        else:
            return None
    return ast.text(d) if d is not None else None


def _has_loop_with_memory(ast: KernelAST, node: Node) -> bool:
    """A loop outside the row loops that touches memory: it would run once per lane."""
    return any(n.type in _LOOPS and ast.accesses(n) for n in walk(node))


def _affine_env(ast: KernelAST, assigned: set[str]) -> dict:
    env = ast.local_affine_env()
    return {name: form for name, form in env.items() if name not in assigned}


def _stable_names(ast: KernelAST, body: list[Node], first: Node, assigned: set[str]) -> set[str]:
    """Names whose value is fixed before the first row loop: parameters, the row index, and locals
    declared above it that nothing assigns."""
    out = set(ast.params)
    for st in [*ast.statements(), *body]:
        if st.start_byte >= first.start_byte:
            break
        if st.type == "declaration":
            for d in st.children_by_field_name("declarator"):
                name = _declared(ast, d)
                if name:
                    out.add(name)
    return out - assigned


# ---- row loops --------------------------------------------------------------------------------------


def _header(ast: KernelAST, loop: Node) -> tuple[str, str, Node, int] | None:
    """(j, its type, bound, start) for `for (T j = 0; j < bound; ++j)` (also `bound > j`, `j++`,
    `j += 1`, `j = j + 1`), or the same from 1 (see `_seeded`)."""
    header = for_header(loop)
    if header is None or header[0].type != "declaration":
        return None
    init, cond, update, _ = header
    decls = init.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    target = decls[0].child_by_field_name("declarator")
    value = decls[0].child_by_field_name("value")
    if target is None or target.type != "identifier" or value is None:
        return None
    start = _number(ast.text(value)) if value.type == "number_literal" else None
    if start not in (0, 1):
        return None
    var = ast.text(target)
    var_type = ast.text(init.child_by_field_name("type"))
    if var_type not in INDEX_TYPES:
        return None
    cond = unparen(cond)
    if cond.type != "binary_expression":
        return None
    left = unparen(cond.child_by_field_name("left"))
    right = unparen(cond.child_by_field_name("right"))
    if operator_of(cond) == "<" and _is_name(ast, left, var):
        bound = right
    elif operator_of(cond) == ">" and _is_name(ast, right, var):
        bound = left
    else:
        return None
    if var in ast.identifiers(bound) or not _unit_step(ast, unparen(update), var):
        return None
    return var, var_type, bound, int(start)


def _unit_step(ast: KernelAST, update: Node, var: str) -> bool:
    if update.type == "update_expression":
        return operator_of(update) == "++" and _is_name(
            ast, update.child_by_field_name("argument"), var
        )
    if update.type != "assignment_expression":
        return False
    left = update.child_by_field_name("left")
    right = unparen(update.child_by_field_name("right"))
    if not _is_name(ast, left, var):
        return False
    if operator_of(update) == "+=":
        return right.type == "number_literal" and _number(ast.text(right)) == 1
    if (
        operator_of(update) == "="
        and right.type == "binary_expression"
        and operator_of(right) == "+"
    ):
        a = unparen(right.child_by_field_name("left"))
        b = unparen(right.child_by_field_name("right"))
        for x, y in ((a, b), (b, a)):
            if _is_name(ast, x, var) and y.type == "number_literal" and _number(ast.text(y)) == 1:
                return True
    return False


def _row_loop(ast: KernelAST, loop: Node, scope: dict[str, Node]) -> RowLoop | None:
    var, var_type, bound, start = _header(ast, loop)  # type: ignore[misc]
    body = loop.child_by_field_name("body")
    if body is None:
        return None
    has_continue = False
    for n in walk(body):
        if n.type in ("return_statement", "goto_statement", "labeled_statement"):
            return None
        if n.type in ("break_statement", "continue_statement"):
            target = _jump_target(n, n.type == "break_statement")
            if target == loop:
                if n.type == "break_statement":
                    return None
                has_continue = True
    local = set(ast.local_declarations(body))
    outer = set(scope) | set(ast.params)
    if local & outer:
        return None  # a body declaration shadows an outer name: too easy to misread
    assigned = ast.assigned(body)
    if var in assigned or assigned & ast.identifiers(bound):
        return None
    for n in walk(body):
        if n.type not in ("assignment_expression", "update_expression"):
            continue
        target = unparen(
            n.child_by_field_name("left" if n.type == "assignment_expression" else "argument")
        )
        if not _target_ok(ast, target, local):
            return None
    reductions = []
    for name in sorted(assigned - local):
        red = _reduction(ast, loop, body, name, scope)
        if red is None:
            return None
        reductions.append(red)
    accesses = [
        LoopAccess(a, None, _unconditional(a.node, body) and not has_continue)
        for a in ast.accesses(body)
    ]
    row_loop = RowLoop(loop, var, var_type, bound, body, reductions, accesses, has_continue)
    if start != 0 and not _seeded(ast, row_loop, scope):
        return None
    return row_loop


def _seeded(ast: KernelAST, loop: RowLoop, scope: dict[str, Node]) -> bool:
    """A loop from 1 that only folds `p[base + j]` into one min/max accumulator declared as
    `p[base]` (element 0): folding element 0 in again changes nothing, so the loop may run from 0
    like the others."""
    if len(loop.reductions) != 1 or loop.reductions[0].op not in MINMAX or loop.has_continue:
        return False
    red = loop.reductions[0]
    # the fold's own `fmaxf(m, p[base + j])` is the only call it may make: what it folds is the
    # element itself, as the seed is (a function of it would fold f(p[base]) into p[base])
    if any(a.access.write for a in loop.accesses) or not all(
        name == red.op and _folds_element(ast, call, red.var) for name, call in ast.calls(loop.body)
    ):
        return False
    if set(ast.assigned(loop.body)) != {red.var} or ast.local_declarations(loop.body):
        return False
    decl = scope.get(red.var)
    seed = None
    for d in decl.children_by_field_name("declarator") if decl is not None else []:
        if d.type == "init_declarator" and _declared(ast, d) == red.var:
            seed = unparen(d.child_by_field_name("value"))
    if seed is None or seed.type != "subscript_expression":
        return False
    found = ast.accesses(seed)
    if len(found) != 1 or found[0].node != seed:
        return False
    first = found[0]
    at_zero = (first.pointer, first.offset, _form(ast.affine(first.index)))
    for a in loop.accesses:
        form = ast.affine(a.access.index, {loop.var: {}})
        if form is None or (a.access.pointer, a.access.offset, _form(form)) != at_zero:
            return False
    return True


def _folds_element(ast: KernelAST, call: Node, var: str) -> bool:
    """`op(var, p[...])` or `op(p[...], var)`."""
    args = call.child_by_field_name("arguments")
    values = [unparen(a) for a in args.named_children] if args is not None else []
    kinds = sorted(
        "acc" if v.type == "identifier" and ast.text(v) == var else v.type for v in values
    )
    return kinds == ["acc", "subscript_expression"]


def _form(form: dict | None) -> Form | None:
    return None if form is None else tuple(sorted(form.items()))


def _jump_target(node: Node, is_break: bool) -> Node | None:
    """The loop (or, for `break`, switch) a `break`/`continue` leaves."""
    n = node.parent
    while n is not None:
        if n.type in _LOOPS or (is_break and n.type == "switch_statement"):
            return n
        n = n.parent
    return None


def _target_ok(ast: KernelAST, target: Node, local: set[str]) -> bool:
    """An assignment inside a row loop writes a pointer parameter, a local of the body, or an
    outer scalar (classified as a reduction by the caller)."""
    if target.type == "identifier":
        return True
    base = target
    while base.type in ("subscript_expression", "field_expression", "parenthesized_expression"):
        base = unparen(
            base.child_by_field_name("argument")
            if base.type != "parenthesized_expression"
            else base.named_children[0]
        )
    if base.type != "identifier":
        return False
    name = ast.text(base)
    if name in local:
        return True
    return target.type == "subscript_expression" and ast.pointer_of(name) is not None


def _reduction(
    ast: KernelAST, loop: Node, body: Node, name: str, scope: dict[str, Node]
) -> Reduction | None:
    decl = scope.get(name)
    if decl is None:
        return None
    type_text = _decl_type(ast, decl, name)
    if type_text not in SHUFFLE_TYPES:
        return None
    ops: set[str] = set()
    covered: set[int] = set()
    for n in walk(body):
        if n.type not in ("assignment_expression", "update_expression"):
            continue
        key = "left" if n.type == "assignment_expression" else "argument"
        target = unparen(n.child_by_field_name(key))
        if not _is_name(ast, target, name):
            continue
        if n.parent is None or n.parent.type != "expression_statement":
            return None  # the update's value is used
        found = _update(ast, n, name) or _if_update(ast, n, name, type_text)
        if found is None:
            return None
        op, uses = found
        ops.add(op)
        covered.update(u.id for u in uses)
    if len(ops) != 1 or {u.id for u in ast.uses(body, name)} != covered:
        return None
    (op,) = ops
    return Reduction(name, type_text, op, op == "+" and _zero_before(ast, loop, name, decl))


def _update(ast: KernelAST, n: Node, name: str) -> tuple[str, list[Node]] | None:
    """The operator of one accumulator update and the accumulator's identifier nodes in it."""
    if n.type == "update_expression":
        return "+", [unparen(n.child_by_field_name("argument"))]
    left = unparen(n.child_by_field_name("left"))
    right = unparen(n.child_by_field_name("right"))
    op = operator_of(n)
    if op in ("+=", "-="):
        return None if name in ast.identifiers(right) else ("+", [left])
    if op != "=":
        return None
    if right.type == "binary_expression" and operator_of(right) in ("+", "-"):
        a = unparen(right.child_by_field_name("left"))
        b = unparen(right.child_by_field_name("right"))
        if _is_name(ast, a, name) and name not in ast.identifiers(b):
            return "+", [left, a]
        if operator_of(right) == "+" and _is_name(ast, b, name) and name not in ast.identifiers(a):
            return "+", [left, b]
        return None
    if right.type == "call_expression":
        fn = ast.text(right.child_by_field_name("function"))
        args = right.child_by_field_name("arguments").named_children
        if fn in MINMAX and len(args) == 2:
            a, b = unparen(args[0]), unparen(args[1])
            if _is_name(ast, a, name) and name not in ast.identifiers(b):
                return fn, [left, a]
            if _is_name(ast, b, name) and name not in ast.identifiers(a):
                return fn, [left, b]
    return None


def _if_update(ast: KernelAST, n: Node, name: str, type_text: str) -> tuple[str, list[Node]] | None:
    """`if (X > m) m = X;` (also `m < X`, `>=`, and `<` for a minimum), with no else and X pure:
    `m = fmaxf(m, X)` as people write it. Returns the min/max function of m's type and m's
    identifiers in the statement."""
    if operator_of(n) != "=":
        return None
    stmt, owner = n.parent, n.parent.parent
    if owner is not None and owner.type == "compound_statement":
        if len([c for c in owner.named_children if c.type != "comment"]) != 1:
            return None
        stmt, owner = owner, owner.parent
    if owner is None or owner.type != "if_statement":
        return None
    if owner.child_by_field_name("consequence") != stmt or owner.child_by_field_name("alternative"):
        return None
    cond = unparen(owner.child_by_field_name("condition"))
    if cond.type == "condition_clause":
        cond = unparen(cond.named_children[0])
    value = unparen(n.child_by_field_name("right"))
    if cond.type != "binary_expression" or not _pure(ast, value):
        return None
    left, right = (
        unparen(cond.child_by_field_name("left")),
        unparen(cond.child_by_field_name("right")),
    )
    op = operator_of(cond)
    if op not in ("<", "<=", ">", ">="):
        return None
    if _is_name(ast, left, name):  # m < X: X is bigger
        other, bigger = right, op in ("<", "<=")
    elif _is_name(ast, right, name):  # X > m
        other, bigger = left, op in (">", ">=")
    else:
        return None
    if _squash(ast.text(other)) != _squash(ast.text(value)) or name in ast.identifiers(value):
        return None
    if type_text == "float":
        fn = "fmaxf" if bigger else "fminf"
    elif type_text == "double":
        fn = "fmax" if bigger else "fmin"
    else:
        fn = "max" if bigger else "min"
    m = left if _is_name(ast, left, name) else right
    return fn, [unparen(n.child_by_field_name("left")), m]


def _decl_type(ast: KernelAST, decl: Node, name: str) -> str | None:
    for d in decl.children_by_field_name("declarator"):
        if d.type in ("init_declarator", "identifier") and _declared(ast, d) == name:
            target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            if target is None or target.type != "identifier":
                return None
            return ast.text(decl.child_by_field_name("type"))
    return None


def _zero_before(ast: KernelAST, loop: Node, name: str, decl: Node) -> bool:
    """The accumulator is declared with a literal zero in the loop's block and nothing between the
    declaration and the loop assigns it."""
    if decl.parent != loop.parent:
        return False
    value = None
    for d in decl.children_by_field_name("declarator"):
        if d.type == "init_declarator" and _declared(ast, d) == name:
            value = d.child_by_field_name("value")
    if value is None or unparen(value).type != "number_literal":
        return False
    if _number(ast.text(unparen(value))) != 0:
        return False
    sibling = decl.next_named_sibling
    while sibling is not None and sibling != loop:
        if name in ast.assigned(sibling):
            return False
        sibling = sibling.next_named_sibling
    return sibling == loop


def _unconditional(node: Node, body: Node) -> bool:
    """`node` is evaluated on every iteration of the loop whose body is `body`."""
    child, n = node, node.parent
    while n is not None and n != body.parent:
        if n.type in _CONDITIONAL:
            if n.type in ("if_statement", "conditional_expression", "switch_statement"):
                if n.child_by_field_name("condition") != child:
                    return False
            else:
                return False
        if (
            n.type == "binary_expression"
            and operator_of(n) in ("&&", "||")
            and n.child_by_field_name("left") != child
        ):
            return False
        child, n = n, n.parent
    return True


# ---- streams and writes -----------------------------------------------------------------------------


def _streams(
    ast: KernelAST, loops: list[RowLoop], env: dict, stable: set[str], row: str, assigned: set[str]
) -> list[Stream] | None:
    """Classify every access in the row loops; None if a write cannot be proved safe.

    A pointer written inside a row loop must be accessed only inside row loops, only at `base + j`
    with one base whose names nothing assigns: every element is then touched by one thread only,
    the one that owns j in every loop (the lane-to-column mapping is the same in all loops of one
    path). A pointer written outside the row loops must only be stored to, with plain `=`: every
    lane then stores the same value."""
    offsets = _alias_offsets(ast)
    spans = [(loop.node.start_byte, loop.node.end_byte) for loop in loops]
    everywhere = ast.accesses()
    in_loop = {a.node.id for a in everywhere if any(s <= a.node.start_byte < e for s, e in spans)}
    loop_written = {a.pointer for a in everywhere if a.write and a.node.id in in_loop}
    written = {a.pointer for a in everywhere if a.write}
    for a in everywhere:
        if a.node.id in in_loop:
            continue
        if a.pointer in loop_written or (a.pointer in written and (a.read or a.atomic)):
            return None
    streams: dict[tuple[str, Form], Stream] = {}
    bases: dict[str, set[Form]] = {}
    for loop in loops:
        resolved = []
        for la in loop.accesses:
            a = la.access
            base = _base(_full_index(ast, a, offsets, env), loop.var)
            if a.pointer in loop_written:
                if base is None or a.atomic or _atoms(base) & assigned:
                    return None
                bases.setdefault(a.pointer, set()).add(base)
            stream = None
            if base is not None:
                stream = streams.get((a.pointer, base))
                if stream is None:
                    stream = Stream(
                        pointer=a.pointer,
                        base=base,
                        element=ast.params[a.pointer].type_text,
                        read_only=a.pointer not in written,
                        by_row=row in _atoms(base),
                        stable=_atoms(base) <= stable and _array_name(ast, a) in stable,
                        access=a,
                        var=loop.var,
                    )
                    streams[(a.pointer, base)] = stream
            resolved.append(LoopAccess(a, stream, la.unconditional))
        loop.accesses = _stores(ast, loop, resolved)
    if any(len(b) > 1 for b in bases.values()):
        return None
    return list(streams.values())


def _atoms(form: Form) -> set[str]:
    return {atom for mono, _ in form for atom in mono}


def _alias_offsets(ast: KernelAST) -> dict[str, Node | None]:
    out: dict[str, Node | None] = {}
    for n in walk(ast.body):
        if n.type != "init_declarator":
            continue
        name = _declared(ast, n.child_by_field_name("declarator"))
        if name not in ast.aliases:
            continue
        value = unparen(n.child_by_field_name("value"))
        out[name] = (
            value.child_by_field_name("right") if value.type == "binary_expression" else None
        )
    return out


def _full_index(ast: KernelAST, a: Access, offsets: dict[str, Node | None], env: dict):
    form = ast.affine(a.index, env)
    if form is None:
        return None
    array = _array_name(ast, a)
    offset = offsets.get(array)
    if offset is None:
        return form
    extra = ast.affine(offset, env)
    if extra is None:
        return None
    out = dict(form)
    for mono, coef in extra.items():
        out[mono] = out.get(mono, 0) + coef
    return {m: c for m, c in out.items() if c}


def _base(form: dict | None, var: str) -> Form | None:
    """The index minus j when it is exactly `base + j` with j nowhere else."""
    if form is None or form.get((var,)) != 1:
        return None
    rest = {m: c for m, c in form.items() if m != (var,)}
    if any(var in mono for mono in rest):
        return None
    return tuple(sorted(rest.items()))


def _array_name(ast: KernelAST, a: Access) -> str:
    return ast.text(unparen(a.node.child_by_field_name("argument")))


def _stores(ast: KernelAST, loop: RowLoop, accesses: list[LoopAccess]) -> list[LoopAccess]:
    """Mark the writes that may become one float4 store after the four elements are computed: a
    top-level `p[base + j] = e;`, the only write of p in the loop, with p read nowhere else in it."""
    top = ast.statements(loop.body) if loop.body.type == "compound_statement" else [loop.body]
    out = []
    for la in accesses:
        a = la.access
        store = None
        parent = a.node.parent
        if (
            a.write
            and la.stream is not None
            and la.stream.vectorizable
            and not loop.has_continue
            and parent.type == "assignment_expression"
            and operator_of(parent) == "="
            and parent.child_by_field_name("left") == a.node
            and parent.parent is not None
            and parent.parent.type == "expression_statement"
            and parent.parent in top
        ):
            rhs = parent.child_by_field_name("right")
            others = [o for o in accesses if o.access.pointer == a.pointer and o is not la]
            if all(
                not o.access.write and rhs.start_byte <= o.access.node.start_byte < rhs.end_byte
                for o in others
            ):
                store = parent.parent
        out.append(LoopAccess(a, la.stream, la.unconditional, store))
    return out


# ---- fusable pairs ---------------------------------------------------------------------------------


def _fusions(
    ast: KernelAST, body: list[Node], loops: list[RowLoop]
) -> tuple[list[OnlineSoftmax], list[Welford]]:
    softmax, welford = [], []
    used: set[int] = set()
    for first, second in zip(loops, loops[1:], strict=False):
        if first.node.id in used:
            continue
        between = [
            st for st in body if first.node.end_byte <= st.start_byte < second.node.start_byte
        ]
        found = _online_softmax(ast, first, second, between) or _welford(
            ast, first, second, between
        )
        if found is not None:
            (softmax if isinstance(found, OnlineSoftmax) else welford).append(found)
            used.update((first.node.id, second.node.id))
    return softmax, welford


def _single(ast: KernelAST, loop: RowLoop) -> list[Node]:
    if loop.body.type == "compound_statement":
        return ast.statements(loop.body)
    return [loop.body]


def _expression(st: Node) -> Node | None:
    if st.type != "expression_statement" or not st.named_children:
        return None
    return unparen(st.named_children[0])


def _same_value(ast: KernelAST, a: Node, var_a: str, b: Node, var_b: str) -> bool:
    return _squash(ast.substitute(a, {var_a: "@"})) == _squash(ast.substitute(b, {var_b: "@"}))


def _pure(ast: KernelAST, node: Node) -> bool:
    return not ast.has(node, "assignment_expression", "update_expression", "call_expression")


def _between_ok(ast: KernelAST, between: list[Node], keep: set[str], value: Node) -> bool:
    """Statements between the two loops touch neither `keep` nor anything the value reads."""
    reads = ast.identifiers(value)
    for st in between:
        if ast.identifiers(st) & keep or ast.assigned(st) & reads:
            return False
        if any(a.write for a in ast.accesses(st)):
            return False
    return True


def _online_softmax(
    ast: KernelAST, first: RowLoop, second: RowLoop, between: list[Node]
) -> OnlineSoftmax | None:
    a, b = _single(ast, first), _single(ast, second)
    if len(a) != 1 or len(b) != 1 or len(first.reductions) != 1 or len(second.reductions) != 1:
        return None
    rm, rs = first.reductions[0], second.reductions[0]
    if rm.op not in MAXES or rm.type != "float" or rs.op != "+" or rs.type != "float":
        return None
    if not rs.zero_init or _squash(ast.text(first.bound)) != _squash(ast.text(second.bound)):
        return None
    eb = _expression(b[0])
    value = _max_value(ast, a[0], rm.var)
    if eb is None or value is None or not _pure(ast, value):
        return None
    term = _summand(ast, eb, rs.var)
    if term is None or term.type != "call_expression":
        return None
    exp = ast.text(term.child_by_field_name("function"))
    targs = term.child_by_field_name("arguments").named_children
    if exp not in EXPS or len(targs) != 1:
        return None
    diff = unparen(targs[0])
    if diff.type != "binary_expression" or operator_of(diff) != "-":
        return None
    if not _is_name(ast, diff.child_by_field_name("right"), rm.var):
        return None
    x2 = unparen(diff.child_by_field_name("left"))
    if not _same_value(ast, value, first.var, x2, second.var):
        return None
    if not _between_ok(ast, between, {rm.var}, value):
        return None
    return OnlineSoftmax(first, second, rm.var, rs.var, value, exp)


def _max_value(ast: KernelAST, st: Node, m: str) -> Node | None:
    """X in the statement `m = fmaxf(m, X);` or `if (X > m) m = X;` (the loop's one update of m,
    already classified as a max reduction)."""
    if st.type == "if_statement":
        for n in walk(st.child_by_field_name("consequence")):
            if n.type == "assignment_expression" and _is_name(
                ast, n.child_by_field_name("left"), m
            ):
                return unparen(n.child_by_field_name("right"))
        return None
    e = _expression(st)
    if e is None or e.type != "assignment_expression":
        return None
    call = unparen(e.child_by_field_name("right"))
    if call.type != "call_expression":
        return None
    args = [unparen(x) for x in call.child_by_field_name("arguments").named_children]
    return args[1] if _is_name(ast, args[0], m) else args[0]


def _summand(ast: KernelAST, e: Node, acc: str) -> Node | None:
    """e in `acc += e`, `acc = acc + e` or `acc = e + acc`."""
    if e.type != "assignment_expression":
        return None
    right = unparen(e.child_by_field_name("right"))
    if operator_of(e) == "+=":
        return right
    if operator_of(e) == "=" and right.type == "binary_expression" and operator_of(right) == "+":
        x = unparen(right.child_by_field_name("left"))
        y = unparen(right.child_by_field_name("right"))
        if _is_name(ast, x, acc):
            return y
        if _is_name(ast, y, acc):
            return x
    return None


def _welford(
    ast: KernelAST, first: RowLoop, second: RowLoop, between: list[Node]
) -> Welford | None:
    a = _single(ast, first)
    if len(a) != 1 or len(first.reductions) != 1 or len(second.reductions) != 1:
        return None
    ra, rv = first.reductions[0], second.reductions[0]
    if ra.op != "+" or ra.type != "float" or rv.op != "+" or rv.type != "float":
        return None
    if not _same_count(ast, first.bound, second.bound):
        return None
    ea = _expression(a[0])
    if ea is None:
        return None
    value = _summand(ast, ea, ra.var)
    if value is None or operator_of(ea) == "-=" or not _pure(ast, value):
        return None
    mean = _mean_of(ast, between, ra.var, first.bound)
    if mean is None:
        return None
    deviation = _squared_deviation(ast, second, rv.var)
    if deviation is None:
        return None
    x2, centre = deviation
    if centre != mean or not _same_value(ast, value, first.var, x2, second.var):
        return None
    reads = ast.identifiers(value)
    for st in between:
        if ast.assigned(st) & reads or any(w.write for w in ast.accesses(st)):
            return None
    return Welford(first, second, ra.var, rv.var, value)


def _same_count(ast: KernelAST, a: Node, b: Node) -> bool:
    fa, fb = ast.affine(a), ast.affine(b)
    if fa is not None and fb is not None:
        return fa == fb
    return _squash(ast.text(a)) == _squash(ast.text(b))


def _mean_of(ast: KernelAST, between: list[Node], acc: str, bound: Node) -> str | None:
    """The name holding acc / bound after the statements between the loops, which must not
    otherwise touch acc: `acc /= n;`, `acc = acc / n;` or `T mu = acc / n;`."""
    mean = None
    for st in between:
        if acc not in ast.identifiers(st):
            continue
        if mean is not None:
            return None
        e = _expression(st)
        if e is not None and e.type == "assignment_expression":
            if not _is_name(ast, e.child_by_field_name("left"), acc):
                return None
            right = unparen(e.child_by_field_name("right"))
            divided = operator_of(e) == "/=" and _same_count(ast, right, bound)
            if not divided and not (operator_of(e) == "=" and _is_quotient(ast, right, acc, bound)):
                return None
            mean = acc
        elif st.type == "declaration":
            decls = st.children_by_field_name("declarator")
            if len(decls) != 1 or decls[0].type != "init_declarator":
                return None
            value = decls[0].child_by_field_name("value")
            if not _is_quotient(ast, unparen(value), acc, bound):
                return None
            mean = _declared(ast, decls[0])
        else:
            return None
    if mean is None or (mean != acc and any(mean in ast.assigned(st) for st in between)):
        return None
    return mean


def _is_quotient(ast: KernelAST, e: Node, acc: str, bound: Node) -> bool:
    return (
        e.type == "binary_expression"
        and operator_of(e) == "/"
        and _is_name(ast, e.child_by_field_name("left"), acc)
        and _same_count(ast, unparen(e.child_by_field_name("right")), bound)
    )


def _squared_deviation(ast: KernelAST, loop: RowLoop, acc: str) -> tuple[Node, str] | None:
    """(X, mean) for a body `T d = X - mean; acc += d * d;` or `acc += (X - mean) * (X - mean);`."""
    stmts = _single(ast, loop)
    if len(stmts) == 2 and stmts[0].type == "declaration":
        decls = stmts[0].children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            return None
        d = _declared(ast, decls[0])
        diff = _difference(ast, unparen(decls[0].child_by_field_name("value")))
        e = _expression(stmts[1])
        term = _summand(ast, e, acc) if e is not None else None
        if (
            diff is None
            or term is None
            or term.type != "binary_expression"
            or operator_of(term) != "*"
        ):
            return None
        x = unparen(term.child_by_field_name("left"))
        y = unparen(term.child_by_field_name("right"))
        if _is_name(ast, x, d) and _is_name(ast, y, d) and operator_of(e) != "-=":
            return diff
        return None
    if len(stmts) == 1:
        e = _expression(stmts[0])
        term = _summand(ast, e, acc) if e is not None else None
        if (
            term is None
            or term.type != "binary_expression"
            or operator_of(term) != "*"
            or operator_of(e) == "-="
        ):
            return None
        x = _difference(ast, unparen(term.child_by_field_name("left")))
        y = _difference(ast, unparen(term.child_by_field_name("right")))
        if (
            x is not None
            and y is not None
            and x[1] == y[1]
            and _squash(ast.text(x[0])) == _squash(ast.text(y[0]))
        ):
            return x
    return None


def _difference(ast: KernelAST, e: Node) -> tuple[Node, str] | None:
    """(X, mean) for `X - mean` or `mean - X`, X pure; the sign does not matter once squared."""
    if e.type != "binary_expression" or operator_of(e) != "-":
        return None
    x = unparen(e.child_by_field_name("left"))
    y = unparen(e.child_by_field_name("right"))
    if y.type == "identifier" and _pure(ast, x):
        return x, ast.text(y)
    if x.type == "identifier" and _pure(ast, y):
        return y, ast.text(x)
    return None


# ---- small helpers ---------------------------------------------------------------------------------


def _is_name(ast: KernelAST, node: Node | None, name: str) -> bool:
    return (
        node is not None and unparen(node).type == "identifier" and ast.text(unparen(node)) == name
    )


def _number(text: str) -> float | None:
    t = text.lower().rstrip("ful")
    try:
        return float(int(t, 0)) if t.isdigit() or t.startswith("0x") else float(t)
    except ValueError:
        return None


def _squash(text: str) -> str:
    return "".join(text.split())
