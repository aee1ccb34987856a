"""Stencils through shared memory: a 2-D kernel whose reads of an input are one element grid shifted
by small constant offsets (`u[idx - cols]`, `u[idx + 1]`, `u[(y + 1) * w + x - 1]`...) loads its
block's tile of that input, halo included, into shared memory once; every neighbour is then read
from there instead of from L1/L2 once per use.

Exact for any boundary handling: a tile cell is loaded where it lies inside the guarded rectangle,
and a read whose element lies outside it (a padded array's border, a wrap-around) still reads
global memory."""

from __future__ import annotations

from dataclasses import dataclass

from optiml.cuda.kernel_ast import Access, Affine, walk
from optiml.search.catalog._gemm import render
from optiml.search.catalog._two_d import (
    Grid2D,
    element_bytes,
    emit,
    fresh,
    grid_2d,
    grid_offsets,
    indent_unit,
    live,
    on_blocks,
    paren,
    thread_independent,
    with_body,
)
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation

# (block.x, block.y, weight): 32 x 8 keeps a warp on one tile row; 32 x 16 halves the halo per
# element; 64 x 4 moves 256 B per tile row.
SHAPES = ((32, 8, 1.0), (32, 16, 0.8), (64, 4, 0.6))
MAX_TILES = 2


@dataclass
class _Input:
    """One read-only input read at several offsets (dx, dy) around the thread's (x, y)."""

    pointer: str
    elem: str
    pitch: Affine  # elements between rows
    base: Affine  # the part of the index that is neither x, y nor an offset
    reads: list[tuple[Access, int, int]]

    def span(self, axis: int) -> tuple[int, int]:
        values = [r[1 + axis] for r in self.reads]
        return min(values), max(values)


class TileStencil(Transformation):
    name = "tile_stencil"
    addresses = frozenset({"l1_shared", "l2", "latency"})
    description = "stencil through a shared-memory tile with its halo, loaded once per block"

    def propose(self, ctx: Context) -> list[Rewrite]:
        g = grid_2d(ctx)
        if g is None or not g.body or not thread_independent(g.ast):
            return []
        inputs = _inputs(ctx, g)
        if not inputs or len(inputs) > MAX_TILES:
            return []
        sizes = [element_bytes(ctx, i.elem) for i in inputs]
        if None in sizes:
            return []
        out = []
        for bx, by, weight in SHAPES:
            cells = [_extent(i, bx, by) for i in inputs]
            if sum(w * h * b for (w, h), b in zip(cells, sizes, strict=True)) > STATIC_SMEM:
                continue
            variant = on_blocks(ctx, g, _definition(g, inputs, bx, by), (bx, by), (bx, by))
            if variant is None:
                continue
            names = ", ".join(i.pointer for i in inputs)
            halo = max(max(-lo, hi) for i in inputs for lo, hi in (i.span(0), i.span(1)))
            out.append(
                Rewrite(
                    params={"block": (bx, by)},
                    summary=(
                        f"{names} through a shared-memory tile of block ({bx}, {by}) with a "
                        f"halo of {halo}: each element loaded once per block"
                    ),
                    variant=variant,
                    weight=weight,
                )
            )
        return out


def _inputs(ctx: Context, g: Grid2D) -> list[_Input]:
    """The inputs read at three or more offsets, every read of each one shifted from (x, y) by
    constants within MAX_RADIUS, in the guarded body, from a buffer the kernel never writes."""
    ast = g.ast
    by_pointer: dict[str, list[Access]] = {}
    for a in ast.accesses():
        by_pointer.setdefault(a.pointer, []).append(a)
    body = {n.id for st in g.body for n in walk(st)}
    out = []
    for pointer, accesses in by_pointer.items():
        buffer = ctx.spec.buffer(pointer)
        if buffer is None or buffer.role != "in":
            continue
        if any(a.write or a.atomic or a.node.id not in body for a in accesses):
            continue
        found = grid_offsets(g, accesses)
        if found is None:
            continue
        pitch, base, reads = found
        if len({(dx, dy) for _, dx, dy in reads}) < 3:
            continue
        out.append(_Input(pointer, ctx.kernel.param(pointer).type_text, pitch, base, reads))
    return out


def _extent(i: _Input, bx: int, by: int) -> tuple[int, int]:
    (x0, x1), (y0, y1) = i.span(0), i.span(1)
    return bx + x1 - x0, by + y1 - y0


def _definition(g: Grid2D, inputs: list[_Input], bx: int, by: int) -> str:
    ast = g.ast
    i1 = indent_unit(ast)
    i2, i3 = i1 * 2, i1 * 3
    taken: set[str] = set()

    def name(base: str) -> str:
        found = fresh(ast, base, taken)
        taken.add(found)
        return found

    lines = [
        f"{i1}{axis.prefix} {axis.var} = blockIdx.{axis.dim} * {b} + threadIdx.{axis.dim};"
        for axis, b in ((g.x, bx), (g.y, by))
    ]
    replace: dict[tuple[int, int], str] = {}
    for i in inputs:
        tile, t, tx, ty = name(f"{i.pointer}_tile"), name("t"), name("tx"), name("ty")
        (x0, _), (y0, _) = i.span(0), i.span(1)
        w, h = _extent(i, bx, by)
        gx, gy = name("gx"), name("gy")
        at = f"{gy} * {paren(render(i.pitch, wide=True))} + {gx}"
        if i.base:
            at += f" + {paren(render(i.base, wide=True))}"
        lines += [
            f"{i1}// {i.pointer} around this block, halo included: each element loaded once.",
            f"{i1}__shared__ {i.elem} {tile}[{h}][{w}];",
            f"{i1}for (int {t} = threadIdx.y * {bx} + threadIdx.x; {t} < {h * w}; "
            f"{t} += {bx * by}) {{",
            f"{i2}const int {ty} = {t} / {w}, {tx} = {t} % {w};",
            f"{i2}const long long {gy} = (long long)blockIdx.y * {by} + {ty} + ({y0});",
            f"{i2}const long long {gx} = (long long)blockIdx.x * {bx} + {tx} + ({x0});",
            f"{i2}if ({gy} >= 0 && {gy} < {paren(g.y.bound)} && {gx} >= 0 && "
            f"{gx} < {paren(g.x.bound)})",
            f"{i3}{tile}[{ty}][{tx}] = {i.pointer}[{at}];",
            f"{i1}}}",
        ]
        for a, dx, dy in i.reads:
            cell = f"{tile}[threadIdx.y + {dy - y0}][threadIdx.x + {dx - x0}]"
            inside = [c for c in (_inside(g.x, dx), _inside(g.y, dy)) if c]
            text = ast.text(a.node)
            span = (a.node.start_byte, a.node.end_byte)
            replace[span] = f"({' && '.join(inside)} ? {cell} : {text})" if inside else cell
    lines.append(f"{i1}__syncthreads();")
    after = "\n".join([g.guard, *emit(ast, g.body, "", replace)])
    lines += emit(ast, live(ast, g.prologue, replace, after), i1, replace)
    lines.append(f"{i1}if ({g.guard}) {{")
    lines += emit(ast, g.body, i2, replace)
    lines.append(f"{i1}}}")
    return with_body(ast, lines)


def _inside(axis, d: int) -> str:
    """The test that (x + d) stays inside the guarded range, where d may leave it."""
    if d > 0:
        return f"{axis.var} + {d} < {paren(axis.bound)}"
    if d < 0:
        return f"{axis.var} >= {-d}"
    return ""
