"""Padding of shared-memory arrays against bank conflicts: a `__shared__ T a[R][C]` that a warp
reads or writes down a column (lanes a multiple of 32 words apart) gets its rows lengthened to
C + pad, the smallest pad that spreads the lanes over the banks. The conflict is computed from the
affine forms of the subscripts and the launch's block shape, never assumed."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import Affine, KernelAST, inside, unparen, walk, words
from optiml.search.catalog._two_d import (
    affine_env,
    const_value,
    constants,
    declared_name,
    element_bytes,
    paren,
)
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation

WARP = 32
BANKS = 32
LANES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass
class _Array:
    name: str
    decl: Node
    size: Node  # the last dimension's size expression, which the pad extends
    dims: list[int]
    bytes: int  # of one element
    # Per access: each subscript's lane coefficients (threadIdx.x, .y, .z), in elements.
    accesses: list[list[tuple[int, int, int]]]


class SmemPadding(Transformation):
    name = "smem_padding"
    addresses = frozenset({"bank_conflicts", "l1_shared"})
    description = "pad shared-memory rows so that column accesses spread over the 32 banks"

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            blocks = {c.block for c in ctx.spec.cases()}
            arrays = _arrays(ctx, blocks)
        except (ValueError, KeyError, AttributeError, TypeError):
            return []
        if arrays is None:
            return []
        total = sum(_bytes(a.dims, a.bytes) for a in arrays.values())
        replace = {}
        changes = []
        for a in arrays.values():
            before = _degrees(a, a.dims, blocks)
            best = None
            for pad in range(1, max(1, 16 // a.bytes) + 1):
                dims = a.dims[:-1] + [a.dims[-1] + pad]
                after = _degrees(a, dims, blocks)
                key = (max(after), sum(after), pad)
                if best is None or key < best[0]:
                    best = (key, pad, after)
            if best is None or best[0][0] >= max(before, default=1):
                continue
            _, pad, after = best
            grown = (
                total + _bytes(a.dims[:-1] + [a.dims[-1] + pad], a.bytes) - _bytes(a.dims, a.bytes)
            )
            if grown > STATIC_SMEM:
                continue
            total = grown
            text = ctx.ast.text(a.size)
            replace[(a.size.start_byte, a.size.end_byte)] = f"{paren(text)} + {pad}"
            changes.append(f"{a.name} +{pad} ({max(before)}-way -> {max(after)}-way)")
        if not replace:
            return []
        return [
            Rewrite(
                params={},
                summary=f"pad shared rows against bank conflicts: {', '.join(changes)}",
                variant=ctx.rewrite(ctx.ast.definition(replace)),
            )
        ]


def _arrays(ctx: Context, blocks: set[tuple[int, int, int]]) -> dict[str, _Array] | None:
    """The kernel's static shared arrays of two or more dimensions whose every use is a full
    subscript with lane strides that are constants and inner subscripts that provably stay inside
    their dimension (so a longer row changes no element's meaning). None if any array is used
    some other way."""
    ast = ctx.ast
    consts = constants(ctx)
    env = affine_env(ast, [ast.body], keep=set())
    ranges = _loop_ranges(ast, consts)
    # Names that hold the same value in every lane of a warp: scalar parameters, names from
    # outside the kernel, and loop variables whose loops no thread index steers.
    local = set(ast.local_declarations(ast.body))
    uniform = set(ranges) | {
        w for w in words(ast.text(ast.body)) if w not in local and w not in ast.pointers
    }
    out: dict[str, _Array] = {}
    for decl in ast.shared_declarations():
        type_node = decl.child_by_field_name("type")
        size = element_bytes(ctx, ast.text(type_node)) if type_node is not None else None
        for d in decl.children_by_field_name("declarator"):
            dims, last = _dims(ast, d, consts)
            name = declared_name(ast, d)
            if dims is None or len(dims) < 2 or size is None or name is None:
                continue
            out[name] = _Array(name, decl, last, dims, size, [])
    for name, array in out.items():
        for n in walk(ast.body):
            if n.type != "identifier" or ast.text(n) != name or inside(n, array.decl):
                continue
            subscripts = _subscripts(n)
            if len(subscripts) != len(array.dims) or _address_taken(n, len(subscripts)):
                return None
            forms = [ast.affine(s, env) for s in subscripts]
            if any(f is None for f in forms):
                return None
            forms = [_fold(f, consts) for f in forms]
            for f, dim in zip(forms[1:], array.dims[1:], strict=True):
                span = _interval(f, blocks, ranges)
                if span is None or span[0] < 0 or span[1] >= dim:
                    return None
            lanes = [_lanes(f, uniform) for f in forms]
            if any(lane is None for lane in lanes):
                continue
            array.accesses.append(lanes)
    return {k: v for k, v in out.items() if v.accesses}


def _dims(
    ast: KernelAST, declarator: Node, consts: dict[str, int]
) -> tuple[list[int] | None, Node]:
    dims: list[int] = []
    last = None
    d = declarator
    if d.type == "init_declarator":
        return None, d
    while d is not None and d.type == "array_declarator":
        size = d.child_by_field_name("size")
        value = const_value(ast.text(size), consts) if size is not None else None
        if value is None or value <= 0:
            return None, d
        dims.insert(0, value)
        last = last or size
        d = d.child_by_field_name("declarator")
    return dims, last


def _subscripts(ident: Node) -> list[Node]:
    """The index expressions of `a[i][j]...` around an occurrence of `a`, outermost first; a use
    that is not a subscript chain has none."""
    out = []
    node = ident
    while True:
        parent = node.parent
        while parent is not None and parent.type == "parenthesized_expression":
            node, parent = parent, parent.parent
        if parent is None or parent.type != "subscript_expression":
            break
        if parent.child_by_field_name("argument") != node:
            break
        args = parent.child_by_field_name("indices")
        if args is None or len(args.named_children) != 1:
            return []
        out.append(args.named_children[0])
        node = parent
    return out


def _address_taken(ident: Node, depth: int) -> bool:
    """Whether `&a[i][j]` takes an element's address (a pointer may walk past the row)."""
    node = ident
    for _ in range(depth):
        node = node.parent
        while node.type == "parenthesized_expression":
            node = node.parent
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        parent = parent.parent
    if parent is None or parent.type != "pointer_expression":
        return False
    op = parent.child_by_field_name("operator")
    return op is not None and op.type == "&"


def _fold(form: Affine, consts: dict[str, int]) -> Affine:
    """A form with the compile-time constants among its atoms multiplied in."""
    out: Affine = {}
    for mono, coef in form.items():
        rest = []
        for atom in mono:
            if atom in consts:
                coef *= consts[atom]
            else:
                rest.append(atom)
        key = tuple(rest)
        out[key] = out.get(key, 0) + coef
    return {m: c for m, c in out.items() if c}


def _loop_ranges(ast: KernelAST, consts: dict[str, int]) -> dict[str, tuple[int, int] | None]:
    """For each loop variable, the values it takes when the loop's bounds are constants (None
    when they are not, but the variable is still the same across a warp), by name; loops whose
    header reads a thread index are left out (their variable differs between lanes)."""
    out: dict[str, tuple[int, int] | None] = {}
    for n in walk(ast.body):
        if n.type != "for_statement":
            continue
        init = n.child_by_field_name("initializer")
        cond = n.child_by_field_name("condition")
        update = n.child_by_field_name("update")
        if init is None or cond is None or update is None or init.type != "declaration":
            continue
        decls = init.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            continue
        var = declared_name(ast, decls[0])
        header = [decls[0].child_by_field_name("value"), cond, update]
        if any(ast.uses_builtin(h, "threadIdx") for h in header):
            continue
        if not all(_uniform_name(ast, w, var, consts) for h in header for w in ast.identifiers(h)):
            continue
        out[var] = _trip(ast, var, decls[0].child_by_field_name("value"), cond, update, consts)
    return out


def _uniform_name(ast: KernelAST, name: str, var: str, consts: dict[str, int]) -> bool:
    if name == var or name in consts:
        return True
    p = ast.params.get(name)
    return p is not None and not p.is_pointer


def _trip(
    ast: KernelAST, var: str, start: Node, cond: Node, update: Node, consts: dict[str, int]
) -> tuple[int, int] | None:
    """The first and last values of `for (v = A; v < B; v += S)` (or `++v`, `v++`, `<=`)."""
    first = const_value(ast.text(start), consts)
    cond = unparen(cond)
    if first is None or cond.type != "binary_expression":
        return None
    op = cond.child_by_field_name("operator")
    left = unparen(cond.child_by_field_name("left"))
    if op is None or op.type not in ("<", "<=") or ast.text(left) != var:
        return None
    end = const_value(ast.text(cond.child_by_field_name("right")), consts)
    if end is None:
        return None
    end = end - 1 if op.type == "<" else end
    update = unparen(update)
    text = ast.text(update).replace(" ", "")
    if text in (f"++{var}", f"{var}++"):
        step = 1
    elif update.type == "assignment_expression" and text.startswith(f"{var}+="):
        step = const_value(ast.text(update.child_by_field_name("right")), consts)
    else:
        return None
    if step is None or step <= 0 or end < first:
        return None
    return first, first + (end - first) // step * step


def _lanes(form: Affine, uniform: set[str]) -> tuple[int, int, int] | None:
    """The subscript's coefficients on threadIdx.x, .y, .z; None if it depends on anything else
    that may differ between the lanes of a warp."""
    coefs = [0, 0, 0]
    for mono, coef in form.items():
        lanes = [a for a in mono if a in LANES]
        if lanes:
            if len(mono) != 1:
                return None
            coefs[LANES.index(lanes[0])] += coef
        elif not all(a in uniform or a.startswith(("blockIdx.", "blockDim.")) for a in mono):
            return None
    return coefs[0], coefs[1], coefs[2]


def _interval(form: Affine, blocks: set, ranges: dict) -> tuple[int, int] | None:
    """The values an inner subscript takes over the block and the loops around it."""
    lo = hi = 0
    for mono, coef in form.items():
        if not mono:
            lo, hi = lo + coef, hi + coef
            continue
        if len(mono) != 1:
            return None
        atom = mono[0]
        if atom in LANES:
            span = (0, max(b[LANES.index(atom)] for b in blocks) - 1)
        elif ranges.get(atom) is not None:
            span = ranges[atom]
        else:
            return None
        a, b = coef * span[0], coef * span[1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _degrees(array: _Array, dims: list[int], blocks: set) -> list[int]:
    """For each access, the worst number of distinct words one bank serves for one warp."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    out = []
    for lanes in array.accesses:
        coef = [sum(s * lane[d] for s, lane in zip(strides, lanes, strict=True)) for d in range(3)]
        out.append(max(_degree(coef, array.bytes, b) for b in blocks))
    return out


def _degree(coef: list[int], size: int, block: tuple[int, int, int]) -> int:
    """Bank conflict degree of one access for every warp of a block: an access of 8 or 16 bytes is
    served a half or a quarter of a warp at a time, narrower ones a whole warp at once."""
    bx, by, bz = block
    threads = bx * by * bz
    group = max(1, WARP * 4 // size) if size > 4 else WARP
    worst = 1
    for first in range(0, threads, group):
        banks: dict[int, set[int]] = {}
        for t in range(first, min(first + group, threads)):
            tx, ty, tz = t % bx, (t // bx) % by, t // (bx * by)
            element = coef[0] * tx + coef[1] * ty + coef[2] * tz
            start = element * size // 4
            for word in range(start, start + max(1, size // 4)):
                banks.setdefault(word % BANKS, set()).add(word)
        worst = max(worst, max(len(w) for w in banks.values()))
    return worst


def _bytes(dims: list[int], size: int) -> int:
    total = size
    for d in dims:
        total *= d
    return total
