"""The shape that 1-D "map" transformations (grid-stride loops, vectorized accesses) rewrite: one
global thread index `i` over x, a bounds guard `i < n`, and a body that works on element `i` alone,
without shared memory, barriers, other thread coordinates or early exits."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import BARRIERS, KernelAST, ThreadIndex, walk
from optiml.search.catalog.base import Context

BUILTINS = ("threadIdx", "blockIdx", "blockDim", "gridDim")


@dataclass
class MapKernel:
    ast: KernelAST
    index: ThreadIndex
    index_type: str  # "int", "size_t", ...
    bound: str  # the guard's bound, as the kernel writes it
    before: list[Node]  # statements before the guard that do not use the index: run once
    per_element: list[Node]  # statements before the guard that use it: run for each element
    body: list[Node]  # the guarded statements


def map_kernel(ctx: Context) -> MapKernel | None:
    """The kernel as a 1-D map, or None if it is not one."""
    ast = ctx.ast
    case = ctx.case
    if case.grid[1] != 1 or case.grid[2] != 1 or case.block[1] != 1 or case.block[2] != 1:
        return None
    indices = [t for t in ast.thread_indices().values() if t.dim == "x"]
    if len(indices) != 1 or len(ast.thread_indices()) != 1:
        return None
    index = indices[0]
    guard = ast.guard(after=index.decl)
    if guard is None or not guard.exact or set(guard.bounds) != {index.var}:
        return None
    stmts = ast.statements()
    decl_pos, guard_pos = stmts.index(index.decl), stmts.index(guard.node)
    if len(index.decl.children_by_field_name("declarator")) != 1:
        return None
    before, per_element = list(stmts[:decl_pos]), []
    for st in stmts[decl_pos + 1 : guard_pos]:
        if st.type not in ("declaration", "expression_statement"):
            return None
        (per_element if index.var in ast.identifiers(st) else before).append(st)
    if any(index.var in ast.identifiers(st) for st in before):
        return None
    everything = [*per_element, *guard.body]
    for st in everything:
        if _unsafe(ast, st, index.var):
            return None
    if index.var in set().union(*(ast.assigned(st) for st in everything)) if everything else set():
        return None
    type_node = index.decl.child_by_field_name("type")
    index_type = ast.text(type_node) if type_node is not None else "int"
    return MapKernel(
        ast, index, index_type, guard.bounds[index.var], before, per_element, guard.body
    )


def _unsafe(ast: KernelAST, node: Node, var: str) -> bool:
    """Code a per-element loop cannot hold: barriers, shared memory, other thread coordinates, an
    exit from the kernel, a label."""
    for n in walk(node):
        if n.type in ("return_statement", "goto_statement", "labeled_statement"):
            return True
        if n.type in ("break_statement", "continue_statement") and not _inside_loop(n, node):
            return True
    if any(name in BARRIERS for name, _ in ast.calls(node)):
        return True
    if "__shared__" in ast.text(node):
        return True
    return any(ast.uses_builtin(node, b) for b in BUILTINS)


def _inside_loop(n: Node, top: Node) -> bool:
    p = n.parent
    while p is not None and p != top.parent:
        if p.type in ("for_statement", "while_statement", "do_statement", "switch_statement"):
            return True
        p = p.parent
    return False


def block_threads(ctx: Context) -> int:
    b = ctx.case.block
    return b[0] * b[1] * b[2]


def statement_text(
    ast: KernelAST,
    statements: list[Node],
    indent: str,
    replace: dict[tuple[int, int], str] | None = None,
) -> str:
    """Statements as text (with byte ranges in `replace` swapped in), each re-indented to `indent`
    with its inner lines kept relative."""
    out = []
    for st in statements:
        column = st.start_point[1]
        mine = {
            r: v
            for r, v in (replace or {}).items()
            if st.start_byte <= r[0] and r[1] <= st.end_byte
        }
        lines = ast.render(st, mine).split("\n")
        block = [indent + lines[0]]
        for line in lines[1:]:
            lead = len(line) - len(line.lstrip(" "))
            block.append(indent + line[min(lead, column) :] if line.strip() else "")
        out.append("\n".join(block))
    return "\n".join(out)
