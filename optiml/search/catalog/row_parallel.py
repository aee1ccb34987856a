"""One warp (or one block) per row for kernels written one thread per row: the lanes stride over the
row, so a warp's loads are contiguous instead of 32 rows apart; every loop that reduces into a
scalar is followed by an all-reduce of it (shuffles, and shared memory across warps for a block),
and the code between the loops runs on every lane with the same values.

Options: float4 accesses (checked per row at run time: 16-byte aligned rows and a length multiple of
4, else the scalar path), the row kept in registers across the loops when it fits a compile-time
number of float4 per lane, and one-pass statistics where the tree shows the classic two-loop
patterns (max then sum of exponentials: online softmax; mean then squared deviations: Welford).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST, words
from optiml.expr import Expr, ExprError
from optiml.search.catalog import _rows
from optiml.search.catalog._rows import (
    LoopAccess,
    OnlineSoftmax,
    RowKernel,
    RowLoop,
    Stream,
    Welford,
)
from optiml.search.catalog.base import Context, Rewrite, Transformation

# float registers per lane (or thread) the row cache may take: 32 keeps a layernorm under ~64
# registers, so 1024 threads per SM stay resident.
REGISTER_FLOATS = 32
FULL_MASK = "0xffffffffu"


@dataclass(frozen=True)
class Config:
    mapping: str  # "warp": a warp per row; "block": a block per row
    threads: int  # threads per block
    vector: bool  # float4 path when the row allows it
    chunks: int  # float4 per lane kept in registers; 0: none
    online: bool  # fuse the recognised two-loop patterns into one pass

    @property
    def params(self) -> dict:
        return {
            "mapping": self.mapping,
            "threads": self.threads,
            "vector": self.vector,
            "chunks": self.chunks,
            "online": self.online,
        }

    def summary(self, rk: RowKernel) -> str:
        if self.mapping == "warp":
            parts = [f"warp per row ({self.threads // 32} rows per {self.threads}-thread block)"]
        else:
            parts = [f"block of {self.threads} per row"]
        if self.vector:
            parts.append("float4 loads/stores")
        if self.chunks:
            parts.append(f"row in registers ({self.chunks} float4 per thread)")
        if self.online and rk.softmax:
            parts.append("online max/sum")
        if self.online and rk.welford:
            parts.append("one-pass Welford mean/variance")
        parts.append("shuffle all-reduce" + (" + shared memory" if self.mapping == "block" else ""))
        return ", ".join(parts)


class RowParallel(Transformation):
    name = "row_parallel"
    addresses = frozenset({"uncoalesced", "l1_shared", "l2", "small_grid", "latency"})
    description = "a warp or block per row instead of a thread per row, with all-reduces"

    def propose(self, ctx: Context) -> list[Rewrite]:
        try:
            rk = _rows.analyse(ctx.ast)
            if rk is None or not _launch_ok(ctx, rk.rows):
                return []
            out = []
            cap = _launch_bound(ctx)
            for cfg, weight in _configs(ctx, rk):
                if cap is not None and cfg.threads > cap:
                    continue
                writer = _Writer(rk, cfg)
                definition = writer.definition()
                grid = (
                    [f"cdiv({rk.rows}, {cfg.threads // 32})"]
                    if cfg.mapping == "warp"
                    else [rk.rows]
                )
                variant = ctx.rewrite(
                    definition, launch=(grid, [str(cfg.threads)], "0"), helpers=writer.helpers()
                )
                out.append(Rewrite(cfg.params, cfg.summary(rk), variant, weight))
            return out
        except (ValueError, KeyError, ExprError, AttributeError, TypeError):
            return []  # code shaped in a way the analysis did not foresee: no proposal


# ---- which configurations ------------------------------------------------------------------------


def _launch_ok(ctx: Context, rows: str) -> bool:
    """The guard's bound is a spec expression, and the original 1-D launch covers it."""
    try:
        expr = Expr.parse(rows)
        for sizes in ctx.spec.sizes:
            case = ctx.spec.case(sizes)
            value = expr.evaluate(ctx.env(case))
            if not isinstance(value, int) or value <= 0:
                return False
            if case.grid[1:] != (1, 1) or case.block[1:] != (1, 1):
                return False
            if case.grid[0] * case.block[0] < value:
                return False
    except ExprError:
        return False
    return True


def _launch_bound(ctx: Context) -> int | None:
    """The kernel's `__launch_bounds__` thread count: a larger block would fail to launch."""
    head = ctx.source.text[ctx.kernel.span.start : ctx.kernel.body_span.start]
    found = re.search(r"__launch_bounds__\s*\(\s*(\d+)", head)
    return int(found.group(1)) if found else None


def _configs(ctx: Context, rk: RowKernel) -> list[tuple[Config, float]]:
    vector = _vectorizable(rk)
    fused = bool(rk.softmax or rk.welford)
    length = _case_length(ctx, rk)
    warp_chunks = _chunks(rk, length, 32) if vector else 0
    block_chunks = _chunks(rk, length, 256) if vector else 0
    out: list[tuple[Config, float]] = []
    if vector:
        if warp_chunks:
            out.append((Config("warp", 256, True, warp_chunks, False), 1.0))
        out.append((Config("warp", 256, True, 0, fused), 0.8))
        if fused:
            out.append((Config("warp", 256, True, 0, False), 0.6))
        if warp_chunks:
            out.append((Config("warp", 128, True, warp_chunks, False), 0.7))
        out.append((Config("block", 256, True, block_chunks, fused and not block_chunks), 0.5))
        out.append((Config("block", 512, True, 0, fused), 0.4))
    out.append((Config("warp", 256, False, 0, fused), 0.3))
    out.append((Config("block", 256, False, 0, fused), 0.2))
    return sorted(out, key=lambda cw: -cw[1])


def _vectorizable(rk: RowKernel) -> bool:
    """float4 pays when a row stream is read or written on every iteration at a 16-byte-aligned
    offset (checked at run time), and every loop bound is known before the first loop."""
    stable = _stable_bounds(rk)
    hoisted = any(
        la.stream is not None
        and la.stream.by_row
        and la.stream.vectorizable
        and (la.unconditional or la.store is not None)
        for loop in rk.loops
        for la in loop.accesses
    )
    return stable and hoisted


def _stable_bounds(rk: RowKernel) -> bool:
    ast = rk.ast
    first = rk.first.node
    names = set(ast.params)
    for st in ast.statements() + _guard_body(rk):
        if st.start_byte >= first.start_byte:
            break
        if st.type == "declaration":
            names |= set(ast.local_declarations(st))
    names -= ast.assigned(ast.body)
    return all(ast.identifiers(loop.bound) <= names for loop in rk.loops)


def _guard_body(rk: RowKernel) -> list[Node]:
    guard = rk.ast.guard(rk.index.decl)
    return guard.body if guard is not None else []


def _case_length(ctx: Context, rk: RowKernel) -> int | None:
    """The row length at the spec's first size, if every loop has the same bound."""
    bounds = {rk.ast.text(loop.bound) for loop in rk.loops}
    if len(bounds) != 1:
        return None
    try:
        value = Expr.parse(bounds.pop()).evaluate(ctx.env())
    except ExprError:
        return None
    return value if isinstance(value, int) and value > 0 else None


def _chunks(rk: RowKernel, length: int | None, threads: int) -> int:
    """float4 per thread that hold the row at the first size (a power of two), or 0 if the cached
    streams would not fit REGISTER_FLOATS or the kernel has nothing worth caching."""
    if length is None or _has_return(rk):
        return 0
    cached = _cached_streams(rk, online=False)
    if not cached:
        return 0
    chunks = 1
    while chunks * 4 * threads < length:
        chunks *= 2
    return chunks if chunks * 4 * len(cached) <= REGISTER_FLOATS else 0


def _has_return(rk: RowKernel) -> bool:
    return any(rk.ast.has(st, "return_statement") for st in _guard_body(rk))


def _cached_streams(rk: RowKernel, online: bool) -> list[Stream]:
    """Read-only row streams that more than one pass reads, at least one of them on every
    iteration (so loading the whole row up front reads nothing the kernel would not)."""
    passes: dict[Stream, int] = {}
    full: set[Stream] = set()
    for unit in _units(rk, online):
        seen = {la.stream for la in unit.accesses if la.stream is not None and la.access.read}
        for s in seen:
            passes[s] = passes.get(s, 0) + 1
        full |= {la.stream for la in unit.accesses if la.stream is not None and la.unconditional}
    return [
        s
        for s, n in passes.items()
        if n > 1 and s in full and s.read_only and s.by_row and s.vectorizable
    ]


# ---- the passes of a variant ------------------------------------------------------------------------


@dataclass
class _Unit:
    """One lane-strided loop of the rewritten kernel: a row loop as written, or a fused pair."""

    loop: RowLoop  # the loop whose header (variable, type, bound) it keeps
    accesses: list[LoopAccess]
    kind: str = "loop"  # "loop" | "softmax" | "welford"
    fusion: OnlineSoftmax | Welford | None = None
    at: Node | None = None  # where it is written; the loop's own place by default


def _units(rk: RowKernel, online: bool) -> list[_Unit]:
    fused: dict[int, OnlineSoftmax | Welford] = {}
    if online:
        for f in [*rk.softmax, *rk.welford]:
            fused[f.first.node.id] = f
            fused[f.second.node.id] = f
    out = []
    for loop in rk.loops:
        f = fused.get(loop.node.id)
        if f is None:
            out.append(_Unit(loop, loop.accesses))
        elif isinstance(f, OnlineSoftmax) and loop is f.second:
            out.append(_Unit(f.first, f.first.accesses, "softmax", f, f.second.node))
        elif isinstance(f, Welford) and loop is f.first:
            out.append(_Unit(f.first, f.first.accesses, "welford", f, f.first.node))
    return out


# ---- writing the kernel ---------------------------------------------------------------------------


@dataclass
class _Writer:
    rk: RowKernel
    cfg: Config
    used: set[str] = field(default_factory=set)
    needed: set[str] = field(default_factory=set)  # helper snippets the kernel calls
    names: dict[tuple[Stream, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ast: KernelAST = self.rk.ast
        self.used = set(self.rk.identifiers)
        warp = self.cfg.mapping == "warp"
        self.lane = self.fresh("lane" if warp else "tid")
        self.stride = "32" if warp else self.fresh("threads")
        self.units = _units(self.rk, self.cfg.online)
        self.cached = _cached_streams(self.rk, self.cfg.online) if self.cfg.chunks else []
        self.vec_flag = self.fresh("row_vec")
        self.regs_flag = self.fresh("row_in_regs")
        self.chunks_name = self.fresh("kRowChunks")
        self.k = self.fresh("k")
        self.c = self.fresh("c")
        self.j0 = self.fresh("j0")
        self.v = self.fresh("v")
        self.delta = self.fresh("delta")
        self.welford = (self.fresh("row_n"), self.fresh("row_mean"), self.fresh("row_m2"))

    def fresh(self, name: str) -> str:
        out = name
        while out in self.used:
            out += "_"
        self.used.add(out)
        return out

    def stream_name(self, stream: Stream, suffix: str) -> str:
        key = (stream, suffix)
        if key not in self.names:
            array = self.ast.text(stream.access.node.child_by_field_name("argument")).strip("()")
            self.names[key] = self.fresh(f"{array}_{suffix}")
        return self.names[key]

    # -- the whole definition --

    def definition(self) -> str:
        ast = self.ast
        replace: dict[tuple[int, int], str] = {}
        decl = self.rk.index.decl
        replace[(decl.start_byte, decl.end_byte)] = self.index_declaration()
        first = True
        for loop in self.rk.loops:
            unit = next((u for u in self.units if (u.at or u.loop.node) == loop.node), None)
            lines: list[str] = self.dispatch() if first else []
            first = False
            if unit is not None:
                lines += self.unit(unit)
            else:
                lines += self.placeholder(loop)
            indent = ast.indent_of(loop.node)
            replace[(loop.node.start_byte, loop.node.end_byte)] = f"\n{indent}".join(
                line if line.strip() else "" for line in lines
            )
        return ast.definition(replace)

    def index_declaration(self) -> str:
        ast = self.ast
        decl = self.rk.index.decl
        value = None
        for d in decl.children_by_field_name("declarator"):
            if d.type == "init_declarator" and ast.text(d.child_by_field_name("declarator")) == (
                self.rk.index.var
            ):
                value = d.child_by_field_name("value")
        if value is None:
            raise ValueError("row index without a value")
        if self.cfg.mapping == "warp":
            new = "blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32"
            lane = f"const int {self.lane} = threadIdx.x % 32;"
        else:
            new = "blockIdx.x"
            lane = f"const int {self.lane} = threadIdx.x, {self.stride} = blockDim.x;"
        text = ast.render(decl, {(value.start_byte, value.end_byte): new})
        return f"{text}\n{ast.indent_of(decl)}{lane}"

    def placeholder(self, loop: RowLoop) -> list[str]:
        """What stands where a fused loop was."""
        for f in self.rk.softmax:
            if loop is f.first:
                return [f"// {f.m}: computed with {f.s} in one pass below (online softmax)"]
        for f in self.rk.welford:
            if loop is f.second:
                return [f"{f.var} += {self.welford[2]};  // from the one-pass loop above"]
        raise ValueError("a row loop with no place in the rewrite")

    # -- the dispatch between paths, before the first loop --

    def vector_streams(self) -> list[Stream]:
        out: list[Stream] = list(self.cached)
        for unit in self.units:
            for la in unit.accesses:
                if (self.hoisted(unit, la) or la.store is not None) and la.stream not in out:
                    out.append(la.stream)
        return out

    def dispatch(self) -> list[str]:
        if not self.cfg.vector:
            return []
        ast = self.ast
        bounds = sorted({ast.text(loop.bound) for loop in self.rk.loops})
        checks = [f"{_paren(b)} % 4 == 0" for b in bounds]
        for s in self.vector_streams():
            checks.append(f"optiml_row_aligned16({self.address(s, s.access, s.var, '0')})")
        self.needed.add("aligned16")
        lines = [
            "// float4 accesses need 16-byte aligned rows and a length that is a multiple of 4;",
            "// other rows take the scalar path.",
            f"const bool {self.vec_flag} = {checks[0]}",
            *[f"    && {check}" for check in checks[1:-1]],
            *([f"    && {checks[-1]};"] if len(checks) > 1 else []),
        ]
        if len(checks) == 1:
            lines[-1] += ";"
        if self.cached:
            (bound,) = bounds
            lines += [
                f"// The row stays in registers when it fits {self.cfg.chunks} float4 per thread:",
                "// every pass after the first reads it from there, not from memory.",
                f"constexpr int {self.chunks_name} = {self.cfg.chunks};",
                f"const bool {self.regs_flag} = {self.vec_flag} && {_paren(bound)} <= "
                f"{self.chunks_name} * 4 * {_paren(self.stride)};",
            ]
            for s in self.cached:
                lines.append(f"float {self.stream_name(s, 'r')}[{self.chunks_name}][4];")
            lines.append(f"if ({self.regs_flag}) {{")
            body = []
            for s in self.cached:
                load = self.load(
                    s, f"{self.stream_name(s, 'r')}[{self.k}]", s.access, s.var, self.j0
                )
                body.append(f"if ({self.j0} < {bound}) {load}")
            lines += _indent(self.chunk_loop(body))
            lines.append("}")
        return lines

    # -- one unit in every path --

    def unit(self, unit: _Unit) -> list[str]:
        decls, before, after = self.reductions(unit)
        scalar = self.loop_scalar(unit)
        if not self.cfg.vector:
            paths = scalar
        else:
            vec = self.loop_vector(unit)
            paths = [f"if ({self.vec_flag}) {{", *_indent(vec), "} else {", *_indent(scalar), "}"]
            if self.cached:
                regs = self.loop_registers(unit)
                paths = [
                    f"if ({self.regs_flag}) {{",
                    *_indent(regs),
                    "} else " + paths[0],
                    *paths[1:],
                ]
        if before:
            return [*decls, "{", *_indent(before + paths + after), "}"]
        return decls + paths + after

    def reductions(self, unit: _Unit) -> tuple[list[str], list[str], list[str]]:
        """Declarations the rest of the kernel sees, lines before the loop (in a scope of their
        own: a sum restarts from zero on every lane and adds its old value back after the
        all-reduce) and after it (the all-reduces)."""
        decls: list[str] = []
        before: list[str] = []
        after: list[str] = []
        scope = "warp" if self.cfg.mapping == "warp" else "block"
        if unit.kind == "softmax":
            f = unit.fusion
            self.needed.add(f"{scope}_softmax")
            after.append(f"optiml_{scope}_softmax({f.m}, {f.s});")
            return decls, before, after
        for red in unit.loop.reductions:
            op = "sum" if red.op == "+" else red.op
            self.needed.add(f"{scope}_{op}")
            call = f"optiml_{scope}_{op}({red.var})"
            if red.op == "+" and not red.zero_init:
                init = self.fresh(f"{red.var}_init")
                before += [f"const {red.type} {init} = {red.var};", f"{red.var} = 0;"]
                after.append(f"{red.var} = {init} + {call};")
            else:
                after.append(f"{red.var} = {call};")
        if unit.kind == "welford":
            n, mean, m2 = self.welford
            decls.append(f"float {n} = 0.0f, {mean} = 0.0f, {m2} = 0.0f;")
            self.needed.add(f"{scope}_welford")
            after.append(f"optiml_{scope}_welford({n}, {mean}, {m2});")
        return decls, before, after

    # -- loop shapes --

    def loop_scalar(self, unit: _Unit) -> list[str]:
        loop = unit.loop
        bound = self.ast.text(loop.bound)
        header = (
            f"for ({loop.var_type} {loop.var} = {self.lane}; {loop.var} < {bound}; "
            f"{loop.var} += {self.stride}) {{"
        )
        return [header, *_indent(self.body(unit, {})), "}"]

    def loop_vector(self, unit: _Unit) -> list[str]:
        loop = unit.loop
        bound = self.ast.text(loop.bound)
        j0 = self.j0
        header = (
            f"for ({loop.var_type} {j0} = {self.lane} * 4; {j0} < {bound}; "
            f"{j0} += 4 * {_paren(self.stride)}) {{"
        )
        return ["#pragma unroll 2", header, *_indent(self.vector_step(unit, j0, cached=False)), "}"]

    def loop_registers(self, unit: _Unit) -> list[str]:
        loop = unit.loop
        bound = self.ast.text(loop.bound)
        step = self.vector_step(unit, self.j0, cached=True)
        return self.chunk_loop([f"if ({self.j0} < {bound}) {{", *_indent(step), "}"])

    def chunk_loop(self, body: list[str]) -> list[str]:
        return [
            "#pragma unroll",
            f"for (int {self.k} = 0; {self.k} < {self.chunks_name}; ++{self.k}) {{",
            f"    const int {self.j0} = ({self.k} * {_paren(self.stride)} + {self.lane}) * 4;",
            *_indent(body),
            "}",
        ]

    def vector_step(self, unit: _Unit, j0: str, cached: bool) -> list[str]:
        """Four consecutive elements from j0: float4 loads, the body once per element with those
        reads and the float4-stored writes on registers, then the stores."""
        loop = unit.loop
        replace: dict[tuple[int, int], str] = {}
        loads: list[str] = []
        stores: list[str] = []
        seen: dict[Stream, str] = {}
        for la in unit.accesses:
            node = la.access.node
            span = (node.start_byte, node.end_byte)
            if cached and la.stream in self.cached and la.access.read and not la.access.write:
                replace[span] = f"{self.stream_name(la.stream, 'r')}[{self.k}][{self.c}]"
            elif la.store is not None:
                name = self.stream_name(la.stream, "o")
                replace[span] = f"{name}[{self.c}]"
                loads.append(f"float {name}[4];")
                stores.append(self.store(name, la, loop.var, j0))
            elif self.hoisted(unit, la):
                if la.stream not in seen:
                    seen[la.stream] = self.stream_name(la.stream, "v")
                    loads.append(f"float {seen[la.stream]}[4];")
                    loads.append(self.load(la.stream, seen[la.stream], la.access, loop.var, j0))
                replace[span] = f"{seen[la.stream]}[{self.c}]"
        body = self.body(unit, replace)
        inner = [f"for (int {self.c} = 0; {self.c} < 4; ++{self.c}) {{"]
        if loop.var in words("\n".join(body)):
            inner.append(f"    const {loop.var_type} {loop.var} = {j0} + {self.c};")
        inner += [*_indent(body), "}"]
        return [*loads, "#pragma unroll", *inner, *stores]

    def hoisted(self, unit: _Unit, la: LoopAccess) -> bool:
        """A read loaded as float4 before the four elements are computed: read on every iteration,
        and its buffer either not written by this pass or written by a float4 store of the same
        statement (the read is then the element's old value, as in the original)."""
        s = la.stream
        if s is None or not s.vectorizable or not la.unconditional or not la.access.read:
            return False
        if la.access.write:
            return False
        writes = [o for o in unit.accesses if o.access.pointer == s.pointer and o.access.write]
        return all(w.store is not None for w in writes)

    # -- memory --

    def address(self, stream: Stream, access, var: str, at: str) -> str:
        array = self.ast.text(access.node.child_by_field_name("argument"))
        index = self.ast.substitute(access.index, {var: at})
        return f"&{array}[{index}]"

    def load(self, stream: Stream, dest: str, access, var: str, at: str) -> str:
        kind = "ldg4" if stream.read_only else "ld4"
        self.needed.add(kind)
        return f"optiml_row_{kind}({dest}, {self.address(stream, access, var, at)});"

    def store(self, name: str, la: LoopAccess, var: str, j0: str) -> str:
        self.needed.add("st4")
        return f"optiml_row_st4({self.address(la.stream, la.access, var, j0)}, {name});"

    # -- bodies --

    def body(self, unit: _Unit, replace: dict[tuple[int, int], str]) -> list[str]:
        if unit.kind == "loop":
            return self.statements(unit.loop.body, replace)
        value = self.node_text(unit.fusion.value, replace)
        v = self.v
        if unit.kind == "softmax":
            f = unit.fusion
            return [
                f"const float {v} = {value};",
                f"if ({v} > {f.m}) {{  // a new maximum rescales the running sum",
                f"    {f.s} = {f.s} * {f.exp}({f.m} - {v}) + 1.0f;",
                f"    {f.m} = {v};",
                "} else {",
                f"    {f.s} += {f.exp}({v} - {f.m});",
                "}",
            ]
        f = unit.fusion
        n, mean, m2 = self.welford
        delta = self.delta
        return [
            f"const float {v} = {value};",
            f"{f.acc} += {v};",
            f"{n} += 1.0f;",
            f"const float {delta} = {v} - {mean};",
            f"{mean} += {delta} / {n};",
            f"{m2} += {delta} * ({v} - {mean});",
        ]

    def statements(self, body: Node, replace: dict[tuple[int, int], str]) -> list[str]:
        nodes = body.named_children if body.type == "compound_statement" else [body]
        out: list[str] = []
        for node in nodes:
            out += self.node_text(node, replace).split("\n")
        return out

    def node_text(self, node: Node, replace: dict[tuple[int, int], str]) -> str:
        inside = {
            span: text
            for span, text in replace.items()
            if node.start_byte <= span[0] and span[1] <= node.end_byte
        }
        text = self.ast.render(node, inside)
        return textwrap.dedent(" " * node.start_point[1] + text).strip("\n")

    # -- helpers --

    def helpers(self) -> str:
        return _helpers(self.needed)


def _paren(text: str) -> str:
    t = text.strip()
    return t if t.replace("_", "").replace(".", "").isalnum() else f"({t})"


def _indent(lines: list[str]) -> list[str]:
    return [f"    {line}" if line else line for line in lines]


# ---- device helpers -----------------------------------------------------------------------------------

_WARP_OP = """\
// Butterfly all-reduce: both partners of every step combine the same two values, so all 32 lanes
// end with the same bits.
template <typename T>
__device__ __forceinline__ T optiml_warp_{name}(T v)
{{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = {combine};
    return v;
}}"""

_BLOCK_OP = """\
// Block all-reduce: every thread folds the warps' results in the same order, so all agree; the
// second barrier lets the next call reuse `partial`.
template <typename T>
__device__ __forceinline__ T optiml_block_{name}(T v)
{{
    __shared__ T partial[32];
    v = optiml_warp_{name}(v);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = partial[0];
    for (int w = 1; w < (int)(blockDim.x / 32); ++w) v = {fold};
    __syncthreads();
    return v;
}}"""

_SNIPPETS: dict[str, str] = {
    "aligned16": """\
__device__ __forceinline__ bool optiml_row_aligned16(const void* p)
{
    return (reinterpret_cast<size_t>(p) & 15) == 0;
}""",
    "ldg4": """\
// The kernel never writes this buffer, so the non-coherent (read-only cache) load is safe.
__device__ __forceinline__ void optiml_row_ldg4(float (&v)[4], const float* p)
{
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}""",
    "ld4": """\
__device__ __forceinline__ void optiml_row_ld4(float (&v)[4], const float* p)
{
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}""",
    "st4": """\
__device__ __forceinline__ void optiml_row_st4(float* p, const float (&v)[4])
{
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}""",
    "softmax_merge": """\
// (max, sum of exp(x - max)) of two sets of values. The operands of the final add do not depend on
// which side is which, and the rounded intrinsics keep the compiler from contracting one side into
// an fma, so both partners of a shuffle step get the same bits.
__device__ __forceinline__ void optiml_softmax_merge(float& m, float& s, float m_o, float s_o)
{
    const float m_n = fmaxf(m, m_o);
    const float a = m == m_n ? s : __fmul_rn(s, expf(m - m_n));
    const float b = m_o == m_n ? s_o : __fmul_rn(s_o, expf(m_o - m_n));
    s = __fadd_rn(a, b);
    m = m_n;
}""",
    "warp_softmax": f"""\
__device__ __forceinline__ void optiml_warp_softmax(float& m, float& s)
{{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {{
        const float m_o = __shfl_xor_sync({FULL_MASK}, m, offset);
        const float s_o = __shfl_xor_sync({FULL_MASK}, s, offset);
        optiml_softmax_merge(m, s, m_o, s_o);
    }}
}}""",
    "block_softmax": """\
__device__ __forceinline__ void optiml_block_softmax(float& m, float& s)
{
    __shared__ float partial_m[32], partial_s[32];
    optiml_warp_softmax(m, s);
    if (threadIdx.x % 32 == 0) {
        partial_m[threadIdx.x / 32] = m;
        partial_s[threadIdx.x / 32] = s;
    }
    __syncthreads();
    m = partial_m[0];
    s = partial_s[0];
    for (int w = 1; w < (int)(blockDim.x / 32); ++w)
        optiml_softmax_merge(m, s, partial_m[w], partial_s[w]);
    __syncthreads();
}""",
    "welford_merge": """\
// Chan et al.'s merge of (count, mean, M2). Written symmetrically in the two sides (the difference
// of the means is only squared) with rounded intrinsics, so both partners of a shuffle step get the
// same bits.
__device__ __forceinline__ void optiml_welford_merge(float& n, float& mean, float& m2, float n_o,
                                                     float mean_o, float m2_o)
{
    const float n_t = __fadd_rn(n, n_o);
    if (n_t > 0.0f) {
        const float d = __fsub_rn(mean_o, mean);
        const float w = __fdiv_rn(__fmul_rn(n, n_o), n_t);
        m2 = __fadd_rn(__fadd_rn(m2, m2_o), __fmul_rn(__fmul_rn(d, d), w));
        mean = __fdiv_rn(__fadd_rn(__fmul_rn(n, mean), __fmul_rn(n_o, mean_o)), n_t);
    }
    n = n_t;
}""",
    "warp_welford": f"""\
__device__ __forceinline__ void optiml_warp_welford(float& n, float& mean, float& m2)
{{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {{
        const float n_o = __shfl_xor_sync({FULL_MASK}, n, offset);
        const float mean_o = __shfl_xor_sync({FULL_MASK}, mean, offset);
        const float m2_o = __shfl_xor_sync({FULL_MASK}, m2, offset);
        optiml_welford_merge(n, mean, m2, n_o, mean_o, m2_o);
    }}
}}""",
    "block_welford": """\
__device__ __forceinline__ void optiml_block_welford(float& n, float& mean, float& m2)
{
    __shared__ float partial[3][32];
    optiml_warp_welford(n, mean, m2);
    if (threadIdx.x % 32 == 0) {
        partial[0][threadIdx.x / 32] = n;
        partial[1][threadIdx.x / 32] = mean;
        partial[2][threadIdx.x / 32] = m2;
    }
    __syncthreads();
    n = partial[0][0];
    mean = partial[1][0];
    m2 = partial[2][0];
    for (int w = 1; w < (int)(blockDim.x / 32); ++w)
        optiml_welford_merge(n, mean, m2, partial[0][w], partial[1][w], partial[2][w]);
    __syncthreads();
}""",
}

_DEPENDS = {
    "warp_softmax": ["softmax_merge"],
    "block_softmax": ["softmax_merge", "warp_softmax"],
    "warp_welford": ["welford_merge"],
    "block_welford": ["welford_merge", "warp_welford"],
}


def _snippet(key: str) -> str:
    if key in _SNIPPETS:
        return _SNIPPETS[key]
    scope, op = key.split("_", 1)
    if scope == "warp":
        shuffled = f"__shfl_xor_sync({FULL_MASK}, v, offset)"
        combine = f"v + {shuffled}" if op == "sum" else f"{op}(v, {shuffled})"
        return _WARP_OP.format(name=op, combine=combine)
    fold = "v + partial[w]" if op == "sum" else f"{op}(v, partial[w])"
    return _BLOCK_OP.format(name=op, fold=fold)


def _helpers(needed: set[str]) -> str:
    """The device functions the kernel calls, each behind its own include guard so that a file
    rewritten twice (two kernels) defines each once."""
    keys: list[str] = []

    def add(key: str) -> None:
        for dep in _DEPENDS.get(key, []):
            add(dep)
        if key.startswith("block_") and key not in _DEPENDS:
            add("warp_" + key.split("_", 1)[1])
        if key not in keys:
            keys.append(key)

    order = ["aligned16", "ldg4", "ld4", "st4"]
    for key in sorted(needed, key=lambda k: (order.index(k) if k in order else len(order), k)):
        add(key)
    blocks = []
    for key in keys:
        guard = f"OPTIML_ROW_{key.upper()}"
        blocks.append(f"#ifndef {guard}\n#define {guard}\n{_snippet(key)}\n#endif")
    return "\n\n".join(blocks)
