"""What the 2-D transformations (tile_transpose, coarsen_rows, flatten_2d, smem_padding) read off a
kernel: its (x, y) thread grid with the guard that bounds it, affine forms of its accesses split into
strides along x and y, compile-time constants, and the text builders their rewrites share.

Every query answers None where the code is not in the shape it understands; callers then propose
nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import Access, Affine, KernelAST, unparen, walk, words
from optiml.expr import Expr, ExprError
from optiml.search.catalog.base import Context
from optiml.search.variant import Variant

BUILTINS = ("threadIdx", "blockIdx", "blockDim", "gridDim")
# Calls whose result depends on which threads run together: a rewrite that moves work between
# threads changes what they see.
WARP_CALLS = re.compile(
    r"^(__syncthreads\w*|__syncwarp|__shfl\w*|__ballot\w*|__any\w*|__all\w*|__activemask"
    r"|__match\w*|__reduce\w*|__threadfence\w*|atomic\w+|this_thread_block|tiled_partition"
    r"|(\w+::)+\w+)$"
)
QUALIFIERS = ("const", "volatile", "register", "static")


@dataclass(frozen=True)
class Axis:
    """One thread index of the grid: `int col = blockIdx.x * blockDim.x + threadIdx.x;`."""

    var: str
    dim: str  # "x" or "y"
    bound: str  # what the guard keeps it below, as written in the kernel
    prefix: str  # the declaration's type as written: "int", "const size_t"

    @property
    def type(self) -> str:
        """The type without qualifiers, for new variables of the same kind."""
        return " ".join(w for w in self.prefix.split() if w not in QUALIFIERS) or "int"


@dataclass
class Grid2D:
    """A kernel of the shape `x, y = thread indices; locals; if (x < X && y < Y) { body }` (or the
    same with an early return), where nothing but the two index declarations reads the builtins."""

    ctx: Context
    ast: KernelAST
    x: Axis
    y: Axis
    prologue: list[Node]  # declarations between the index declarations and the guard
    body: list[Node]  # the statements the guard lets run
    env: dict[str, Affine]  # affine forms of single-assignment integer locals (x and y stay atoms)
    local_names: set[str]  # every name declared in the body
    guard_order: tuple[str, str]  # the index variables in the order the guard tests them

    @property
    def guard(self) -> str:
        """The guard's condition, `x < X && y < Y`, in the original's order."""
        axes = {self.x.var: self.x, self.y.var: self.y}
        return " && ".join(f"{v} < {paren(axes[v].bound)}" for v in self.guard_order)

    @property
    def statements(self) -> list[Node]:
        return self.prologue + self.body

    def form(self, access: Access) -> Affine | None:
        """The affine form of the element an access touches, alias offset included."""
        form = self.ast.affine(access.index, self.env)
        if form is None or access.offset is None:
            return form
        offsets = alias_offsets(self.ast)
        name = _alias_name(self.ast, access)
        if name not in offsets:
            return None
        if offsets[name] is None:
            return form
        extra = self.ast.affine(offsets[name], self.env)
        return None if extra is None else add(form, extra)

    def split(self, form: Affine) -> tuple[Affine, Affine, Affine] | None:
        """(stride along x, stride along y, rest) of a form, each free of x and y; None if x and y
        meet in one monomial, appear squared, or the rest names a variable that may differ between
        threads."""
        sx: Affine = {}
        sy: Affine = {}
        rest: Affine = {}
        for mono, coef in form.items():
            nx, ny = mono.count(self.x.var), mono.count(self.y.var)
            if nx + ny > 1:
                return None
            others = tuple(a for a in mono if a not in (self.x.var, self.y.var))
            if not all(self.is_uniform(a) for a in others):
                return None
            target = sx if nx else sy if ny else rest
            target[others] = target.get(others, 0) + coef
        return sx, sy, rest

    def is_uniform(self, atom: str) -> bool:
        """An atom that is the same in every thread: a scalar parameter or a name declared outside
        the kernel (a macro, a constant, a template parameter)."""
        if atom in self.ast.params:
            return not self.ast.params[atom].is_pointer
        return atom.isidentifier() and atom not in self.local_names


def grid_2d(ctx: Context) -> Grid2D | None:
    """The kernel's (x, y) grid, or None if it is not a guarded 2-D kernel this module can prove
    things about: launched as a 2-D grid that covers the guard's bounds on every size of the spec."""
    try:
        return _grid_2d(ctx)
    except (ValueError, ExprError, KeyError, AttributeError, TypeError):
        return None


def _grid_2d(ctx: Context) -> Grid2D | None:
    ast = ctx.ast
    indices = ast.thread_indices()
    by_dim = {}
    for ti in indices.values():
        if ti.dim in by_dim or ti.dim == "z":
            return None
        by_dim[ti.dim] = ti
    if set(by_dim) != {"x", "y"}:
        return None
    stmts = ast.statements()
    decls = [by_dim["x"].decl, by_dim["y"].decl]
    for decl in decls:
        names = [declared_name(ast, d) for d in decl.children_by_field_name("declarator")]
        if any(n not in indices for n in names):
            return None
    last = max(decls, key=lambda d: d.start_byte)
    guard = ast.guard(last)
    if guard is None or not guard.exact:
        return None
    xv, yv = by_dim["x"].var, by_dim["y"].var
    # `bounds` keeps one bound per variable: a third test (`x < cols && x < limit`) would be lost.
    joiner = "||" if guard.style == "return" else "&&"
    if set(guard.bounds) != {xv, yv} or len(_terms(ast, guard.condition, joiner)) != 2:
        return None
    prologue = [s for s in stmts[: stmts.index(guard.node)] if s not in decls]
    if any(s.type != "declaration" for s in prologue):
        return None
    if any(_writes(ast, s) for s in prologue):
        return None
    body = guard.body
    for st in prologue + body + [guard.condition]:
        if any(ast.uses_builtin(st, b) for b in BUILTINS):
            return None
    for var in (xv, yv):
        if var in ast.assigned(ast.body) or _declarations_of(ast, var) != 1:
            return None
    if not _covers(ctx, by_dim, guard.bounds):
        return None
    axes = {
        d: Axis(ti.var, d, guard.bounds[ti.var], _prefix(ast, ti.decl)) for d, ti in by_dim.items()
    }
    env = affine_env(ast, prologue + body, keep={xv, yv})
    local_names = set(ast.local_declarations(ast.body))
    order = tuple(guard.bounds)
    return Grid2D(ctx, ast, axes["x"], axes["y"], prologue, body, env, local_names, order)


def _terms(ast: KernelAST, cond: Node, joiner: str) -> list[Node]:
    """The operands of a chain of `joiner` (`&&` or `||`)."""
    cond = unparen(cond)
    if cond.type == "binary_expression":
        op = cond.child_by_field_name("operator")
        if op is not None and op.type == joiner:
            left = _terms(ast, cond.child_by_field_name("left"), joiner)
            return left + _terms(ast, cond.child_by_field_name("right"), joiner)
    return [cond]


def _covers(ctx: Context, by_dim: dict, bounds: dict[str, str]) -> bool:
    """Whether the spec's launch runs a thread for every (x, y) under the guard's bounds, with the
    block the index expressions assume, on every size: then the kernel's work is exactly the
    guarded rectangle, whatever launch a rewrite picks for it."""
    launch = ctx.spec.launch
    known = constants(ctx)
    if len(launch.grid) > 3 or len(launch.block) > 3:
        return False
    for case in ctx.spec.cases():
        if case.grid[2] != 1 or case.block[2] != 1:
            return False
        for i, d in enumerate(("x", "y")):
            ti = by_dim[d]
            if (
                ti.block != f"blockDim.{d}"
                and known.get(ti.block, int_literal(ti.block)) != case.block[i]
            ):
                return False
            bound = spec_value(ctx, bounds[ti.var], case)
            if bound is None or case.grid[i] * case.block[i] < bound:
                return False
    return True


# ---- spec expressions ---------------------------------------------------------------------------


def spec_value(ctx: Context, text: str, case) -> int | None:
    """`text` (a kernel expression over scalar parameters) evaluated at one size of the spec, or
    None if it is not an expression the spec language can write."""
    names = words(text)
    scalars = {p.name for p in ctx.kernel.params if not p.is_pointer}
    known = scalars | set(ctx.spec.template_values) | set(ctx.spec.constants)
    if not names <= known:
        return None
    env = ctx.env(case)
    try:
        value = Expr.parse(text).evaluate(env)
    except (ExprError, KeyError, ZeroDivisionError):
        return None
    return value if isinstance(value, int) else None


def spec_expr(ctx: Context, text: str) -> str | None:
    """`text` as a spec launch expression, if it evaluates on every size of the spec."""
    if all(spec_value(ctx, text, case) is not None for case in ctx.spec.cases()):
        return text.strip()
    return None


def on_blocks(
    ctx: Context, g: Grid2D, definition: str, block: tuple[int, int], covers: tuple[int, int]
) -> Variant | None:
    """`definition` in place of the kernel, launched on blocks of `block` threads that each cover
    `covers` (columns, rows) of the guarded rectangle; None where the kernel's `__launch_bounds__`
    forbid such a block or the launch does not evaluate on every size."""
    gx, gy = spec_expr(ctx, g.x.bound), spec_expr(ctx, g.y.bound)
    if gx is None or gy is None or not launch_bounds_fit(g.ast, block[0] * block[1]):
        return None
    _, _, smem = ctx.launch
    variant = ctx.rewrite(
        definition,
        launch=(
            [f"cdiv({gx}, {covers[0]})", f"cdiv({gy}, {covers[1]})"],
            [str(block[0]), str(block[1])],
            smem,
        ),
    )
    return variant if launch_ok(ctx, variant) else None


def launch_ok(ctx: Context, variant: Variant) -> bool:
    """Whether the variant's spec still parses and its launch evaluates on every size."""
    try:
        Context.of(variant, ctx.source.path, ctx.kernel.name).spec.cases()
    except Exception:  # noqa: BLE001 - any failure means the proposal is not made
        return False
    return True


# ---- affine forms -------------------------------------------------------------------------------


def add(a: Affine, b: Affine) -> Affine:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + c
    return {m: c for m, c in out.items() if c}


def is_one(form: Affine) -> bool:
    return form == {(): 1}


def is_constant(form: Affine) -> bool:
    return set(form) <= {()}


def affine_env(ast: KernelAST, nodes: list[Node], keep: set[str]) -> dict[str, Affine]:
    """Affine forms of the integer locals declared once under `nodes` and never assigned, in terms
    of parameters, builtins and the names in `keep` (which stay atoms)."""
    assigned = ast.assigned(ast.body)
    env: dict[str, Affine] = {}
    for node in nodes:
        for n in walk(node):
            if n.type != "declaration":
                continue
            for d in n.children_by_field_name("declarator"):
                if d.type != "init_declarator":
                    continue
                target = d.child_by_field_name("declarator")
                name = declared_name(ast, target)
                if (
                    not name
                    or target.type != "identifier"
                    or name in keep
                    or name in assigned
                    or _declarations_of(ast, name) != 1
                ):
                    continue
                form = ast.affine(d.child_by_field_name("value"), env)
                if form is not None:
                    env[name] = form
    return env


def alias_offsets(ast: KernelAST) -> dict[str, Node | None]:
    """The offset expression of every local pointer alias declared once, `T* p = param + offset;`
    (None for `T* p = param;`)."""
    out: dict[str, Node | None] = {}
    for n in walk(ast.body):
        if n.type != "init_declarator":
            continue
        name = declared_name(ast, n.child_by_field_name("declarator"))
        if name not in ast.aliases or _declarations_of(ast, name) != 1:
            continue
        value = n.child_by_field_name("value")
        while value.type == "parenthesized_expression":
            value = value.named_children[0]
        out[name] = (
            value.child_by_field_name("right") if value.type == "binary_expression" else None
        )
    return out


def _alias_name(ast: KernelAST, access: Access) -> str:
    arr = access.node.child_by_field_name("argument")
    while arr.type == "parenthesized_expression":
        arr = arr.named_children[0]
    return ast.text(arr)


# ---- shifted grids -----------------------------------------------------------------------------

# How far from (x, y) a stencil's reads may reach and still count as its neighbours.
MAX_RADIUS = 4


def grid_offsets(
    g: Grid2D, accesses: list[Access]
) -> tuple[Affine, Affine, list[tuple[Access, int, int]]] | None:
    """(pitch, base, [(access, dx, dy)]) if every access is element (x + dx, y + dy) of one
    `pitch`-wide grid starting at `base`, with unit stride along x and |dx|, |dy| <= MAX_RADIUS."""
    pitch = base = None
    reads = []
    for a in accesses:
        form = g.form(a)
        parts = g.split(form) if form is not None else None
        if parts is None:
            return None
        sx, sy, rest = parts
        if sx != {(): 1} or not sy or (pitch is not None and sy != pitch):
            return None
        pitch = sy
        found = shift(rest, sy)
        if found is None:
            return None
        dx, dy, b = found
        if base is not None and b != base:
            return None
        base = b
        if max(abs(dx), abs(dy)) > MAX_RADIUS:
            return None
        reads.append((a, dx, dy))
    return pitch, base, reads


def shift(rest: Affine, pitch: Affine) -> tuple[int, int, Affine] | None:
    """rest = dy * pitch + dx + base, with dx and dy small constants and base free of constants."""
    if is_constant(pitch):
        p = pitch.get((), 0)
        if p <= 2 * MAX_RADIUS:
            return None
        c = rest.get((), 0)
        dy = round(c / p)
        base = {m: v for m, v in rest.items() if m != ()}
        return c - dy * p, dy, base
    monos = [m for m in pitch if m != ()]
    first = monos[0]
    if rest.get(first, 0) % pitch[first]:
        return None
    dy = rest.get(first, 0) // pitch[first]
    left = add(rest, {m: -dy * v for m, v in pitch.items()})
    if any(left.get(m, 0) for m in monos):
        return None
    dx = left.get((), 0)
    return dx, dy, {m: v for m, v in left.items() if m != ()}


# ---- safety checks ------------------------------------------------------------------------------


def _writes(ast: KernelAST, node: Node) -> bool:
    return any(a.write for a in ast.accesses(node)) or bool(ast.assigned(node))


def _declarations_of(ast: KernelAST, name: str) -> int:
    count = 0
    for n in walk(ast.body):
        if n.type in ("declaration", "for_statement", "parameter_declaration"):
            for d in n.children_by_field_name("declarator"):
                if declared_name(ast, d) == name:
                    count += 1
    return count + (1 if name in ast.params else 0)


def thread_independent(ast: KernelAST) -> bool:
    """No shared memory, barriers, atomics, warp intrinsics, inline assembly, goto, or pointer
    escapes, in the kernel or in a function of the file it calls: each thread's work depends on
    its own indices only, so it may move to another thread."""
    if ast.shared_declarations() or ast.pointer_escapes() or ast.dereferences():
        return False
    if any(a.atomic for a in ast.accesses()):
        return False
    return _thread_free(ast, ast.body, set())


def _thread_free(ast: KernelAST, body: Node, seen: set[str]) -> bool:
    if ast.has(body, "goto_statement", "gnu_asm_expression", "asm_statement"):
        return False
    for name, _ in ast.calls(body):
        if WARP_CALLS.match(name):
            return False
        if name in seen:
            continue
        seen.add(name)
        for helper in _definitions(ast, name):
            text = ast.text(helper)
            if "__shared__" in text or any(ast.uses_builtin(helper, b) for b in BUILTINS):
                return False
            if not _thread_free(ast, helper, seen):
                return False
    return True


def _definitions(ast: KernelAST, name: str) -> list[Node]:
    """The bodies of the functions of the file called `name`."""
    out = []
    for n in walk(ast.source.tree.root_node):
        if n.type != "function_definition":
            continue
        d = n.child_by_field_name("declarator")
        while d is not None and d.type != "function_declarator":
            d = d.child_by_field_name("declarator")
        f = d.child_by_field_name("declarator") if d is not None else None
        if f is not None and ast.text(f).split("::")[-1] == name.split("::")[-1]:
            out.append(n.child_by_field_name("body"))
    return [b for b in out if b is not None]


def restrict_params(ast: KernelAST) -> dict[tuple[int, int], str]:
    """Replacements that put `__restrict__` on every pointer parameter without it: safe under the
    kernel contract, where every buffer is its own allocation."""
    decl = ast.fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    if decl is None:
        return {}
    out = {}
    for node in decl.child_by_field_name("parameters").named_children:
        if node.type != "parameter_declaration":
            continue
        name = declared_name(ast, node.child_by_field_name("declarator"))
        p = ast.params.get(name)
        if p is None or p.pointer_depth != 1 or p.restrict:
            continue
        const = "const " if p.const_pointee else ""
        out[(node.start_byte, node.end_byte)] = f"{const}{p.type_text}* __restrict__ {p.name}"
    return out


# ---- constants ----------------------------------------------------------------------------------


def constants(ctx: Context) -> dict[str, int]:
    """Integer values known at compile time: `#define N 32`, file-scope `constexpr int N = 32;`,
    the spec's template values, and the kernel's own `constexpr`/`const int` locals."""
    out: dict[str, int] = dict(ctx.spec.template_values)
    root = ctx.source.tree.root_node
    for n in root.named_children:
        if n.type == "preproc_def":
            name, value = n.child_by_field_name("name"), n.child_by_field_name("value")
            if name is not None and value is not None:
                v = const_value(ctx.source.node_text(value), out)
                if v is not None:
                    out[ctx.source.node_text(name)] = v
        elif n.type == "declaration" and re.match(
            r"\s*(static\s+)?(constexpr|const)\b", ctx.source.node_text(n)
        ):
            _bind(ctx.source.node_text, n, out)
    for n in walk(ctx.ast.body):
        if n.type == "declaration" and re.match(r"\s*(constexpr|const)\b", ctx.ast.text(n)):
            _bind(ctx.ast.text, n, out)
    return out


def _bind(text, decl: Node, out: dict[str, int]) -> None:
    for d in decl.children_by_field_name("declarator"):
        if d.type != "init_declarator":
            continue
        name, value = d.child_by_field_name("declarator"), d.child_by_field_name("value")
        if name is not None and name.type == "identifier" and value is not None:
            v = const_value(text(value), out)
            if v is not None:
                out[text(name)] = v


def const_value(text: str, known: dict[str, int]) -> int | None:
    """An integer constant expression over known names, or None."""
    if not words(text) <= set(known):
        return None
    try:
        value = Expr.parse(text.strip()).evaluate(dict(known))
    except (ExprError, KeyError, ZeroDivisionError, SyntaxError):
        return None
    return value if isinstance(value, int) else None


# ---- text ---------------------------------------------------------------------------------------


def declared_name(ast: KernelAST, declarator: Node | None) -> str | None:
    """The name a declarator declares, through pointer, array, reference and init declarators."""
    d = declarator
    while d is not None and d.type != "identifier":
        if d.type not in (
            "init_declarator",
            "pointer_declarator",
            "array_declarator",
            "reference_declarator",
        ):
            return None
        d = d.child_by_field_name("declarator")
    return ast.text(d) if d is not None else None


def int_literal(text: str) -> int | None:
    try:
        return int(text.strip().rstrip("uUlL"), 0)
    except ValueError:
        return None


def _prefix(ast: KernelAST, decl: Node) -> str:
    """The type part of a declaration statement: `const int` of `const int x = ...;`."""
    first = decl.child_by_field_name("declarator")
    return ast.source._bytes[decl.start_byte : first.start_byte].decode().strip()


def paren(text: str) -> str:
    """`text` safe as an operand of `*`, `<` or `+`."""
    t = text.strip()
    return t if re.fullmatch(r"[A-Za-z_]\w*|\d+|\w+\.\w+", t) else f"({t})"


def fresh(ast: KernelAST, base: str, taken: set[str] = frozenset()) -> str:
    """A name that nothing in the file (macros included) or in `taken` uses."""
    used = words(ast.source.text) | set(taken)
    name, n = base, 1
    while name in used:
        name, n = f"{base}{n}", n + 1
    return name


def indent_unit(ast: KernelAST) -> str:
    stmts = ast.statements()
    unit = ast.indent_of(stmts[0]) if stmts else ""
    return unit if unit.strip() == "" and unit else "    "


def reindent(ast: KernelAST, node: Node, text: str, to: str) -> str:
    """A statement's (possibly replaced) text moved to indentation `to`: its continuation lines
    keep their depth relative to its first line."""
    old = ast.indent_of(node)
    lines = text.split("\n")
    out = [to + lines[0]]
    for line in lines[1:]:
        if line.startswith(old):
            out.append(to + line[len(old) :])
        else:
            out.append(to + line.lstrip() if line.strip() else "")
    return "\n".join(out)


def emit(
    ast: KernelAST,
    nodes: list[Node],
    to: str,
    replace: dict[tuple[int, int], str] | None = None,
) -> list[str]:
    """The statements, each rendered with the replacements that fall inside it, at indent `to`."""
    replace = replace or {}
    out = []
    for node in nodes:
        inside = {
            k: v for k, v in replace.items() if node.start_byte <= k[0] and k[1] <= node.end_byte
        }
        out.append(reindent(ast, node, ast.render(node, inside), to))
    return out


def declared_names(ast: KernelAST, node: Node) -> set[str]:
    return set(ast.local_declarations(node))


def closure(ast: KernelAST, stmts: list[Node], needed: set[str]) -> list[Node] | None:
    """The declarations among `stmts` that the names in `needed` depend on, in order; None if
    one of them is not a plain declaration."""
    keep = []
    need = set(needed)
    for st in reversed(stmts):
        declared = declared_names(ast, st)
        if declared & need:
            if st.type != "declaration":
                return None
            keep.append(st)
            need |= ast.identifiers(st)
    return list(reversed(keep))


def live(
    ast: KernelAST,
    stmts: list[Node],
    replace: dict[tuple[int, int], str],
    uses: str,
) -> list[Node]:
    """`stmts` without the declarations nothing after them reads once `replace` is applied (an
    index the rewrite no longer computes, an alias it no longer reads through), given the text
    `uses` that follows them. Declarations that call a function are kept."""
    needed = words(uses)
    kept = []
    for st in reversed(stmts):
        rendered = ast.render(st, _inside(replace, st))
        if (
            st.type == "declaration"
            and not declared_names(ast, st) & needed
            and not ast.calls(st)
            and not ast.assigned(st)
        ):
            continue
        kept.append(st)
        needed |= words(rendered)
    return list(reversed(kept))


def _inside(replace: dict[tuple[int, int], str], node: Node) -> dict[tuple[int, int], str]:
    return {k: v for k, v in replace.items() if node.start_byte <= k[0] and k[1] <= node.end_byte}


def with_body(
    ast: KernelAST, lines: list[str], extra: dict[tuple[int, int], str] | None = None
) -> str:
    """The kernel's definition with its body replaced by `lines` (and other ranges by `extra`)."""
    body = "{\n" + "\n".join(lines) + "\n}"
    replace = dict(extra or {})
    replace[(ast.body.start_byte, ast.body.end_byte)] = body
    return ast.definition(replace)


def launch_bounds_fit(ast: KernelAST, threads: int) -> bool:
    """A kernel declared with `__launch_bounds__(N)` can only run blocks of at most N threads."""
    for c in ast.fn.children:
        if c.type == "launch_bounds":
            nums = [n for n in c.named_children if n.type == "number_literal"]
            value = int_literal(ast.text(nums[0])) if nums else None
            return value is not None and threads <= value
    return True


def element_type(ctx: Context, type_text: str) -> str:
    """An element type as a kernel writes it, template parameters resolved, qualifiers dropped."""
    t = ctx.spec.template.get(type_text, type_text).strip()
    return " ".join(w for w in t.split() if w not in QUALIFIERS)


def element_bytes(ctx: Context, type_text: str) -> int | None:
    """The size of an element type as a kernel writes it (template parameters resolved)."""
    return _SIZES.get(element_type(ctx, type_text))


_SIZES = {
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "bool": 1,
    "short": 2,
    "unsigned short": 2,
    "int16_t": 2,
    "uint16_t": 2,
    "half": 2,
    "__half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "float": 4,
    "half2": 4,
    "__half2": 4,
    "long long": 8,
    "unsigned long long": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "size_t": 8,
    "double": 8,
    "float2": 8,
    "int2": 8,
    "float4": 16,
    "int4": 16,
    "uint4": 16,
    "double2": 16,
}
