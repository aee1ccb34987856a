"""The NumPy reference module of a checked formula: every statement computed in float64 on whole
tensors, in the kernel's argument order, returning the outputs (the harness's contract: see
`optiml.harness.evaluate._numpy_expected`)."""

from __future__ import annotations

import keyword
import math

from optiml.generate.check import SCANS
from optiml.generate.model import Access, Binary, Call, Checked, Name, Node, Num, Reduce, Unary

HELPERS = '''
import math

import numpy as np


class _V:
    """A value over named axes: `a` has one dimension per name of `ax`."""

    def __init__(self, a, ax=()):
        self.a = np.asarray(a, dtype=np.float64) if not ax else a
        self.ax = tuple(ax)


def _c(value):
    return _V(np.float64(value))


def _index(name, n):
    return _V(np.arange(n, dtype=np.float64), (name,))


def _at(array, *ax):
    if len(set(ax)) < len(ax):  # a repeated index: the diagonal
        letters = "".join(chr(97 + sorted(set(ax), key=ax.index).index(x)) for x in ax)
        out = "".join(dict.fromkeys(letters))
        return _V(np.einsum(f"{letters}->{out}", array), tuple(dict.fromkeys(ax)))
    return _V(array, ax)


def _placed(v, axes):
    """`v`'s array with its axes in the order of `axes`, a dimension of 1 for each it lacks."""
    a = np.transpose(v.a, sorted(range(len(v.ax)), key=lambda i: axes.index(v.ax[i])))
    return np.reshape(a, [v.a.shape[v.ax.index(x)] if x in v.ax else 1 for x in axes])


def _align(*vs):
    axes = list(dict.fromkeys(x for v in vs for x in v.ax))
    return tuple(axes), [_placed(v, axes) for v in vs]


def _op(f, *vs):
    axes, arrays = _align(*vs)
    return _V(f(*arrays), axes)


def _full(v, names, extents):
    a, ax = v.a, list(v.ax)
    for n in names:
        if n not in ax:
            a = np.broadcast_to(np.expand_dims(a, -1), (*a.shape, extents[n]))
            ax.append(n)
    return a, ax


def _reduce(kind, v, names, extents):
    a, ax = _full(v, names, extents)
    axis = tuple(ax.index(n) for n in names)
    rest = tuple(x for x in ax if x not in names)
    if kind in ("argmax", "argmin"):
        f = np.argmax if kind == "argmax" else np.argmin
        return _V(f(a, axis=axis[0]).astype(np.float64), rest)
    f = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min}[kind]
    return _V(f(a, axis=axis), rest)


def _win(array, pad, subs, extents):
    """`array` read at affine subscripts, gathered with NumPy's advanced indexing: `subs` has per
    dimension ((coefficient, index or None), ...) and a divisor; a position outside the array,
    or one the divisor does not divide, reads `pad`."""
    names = list(dict.fromkeys(n for terms, _ in subs for _, n in terms if n is not None))
    shape = [extents[n] for n in names]
    ok = np.ones(shape, dtype=bool)
    where = []
    for dim, (terms, div) in enumerate(subs):
        pos = np.zeros(shape, dtype=np.int64)
        for coef, n in terms:
            if n is None:
                pos = pos + int(coef)
            else:
                axis = [-1 if m == n else 1 for m in names]
                pos = pos + int(coef) * np.arange(extents[n], dtype=np.int64).reshape(axis)
        if div != 1:
            ok &= pos % div == 0
            pos = pos // div
        ok &= (pos >= 0) & (pos < array.shape[dim])
        where.append(np.clip(pos, 0, array.shape[dim] - 1))
    return _V(np.where(ok, array[tuple(where)], np.float64(pad)), names)


def _gather(array, subs, extents):
    """`array` read at subscripts that are index names ("i", name) or elements of an int
    input (`_V` over its index names): NumPy's advanced indexing, over the names in order."""
    names = []
    for kind, v in subs:
        for n in [v] if kind == "i" else v.ax:
            if n not in names:
                names.append(n)
    where = []
    for kind, v in subs:
        if kind == "i":
            where.append(np.arange(extents[v]).reshape([-1 if m == v else 1 for m in names]))
            continue
        where.append(_placed(v, names).astype(np.int64))
    return _V(array[tuple(where)], tuple(names))


def _scan(kind, v, name, extents):
    a, ax = _full(v, [name], extents)
    f = {
        "cumsum": np.cumsum,
        "cumprod": np.cumprod,
        "cummax": np.maximum.accumulate,
        "cummin": np.minimum.accumulate,
    }[kind.removeprefix("r")]
    axis = ax.index(name)
    if kind.startswith("r"):  # from the end: a suffix scan
        return _V(np.flip(f(np.flip(a, axis), axis=axis), axis), ax)
    return _V(f(a, axis=axis), ax)


def _sum_of_product(names, extents, *factors, mean=False):
    """sum over `names` of a product of factors, as one einsum (no product tensor is built)."""
    letters = {}
    subs = ["".join(letters.setdefault(x, chr(97 + len(letters))) for x in f.ax) for f in factors]
    axes = list(dict.fromkeys(x for f in factors for x in f.ax))
    rest = tuple(x for x in axes if x not in names)
    out = "".join(letters[x] for x in rest)
    r = np.einsum(",".join(subs) + "->" + out, *[f.a for f in factors], optimize=True)
    count = 1
    for n in names:
        if n not in axes:
            r = r * extents[n]
        count *= extents[n]
    return _V(r / count if mean else r, rest)


def _result(v, ax, shape):
    axes, (a,) = _align(v)
    a = np.transpose(a, [axes.index(x) for x in ax if x in axes]) if axes else a
    a = np.reshape(a, [shape[i] if x in axes else 1 for i, x in enumerate(ax)])
    return np.broadcast_to(a, shape).astype(np.float64)


def _min(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return out


def _max(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return out


_erf = np.vectorize(math.erf, otypes=[np.float64])
'''

_FUNCS = {
    "exp": "np.exp",
    "log": "np.log",
    "sqrt": "np.sqrt",
    "rsqrt": "(lambda a: 1.0 / np.sqrt(a))",
    "tanh": "np.tanh",
    "erf": "_erf",
    "sin": "np.sin",
    "cos": "np.cos",
    "abs": "np.abs",
    "sigmoid": "(lambda a: 1.0 / (1.0 + np.exp(-a)))",
    "pow": "np.power",
    "min": "_min",
    "max": "_max",
    "where": "np.where",
}
_OPS = {
    "+": "np.add",
    "-": "np.subtract",
    "*": "np.multiply",
    "/": "np.divide",
    "**": "np.power",
    "<": "np.less",
    "<=": "np.less_equal",
    ">": "np.greater",
    ">=": "np.greater_equal",
    "==": "np.equal",
    "!=": "np.not_equal",
}


def py_name(name: str) -> str:
    return f"{name}_" if keyword.iskeyword(name) or name in ("np", "math") else name


class _Ref:
    def __init__(self, c: Checked):
        self.c = c

    def extents(self) -> str:
        items = ", ".join(f"{i!r}: {py_name(b)}" for i, b in self.c.ranges.items())
        return "{" + items + "}"

    def expr(self, node: Node) -> str:
        if isinstance(node, Num):
            if math.isinf(node.value):
                return f"_c({'' if node.value > 0 else '-'}math.inf)"
            return f"_c({node.value!r})"
        if isinstance(node, Name):
            if node.kind == "index":
                return f"_index({node.name!r}, {py_name(self.c.ranges[node.name])})"
            return f"_c({py_name(node.name)})"
        if isinstance(node, Access):
            return self.access(node, "0.0")
        if isinstance(node, Unary):
            return f"_op(np.negative, {self.expr(node.operand)})"
        if isinstance(node, Binary):
            return f"_op({_OPS[node.op]}, {self.expr(node.left)}, {self.expr(node.right)})"
        if isinstance(node, Call):
            if node.func == "pad":
                return self.access(node.args[0], f"{self.expr(node.args[1])}.a")
            args = ", ".join(self.expr(a) for a in node.args)
            return f"_op({_FUNCS[node.func]}, {args})"
        if isinstance(node, Reduce) and node.op in SCANS:
            name = node.indices[0].name
            return f"_scan({node.op!r}, {self.expr(node.body)}, {name!r}, _E)"
        if isinstance(node, Reduce):
            names = tuple(i.name for i in node.indices)
            factors = _product_factors(node.body)
            if node.op in ("sum", "mean") and factors is not None:
                fs = ", ".join(self.expr(f) for f in factors)
                mean = ", mean=True" if node.op == "mean" else ""
                return f"_sum_of_product({names!r}, _E, {fs}{mean})"
            return f"_reduce({node.op!r}, {self.expr(node.body)}, {names!r}, _E)"
        raise AssertionError(node)

    def access(self, node: Access, pad: str) -> str:
        if any(i.gather is not None for i in node.indices):
            subs = ", ".join(
                f"('g', {self.access(i.gather, pad)})"
                if i.gather is not None
                else f"('i', {i.name!r})"
                for i in node.indices
            )
            return f"_gather({py_name(node.tensor)}, ({subs},), _E)"
        if not any(i.affine for i in node.indices):
            ax = ", ".join(repr(i.name) for i in node.indices)
            return f"_at({py_name(node.tensor)}, {ax})"
        subs = []
        for ix in node.indices:
            terms = [(1, [ix.name])] if not ix.affine else ix.terms
            parts = []
            for sign, factors in terms:
                index = [f for f in factors if f in self.c.ranges]
                coef = [f if f[0].isdigit() else py_name(f) for f in factors if f not in index]
                value = " * ".join([str(sign), *coef])
                parts.append(f"({value}, {index[0]!r})" if index else f"({value}, None)")
            div = "1" if ix.div is None else ix.div if ix.div.isdigit() else py_name(ix.div)
            subs.append(f"(({', '.join(parts)},), {div})")
        return f"_win({py_name(node.tensor)}, {pad}, ({', '.join(subs)},), _E)"


def _product_factors(node: Node) -> list[Node] | None:
    """The factors of a product `a * b * c`, or None where the body is not a product."""
    if isinstance(node, Binary) and node.op == "*":
        left = _product_factors(node.left) or [node.left]
        right = _product_factors(node.right) or [node.right]
        return left + right
    return None


def reference_text(c: Checked, name: str, param_names: list[str], formula: str) -> str:
    r = _Ref(c)
    quoted = "\n".join(f"    {line}" for line in formula.strip().splitlines())
    lines = [
        f'"""NumPy reference of `{name}`, generated by `optiml generate` from the formula',
        "",
        quoted.replace('"""', "'''").replace("\\", "\\\\"),
        "",
        "Computed in float64. The harness calls it with the kernel's arguments in order (arrays",
        'flat) and takes the outputs it returns, in the order of the spec\'s `args`."""',
        HELPERS,
        "",
        f"def {py_name(name)}({', '.join(py_name(p) for p in param_names)}):",
        '    with np.errstate(all="ignore"):',
        f"        _E = {r.extents()}",
    ]
    for t in c.tensors.values():
        if t.role in ("in", "inout"):
            shape = ", ".join(py_name(d) for d in t.dims)
            n = py_name(t.name)
            lines.append(f"        {n} = np.asarray({n}, dtype=np.float64).reshape({shape},)")
    for st in c.formula.statements:
        t = c.tensors[st.target.tensor]
        ax = tuple(i.name for i in st.target.indices)
        shape = "".join(f"{py_name(d)}, " for d in t.dims)
        lines.append(f"        {py_name(t.name)} = _result({r.expr(st.rhs)}, {ax!r}, ({shape}))")
    outs = ", ".join(f"{py_name(o)}.reshape(-1)" for o in _spec_outputs(c, param_names))
    lines.append(f"        return ({outs},)")
    return "\n".join(lines) + "\n"


def _spec_outputs(c: Checked, param_names: list[str]) -> list[str]:
    return [p for p in param_names if p in c.tensors and c.tensors[p].role in ("out", "inout")]
