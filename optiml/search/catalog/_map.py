"""The shape that 1-D "map" transformations (grid-stride loops, vectorized accesses) rewrite: one
global thread index `i` over x, a bounds guard `i < n` (or a grid-stride loop over `i < n`, as a
`for` or a `while`), and a body that works on element `i` alone, without shared memory, barriers,
other thread coordinates or early exits."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import (
    BARRIERS,
    KernelAST,
    ThreadIndex,
    for_header,
    operator_of,
    unparen,
    walk,
)
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
    indices = list(ast.thread_indices().values())
    if not indices:
        return _grid_stride_loop(ast)
    if len(indices) != 1 or indices[0].dim != "x":
        return None
    index = indices[0]
    looped = _while_grid_stride(ast, index)
    if looped is not None:
        return looped
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


def _grid_stride_loop(ast: KernelAST) -> MapKernel | None:
    """`for (T i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    { body }` as the kernel's last statement: the same map as a guarded `i`, for any grid."""
    stmts = ast.statements()
    if not stmts or stmts[-1].type != "for_statement":
        return None
    loop, before = stmts[-1], stmts[:-1]
    header = for_header(loop)
    if header is None or header[0].type != "declaration":
        return None
    init, cond, update, body = header
    decls = init.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    target, value = (
        decls[0].child_by_field_name("declarator"),
        decls[0].child_by_field_name("value"),
    )
    if target is None or target.type != "identifier" or value is None:
        return None
    found = ast.global_index_of(value)
    if found is None or found[0] != "x" or found[1] != "blockDim.x":
        return None
    index = ThreadIndex(ast.text(target), "x", "blockDim.x", loop)
    inner = ast.statements(body) if body.type == "compound_statement" else [body]
    return _strided_map(ast, index, init, cond, update, body, inner, before)


def _while_grid_stride(ast: KernelAST, index: ThreadIndex) -> MapKernel | None:
    """`T i = blockIdx.x * blockDim.x + threadIdx.x; while (i < n) { body; i += blockDim.x *
    gridDim.x; }` as the kernel's last two statements: the grid-stride loop written as a while."""
    stmts = ast.statements()
    if len(stmts) < 2 or stmts[-2] != index.decl or stmts[-1].type != "while_statement":
        return None
    if index.block != "blockDim.x":
        return None
    if len(index.decl.children_by_field_name("declarator")) != 1:
        return None
    loop = stmts[-1]
    cond = loop.child_by_field_name("condition")
    body = loop.child_by_field_name("body")
    if cond is None or not cond.named_children or body is None:
        return None
    if body.type != "compound_statement":
        return None
    inner = ast.statements(body)
    if not inner or inner[-1].type != "expression_statement" or not inner[-1].named_children:
        return None
    update = inner[-1].named_children[0]
    return _strided_map(
        ast, index, index.decl, cond.named_children[0], update, body, inner[:-1], stmts[:-2]
    )


def _strided_map(
    ast: KernelAST,
    index: ThreadIndex,
    decl: Node,
    cond: Node,
    update: Node,
    body: Node,
    inner: list[Node],
    before: list[Node],
) -> MapKernel | None:
    """What both spellings of the grid-stride loop must hold: `i < bound` with a bound the loop
    leaves alone, a step of the whole grid, statements before it that do not use the thread, and a
    body that works on element `i` alone."""
    var = index.var
    cond = unparen(cond)
    if cond.type != "binary_expression" or operator_of(cond) != "<":
        return None
    left, bound = unparen(cond.child_by_field_name("left")), cond.child_by_field_name("right")
    if left.type != "identifier" or ast.text(left) != var or var in ast.identifiers(bound):
        return None
    update = unparen(update)
    if update.type != "assignment_expression" or operator_of(update) != "+=":
        return None
    step = ast.affine(update.child_by_field_name("right"))
    if ast.text(update.child_by_field_name("left")) != var or step != {
        ("blockDim.x", "gridDim.x"): 1
    }:
        return None
    if any(ast.uses_builtin(st, b) for st in before for b in BUILTINS):
        return None
    if any(var in ast.identifiers(st) for st in before) or ast.identifiers(bound) & set(
        ast.local_declarations(body)
    ):
        return None
    for st in inner:
        if _unsafe(ast, st, var) or ({var} | ast.identifiers(bound)) & ast.assigned(st):
            return None
    type_node = decl.child_by_field_name("type")
    index_type = ast.text(type_node) if type_node is not None else "int"
    return MapKernel(ast, index, index_type, ast.text(bound), list(before), [], inner)


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
