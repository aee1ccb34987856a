"""`__restrict__` on every pointer parameter and `const` on those the kernel only reads: the compiler
may then keep loaded values in registers across stores and use the read-only data path.

Safe under the kernel contract: every buffer of a spec is its own allocation, so no two pointer
parameters alias."""

from __future__ import annotations

from optiml.search.catalog.base import MEMORY, Context, Rewrite, Transformation


class RestrictConst(Transformation):
    name = "restrict_const"
    addresses = MEMORY | frozenset({"latency"})
    gain = 0.5
    description = "__restrict__ on pointer parameters, const on read-only ones"

    def propose(self, ctx: Context) -> list[Rewrite]:
        ast = ctx.ast
        written = {a.pointer for a in ast.accesses() if a.write}
        escaped = {ast.pointer_of(ast.text(n))[0] for n in ast.pointer_escapes()}
        escaped |= {
            ast.pointer_of(ast.text(n.child_by_field_name("argument")))[0]
            for n in ast.dereferences()
        }
        replace = {}
        changed = []
        for p in ctx.kernel.params:
            if p.pointer_depth != 1:
                continue
            const = p.const_pointee or (p.name not in written and p.name not in escaped)
            if p.restrict and const == p.const_pointee:
                continue
            node = _param_node(ctx, p)
            replace[(node.start_byte, node.end_byte)] = (
                f"{'const ' if const else ''}{p.type_text}* __restrict__ {p.name}"
            )
            changed.append(p.name)
        if not changed:
            return []
        return [
            Rewrite(
                params={},
                summary=f"__restrict__ (and const where read-only) on {', '.join(changed)}",
                variant=ctx.rewrite(ast.definition(replace)),
            )
        ]


def _param_node(ctx: Context, param):
    ast = ctx.ast
    decl = ast.fn.child_by_field_name("declarator")
    while decl is not None and decl.type != "function_declarator":
        decl = decl.child_by_field_name("declarator")
    for node in decl.child_by_field_name("parameters").named_children:
        if node.type == "parameter_declaration" and ctx.source.span(node).start == param.span.start:
            return node
    raise ValueError(f"parameter {param.name} not found")
