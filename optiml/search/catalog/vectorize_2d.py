"""Vectorized 2-D kernels: each thread computes 4 consecutive columns (x values) of R consecutive
rows instead of one element. Every row segment an input is read at goes through one 16-byte load,
kept in registers and shared by the 4 columns and, sliding down, by the R rows (a stencil's `u[idx -
cols]` of one row is the `u[idx + cols]` of the row two above); columns just outside the segment (a
stencil's left and right neighbours) are single loads; each output row of 4 is one 16-byte store.

The kernel's own statements run once per element, as written, with their loads replaced by the
registers: the arithmetic, and so every result, is the original's to the bit. Threads whose 4 x R
block, with every offset it reads, lies inside the guarded rectangle, and whose rows start on 16-byte
boundaries, take that path; the others (the borders, an odd pitch, an unaligned pointer) run the
original statements element by element.

Preconditions: a guarded 2-D grid of independent threads; every read and write of a buffer is its
element (x + dx, y + dy) of one grid with unit stride along x, dx and dy small constants (or, for a
buffer only read, an element the same in every thread, such as a filter's weights, left as
written); outputs are written at (x, y) only, exactly once on every path through the body (so 4 x R
results are always there to store), and never read; inputs are never written; elements of 4 bytes
(float, int, unsigned). Like tile_stencil, an element inside the guarded rectangle is taken to be addressable."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import Access, Affine, operator_of, walk, words
from optiml.search.catalog._gemm import render
from optiml.search.catalog._two_d import (
    Grid2D,
    element_type,
    emit,
    fresh,
    grid_2d,
    grid_offsets,
    indent_unit,
    live,
    on_blocks,
    paren,
    restrict_params,
    thread_independent,
    with_body,
)
from optiml.search.catalog.base import MEMORY, Context, Rewrite, Transformation

LANES = 4
# (R, block, weight), ranked by the Jacobi fixture's times on an H200 (8192^2, hand-written
# equivalents of these rewrites): R = 2 rows on (32, 8) 0.134 ms, R = 1 0.136 ms, R = 4 on (64, 4)
# 0.138 ms and on (32, 8) 0.139 ms; row coarsening without vectors took 0.156-0.167 ms.
CHOICES = (
    (2, (32, 8), 1.0),
    (1, (32, 8), 0.9),
    (4, (64, 4), 0.7),
    (4, (32, 8), 0.6),
)
VECTORS = {"float": "float4", "int": "int4", "unsigned": "uint4", "unsigned int": "uint4"}
FIELDS = ("x", "y", "z", "w")


@dataclass
class _Buffer:
    """A buffer the kernel reads or writes as elements (x + dx, y + dy) of one grid."""

    pointer: str
    elem: str  # the element type, template parameters resolved
    pitch: Affine  # elements between rows
    base: Affine  # the part of the index that is neither x, y nor an offset
    accesses: list[tuple[Access, int, int]]  # (access, dx, dy)
    written: bool

    def address(self, x: str, y: str, dx: int, dy: int) -> str:
        """Text of the address of element (x + dx, y + dy), in 64-bit arithmetic."""
        row = f"(long long)({y})"
        if dy:
            row = f"({row} {'+' if dy > 0 else '-'} {abs(dy)})"
        at = f"{self.pointer} + {row} * {paren(render(self.pitch))} + {x}"
        if self.base:
            at += f" + {paren(render(self.base, wide=True))}"
        return f"{at} + {dx}" if dx > 0 else f"{at} - {-dx}" if dx < 0 else at


class Vectorize2D(Transformation):
    name = "vectorize_2d"
    addresses = MEMORY | frozenset({"latency"})
    description = (
        "4 columns x R rows per thread: 16-byte row loads shared across them, 16-byte stores"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        g = grid_2d(ctx)
        if g is None or not g.body or not thread_independent(g.ast):
            return []
        buffers = _buffers(ctx, g)
        if buffers is None or not any(b.written for b in buffers):
            return []
        if not _written_once(g, {b.pointer for b in buffers if b.written}):
            return []
        out = []
        for rows, (bx, by), weight in CHOICES:
            definition = _definition(g, buffers, rows)
            variant = on_blocks(ctx, g, definition, (bx, by), (LANES * bx, rows * by))
            if variant is None:
                continue
            out.append(
                Rewrite(
                    params={"rows": rows, "block": (bx, by)},
                    summary=(
                        f"{LANES} columns x {rows} row(s) per thread: 16-byte loads of each row "
                        f"segment, shared across them, and 16-byte stores; block ({bx}, {by})"
                    ),
                    variant=variant,
                    weight=weight,
                )
            )
        return out


def _buffers(ctx: Context, g: Grid2D) -> list[_Buffer] | None:
    """Every buffer the kernel touches, if each is read or written as elements of one unit-stride
    grid at small constant offsets; None otherwise."""
    by_pointer: dict[str, list[Access]] = {}
    for a in g.ast.accesses():
        by_pointer.setdefault(a.pointer, []).append(a)
    out = []
    for pointer, accesses in by_pointer.items():
        if any(a.atomic for a in accesses):
            return None
        if all(a.read and not a.write and _uniform(g, a) for a in accesses):
            continue  # the same elements in every thread (a filter's weights): left as written
        elem = element_type(ctx, ctx.kernel.param(pointer).type_text)
        if elem not in VECTORS:  # 4-byte types only
            return None
        found = grid_offsets(g, accesses)
        if found is None:
            return None
        pitch, base, placed = found
        written = any(a.write for a in accesses)
        if written and any(a.read or (dx, dy) != (0, 0) for a, dx, dy in placed):
            return None
        out.append(_Buffer(pointer, elem, pitch, base, placed, written))
    return out


def _tag(n: int) -> str:
    """An offset as part of a name: 2, m1."""
    return f"m{-n}" if n < 0 else str(n)


def _uniform(g: Grid2D, access: Access) -> bool:
    """An access whose element depends on neither x nor y, nor on anything else that differs
    between threads."""
    form = g.form(access)
    parts = g.split(form) if form is not None else None
    return parts is not None and not parts[0] and not parts[1]


def _written_once(g: Grid2D, outputs: set[str]) -> bool:
    """Whether every path through the guarded statements writes each output exactly once."""
    total = _in_sequence(g, g.statements, outputs)
    return total is not None and all(total.get(p, 0) == 1 for p in outputs)


def _in_sequence(g: Grid2D, nodes: list[Node], outputs: set[str]) -> dict[str, int] | None:
    total: dict[str, int] = {}
    for node in nodes:
        counts = _writes(g, node, outputs)
        if counts is None:
            return None
        for p, n in counts.items():
            total[p] = total.get(p, 0) + n
    return total


def _writes(g: Grid2D, node: Node, outputs: set[str]) -> dict[str, int] | None:
    """The number of writes to each output on every path through `node`; None if paths differ,
    a loop writes one, or control can leave the element's statements early."""
    ast = g.ast
    if any(n.type in ("return_statement", "goto_statement") for n in walk(node)):
        return None
    here = [a for a in ast.accesses(node) if a.write and a.pointer in outputs]
    if not here:
        return {}
    if node.type == "compound_statement":
        return _in_sequence(g, node.named_children, outputs)
    if node.type == "if_statement":
        cond = node.child_by_field_name("condition")
        if any(a.write for a in ast.accesses(cond)):
            return None
        then = _writes(g, node.child_by_field_name("consequence"), outputs)
        other = node.child_by_field_name("alternative")
        if other is not None and other.type == "else_clause":
            other = other.named_children[0] if other.named_children else None
        alt = _writes(g, other, outputs) if other is not None else {}
        return then if then is not None and then == alt else None
    if node.type in ("expression_statement", "declaration"):
        # A write inside a conditional expression or a short-circuit operand may not happen.
        for a in here:
            parent = a.node.parent
            while parent is not None and parent != node:
                if parent.type == "conditional_expression" or (
                    parent.type == "binary_expression" and operator_of(parent) in ("&&", "||")
                ):
                    return None
                parent = parent.parent
        counts: dict[str, int] = {}
        for a in here:
            counts[a.pointer] = counts.get(a.pointer, 0) + 1
        return counts
    return None  # a loop, a switch, or anything else that writes


def _definition(g: Grid2D, buffers: list[_Buffer], rows: int) -> str:
    ast = g.ast
    i1 = indent_unit(ast)
    i2, i3, i4 = i1 * 2, i1 * 3, i1 * 4
    taken: set[str] = set()

    def name(base: str) -> str:
        found = fresh(ast, base, taken)
        taken.add(found)
        return found

    x0, y0 = name(f"{g.x.var}0"), name(f"{g.y.var}0")
    r, c = name("r"), name("c")
    reads = [(b, a, dx, dy) for b in buffers if not b.written for a, dx, dy in b.accesses]
    dxs = [dx for _, _, dx, _ in reads] + [0]
    dys = [dy for _, _, _, dy in reads] + [0]

    # Registers: for each input row k (relative to y0) its vector of columns 0..3 and the single
    # columns outside it that some element reads.
    needed: dict[tuple[str, int], set[int]] = {}
    for b, _, dx, dy in reads:
        for rr in range(rows):
            for cc in range(LANES):
                needed.setdefault((b.pointer, rr + dy), set()).add(cc + dx)
    by_name = {b.pointer: b for b in buffers}
    vec, one = {}, {}
    loads = []
    for (p, k), cols in sorted(needed.items()):
        b = by_name[p]
        if cols & set(range(LANES)):
            vec[(p, k)] = name(f"{p}_r{_tag(k)}")
            loads.append(
                f"{i2}const {VECTORS[b.elem]} {vec[(p, k)]} = "
                f"*reinterpret_cast<const {VECTORS[b.elem]}*>({b.address(x0, y0, 0, k)});"
            )
        for col in sorted(cols - set(range(LANES))):
            one[(p, k, col)] = name(f"{p}_r{_tag(k)}_c{_tag(col)}")
            loads.append(f"{i2}const {b.elem} {one[(p, k, col)]} = *({b.address(x0, y0, col, k)});")

    def value(p: str, k: int, col: int) -> str:
        return f"{vec[(p, k)]}.{FIELDS[col]}" if 0 <= col < LANES else one[(p, k, col)]

    outputs = [b for b in buffers if b.written]
    results = {(b.pointer, cc): name(f"{b.pointer}_o{cc}") for b in outputs for cc in range(LANES)}
    regs = {b.pointer: ", ".join(results[(b.pointer, cc)] for cc in range(LANES)) for b in outputs}
    fast_rows = []
    for rr in range(rows):
        fast_rows.append(f"{i2}{{")
        fast_rows += [f"{i3}{b.elem} {regs[b.pointer]};" for b in outputs]
        for cc in range(LANES):
            replace = {}
            for b, a, dx, dy in reads:
                replace[(a.node.start_byte, a.node.end_byte)] = value(b.pointer, rr + dy, cc + dx)
            for b in outputs:
                for a, _, _ in b.accesses:
                    replace[(a.node.start_byte, a.node.end_byte)] = results[(b.pointer, cc)]
            # The element's statements, less the declarations the registers made dead (an index
            # only the loads used), and its x and y where they are still read.
            body = emit(ast, live(ast, g.statements, replace, ""), i4, replace)
            used = words(re.sub(r"\.\s*[A-Za-z_]\w*", "", "\n".join(body)))  # not `.x` of a vector
            fast_rows += [
                f"{i3}{{",
                *(
                    f"{i4}{axis.prefix} {axis.var} = {start} + {offset};"
                    for axis, start, offset in ((g.x, x0, cc), (g.y, y0, rr))
                    if axis.var in used
                ),
                *body,
                f"{i3}}}",
            ]
        fast_rows += [
            f"{i3}*reinterpret_cast<{VECTORS[b.elem]}*>({b.address(x0, y0, 0, rr)}) = "
            f"make_{VECTORS[b.elem]}({regs[b.pointer]});"
            for b in outputs
        ]
        fast_rows.append(f"{i2}}}")

    aligned = [f"(reinterpret_cast<unsigned long long>({b.pointer}) & 15) == 0" for b in buffers]
    for b in buffers:
        for form in (b.pitch, b.base):
            test = f"{paren(render(form))} % {LANES} == 0"
            if form and test not in aligned:
                aligned.append(test)
    inside = [f"{x0} >= {-min(dxs)}"] if min(dxs) < 0 else []
    inside += [f"{y0} >= {-min(dys)}"] if min(dys) < 0 else []
    inside += [
        f"{x0} + {LANES - 1 + max(dxs)} < {paren(g.x.bound)}",
        f"{y0} + {rows - 1 + max(dys)} < {paren(g.y.bound)}",
    ]
    fast = f" &&\n{i2}    ".join(aligned + inside)
    lines = [
        f"{i1}// This thread's elements: columns {x0} .. {x0} + {LANES - 1} of "
        + (f"rows {y0} .. {y0} + {rows - 1}." if rows > 1 else f"row {y0}."),
        f"{i1}const {g.x.type} {x0} = (blockIdx.x * blockDim.x + threadIdx.x) * {LANES};",
        f"{i1}const {g.y.type} {y0} = (blockIdx.y * blockDim.y + threadIdx.y) * {rows};",
        f"{i1}if ({x0} >= {paren(g.x.bound)} || {y0} >= {paren(g.y.bound)})",
        f"{i2}return;",
        f"{i1}if ({fast}) {{",
        f"{i2}// Every element and every neighbour it reads is inside, every row 16-byte aligned:",
        f"{i2}// each row segment is loaded once, as a vector, and shared by the elements below.",
        *loads,
        *fast_rows,
        f"{i1}}} else {{",
        f"{i2}for (int {r} = 0; {r} < {rows}; ++{r}) {{",
        f"{i3}for (int {c} = 0; {c} < {LANES}; ++{c}) {{",
        f"{i4}{g.x.prefix} {g.x.var} = {x0} + {c};",
        f"{i4}{g.y.prefix} {g.y.var} = {y0} + {r};",
        f"{i4}if ({g.guard}) {{",
        *emit(ast, g.statements, i4 + i1),
        f"{i4}}}",
        f"{i3}}}",
        f"{i2}}}",
        f"{i1}}}",
    ]
    return with_body(ast, lines, restrict_params(ast))
