"""The plain kernel of a checked formula, with its `@optiml` spec.

One thread per element of the output domain (a 1-D flattened index with a bounds check). Every
value is computed in `float` (`double` where a tensor or scalar is double), half and bf16 loaded
and stored through cuda_fp16.h / cuda_bf16.h. A temporary is never stored: a thread computes the
elements of it that it needs, once each — a reduction or temporary that depends only on indices
bound outside a loop is computed before that loop (a row's max and sum in softmax are computed
once per thread, not once per column).
"""

from __future__ import annotations

from optiml.generate.check import BLOCK
from optiml.generate.model import (
    Access,
    Binary,
    Call,
    Checked,
    Name,
    Node,
    Num,
    Reduce,
    Unary,
)

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


class _Kernel:
    def __init__(self, c: Checked):
        self.c = c
        self.T = c.compute
        self.f = 1 if self.T == "double" else 0
        self.taken = set(c.tensors) | set(c.scalars) | set(c.sizes) | set(c.ranges)
        self.counter = 0

    def fresh(self, base: str) -> str:
        while True:
            self.counter += 1
            name = f"{base}{self.counter}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def lit(self, v: float) -> str:
        text = repr(float(v))
        return text if self.T == "double" else f"{text}f"

    # ---- what a value depends on ----

    def level(self, node: Node, env: dict[str, tuple[str, int]]) -> int:
        if isinstance(node, Num):
            return 0
        if isinstance(node, Name):
            return env[node.name][1] if node.kind == "index" else 0
        if isinstance(node, Access):
            return max([0] + [env[i.name][1] for i in node.indices])
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
            a = self.emit(node.left, env, stack, k)
            b = self.emit(node.right, env, stack, k)
            if node.op == "**":
                return f"{_MATH['pow'][self.f]}({a}, {b})"
            return f"({a} {node.op} {b})"
        if isinstance(node, Call):
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

    def access(self, a: Access, env, stack: list[_Block], k: int) -> str:
        t = self.c.tensors[a.tensor]
        if t.statement is not None and t.statement < k:  # a result of an earlier statement
            return self.temporary(a, env, stack)
        idx = [env[i.name][0] for i in a.indices]
        load = f"{a.tensor}[{_offset(t.dims, idx)}]"
        if t.dtype in _LOAD:
            return _LOAD[t.dtype].format(load)
        if t.dtype != self.T:
            return f"({self.T}){load}"
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

    def reduce(self, node: Reduce, env, stack: list[_Block], k: int) -> str:
        T = self.T
        level = self.level(node, env)
        target = stack[level]
        key = ("r", id(node), tuple(sorted((n, v[0]) for n, v in env.items())))
        if key in target.memo:
            return target.memo[key]
        inner_block = _Block()
        inner_env = dict(env)
        loops = []
        for ix in node.indices:
            var = self.fresh(f"{ix.name}_")
            bound = self.c.ranges[ix.name]
            loops.append(f"for (int {var} = 0; {var} < {bound}; ++{var}) {{")
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
        head = [f"{T} {acc} = {init};"]
        result = acc
        if op in ("sum", "mean"):
            update = [f"{acc} += {v};"]
        elif op == "prod":
            update = [f"{acc} *= {v};"]
        elif op in ("max", "min"):
            update = [f"{acc} = {_MATH[op][self.f]}({acc}, {v});"]
        else:
            arg = self.fresh("arg")
            head.append(f"int {arg} = 0;")
            cmp = ">" if op == "argmax" else "<"
            val = self.fresh("v")
            loop_var = inner_env[node.indices[0].name][0]
            update = [
                f"const {T} {val} = {v};",
                f"if ({val} {cmp} {acc}) {{ {acc} = {val}; {arg} = {loop_var}; }}",
            ]
            result = arg
        body = inner_block.lines + update
        pad = "    "
        lines = list(head)
        for depth, loop in enumerate(loops):
            lines.append(pad * depth + loop)
        lines += [pad * len(loops) + line for line in body]
        for depth in reversed(range(len(loops))):
            lines.append(pad * depth + "}")
        target.lines += lines
        if op == "mean":
            extent = " * ".join(self.c.ranges[i.name] for i in node.indices)
            result = f"({acc} / ({T})({extent}))"
        target.memo[key] = result
        return result


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


def kernel_body(c: Checked) -> list[str]:
    k = _Kernel(c)
    dims = c.domain
    first = c.tensors[c.outputs[0]]
    names = [i.name for i in c.formula.statements[first.statement].target.indices]
    total = " * ".join(f"(long long){d}" if n == 0 else d for n, d in enumerate(dims))
    idx = k.fresh("idx")
    top = _Block()
    lines = [
        f"const long long {idx} = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        f"if ({idx} >= {total}) return;",
    ]
    cvars = [k.fresh(f"{n}_") if n in RESERVED_C else n for n in names]
    if len(dims) == 1:
        lines.append(f"const int {cvars[0]} = (int){idx};")
    else:
        rest = k.fresh("rest")
        lines.append(f"long long {rest} = {idx};")
        for n in reversed(range(1, len(dims))):
            lines.append(f"const int {cvars[n]} = (int)({rest} % {dims[n]});")
            lines.append(f"{rest} /= {dims[n]};")
        lines.append(f"const int {cvars[0]} = (int){rest};")
    stores = []
    for o in c.outputs:
        t = c.tensors[o]
        st = c.formula.statements[t.statement]
        env = {ix.name: (cv, 0) for ix, cv in zip(st.target.indices, cvars, strict=True)}
        value = k.emit(st.rhs, env, [top], t.statement)
        if t.dtype in _STORE:
            value = _STORE[t.dtype].format(value)
        elif t.dtype != c.compute:
            value = f"({C_TYPES[t.dtype]})({value})"
        stores.append(f"{o}[{idx}] = {value};")
    return lines + top.lines + stores


MAX_SPEC_SIZES = 3  # a size of the spec's `sizes:` is a tuple of at most three values


def spec_sizes(c: Checked) -> tuple[list[str], list[dict[str, int]], dict[str, int]]:
    """The size variables of the spec's `sizes:` (the output domain's first), their cases (the
    given or default values, then a case with none a multiple of the block), and the sizes past
    the third, which the spec can only give as fixed values (`K = 128` in `args`)."""
    order = list(dict.fromkeys([d for d in c.domain if d in c.sizes] + list(c.sizes)))
    names, fixed = order[:MAX_SPEC_SIZES], order[MAX_SPEC_SIZES:]
    first = {n: c.sizes[n].value for n in names}
    odd = {n: odd_size(v) for n, v in first.items()}
    cases = [first] if odd == first else [first, odd]
    return names, cases, {n: c.sizes[n].value for n in fixed}


def spec_comment(
    c: Checked, name: str, tol: tuple[float, float] | None, why: str, ref_file: str
) -> str:
    names, cases, fixed = spec_sizes(c)
    args = []
    for pname, _ in params(c):
        if pname in c.tensors:
            t = c.tensors[pname]
            length = " * ".join(t.dims)
            args.append(f"{pname}: {t.role} {SPEC_TYPES[t.dtype]}[{length}]")
        elif pname in c.scalars:
            args.append(f"{pname} = {c.scalars[pname].value!r}")
        elif pname in fixed:
            args.append(f"{pname} = {fixed[pname]}")
    total = " * ".join(c.domain)
    if len(names) == 1:
        sizes_text = f"{names[0]} = " + ", ".join(str(s[names[0]]) for s in cases)
    else:
        sizes_text = f"{', '.join(names)} = " + ", ".join(
            "(" + ", ".join(str(s[n]) for n in names) + ")" for s in cases
        )
    lines = [
        "/* @optiml",
        f" *   args:      {', '.join(args)}",
        f" *   launch:    grid = cdiv({total}, {BLOCK}), block = {BLOCK}",
        f" *   sizes:     {sizes_text}",
    ]
    if tol is not None:
        lines.append(f" *   tol:       rtol = {tol[0]:g}, atol = {tol[1]:g}  # {why}")
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
    body = "\n".join(f"    {line}" for line in kernel_body(c))
    return (
        f"{spec_comment(c, name, tol, why, ref_file)}\n"
        f"__global__ void {name}(\n    {decls})\n{{\n{body}\n}}\n"
    )
