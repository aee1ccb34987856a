"""What the catalog's reductions share (block_reduce, privatize_histogram): reading a 1-D kernel as
"one element per thread" (the index, its bound, the statements that run for each element and the
atomics they end in), and writing the grid-stride loop that runs those statements for many elements
per thread, with unrolled independent loads and 16-byte vector loads where they are safe.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import (
    KernelAST,
    address_of,
    for_header,
    inside,
    operator_of,
    unparen,
    walk,
    words,
)
from optiml.cuda.types import DTYPES, DType
from optiml.expr import Expr, ExprError
from optiml.search.catalog.base import Context

# Every name the generated code declares starts with this; a kernel that already uses such a name
# is left alone rather than risk a clash.
PREFIX = "opt_"
BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim"})
# Calls whose meaning depends on which threads run together: a kernel that makes them is not "one
# element per thread", or is already cooperative.
COOPERATIVE = (
    "__syncthreads",
    "__syncwarp",
    "__shfl",
    "__ballot",
    "__any",
    "__all",
    "__activemask",
    "__match",
    "__reduce",
    "__threadfence",
    "this_thread_block",
    "this_grid",
    "tiled_partition",
    "coalesced_threads",
)
VECTOR4 = {"f32": "float4", "i32": "int4", "u32": "uint4"}
LANES = ("x", "y", "z", "w")
INDENT = "    "

# A replacement of a node by text built from its parts: it gets a function that renders any node
# inside it with the leaf replacements (vector components) applied.
Edit = Callable[[Callable[[Node], str]], str]


def squash(text: str) -> str:
    """An expression's text without blanks and outer parentheses, for comparing two spellings."""
    text = "".join(text.split())
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


@dataclass(frozen=True)
class Atomic:
    """One atomic call of the element code, standing alone as a statement (its value unused)."""

    call: Node
    function: str
    address: Node  # the first argument
    value: Node | None  # the second argument, if any
    pointer: str  # the parameter the address points into
    index: Node | None  # `b` of `&p[b]`, `p + b`; None for `p` itself


@dataclass
class ElementKernel:
    """A kernel that does some work for each element i < bound, one element per thread."""

    ctx: Context
    ast: KernelAST
    index: str  # the element index variable
    index_type: str  # its type as declared ("int", "size_t", "const unsigned int")
    bound: str  # the kernel-side expression the index stays below
    bound_spec: str  # the same as a spec expression (evaluates at every size)
    bound_values: list[int]  # its value at each of the spec's sizes
    uniform: list[Node]  # declarations the bound needs, run once per thread
    pre: list[Node]  # declarations run for each element before its condition
    condition: Node | None  # the guard's condition, when it says more than index < bound
    admits: bool  # whether the element runs when `condition` holds (else: when it fails)
    body: list[Node]  # the guarded statements
    early_returns: frozenset[int]  # ids of body-level `if (c) return;` statements
    atomics: list[Atomic]

    @property
    def nodes(self) -> list[Node]:
        """The element code's roots: everything that runs per element."""
        cond = [self.condition] if self.condition is not None else []
        return [*self.pre, *cond, *self.body]

    def lengths(self, pointer: str) -> list[int] | None:
        """The spec length of a pointer parameter at each size."""
        try:
            return [case.lengths[pointer] for case in self.ctx.spec.cases()]
        except (KeyError, ExprError, ValueError):
            return None

    def dtype(self, pointer: str) -> DType | None:
        buf = self.ctx.spec.buffer(pointer)
        return DTYPES.get(buf.dtype) if buf is not None else None


# ---- reading the kernel -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """Where a kernel's per-element work is: after a guard, or in a grid-stride loop."""

    decl: Node  # the index's declaration (the loop, for a grid-stride loop)
    index: str
    index_type: str
    block: str  # the block size in the index's formula
    before: list[Node]  # declarations ahead of the guard or loop
    condition: Node  # the guard's (or loop's) condition
    admits: bool  # the element runs when `condition` holds (else: when it fails)
    exact: bool  # the condition is only index < bound
    bound: str
    body: list[Node]


def analyse(ctx: Context) -> ElementKernel | None:
    """The kernel as element code, or None if it is not (or not provably) one element per thread
    with no effect other than reads, local computation and atomics that stand alone."""
    try:
        return _analyse(ctx)
    except (ValueError, ExprError, KeyError, IndexError, AttributeError):
        return None


def _analyse(ctx: Context) -> ElementKernel | None:
    ast = ctx.ast
    spec = ctx.spec
    if len(spec.launch.block) != 1 or len(spec.launch.grid) != 1:
        return None
    if ast.shared_declarations() or _cooperative(ast, ast.body):
        return None
    if any(PREFIX in name for name in ast.identifiers(ast.body) | set(ast.params)):
        return None
    stmts = ast.statements()
    shape = _guarded(ast, stmts) or _grid_stride(ast, stmts) or _while_grid_stride(ast, stmts)
    if shape is None:
        return None
    decl, index, before, cond, bound, body = (
        shape.decl,
        shape.index,
        shape.before,
        shape.condition,
        shape.bound,
        shape.body,
    )
    launch = spec.cases()
    if not _block_matches(ctx, shape.block, launch[0].block[0]):
        return None
    uniform, pre = _classify(ast, before, index, bound, body, cond)
    if uniform is None or pre is None:
        return None
    bound_spec, values = _spec_values(ctx, _expand(ast, bound, uniform))
    if values is None or any(not isinstance(v, int) for v in values):
        return None
    loops = ("for_statement", "while_statement")
    if decl.type not in loops and any(
        c.grid[0] * c.block[0] < v for c, v in zip(launch, values, strict=True)
    ):
        return None  # the original leaves elements out; a grid-stride loop would not
    early = _early_returns(ast, body)
    if early is None:
        return None
    if decl.type in loops:
        # In a loop over elements, what is declared before it lives across elements, and a
        # return ends all of the thread's elements: neither is "one element".
        carried = set().union(*(_declared_names(ast, d) for d in pre)) if pre else set()
        if early or any(carried & ast.assigned(b) for b in body):
            return None
    ek = ElementKernel(
        ctx,
        ast,
        index,
        shape.index_type,
        bound,
        bound_spec,
        values,
        uniform,
        pre,
        None if shape.exact else cond,
        shape.admits,
        body,
        early,
        [],
    )
    roots = ek.nodes
    assigned = set().union(*(ast.assigned(n) for n in roots)) if roots else set()
    if index in assigned or words(bound) & assigned:
        return None
    if any(index in ast.local_declarations(n) for n in roots):
        return None  # an inner `i` would hide the element's
    if any(_declared_names(ast, u) & assigned for u in uniform):
        return None
    if not all(_element_ok(ast, n, early) for n in roots):
        return None
    atomics = _atomics(ast, [*uniform, *roots])
    if atomics is None:
        return None
    ek.atomics = atomics
    return ek


def _cooperative(ast: KernelAST, node: Node) -> bool:
    names = [name.rsplit("::", 1)[-1] for name, _ in ast.calls(node)]
    return any(name.startswith(COOPERATIVE) for name in names) or any(
        n.type == "qualified_identifier" and "cooperative_groups" in ast.text(n) for n in walk(node)
    )


def _single_init(ast: KernelAST, decl: Node) -> tuple[str, Node, str] | None:
    """(name, value, type text) of a declaration `T name = value;` with exactly one declarator."""
    ds = decl.children_by_field_name("declarator")
    if len(ds) != 1 or ds[0].type != "init_declarator":
        return None
    target = ds[0].child_by_field_name("declarator")
    value = ds[0].child_by_field_name("value")
    if target is None or target.type != "identifier" or value is None:
        return None
    type_text = ast.source._bytes[decl.start_byte : ds[0].start_byte].decode().strip()
    return ast.text(target), value, " ".join(type_text.split())


def _global_index(ast: KernelAST, value: Node, env: dict) -> str | None:
    """The block-size text if `value` is blockIdx.x * B + threadIdx.x (through local variables)."""
    form = ast.affine(value, env)
    if form is None or form.get(("threadIdx.x",)) != 1:
        return None
    rest = {m: c for m, c in form.items() if m != ("threadIdx.x",)}
    if len(rest) != 1:
        return None
    ((mono, coef),) = rest.items()
    if "blockIdx.x" not in mono:
        return None
    others = [a for a in mono if a != "blockIdx.x"]
    if len(others) == 1 and coef == 1:
        return others[0]
    return str(coef) if not others else None


def _guarded(ast: KernelAST, stmts: list[Node]) -> _Shape | None:
    """`idx = global index; ... if (idx < n) {...}` or `if (idx >= n) return; ...`."""
    env: dict = {}
    for pos, st in enumerate(stmts):
        if st.type != "declaration":
            return None
        found = _single_init(ast, st)
        if found is None:
            continue
        name, value, type_text = found
        block = _global_index(ast, value, env)
        if block is None:
            form = ast.affine(value, env)
            if form is not None:
                env[name] = form
            continue
        guard = ast.guard(after=st)
        if guard is None or name not in guard.bounds:
            return None
        gpos = stmts.index(guard.node)
        if any(s.type != "declaration" for s in stmts[pos + 1 : gpos]):
            return None
        exact = guard.exact and set(guard.bounds) == {name}
        before = [s for s in stmts[:gpos] if s is not st]
        cond = unparen(guard.node.child_by_field_name("condition").named_children[0])
        return _Shape(
            st,
            name,
            type_text,
            block,
            before,
            cond,
            guard.style == "if",
            exact,
            guard.bounds[name],
            guard.body,
        )
    return None


def _grid_stride(ast: KernelAST, stmts: list[Node]) -> _Shape | None:
    """`for (T i = global index; i < n; i += blockDim.x * gridDim.x) body` as the last statement."""
    if not stmts or stmts[-1].type != "for_statement":
        return None
    loop = stmts[-1]
    before = stmts[:-1]
    if any(s.type != "declaration" for s in before):
        return None
    env: dict = {}
    for st in before:
        found = _single_init(ast, st)
        if found is not None:
            form = ast.affine(found[1], env)
            if form is not None:
                env[found[0]] = form
    header = for_header(loop)
    if header is None or header[0].type != "declaration":
        return None
    init, cond, update, _ = header
    found = _single_init(ast, init)
    if found is None:
        return None
    name, value, type_text = found
    block = _global_index(ast, value, env)
    if block is None:
        return None
    cond = unparen(cond)
    if cond.type != "binary_expression" or operator_of(cond) != "<":
        return None
    left = unparen(cond.child_by_field_name("left"))
    if left.type != "identifier" or ast.text(left) != name:
        return None
    if not _grid_step(_step(ast, update, name, env), block):
        return None
    body = loop.child_by_field_name("body")
    bound = ast.text(cond.child_by_field_name("right"))
    return _Shape(
        loop, name, type_text, block, before, cond, True, True, bound, ast.statements(body)
    )


def _while_grid_stride(ast: KernelAST, stmts: list[Node]) -> _Shape | None:
    """`T i = global index; ... while (i < n) { body; i += blockDim.x * gridDim.x; }` as the last
    statement (the stride may be a variable declared before the loop)."""
    if not stmts or stmts[-1].type != "while_statement":
        return None
    loop = stmts[-1]
    before = stmts[:-1]
    if any(s.type != "declaration" for s in before):
        return None
    cond = unparen(loop.child_by_field_name("condition"))
    if cond.type == "condition_clause":
        inner = [c for c in cond.named_children if c.type != "comment"]
        if len(inner) != 1:
            return None
        cond = unparen(inner[0])
    if cond.type != "binary_expression" or operator_of(cond) != "<":
        return None
    left = unparen(cond.child_by_field_name("left"))
    if left.type != "identifier":
        return None
    name = ast.text(left)
    env: dict = {}
    index_decl = None
    for st in before:
        found = _single_init(ast, st)
        if found is None:
            continue
        if found[0] == name:
            index_decl = (st, found)
            continue
        form = ast.affine(found[1], env)
        if form is not None:
            env[found[0]] = form
    if index_decl is None:
        return None
    decl, (_, value, type_text) = index_decl
    block = _global_index(ast, value, env)
    if block is None:
        return None
    body = ast.statements(loop.child_by_field_name("body"))
    if not body or body[-1].type != "expression_statement" or not body[-1].named_children:
        return None
    if not _grid_step(_step(ast, body[-1].named_children[0], name, env), block):
        return None
    if any(name in ast.assigned(b) for b in body[:-1]):
        return None
    bound = ast.text(cond.child_by_field_name("right"))
    rest = [st for st in before if st is not decl]
    return _Shape(loop, name, type_text, block, rest, cond, True, True, bound, body[:-1])


def _grid_step(step: dict | None, block: str) -> bool:
    """A loop's step that is the whole grid's threads: `blockDim.x * gridDim.x` (the block size
    as the index's formula spells it)."""
    return step is not None and (
        step == {tuple(sorted((block, "gridDim.x"))): 1}
        or (block.isdigit() and step == {("gridDim.x",): int(block)})
    )


def _step(ast: KernelAST, update: Node, name: str, env: dict) -> dict | None:
    """How much a loop's update adds to its variable, as an affine form."""
    update = unparen(update)
    if update.type != "assignment_expression":
        return None
    left = unparen(update.child_by_field_name("left"))
    if left.type != "identifier" or ast.text(left) != name:
        return None
    right = update.child_by_field_name("right")
    if operator_of(update) == "+=":
        return ast.affine(right, env)
    if operator_of(update) == "=":
        form = ast.affine(right, env)
        if form is None or form.get((name,)) != 1:
            return None
        return {m: c for m, c in form.items() if m != (name,)}
    return None


def _expand(ast: KernelAST, text: str, uniform: list[Node]) -> str:
    """A kernel expression with the locals it reads (declared once per thread, before the guard)
    replaced by their definitions, so that it reads in the spec's variables."""
    defs = {}
    for d in uniform:
        found = _single_init(ast, d)
        if found is not None:
            defs[found[0]] = ast.text(found[1])
    for _ in range(len(defs)):
        names = words(text) & set(defs)
        if not names:
            break
        text = re.sub(
            r"\b(" + "|".join(sorted(names)) + r")\b", lambda m: f"({defs[m.group(1)]})", text
        )
    return text


def _block_matches(ctx: Context, block_text: str, launch_block: int) -> bool:
    if block_text == "blockDim.x":
        return True
    if block_text.isdigit():
        return int(block_text) == launch_block
    return ctx.spec.template_values.get(block_text) == launch_block


def _spec_values(ctx: Context, text: str) -> tuple[str, list | None]:
    """A kernel expression read as a spec expression, and its value at each size."""
    try:
        expr = Expr.parse(text)
        values = []
        for sizes in ctx.spec.sizes:
            case = ctx.spec.case(sizes)
            env = ctx.env(case)
            value = expr.evaluate(env)
            if isinstance(value, tuple):
                return text, None
            values.append(value)
        return " ".join(text.split()), values
    except (ExprError, ValueError, TypeError):
        return text, None


def spec_values(ctx: Context, text: str) -> list | None:
    return _spec_values(ctx, text)[1]


def _declared_names(ast: KernelAST, decl: Node) -> set[str]:
    return set(ast.local_declarations(decl))


def _uses_builtin(ast: KernelAST, node: Node) -> bool:
    return any(n.type == "identifier" and ast.text(n) in BUILTINS for n in walk(node))


def _classify(
    ast: KernelAST,
    before: list[Node],
    index: str,
    bound: str,
    body: list[Node],
    cond: Node,
) -> tuple[list[Node] | None, list[Node] | None]:
    """Split the declarations before the guard: those the bound needs (run once per thread), those
    that only feed the index (dropped) and the rest (run per element)."""
    names = {id(d): _declared_names(ast, d) for d in before}
    needed = words(bound)
    uniform: list[Node] = []
    for d in reversed(before):
        if names[id(d)] & needed:
            uniform.insert(0, d)
            needed |= ast.identifiers(d)
    # The index's own declaration is not among the readers: what only it reads is dropped.
    readers_of = {id(d): [o for o in before if o is not d] + [*body, cond] for d in before}
    dropped: set[int] = set()
    changed = True
    while changed:  # declarations that only the index (or other dropped ones) reads
        changed = False
        for d in before:
            if id(d) in dropped or d in uniform or not _uses_builtin(ast, d):
                continue
            readers = [r for r in readers_of[id(d)] if id(r) not in dropped]
            if not any(ast.uses(r, n) for r in readers for n in names[id(d)]):
                dropped.add(id(d))
                changed = True
    pre = [d for d in before if id(d) not in dropped and d not in uniform]
    if any(_uses_builtin(ast, d) or ast.uses(d, index) for d in uniform):
        return None, None
    if any(_uses_builtin(ast, d) for d in pre):
        return None, None
    if any(
        ast.has(d, "call_expression", "assignment_expression", "update_expression")
        for d in before
        if id(d) in dropped
    ):
        return None, None
    return uniform, pre


def _is_return(node: Node) -> bool:
    if node.type == "return_statement":
        return True
    if node.type == "compound_statement":
        inner = [c for c in node.named_children if c.type != "comment"]
        return len(inner) == 1 and inner[0].type == "return_statement"
    return False


def _early_returns(ast: KernelAST, body: list[Node]) -> frozenset[int] | None:
    """Body-level `if (c) return;`: the element is skipped from there on."""
    out = set()
    for st in body:
        if st.type != "if_statement" or st.child_by_field_name("alternative") is not None:
            continue
        cons = st.child_by_field_name("consequence")
        if _is_return(cons):
            ret = next(n for n in walk(cons) if n.type == "return_statement")
            if ret.named_children:
                return None
            out.add(st.id)
    return frozenset(out)


def _element_ok(ast: KernelAST, root: Node, early: frozenset[int]) -> bool:
    allowed = set()
    for n in walk(root):
        if n.id in early:
            allowed |= {m.id for m in walk(n) if m.type == "return_statement"}
    for n in walk(root):
        if n.type in (
            "goto_statement",
            "labeled_statement",
            "lambda_expression",
            "reference_declarator",  # a reference to an element is a write we would not see
        ):
            return False
        if n.type == "return_statement" and n.id not in allowed:
            return False
        if n.type in ("break_statement", "continue_statement") and not _enclosed(n, root):
            return False
        if n.type == "identifier" and ast.text(n) in BUILTINS:
            return False
    return True


def _enclosed(node: Node, root: Node) -> bool:
    """Whether a break/continue's loop (or switch) lies inside the element code."""
    kinds = {"for_statement", "while_statement", "do_statement", "for_range_loop"}
    if node.type == "break_statement":
        kinds.add("switch_statement")
    anc = node.parent
    while anc is not None:
        if anc.type in kinds:
            return True
        if anc == root:
            return False
        anc = anc.parent
    return False


def _atomics(ast: KernelAST, roots: list[Node]) -> list[Atomic] | None:
    """The atomic calls of the element code, or None if the value of one is used, if a pointer
    parameter is written any other way, or if a writable pointer is handed to a function."""
    out: list[Atomic] = []
    for root in roots:
        for name, call in ast.calls(root):
            if not name.startswith("atomic"):
                continue
            args = call.child_by_field_name("arguments").named_children
            parsed = address_of(ast, args[0]) if args else None
            if parsed is None or not _statement_level(ast, call):
                return None
            out.append(Atomic(call, name, args[0], args[1] if len(args) > 1 else None, *parsed))
    addresses = [a.address for a in out]
    for root in roots:
        if any(acc.write and not acc.atomic for acc in ast.accesses(root)):
            return None
        for n in walk(root):
            if n.type == "assignment_expression":
                target = unparen(n.child_by_field_name("left"))
            elif n.type == "update_expression":
                target = unparen(n.child_by_field_name("argument"))
            else:
                continue
            if target.type != "identifier" and not _local_target(ast, target):
                return None
        for ident in ast.pointer_escapes(root):
            if any(inside(ident, a) for a in addresses):
                continue
            param = ast.params.get(ast.pointer_of(ast.text(ident))[0])
            if param is None or not param.const_pointee:
                return None
    return out


def _local_target(ast: KernelAST, target: Node) -> bool:
    """An assignment target inside a local: a member of a local struct, an element of a local
    array (through `.` and `[]` only; `*p` and `p->f` might be anything)."""
    base = target
    while base.type in ("field_expression", "subscript_expression", "parenthesized_expression"):
        if base.type == "field_expression" and operator_of(base) == "->":
            return False
        base = base.child_by_field_name("argument") or base.named_children[0]
    if base.type != "identifier":
        return False
    name = ast.text(base)
    return ast.pointer_of(name) is None and name not in ast.params


def statement_call(node: Node) -> bool:
    """Whether a call is the whole expression of its statement (no `(void)` around it)."""
    return node.parent is not None and node.parent.type == "expression_statement"


def _statement_level(ast: KernelAST, call: Node) -> bool:
    """Whether a call is a statement of its own (its value unused): `f(...);`, `(void)f(...);`."""
    node = call.parent
    while node is not None and node.type == "parenthesized_expression":
        node = node.parent
    if node is not None and node.type == "cast_expression":
        if squash(ast.text(node.child_by_field_name("type"))) != "void":
            return False
        node = node.parent
    return node is not None and node.type == "expression_statement"


def only_in_addresses(ek: ElementKernel, pointers: set[str]) -> bool:
    """Whether the buffers appear nowhere but in the atomics' addresses (nothing reads them)."""
    ast = ek.ast
    names = pointers | {k for k, v in ast.aliases.items() if v[0] in pointers}
    addresses = [a.address for a in ek.atomics]
    for root in [*ek.uniform, *ek.nodes]:
        for name in names:
            for use in ast.uses(root, name):
                if not any(inside(use, a) for a in addresses):
                    return False
    return True


# ---- what an element's code reads ---------------------------------------------------------------


def vector_reads(ek: ElementKernel) -> dict[str, list[Node]]:
    """Reads `p[i]` of 4-byte pointer parameters that stay in bounds at every size for every
    i < bound (so a 16-byte load of four of them is safe), by parameter."""
    ast = ek.ast
    out: dict[str, list[Node]] = {}
    for root in ek.nodes:
        for acc in ast.accesses(root):
            if acc.write or acc.atomic or acc.offset not in (None, "0"):
                continue
            if ast.affine(acc.index) != {(ek.index,): 1}:
                continue
            dtype = ek.dtype(acc.pointer)
            lengths = ek.lengths(acc.pointer)
            if dtype is None or dtype.code not in VECTOR4 or lengths is None:
                continue
            if any(n < b for n, b in zip(lengths, ek.bound_values, strict=True)):
                continue
            out.setdefault(acc.pointer, []).append(acc.node)
    return out


def uniform_expr(ek: ElementKernel, node: Node) -> bool:
    """Whether an expression has the same value in every thread and for every element: literals,
    scalar parameters the kernel never assigns, and names the kernel does not declare (macros,
    constants)."""
    ast = ek.ast
    local = set(ast.local_declarations(ast.body))
    assigned = ast.assigned(ast.body)
    for n in walk(node):
        if n.type in (
            "call_expression",
            "subscript_expression",
            "field_expression",
            "pointer_expression",
            "assignment_expression",
            "update_expression",
            "sizeof_expression",
        ):
            return False
        if n.type == "identifier":
            name = ast.text(n)
            if name in local or name in assigned or name in BUILTINS or name in ast.pointers:
                return False
    return True


def dominating(ek: ElementKernel, node: Node) -> list[tuple[Node, bool]]:
    """Conditions known at `node` in the element code, each with the truth it has there."""
    out: list[tuple[Node, bool]] = []
    if ek.condition is not None:
        out.append((ek.condition, ek.admits))
    top = node
    while top.parent is not None and not any(top == b for b in ek.body):
        prev, top = top, top.parent
        if top.type == "if_statement":
            if prev == top.child_by_field_name("consequence"):
                out.append((unparen(top.child_by_field_name("condition").named_children[0]), True))
            elif prev == top.child_by_field_name("alternative"):
                out.append((unparen(top.child_by_field_name("condition").named_children[0]), False))
    if not any(top == b for b in ek.body):
        return out
    for st in ek.body:
        if st == top:
            break
        if st.id in ek.early_returns:
            out.append((unparen(st.child_by_field_name("condition").named_children[0]), False))
    return out


def comparisons(ast: KernelAST, cond: Node, truth: bool) -> list[tuple[str, str, str]]:
    """Facts `(left, op, right)` with op in < <= > >= that hold when `cond` has `truth`."""
    cond = unparen(cond)
    if cond.type == "unary_expression" and operator_of(cond) == "!":
        return comparisons(ast, cond.child_by_field_name("argument"), not truth)
    if cond.type != "binary_expression":
        return []
    op = operator_of(cond)
    left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
    if (op == "&&" and truth) or (op == "||" and not truth):
        return comparisons(ast, left, truth) + comparisons(ast, right, truth)
    negate = {"<": ">=", ">=": "<", ">": "<=", "<=": ">"}
    if op not in negate:
        return []
    return [(squash(ast.text(left)), op if truth else negate[op], squash(ast.text(right)))]


# ---- writing code -------------------------------------------------------------------------------


def reindent(ast: KernelAST, node: Node, text: str, indent: str) -> list[str]:
    """A node's rendered text as lines at `indent`, keeping its inner indentation."""
    base = ast.indent_of(node)
    lines = text.split("\n")
    out = [indent + lines[0]]
    for line in lines[1:]:
        out.append(indent + line[len(base) :] if line.startswith(base) else indent + line.lstrip())
    return out


class Renderer:
    """Renders element code with `edits` (atomic calls rewritten) and `leaves` (reads replaced by
    vector components); leaves inside an edit are applied when the edit renders its parts."""

    def __init__(self, ek: ElementKernel, edits: dict[int, Edit], leaves: dict[int, str]):
        self.ek, self.ast = ek, ek.ast
        self.edits = edits  # node id -> edit
        self.leaves = leaves  # node id -> text
        self._nodes = {n.id: n for root in ek.nodes for n in walk(root)}

    def _ranges(self, node: Node, with_edits: bool) -> dict[tuple[int, int], str]:
        out: dict[tuple[int, int], str] = {}
        edited: list[Node] = []
        if with_edits:
            for nid, edit in self.edits.items():
                n = self._nodes.get(nid)
                if n is not None and inside(n, node):
                    out[(n.start_byte, n.end_byte)] = edit(self.sub)
                    edited.append(n)
        for nid, text in self.leaves.items():
            n = self._nodes.get(nid)
            if n is not None and inside(n, node) and not any(inside(n, e) for e in edited):
                out[(n.start_byte, n.end_byte)] = text
        return out

    def sub(self, node: Node) -> str:
        return self.ast.render(node, self._ranges(node, with_edits=False))

    def node(self, node: Node) -> str:
        return self.ast.render(node, self._ranges(node, with_edits=True))

    def statements(self, stmts: list[Node], indent: str) -> list[str]:
        lines: list[str] = []
        for pos, st in enumerate(stmts):
            if st.id in self.ek.early_returns:
                cond = st.child_by_field_name("condition").named_children[0]
                lines.append(f"{indent}if (!({self.node(unparen(cond))})) {{")
                lines += self.statements(stmts[pos + 1 :], indent + INDENT)
                lines.append(f"{indent}}}")
                return lines
            lines += reindent(self.ast, st, self.node(st), indent)
        return lines

    def element(self, indent: str) -> list[str]:
        ek = self.ek
        lines: list[str] = []
        for d in ek.pre:
            lines += reindent(self.ast, d, self.node(d), indent)
        if ek.condition is not None:
            cond = self.node(ek.condition)
            lines.append(f"{indent}if ({cond if ek.admits else f'!({cond})'}) {{")
        elif ek.pre and any(s.type == "declaration" for s in ek.body):
            lines.append(f"{indent}{{")  # the body's names may repeat those before the guard
        else:
            return lines + self.statements(ek.body, indent)
        lines += self.statements(ek.body, indent + INDENT)
        lines.append(f"{indent}}}")
        return lines


def element_loop(
    ek: ElementKernel,
    *,
    block: int,
    unroll: int,
    vectors: dict[str, list[Node]],
    edits: Callable[[int], dict[int, Edit]],
    indent: str = INDENT,
) -> list[str]:
    """Every element i < bound, each run through the element code once: a grid-stride loop over
    `unroll` elements at a time (independent loads in flight), preceded, when `vectors` names
    parameters read as p[i], by the same loop over 16-byte vectors of them where they are aligned.
    `edits(u)` rewrites the element code's atomics for unroll slot u."""
    p = PREFIX
    itype = ek.index_type
    cast = " ".join(w for w in itype.split() if w not in ("const", "volatile"))
    if cast == "auto":
        itype = cast = "unsigned int"  # what blockIdx.x * blockDim.x + threadIdx.x is

    def element(
        base: str, slot: int, leaves: dict[int, str], ind: str, scoped: bool = False
    ) -> list[str]:
        """One element's code, in a scope of its own unless `scoped` (the caller's block is one);
        its index declared only where it is still used."""
        lines = Renderer(ek, edits(slot), leaves).element(ind + INDENT)
        declares = bool(ek.pre) or any(s.type == "declaration" for s in ek.body)
        if ek.index in words("\n".join(lines)):
            lines = [f"{ind}{INDENT}{itype} {ek.index} = ({cast})({base});", *lines]
            declares = True
        if scoped or not declares:
            return [line[len(INDENT) :] for line in lines]
        return [f"{ind}{{", *lines, f"{ind}}}"]

    def slot_at(var: str, slot: int) -> str:
        return var if slot == 0 else f"{var} + {slot} * {p}threads"

    def vec_index(slot: int, lane: int) -> str:
        at = f"{p}v" if slot == 0 else f"({slot_at(p + 'v', slot)})"
        return f"4 * {at} + {lane}"

    out = [
        f"{indent}const long long {p}n = (long long)({ek.bound});",
        f"{indent}const long long {p}threads = (long long)gridDim.x * {block};",
        f"{indent}const long long {p}tid = (long long)blockIdx.x * {block} + threadIdx.x;",
        f"{indent}long long {p}e = {p}tid;",
    ]
    if vectors:
        ptrs = list(vectors)
        vtype = {q: VECTOR4[ek.dtype(q).code] for q in ptrs}
        aligned = " | ".join(f"reinterpret_cast<unsigned long long>({q})" for q in ptrs)
        ind = indent + INDENT

        def loads(slot: int, ind2: str) -> list[str]:
            return [
                f"{ind2}const {vtype[q]} {p}{q}{slot} = "
                f"reinterpret_cast<const {vtype[q]}*>({q})[{slot_at(p + 'v', slot)}];"
                for q in ptrs
            ]

        def lanes(slot: int, ind2: str) -> list[str]:
            lines = []
            for lane, comp in enumerate(LANES):
                leaves = {n.id: f"{p}{q}{slot}.{comp}" for q in ptrs for n in vectors[q]}
                lines += element(vec_index(slot, lane), slot, leaves, ind2)
            return lines

        out += [
            f"{indent}// Four elements per 16-byte load where every pointer read as p[{ek.index}] "
            "is aligned;",
            f"{indent}// the rest (all of it if one is not) goes one element at a time below.",
            f"{indent}if ((({aligned}) & 15) == 0) {{",
            f"{ind}const long long {p}nv = {p}n / 4;",
            f"{ind}long long {p}v = {p}tid;",
            f"{ind}for (; {slot_at(p + 'v', unroll - 1)} < {p}nv; {p}v += {unroll} * {p}threads) {{",
        ]
        # All of an iteration's loads come first, so that they are in flight together.
        for slot in range(unroll):
            out += loads(slot, ind + INDENT)
        for slot in range(unroll):
            out += lanes(slot, ind + INDENT)
        out.append(f"{ind}}}")
        if unroll > 1:
            # The last, partial round (at most unroll - 1 vectors): its loads, too, go first.
            ind2 = ind + INDENT
            out.append(f"{ind}if ({p}v < {p}nv) {{")
            out += loads(0, ind2)
            for slot in range(1, unroll - 1):
                for q in ptrs:
                    out.append(f"{ind2}{vtype[q]} {p}{q}{slot} = {{}};")
                out.append(f"{ind2}if ({slot_at(p + 'v', slot)} < {p}nv) {{")
                out += [
                    line.replace(f"const {vtype[q]} ", "", 1)
                    for line, q in zip(loads(slot, ind2 + INDENT), ptrs, strict=True)
                ]
                out.append(f"{ind2}}}")
            out += lanes(0, ind2)
            for slot in range(1, unroll - 1):
                out.append(f"{ind2}if ({slot_at(p + 'v', slot)} < {p}nv) {{")
                out += lanes(slot, ind2 + INDENT)
                out.append(f"{ind2}}}")
            out.append(f"{ind}}}")
        out += [f"{ind}{p}e = 4 * {p}nv + {p}tid;", f"{indent}}}"]

    out.append(
        f"{indent}for (; {slot_at(p + 'e', unroll - 1)} < {p}n; {p}e += {unroll} * {p}threads) {{"
    )
    for slot in range(unroll):
        out += element(slot_at(p + "e", slot), slot, {}, indent + INDENT)
    out.append(f"{indent}}}")
    for slot in range(unroll - 1):  # the last, partial round: at most unroll - 1 elements
        out.append(f"{indent}if ({slot_at(p + 'e', slot)} < {p}n) {{")
        out += element(slot_at(p + "e", slot), slot, {}, indent + INDENT, scoped=True)
        out.append(f"{indent}}}")
    return out


def uniform_lines(ek: ElementKernel, indent: str = INDENT) -> list[str]:
    return [ln for d in ek.uniform for ln in reindent(ek.ast, d, ek.ast.text(d), indent)]


def definition(ek: ElementKernel, body: list[str], block: int, min_blocks: int) -> str:
    """The kernel's definition with its body replaced and `__launch_bounds__(block, min_blocks)`
    (so that min_blocks blocks fit on an SM: the grid is sized to be resident at once)."""
    ast = ek.ast
    bounds = f"__launch_bounds__({block}, {min_blocks})"
    repl: dict[tuple[int, int], str] = {}
    old = next((c for c in ast.fn.children if c.type == "launch_bounds"), None)
    if old is not None:
        repl[(old.start_byte, old.end_byte)] = bounds
    else:
        decl = ast.fn.child_by_field_name("declarator")
        repl[(decl.start_byte, decl.start_byte)] = bounds + " "
    repl[(ast.body.start_byte, ast.body.end_byte)] = "{\n" + "\n".join(body) + "\n}"
    return ast.definition(repl)


def slots(unroll: int, vectors: dict[str, list[Node]]) -> int:
    """The unroll for a configuration's `unroll` 16-byte loads in flight per thread, when each
    element reads `len(vectors)` vectorized buffers (more would only cost registers)."""
    return max(1, unroll // len(vectors)) if vectors else unroll


def grid(ek: ElementKernel, per_block: int, blocks_per_sm: int) -> str:
    """Enough blocks for one pass of `per_block` elements each, at most what fits at once."""
    resident = ek.ctx.sm_count * blocks_per_sm
    return f"min(cdiv({ek.bound_spec}, {per_block}), {resident})"


# ---- value ranges -------------------------------------------------------------------------------

UNSIGNED_WORDS = ("unsigned", "size_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t")


def declaration_of(ek: ElementKernel, name: str) -> tuple[str, Node] | None:
    """(type text, initializer) of a local declared once with an initializer and never assigned."""
    ast = ek.ast
    found = []
    for root in [*ek.uniform, *ek.nodes]:
        for n in walk(root):
            if n.type == "declaration":
                init = _single_init(ast, n)
                if init is not None and init[0] == name:
                    found.append((init[2], init[1]))
                elif name in _declared_names(ast, n):
                    return None
    if len(found) != 1 or any(name in ast.assigned(r) for r in [*ek.uniform, *ek.nodes]):
        return None
    return found[0]


def is_unsigned(ek: ElementKernel, node: Node) -> bool:
    """Whether an expression has an unsigned type: an unsigned local, a cast to one, an element
    of an unsigned buffer."""
    ast = ek.ast
    node = unparen(node)
    if node.type == "identifier":
        decl = declaration_of(ek, ast.text(node))
        return decl is not None and any(w in decl[0].split() for w in UNSIGNED_WORDS)
    if node.type == "cast_expression":
        words_ = ast.text(node.child_by_field_name("type")).split()
        return any(w in words_ for w in UNSIGNED_WORDS)
    if node.type == "subscript_expression":
        arr = unparen(node.child_by_field_name("argument"))
        found = ast.pointer_of(ast.text(arr)) if arr.type == "identifier" else None
        dtype = ek.dtype(found[0]) if found is not None else None
        return dtype is not None and dtype.kind == "uint"
    return False


def interval(ek: ElementKernel, node: Node, case: int) -> tuple[int, int] | None:
    """Bounds [lo, hi] of an integer expression at one of the spec's sizes, from literals, the
    spec's ranges of input buffers and `&`, `%`, `>>`, `+`, `-`, `*` on them; None if unknown."""
    ast = ek.ast
    node = unparen(node)
    t = node.type
    if t == "number_literal":
        try:
            value = int(ast.text(node).rstrip("uUlL"), 0)
        except ValueError:
            return None
        return value, value
    if t == "identifier":
        decl = declaration_of(ek, ast.text(node))
        if decl is not None and decl[0].split()[-1] not in ("float", "double", "half"):
            return interval(ek, decl[1], case)
        return None
    if t == "cast_expression":
        narrow = {"char", "short", "int8_t", "int16_t", "uint8_t", "uint16_t"}
        if narrow & set(ast.text(node.child_by_field_name("type")).split()):
            return None
        inner = interval(ek, node.child_by_field_name("value"), case)
        return inner if inner is not None and inner[0] >= 0 and inner[1] < 2**31 else None
    if t == "subscript_expression":
        arr = unparen(node.child_by_field_name("argument"))
        found = ast.pointer_of(ast.text(arr)) if arr.type == "identifier" else None
        if found is None:
            return None
        dtype = ek.dtype(found[0])
        try:
            lo, hi = ek.ctx.spec.cases()[case].ranges[found[0]]
        except (KeyError, IndexError, ExprError, ValueError):
            return None
        if dtype is None or dtype.is_float or not isinstance(lo, int) or not isinstance(hi, int):
            return None
        return lo, hi - 1
    if t != "binary_expression":
        return None
    op = operator_of(node)
    left = interval(ek, node.child_by_field_name("left"), case)
    right = interval(ek, node.child_by_field_name("right"), case)
    if op == "&" and (right is not None and right[0] == right[1] and right[0] >= 0):
        return 0, right[0]
    if op == "&" and (left is not None and left[0] == left[1] and left[0] >= 0):
        return 0, left[0]
    if left is None or right is None:
        return None
    if op == "%" and right[0] == right[1] > 0 and left[0] >= 0:
        return 0, min(left[1], right[0] - 1)
    if op == ">>" and right[0] == right[1] >= 0 and left[0] >= 0:
        return left[0] >> right[0], left[1] >> right[0]
    if op == "+":
        return left[0] + right[0], left[1] + right[1]
    if op == "-":
        return left[0] - right[1], left[1] - right[0]
    if op == "*" and left[0] >= 0 and right[0] >= 0:
        return left[0] * right[0], left[1] * right[1]
    return None
