"""`#pragma unroll N` on the innermost loops whose trip count is not a compile-time constant (those
nvcc unrolls by itself): more independent loads and arithmetic in flight per thread."""

from __future__ import annotations

from optiml.cuda.kernel_ast import walk
from optiml.search.catalog.base import Context, Rewrite, Transformation


class Unroll(Transformation):
    name = "unroll"
    addresses = frozenset({"latency", "l1_shared", "l2", "compute"})
    gain = 0.5
    keeps_accesses = True
    description = "#pragma unroll on innermost loops"

    def propose(self, ctx: Context) -> list[Rewrite]:
        ast = ctx.ast
        loops = []
        for n in walk(ast.body):
            if n.type != "for_statement":
                continue
            inner = [
                m
                for m in walk(n.child_by_field_name("body"))
                if m.type in ("for_statement", "while_statement", "do_statement")
            ]
            if inner or _has_pragma(ast, n):
                continue
            cond = n.child_by_field_name("condition")
            if cond is None or not ast.identifiers(cond) - ast.identifiers(
                n.child_by_field_name("initializer") or cond
            ):
                continue  # a constant trip count: nvcc unrolls it already
            loops.append(n)
        if not loops:
            return []
        out = []
        for factor, weight in ((4, 1.0), (8, 0.8), (2, 0.5)):
            edits = {}
            for loop in loops:
                indent = ast.indent_of(loop)
                edits[(loop.start_byte, loop.start_byte)] = f"#pragma unroll {factor}\n{indent}"
            out.append(
                Rewrite(
                    params={"factor": factor},
                    summary=f"#pragma unroll {factor} on {len(loops)} innermost loop(s)",
                    variant=ctx.rewrite(ast.definition(edits)),
                    weight=weight,
                )
            )
        return out


def _has_pragma(ast, loop) -> bool:
    prev = loop.prev_sibling
    return prev is not None and prev.type.startswith("preproc") and "unroll" in ast.text(prev)
