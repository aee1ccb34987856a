"""Row coarsening of 2-D kernels: each thread computes R consecutive rows (y values) of its column
instead of one. Strips fully inside the array run an unrolled loop with no per-row bounds check and
`__restrict__` pointers, so the loads of all R rows are in flight together before the first store."""

from __future__ import annotations

from tree_sitter import Node

from optiml.cuda.kernel_ast import walk
from optiml.search.catalog._two_d import (
    Grid2D,
    emit,
    fresh,
    grid_2d,
    indent_unit,
    on_blocks,
    paren,
    restrict_params,
    thread_independent,
    with_body,
)
from optiml.search.catalog.base import MEMORY, Context, Rewrite, Transformation

# (R, block, weight). A warp spans one row segment of 32 x 4 B = one 128 B line in every shape;
# R = 4 keeps 4 loads per thread in flight, which a DRAM-bound kernel of one load per element needs
# to cover the memory latency, at a register cost that keeps full occupancy.
CHOICES = (
    (4, (32, 8), 1.0),
    (2, (32, 8), 0.7),
    (8, (32, 8), 0.7),
    (4, (64, 4), 0.6),
    (4, (128, 2), 0.5),
    (8, (64, 4), 0.4),
)
LOOPS = ("for_statement", "while_statement", "do_statement", "for_range_loop")


class CoarsenRows(Transformation):
    name = "coarsen_rows"
    addresses = MEMORY | frozenset({"latency"})
    description = "each thread computes R consecutive rows, unrolled, loads of all rows in flight"

    def propose(self, ctx: Context) -> list[Rewrite]:
        g = grid_2d(ctx)
        if g is None or not thread_independent(g.ast) or not _rows_independent(g):
            return []
        returns = _returns(g)
        if returns is None:
            return []
        out = []
        for rows, (bx, by), weight in CHOICES:
            variant = on_blocks(ctx, g, _definition(g, rows, returns), (bx, by), (bx, by * rows))
            if variant is None:
                continue
            out.append(
                Rewrite(
                    params={"rows": rows, "block": (bx, by)},
                    summary=(
                        f"{rows} rows per thread, unrolled with __restrict__ so their loads overlap, "
                        f"block ({bx}, {by})"
                    ),
                    variant=variant,
                    weight=weight,
                )
            )
        return out


def _rows_independent(g: Grid2D) -> bool:
    """Rows of one column run in sequence in one thread instead of side by side: only safe if no
    row reads what another row writes. Every pointer that is written must be read and written at
    one element, the same in every access, and that element must move with both x and y (so two
    threads never share it)."""
    accesses = g.ast.accesses()
    written = {a.pointer for a in accesses if a.write}
    for p in written:
        forms = []
        for a in accesses:
            if a.pointer != p:
                continue
            form = g.form(a)
            if form is None:
                return False
            forms.append(form)
        if any(f != forms[0] for f in forms):
            return False
        parts = g.split(forms[0])
        if parts is None or not parts[0] or not parts[1]:
            return False
    return True


def _returns(g: Grid2D) -> list[Node] | None:
    """The `return` statements of the guarded code, which become `continue` (to the next row);
    None if one sits inside a loop of the body, where `continue` would mean something else."""
    out = []
    for st in g.statements:
        for n in walk(st):
            if n.type != "return_statement":
                continue
            parent = n.parent
            while parent is not None and parent not in g.statements:
                if parent.type in LOOPS:
                    return None
                parent = parent.parent
            out.append(n)
    return out


def _definition(g: Grid2D, rows: int, returns: list[Node]) -> str:
    ast = g.ast
    i1 = indent_unit(ast)
    i2, i3, i4 = i1 * 2, i1 * 3, i1 * 4
    first = fresh(ast, f"{g.y.var}0")
    r = fresh(ast, "r", {first})
    to_next = {(n.start_byte, n.end_byte): "continue;" for n in returns}
    row = f"{i3}{g.y.prefix} {g.y.var} = {first} + {r};"
    lines = [
        f"{i1}{g.x.prefix} {g.x.var} = blockIdx.x * blockDim.x + threadIdx.x;",
        f"{i1}// This thread's rows: {first}, {first} + 1, ..., {first} + {rows - 1}.",
        f"{i1}const {g.y.type} {first} = (blockIdx.y * blockDim.y + threadIdx.y) * {rows};",
        f"{i1}if ({g.x.var} >= {paren(g.x.bound)})",
        f"{i2}return;",
        f"{i1}if ({first} + {rows} <= {paren(g.y.bound)}) {{",
        f"{i2}// Every row is inside: with no bounds check between them, the loads of all rows",
        f"{i2}// can be issued before the first store.",
        f"{i2}#pragma unroll",
        f"{i2}for (int {r} = 0; {r} < {rows}; ++{r}) {{",
        row,
        *emit(ast, g.statements, i3, to_next),
        f"{i2}}}",
        f"{i1}}} else {{",
        f"{i2}#pragma unroll",
        f"{i2}for (int {r} = 0; {r} < {rows}; ++{r}) {{",
        row,
        *emit(ast, g.prologue, i3, to_next),
        f"{i3}if ({g.y.var} < {paren(g.y.bound)}) {{",
        *emit(ast, g.body, i4, to_next),
        f"{i3}}}",
        f"{i2}}}",
        f"{i1}}}",
    ]
    return with_body(ast, lines, restrict_params(ast))
