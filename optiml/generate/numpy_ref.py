"""The NumPy reference module of a checked formula: every statement computed in float64 on whole
tensors, in the kernel's argument order, returning the outputs (the harness's contract: see
`optiml.harness.evaluate._numpy_expected`)."""

from __future__ import annotations

import keyword
import math
from collections.abc import Iterator

from optiml.generate.check import SCANS
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
    children,
)

HELPERS = '''
import itertools
import math

import numpy as np

# The most elements one factor of a reduction may span before the reduction loops over the
# reduced names in Python (a convolution's taps) rather than building the factor whole.
_SPAN = 1 << 26


class _V:
    """A value over named axes: `a` has one dimension per name of `ax`."""

    def __init__(self, a, ax=()):
        self.a = np.asarray(a, dtype=np.float64) if not ax else a
        self.ax = tuple(ax)


def _c(value):
    return _V(np.float64(value))


def _index(name, extents):
    r = extents[name]
    return _V(np.arange(r.start, r.stop, dtype=np.float64), (name,))


def _at(array, extents, *ax):
    """`array` read at index names: each dimension over its name's range (one element of it
    where a reduction loops over that name)."""
    array = array[tuple(slice(extents[x].start, extents[x].stop) for x in ax)]
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
            a = np.broadcast_to(np.expand_dims(a, -1), (*a.shape, len(extents[n])))
            ax.append(n)
    return a, ax


def _taps(names, extents, spans, taps):
    """The reduced names to take one value at a time where a factor (`spans`: each factor's
    index names) spans more than _SPAN elements: every tap (`taps`: reduced names that shift a
    subscript of another name, a window's offsets, so that each read is a view), then, while a
    factor is still too large, other reduced names, smallest range first."""
    fixed = []

    def size(ax):
        return math.prod(1 if n in fixed else len(extents[n]) for n in set(ax))

    if max(map(size, spans), default=0) > _SPAN:
        fixed = [n for n in taps if n in names]
    while True:
        big = max(spans, key=size, default=())
        free = sorted((n for n in names if n in big and n not in fixed), key=lambda n: len(extents[n]))
        if size(big) <= _SPAN or not free:
            return fixed
        fixed.append(free[0])


def _tapped(names, extents, spans, taps):
    """The restricted extents of each step of a reduction's loop over its taps (one step, the
    extents as they are, where no factor is too large)."""
    fixed = _taps(names, extents, spans, taps)
    for values in itertools.product(*(extents[n] for n in fixed)):
        yield dict(extents, **{n: range(t, t + 1) for n, t in zip(fixed, values)})


_COMBINE = {"sum": np.add, "mean": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduce(kind, body, names, extents, spans, taps):
    """`kind` over `names` of `body` (a function of the extents: called once per tap where the
    body would span too many elements whole)."""
    if kind in ("argmax", "argmin"):
        a, ax = _full(body(extents), names, extents)
        f = np.argmax if kind == "argmax" else np.argmin
        rest = tuple(x for x in ax if x not in names)
        return _V(f(a, axis=ax.index(names[0])).astype(np.float64), rest)
    f = {"sum": np.sum, "mean": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[kind]
    total = rest = None
    for e in _tapped(names, extents, [spans], taps):
        a, ax = _full(body(e), names, e)
        part = f(a, axis=tuple(ax.index(n) for n in names))
        total = part if total is None else _COMBINE[kind](total, part)
        rest = tuple(x for x in ax if x not in names)
    if kind == "mean":
        total = total / math.prod(len(extents[n]) for n in names)
    return _V(total, rest)


def _win(array, pad, subs, extents):
    """`array` read at affine subscripts, gathered with NumPy's advanced indexing: `subs` has per
    dimension ((coefficient, index or None), ...) and a divisor; a position outside the array,
    or one the divisor does not divide, reads `pad`. Each dimension's positions span only the
    names its subscript reads (broadcast by the indexing), so no index array is as large as the
    window."""
    names = list(dict.fromkeys(n for terms, _ in subs for _, n in terms if n is not None))
    sliced = _win_sliced(array, pad, subs, extents, names)
    if sliced is not None:
        return sliced
    ok, where = True, []
    for dim, (terms, div) in enumerate(subs):
        pos = np.zeros([1] * len(names), dtype=np.int64)
        for coef, n in terms:
            if n is None:
                pos = pos + int(coef)
            else:
                axis = [-1 if m == n else 1 for m in names]
                r = extents[n]
                pos = pos + int(coef) * np.arange(r.start, r.stop, dtype=np.int64).reshape(axis)
        if div != 1:
            ok = ok & (pos % div == 0)
            pos = pos // div
        ok = ok & (pos >= 0) & (pos < array.shape[dim])
        where.append(np.clip(pos, 0, array.shape[dim] - 1))
    a = array[tuple(where)]
    shape = [len(extents[n]) for n in names]
    if not np.all(ok):
        a = np.where(ok, a, np.float64(pad))
    return _V(np.broadcast_to(a, shape), names)


def _win_sliced(array, pad, subs, extents, names):
    """`_win` as slices, where each dimension's subscript varies with one name at most, no name
    in two, and the positions it reads run forward: a view of `array` where no position falls
    outside it, else the padded result with the view copied in. None where it is not so."""
    free = [[n for _, n in terms if n is not None and len(extents[n]) > 1] for terms, _ in subs]
    if any(len(f) > 1 for f in free) or len(sum(free, [])) != len(set(sum(free, []))):
        return None
    inner, outer, axes = [], [], []
    for dim, ((terms, div), f) in enumerate(zip(subs, free)):
        n = f[0] if f else None
        pos = np.zeros(1 if n is None else len(extents[n]), dtype=np.int64)
        for coef, m in terms:
            if m is None:
                pos = pos + int(coef)
            elif m == n:
                pos = pos + int(coef) * np.arange(extents[m].start, extents[m].stop, dtype=np.int64)
            else:  # a name of one value here
                pos = pos + int(coef) * extents[m].start
        ok = pos % div == 0 if div != 1 else np.ones(pos.shape, dtype=bool)
        pos = pos // div
        at = np.flatnonzero(ok & (pos >= 0) & (pos < array.shape[dim]))
        if at.size == 0:  # nothing of `array` is read: all padding
            shape = [len(extents[m]) for m in names]
            return _V(np.full(shape, np.float64(pad)), names)
        step, read = (at[1] - at[0], pos[at[1]] - pos[at[0]]) if at.size > 1 else (1, 1)
        if read <= 0 or np.any(np.diff(at) != step):
            return None
        outer.append(slice(at[0], at[-1] + 1, step))
        inner.append(slice(pos[at[0]], pos[at[-1]] + 1, read))
        axes.append((n, pos.size))
    a = array[tuple(inner)]
    shape = tuple(size for _, size in axes)
    if a.shape != shape:  # some positions fall outside: padding around the view
        full = np.full(shape, np.float64(pad))
        full[tuple(outer)] = a
        a = full
    ax = [n for n, _ in axes if n is not None]
    held = [m for m in names if m not in ax]  # names of one value: an axis of one element each
    a = np.reshape(a, [len(extents[m]) for m in ax] + [1] * len(held))
    return _V(a, (*ax, *held))


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
            r = extents[v]
            where.append(np.arange(r.start, r.stop).reshape([-1 if m == v else 1 for m in names]))
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


def _sum_of_product(names, extents, spans, taps, *factors, mean=False):
    """sum over `names` of a product of factors (each a function of the extents, `spans` their
    index names), as one einsum (no product tensor is built), or one per tap where a factor
    would span too many elements whole (a convolution's input gathered for every tap)."""
    r = rest = None
    for e in _tapped(names, extents, spans, taps):
        vs = [f(e) for f in factors]
        letters = {}
        subs = ["".join(letters.setdefault(x, chr(97 + len(letters))) for x in v.ax) for v in vs]
        axes = list(dict.fromkeys(x for v in vs for x in v.ax))
        rest = tuple(x for x in axes if x not in names)
        out = "".join(letters[x] for x in rest)
        part = np.einsum(",".join(subs) + "->" + out, *[v.a for v in vs], optimize=True)
        r = part if r is None else r + part
    for n in names:
        if n not in axes:
            r = r * len(extents[n])
    return _V(r / math.prod(len(extents[n]) for n in names) if mean else r, rest)


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
        items = ", ".join(f"{i!r}: range({py_name(b)})" for i, b in self.c.ranges.items())
        return "{" + items + "}"

    def expr(self, node: Node) -> str:
        if isinstance(node, Num):
            if math.isinf(node.value):
                return f"_c({'' if node.value > 0 else '-'}math.inf)"
            return f"_c({node.value!r})"
        if isinstance(node, Name):
            if node.kind == "index":
                return f"_index({node.name!r}, _E)"
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
                fs = ", ".join(f"lambda _E: {self.expr(f)}" for f in factors)
                spans = tuple(_index_names(f, self.c.ranges) for f in factors)
                taps = _shifts(node.body, self.c.ranges)
                mean = ", mean=True" if node.op == "mean" else ""
                return f"_sum_of_product({names!r}, _E, {spans!r}, {taps!r}, {fs}{mean})"
            body, spans = self.expr(node.body), _index_names(node.body, self.c.ranges)
            taps = _shifts(node.body, self.c.ranges)
            return f"_reduce({node.op!r}, lambda _E: {body}, {names!r}, _E, {spans!r}, {taps!r})"
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
            return f"_at({py_name(node.tensor)}, _E, {ax})"
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


def _reads(node: Node, ranges: dict[str, str]) -> Iterator[list[str]]:
    """The index names each read of a node takes: one list per subscript dimension (through the
    subscripts of a gather), and one for an index used as a value."""
    if isinstance(node, Name) and node.kind == "index":
        yield [node.name]
    elif isinstance(node, Access):
        for ix in node.indices:
            if ix.gather is not None:
                yield from _reads(ix.gather, ranges)
            elif ix.affine:
                yield [f for _, factors in ix.terms for f in factors if f in ranges]
            else:
                yield [ix.name]
    for child in children(node):
        yield from _reads(child, ranges)


def _shifts(node: Node, ranges: dict[str, str]) -> tuple[str, ...]:
    """The index names a node's subscripts read beside another index name in one dimension
    (`o * S + k - P`: both), in order."""
    return tuple(
        dict.fromkeys(n for read in _reads(node, ranges) if len(set(read)) > 1 for n in read)
    )


def _index_names(node: Node, ranges: dict[str, str]) -> tuple[str, ...]:
    """The index names a node reads, in order (those of its subscripts and its index values)."""
    return tuple(dict.fromkeys(n for read in _reads(node, ranges) for n in read))


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
