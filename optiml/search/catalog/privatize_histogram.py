"""Histogram privatization: a kernel whose only writes are `atomicAdd(&bins[b], v)` into a small
buffer, b data-dependent and proven in range, gets per-block copies of the histogram in shared
memory, filled with shared-memory atomics in a grid-stride loop and merged into `bins` with one
global atomic per non-zero bin and block."""

from __future__ import annotations

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST, unparen, words
from optiml.expr import Expr, ExprError
from optiml.lift import Lifted, lift
from optiml.lift.ranges import indices_within
from optiml.search.catalog._reduce import (
    INDENT,
    PREFIX,
    Atomic,
    Edit,
    ElementKernel,
    analyse,
    comparisons,
    definition,
    dominating,
    element_loop,
    grid,
    interval,
    is_unsigned,
    only_in_addresses,
    slots,
    spec_values,
    squash,
    uniform_lines,
    vector_reads,
)
from optiml.search.catalog.base import STATIC_SMEM, Context, Rewrite, Transformation

MAX_BINS = 12 * 1024
BIN_TYPES = frozenset({"f32", "i32", "u32"})  # 4-byte counters: shared atomics, one bank each
# 64-bit bins counted one at a time: a block's private counts fit 32 bits where the element index
# does (at most 2^32 - 1 elements a block), so the copies are 4-byte too and each count is merged
# into its 64-bit bin once. Any other increment, or a 64-bit index, keeps them out.
WIDE_BINS = frozenset({"u64"})
INDEX_32 = frozenset({"int", "unsigned", "unsigned int", "uint32_t", "int32_t"})
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024
SMEM_RESERVED = 1024  # the runtime's share of each block's shared memory

# (layout, copies, block, unroll, blocks per SM), best guess first. "lanes": bin b of lane l's copy
# at b * copies + l % copies, so that the lanes of a warp never share a bank for copies = 32 (and a
# warp's atomics never collide on one address); "warps": warp w's copy is w % copies, whole.
CONFIGS = [
    ("lanes", 32, 512, 4, 2),
    ("lanes", 32, 256, 4, 4),
    ("lanes", 32, 1024, 2, 1),
    ("lanes", 8, 512, 4, 2),
    ("warps", 4, 512, 4, 2),
    ("warps", 2, 1024, 2, 2),
    ("warps", 1, 256, 4, 4),
]
CAST_UNSIGNED = ("(unsigned)", "(unsignedint)", "(uint32_t)", "(size_t)")


class PrivatizeHistogram(Transformation):
    name = "privatize_histogram"
    addresses = frozenset({"atomics", "l2", "latency"})
    description = (
        "per-block shared-memory copies of a small histogram, shared atomics in a grid-stride "
        "loop, one global atomic per bin and block"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            return self._propose(ctx)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError, ExprError):
            return []  # code of a shape the analysis did not foresee: no proposal

    def _propose(self, ctx: Context) -> list[Rewrite]:
        ek = analyse(ctx)
        if ek is None or not ek.atomics:
            return []
        pointer = ek.atomics[0].pointer
        param = ek.ast.params[pointer]
        dtype = ek.dtype(pointer)
        lengths = ek.lengths(pointer)
        if (
            any(a.pointer != pointer for a in ek.atomics)
            or any(a.function != "atomicAdd" or a.value is None for a in ek.atomics)
            or any(a.index is None for a in ek.atomics)
            or param.pointer_depth != 1
            or dtype is None
            or (dtype.code not in BIN_TYPES and not _counted_by_ones(ek, dtype.code))
            or lengths is None
            or not all(0 < n <= MAX_BINS for n in lengths)
        ):
            return []
        bins = _bins(ek, pointer)
        if bins is None or not only_in_addresses(ek, {pointer}):
            return []
        if not all(_in_range(ek, a, lengths, bins[0]) for a in ek.atomics) and not _proven(
            ctx, pointer
        ):
            return []
        vectors = vector_reads(ek)
        width = 4 if vectors else 1
        out = []
        seen = set()
        # the private copies' type: the bins' own, or 32-bit counts of 64-bit bins
        private = "unsigned int" if dtype.code in WIDE_BINS else param.type_text
        for rank, (layout, copies, block, loads_in_flight, per_sm) in enumerate(CONFIGS):
            unroll = slots(loads_in_flight, vectors)
            size = copies * max(lengths) * 4
            if size > SMEM_PER_BLOCK or per_sm * (size + SMEM_RESERVED) > SMEM_PER_SM:
                continue
            if (layout, copies, block, unroll, per_sm) in seen:
                continue
            seen.add((layout, copies, block, unroll, per_sm))
            body, smem = _body(
                ek, pointer, private, param.type_text, bins, layout, copies, block, unroll
            )
            launch = ([grid(ek, block * unroll * width, per_sm)], [str(block)], smem)
            if layout == "lanes":
                where = f"{copies} copies per lane"
            else:
                where = f"{copies} copies per warp group" if copies > 1 else "1 copy per block"
            loads = f"{unroll * max(1, len(vectors))}x {'16-byte' if vectors else 'scalar'} loads"
            out.append(
                Rewrite(
                    params={
                        "layout": layout,
                        "copies": copies,
                        "block": block,
                        "unroll": unroll,
                        "blocks_per_sm": per_sm,
                        "vector": bool(vectors),
                    },
                    summary=(
                        f"shared-memory histogram, {where}, grid-stride {loads}, one atomicAdd per "
                        f"bin and block ({block} threads, {per_sm} block{'s' if per_sm > 1 else ''}"
                        "/SM)"
                    ),
                    variant=ctx.rewrite(definition(ek, body, block, per_sm), launch=launch),
                    weight=round(1.0 - 0.1 * rank, 2),
                )
            )
        return out


def _counted_by_ones(ek: ElementKernel, code: str) -> bool:
    """64-bit bins whose every atomic adds 1, in a kernel whose element index is 32-bit."""
    index_type = " ".join(w for w in ek.index_type.split() if w != "const")
    return (
        code in WIDE_BINS
        and index_type in INDEX_32
        and all(a.value is not None and _is_one(ek.ast, a.value) for a in ek.atomics)
    )


def _is_one(ast: KernelAST, value: Node) -> bool:
    """`1`, `1ULL`, `(unsigned long long)1`, parenthesized or not."""
    value = unparen(value)
    if value.type == "cast_expression":
        value = unparen(value.child_by_field_name("value"))
    return value.type == "number_literal" and ast.int_literals(value) == [1]


def _proven(ctx: Context, pointer: str) -> bool:
    """The bins' range proven on the lifted model (a bin computed through local variables,
    clamps, float binning), where the text's own reading cannot tell."""
    lifted = lift(ctx.source, ctx.kernel, ctx.spec)
    return isinstance(lifted, Lifted) and indices_within(lifted, ctx.spec, pointer)


def _bins(ek: ElementKernel, pointer: str) -> tuple[str, str, int | None] | None:
    """The histogram's length: (kernel expression, spec expression, value if a constant). The
    kernel needs it as an expression of its own scalar parameters, or as a literal."""
    buf = ek.ctx.spec.buffer(pointer)
    try:
        expr = Expr.parse(buf.length)
    except ExprError:
        return None
    names = expr.names()
    # a length of literals and the file's constants (`NUM_BINS`) is one number at every size
    if not names - set(ek.ctx.spec.constants) and not words(buf.length) & {"cdiv", "min", "max"}:
        values = spec_values(ek.ctx, buf.length)
        if values is None or len(set(values)) != 1:
            return None
        return str(values[0]), str(values[0]), values[0]
    scalars = {p.name for p in ek.ctx.kernel.params if not p.is_pointer}
    if words(buf.length) & {"cdiv", "min", "max"} or not names <= scalars:
        return None
    if names & ek.ast.assigned(ek.ast.body):
        return None
    return f"({buf.length})", buf.length, None


def _in_range(ek: ElementKernel, atomic: Atomic, lengths: list[int], bins_text: str) -> bool:
    """Whether the bin index is in [0, length) wherever the atomic runs: from the conditions that
    guard it (`b >= 0 && b < nbins`, an early return), its type, or the spec's input ranges."""
    ast = ek.ast
    b = atomic.index
    if any(name in ast.assigned(r) for r in ek.nodes for name in ast.identifiers(b)):
        return False
    if ast.has(b, "call_expression", "assignment_expression", "update_expression"):
        return False
    text = squash(ast.text(b))
    cases = range(len(lengths))
    spans = [interval(ek, b, c) for c in cases]
    low = is_unsigned(ek, b) or all(s is not None and s[0] >= 0 for s in spans)
    high = all(s is not None and s[1] < n for s, n in zip(spans, lengths, strict=True))
    facts = [
        f for cond, truth in dominating(ek, atomic.call) for f in comparisons(ast, cond, truth)
    ]

    assigned = ast.assigned(ast.body)

    def values(expr: str) -> list | None:
        if words(expr) & assigned:
            return None
        if squash(expr) == squash(bins_text):
            return list(lengths)
        return spec_values(ek.ctx, expr)

    def below(expr: str, slack: int) -> bool:  # expr + slack <= length at every size
        v = values(expr)
        return v is not None and all(
            isinstance(x, int) and x + slack <= n for x, n in zip(v, lengths, strict=True)
        )

    def at_least(expr: str, floor: int) -> bool:
        v = values(expr)
        return v is not None and all(isinstance(x, int) and x >= floor for x in v)

    for left, op, right in facts:
        unsigned_left = any(
            left.startswith(c) and squash(left[len(c) :]) == text for c in CAST_UNSIGNED
        )
        if (
            (left == text or unsigned_left)
            and op in ("<", "<=")
            and below(right, 0 if op == "<" else 1)
        ):
            high = True
            low = low or unsigned_left
        if left == text and op in (">=", ">") and at_least(right, 0 if op == ">=" else -1):
            low = True
        if right == text and op in (">", ">=") and below(left, 0 if op == ">" else 1):
            high = True
        if right == text and op in ("<=", "<") and at_least(left, 0 if op == "<=" else -1):
            low = True
    return low and high


def _body(
    ek: ElementKernel,
    pointer: str,
    ctype: str,
    bins_type: str,
    bins: tuple[str, str, int | None],
    layout: str,
    copies: int,
    block: int,
    unroll: int,
) -> tuple[list[str], str]:
    """The new kernel body (shared histogram, element loop, merge) and the launch's smem."""
    p, ind = PREFIX, INDENT
    bins_kernel, bins_spec, constant = bins
    lines = list(uniform_lines(ek))
    total = f"{copies} * {p}bins" if copies > 1 else f"{p}bins"
    if layout == "lanes":
        lines += [
            f"{ind}// {copies} copies of the histogram in shared memory, bin-major: lane l counts "
            f"into copy l % {copies},",
            f"{ind}// so that the lanes of a warp spread their atomics over the banks.",
        ]
    else:
        what = f"{copies} copies" if copies > 1 else "A copy"
        lines.append(
            f"{ind}// {what} of the histogram in shared memory"
            + (f", warp w counting into copy w % {copies}." if copies > 1 else " per block.")
        )
    if constant is not None and copies * constant * 4 <= STATIC_SMEM:
        smem = "0"
        lines += [
            f"{ind}constexpr int {p}bins = {constant};",
            f"{ind}__shared__ {ctype} {p}hist[{copies} * {p}bins];",
        ]
    else:
        length = str(constant) if constant is not None else f"({bins_spec})"
        smem = f"{copies * 4} * {length}"
        lines += [
            f"{ind}const int {p}bins = (int){bins_kernel};"
            if constant is None
            else f"{ind}constexpr int {p}bins = {constant};",
            f"{ind}extern __shared__ __align__(16) unsigned char {p}smem[];",
            f"{ind}{ctype}* {p}hist = reinterpret_cast<{ctype}*>({p}smem);",
        ]
    lines += [
        f"{ind}for (int {p}j = threadIdx.x; {p}j < {total}; {p}j += {block}) {{",
        f"{ind}{ind}{p}hist[{p}j] = 0;",
        f"{ind}}}",
        f"{ind}__syncthreads();",
    ]
    if layout == "lanes":
        lines.append(f"{ind}{ctype}* {p}mine = {p}hist + (threadIdx.x & {copies - 1});")
    elif copies > 1:
        lines.append(
            f"{ind}{ctype}* {p}mine = {p}hist + ((threadIdx.x >> 5) & {copies - 1}) * {p}bins;"
        )
    else:
        lines.append(f"{ind}{ctype}* {p}mine = {p}hist;")
    stride = f" * {copies}" if layout == "lanes" and copies > 1 else ""

    def edits(slot: int) -> dict[int, Edit]:
        del slot  # every unroll slot counts into the same copy
        return {
            a.address.id: (lambda sub, a=a: f"{p}mine + ({sub(a.index)}){stride}")
            for a in ek.atomics
        }

    lines += element_loop(ek, block=block, unroll=unroll, vectors=vector_reads(ek), edits=edits)
    if layout == "lanes":
        # Lane t starts at copy t, so that a warp's reads of one bin's copies hit 32 banks.
        cell = f"{p}j * {copies} + (({p}r + threadIdx.x) & {copies - 1})"
    else:
        cell = f"{p}r * {p}bins + {p}j"
    lines += [
        f"{ind}__syncthreads();",
        f"{ind}for (int {p}j = threadIdx.x; {p}j < {p}bins; {p}j += {block}) {{",
        f"{ind}{ind}{ctype} {p}sum = 0;",
        "#pragma unroll",
        f"{ind}{ind}for (int {p}r = 0; {p}r < {copies}; ++{p}r) {{",
        f"{ind}{ind}{ind}{p}sum += {p}hist[{cell}];",
        f"{ind}{ind}}}",
        f"{ind}{ind}if ({p}sum != 0) {{",
        f"{ind}{ind}{ind}atomicAdd(&{pointer}[{p}j], {p}sum);"
        if ctype == bins_type
        else f"{ind}{ind}{ind}atomicAdd(&{pointer}[{p}j], ({bins_type}){p}sum);",
        f"{ind}{ind}}}",
        f"{ind}}}",
    ]
    return lines, smem
