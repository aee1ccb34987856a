"""Where a kernel, as the reference its rewrites are checked against, rounds in a way that a correct
rewrite need not reproduce: notes for `optiml check` and the editor's hover, read off the kernel's
tree.

- Every thread adds a float into one address with `atomicAdd`: the sum is rounded once per thread,
  in no fixed order, and terms under half an ulp of the running total are lost (2^24 additions of
  ~4e-8 into a total near 1 lose a few per cent of it). A rewrite that sums per block first is
  usually closer to the exact sum than the kernel itself, and can fail a check against it.
- A float accumulates a loop's terms one at a time, with the default tolerance: a rewrite that
  splits the sum (a warp or block per row, vector loads) rounds differently, and where the sum is
  small against its terms the difference can exceed rtol = atol = 1e-5.
"""

from __future__ import annotations

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST, address_of, inside, unparen, walk
from optiml.cuda.types import DTYPES
from optiml.spec import Spec

FLOATS = frozenset({"float", "double"})
ATOMIC_ADDS = frozenset({"atomicAdd", "atomicAdd_block", "atomicAdd_system"})
LOOPS = frozenset({"for_statement", "while_statement", "do_statement"})
BUILTINS = frozenset({"threadIdx", "blockIdx"})


def rounding_notes(ast: KernelAST, spec: Spec | None) -> list[str]:
    """The notes for this kernel (none where neither pattern is found)."""
    per_thread = _thread_dependent(ast)
    notes = []
    seen: set[str] = set()
    for name, call in ast.calls(ast.body):
        if name not in ATOMIC_ADDS:
            continue
        target = _single_float_address(ast, call, per_thread, spec)
        if target is not None and target not in seen:
            seen.add(target)
            notes.append(
                f"`{name}({target}, ...)`: every thread adds a float into the same address, so the "
                "sum is rounded once per thread in no fixed order, and terms under half an ulp of "
                "the running total are lost; a rewrite that sums per block first can be closer to "
                "the exact sum than this kernel and still fail a check against it: a NumPy "
                "reference (`reference: file.py:function` in the spec) that sums in float64 "
                "checks both against the exact sum"
            )
    if spec is not None and spec.rtol is None and spec.atol is None:
        for acc in _loop_accumulators(ast):
            notes.append(
                f"`{acc}` adds a loop's float terms one at a time: a rewrite that splits the sum (a "
                "warp or block per row, vector loads) rounds differently, and where the sum is "
                "small against its terms the difference can exceed the default tolerance "
                "(rtol = atol = 1e-5): give `tol` in the spec if such differences are acceptable"
            )
    return notes


def _thread_dependent(ast: KernelAST) -> set[str]:
    """Local names whose value depends on the thread (threadIdx or blockIdx, directly or through
    another such name), in declaration order."""
    names: set[str] = set()
    for n in walk(ast.body):
        if n.type == "init_declarator":
            value = n.child_by_field_name("value")
            target = n.child_by_field_name("declarator")
            if value is None or target is None:
                continue
            used = ast.identifiers(value)
            if used & (BUILTINS | names):
                names |= ast.identifiers(target) - used
        elif n.type == "assignment_expression":
            left = n.child_by_field_name("left")
            right = n.child_by_field_name("right")
            if (
                left is not None
                and left.type == "identifier"
                and right is not None
                and ast.identifiers(right) & (BUILTINS | names)
            ):
                names.add(ast.text(left))
    return names


def _single_float_address(
    ast: KernelAST, call: Node, per_thread: set[str], spec: Spec | None
) -> str | None:
    """The address text of an `atomicAdd` whose address is the same for every thread and holds a
    float (the pointer's element type, or its buffer's in the spec), else None."""
    args = call.child_by_field_name("arguments")
    if args is None or len(args.named_children) != 2:
        return None
    found = address_of(ast, args.named_children[0])
    if found is None:
        return None
    param, index = found
    if index is not None and ast.identifiers(index) & (BUILTINS | per_thread):
        return None
    buffer = spec.buffer(param) if spec is not None else None
    is_float = (
        DTYPES[buffer.dtype].is_float
        if buffer is not None
        else ast.params[param].type_text in FLOATS
    )
    return ast.text(unparen(args.named_children[0])) if is_float else None


def _loop_accumulators(ast: KernelAST) -> list[str]:
    """Float locals declared outside a loop that the loop adds to with `+=`, once per iteration."""
    floats = {}
    for n in walk(ast.body):
        if n.type == "declaration":
            kind = n.child_by_field_name("type")
            if kind is None or ast.text(kind) not in FLOATS:
                continue
            for d in n.children_by_field_name("declarator"):
                target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
                if target is not None and target.type == "identifier":
                    floats[ast.text(target)] = n
    out: list[str] = []
    for loop in walk(ast.body):
        if loop.type not in LOOPS:
            continue
        for n in walk(loop):
            if (
                n.type != "assignment_expression"
                or ast.text(n.child_by_field_name("operator")) != "+="
            ):
                continue
            left = n.child_by_field_name("left")
            name = ast.text(left) if left is not None and left.type == "identifier" else None
            decl = floats.get(name)
            if decl is None or inside(decl, loop) or name in out:
                continue
            out.append(name)
    return out
