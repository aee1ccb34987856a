"""Transpose through shared memory: a 2-D kernel that reads along x (contiguous per warp) and writes
along y (a stride of a whole row per lane), or the reverse, is rewritten so that both global sides
run along threadIdx.x and the turn happens in a TILE x (TILE + 1) shared tile."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import ASSIGN_OPS, Access, walk
from optiml.search.catalog._two_d import (
    Grid2D,
    closure,
    element_bytes,
    emit,
    fresh,
    grid_2d,
    indent_unit,
    is_constant,
    is_one,
    live,
    on_blocks,
    thread_independent,
    with_body,
)
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation

# (TILE, block.y, weight): 64 x 8 moves 256 B per row per block (8 elements per thread, 16 KB of
# tile) and was the faster on the H200 (naive transpose fixture, 8192^2 floats: 0.139 ms against
# 0.151 ms for 32 x 8; benchmarks/results/search-table-h200.json); 32 x 8 is the classic shape (4
# elements per thread, 4 KB of tile); 32 x 16 trades elements per thread for more warps.
SHAPES = ((64, 8, 1.0), (32, 8, 0.8), (32, 16, 0.6))
MAX_TILES = 2
# A lane stride of at least this many elements gives each lane its own sectors.
STRIDED = 16


@dataclass
class _Plan:
    grid: Grid2D
    store: Node  # `p[W] = E;` (or `op=`), the body's last statement
    target: Node  # p[W]
    value: Node  # E
    turn_write: bool  # the write runs along y (else some reads do)
    tiles: list[tuple[str, list[Node]]]  # element type, and the reads each tile replaces
    # The declarations the pass along y needs: those of the write's index (turn_write), or those
    # of the strided reads' indices.
    keep: list[Node]


class TileTranspose(Transformation):
    name = "tile_transpose"
    addresses = frozenset({"uncoalesced", "dram", "l2"})
    description = "transpose through a padded shared-memory tile: coalesced reads and writes"

    def propose(self, ctx: Context) -> list[Rewrite]:
        plan = _plan(ctx)
        if plan is None:
            return []
        g = plan.grid
        sizes = [element_bytes(ctx, t) for t, _ in plan.tiles]
        if None in sizes:
            return []
        out = []
        for tile, rows, weight in SHAPES:
            if sum(tile * (tile + 1) * b for b in sizes) > STATIC_SMEM:
                continue
            variant = on_blocks(ctx, g, _definition(plan, tile, rows), (tile, rows), (tile, tile))
            if variant is None:
                continue
            side = "write" if plan.turn_write else "read"
            out.append(
                Rewrite(
                    params={"tile": tile, "block": (tile, rows)},
                    summary=(
                        f"{tile}x{tile + 1} smem tile turns the strided {side}, block "
                        f"({tile}, {rows}), {tile // rows} rows per thread, both sides coalesced"
                    ),
                    variant=variant,
                    weight=weight,
                )
            )
        return out


def _plan(ctx: Context) -> _Plan | None:
    g = grid_2d(ctx)
    if g is None or not g.body or not thread_independent(g.ast):
        return None
    ast = g.ast
    *decls, store = g.body
    if any(s.type != "declaration" for s in decls) or store.type != "expression_statement":
        return None
    assign = store.named_children[0] if store.named_children else None
    if assign is None or assign.type != "assignment_expression":
        return None
    op = assign.child_by_field_name("operator")
    if op is None or op.type not in ASSIGN_OPS:
        return None
    target, value = assign.child_by_field_name("left"), assign.child_by_field_name("right")
    accesses = ast.accesses()
    writes = [a for a in accesses if a.write]
    if len(writes) != 1 or writes[0].node != target:
        return None
    # The written array is touched by the store alone (`+=` reads the element it writes).
    written = writes[0].pointer
    reads = [a for a in accesses if not a.write]
    if any(a.pointer == written for a in reads):
        return None
    along: dict[int, str] = {}
    for a in accesses:
        form = g.form(a)
        parts = g.split(form) if form is not None else None
        if parts is None:
            return None
        along[a.node.id] = _along_x(parts[0], parts[1])
    local = g.prologue + decls
    xy = {g.x.var, g.y.var}
    if along[target.id] == "turn":
        if any(along[a.node.id] != "x" for a in reads):
            return None
        keep = closure(ast, local, ast.identifiers(target) - xy)
        if keep is None or any(ast.accesses(st) for st in keep):
            return None
        elem = ctx.kernel.param(written).type_text
        return _Plan(g, store, target, value, True, [(elem, [])], keep)
    if along[target.id] != "x":
        return None
    turned = [a for a in reads if along[a.node.id] == "turn"]
    if not turned or any(along[a.node.id] not in ("x", "turn") for a in reads):
        return None
    in_body = {n.id for st in g.body for n in walk(st)}
    if any(a.node.id not in in_body for a in turned):
        return None
    tiles = _tiles(ctx, g, turned)
    if len(tiles) > MAX_TILES:
        return None
    needed = set().union(*(ast.identifiers(nodes[0]) for _, nodes in tiles)) - xy
    keep = closure(ast, local, needed)
    if keep is None or any(ast.accesses(st) for st in keep):
        return None
    return _Plan(g, store, target, value, False, tiles, keep)


def _along_x(sx: dict, sy: dict) -> str:
    """How an access runs along x: "x" if contiguous (or the same element) for consecutive x,
    "turn" if strided along x but contiguous along y, "other" if neither, which no tile fixes."""
    if not sx or is_one(sx):
        return "x"
    if is_one(sy) and (not is_constant(sx) or abs(sx.get((), 0)) >= STRIDED):
        return "turn"
    return "other"


def _tiles(ctx: Context, g: Grid2D, turned: list[Access]) -> list[tuple[str, list[Node]]]:
    """One tile per distinct strided read (same pointer, same element)."""
    groups: dict[tuple, list[Node]] = {}
    for a in turned:
        key = (a.pointer, tuple(sorted(g.form(a).items())))
        groups.setdefault(key, []).append(a.node)
    return [(ctx.kernel.param(key[0]).type_text, nodes) for key, nodes in groups.items()]


def _definition(plan: _Plan, tile: int, rows: int) -> str:
    g = plan.grid
    ast = g.ast
    i1 = indent_unit(ast)
    taken: set[str] = set()
    names = []
    for _ in plan.tiles:
        names.append(fresh(ast, "tile", taken))
        taken.add(names[-1])
    k = fresh(ast, "k", taken)
    r = fresh(ast, "r", taken | {k})
    decls = g.body[:-1]
    kept_prologue = [s for s in g.prologue if s in plan.keep]
    kept_body = [s for s in decls if s in plan.keep]
    lines = [
        f"{i1}// Padded by one column: reading a column of the tile then hits every bank once."
    ]
    lines += [
        f"{i1}__shared__ {elem} {name}[{tile}][{tile} + 1];"
        for name, (elem, _) in zip(names, plan.tiles, strict=True)
    ]
    if plan.turn_write:
        # `out[W] op= E` computes E into the tile, and applies `op=` where it writes.
        into_tile = {
            (plan.target.start_byte, plan.value.start_byte): f"{names[0]}[{r}][threadIdx.x] = "
        }
        from_tile = {_span(plan.value): f"{names[0]}[threadIdx.x][{r}]"}
        lines.append(f"{i1}// Compute along x, where the input is contiguous, into the tile.")
        lines += _pass(g, tile, rows, (k, r), "x", g.prologue, decls + [plan.store], into_tile)
        lines.append(f"{i1}__syncthreads();")
        lines.append(
            f"{i1}// Write along y, where the output is contiguous: the tile read by column."
        )
        lines += _pass(
            g, tile, rows, (k, r), "y", kept_prologue, kept_body + [plan.store], from_tile
        )
    else:
        loads = [
            f"{name}[{r}][threadIdx.x] = {ast.text(nodes[0])};"
            for name, (_, nodes) in zip(names, plan.tiles, strict=True)
        ]
        from_tile = {
            _span(n): f"{name}[threadIdx.x][{r}]"
            for name, (_, nodes) in zip(names, plan.tiles, strict=True)
            for n in nodes
        }
        lines.append(
            f"{i1}// Read the strided input along y, where it is contiguous, into the tile."
        )
        lines += _pass(g, tile, rows, (k, r), "y", kept_prologue, kept_body, {}, loads)
        lines.append(f"{i1}__syncthreads();")
        lines.append(
            f"{i1}// Compute along x, where the output is contiguous: the tile read by column."
        )
        lines += _pass(g, tile, rows, (k, r), "x", g.prologue, g.body, from_tile)
    return with_body(ast, lines)


def _pass(
    g: Grid2D,
    tile: int,
    rows: int,
    names: tuple[str, str],
    lanes: str,
    prologue: list[Node],
    body: list[Node],
    replace: dict[tuple[int, int], str],
    extra: list[str] | None = None,
) -> list[str]:
    """One pass over the block's tile: each thread takes rows threadIdx.y, + rows, ... of it, with
    the lanes of a warp along `lanes` ("x" or "y"), and runs the original statements there."""
    ast = g.ast
    k, r = names
    i1 = indent_unit(ast)
    i2, i3 = i1 * 2, i1 * 3
    lines = [
        f"{i1}#pragma unroll",
        f"{i1}for (int {k} = 0; {k} < {tile}; {k} += {rows}) {{",
        f"{i2}const int {r} = threadIdx.y + {k};",
    ]
    for axis in (g.x, g.y):
        offset = "threadIdx.x" if axis.dim == lanes else r
        lines.append(f"{i2}{axis.prefix} {axis.var} = blockIdx.{axis.dim} * {tile} + {offset};")
    extra = extra or []
    body = live(ast, body, replace, "\n".join(extra))
    after = "\n".join([g.guard, *emit(ast, body, "", replace), *extra])
    lines += emit(ast, live(ast, prologue, replace, after), i2, replace)
    lines.append(f"{i2}if ({g.guard}) {{")
    lines += emit(ast, body, i3, replace)
    lines += [i3 + line for line in extra]
    lines += [f"{i2}}}", f"{i1}}}"]
    return lines


def _span(node: Node) -> tuple[int, int]:
    return (node.start_byte, node.end_byte)
