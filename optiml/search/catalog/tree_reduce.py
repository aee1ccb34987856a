"""A block's shared-memory tree reduction done with warp shuffles: the textbook loop

    for (s = 1; s < blockDim.x; s *= 2) { if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s]; __syncthreads(); }

(or its strided-index and sequential-addressing forms, with +, max or min) halves the active
threads each step, diverges inside every warp, conflicts on banks and waits at log2(block) barriers.
It becomes: each warp combines its 32 values in registers with `__shfl_down_sync`, the warps' results
meet in shared memory, and the first warp combines those; the block's result lands in `sdata[0]`, as
before, so whatever the kernel does with it afterwards is kept. The loop is matched exactly (its
bounds, step and indexing), never guessed: only a loop that leaves the whole block's combination in
`sdata[0]` is replaced."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST, for_header, unparen, walk
from optiml.search.catalog._reduce import PREFIX, squash
from optiml.search.catalog.base import Context, Rewrite, Transformation

SHUFFLED = {"float": "f32", "double": "f64", "int": "i32", "unsigned": "u32", "unsigned int": "u32"}
IDENTITY = {
    ("add", "float"): "0.0f",
    ("add", "double"): "0.0",
    ("add", "int"): "0",
    ("add", "unsigned"): "0u",
    ("add", "unsigned int"): "0u",
    ("max", "float"): "-INFINITY",
    ("max", "double"): "-INFINITY",
    ("min", "float"): "INFINITY",
    ("min", "double"): "INFINITY",
}
MAX_FUNCTIONS = {
    "fmaxf": "max",
    "fmax": "max",
    "max": "max",
    "fminf": "min",
    "fmin": "min",
    "min": "min",
}


@dataclass
class _Tree:
    array: str  # the shared array
    op: str  # add | max | min
    combine: str  # how two values combine, as a format with {a} and {b}
    tid: str  # the name (or expression) that is threadIdx.x
    loop: Node  # the for statement replaced
    counter: str | None = None  # the loop's variable where it is declared before the loop
    ctype: str = ""  # the array's element type, read off its declaration once the loop matched


class TreeReduce(Transformation):
    name = "tree_reduce"
    addresses = frozenset({"latency", "l1_shared", "bank_conflicts", "dram"})
    description = (
        "a shared-memory tree reduction in a block -> warp shuffles, one barrier per level of warps"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            tree = _match(ctx)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError):
            return []  # code of a shape the analysis did not foresee: no proposal
        if tree is None:
            return []
        ast = ctx.ast
        block = ctx.case.block[0]
        indent = ast.indent_of(tree.loop)
        text = "\n".join(_replacement(tree, block, indent))
        definition = ast.definition({(tree.loop.start_byte, tree.loop.end_byte): text.lstrip()})
        return [
            Rewrite(
                params={"warps": block // 32},
                summary=(
                    f"the tree reduction of `{tree.array}` as warp shuffles: {block // 32} warps "
                    "combine in registers, then one warp combines their results (3 barriers "
                    f"instead of {block.bit_length() - 1})"
                ),
                variant=ctx.rewrite(definition),
            )
        ]


def _replacement(tree: _Tree, block: int, indent: str) -> list[str]:
    v, o = f"{PREFIX}v", f"{PREFIX}o"
    t, a = tree.tid, tree.array
    identity = IDENTITY[(tree.op, tree.ctype)]
    step = tree.combine.format(a=v, b=f"__shfl_down_sync(0xffffffffu, {v}, {o})")
    i1, i2 = indent + "    ", indent + "        "
    return [
        f"{indent}{{",
        f"{i1}// The tree over `{a}` as warp shuffles: each warp combines its 32 values in",
        f"{i1}// registers, the warps' results meet in `{a}`, the first warp combines those, and",
        f"{i1}// the block's result lands in {a}[0] as before.",
        f"{i1}{tree.ctype} {v} = {a}[{t}];",
        "#pragma unroll",
        f"{i1}for (int {o} = 16; {o} > 0; {o} >>= 1) {v} = {step};",
        f"{i1}__syncthreads();  // every thread has read its value before the warps' results go in",
        f"{i1}if ({t} % 32 == 0) {a}[{t} / 32] = {v};",
        f"{i1}__syncthreads();",
        f"{i1}if ({t} < 32) {{",
        f"{i2}{v} = {t} < {block // 32} ? {a}[{t}] : {identity};",
        "#pragma unroll",
        f"{i2}for (int {o} = 16; {o} > 0; {o} >>= 1) {v} = {step};",
        f"{i2}if ({t} == 0) {a}[0] = {v};",
        f"{i1}}}",
        f"{i1}__syncthreads();",
        f"{indent}}}",
    ]


def _match(ctx: Context) -> _Tree | None:
    ast = ctx.ast
    if PREFIX in ast.text(ast.body):
        return None
    blocks = {c.block for c in ctx.spec.cases()}
    if len(blocks) != 1:
        return None
    (block,) = blocks
    if block[1:] != (1, 1) or block[0] % 32 or block[0] & (block[0] - 1) or block[0] > 1024:
        return None  # one dimension, whole warps, a power of two (the tree's halving is exact)
    tids = _thread_x_names(ast)
    stmts = ast.statements()
    for at, st in enumerate(stmts):
        if st.type != "for_statement":
            continue
        tree = _tree_loop(ast, st, tids, block[0])
        if tree is None:
            continue
        # No thread may leave before the tree: its barriers and shuffles need the whole block.
        if any(n.type == "return_statement" for before in stmts[:at] for n in walk(before)):
            return None
        ctype = _shared_array_type(ast, tree, block[0])
        if ctype is None:
            return None
        tree.ctype = ctype
        if not _only_result_read_after(ast, tree, stmts[at + 1 :]):
            return None
        return tree
    return None


def _thread_x_names(ast: KernelAST) -> set[str]:
    """`threadIdx.x` and the locals declared (and never reassigned) as exactly it."""
    names = {"threadIdx.x"}
    assigned = ast.assigned(ast.body)
    for n in walk(ast.body):
        if n.type == "init_declarator":
            value = n.child_by_field_name("value")
            target = n.child_by_field_name("declarator")
            if value is None or target is None or target.type != "identifier":
                continue
            name = ast.text(target)
            exact = squash(ast.text(value)) in (
                "threadIdx.x",
                "(int)threadIdx.x",
                "(unsignedint)threadIdx.x",
            )
            if exact and name not in assigned:
                names.add(name)
    return names


def _tree_loop(ast: KernelAST, loop: Node, tids: set[str], block: int) -> _Tree | None:
    """The loop as one of the textbook tree reductions over a shared array, or None."""
    header = for_header(loop)
    if header is None:
        return None
    init, cond, update, body = header
    s, start = _init(ast, init)
    if s is None:
        return None
    sizes = {"blockDim.x", str(block)}
    c, u = squash(ast.text(cond)), squash(ast.text(update))
    doubling = (
        start == "1"
        and c in {f"{s}<{x}" for x in sizes}
        and u
        in (
            f"{s}*=2",
            f"{s}<<=1",
            f"{s}={s}*2",
            f"{s}=2*{s}",
            f"{s}+={s}",
        )
    )
    halving = (
        start in {f"{x}/2" for x in sizes} | {f"{x}>>1" for x in sizes} | {str(block // 2)}
        and c in (f"{s}>0", f"{s}>=1", f"{s}!=0")
        and u in (f"{s}/=2", f"{s}>>=1", f"{s}={s}/2", f"{s}={s}>>1")
    )
    if not (doubling or halving):
        return None
    stmts = (
        [n for n in body.named_children if n.type != "comment"]
        if body.type == "compound_statement"
        else [body]
    )
    if len(stmts) < 2 or squash(ast.text(stmts[-1])) != "__syncthreads();":
        return None
    stmts = stmts[:-1]
    local = None  # reduce1's `int index = 2 * s * tid;`
    if len(stmts) == 2 and stmts[0].type == "declaration":
        local = _strided_index(ast, stmts[0], s, tids)
        if local is None:
            return None
        stmts = stmts[1:]
    if (
        len(stmts) != 1
        or stmts[0].type != "if_statement"
        or stmts[0].child_by_field_name("alternative")
    ):
        return None
    guard = squash(ast.text(stmts[0].child_by_field_name("condition")))
    step = stmts[0].child_by_field_name("consequence")
    if step.type == "compound_statement":
        inner = [n for n in step.named_children if n.type != "comment"]
        if len(inner) != 1:
            return None
        step = inner[0]
    for t in tids:
        if local is not None:
            ok = doubling and guard in (f"{local}<blockDim.x", f"{local}<{block}")
            at = local
        elif doubling:
            ok = guard in (
                f"{t}%(2*{s})==0",
                f"({t}%(2*{s}))==0",
                f"{t}%({s}*2)==0",
                f"({t}%({s}*2))==0",
                f"({t}&(2*{s}-1))==0",
            )
            at = t
        else:
            ok = guard in (f"{t}<{s}", f"{s}>{t}")
            at = t
        if not ok:
            continue
        found = _combine(ast, step, at, s)
        if found is None:
            continue
        array, op, combine = found
        counter = s if init.type != "declaration" else None
        return _Tree(array, op, combine, t, loop, counter)
    return None


def _init(ast: KernelAST, init: Node) -> tuple[str | None, str | None]:
    """`unsigned int s = 1` (or `s = 1`): the loop variable and its start."""
    if init.type == "declaration":
        decls = init.children_by_field_name("declarator")
        if len(decls) != 1 or decls[0].type != "init_declarator":
            return None, None
        name = decls[0].child_by_field_name("declarator")
        value = decls[0].child_by_field_name("value")
        if name is None or name.type != "identifier" or value is None:
            return None, None
        return ast.text(name), squash(ast.text(value))
    if (
        init.type == "assignment_expression"
        and ast.text(init.child_by_field_name("operator")) == "="
    ):
        left = init.child_by_field_name("left")
        if left is not None and left.type == "identifier":
            return ast.text(left), squash(ast.text(init.child_by_field_name("right")))
    return None, None


def _strided_index(ast: KernelAST, decl: Node, s: str, tids: set[str]) -> str | None:
    decls = decl.children_by_field_name("declarator")
    if len(decls) != 1 or decls[0].type != "init_declarator":
        return None
    name = decls[0].child_by_field_name("declarator")
    value = squash(ast.text(decls[0].child_by_field_name("value")))
    if name is None or name.type != "identifier":
        return None
    forms = (
        {f"2*{s}*{t}" for t in tids} | {f"{t}*2*{s}" for t in tids} | {f"2*{t}*{s}" for t in tids}
    )
    return ast.text(name) if value in forms else None


def _combine(ast: KernelAST, step: Node, at: str, s: str) -> tuple[str, str, str] | None:
    """`a[at] += a[at + s]`, `a[at] = a[at] + a[at + s]` or `a[at] = fmaxf(a[at], a[at + s])`:
    the array, the operator and its format."""
    if step.type != "expression_statement":
        return None
    e = unparen(step.named_children[0]) if step.named_children else None
    if e is None or e.type != "assignment_expression":
        return None
    left, right = e.child_by_field_name("left"), unparen(e.child_by_field_name("right"))
    op = ast.text(e.child_by_field_name("operator"))
    if left.type != "subscript_expression":
        return None
    array = ast.text(unparen(left.child_by_field_name("argument")))
    here, there = f"{array}[{at}]", {f"{array}[{at}+{s}]", f"{array}[{s}+{at}]"}
    if squash(ast.text(left)) != here:
        return None
    r = squash(ast.text(right))
    if op == "+=" and r in there:
        return array, "add", "{a} + {b}"
    if op != "=":
        return None
    if right.type == "binary_expression" and ast.text(right.child_by_field_name("operator")) == "+":
        terms = {squash(ast.text(right.child_by_field_name(k))) for k in ("left", "right")}
        if here in terms and terms - {here} <= there and len(terms) == 2:
            return array, "add", "{a} + {b}"
    if right.type == "call_expression":
        fn = ast.text(right.child_by_field_name("function"))
        args = right.child_by_field_name("arguments").named_children
        if fn in MAX_FUNCTIONS and len(args) == 2:
            terms = {squash(ast.text(x)) for x in args}
            if here in terms and terms - {here} <= there and len(terms) == 2:
                return array, MAX_FUNCTIONS[fn], f"{fn}({{a}}, {{b}})"
    return None


def _shared_array_type(ast: KernelAST, tree: _Tree, block: int) -> str | None:
    """The element type of the array, if it is a 1-D `__shared__` array of a shuffled type with
    room for the block."""
    for decl in ast.shared_declarations():
        for d in decl.children_by_field_name("declarator"):
            if d.type != "array_declarator":
                continue
            name = d.child_by_field_name("declarator")
            if name is None or ast.text(name) != tree.array or name.type != "identifier":
                continue
            kind = decl.child_by_field_name("type")
            ctype = " ".join(ast.text(kind).split()) if kind is not None else ""
            size = d.child_by_field_name("size")
            if ctype not in SHUFFLED or (tree.op, ctype) not in IDENTITY or size is None:
                return None
            try:
                length = int(ast.text(size), 0)
            except ValueError:
                length = None
            return None if length is not None and length < block else ctype
    return None


def _only_result_read_after(ast: KernelAST, tree: _Tree, after: list[Node]) -> bool:
    """After the loop the array is only read at [0] (the block's result, which stays there), and
    the loop's variable, where it outlives the loop, is not read (the loop is gone)."""
    for st in after:
        if tree.counter is not None and tree.counter in ast.identifiers(st):
            return False
        for n in walk(st):
            if n.type == "subscript_expression":
                arg = unparen(n.child_by_field_name("argument"))
                if ast.text(arg) == tree.array and squash(ast.text(n)) != f"{tree.array}[0]":
                    return False
            if n.type == "assignment_expression":
                left = n.child_by_field_name("left")
                if left is not None and tree.array in ast.identifiers(left):
                    return False
    return True
