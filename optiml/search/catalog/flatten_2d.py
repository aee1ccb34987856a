"""Flattening of 2-D elementwise kernels: when every global access is `p[row * cols + col]` (the
one linear index of a dense row-major array), the kernel becomes a 1-D kernel over rows * cols
elements, in which consecutive threads touch consecutive elements whatever the array's width, and to
which the 1-D transformations (vector loads, grid-stride loops) apply."""

from __future__ import annotations

from tree_sitter import Node

from optiml.cuda.kernel_ast import words
from optiml.search.catalog._two_d import (
    Axis,
    Grid2D,
    alias_offsets,
    declared_name,
    emit,
    fresh,
    grid_2d,
    indent_unit,
    launch_bounds_fit,
    launch_ok,
    live,
    paren,
    spec_expr,
    thread_independent,
    with_body,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation

BLOCK = 256
NARROW = frozenset({"int", "unsigned", "unsigned int"})


class Flatten2D(Transformation):
    name = "flatten_2d"
    addresses = frozenset({"dram", "uncoalesced", "latency"})
    description = "2-D elementwise kernel as a 1-D kernel over rows * cols elements"

    def propose(self, ctx: Context) -> list[Rewrite]:
        g = grid_2d(ctx)
        if g is None or not thread_independent(g.ast) or not launch_bounds_fit(g.ast, BLOCK):
            return []
        found = _linear(g)
        if found is None:
            return []
        major, minor, replace, drop, name, prefix = found
        total_spec = spec_expr(ctx, f"{paren(major.bound)} * {paren(minor.bound)}")
        if total_spec is None:
            return []
        _, _, smem = ctx.launch
        variant = ctx.rewrite(
            _definition(g, major, minor, replace, drop, name, prefix),
            launch=([f"cdiv({total_spec}, {BLOCK})"], [str(BLOCK)], smem),
        )
        if not launch_ok(ctx, variant):
            return []
        turned = "" if major is g.y else " (the 2-D grid ran x down the columns)"
        return [
            Rewrite(
                params={"block": BLOCK},
                summary=(
                    f"1-D grid over {major.bound} * {minor.bound} elements, block {BLOCK}: "
                    f"consecutive threads, consecutive elements{turned}"
                ),
                variant=variant,
            )
        ]


def _linear(g: Grid2D):
    """The axes (major, minor) of the one linear index every access uses, `major * minor_bound +
    minor`, with the replacements that make each access use a single linear variable: its index
    becomes the variable, and each alias `q = p + offset` becomes `q = p`. Also the declaration of
    a local that already holds the linear index (its name is reused, the declaration dropped), the
    variable's name and its type. None if some access is not of that form."""
    ast = g.ast
    accesses = ast.accesses()
    if not accesses:
        return None
    for major, minor in ((g.y, g.x), (g.x, g.y)):
        if not _is_name(minor.bound):
            continue
        linear = {tuple(sorted((major.var, minor.bound.strip()))): 1, (minor.var,): 1}
        if all(g.form(a) == linear for a in accesses):
            break
    else:
        return None
    holder = _holder(g, linear)
    if holder is None:
        name, prefix, drop = fresh(ast, "idx"), g.x.prefix, None
    else:
        name, prefix, drop = holder
    replace: dict[tuple[int, int], str] = {}
    offsets = alias_offsets(ast)
    for a in accesses:
        replace[(a.index.start_byte, a.index.end_byte)] = name
        if a.offset is None:
            continue
        alias = ast.text(a.node.child_by_field_name("argument")).strip("() ")
        offset = offsets.get(alias)
        if offset is None:
            continue
        value = offset.parent
        replace[(value.start_byte, value.end_byte)] = a.pointer
    if drop is not None and any(drop.start_byte <= s < drop.end_byte for s, _ in replace):
        return None
    return major, minor, replace, drop, name, prefix


def _holder(g: Grid2D, linear: dict) -> tuple[str, str, Node] | None:
    """A top-level local declared alone as the linear index (`int idx = row * cols + col;`)."""
    ast = g.ast
    for st in g.statements:
        if st.type != "declaration":
            continue
        decls = st.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            continue
        name = declared_name(ast, decls[0].child_by_field_name("declarator"))
        if name in g.env and g.env[name] == linear:
            prefix = ast.text(st)[: decls[0].start_byte - st.start_byte].strip()
            return name, prefix, st
    return None


def _is_name(text: str) -> bool:
    return text.strip().isidentifier()


def _definition(
    g: Grid2D,
    major: Axis,
    minor: Axis,
    replace: dict[tuple[int, int], str],
    drop: Node | None,
    name: str,
    prefix: str,
) -> str:
    ast = g.ast
    i1 = indent_unit(ast)
    i2 = i1 * 2
    kept = live(ast, [s for s in g.statements if s != drop], replace, "")
    body = emit(ast, kept, i2, replace)
    count = f"{paren(major.bound)} * {paren(minor.bound)}"
    if _type(prefix) not in NARROW:
        # A 64-bit index is there for arrays past 2^31 elements: count them in 64 bits too.
        count = f"static_cast<{_type(prefix)}>({major.bound}) * {paren(minor.bound)}"
    lines = [
        f"{i1}// One thread per element, in the order the array is laid out.",
        f"{i1}{prefix} {name} = blockIdx.x * blockDim.x + threadIdx.x;",
        f"{i1}if ({name} < {count}) {{",
    ]
    still = words("\n".join(body))
    if minor.var in still:
        lines.append(f"{i2}{minor.prefix} {minor.var} = {name} % {paren(minor.bound)};")
    if major.var in still:
        lines.append(f"{i2}{major.prefix} {major.var} = {name} / {paren(minor.bound)};")
    lines += body
    lines.append(f"{i1}}}")
    return with_body(ast, lines)


def _type(prefix: str) -> str:
    return " ".join(w for w in prefix.split() if w not in ("const", "volatile")) or "int"
