"""`__launch_bounds__(threads[, min blocks per SM])`: tells ptxas the block size it will run with, so
it can budget registers for it (and, with a minimum of resident blocks, cap them to keep occupancy).
Only where the launch's block size is the same constant at every problem size."""

from __future__ import annotations

from optiml.search.catalog.base import Context, Rewrite, Transformation


class LaunchBounds(Transformation):
    name = "launch_bounds"
    addresses = frozenset({"occupancy", "latency", "spilling"})
    gain = 0.5
    keeps_accesses = True
    description = "__launch_bounds__ with the launch's block size"

    def propose(self, ctx: Context) -> list[Rewrite]:
        ast = ctx.ast
        if "__launch_bounds__" in ast.text(ast.fn)[: ast.body.start_byte - ast.fn.start_byte]:
            return []
        sizes = {_threads(ctx.spec.case(s)) for s in ctx.spec.sizes}
        if len(sizes) != 1:
            return []
        threads = sizes.pop()
        declarator = ast.fn.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        name = declarator.child_by_field_name("declarator")
        regs = _registers(ctx)
        options = [(None, 1.0)]
        # Two or more resident blocks: only useful when registers now keep fewer resident.
        if regs is not None and threads * regs > 65536 // 2:
            options.append((2, 0.8))
        if regs is not None and threads * regs > 65536 // 4 and threads <= 256:
            options.append((4, 0.6))
        out = []
        for min_blocks, weight in options:
            bounds = f"__launch_bounds__({threads}{f', {min_blocks}' if min_blocks else ''}) "
            definition = ast.definition({(name.start_byte, name.start_byte): bounds})
            what = f"{threads} threads" + (
                f", at least {min_blocks} blocks per SM" if min_blocks else ""
            )
            out.append(
                Rewrite(
                    params={"threads": threads, "min_blocks": min_blocks},
                    summary=f"__launch_bounds__({what})",
                    variant=ctx.rewrite(definition),
                    weight=weight,
                )
            )
        return out


def _threads(case) -> int:
    b = case.block
    return b[0] * b[1] * b[2]


def _registers(ctx: Context) -> int | None:
    regs = ctx.profile.get("registers_per_thread")
    return int(regs) if regs else None
