"""The plain kernel of a checked formula, with its `@optiml` spec.

One thread per element of the output domain (a 1-D flattened index with a bounds check) — or,
where the outputs' reductions depend on some of the output's indices only (a softmax's row), one
thread per row of those, which computes the row's reductions once and loops over its elements. Every
value is computed in `float` (`double` where a tensor or scalar is double), half and bf16 loaded
and stored through cuda_fp16.h / cuda_bf16.h. A temporary is never stored: a thread computes the
elements of it that it needs, once each — a reduction or temporary that depends only on indices
bound outside a loop is computed before that loop (a row's max and sum in softmax are computed
once per thread, not once per column).
"""

from __future__ import annotations

import math
import re

from optiml.generate.check import BLOCK, SCANS, top_reductions
from optiml.generate.model import (
    Access,
    Binary,
    Call,
    Checked,
    Name,
    Node,
    Num,
    Reduce,
    Statement,
    Unary,
    children,
)
from optiml.generate.numpy_ref import _product_factors

C_TYPES = {
    "float": "float",
    "double": "double",
    "half": "__half",
    "bf16": "__nv_bfloat16",
    "int": "int",
}
SPEC_TYPES = {
    "float": "float",
    "double": "double",
    "half": "half",
    "bf16": "bfloat16",
    "int": "int",
}
_LOAD = {"half": "__half2float({})", "bf16": "__bfloat162float({})"}
_STORE = {"half": "__float2half({})", "bf16": "__float2bfloat16({})", "int": "(int)({})"}

# function -> (float spelling, double spelling)
_MATH = {
    "exp": ("expf", "exp"),
    "log": ("logf", "log"),
    "sqrt": ("sqrtf", "sqrt"),
    "rsqrt": ("rsqrtf", "rsqrt"),
    "tanh": ("tanhf", "tanh"),
    "erf": ("erff", "erf"),
    "sin": ("sinf", "sin"),
    "cos": ("cosf", "cos"),
    "abs": ("fabsf", "fabs"),
    "pow": ("powf", "pow"),
    "min": ("fminf", "fmin"),
    "max": ("fmaxf", "fmax"),
}
RESERVED_C = {f for pair in _MATH.values() for f in pair} | {"INFINITY", "blockIdx", "threadIdx"}


class _Block:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.memo: dict[tuple, str] = {}


def _offset(dims: list[str], idx: list[str]) -> str:
    """Row-major element offset of `idx` in a tensor of `dims`, in 64 bits."""
    if len(idx) == 1:
        return idx[0]
    text = f"(long long){idx[0]}"
    for d, i in zip(dims[1:], idx[1:], strict=True):
        text = f"({text} * {d} + {i})"
    return text


def _index_names(ix, env) -> list[str]:
    """The bound indices a subscript uses."""
    if ix.gather is not None:
        return [i.name for i in ix.gather.indices]
    if not ix.affine:
        return [ix.name]
    return [f for _, fs in ix.terms for f in fs if f in env]


def _affine_text(ix, env) -> str:
    """An affine subscript in C `int` arithmetic: indices by their variables, sizes and int
    scalars by their parameters, whole numbers as they are."""
    text = ""
    for sign, factors in ix.terms:
        term = " * ".join(env[f][0] if f in env else f for f in factors)
        text += (" - " if sign < 0 else " + ") + term if text else ("-" if sign < 0 else "") + term
    return f"({text})"


LANES = 32  # a warp's threads


class _Kernel:
    def __init__(self, c: Checked):
        self.c = c
        self.T = c.compute
        self.f = 1 if self.T == "double" else 0
        self.taken = set(c.tensors) | set(c.scalars) | set(c.sizes) | set(c.ranges)
        self.counter = 0
        # index variables taken apart from one flat variable (`_decode`): their tuple -> (the flat
        # variable, their extents); a subscript ending in them is that flat variable's offset
        self.flat: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
        # flat variables whose indices a subscript put back together (`offset`), and those that
        # must not be: an index of theirs is used alone elsewhere, so they are taken apart anyway
        self.merged: set[str] = set()
        self.apart: set[str] = set()
        self.decodes: dict[str, list[str]] = {}  # a flat variable -> the lines taking it apart
        # a thread per row (`_rows_body`): a reduction over several indices that every read takes
        # as plain subscripts runs as one flat loop, its indices taken apart at each step (a batch
        # norm's (b, h, w) around its channel): one counter walks the row, as the row schedules
        # read it, where a nest of loops would leave them nothing to split over a warp or block
        self.flat_rows = False
        # a warp per element of a grid's sum (`_spread_body`): the reductions computed in this
        # block (each element's own) are split over the warp's lanes and all-reduced by shuffles
        self.lane_block: _Block | None = None

    def offset(self, dims: list[str], idx: list[str]) -> str:
        """`_offset`, with indices taken apart from a flat variable put back together as it:
        `x[b, f, h, w]` with (f, h, w) from `r` is `b * (F * H * W) + r` (affine in `r`, and
        no division per element); and (`_runs`) with (b, h, w) from `r`, where none of them is
        used alone, `(r / (H * W) * F + f) * (H * W) + r % (H * W)`."""
        parts = self._runs(dims, idx)
        if parts is not None:
            text = f"(long long){parts[0][1]}"
            for d, i in parts[1:]:
                text = f"({text} * {d if ' ' not in d else f'({d})'} + {i})"
            return text
        for cut in range(len(idx)):
            found = self.flat.get(tuple(idx[cut:]))
            if found is None or found[1] != tuple(dims[cut:]):
                continue
            flat, inner = found
            if cut == 0:
                return flat
            return f"({self.offset(dims[:cut], idx[:cut])} * ({_total(list(inner))}) + {flat})"
        return _offset(dims, idx)

    def _runs(self, dims: list[str], idx: list[str]) -> list[tuple[str, str]] | None:
        """The subscript's axes as (extent, index) with runs of a flat variable's indices merged:
        all of them as it, some as a quotient and remainder of it (one division for the run,
        where taking each apart takes one per index; not for a flat variable `apart`, whose
        indices are taken apart anyway), and then its single indices here from it too. None where
        no run but a whole flat variable ending the subscript is merged (`offset`'s own case)."""
        runs: dict[int, tuple[str, tuple[str, ...], int, int]] = {}  # at -> flat, extents, i, j
        for names, (flat, extents) in self.flat.items():
            p = 0
            while p < len(idx):
                if idx[p] not in names:
                    p += 1
                    continue
                i = j = names.index(idx[p])
                while (
                    j < len(names)
                    and p + j - i < len(idx)
                    and idx[p + j - i] == names[j]
                    and dims[p + j - i] == extents[j]
                ):
                    j += 1
                runs[p] = (flat, extents, i, j)
                p += max(j - i, 1)
        complete = {p for p, (_, e, i, j) in runs.items() if i == 0 and j == len(e)}
        # `offset`'s own case: whole flat variables one after another to the subscript's end
        chain, end = set(), len(idx)
        while (p := next((p for p in complete if p + len(runs[p][1]) == end), None)) is not None:
            chain.add(p)
            end = p
        whole = chain | {p for p in complete if len(runs[p][1]) >= 2}
        # flat variables with two or more indices in a row here, whose others here follow them
        joined = {r[0] for r in runs.values() if r[3] - r[2] >= 2 and r[0] not in self.apart}
        if whole <= chain and not joined - {runs[p][0] for p in whole}:
            return None
        self.merged |= joined
        parts: list[tuple[str, str]] = []
        p = 0
        while p < len(idx):
            flat, extents, i, j = runs.get(p, ("", (), 0, 0))
            if p not in whole and flat not in joined:
                parts.append((dims[p], idx[p]))
                p += 1
                continue
            text = flat
            if j < len(extents):
                text = f"({text} / ({_total(list(extents[j:]))}))"
            if i > 0:
                text = f"({text} % ({_total(list(extents[i:j]))}))"
            parts.append((_total(list(extents[i:j])), text))
            p += j - i
        return parts

    def fresh(self, base: str) -> str:
        while True:
            self.counter += 1
            name = f"{base}{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def lit(self, v: float) -> str:
        if v in (float("inf"), float("-inf")):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(float(v))
        return text if self.T == "double" else f"{text}f"

    # ---- what a value depends on ----

    def level(self, node: Node, env: dict[str, tuple[str, int]]) -> int:
        if isinstance(node, Num):
            return 0
        if isinstance(node, Name):
            return env[node.name][1] if node.kind == "index" else 0
        if isinstance(node, Access):
            return max([0] + [env[n][1] for i in node.indices for n in _index_names(i, env)])
        if isinstance(node, Unary):
            return self.level(node.operand, env)
        if isinstance(node, Binary):
            return max(self.level(node.left, env), self.level(node.right, env))
        if isinstance(node, Call):
            return max(self.level(a, env) for a in node.args)
        if isinstance(node, Reduce):
            inner = {**env, **{i.name: ("", -1) for i in node.indices}}
            return max(0, self.level(node.body, inner))
        raise AssertionError(node)

    # ---- code ----

    def emit(self, node: Node, env, stack: list[_Block], k: int) -> str:
        T = self.T
        if isinstance(node, Num):
            return self.lit(node.value)
        if isinstance(node, Name):
            if node.kind == "index":
                return f"({T}){env[node.name][0]}"
            if node.kind == "size" or self.c.scalars[node.name].dtype == "int":
                return f"({T}){node.name}"
            return node.name
        if isinstance(node, Access):
            return self.access(node, env, stack, k)
        if isinstance(node, Unary):
            return f"(-{self.emit(node.operand, env, stack, k)})"
        if isinstance(node, Binary):
            self.fuse(node, env, stack, k)
            a = self.emit(node.left, env, stack, k)
            b = self.emit(node.right, env, stack, k)
            if node.op == "**":
                if isinstance(node.right, Num) and node.right.value == 2:
                    return f"({a} * {a})"  # a square: one multiply, not a call to pow
                return f"{_MATH['pow'][self.f]}({a}, {b})"
            return f"({a} {node.op} {b})"
        if isinstance(node, Call):
            if node.func == "pad":
                return self.access(
                    node.args[0], env, stack, k, self.emit(node.args[1], env, stack, k)
                )
            self.fuse(node, env, stack, k)
            args = [self.emit(a, env, stack, k) for a in node.args]
            if node.func == "where":
                return f"({args[0]} ? {args[1]} : {args[2]})"
            if node.func == "sigmoid":
                one = self.lit(1.0)
                return f"({one} / ({one} + {_MATH['exp'][self.f]}(-{args[0]})))"
            fn = _MATH[node.func][self.f]
            if node.func in ("min", "max"):
                text = args[0]
                for a in args[1:]:
                    text = f"{fn}({text}, {a})"
                return text
            if node.func == "pow":
                return f"{fn}({args[0]}, {args[1]})"
            return f"{fn}({args[0]})"
        if isinstance(node, Reduce):
            return self.reduce(node, env, stack, k)
        raise AssertionError(node)

    def access(self, a: Access, env, stack: list[_Block], k: int, pad: str | None = None) -> str:
        t = self.c.tensors[a.tensor]
        if t.statement is not None and t.statement < k:  # a result of an earlier statement
            return self.temporary(a, env, stack)
        idx, guards = [], []
        for ix, dim in zip(a.indices, t.dims, strict=True):
            if ix.gather is not None:  # an element of an int input, in [0, dim) by the spec
                g = ix.gather
                at = _offset(self.c.tensors[g.tensor].dims, [env[i.name][0] for i in g.indices])
                idx.append(f"{g.tensor}[{at}]")
                continue
            if not ix.affine:
                idx.append(env[ix.name][0])
                continue
            text = _affine_text(ix, env)
            if ix.div is not None:
                guards.append(f"{text} % {ix.div} == 0")
                text = f"({text} / {ix.div})"
            guards += [f"{text} >= 0", f"{text} < {dim}"]
            idx.append(text)
        load = f"{a.tensor}[{self.offset(t.dims, idx)}]"
        if t.dtype in _LOAD:
            load = _LOAD[t.dtype].format(load)
        elif t.dtype != self.T:
            load = f"({self.T}){load}"
        if guards:  # a read outside the tensor is the padding value, never a load
            return f"(({' && '.join(guards)}) ? {load} : {pad or self.lit(0.0)})"
        return load

    def temporary(self, a: Access, env, stack: list[_Block]) -> str:
        t = self.c.tensors[a.tensor]
        level = max([0] + [env[i.name][1] for i in a.indices])
        target = stack[level]
        args = tuple(env[i.name][0] for i in a.indices)
        key = ("t", a.tensor, args)
        if key in target.memo:
            return target.memo[key]
        st = self.c.formula.statements[t.statement]
        inner = {lhs.name: env[i.name] for lhs, i in zip(st.target.indices, a.indices, strict=True)}
        value = self.emit(st.rhs, inner, stack[: level + 1], t.statement)
        var = self.fresh(f"{a.tensor}_")
        ctype = "int" if t.dtype == "int" else self.T
        target.lines.append(f"const {ctype} {var} = {value};  // {a.tensor}[{', '.join(args)}]")
        target.memo[key] = var
        return var

    def _reduce_key(self, node: Reduce, env) -> tuple:
        return ("r", id(node), tuple(sorted((n, v[0]) for n, v in env.items())))

    def reduce(self, node: Reduce, env, stack: list[_Block], k: int) -> str:
        target = stack[self.level(node, env)]
        key = self._reduce_key(node, env)
        if key not in target.memo:
            self._reductions([node], env, stack, k)
        return target.memo[key]

    def _flat(self, node: Reduce) -> bool:
        """Whether the reduction's indices run as one flat loop (see `flat_rows`)."""
        return len(node.indices) > 1 and (
            _flat_serves(self.c, node) or (self.flat_rows and _plain_reads(self.c, node))
        )

    def fuse(self, node: Node, env, stack: list[_Block], k: int) -> None:
        """The reductions `node` holds (not those inside a reduction or a temporary) that share a
        level, the extents of their indices and their loops' form, whose bodies read inputs only,
        run as one loop, each with its own accumulator: a cosine similarity's three sums read
        the two rows once, not three times. Each sum adds the same terms in the same order as
        its own loop would."""
        found: list[Reduce] = []

        def walk(n: Node) -> None:
            if isinstance(n, Reduce):
                found.append(n)
            elif not isinstance(n, Access):
                for child in children(n):
                    walk(child)

        walk(node)
        if len(found) < 2:
            return
        groups: dict[tuple, list[Reduce]] = {}
        for r in found:
            if r.op in ("argmax", "argmin") or not _reads_inputs_only(self.c, r.body, k):
                continue
            level = self.level(r, env)
            if self._reduce_key(r, env) in stack[level].memo:
                continue
            dims = tuple(self.c.ranges[ix.name] for ix in r.indices)
            groups.setdefault((level, dims, self._flat(r)), []).append(r)
        for group in groups.values():
            if len(group) > 1:
                self._reductions(group, env, stack, k)

    def _fold(self, op: str, acc: str, value: str) -> str:
        """The statement adding `value` into the accumulator `acc` of a sum, mean, product,
        maximum or minimum."""
        if op in ("max", "min"):
            return f"{acc} = {_MATH[op][self.f]}({acc}, {value});"
        return f"{acc} {'*' if op == 'prod' else '+'}= {value};"

    def _reductions(self, nodes: list[Reduce], env, stack: list[_Block], k: int) -> None:
        """One loop (or nest) over the first reduction's indices computing every one of `nodes`
        (their levels, extents and loop forms the same), each result memoized in its block."""
        T = self.T
        first = nodes[0]
        level = self.level(first, env)
        target = stack[level]
        inner_block = _Block()
        loops = []
        names = [self.fresh(f"{ix.name}_") for ix in first.indices]
        dims = [self.c.ranges[ix.name] for ix in first.indices]
        lanes = self.lane_block is not None and target is self.lane_block
        start, step = ("optiml_lane", f"{LANES}") if lanes else ("0", "1")
        if self._flat(first):
            # one loop over all the reduced indices: every read of them is at the flat one
            flat = self.fresh("r")
            loops.append(
                f"for (long long {flat} = {start}; {flat} < {_total(dims)}; "
                + (f"++{flat}) {{" if step == "1" else f"{flat} += {step}) {{")
            )
            inner_block.lines += _decode(self, flat, names, dims)
        else:  # a loop each (a window's offsets, a convolution's taps: no division per step)
            loops += [
                f"for (int {n} = {start if j == 0 else '0'}; {n} < {d}; "
                + (f"{n} += {step}) {{" if j == 0 and step != "1" else f"++{n}) {{")
                for j, (n, d) in enumerate(zip(names, dims, strict=True))
            ]
        head: list[str] = []
        updates: list[str] = []
        after: list[str] = []
        results: list[str] = []
        for node in nodes:
            inner_env = dict(env)
            for ix, var in zip(node.indices, names, strict=True):
                inner_env[ix.name] = (var, level + 1)
            v = self.emit(node.body, inner_env, stack[: level + 1] + [inner_block], k)
            acc = self.fresh("acc")
            op = node.op
            init = {
                "sum": self.lit(0.0),
                "mean": self.lit(0.0),
                "prod": self.lit(1.0),
                "max": "-INFINITY",
                "min": "INFINITY",
                "argmax": "-INFINITY",
                "argmin": "INFINITY",
            }[op]
            head.append(f"{T} {acc} = {init};")
            result = acc
            if op not in ("argmax", "argmin"):
                updates.append(self._fold(op, acc, v))
            else:
                arg = self.fresh("arg")
                head.append(f"int {arg} = 0;")
                cmp = ">" if op == "argmax" else "<"
                val = self.fresh("v")
                loop_var = inner_env[node.indices[0].name][0]
                updates += [
                    f"const {T} {val} = {v};",
                    f"if ({val} {cmp} {acc}) {{ {acc} = {val}; {arg} = {loop_var}; }}",
                ]
                result = arg
            if lanes:  # every lane's part combined, the result in every lane
                shuffled = f"__shfl_xor_sync(0xffffffffu, {acc}, optiml_o)"
                after.append(
                    f"for (int optiml_o = {LANES // 2}; optiml_o > 0; optiml_o >>= 1) "
                    + self._fold(op, acc, shuffled)
                )
            if op == "mean":
                extent = " * ".join(self.c.ranges[i.name] for i in node.indices)
                result = f"({acc} / ({T})({extent}))"
            results.append(result)
        body = inner_block.lines + updates
        pad = "    "
        lines = list(head)
        for depth, loop in enumerate(loops):
            lines.append(pad * depth + loop)
        lines += [pad * len(loops) + line for line in body]
        for depth in reversed(range(len(loops))):
            lines.append(pad * depth + "}")
        target.lines += lines + after
        for node, result in zip(nodes, results, strict=True):
            target.memo[self._reduce_key(node, env)] = result


def _reads_inputs_only(c: Checked, node: Node, k: int) -> bool:
    """Whether `node` holds no reduction and reads no earlier statement's result."""
    if isinstance(node, Reduce):
        return False
    if isinstance(node, Access):
        t = c.tensors[node.tensor]
        if t.statement is not None and t.statement < k:
            return False
    return all(_reads_inputs_only(c, child, k) for child in children(node))


def params(c: Checked) -> list[tuple[str, str]]:
    """The kernel's parameters in order: (name, C declaration)."""
    out = []
    for t in c.tensors.values():
        if t.role == "in":
            out.append((t.name, f"const {C_TYPES[t.dtype]}* __restrict__ {t.name}"))
    for t in c.tensors.values():
        if t.role in ("out", "inout"):
            out.append((t.name, f"{C_TYPES[t.dtype]}* __restrict__ {t.name}"))
    for s in c.sizes:
        out.append((s, f"int {s}"))
    for s in c.scalars.values():
        out.append((s.name, f"{s.dtype} {s.name}"))
    return out


def scan_of(c: Checked) -> tuple[Statement, Reduce] | None:
    """The statement whose right-hand side is a scan (`cumsum(c) ...`), if the formula has one."""
    for o in c.outputs:
        st = c.statement_of(o)
        if isinstance(st.rhs, Reduce) and st.rhs.op in SCANS:
            return st, st.rhs
    return None


def thread_dims(c: Checked) -> list[str]:
    """The extents one thread each covers: the output's, less a scanned index (a thread runs
    along it) and the indices a row's reductions do not depend on (a thread loops over them,
    `row_indices`); none for a result of one number (one block computes it)."""
    scan = scan_of(c)
    if scan is None:
        if not c.domain:
            return []
        first = c.statement_of(c.outputs[0])
        names = [i.name for i in first.target.indices]
        rows = row_indices(c, names)
        if rows is None:
            return list(c.domain)
        return [d for n, d in zip(names, c.domain, strict=True) if n in rows]
    st, node = scan
    at = [i.name for i in st.target.indices].index(node.indices[0].name)
    return [d for n, d in enumerate(c.domain) if n != at]


def _decode(k: _Kernel, flat: str, names: list[str], dims: list[str]) -> list[str]:
    """Lines splitting a flat index into `names` (row-major over `dims`)."""
    k.flat[tuple(names)] = (flat, tuple(dims))
    if len(dims) == 1:
        return [f"const int {names[0]} = (int){flat};"]
    rest = k.fresh("rest")
    lines = [f"long long {rest} = {flat};"]
    for n in reversed(range(1, len(dims))):
        lines.append(f"const int {names[n]} = (int)({rest} % {dims[n]});")
        lines.append(f"{rest} /= {dims[n]};")
    lines.append(f"const int {names[0]} = (int){rest};")
    k.decodes[flat] = lines
    return lines


def _total(dims: list[str]) -> str:
    return " * ".join(f"(long long){d}" if n == 0 else d for n, d in enumerate(dims)) or "1"


def _store(c: Checked, dtype: str, value: str) -> str:
    if dtype in _STORE:
        return _STORE[dtype].format(value)
    if dtype != c.compute:
        return f"({C_TYPES[dtype]})({value})"
    return value


def kernel_body(c: Checked, name: str = "kernel") -> list[str]:
    """The kernel's statements. A flat variable's indices put back together in the subscripts
    (`_Kernel.offset`) where none of them is used alone: its division into them is then dead."""
    apart: set[str] = set()
    while True:
        k = _Kernel(c)
        k.apart = apart
        lines = _kernel_body(c, k, name)
        used = {
            flat
            for names, (flat, _) in k.flat.items()
            if flat in k.merged and len(names) > 1 and _used_alone(lines, names)
        }
        if used <= apart:
            break
        apart = apart | used
    # the lines taking apart a flat variable whose indices every subscript put back together
    dead = {
        line
        for names, (flat, _) in k.flat.items()
        if flat in k.merged - apart and len(names) > 1
        for line in k.decodes[flat]
    }
    kept = ["\n".join(t for t in text.split("\n") if t.strip() not in dead) for text in lines]
    return [text for text, was in zip(kept, lines, strict=True) if text or not was]


def _used_alone(lines: list[str], names: tuple[str, ...]) -> bool:
    """Whether a line other than their declarations uses one of `names`."""
    word = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    declared = re.compile(r"^\s*const int (" + "|".join(map(re.escape, names)) + r") = ")
    every = [line for text in lines for line in text.split("\n")]
    return any(word.search(line) and not declared.match(line) for line in every)


def _kernel_body(c: Checked, k: _Kernel, name: str) -> list[str]:
    if not c.domain:
        spread = spread_reduction(c)
        if spread is not None:
            return _spread_body(c, k, spread, name)
        return _scalar_body(c, k)
    first = c.tensors[c.outputs[0]]
    names = [i.name for i in c.formula.statements[first.statement].target.indices]
    cvars = [k.fresh(f"{n}_") if n in RESERVED_C else n for n in names]
    scan = scan_of(c)
    rows = row_indices(c, names) if scan is None else None
    if rows is not None:
        return _rows_body(c, k, names, cvars, rows)
    scanned = scan[1].indices[0].name if scan else None
    threaded = [(cv, d) for n, cv, d in zip(names, cvars, c.domain, strict=True) if n != scanned]
    idx = k.fresh("idx")
    top = _Block()
    lines = [
        f"const long long {idx} = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        f"if ({idx} >= {_total([d for _, d in threaded])}) return;",
    ]
    if threaded:
        lines += _decode(k, idx, [cv for cv, _ in threaded], [d for _, d in threaded])
    if scan is not None:
        return lines + _scan_body(c, k, scan, names, cvars, top)
    stores = []
    for o in c.outputs:
        t = c.tensors[o]
        st = c.formula.statements[t.statement]
        env = {ix.name: (cv, 0) for ix, cv in zip(st.target.indices, cvars, strict=True)}
        value = k.emit(st.rhs, env, [top], t.statement)
        stores.append(f"{o}[{idx}] = {_store(c, t.dtype, value)};")
    return lines + top.lines + stores


def thread_per_row(c: Checked) -> bool:
    """Whether the plain kernel is a thread per row (`_rows_body`)."""
    if not c.domain or scan_of(c) is not None:
        return False
    first = c.statement_of(c.outputs[0])
    return row_indices(c, [i.name for i in first.target.indices]) is not None


def row_indices(c: Checked, names: list[str]) -> list[str] | None:
    """The output indices that the outputs' reductions and temporaries depend on, where they are
    some of the output's indices but not all (softmax's row `b`, not its column `d`): a thread
    then computes them once for its row and loops over the other indices, instead of every
    element's thread computing its row's reductions again. None where every index is needed
    (a matrix product's sum depends on both) or there is no reduction (a map). [] where the
    reductions depend on none of the output's indices (a tensor divided by its whole norm): one
    row, the whole output, its reductions computed once rather than once per element."""
    used: set[str] = set()
    reduced = False
    for o in c.outputs:
        st = c.statement_of(o)
        targets = [i.name for i in st.target.indices]
        if targets != names:
            return None
        used |= _shared_indices(c, st.rhs, set(names), c.tensors[o].statement)
        reduced = reduced or bool(_inner_reductions(c, st.rhs, c.tensors[o].statement))
    rows = [n for n in names if n in used]
    if not rows:
        return [] if reduced else None
    return rows if len(rows) < len(names) else None


def _shared_indices(c: Checked, node: Node, names: set[str], k: int) -> set[str]:
    """The indices of `names` that the reductions under `node` depend on, through temporaries
    too: softmax's `e[r, c] = exp(x[r, c] - m[r])` depends on its row `r` for its reduction
    (`m[r]`), not on `c`."""
    if isinstance(node, Reduce):
        return _free(node, names)
    if isinstance(node, Access):
        t = c.tensors[node.tensor]
        out: set[str] = set()
        if t.statement is not None and t.statement < k:
            st = c.formula.statements[t.statement]
            own = [i.name for i in st.target.indices]
            inner = _shared_indices(c, st.rhs, set(own), t.statement)
            for name, ix in zip(own, node.indices, strict=True):
                if name in inner:
                    out |= _free(Access(node.tensor, [ix], node.pos), names)
            return out
        for ix in node.indices:
            if ix.gather is not None:
                out |= _shared_indices(c, ix.gather, names, k)
        return out
    out = set()
    for child in children(node):
        out |= _shared_indices(c, child, names, k)
    return out


def _free(node: Node, names: set[str]) -> set[str]:
    """The names of `names` that `node` reads (a reduction's own indices are its own)."""
    if isinstance(node, Name):
        return {node.name} & names if node.kind == "index" else set()
    if isinstance(node, Access):
        out: set[str] = set()
        for ix in node.indices:
            if ix.gather is not None:
                out |= _free(ix.gather, names)
            elif ix.affine:
                out |= {f for _, fs in ix.terms for f in fs if f in names}
            elif ix.name in names:
                out.add(ix.name)
        return out
    if isinstance(node, Reduce):
        return _free(node.body, names - {i.name for i in node.indices})
    out = set()
    for child in children(node):
        out |= _free(child, names)
    return out


def _every_read(node: Node, wanted: set[str], access_ok) -> bool:
    """Whether every read in `node` of the indices in `wanted` is one `access_ok` accepts: an
    access that reads none of them passes, an index read as a value does not."""
    if isinstance(node, Name):
        return node.name not in wanted or node.kind != "index"
    if isinstance(node, Access):
        return not _free(node, wanted) or access_ok(node)
    return all(_every_read(ch, wanted, access_ok) for ch in children(node))


def _plain_reads(c: Checked, node: Reduce) -> bool:
    """Whether every read of the reduction's indices is an input's plain subscript (no window,
    no gather, no index used as a value, no temporary at them)."""
    wanted = {i.name for i in node.indices}

    def plain(n: Access) -> bool:
        if c.tensors[n.tensor].statement is not None:
            return False
        return all(
            ix.gather is None and not ix.affine
            for ix in n.indices
            if _free(Access(n.tensor, [ix], n.pos), wanted)
        )

    return _every_read(node.body, wanted, plain)


def _flat_serves(c: Checked, node: Reduce) -> bool:
    """Whether one flat loop serves a reduction over several indices: every read that uses them
    reads an input at them as its last indices, in order, over those extents, so that its address
    is the flat counter's (`_Kernel.offset`) and the indices taken apart from it go unused (a norm's
    row). Otherwise (a window `x[o + k - 1]`, an index used as a value, a temporary) a flat loop
    would divide and take a remainder for each index at every step."""
    names = [i.name for i in node.indices]
    dims = [c.ranges[n] for n in names]
    wanted = set(names)

    def served(n: Access) -> bool:
        t = c.tensors[n.tensor]
        cut = len(n.indices) - len(names)
        if t.statement is not None or cut < 0 or list(t.dims[cut:]) != dims:
            return False
        tail = n.indices[cut:]
        plain = all(
            ix.gather is None and not ix.affine and ix.name == name
            for ix, name in zip(tail, names, strict=True)
        )
        return plain and not _free(Access(n.tensor, n.indices[:cut], n.pos), wanted)

    return _every_read(node.body, wanted, served)


def _rows_body(c: Checked, k: _Kernel, names, cvars, rows: list[str]) -> list[str]:
    """A thread per row (the indices the reductions depend on): the row's reductions and
    temporaries once, then a loop over the row's elements (the other indices, flattened)."""
    k.flat_rows = True
    dims = dict(zip(names, c.domain, strict=True))
    cv = dict(zip(names, cvars, strict=True))
    cols = [n for n in names if n not in rows]
    row = k.fresh("row")
    lines = [
        f"const long long {row} = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        f"if ({row} >= {_total([dims[n] for n in rows])}) return;",
        *(_decode(k, row, [cv[n] for n in rows], [dims[n] for n in rows]) if rows else []),
    ]
    top, inner = _Block(), _Block()
    col = k.fresh("col")
    inner.lines += _decode(k, col, [cv[n] for n in cols], [dims[n] for n in cols])
    env = {n: (cv[n], 0 if n in rows else 1) for n in names}
    stores = []
    for o in c.outputs:
        t = c.tensors[o]
        st = c.formula.statements[t.statement]
        value = k.emit(st.rhs, env, [top, inner], t.statement)
        at = k.offset(c.domain, cvars)
        stores.append(f"{o}[{at}] = {_store(c, t.dtype, value)};")
    return [
        *lines,
        *top.lines,
        f"for (long long {col} = 0; {col} < {_total([dims[n] for n in cols])}; ++{col}) {{",
        *(f"    {line}" for line in inner.lines + stores),
        "}",
    ]


_SCAN_INIT = {"cumsum": 0.0, "cumprod": 1.0, "cummax": float("-inf"), "cummin": float("inf")}


def _scan_body(c: Checked, k: _Kernel, scan, names, cvars, top: _Block) -> list[str]:
    """A thread runs along the scanned index, writing each prefix's value as it goes (from the
    end for `rcumsum` and the other suffix scans)."""
    st, node = scan
    t = c.tensors[st.target.tensor]
    scanned = node.indices[0].name
    env = {n: (cv, 1 if n == scanned else 0) for n, cv in zip(names, cvars, strict=True)}
    inner = _Block()
    value = k.emit(node.body, env, [top, inner], t.statement)
    acc = k.fresh("acc")
    var = env[scanned][0]
    reverse = node.op.startswith("r")
    op = node.op.removeprefix("r")
    n = c.ranges[scanned]
    loop = (
        f"for (int {var} = {n} - 1; {var} >= 0; --{var}) {{"
        if reverse
        else f"for (int {var} = 0; {var} < {n}; ++{var}) {{"
    )
    update = {
        "cumsum": f"{acc} += {value};",
        "cumprod": f"{acc} *= {value};",
        "cummax": f"{acc} = {_MATH['max'][k.f]}({acc}, {value});",
        "cummin": f"{acc} = {_MATH['min'][k.f]}({acc}, {value});",
    }[op]
    offset = _offset(t.dims, cvars)
    return [
        *top.lines,
        f"{k.T} {acc} = {k.lit(_SCAN_INIT[op])};",
        loop,
        *(f"    {line}" for line in inner.lines),
        f"    {update}",
        f"    {st.target.tensor}[{offset}] = {_store(c, t.dtype, acc)};",
        "}",
    ]


def spread_reduction(c: Checked) -> Reduce | None:
    """The one sum or mean a result of one number reduces (a loss), which the whole grid shares:
    None where the result has another shape (several reductions, one that needs another's
    result, a max), which one block computes."""
    if c.domain or len(c.outputs) != 1:
        return None
    found = list(top_reductions(c.statement_of(c.outputs[0]).rhs))
    if len(found) != 1 or found[0].op not in ("sum", "mean"):
        return None
    return found[0]


def warp_per_element(c: Checked, node: Reduce) -> bool:
    """Whether the grid's sum takes a warp per element: each element holds reductions of its own
    (a loss over rows of a cosine similarity or a norm), all of them sums, means, products,
    maxima or minima, which the lanes split and combine by shuffles; a thread per element would
    walk its row alone, a warp's threads 32 rows apart."""
    found = _inner_reductions(c, node.body, c.tensors[c.outputs[0]].statement)
    return bool(found) and all(r.op in ("sum", "mean", "prod", "max", "min") for r in found)


def _inner_reductions(c: Checked, node: Node, k: int) -> list[Reduce]:
    """The reductions under `node`, through the temporaries it reads, outermost first."""
    if isinstance(node, Reduce):
        return [node, *_inner_reductions(c, node.body, k)]
    if isinstance(node, Access):
        t = c.tensors[node.tensor]
        if t.statement is not None and t.statement < k:
            return _inner_reductions(c, c.formula.statements[t.statement].rhs, t.statement)
        out: list[Reduce] = []
        for ix in node.indices:
            if ix.gather is not None:
                out += _inner_reductions(c, ix.gather, k)
        return out
    return [r for child in children(node) for r in _inner_reductions(c, child, k)]


def device_state(c: Checked, name: str) -> list[str]:
    """File-scope state of a spread reduction: the grid's total and its blocks' arrivals, which
    the last block to arrive reads and resets for the next launch."""
    if spread_reduction(c) is None:
        return []
    return [
        f"// {name}'s grid-wide sum and how many blocks have added to it; the last block resets both",
        f"__device__ double {name}_total = 0.0;",
        f"__device__ unsigned int {name}_arrived = 0u;",
        "",
    ]


def _spread_body(c: Checked, k: _Kernel, node: Reduce, name: str) -> list[str]:
    """A result of one number from one sum or mean over the whole grid: each thread strides over
    the flattened indices accumulating in double, each block combines its threads by a tree in
    shared memory and adds its total atomically; the last block to arrive (the arrivals counted
    after a fence) writes the result and resets the state."""
    red, acc, flat = k.fresh("partial"), k.fresh("acc"), k.fresh("flat")
    names = [k.fresh(f"{i.name}_") for i in node.indices]
    dims = [c.ranges[i.name] for i in node.indices]
    env = {i.name: (v, 1) for i, v in zip(node.indices, names, strict=True)}
    top, inner = _Block(), _Block()
    warps = warp_per_element(c, node)
    if warps:
        k.lane_block = inner
    decode = _decode(k, flat, names, dims)  # first: the element's reads are then at `flat`
    value = k.emit(node.body, env, [top, inner], c.tensors[c.outputs[0]].statement)
    k.lane_block = None
    tid = "threadIdx.x"
    total = f"{name}_total"
    if warps:  # a warp per element, its lanes splitting the element's own reductions
        head = [
            f"const int optiml_lane = {tid} % {LANES};",
            f"for (long long {flat} = ((long long)blockIdx.x * blockDim.x + {tid}) / {LANES}; "
            f"{flat} < {_total(dims)}; {flat} += (long long)gridDim.x * blockDim.x / {LANES}) {{",
        ]
        add = f"    if (optiml_lane == 0) {acc} += (double)({value});"
    else:
        head = [
            f"for (long long {flat} = (long long)blockIdx.x * blockDim.x + {tid}; "
            f"{flat} < {_total(dims)}; {flat} += (long long)gridDim.x * blockDim.x) {{"
        ]
        add = f"    {acc} += (double)({value});"
    lines = [
        f"__shared__ double {red}[{BLOCK}];",
        "__shared__ bool optiml_last;",
        *top.lines,
        f"double {acc} = 0.0;",
        *head,
        *(f"    {line}" for line in decode),
        *(f"    {line}" for line in inner.lines),
        add,
        "}",
        f"{red}[{tid}] = {acc};",
        "__syncthreads();",
        "for (int s = blockDim.x / 2; s > 0; s >>= 1) {",
        f"    if ({tid} < s) {red}[{tid}] += {red}[{tid} + s];",
        "    __syncthreads();",
        "}",
        f"if ({tid} == 0) {{",
        f"    atomicAdd(&{total}, {red}[0]);",
        "    __threadfence();  // the sum is added before the arrival is counted",
        f"    optiml_last = atomicAdd(&{name}_arrived, 1u) == gridDim.x - 1;",
        "}",
        "__syncthreads();",
        f"if (!optiml_last || {tid} != 0) return;",
        f"const double {acc}_all = atomicAdd(&{total}, 0.0);  // every block's, read once",
        f"{total} = 0.0;",
        f"{name}_arrived = 0u;",
    ]
    T = k.T
    result = (
        f"({T})({acc}_all / (double)({_total(dims)}))" if node.op == "mean" else f"({T}){acc}_all"
    )
    o = c.outputs[0]
    st = c.statement_of(o)
    k_top = _Block()
    k_top.memo[("r", id(node), ())] = result
    out = k.emit(st.rhs, {}, [k_top], c.tensors[o].statement)
    return [*lines, *k_top.lines, f"{o}[0] = {_store(c, c.tensors[o].dtype, out)};"]


def _scalar_body(c: Checked, k: _Kernel) -> list[str]:
    """A result of one number: one block; each top-level reduction is shared by its threads
    (each strides over the flattened indices, accumulating in double for sums, means and
    products), combined through shared memory by a tree; thread 0 writes the result."""
    red = k.fresh("partial")
    top = _Block()
    lines = [f"__shared__ double {red}[{BLOCK}];"]
    for o in c.outputs:
        t = c.tensors[o]
        st = c.formula.statements[t.statement]
        for node in top_reductions(st.rhs):
            _cooperative(c, k, node, red, top, t.statement)
        value = k.emit(st.rhs, {}, [top], t.statement)
        lines += top.lines
        top.lines = []
        lines.append(f"if (threadIdx.x == 0) {o}[0] = {_store(c, t.dtype, value)};")
    return lines


def _cooperative(c: Checked, k: _Kernel, node: Reduce, red: str, top: _Block, st: int):
    T = k.T
    wide = node.op in ("sum", "mean", "prod")
    A = "double" if wide else T
    names = [k.fresh(f"{i.name}_") for i in node.indices]
    dims = [c.ranges[i.name] for i in node.indices]
    env = {i.name: (v, 1) for i, v in zip(node.indices, names, strict=True)}
    inner = _Block()
    acc, flat, res = k.fresh("acc"), k.fresh("flat"), k.fresh("total")
    decode = _decode(k, flat, names, dims)  # first: the element's reads are then at `flat`
    value = k.emit(node.body, env, [top, inner], st)
    init = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "max": "-INFINITY", "min": "INFINITY"}
    if node.op not in init:
        raise AssertionError(node.op)  # the checker refuses argmax/argmin of everything
    fn = "fmax" if node.op == "max" else "fmin"
    combine = {
        "sum": "{a} + {b}",
        "mean": "{a} + {b}",
        "prod": "{a} * {b}",
        "max": fn + "({a}, {b})",
        "min": fn + "({a}, {b})",
    }[node.op]
    tid = "threadIdx.x"
    lines = [
        f"{A} {acc} = {init[node.op]};",
        f"for (long long {flat} = {tid}; {flat} < {_total(dims)}; {flat} += blockDim.x) {{",
        *(f"    {line}" for line in decode),
        *(f"    {line}" for line in inner.lines),
        f"    {acc} = {combine.format(a=acc, b=f'({A})({value})')};",
        "}",
        f"{red}[{tid}] = {acc};",
        "__syncthreads();",
        "for (int s = blockDim.x / 2; s > 0; s >>= 1) {",
        f"    if ({tid} < s) {red}[{tid}] = {combine.format(a=f'{red}[{tid}]', b=f'{red}[{tid} + s]')};",
        "    __syncthreads();",
        "}",
        f"const double {res} = {red}[0];",
        "__syncthreads();",
    ]
    result = f"({T})({res} / (double)({_total(dims)}))" if node.op == "mean" else f"({T}){res}"
    top.memo[("r", id(node), ())] = result
    top.lines += lines


MAX_SPEC_SIZES = 3  # sizes that vary in the spec's `sizes:`, beyond the output domain's


def spec_sizes(c: Checked) -> tuple[list[str], list[dict[str, int]], dict[str, int]]:
    """The size variables of the spec's `sizes:` (the output domain's, then others up to
    `MAX_SPEC_SIZES`), their cases (the given or default values, then a smaller case with none a
    multiple of the block), and the other sizes, which the spec holds fixed (`K = 128` in
    `args`)."""
    domain = list(dict.fromkeys(d for d in c.domain if d in c.sizes))
    order = list(dict.fromkeys(domain + list(c.sizes)))
    # every size of the output's domain varies (a smaller output reads no element a larger one
    # does not, so any of them is a valid case), and the first others up to MAX_SPEC_SIZES
    count = max(MAX_SPEC_SIZES, len(domain))
    names, fixed = order[:count], order[count:]
    first = {n: c.sizes[n].value for n in names}
    odd = {n: odd_size(v) for n, v in first.items()}
    held = {n: c.sizes[n].value for n in fixed}
    # The odd case is for correctness: small enough that the float64 NumPy reference checks it
    # in about a second a seed, a quarter again of its largest size while it is over that.
    while _elements(c, {**held, **odd}) > CHECK_ELEMENTS:
        largest = max(odd, key=lambda n: odd[n])
        if odd[largest] <= 4 * BLOCK:
            break
        odd[largest] = odd_size(odd[largest])

    # Where sizes the spec holds fixed keep it over that (a pool's or a convolution's input planes,
    # `height = 512`: KernelBench's 3-D average pool made a 323 M-element input at its odd case,
    # whose reference took most of a minute), or the reductions' terms do (a convolution's taps
    # for every output), the varying sizes shrink further, each step the one that lowers the cost
    # most, while a step lowers it by a tenth.
    def cost(values: dict[str, int]) -> float:
        return _elements(c, values) + _work(c, values) * CHECK_ELEMENTS / CHECK_WORK

    while (now := cost({**held, **odd})) > CHECK_ELEMENTS:
        steps = [{**odd, n: odd_size(v)} for n, v in odd.items() if odd_size(v) < v]
        if not steps:
            break
        best = min(steps, key=lambda s: cost({**held, **s}))
        if cost({**held, **best}) > 0.9 * now:
            break
        odd = best
    cases = [first] if odd == first else [first, odd]
    return names, cases, held


# The most elements (every tensor of the spec together) of the odd case; NumPy makes and checks
# about 16 M elements a second a seed (inputs alone), and the task's own size is checked against
# the kernel beyond `optiml.harness.evaluate.NUMPY_ELEMENTS`.
CHECK_ELEMENTS = 1 << 22


# The most terms of the odd case's reductions that NumPy evaluates element by element: it gathers
# a convolution's shifted input for every tap (KernelBench's 5 x 7 convolution over 64 channels
# took 11 s a seed at 2.6 G terms).
CHECK_WORK = 1 << 30


def _work(c: Checked, values: dict[str, int]) -> int:
    """The terms of every reduction as the NumPy reference makes them: the array it reduces spans
    the indices its body reads and its own, whatever the statement's (a row's sum inside an
    elementwise statement, as LogSoftmax's `out[b, d] = ... sum(d2) exp(x[b, d2] - mx[b])`,
    counts each row once, not once per element of the output); none for a sum of products of
    plain subscripts, which the reference hands to einsum whole (a GEMM's terms are BLAS's)."""

    def extent(name: str) -> int:
        d = c.ranges.get(name, "1")
        return int(d) if d.isdigit() else values.get(d, 1)

    def terms(node: Reduce) -> int:
        inner = sum(terms(r) for r in top_reductions(node.body))
        factors = _product_factors(node.body) if node.op in ("sum", "mean") else None
        if factors is not None and all(_plain(f) for f in factors):
            return inner
        names = _free(node.body, set(c.ranges)) | {ix.name for ix in node.indices}
        return inner + math.prod(extent(n) for n in names)

    return sum(terms(r) for st in c.formula.statements for r in top_reductions(st.rhs))


def _plain(node: Node) -> bool:
    """A factor einsum takes as it is: a tensor at index names, a number or a scalar."""
    if isinstance(node, Access):
        return not any(ix.affine or ix.gather is not None for ix in node.indices)
    return isinstance(node, Num | Name)


def _elements(c: Checked, values: dict[str, int]) -> int:
    total = 0
    for t in c.tensors.values():
        if t.role != "temp":
            total += math.prod(int(d) if d.isdigit() else values.get(d, 1) for d in t.dims)
    return total


def spec_comment(
    c: Checked, name: str, tol: tuple[float, float] | None, why: str, ref_file: str
) -> str:
    names, cases, fixed = spec_sizes(c)
    args = []
    for pname, _ in params(c):
        if pname in c.tensors:
            t = c.tensors[pname]
            length = " * ".join(t.dims) or "1"
            extent = c.value_ranges.get(pname)
            values = f" in [0, {extent})" if extent is not None else ""
            args.append(f"{pname}: {t.role} {SPEC_TYPES[t.dtype]}[{length}]{values}")
        elif pname in c.scalars:
            args.append(f"{pname} = {c.scalars[pname].value!r}")
        elif pname in fixed:
            args.append(f"{pname} = {fixed[pname]}")
    spread = spread_reduction(c)
    if c.domain:
        grid = f"cdiv({' * '.join(thread_dims(c)) or '1'}, {BLOCK})"
    elif spread is not None:  # the grid shares the sum: a few blocks per SM, a stride apart
        extent = " * ".join(c.ranges[i.name] for i in spread.indices)
        per = BLOCK // LANES if warp_per_element(c, spread) else BLOCK  # elements a block takes
        grid = f"min(cdiv({extent}, {per * 4}), 4 * sm_count)"
    else:
        grid = "1"
    if len(names) == 1:
        sizes_text = f"{names[0]} = " + ", ".join(str(s[names[0]]) for s in cases)
    else:
        sizes_text = f"{', '.join(names)} = " + ", ".join(
            "(" + ", ".join(str(s[n]) for n in names) + ")" for s in cases
        )
    lines = [
        "/* @optiml",
        f" *   args:      {', '.join(args)}",
        f" *   launch:    grid = {grid}, block = {BLOCK}",
        f" *   sizes:     {sizes_text}",
    ]
    if tol is not None:
        lines.append(f" *   tol:       rtol = {tol[0]:g}, atol = {tol[1]:g}  # {why}")
    if spread is not None:
        lines.append(
            " *   state:     kept  # the grid's sum, reset by the last block of each launch"
        )
    lines.append(f" *   reference: {ref_file}:{name}")
    lines.append(" */")
    return "\n".join(lines)


def odd_size(v: int) -> int:
    """A second size near a quarter of `v` that is not a multiple of the block."""
    out = max(v // 4 + 3, 1)
    if out % BLOCK == 0:
        out += 1
    return out


def size_cases(c: Checked) -> list[dict[str, int]]:
    """Every size's value in each case of the spec."""
    _, cases, fixed = spec_sizes(c)
    return [{**case, **fixed} for case in cases]


def headers(c: Checked) -> list[str]:
    types = {t.dtype for t in c.tensors.values()}
    out = ["#include <math.h>"]
    if "half" in types:
        out.append("#include <cuda_fp16.h>")
    if "bf16" in types:
        out.append("#include <cuda_bf16.h>")
    return out


def kernel_text(c: Checked, name: str, tol, why: str, ref_file: str) -> str:
    decls = ",\n    ".join(d for _, d in params(c))
    body = "\n".join(f"    {line}" for line in kernel_body(c, name))
    state = "\n".join(device_state(c, name))
    return (
        (f"{state}\n" if state else "") + f"{spec_comment(c, name, tol, why, ref_file)}\n"
        f"__global__ void {name}(\n    {decls})\n{{\n{body}\n}}\n"
    )
