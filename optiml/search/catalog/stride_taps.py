"""A loop whose every effect needs `(r + c*v) % S == 0` (a transposed convolution's taps under a
stride: output `oh` takes input `(oh + pad - kh) / S` only where the division is exact) starts at
the first `v` that passes and steps by S, rather than visiting every `v` and discarding all but
one in S: a 3-D transposed convolution with stride 2 visits an eighth of its taps. Where c shares
a factor g with S (a dilation of 2 under a stride of 2) the step is S/g, and the loop runs not at
all where no `v` can pass (g does not divide `r + c*start`).

Read from the kernel's tree: the loop counts `v` up by one under `v < bound` (or `<=`), and the
divisibility test is affine in `v` with a literal coefficient (±1 where S is not a literal), `r`
invariant in the loop (locals declared in the loop are read through to their definitions:
`int t = oh + pad - kh; if (t % stride) continue;`). S is a literal or a value the loop does not
change; where S is not a literal the step is `S` only when it is positive, else 1 (the original
loop). The test stays in the body: it holds for every `v` the loop now visits.

Sound only where a skipped iteration does nothing: every effect in the body (an assignment to
anything declared outside the loop, an atomic, a store, a `break` or `return`) is under an `if`
whose condition has the test as a conjunct, after an `if (... || test fails) continue;`, or adds
a term that is zero where the test fails (`acc += (ok && test ? x[..] : 0) * w[..]`). A term so
skipped is `0 * w`: for finite `w` it adds nothing, so results are bit-for-bit the original's
(the non-finite `w` that would make it NaN is outside every spec's inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from tree_sitter import Node

from optiml.cuda.kernel_ast import (
    KernelAST,
    _declared_name,
    _int_literal,
    condition,
    for_header,
    operator_of,
    unparen,
    walk,
)
from optiml.lift.symbolic import PURE_CALLS
from optiml.search.catalog._gemm import render
from optiml.search.catalog.base import Context, Rewrite, Transformation


@dataclass(frozen=True)
class Test:
    """`(r + c*v) % s == 0`: `key` the test's `%` expression as written (spaces and outer
    parentheses dropped: the same test written twice is one), `rest` the C text of r, `c` the
    literal coefficient, `s` the modulus's text (`literal` its value, if one)."""

    key: str
    rest: str
    c: int
    s: str
    literal: int | None


@dataclass(frozen=True)
class Scope:
    """The loop's body, and the names declared in it (each iteration's own)."""

    body: Node
    local: frozenset[str]


@dataclass(frozen=True)
class Counted:
    """A `for` loop counting `v` up by one from `start`."""

    loop: Node
    v: str
    start: str
    init: Node  # the initializer's value
    update: Node
    body: Node
    past: str  # a start at which the loop runs no iteration


class StrideTaps(Transformation):
    name = "stride_taps"
    addresses = frozenset({"compute", "latency", "l1_shared", "l2", "dram", "uncoalesced"})
    description = (
        "loops whose every effect needs (r + v) % S == 0 (a transposed convolution's taps "
        "under a stride) start at the first passing v and step by S"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        ast = ctx.ast
        edits: dict[tuple[int, int], str] = {}
        stepped = []
        for node in walk(ast.body):
            loop = _counted(ast, node) if node.type == "for_statement" else None
            if loop is None:
                continue
            scope = Scope(loop.body, frozenset(ast.local_declarations(loop.body)))
            for test in _tests(ast, loop, scope):
                if _covered(ast, loop.body, test.key, scope):
                    edits.update(_step(loop, test))
                    stepped.append(_said(loop, test))
                    break
        if not edits:
            return []
        return [
            Rewrite(
                params={"loops": len(stepped)},
                summary=f"loops step over the taps a stride keeps: {', '.join(stepped)}",
                variant=ctx.rewrite(ast.definition(edits)),
            )
        ]


# ---- the loop and its tests ---------------------------------------------------------------------


def _counted(ast: KernelAST, loop: Node) -> Counted | None:
    """`for (int v = start; v < bound; ++v)` (or `v++`, `v += 1`, `v <= bound`), v unchanged in
    the body."""
    header = for_header(loop)
    if header is None:
        return None
    init, cond, update, body = header
    if init.type == "declaration":
        decls = init.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            return None
        v = _declared_name(ast, decls[0].child_by_field_name("declarator"))
        value = decls[0].child_by_field_name("value")
    elif init.type == "assignment_expression" and operator_of(init) == "=":
        left = unparen(init.child_by_field_name("left"))
        v = ast.text(left) if left.type == "identifier" else None
        value = init.child_by_field_name("right")
    else:
        return None
    if not v or value is None:
        return None
    cond = unparen(cond)
    if cond.type != "binary_expression":
        return None
    left, right = (unparen(cond.child_by_field_name(f)) for f in ("left", "right"))
    op = operator_of(cond)
    if op in ("<", "<=") and ast.text(left) == v and v not in ast.identifiers(right):
        bound = right
    elif op in (">", ">=") and ast.text(right) == v and v not in ast.identifiers(left):
        bound = left
    else:
        return None
    if not _steps_by_one(ast, update, v) or v in ast.assigned(body):
        return None
    past = ast.text(bound) if op in ("<", ">") else f"({ast.text(bound)}) + 1"
    return Counted(loop, v, ast.text(value), value, update, body, past)


def _steps_by_one(ast: KernelAST, update: Node, v: str) -> bool:
    update = unparen(update)
    if update.type == "update_expression":
        arg = unparen(update.child_by_field_name("argument"))
        return operator_of(update) == "++" and ast.text(arg) == v
    if update.type == "assignment_expression":
        left = ast.text(unparen(update.child_by_field_name("left")))
        right = "".join(ast.text(update.child_by_field_name("right")).split())
        op = operator_of(update)
        return left == v and (
            (op == "+=" and right == "1") or (op == "=" and right in (f"{v}+1", f"1+{v}"))
        )
    return False


def _tests(ast: KernelAST, loop: Counted, scope: Scope) -> list[Test]:
    """Every `x % s` in the body whose x is affine in v (a literal coefficient, ±1 where s is not
    a literal, the rest invariant in the loop) and whose s the loop does not change."""
    changed = ast.assigned(loop.body) | scope.local | {loop.v}
    env = _local_forms(ast, loop)
    found = []
    for n in walk(loop.body):
        if n.type != "binary_expression" or operator_of(n) != "%":
            continue
        x, s = (unparen(n.child_by_field_name(f)) for f in ("left", "right"))
        form = ast.affine(x, env)
        if form is None or ast.identifiers(s) & changed:
            continue
        c = form.get((loop.v,), 0)
        rest = {m: k for m, k in form.items() if m != (loop.v,)}
        if not c or any(loop.v in m or set(m) & changed for m in rest):
            continue
        literal = _literal(ast, s)
        if literal is not None and literal < 2:
            continue
        if literal is None and c not in (1, -1):
            continue
        found.append(Test(_key(ast, n), render(rest), c, ast.text(s), literal))
    return found


def _said(loop: Counted, test: Test) -> str:
    if test.literal is None:
        return f"{loop.v} by {test.s}"
    step = test.literal // gcd(test.c, test.literal)
    return f"{loop.v} by {step}" if step > 1 else f"{loop.v} only where a tap passes"


def _local_forms(ast: KernelAST, loop: Counted) -> dict:
    """Affine forms of the locals the body declares once and never assigns (`int t = oh - kh;`),
    in terms of v and what the loop does not change."""
    assigned = ast.assigned(loop.body)
    env: dict = {}
    for n in walk(loop.body):
        if n.type != "declaration":
            continue
        for d in n.children_by_field_name("declarator"):
            if d.type != "init_declarator":
                continue
            name = _declared_name(ast, d.child_by_field_name("declarator"))
            if not name or name in assigned or name in env:
                continue
            form = ast.affine(d.child_by_field_name("value"), env)
            if form is not None:
                env[name] = form
    return env


def _literal(ast: KernelAST, node: Node) -> int | None:
    node = unparen(node)
    return _int_literal(ast.text(node)) if node.type == "number_literal" else None


# ---- the step -----------------------------------------------------------------------------------


def _step(loop: Counted, test: Test) -> dict[tuple[int, int], str]:
    """The loop's start (the first v >= start that passes) and its step.

    (r + c*v) % S == 0 at v = start + d: with t = r + c*start and g = gcd(c, S), no v passes
    unless g divides t (the loop then starts past its end); else (c/g)*d = -t/g (mod S/g), so
    d = -(t/g) * (c/g)^-1 (mod S/g), and every S/g-th v after passes."""
    g = gcd(test.c, test.literal) if test.literal is not None else 1
    if test.literal is not None:
        step = str(test.literal // g)
        inverse = pow(test.c // g, -1, test.literal // g) if test.literal // g > 1 else 0
    else:
        step = f"({test.s} > 0 ? {test.s} : 1)"
        inverse = 1 if test.c == 1 else -1
    start = loop.start.strip()
    if start == "0":
        t = test.rest
    elif test.c in (1, -1):
        t = f"({test.rest}) {'+' if test.c == 1 else '-'} ({start})"
    else:
        t = f"({test.rest}) + {test.c} * ({start})"
    q = f"({t}) / {g}" if g > 1 else f"({t})"
    if step == "1":
        d = "0"
    elif inverse == 1:
        d = f"(({step} - {q} % {step}) % {step})"
    elif inverse == -1 or str(inverse + 1) == step:
        d = f"(({q} % {step} + {step}) % {step})"
    else:
        d = f"((({step} - {q} % {step}) % {step}) * {inverse} % {step})"
    first = start if d == "0" else (d if start == "0" else f"{start} + {d}")
    if g > 1:
        first = f"(({t}) % {g} == 0 ? {first} : {loop.past})"
    edits = {(loop.init.start_byte, loop.init.end_byte): first}
    if step != "1":
        edits[(loop.update.start_byte, loop.update.end_byte)] = f"{loop.v} += {step}"
    return edits


# ---- what a skipped iteration would have done ---------------------------------------------------


def _covered(ast: KernelAST, stmt: Node, test: str, scope: Scope) -> bool:
    """Whether `stmt` (inside the loop's body) changes nothing outside the iteration where the
    test fails."""
    t = stmt.type
    if t == "compound_statement":
        for s in ast.statements(stmt):
            if _skips(ast, s, test):
                return True  # the rest of this block is not reached where the test fails
            if not _covered(ast, s, test, scope):
                return False
        return True
    if t == "if_statement":
        cond = condition(stmt)
        if not _pure(ast, cond):
            return False
        then, other = (
            stmt.child_by_field_name("consequence"),
            stmt.child_by_field_name("alternative"),
        )
        if other is not None and other.type == "else_clause":
            other = other.named_children[0] if other.named_children else None
        if _requires(ast, cond, test):
            return other is None or _covered(ast, other, test, scope)
        return _covered(ast, then, test, scope) and (
            other is None or _covered(ast, other, test, scope)
        )
    if t == "for_statement":
        header = for_header(stmt)
        if header is None:
            return False
        init, cond, update, inner = header
        return (
            _pure(ast, cond)
            and ast.assigned(update) <= scope.local
            and (
                _initializers_pure(ast, init)
                if init.type == "declaration"
                else ast.assigned(init) <= scope.local and _pure(ast, init, allow_assign=True)
            )
            and _covered(ast, inner, test, scope)
        )
    if t in ("while_statement", "do_statement"):
        cond = condition(stmt)
        return _pure(ast, cond) and _covered(ast, stmt.child_by_field_name("body"), test, scope)
    if t == "declaration":
        return _initializers_pure(ast, stmt)
    if t == "expression_statement":
        return not stmt.named_children or _neutral(ast, stmt.named_children[0], test, scope)
    if t == "continue_statement":
        return True
    if t == "break_statement":
        # leaves an inner loop (the loop's own break would end it early: an effect)
        return any(
            p.type in ("for_statement", "while_statement", "do_statement")
            for p in _ancestors(stmt, scope.body)
        )
    return t in ("comment", ";")


def _ancestors(node: Node, stop: Node):
    p = node.parent
    while p is not None and p != stop:
        yield p
        p = p.parent


def _neutral(ast: KernelAST, e: Node, test: str, scope: Scope) -> bool:
    """An expression statement that changes nothing outside the iteration where the test fails."""
    e = unparen(e)
    if e.type == "assignment_expression":
        left = unparen(e.child_by_field_name("left"))
        right = e.child_by_field_name("right")
        if not _pure(ast, right) or not _pure(ast, left):
            return False
        if left.type == "identifier" and ast.text(left) in scope.local:
            return True  # the iteration's own variable
        op = operator_of(e)
        if op in ("+=", "-="):
            return _zero(ast, right, test)
        if op == "=":
            r = unparen(right)
            name = "".join(ast.text(left).split())
            if r.type == "binary_expression" and operator_of(r) in ("+", "-"):
                a, b = (unparen(r.child_by_field_name(f)) for f in ("left", "right"))
                if "".join(ast.text(a).split()) == name and _zero(ast, b, test):
                    return True
                return (
                    operator_of(r) == "+"
                    and "".join(ast.text(b).split()) == name
                    and _zero(ast, a, test)
                )
        return False
    if e.type == "update_expression":
        arg = unparen(e.child_by_field_name("argument"))
        return arg.type == "identifier" and ast.text(arg) in scope.local
    if e.type == "call_expression":
        name = ast.text(e.child_by_field_name("function"))
        args = e.child_by_field_name("arguments").named_children
        return (
            name in ("atomicAdd", "atomicSub")
            and len(args) == 2
            and _pure(ast, args[0])
            and _zero(ast, args[1], test)
        )
    if e.type == "comma_expression":
        return all(_neutral(ast, c, test, scope) for c in e.named_children)
    return _pure(ast, e)


def _zero(ast: KernelAST, e: Node, test: str) -> bool:
    """Whether `e` is 0 (for finite operands) wherever the test fails."""
    e = unparen(e)
    t = e.type
    if t == "number_literal":
        try:
            return float(ast.text(e).rstrip("fFlLuU") or "1") == 0.0
        except ValueError:
            return False
    if not _pure(ast, e):
        return False
    if t == "conditional_expression":
        cond = e.child_by_field_name("condition")
        a, b = e.child_by_field_name("consequence"), e.child_by_field_name("alternative")
        if _requires(ast, cond, test):
            return _zero(ast, b, test)
        return _zero(ast, a, test) and _zero(ast, b, test)
    if t == "binary_expression":
        op = operator_of(e)
        a, b = e.child_by_field_name("left"), e.child_by_field_name("right")
        if op == "*":
            return _zero(ast, a, test) or _zero(ast, b, test)
        if op in ("+", "-"):
            return _zero(ast, a, test) and _zero(ast, b, test)
        return False
    if t == "cast_expression":
        return _zero(ast, e.child_by_field_name("value"), test)
    if t == "unary_expression" and operator_of(e) in ("-", "+"):
        return _zero(ast, e.child_by_field_name("argument"), test)
    return False


def _requires(ast: KernelAST, cond: Node, test: str) -> bool:
    """Whether `cond` is false wherever the test fails: the test `== 0` (or `!(x % s)`) is one of
    its `&&` conjuncts."""
    cond = unparen(cond)
    if cond.type == "binary_expression" and operator_of(cond) == "&&":
        return any(_requires(ast, cond.child_by_field_name(f), test) for f in ("left", "right"))
    if _against_zero(ast, cond, "==", test):
        return True
    if cond.type == "unary_expression" and operator_of(cond) == "!":
        return _is(ast, cond.child_by_field_name("argument"), test)
    return False


def _fails(ast: KernelAST, cond: Node, test: str) -> bool:
    """Whether `cond` is true wherever the test fails: `x % s`, `x % s != 0`, `!(x % s == 0)`,
    or any `||` disjunct of these."""
    cond = unparen(cond)
    if _is(ast, cond, test):
        return True
    if cond.type == "binary_expression" and operator_of(cond) == "||":
        return any(_fails(ast, cond.child_by_field_name(f), test) for f in ("left", "right"))
    if _against_zero(ast, cond, "!=", test):
        return True
    if cond.type == "unary_expression" and operator_of(cond) == "!":
        return _requires(ast, cond.child_by_field_name("argument"), test)
    return False


def _against_zero(ast: KernelAST, cond: Node, op: str, test: str) -> bool:
    """`test op 0` or `0 op test`."""
    if cond.type != "binary_expression" or operator_of(cond) != op:
        return False
    a, b = (unparen(cond.child_by_field_name(f)) for f in ("left", "right"))
    return (_is(ast, a, test) and _is_zero(ast, b)) or (_is(ast, b, test) and _is_zero(ast, a))


def _skips(ast: KernelAST, stmt: Node, test: str) -> bool:
    """`if (... test fails ...) continue;` (nothing else in the `if`)."""
    if stmt.type != "if_statement" or stmt.child_by_field_name("alternative") is not None:
        return False
    then = stmt.child_by_field_name("consequence")
    inner = ast.statements(then) if then.type == "compound_statement" else [then]
    cond = condition(stmt)
    return (
        len(inner) == 1
        and inner[0].type == "continue_statement"
        and _pure(ast, cond)
        and _fails(ast, cond, test)
    )


def _key(ast: KernelAST, node: Node) -> str:
    return "".join(ast.text(unparen(node)).split())


def _is(ast: KernelAST, node: Node, test: str) -> bool:
    return _key(ast, node) == test


def _is_zero(ast: KernelAST, node: Node) -> bool:
    return node.type == "number_literal" and _literal(ast, node) == 0


def _initializers_pure(ast: KernelAST, decl: Node) -> bool:
    """A declaration whose initial values change nothing else."""
    return all(
        _pure(ast, d.child_by_field_name("value"))
        for d in decl.children_by_field_name("declarator")
        if d.type == "init_declarator"
    )


def _pure(ast: KernelAST, node: Node | None, *, allow_assign: bool = False) -> bool:
    """No assignment, increment or call with an effect under `node` (a declaration's own
    initialization is not one where `allow_assign`)."""
    if node is None:
        return True
    for n in walk(node):
        if n.type in ("assignment_expression", "update_expression") and not allow_assign:
            return False
        if n.type == "call_expression":
            f = n.child_by_field_name("function")
            if f is None or ast.text(f) not in PURE_CALLS:
                return False
    return True
