"""Same-address atomics turned into a block reduction: a kernel whose only effect is
`atomicAdd(sum, value(i))` (or Sub/Max/Min/And/Or/Xor) to addresses no thread or element changes
gets a grid-stride loop that accumulates in registers, a warp-shuffle and shared-memory reduction,
and one atomic per block and address."""

from __future__ import annotations

from dataclasses import dataclass

from tree_sitter import Node

from optiml.expr import ExprError
from optiml.search.catalog._reduce import (
    INDENT,
    PREFIX,
    Edit,
    ElementKernel,
    analyse,
    definition,
    element_loop,
    grid,
    only_in_addresses,
    slots,
    squash,
    statement_call,
    uniform_expr,
    uniform_lines,
    vector_reads,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation

# atomic function -> (operator class, how one element's value joins a register accumulator)
OPERATORS = {
    "atomicAdd": ("add", "+="),
    "atomicSub": ("add", "-="),
    "atomicMax": ("max", "max"),
    "atomicMin": ("min", "min"),
    "atomicAnd": ("and", "&="),
    "atomicOr": ("or", "|="),
    "atomicXor": ("xor", "^="),
}
FINAL = {
    "add": "atomicAdd",
    "max": "atomicMax",
    "min": "atomicMin",
    "and": "atomicAnd",
    "or": "atomicOr",
    "xor": "atomicXor",
}
SHUFFLE_TYPES = frozenset({"f32", "f64", "i32", "u32", "i64", "u64"})
INTEGER_TYPES = frozenset({"i32", "u32", "i64", "u64"})
# Identities of max and min by type code (no <climits> in device code).
LOWEST = {
    "i32": "(-2147483647 - 1)",
    "u32": "0u",
    "i64": "(-9223372036854775807LL - 1)",
    "u64": "0ull",
}
HIGHEST = {
    "i32": "2147483647",
    "u32": "0xffffffffu",
    "i64": "9223372036854775807LL",
    "u64": "0xffffffffffffffffull",
}
ZERO = {"f32": "0.0f", "f64": "0.0", "i32": "0", "u32": "0u", "i64": "0LL", "u64": "0ull"}
SYMBOLS = {"add": "+", "and": "&", "or": "|", "xor": "^"}
MAX_ACCUMULATORS = 4

# (block, 16-byte loads in flight per thread, blocks per SM), best guess first: 64-128 KB in flight
# per SM where the registers allow (the grid is one wave: __launch_bounds__ keeps that many blocks
# resident), down to 24 KB with one load per thread and the most registers to spare.
CONFIGS = [(512, 8, 2), (256, 8, 4), (512, 4, 2), (256, 4, 4), (512, 1, 3)]


@dataclass
class Accumulator:
    """The value one thread, then one warp, then one block adds (or maxes...) into one address."""

    pointer: str
    index: Node | None
    op: str
    ctype: str  # the element type as the kernel spells it
    code: str  # its type code

    def identity(self) -> str:
        if self.op == "max":
            return LOWEST[self.code]
        if self.op == "min":
            return HIGHEST[self.code]
        return f"~{ZERO[self.code]}" if self.op == "and" else ZERO[self.code]

    def combine(self, a: str, b: str) -> str:
        if self.op in ("max", "min"):
            return f"{self.op}({a}, {b})"
        return f"{a} {SYMBOLS[self.op]} {b}"

    def address(self, ek: ElementKernel) -> str:
        if self.index is None:
            return self.pointer
        return f"&{self.pointer}[{ek.ast.text(self.index)}]"


class BlockReduce(Transformation):
    name = "block_reduce"
    addresses = frozenset({"atomics", "l2", "latency"})
    description = (
        "same-address atomics -> register accumulation in a grid-stride loop, warp shuffles, "
        "shared memory, one atomic per block"
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
        accs, slot_of = _accumulators(ek)
        if not accs:
            return []
        vectors = vector_reads(ek)
        width = 4 if vectors else 1
        out = []
        seen = set()
        for rank, (block, loads_in_flight, per_sm) in enumerate(CONFIGS):
            unroll = slots(loads_in_flight, vectors)
            if (block, unroll, per_sm) in seen:
                continue
            seen.add((block, unroll, per_sm))
            body = _body(ek, accs, slot_of, vectors, block, unroll)
            launch = ([grid(ek, block * unroll * width, per_sm)], [str(block)], "0")
            loads = f"{unroll * max(1, len(vectors))}x {'16-byte' if vectors else 'scalar'} loads"
            ops = ", ".join(sorted({FINAL[a.op] for a in accs}))
            out.append(
                Rewrite(
                    params={
                        "block": block,
                        "unroll": unroll,
                        "blocks_per_sm": per_sm,
                        "vector": bool(vectors),
                    },
                    summary=(
                        f"grid-stride register accumulation ({loads}), warp shuffles + smem, "
                        f"one {ops} per block ({block} threads, {per_sm} blocks/SM)"
                    ),
                    variant=ctx.rewrite(definition(ek, body, block, per_sm), launch=launch),
                    weight=round(1.0 - 0.15 * rank, 2),
                )
            )
        return out


def _accumulators(ek: ElementKernel) -> tuple[list[Accumulator], dict[int, int]]:
    """One accumulator per address and operator class, and the accumulator of each atomic call;
    nothing if an atomic is not a reduction to a fixed address."""
    ast = ek.ast
    accs: list[Accumulator] = []
    keys: dict[tuple[str, str], int] = {}
    slot_of: dict[int, int] = {}
    for a in ek.atomics:
        if a.function not in OPERATORS or a.value is None:
            return [], {}
        if a.index is not None and not uniform_expr(ek, a.index):
            return [], {}
        op = OPERATORS[a.function][0]
        dtype = ek.dtype(a.pointer)
        param = ast.params[a.pointer]
        if dtype is None or dtype.code not in SHUFFLE_TYPES or param.pointer_depth != 1:
            return [], {}
        if op != "add" and dtype.code not in INTEGER_TYPES:
            return [], {}
        key = (a.pointer, squash(ast.text(a.index)) if a.index is not None else "0")
        if key not in keys:
            keys[key] = len(accs)
            accs.append(Accumulator(a.pointer, a.index, op, param.type_text, dtype.code))
        if accs[keys[key]].op != op:
            return [], {}
        slot_of[a.call.id] = keys[key]
    # Two operator classes on one buffer might meet at one address, where their order matters.
    for acc in accs:
        if any(o.pointer == acc.pointer and o.op != acc.op for o in accs):
            return [], {}
    if len(accs) > MAX_ACCUMULATORS or not only_in_addresses(ek, {a.pointer for a in accs}):
        return [], {}
    return accs, slot_of


def _body(
    ek: ElementKernel,
    accs: list[Accumulator],
    slot_of: dict[int, int],
    vectors: dict[str, list[Node]],
    block: int,
    unroll: int,
) -> list[str]:
    """The new kernel body: accumulators, the element loop, the warp and block reduction."""
    p, ind = PREFIX, INDENT
    acc_names = [[f"{p}acc{k}_{u}" for u in range(unroll)] for k in range(len(accs))]
    lines = list(uniform_lines(ek))
    lines.append(f"{ind}// {unroll} independent partial results per thread, in registers.")
    for k, acc in enumerate(accs):
        lines += [f"{ind}{acc.ctype} {name} = {acc.identity()};" for name in acc_names[k]]

    def edits(slot: int) -> dict[int, Edit]:
        out = {}
        for a in ek.atomics:
            k = slot_of[a.call.id]
            acc = accs[k]
            target = acc_names[k][slot]
            step = OPERATORS[a.function][1]

            def edit(sub, a=a, acc=acc, target=target, step=step) -> str:
                value = f"static_cast<{acc.ctype}>({sub(a.value)})"
                if step in ("max", "min"):
                    text = f"{target} = {step}({target}, {value})"
                else:
                    text = f"{target} {step} {value}"
                return text if statement_call(a.call) else f"({text})"

            out[a.call.id] = edit
        return out

    lines += element_loop(ek, block=block, unroll=unroll, vectors=vectors, edits=edits)
    warps = block // 32
    lines += [
        f"{ind}// One value per thread, then per warp (shuffles), then per block (shared memory):",
        f"{ind}// one atomic per block and address.",
        f"{ind}const int {p}lane = threadIdx.x & 31;",
        f"{ind}const int {p}warp = threadIdx.x >> 5;",
    ]
    for k, acc in enumerate(accs):
        total = acc_names[k][0]
        for name in acc_names[k][1:]:
            total = acc.combine(total, name)
        r = f"{p}r{k}"
        lines += [
            f"{ind}__shared__ {acc.ctype} {p}part{k}[{warps}];",
            f"{ind}{acc.ctype} {r} = {total};",
            "#pragma unroll",
            f"{ind}for (int {p}o = 16; {p}o > 0; {p}o >>= 1) {{",
            f"{ind}{ind}{r} = {acc.combine(r, f'__shfl_xor_sync(0xffffffffu, {r}, {p}o)')};",
            f"{ind}}}",
            f"{ind}if ({p}lane == 0) {{",
            f"{ind}{ind}{p}part{k}[{p}warp] = {r};",
            f"{ind}}}",
        ]
    lines.append(f"{ind}__syncthreads();")
    lines.append(f"{ind}if ({p}warp == 0) {{")
    for k, acc in enumerate(accs):
        r = f"{p}r{k}"
        lines += [
            f"{ind}{ind}{r} = {p}lane < {warps} ? {p}part{k}[{p}lane] : {acc.identity()};",
            "#pragma unroll",
            f"{ind}{ind}for (int {p}o = {warps // 2}; {p}o > 0; {p}o >>= 1) {{",
            f"{ind}{ind}{ind}{r} = {acc.combine(r, f'__shfl_xor_sync(0xffffffffu, {r}, {p}o)')};",
            f"{ind}{ind}}}",
            f"{ind}{ind}if ({p}lane == 0) {{",
            f"{ind}{ind}{ind}{FINAL[acc.op]}({acc.address(ek)}, {r});",
            f"{ind}{ind}}}",
        ]
    lines.append(f"{ind}}}")
    return lines
