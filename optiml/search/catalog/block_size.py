"""Block size and shape: the launch's block changes and its grid with it, so that the same elements
are covered. Only for kernels that use the block size through `blockDim` alone (no shared memory
or barriers sized for one block, no constant that must equal it) — or through a template parameter,
which changes with the block."""

from __future__ import annotations

import re

from optiml.cuda.kernel_ast import BARRIERS
from optiml.expr import Expr
from optiml.search.catalog.base import LATENCY, Context, Rewrite, Transformation

SIZES_1D = (128, 256, 512, 1024)
SHAPES_2D = ((32, 4), (32, 8), (32, 16), (64, 4), (128, 2), (16, 16), (32, 32), (256, 1))


class BlockSize(Transformation):
    name = "block_size"
    addresses = LATENCY | frozenset({"dram", "occupancy"})
    gain = 0.5
    keeps_accesses = True
    description = "block size and shape (the grid follows)"
    once = False

    def propose(self, ctx: Context) -> list[Rewrite]:
        ast = ctx.ast
        if ast.shared_declarations() or any(n in BARRIERS for n, _ in ast.calls(ast.body)):
            return []
        if "__launch_bounds__" in ast.text(ast.fn) and not ctx.spec.template:
            return []
        grid, block, smem = ctx.launch
        block_param = _template_block(ctx, block)
        if block_param is not None:
            return self._template(ctx, block_param)
        try:
            current = [int(Expr.parse(b).evaluate({})) for b in block]
        except Exception:
            return []  # a block that depends on the problem size
        dims = len(current)
        if dims == 1:
            options = [(b,) for b in SIZES_1D if b != current[0]]
        elif dims == 2:
            options = [s for s in SHAPES_2D if list(s) != current]
        else:
            return []
        literals = _block_literals(ast, current)
        if literals:
            return []  # the body has a constant equal to the block: it may assume that size
        proposals = []
        for shape in options:
            new_grid = []
            for d, g in enumerate(grid):
                if d >= dims:
                    new_grid.append(g)
                    continue
                rewritten = _rescale(g, current[d], shape[d])
                if rewritten is None:
                    return []
                new_grid.append(rewritten)
            threads = 1
            for s in shape:
                threads *= s
            label = " x ".join(str(s) for s in shape)
            proposals.append(
                Rewrite(
                    params={"block": list(shape)},
                    summary=f"block {label} ({threads} threads)",
                    variant=ctx.rewrite(launch=(new_grid, [str(s) for s in shape], smem)),
                    weight=_weight(shape, dims),
                )
            )
        return proposals

    def _template(self, ctx: Context, param: str) -> list[Rewrite]:
        current = ctx.spec.template_values.get(param)
        out = []
        for b in SIZES_1D:
            if b == current:
                continue
            values = {**ctx.spec.template, param: str(b)}
            template = ", ".join(f"{k} = {v}" for k, v in values.items())
            out.append(
                Rewrite(
                    params={"block": [b]},
                    summary=f"block {b} threads ({param} = {b})",
                    variant=ctx.rewrite(template=template),
                    weight=_weight((b,), 1),
                )
            )
        return out


def _weight(shape: tuple[int, ...], dims: int) -> float:
    threads = 1
    for s in shape:
        threads *= s
    # 256 and 512 threads are the usual sweet spot; wide-in-x shapes coalesce best in 2-D
    base = {128: 0.7, 256: 1.0, 512: 0.9, 1024: 0.6}.get(threads, 0.5)
    if dims == 2 and shape[0] < 32:
        base *= 0.5
    return base


def _template_block(ctx: Context, block: list[str]) -> str | None:
    """The template parameter the launch's block is, if it is one (`block = BLOCK`)."""
    if len(block) == 1 and block[0].strip() in ctx.spec.template_values:
        return block[0].strip()
    return None


def _block_literals(ast, current: list[int]) -> bool:
    """Whether the body has an integer literal equal to the block's thread count (or a dimension
    of it, beyond 1): code that may hard-wire the block size."""
    threads = 1
    for c in current:
        threads *= c
    suspects = {threads} | {c for c in current if c > 1}
    return any(n in suspects for n in ast.int_literals(ast.body))


_CDIV = re.compile(r"cdiv\(\s*(?P<arg>.+)\s*,\s*(?P<den>\d+)\s*\)$")


def _rescale(grid: str, old: int, new: int) -> str | None:
    """The grid dimension for a block dimension `new` instead of `old`: `cdiv(X, old)` becomes
    `cdiv(X, new)`; a constant 1 stays; anything else is not understood."""
    g = grid.strip()
    m = _CDIV.match(g)
    if m and int(m.group("den")) == old:
        return f"cdiv({m.group('arg').strip()}, {new})"
    if g == "1" and old == new:
        return g
    inner = re.match(r"^(?P<fn>cdiv|min)\((?P<a>.+)\)$", g)
    if inner is not None and inner.group("fn") == "cdiv":
        # cdiv(cdiv(n, 256), 4): rescale the inner one
        args = _split_args(inner.group("a"))
        if len(args) == 2:
            first = _rescale(args[0], old, new)
            if first is not None:
                return f"cdiv({first}, {args[1].strip()})"
    return None


def _split_args(text: str) -> list[str]:
    depth, parts, cur = 0, [], []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts
