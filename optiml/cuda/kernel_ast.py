"""A kernel's body as tree-sitter nodes, with the queries that code transformations need: statements,
identifiers, accesses to pointer parameters (direct or through a local pointer `p = param + off`),
thread-index variables, bounds guards, and affine forms of index expressions. Plus `render`, which
writes a node back with some of its sub-ranges replaced: transformations edit the tree's text, never
a regex over the file.

Nothing here decides whether a transformation is legal; it only answers questions about the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from tree_sitter import Node

from optiml.cuda.source import Kernel, SourceFile

BUILTIN_DIMS = ("x", "y", "z")
ATOMIC_FUNCTIONS = frozenset(
    {
        "atomicAdd",
        "atomicSub",
        "atomicMax",
        "atomicMin",
        "atomicExch",
        "atomicCAS",
        "atomicAnd",
        "atomicOr",
        "atomicXor",
        "atomicInc",
        "atomicDec",
    }
)
ASSIGN_OPS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="})
BARRIERS = frozenset({"__syncthreads", "__syncwarp", "__threadfence", "__threadfence_block"})

# An affine form: monomial (sorted atoms) -> integer coefficient; () is the constant term.
Affine = dict[tuple[str, ...], int]


def walk(node: Node) -> Iterator[Node]:
    """Every node under `node`, itself first, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def for_header(loop: Node) -> tuple[Node, Node, Node, Node] | None:
    """A `for` statement's initializer, condition, update and body; None if one is missing."""
    parts = tuple(
        loop.child_by_field_name(f) for f in ("initializer", "condition", "update", "body")
    )
    return None if None in parts else parts


def inside(node: Node, outer: Node) -> bool:
    """Whether `node` lies within `outer` in the source."""
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def condition(stmt: Node) -> Node | None:
    """An `if`'s or `while`'s condition, its `condition_clause` (C++'s `(init; cond)`) unwrapped
    where it holds the condition alone."""
    cond = stmt.child_by_field_name("condition")
    if cond is None:
        return None
    cond = unparen(cond)
    if cond.type == "condition_clause":
        inner = [c for c in cond.named_children if c.type != "comment"]
        return unparen(inner[0]) if len(inner) == 1 else cond
    return cond


def unparen(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


@dataclass(frozen=True)
class Access:
    """One subscript of a pointer parameter, `p[index]` (or `alias[index]` with `alias = p + off`)."""

    pointer: str  # the parameter
    node: Node  # the subscript_expression
    index: Node  # the index expression as written
    offset: str | None  # the alias's offset from the parameter, as text, if through an alias
    read: bool
    write: bool
    atomic: bool  # the address is the first argument of an atomic function


@dataclass(frozen=True)
class ThreadIndex:
    """`v = blockIdx.D * B + threadIdx.D` with B = blockDim.D or a constant equal to it."""

    var: str
    dim: str
    block: str  # the text standing for the block size: "blockDim.x", "BLOCK", "256"
    decl: Node  # the declaration statement


@dataclass(frozen=True)
class Guard:
    """How a kernel keeps threads past the end of the data out: `if (cond) { body }` around the rest
    of the kernel, or `if (!cond) return;` before it. `bounds` maps index variables to the expression
    they must stay below, from the condition's `v < e` conjuncts (also `e > v`)."""

    node: Node
    style: str  # "if" | "return"
    condition: Node  # the condition under which the body runs (for "return", its negation's text)
    condition_text: str
    body: list[Node]  # statements that run under the guard
    bounds: dict[str, str] = field(default_factory=dict)
    exact: bool = True  # the condition is only `v < e` conjuncts


class KernelAST:
    """The tree of one kernel's definition and the queries over it."""

    def __init__(self, source: SourceFile, kernel: Kernel):
        self.source = source
        self.kernel = kernel
        self.fn = self._function_node()
        self.outer = self._outer_node()
        self.body: Node = self.fn.child_by_field_name("body")
        self.params = {p.name: p for p in kernel.params}
        self.pointers = {p.name for p in kernel.params if p.is_pointer}
        self.aliases = self._aliases()

    # ---- text ---------------------------------------------------------------------------------

    def text(self, node: Node) -> str:
        return self.source.node_text(node)

    def render(self, node: Node, replace: dict[tuple[int, int], str]) -> str:
        """`node`'s text with the byte ranges in `replace` (which must not overlap) swapped in."""
        raw = self.source._bytes
        out, pos = [], node.start_byte
        for (start, end), new in sorted(replace.items()):
            if start < pos:
                raise ValueError("overlapping replacements")
            out.append(raw[pos:start].decode("utf-8", errors="replace"))
            out.append(new)
            pos = end
        out.append(raw[pos : node.end_byte].decode("utf-8", errors="replace"))
        return "".join(out)

    def substitute(self, node: Node, names: dict[str, str]) -> str:
        """`node`'s text with every identifier in `names` replaced (a whole-token rename)."""
        repl = {
            (n.start_byte, n.end_byte): names[self.text(n)]
            for n in walk(node)
            if n.type == "identifier" and self.text(n) in names and not _is_member(n)
        }
        return self.render(node, repl)

    def indent_of(self, node: Node) -> str:
        line = self.source.text.splitlines()[node.start_point[0]] if self.source.text else ""
        return line[: len(line) - len(line.lstrip())]

    # ---- structure ----------------------------------------------------------------------------

    def _function_node(self) -> Node:
        found = self.source.definition(self.kernel)
        if found is not None:
            return found
        start = self.kernel.body_span.start
        for n in walk(self.source.tree.root_node):
            if n.type == "function_definition":
                body = n.child_by_field_name("body")
                if body is not None and self.source._offset(body.start_byte) == start:
                    return n
        raise ValueError(f"no definition found for kernel {self.kernel.name}")

    def _outer_node(self) -> Node:
        """The node the kernel's span covers: `template <...>` or `extern "C"` included."""
        node = self.fn
        while (
            node.parent is not None
            and self.source._offset(node.parent.start_byte) >= self.kernel.span.start
            and node.parent.type != "translation_unit"
        ):
            node = node.parent
        return node

    def definition(self, replace: dict[tuple[int, int], str] | None = None) -> str:
        """The kernel's whole definition (its span) with byte ranges replaced."""
        return self.render(self.outer, replace or {})

    def statements(self, block: Node | None = None) -> list[Node]:
        """The statements of a compound statement (the body by default), comments left out."""
        block = block if block is not None else self.body
        if block.type != "compound_statement":
            return [block]
        return [c for c in block.named_children if c.type != "comment"]

    def identifiers(self, node: Node) -> set[str]:
        return {self.text(n) for n in walk(node) if n.type == "identifier" and not _is_member(n)}

    def uses(self, node: Node, name: str) -> list[Node]:
        return [
            n
            for n in walk(node)
            if n.type == "identifier" and self.text(n) == name and not _is_member(n)
        ]

    def calls(self, node: Node) -> list[tuple[str, Node]]:
        out = []
        for n in walk(node):
            if n.type == "call_expression":
                f = n.child_by_field_name("function")
                if f is not None:
                    out.append((self.text(f), n))
        return out

    def int_literals(self, node: Node | None = None) -> list[int]:
        """The integer literals under `node` (the whole definition by default), as values."""
        found = []
        for n in walk(node if node is not None else self.outer):
            if n.type == "number_literal" and (v := _int_literal(self.text(n))) is not None:
                found.append(v)
        return found

    def has(self, node: Node, *types: str) -> bool:
        return any(n.type in types for n in walk(node))

    def uses_builtin(self, node: Node, builtin: str, dims: tuple[str, ...] = BUILTIN_DIMS) -> bool:
        """Whether `node` reads `builtin.d` (threadIdx, blockIdx, blockDim, gridDim) for d in dims."""
        for n in walk(node):
            if n.type == "field_expression":
                arg, fld = n.child_by_field_name("argument"), n.child_by_field_name("field")
                if (
                    arg is not None
                    and fld is not None
                    and self.text(arg) == builtin
                    and self.text(fld) in dims
                ):
                    return True
        return False

    def shared_declarations(self) -> list[Node]:
        return [
            n
            for n in walk(self.body)
            if n.type == "declaration" and "__shared__" in self.text(n).split("[")[0]
        ]

    def local_declarations(self, node: Node) -> dict[str, Node]:
        """Names declared anywhere under `node` -> their declaration."""
        out = {}
        for n in walk(node):
            if n.type in ("declaration", "for_statement"):
                for d in n.children_by_field_name("declarator"):
                    name = _declared_name(self, d)
                    if name:
                        out[name] = n
        return out

    def assigned(self, node: Node) -> set[str]:
        """Plain variables assigned or incremented under `node` (not subscripts)."""
        out = set()
        for n in walk(node):
            if n.type == "assignment_expression":
                left = unparen(n.child_by_field_name("left"))
                if left.type == "identifier":
                    out.add(self.text(left))
            elif n.type == "update_expression":
                arg = unparen(n.child_by_field_name("argument"))
                if arg.type == "identifier":
                    out.add(self.text(arg))
        return out

    # ---- pointers and accesses ----------------------------------------------------------------

    def _aliases(self) -> dict[str, tuple[str, str]]:
        """Local pointers defined as a parameter plus an offset: `const float* x = in + row * n;`."""
        out: dict[str, tuple[str, str]] = {}
        for n in walk(self.body):
            if n.type != "declaration":
                continue
            for d in n.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                target = d.child_by_field_name("declarator")
                value = d.child_by_field_name("value")
                if target is None or value is None or target.type != "pointer_declarator":
                    continue
                name = _declared_name(self, target)
                value = unparen(value)
                if value.type == "identifier" and self.text(value) in self.pointers:
                    out[name] = (self.text(value), "0")
                elif value.type == "binary_expression" and operator_of(value) == "+":
                    left = unparen(value.child_by_field_name("left"))
                    right = value.child_by_field_name("right")
                    if left.type == "identifier" and self.text(left) in self.pointers:
                        out[name] = (self.text(left), self.text(right))
        return out

    @cached_property
    def volatile_memory(self) -> frozenset[str]:
        """The pointer parameters whose memory the kernel reaches as `volatile`: declared so, or
        read through a local volatile pointer or a cast to one (`const volatile int* flag =
        ready + i;`) that the parameter initializes. Volatile pointers into shared memory are not
        among them."""
        out = {p.name for p in self.kernel.params if p.volatile_pointee}
        for n in walk(self.body):
            if n.type not in ("declaration", "cast_expression"):
                continue
            qualified = n if n.type == "declaration" else n.child_by_field_name("type")
            if qualified is None or not any(
                c.type == "type_qualifier" and self.text(c) == "volatile"
                for c in qualified.named_children
            ):
                continue
            if n.type == "declaration":
                values = [
                    d.child_by_field_name("value")
                    for d in n.children_by_field_name("declarator")
                    if d.type == "init_declarator"
                    and d.child_by_field_name("declarator").type == "pointer_declarator"
                ]
            else:
                values = [n.child_by_field_name("value")]
            for v in values:
                if v is not None:
                    out |= self.identifiers(v) & self.pointers
        return frozenset(out)

    def pointer_of(self, name: str) -> tuple[str, str | None] | None:
        """The parameter a pointer name stands for, and the alias offset (None for the parameter)."""
        if name in self.pointers:
            return name, None
        if name in self.aliases:
            return self.aliases[name]
        return None

    def accesses(self, node: Node | None = None) -> list[Access]:
        node = node if node is not None else self.body
        out = []
        for n in walk(node):
            if n.type != "subscript_expression":
                continue
            arr = unparen(n.child_by_field_name("argument"))
            if arr.type != "identifier":
                continue
            found = self.pointer_of(self.text(arr))
            if found is None:
                continue
            args = n.child_by_field_name("indices")
            index = args.named_children[0] if args is not None and args.named_children else None
            if index is None:
                continue
            read, write, atomic = _access_kind(self, n)
            out.append(Access(found[0], n, index, found[1], read, write, atomic))
        return out

    def dereferences(self, node: Node | None = None) -> list[Node]:
        """`*p` and `p->f` uses of pointer parameters or aliases (not subscripts)."""
        node = node if node is not None else self.body
        out = []
        for n in walk(node):
            if n.type == "pointer_expression" and operator_of(n) == "*":
                arg = unparen(n.child_by_field_name("argument"))
                if arg.type == "identifier" and self.pointer_of(self.text(arg)):
                    out.append(n)
        return out

    def pointer_escapes(self, node: Node | None = None) -> list[Node]:
        """Uses of a pointer parameter other than subscripting it or offsetting it into an alias:
        passed to a function, stored, compared, offset inline (`(p + 4)[i]`)."""
        node = node if node is not None else self.body
        alias_decls = set()
        for n in walk(self.body):
            if n.type == "init_declarator":
                target = n.child_by_field_name("declarator")
                if target is not None and _declared_name(self, target) in self.aliases:
                    alias_decls.add(n.id)
        out = []
        for n in walk(node):
            if n.type != "identifier" or _is_member(n):
                continue
            name = self.text(n)
            if self.pointer_of(name) is None:
                continue
            parent = n.parent
            if (
                parent.type == "subscript_expression"
                and parent.child_by_field_name("argument") == n
            ):
                continue
            anc = parent
            inside_alias = False
            while anc is not None and anc != self.body:
                if anc.type == "init_declarator" and anc.id in alias_decls:
                    inside_alias = True
                    break
                anc = anc.parent
            if inside_alias:
                continue
            if parent.type in ("pointer_declarator", "init_declarator") and name in self.aliases:
                continue
            out.append(n)
        return out

    # ---- thread indices and guards ------------------------------------------------------------

    def thread_indices(self) -> dict[str, ThreadIndex]:
        """Variables declared as a global thread index in one dimension, at the top of the body."""
        out: dict[str, ThreadIndex] = {}
        for st in self.statements():
            if st.type != "declaration":
                continue
            for d in st.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                name = _declared_name(self, d.child_by_field_name("declarator"))
                value = d.child_by_field_name("value")
                if not name or value is None:
                    continue
                found = self.global_index_of(value)
                if found is not None:
                    dim, block = found
                    out[name] = ThreadIndex(name, dim, block, st)
        return out

    def global_index_of(self, expr: Node) -> tuple[str, str] | None:
        """(dim, block text) if `expr` is blockIdx.D * B + threadIdx.D (any order)."""
        form = self.affine(expr)
        if form is None:
            return None
        for dim in BUILTIN_DIMS:
            tid, bid = f"threadIdx.{dim}", f"blockIdx.{dim}"
            if form.get((tid,)) != 1:
                continue
            rest = {m: c for m, c in form.items() if m != (tid,)}
            if len(rest) != 1:
                continue
            ((mono, coef),) = rest.items()
            if bid not in mono:
                continue
            others = [a for a in mono if a != bid]
            if len(others) == 1 and coef == 1:
                return dim, others[0]
            if not others:
                return dim, str(coef)
        return None

    def guard(self, after: Node | None = None) -> Guard | None:
        """The bounds guard of the body: the first `if` after `after` (the statement that declares
        the index, say) that either encloses every later statement or returns early."""
        stmts = self.statements()
        start = stmts.index(after) + 1 if after is not None else 0
        for pos in range(start, len(stmts)):
            st = stmts[pos]
            if st.type != "if_statement":
                continue
            cond = unparen(st.child_by_field_name("condition").named_children[0])
            cons = st.child_by_field_name("consequence")
            alt = st.child_by_field_name("alternative")
            rest = stmts[pos + 1 :]
            if alt is None and _is_return(self, cons):
                text = f"!({self.text(cond)})"
                bounds, exact = self._bounds(cond, negated=True)
                return Guard(st, "return", cond, text, rest, bounds, exact)
            if alt is None and not rest:
                bounds, exact = self._bounds(cond, negated=False)
                return Guard(st, "if", cond, self.text(cond), self.statements(cons), bounds, exact)
            return None
        return None

    def _bounds(self, cond: Node, negated: bool) -> tuple[dict[str, str], bool]:
        """`v < e` conjuncts of the guard condition (for an early return: `v >= e` disjuncts)."""
        joiner = "||" if negated else "&&"
        parts: list[Node] = []
        stack = [unparen(cond)]
        while stack:
            n = stack.pop()
            if n.type == "binary_expression" and operator_of(n) == joiner:
                stack.append(unparen(n.child_by_field_name("right")))
                stack.append(unparen(n.child_by_field_name("left")))
            else:
                parts.append(n)
        bounds, exact = {}, True
        for p in parts:
            if p.type != "binary_expression":
                exact = False
                continue
            op = operator_of(p)
            left = unparen(p.child_by_field_name("left"))
            right = unparen(p.child_by_field_name("right"))
            want, flip = (">=", "<=") if negated else ("<", ">")
            if op == want and left.type == "identifier":
                bounds[self.text(left)] = self.text(right)
            elif op == flip and right.type == "identifier":
                bounds[self.text(right)] = self.text(left)
            else:
                exact = False
        return bounds, exact

    # ---- affine forms -------------------------------------------------------------------------

    def affine(self, node: Node, env: dict[str, Affine] | None = None) -> Affine | None:
        """The expression as a sum of integer multiples of products of atoms (identifiers, builtins
        like `blockIdx.x`), or None if it is not one (a division, a call, a float). Casts are seen
        through; `env` substitutes the affine forms of local variables."""
        node = unparen(node)
        t = node.type
        if t == "number_literal":
            value = _int_literal(self.text(node))
            return None if value is None else ({(): value} if value else {})
        if t == "identifier":
            name = self.text(node)
            if env is not None and name in env:
                return dict(env[name])
            return {(name,): 1}
        if t == "field_expression":
            return {(self.text(node).replace(" ", ""),): 1}
        if t == "cast_expression":
            return self.affine(node.child_by_field_name("value"), env)
        if t == "unary_expression" and operator_of(node) in ("-", "+"):
            inner = self.affine(node.child_by_field_name("argument"), env)
            if inner is None:
                return None
            return {m: -c for m, c in inner.items()} if operator_of(node) == "-" else inner
        if t == "binary_expression":
            op = operator_of(node)
            left = self.affine(node.child_by_field_name("left"), env)
            right = self.affine(node.child_by_field_name("right"), env)
            if left is None or right is None:
                return None
            if op in ("+", "-"):
                out = dict(left)
                sign = 1 if op == "+" else -1
                for m, c in right.items():
                    out[m] = out.get(m, 0) + sign * c
                return {m: c for m, c in out.items() if c}
            if op == "*":
                out: Affine = {}
                for m1, c1 in left.items():
                    for m2, c2 in right.items():
                        m = tuple(sorted(m1 + m2))
                        out[m] = out.get(m, 0) + c1 * c2
                return {m: c for m, c in out.items() if c}
            if op == "<<":
                shift = right.get(()) if set(right) <= {()} else None
                if shift is None:
                    return None
                return {m: c << shift for m, c in left.items()}
        return None

    def local_affine_env(self, upto: Node | None = None) -> dict[str, Affine]:
        """Affine forms of the body's top-level `int v = expr;` declarations before `upto`, in
        terms of parameters and builtins (thread indices stay atoms)."""
        env: dict[str, Affine] = {}
        indices = self.thread_indices()
        for st in self.statements():
            if upto is not None and st.start_byte >= upto.start_byte:
                break
            if st.type != "declaration":
                continue
            for d in st.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                name = _declared_name(self, d.child_by_field_name("declarator"))
                if not name or name in indices:
                    continue
                form = self.affine(d.child_by_field_name("value"), env)
                if form is not None:
                    env[name] = form
        return env


def address_of(ast: KernelAST, node: Node) -> tuple[str, Node | None] | None:
    """(parameter, element index) of an atomic's address: `p`, `&p[b]`, `p + b`, `b + p`."""
    node = unparen(node)
    if node.type == "identifier":
        found = ast.pointer_of(ast.text(node))
        if found is None or found[1] not in (None, "0"):
            return None
        return found[0], None
    if node.type == "pointer_expression" and operator_of(node) == "&":
        sub = unparen(node.child_by_field_name("argument"))
        if sub.type != "subscript_expression":
            return None
        arr = unparen(sub.child_by_field_name("argument"))
        found = ast.pointer_of(ast.text(arr)) if arr.type == "identifier" else None
        idx = sub.child_by_field_name("indices")
        if found is None or found[1] not in (None, "0") or idx is None:
            return None
        return found[0], idx.named_children[0]
    if node.type == "binary_expression" and operator_of(node) == "+":
        left = unparen(node.child_by_field_name("left"))
        right = unparen(node.child_by_field_name("right"))
        for ptr, off in ((left, right), (right, left)):
            if ptr.type == "identifier":
                found = ast.pointer_of(ast.text(ptr))
                if found is not None and found[1] in (None, "0"):
                    return found[0], off
    return None


# ---- small helpers ------------------------------------------------------------------------------


def operator_of(node: Node) -> str:
    """The operator of a unary, binary, update or assignment expression: `+`, `&&`, `+=`, `++`."""
    op = node.child_by_field_name("operator")
    if op is not None:
        return op.type
    for c in node.children:
        if not c.is_named:
            return c.type
    return ""


def _is_member(ident: Node) -> bool:
    """`x` in `a.x` is a field, not a variable (tree-sitter gives fields their own type, but a
    qualified name's scope is an identifier too: `std::x`)."""
    parent = ident.parent
    return (
        parent is not None
        and parent.type in ("qualified_identifier",)
        and parent.child_by_field_name("name") == ident
    )


def _declared_name(ast: KernelAST, declarator: Node | None) -> str | None:
    d = declarator
    while d is not None and d.type != "identifier":
        if d.type in (
            "init_declarator",
            "pointer_declarator",
            "array_declarator",
            "reference_declarator",
        ):
            d = d.child_by_field_name("declarator")
        else:
            return None
    return ast.text(d) if d is not None else None


def _int_literal(text: str) -> int | None:
    t = text.rstrip("uUlL")
    try:
        return int(t, 0)
    except ValueError:
        return None


def _is_return(ast: KernelAST, node: Node) -> bool:
    if node.type == "return_statement":
        return True
    if node.type == "compound_statement":
        inner = [c for c in node.named_children if c.type != "comment"]
        return len(inner) == 1 and inner[0].type == "return_statement"
    return False


def _access_kind(ast: KernelAST, sub: Node) -> tuple[bool, bool, bool]:
    """(read, write, atomic) for a subscript expression, from where it stands."""
    node, parent = sub, sub.parent
    while parent is not None and parent.type == "parenthesized_expression":
        node, parent = parent, parent.parent
    if parent is None:
        return True, False, False
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == node:
        op = operator_of(parent)
        return op != "=", True, False
    if parent.type == "update_expression":
        return True, True, False
    if parent.type == "pointer_expression" and operator_of(parent) == "&":
        call = parent.parent
        while call is not None and call.type == "argument_list":
            call = call.parent
        if call is not None and call.type == "call_expression":
            f = call.child_by_field_name("function")
            args = call.child_by_field_name("arguments")
            if (
                f is not None
                and ast.text(f) in ATOMIC_FUNCTIONS
                and args is not None
                and args.named_children
                and args.named_children[0] == parent
            ):
                return True, True, True
        return True, True, False  # an address taken: assume the worst
    return True, False, False


_WORD = re.compile(r"[A-Za-z_]\w*")


def words(text: str) -> set[str]:
    """The identifiers in a piece of text (for expressions that are text, not nodes)."""
    return set(_WORD.findall(text))
