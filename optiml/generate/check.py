"""From the parsed formula to the checked model: names resolved, index ranges inferred and
checked against shapes, roles and element types of tensors, sizes and scalars with values.

Every error is a `FormulaError` at the position of the text it is about, saying what would be
right."""

from __future__ import annotations

import difflib

from optiml.expr import Expr, ExprError
from optiml.generate.model import (
    Access,
    Binary,
    Call,
    Checked,
    Formula,
    Index,
    Name,
    Node,
    Num,
    Pos,
    Reduce,
    Reduction,
    Scalar,
    Size,
    Statement,
    Tensor,
    Unary,
    children,
)
from optiml.generate.parser import FormulaSource

# element types a tensor may have, by every spelling accepted
DTYPES = {
    "float": "float",
    "float32": "float",
    "double": "double",
    "float64": "double",
    "half": "half",
    "__half": "half",
    "float16": "half",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "__nv_bfloat16": "bf16",
    "int": "int",
    "int32": "int",
}
TYPE_LIST = "float, double, half, bf16, int"
SCALAR_TYPES = ("float", "double", "int")

# function -> (fewest arguments, most arguments or None)
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "exp": (1, 1),
    "log": (1, 1),
    "sqrt": (1, 1),
    "rsqrt": (1, 1),
    "tanh": (1, 1),
    "erf": (1, 1),
    "sin": (1, 1),
    "cos": (1, 1),
    "abs": (1, 1),
    "sigmoid": (1, 1),
    "pow": (2, 2),
    "min": (2, None),
    "max": (2, None),
    "where": (3, 3),
    "pad": (2, 2),
}
REDUCERS = ("sum", "prod", "max", "min", "mean", "argmax", "argmin")
SCANS = ("cumsum", "cumprod", "cummax", "cummin", "rcumsum", "rcumprod", "rcummax", "rcummin")
FUNCTION_LIST = ", ".join(
    f"{f}(a, b, ...)" if most is None else f"{f}({', '.join('abc'[:least])})"
    for f, (least, most) in FUNCTIONS.items()
)

BLOCK = 256  # threads per block of the generated kernel


def _near(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`? " if close else ""


def _fmt_access(tensor: str, dims) -> str:
    return f"{tensor}[{', '.join(dims)}]"


class _Checker:
    def __init__(self, formula: Formula, source: FormulaSource):
        self.f = formula
        self.src = source
        self.tensors: dict[str, Tensor] = {}
        self.decl_pos: dict[str, Pos] = {}
        self.scalars: dict[str, Scalar] = {}
        self.sizes: dict[str, Size] = {}
        self.size_names: set[str] = set()
        self.ranges: dict[str, tuple[str, Pos]] = {}
        self.defined_at: dict[str, Pos] = {}  # tensor -> its statement's position
        self.read: set[str] = set()
        self.inout: set[str] = set()
        self.reductions: list[Reduction] = []
        self.implicit: dict[str, Access] = {}  # inputs nobody declared: their first access
        self.value_ranges: dict[str, str] = {}  # an int input read as a subscript -> its extent
        self.scans: list[tuple[int, Reduce]] = []  # (statement, scan)
        self.notes: list[str] = []

    def fail(self, message: str, pos: Pos | None):
        raise self.src.error(message, pos)

    # ---- declarations ----

    def declarations(self) -> None:
        for d in self.f.tensors:
            dtype = DTYPES.get(d.dtype)
            if dtype is None:
                self.fail(
                    f"unknown element type `{d.dtype}`; {_near(d.dtype, DTYPES)}"
                    f"tensors are one of: {TYPE_LIST}",
                    d.dtype_pos,
                )
            if d.name in self.tensors:
                at = self.decl_pos[d.name]
                self.fail(
                    f"tensor `{d.name}` is declared twice (first at {at.line}:{at.column}); "
                    "declare it once",
                    d.pos,
                )
            dims = []
            for dim, pos in d.dims:
                if dim[0].isdigit():
                    if not dim.isdigit() or int(dim) <= 0:
                        self.fail(
                            f"`{dim}` is not a size; a dimension is a size name (`N`) or a "
                            "positive whole number",
                            pos,
                        )
                    dims.append(str(int(dim)))
                else:
                    self.size_names.add(dim)
                    dims.append(dim)
            self.tensors[d.name] = Tensor(d.name, dtype, dims, "in", declared=True)
            self.decl_pos[d.name] = d.pos
        for r in self.f.ranges:
            bound = r.bound
            if bound[0].isdigit():
                if not bound.isdigit() or int(bound) <= 0:
                    self.fail(
                        f"`for {r.index} < {bound}`: a range is a size name or a positive whole "
                        "number",
                        r.pos,
                    )
                bound = str(int(bound))
            else:
                self.size_names.add(bound)
            self.constrain(r.index, bound, r.pos, f"`for {r.index} < {bound}`")
        self.settings()

    def settings(self) -> None:
        env: dict[str, int | float] = {}
        seen: dict[str, Pos] = {}
        # sizes first (scalars may be expressions of sizes), each in the order given
        ordered = [s for s in self.f.settings if s.name in self.size_names] + [
            s for s in self.f.settings if s.name not in self.size_names
        ]
        for s in ordered:
            if s.name in seen:
                at = seen[s.name]
                self.fail(
                    f"`{s.name}` is given a value twice (first at {at.line}:{at.column}); "
                    "give it once",
                    s.pos,
                )
            seen[s.name] = s.pos
            if s.name in self.tensors:
                self.fail(
                    f"`{s.name}` is a tensor; a value (`{s.name} = ...`) is for a size or a scalar",
                    s.pos,
                )
            value = self.value(s.value, s.value_pos, env)
            if s.name in self.size_names:
                if s.dtype is not None and s.dtype != "int":
                    self.fail(
                        f"`{s.name}` is a size (a dimension or a range); write `{s.name} = "
                        f"{s.value.strip()}` without the type `{s.dtype}`",
                        s.dtype_pos,
                    )
                if not isinstance(value, int) or value <= 0:
                    self.fail(
                        f"size `{s.name}` is {value}; a size is a positive whole number "
                        "(e.g. `N = 1 << 20`)",
                        s.value_pos,
                    )
                if value > (1 << 31) - 1:
                    self.fail(
                        f"size `{s.name}` is {value}; at most 2^31 - 1 (an `int` of the kernel)",
                        s.value_pos,
                    )
                self.sizes[s.name] = Size(s.name, value, given=True)
            else:
                dtype = "float" if s.dtype is None else DTYPES.get(s.dtype, s.dtype)
                if dtype not in SCALAR_TYPES:
                    self.fail(
                        f"unknown scalar type `{s.dtype}`; {_near(s.dtype or '', SCALAR_TYPES)}"
                        "a scalar is float, double or int",
                        s.dtype_pos,
                    )
                if dtype == "int":
                    if not isinstance(value, int) or not -(1 << 31) <= value < (1 << 31):
                        self.fail(
                            f"int scalar `{s.name}` is {value}; give a whole number that an "
                            "`int` holds",
                            s.value_pos,
                        )
                else:
                    value = float(value)
                self.scalars[s.name] = Scalar(s.name, dtype, value)
            env[s.name] = value

    def value(self, text: str, pos: Pos, env: dict) -> int | float:
        try:
            expr = Expr.parse(text)
            unknown = sorted(expr.names() - set(env))
            if unknown:
                self.fail(
                    f"`{unknown[0]}` has no value here; a value is a number or an expression of "
                    "numbers and sizes or scalars given before it",
                    pos,
                )
            value = expr.evaluate(env)
        except ExprError as e:
            self.fail(f"bad value `{text.strip()}`: {e}", Pos(pos.line, pos.column + e.column))
        if isinstance(value, tuple):
            self.fail("a value is one number, not a tuple", pos)
        return value

    # ---- ranges ----

    def constrain(self, index: str, bound: str, pos: Pos, why: str) -> None:
        known = self.ranges.get(index)
        if known is None:
            self.ranges[index] = (bound, pos)
            return
        if known[0] != bound:
            at = known[1]
            self.fail(
                f"shape mismatch: index `{index}` runs over `{known[0]}` (from {at.line}:"
                f"{at.column}) but {why} needs `{bound}`; use another index name here, or the "
                f"same size for both",
                pos,
            )

    def range_of(self, index: str, pos: Pos) -> str:
        if index not in self.ranges:
            self.fail(
                f"no range for index `{index}`: add `for {index} < N` (a size name), or use "
                f"`{index}` to index a declared tensor",
                pos,
            )
        return self.ranges[index][0]

    # ---- statements ----

    def statements(self) -> None:
        assigned_later = {s.target.tensor: s.pos for s in self.f.statements}
        for k, st in enumerate(self.f.statements):
            self.statement(k, st, assigned_later)

    def statement(self, k: int, st: Statement, assigned_later: dict[str, Pos]) -> None:
        t = st.target
        if t.tensor in self.scalars or t.tensor in self.size_names:
            what = "scalar" if t.tensor in self.scalars else "size"
            self.fail(
                f"`{t.tensor}` is a {what}; the left-hand side is a tensor element like `y[i]`",
                t.pos,
            )
        if t.tensor in self.defined_at:
            at = self.defined_at[t.tensor]
            self.fail(
                f"`{t.tensor}` is assigned twice (first at {at.line}:{at.column}); give the "
                "second result another name",
                t.pos,
            )
        if t.tensor in self.inout or (
            t.tensor in self.read and self.tensors.get(t.tensor, None) is not None
        ):
            self.fail(
                f"`{t.tensor}` is read by an earlier statement and assigned here; give the result "
                "another name",
                t.pos,
            )
        lhs = []
        for ix in t.indices:
            if ix.name in lhs:
                self.fail(
                    f"index `{ix.name}` appears twice on the left-hand side; each output "
                    "dimension needs its own index",
                    ix.pos,
                )
            self.check_index_name(ix.name, ix.pos)
            lhs.append(ix.name)
        declared = self.tensors.get(t.tensor)
        if declared is not None and declared.declared:
            self.check_arity(t, declared)
        self.walk(st.rhs, set(lhs), k, st, assigned_later)
        self.resolve_implicit()
        if declared is not None and declared.declared:
            for ix, dim in zip(t.indices, declared.dims, strict=True):
                self.constrain(
                    ix.name,
                    dim,
                    ix.pos,
                    f"dimension {dim} of `{_fmt_access(t.tensor, declared.dims)}`",
                )
        dims = [self.range_of(ix.name, ix.pos) for ix in t.indices]
        if declared is None:
            self.tensors[t.tensor] = Tensor(
                t.tensor, self.result_type(st.rhs), dims, "temp", declared=False, statement=k
            )
        else:
            declared.statement = k
            declared.role = "inout" if t.tensor in self.inout else "out"
        self.defined_at[t.tensor] = st.pos

    def check_index_name(self, name: str, pos: Pos) -> None:
        for table, what in (
            (self.tensors, "a tensor"),
            (self.scalars, "a scalar"),
            (self.size_names, "a size"),
        ):
            if name in table:
                self.fail(f"`{name}` is {what}; use another name for the index", pos)

    def check_arity(self, a: Access, tensor: Tensor) -> None:
        if len(a.indices) != len(tensor.dims):
            self.fail(
                f"`{a.tensor}` has {len(tensor.dims)} dimension(s) "
                f"(`{_fmt_access(a.tensor, tensor.dims)}`); this access has {len(a.indices)} "
                f"index(es)",
                a.pos,
            )

    def walk(
        self, node: Node, bound: set[str], k: int, st: Statement, later: dict[str, Pos]
    ) -> None:
        if isinstance(node, Num):
            return
        if isinstance(node, Name):
            n = node.name
            if n in bound:
                node.kind = "index"
            elif n in self.scalars:
                node.kind = "scalar"
            elif n in self.size_names:
                node.kind = "size"
            elif n in self.tensors or n in later:
                self.fail(f"`{n}` is a tensor; write an element of it, like `{n}[i]`", node.pos)
            elif n in self.ranges:
                self.fail(
                    f"index `{n}` is not bound here: it is not on the left-hand side and no "
                    f"reduction around it binds it; write `sum({n}) ...` or add `{n}` to the left",
                    node.pos,
                )
            else:
                known = list(self.scalars) + list(self.size_names) + list(bound)
                self.fail(
                    f"unknown name `{n}`: {_near(n, known)}give it a value (`{n} = 2.5`) or a "
                    "size (`for i < n`), or use an index of the left-hand side",
                    node.pos,
                )
            return
        if isinstance(node, Access):
            self.access(node, bound, k, st, later)
            return
        if isinstance(node, Unary):
            self.walk(node.operand, bound, k, st, later)
            return
        if isinstance(node, Binary):
            self.walk(node.left, bound, k, st, later)
            self.walk(node.right, bound, k, st, later)
            return
        if isinstance(node, Call):
            self.call(node)
            if node.func == "pad":
                self.pad(node, bound)
            for a in node.args:
                self.walk(a, bound, k, st, later)
            return
        if isinstance(node, Reduce):
            self.reduce(node, bound, k, st, later)
            return
        raise AssertionError(node)

    def call(self, node: Call) -> None:
        f = node.func
        if f not in FUNCTIONS:
            if f in REDUCERS:
                self.fail(
                    f"`{f}` is a reduction: it binds an index and takes a body, like "
                    f"`{f}(k) x[i, k]`",
                    node.pos,
                )
            self.fail(
                f"unknown function `{f}`; {_near(f, list(FUNCTIONS) + list(REDUCERS))}"
                f"functions: {', '.join(FUNCTIONS)}; reductions: {', '.join(REDUCERS)}",
                node.pos,
            )
        least, most = FUNCTIONS[f]
        n = len(node.args)
        if n < least or (most is not None and n > most):
            want = f"{least}" if least == most else f"at least {least}"
            extra = (
                f" (or, as a reduction, `{f}(k) x[i, k]`)" if f in ("max", "min") and n == 1 else ""
            )
            self.fail(f"`{f}` takes {want} argument(s), not {n}{extra}", node.pos)

    def pad(self, node: Call, bound: set[str]) -> None:
        inner, value = node.args
        if not isinstance(inner, Access) or not any(ix.affine for ix in inner.indices):
            self.fail(
                "`pad(ACCESS, VALUE)` gives the value read outside a tensor: its first argument "
                "is an access with a shifted subscript, like `pad(x[i + k - 1], -inf)`",
                node.pos,
            )
        if any(n.kind == "index" or n.name in bound for n in _names(value)) or any(
            True for _ in _accesses(value)
        ):
            self.fail(
                "the padding value is a number or a scalar (`0`, `-inf`, `eps`), the same for "
                "every element",
                _node_pos(value),
            )

    def scan(self, node: Reduce, bound: set[str], k: int, st: Statement, later) -> None:
        """`cumsum(c) BODY` at the top of a statement writing `y[..., c, ...]`: each element is
        the scan of BODY over positions 0..c of the index `c` of the left-hand side (`rcumsum`:
        over positions c..C-1, from the end)."""
        lhs = [i.name for i in st.target.indices]
        if len(node.indices) != 1 or node.indices[0].name not in lhs:
            self.fail(
                f"`{node.op}` scans along one index of the left-hand side, like "
                f"`y[r, c] = {node.op}(c) x[r, c]`",
                node.pos,
            )
        if st.rhs is not node:
            self.fail(
                f"`{node.op}` is the whole right-hand side of its statement "
                f"(`y[r, c] = {node.op}(c) x[r, c]`); compute the rest in another statement",
                node.pos,
            )
        self.walk(node.body, bound, k, st, later)
        self.scans.append((k, node))
        op = {"cumsum": "sum", "cumprod": "prod"}.get(node.op.removeprefix("r"), "max")
        dims = [self.range_of(node.indices[0].name, node.pos)]
        self.reductions.append(Reduction(op, dims, _nonnegative(node.body, self.definition)))

    def reduce(self, node: Reduce, bound: set[str], k: int, st, later) -> None:
        if node.op in SCANS:
            self.scan(node, bound, k, st, later)
            return
        if node.op not in REDUCERS:
            if node.op in FUNCTIONS:
                self.fail(
                    f"`{node.op}` is a function, not a reduction: its arguments go in "
                    f"parentheses, like `{node.op}(x[i])`",
                    node.pos,
                )
            self.fail(
                f"unknown reduction `{node.op}`; {_near(node.op, REDUCERS + SCANS)}reductions: "
                f"{', '.join(REDUCERS)}; scans: {', '.join(SCANS)}",
                node.pos,
            )
        if node.op in ("argmax", "argmin") and len(node.indices) != 1:
            self.fail(f"`{node.op}` binds one index, like `{node.op}(k) x[i, k]`", node.pos)
        inner = set(bound)
        for ix in node.indices:
            if ix.name in inner:
                self.fail(
                    f"index `{ix.name}` is already bound here; the reduction needs an index of "
                    f"its own (e.g. `{ix.name}2`)",
                    ix.pos,
                )
            self.check_index_name(ix.name, ix.pos)
            inner.add(ix.name)
        self.walk(node.body, inner, k, st, later)
        dims = [self.range_of(ix.name, ix.pos) for ix in node.indices]
        self.reductions.append(Reduction(node.op, dims, _nonnegative(node.body, self.definition)))

    def access(self, a: Access, bound: set[str], k: int, st: Statement, later) -> None:
        name = a.tensor
        tensor = self.tensors.get(name)
        if name in self.scalars or name in self.size_names:
            what = "scalar" if name in self.scalars else "size"
            self.fail(f"`{name}` is a {what}, not a tensor; write `{name}` without indices", a.pos)
        if name == st.target.tensor:
            if tensor is None or not tensor.declared:
                self.fail(
                    f"`{name}` is used before it is defined: it is this statement's result; to "
                    f"update a tensor in place, declare it (`float {name}[N]`)",
                    a.pos,
                )
            if [i.name for i in a.indices] != [i.name for i in st.target.indices]:
                self.fail(
                    f"`{name}` is updated in place, so it can be read only at the element being "
                    f"written, `{_fmt_access(name, [i.name for i in st.target.indices])}`",
                    a.pos,
                )
            self.inout.add(name)
        elif tensor is None:
            if name in later:
                at = later[name]
                self.fail(
                    f"`{name}` is used before it is defined (at {at.line}:{at.column}); move its "
                    "statement above this one",
                    a.pos,
                )
            # an input nobody declared: float, its shape from its indices' ranges
            tensor = Tensor(name, "float", [], "in", declared=False)
            self.tensors[name] = tensor
            self.implicit[name] = a
        elif tensor.declared and tensor.statement is None and name in later:
            at = later[name]
            self.fail(
                f"`{name}` is read here before its statement (at {at.line}:{at.column}) assigns "
                "it; move that statement above this one or read another tensor",
                a.pos,
            )
        elif name in self.inout:
            self.fail(
                f"`{name}` is updated in place by an earlier statement, so a later one cannot "
                "read it; give the updated result another name",
                a.pos,
            )
        self.read.add(name)
        gathers = [ix for ix in a.indices if ix.gather is not None]
        if gathers:
            self.gathers(a, tensor, gathers, bound, k, st, later)
        shifted = [ix for ix in a.indices if ix.affine]
        if shifted:
            self.subscripts(a, tensor, shifted, bound, st)
        if name in self.implicit and not tensor.dims:
            first = self.implicit[name]
            if len(a.indices) != len(first.indices):
                self.fail(
                    f"`{name}` has {len(first.indices)} index(es) at {first.pos.line}:"
                    f"{first.pos.column} and {len(a.indices)} here; declare it "
                    f"(`float {name}[N, M]`) and index it the same way everywhere",
                    a.pos,
                )
            for ix in a.indices:
                if ix.name not in bound:
                    self.unbound(ix, st)
            return
        self.check_arity(a, self.tensors[name])
        dims = self.tensors[name].dims
        for d, (ix, dim) in enumerate(zip(a.indices, dims, strict=True)):
            if ix.affine or ix.gather is not None:
                continue
            if ix.name not in bound:
                if ix.name in self.scalars or ix.name in self.size_names:
                    self.fail(
                        f"`{ix.name}` is not an index; an index is a name bound by the left-hand "
                        "side or a reduction",
                        ix.pos,
                    )
                self.unbound(ix, st)
            self.constrain(
                ix.name, dim, ix.pos, f"dimension {d + 1} of `{_fmt_access(name, dims)}`"
            )

    def gathers(self, a: Access, tensor: Tensor, gathers, bound: set[str], k, st, later) -> None:
        """Subscripts that are elements of an `int` input read at index names, `wte[idx[t], c]`:
        the gathered tensor declared (its shape cannot come from them) and an input; each such
        input indexes one extent, which its values are drawn in (`in [0, V)` in the spec)."""
        name, first = a.tensor, gathers[0]
        if name in self.implicit or not tensor.declared:
            self.fail(
                f"`{name}` is read at `{first.name}`, an element of another tensor, so its shape "
                f"cannot come from its indices; declare it (`float {name}[V, C]`)",
                first.pos,
            )
        if tensor.statement is not None:
            self.fail(
                f"`{name}` is a result of the formula; a result is read at index names, not at "
                f"`{first.name}` (gather from an input)",
                first.pos,
            )
        if any(ix.affine for ix in a.indices):
            self.fail(
                f"`{_fmt_access(name, [ix.name for ix in a.indices])}` both gathers and shifts; "
                "an access does one or the other",
                a.pos,
            )
        self.check_arity(a, tensor)
        for d, ix in enumerate(a.indices):
            g = ix.gather
            if g is None:
                continue
            it = self.tensors.get(g.tensor)
            if it is None or not it.declared or it.dtype != "int" or it.statement is not None:
                self.fail(
                    f"`{g.tensor}` in subscript `{ix.name}` must be an `int` input declared with "
                    f"its shape (`int {g.tensor}[T]`): its elements index dimension {d + 1} of "
                    f"`{name}`",
                    ix.pos,
                )
            if any(i.affine or i.gather is not None for i in g.indices):
                self.fail(
                    f"`{ix.name}`: a gathering subscript is read at index names, like `idx[t]`",
                    ix.pos,
                )
            self.access(g, bound, k, st, later)
            dim = tensor.dims[d]
            if self.value_ranges.setdefault(g.tensor, dim) != dim:
                self.fail(
                    f"`{g.tensor}` indexes extents `{self.value_ranges[g.tensor]}` and `{dim}`; "
                    "an int input indexes one extent",
                    ix.pos,
                )

    def subscripts(self, a: Access, tensor: Tensor, shifted, bound: set[str], st) -> None:
        """Affine subscripts: each factor a whole number, a size, an int scalar or a bound index
        (at most one index per term); the tensor declared (its shape cannot come from them) and
        not a temporary (a temporary is computed at the elements its thread needs)."""
        name = a.tensor
        if name in self.implicit:
            self.fail(
                f"`{name}` has a shifted subscript (`{shifted[0].name}`), so its shape cannot come "
                f"from its indices; declare it (`float {name}[N, M]`)",
                shifted[0].pos,
            )
        if tensor.statement is not None:
            self.fail(
                f"`{name}` is a result of the formula; a result is read at index names, not at "
                f"`{shifted[0].name}` (read the inputs it is computed from there)",
                shifted[0].pos,
            )
        for ix in shifted:
            factors = [f for _, fs in ix.terms for f in fs] + ([ix.div] if ix.div else [])
            for _, fs in ix.terms:
                if sum(1 for f in fs if f in bound) > 1:
                    self.fail(
                        f"`{ix.name}`: a subscript is affine, at most one index per term "
                        "(`h * 2 + kh`, not `h * kh`)",
                        ix.pos,
                    )
            if ix.div is not None and ix.div in bound:
                self.fail(f"`{ix.name}`: the divisor is a number or a size, not an index", ix.pos)
            for f in factors:
                if f[0].isdigit():
                    if not f.isdigit():
                        self.fail(
                            f"`{f}` in subscript `{ix.name}`: subscripts are whole numbers, "
                            "sizes, int scalars and indices",
                            ix.pos,
                        )
                    if f == ix.div and int(f) == 0:
                        self.fail(f"`{ix.name}` divides by 0", ix.pos)
                elif f in bound or f in self.size_names or self._int_scalar(f):
                    continue
                elif f in self.scalars:
                    self.fail(
                        f"`{f}` in subscript `{ix.name}` is a {self.scalars[f].dtype} scalar; a "
                        f"subscript's scalars are int (`int {f} = ...`)",
                        ix.pos,
                    )
                elif f in self.ranges:
                    self.unbound(Index(f, ix.pos), st)
                else:
                    self.fail(
                        f"unknown name `{f}` in subscript `{ix.name}`: {_near(f, list(bound))}a "
                        "subscript is made of indices, sizes, int scalars and whole numbers",
                        ix.pos,
                    )

    def _int_scalar(self, name: str) -> bool:
        return name in self.scalars and self.scalars[name].dtype == "int"

    def definition(self, tensor: str) -> Node | None:
        """The right-hand side of the statement that defines `tensor`, if one did."""
        t = self.tensors.get(tensor)
        return None if t is None or t.statement is None else self.f.statements[t.statement].rhs

    def unbound(self, ix, st: Statement) -> None:
        if ix.name in self.scalars or ix.name in self.size_names:
            self.fail(
                f"`{ix.name}` is not an index; an index is a name bound by the left-hand side or "
                "a reduction",
                ix.pos,
            )
        lhs = _fmt_access(st.target.tensor, [i.name for i in st.target.indices])
        self.fail(
            f"index `{ix.name}` is not bound: it is not on the left-hand side (`{lhs}`) and no "
            f"reduction around it binds it; write `sum({ix.name}) ...` or add `{ix.name}` to "
            "the left",
            ix.pos,
        )

    def resolve_implicit(self) -> None:
        """Inputs nobody declared get their shape once their statement has bound every range."""
        for name, first in self.implicit.items():
            t = self.tensors[name]
            if not t.dims:
                t.dims = [self.range_of(ix.name, ix.pos) for ix in first.indices]
                self.size_names.update(d for d in t.dims if not d.isdigit())

    def result_type(self, node: Node) -> str:
        if isinstance(node, Reduce) and node.op in ("argmax", "argmin"):
            return "int"
        types = {self.tensors[a.tensor].dtype for a in _accesses(node)}
        types.discard("int")
        if len(types) == 1:
            return types.pop()
        return "double" if "double" in types else "float"

    # ---- the model ----

    def finish(self) -> Checked:
        for name, t in self.tensors.items():
            if t.declared and t.statement is None and name not in self.read:
                self.fail(
                    f"tensor `{name}` is declared but not used; use it or remove its declaration",
                    self.decl_pos[name],
                )
            if not t.declared and t.role == "temp" and name not in self.read:
                t.role = "out"
        used = {n.name for st in self.f.statements for n in _names(st.rhs) if n.kind == "scalar"}
        used |= {f for st in self.f.statements for f in _subscript_names(st.rhs)}
        for s in self.f.settings:
            if s.name in self.scalars and s.name not in used:
                self.fail(
                    f"scalar `{s.name}` is given a value but not used; use it or remove it", s.pos
                )
            if s.name in self.size_names and s.name not in self.sizes:
                pass
        outputs = [st.target.tensor for st in self.f.statements]
        outputs = [o for o in outputs if self.tensors[o].role in ("out", "inout")]
        first = self.tensors[outputs[0]]
        for o in outputs[1:]:
            t = self.tensors[o]
            if t.dims != first.dims:
                st = self.f.statements[t.statement]
                self.fail(
                    f"`{_fmt_access(o, t.dims)}` and `{_fmt_access(first.name, first.dims)}` are "
                    "both results, of different shapes; one kernel writes one shape: read "
                    f"`{o}` in a later statement (a temporary) or generate it on its own",
                    st.target.pos,
                )
        if not first.dims:
            for o in outputs:
                for node in top_reductions(self.f.statements[self.tensors[o].statement].rhs):
                    if node.op in ("argmax", "argmin"):
                        self.fail(
                            f"`{node.op}` of everything is not a result of the notation; give "
                            "it an index to keep (`y[r] = argmax(c) x[r, c]`)",
                            node.pos,
                        )
        for k, node in self.scans:
            st = self.f.statements[k]
            if self.tensors[st.target.tensor].role == "temp" or len(outputs) > 1:
                self.fail(
                    f"a scan (`{node.op}`) is the formula's only result: its kernel runs along "
                    "the scanned index; generate what reads it on its own",
                    node.pos,
                )
        self.default_sizes()
        types = {t.dtype for t in self.tensors.values()} | {s.dtype for s in self.scalars.values()}
        compute = "double" if "double" in types else "float"
        return Checked(
            formula=self.f,
            tensors=self.tensors,
            scalars=self.scalars,
            sizes=self.sizes,
            ranges={i: b for i, (b, _) in self.ranges.items()},
            outputs=outputs,
            domain=list(first.dims),
            compute=compute,
            reductions=self.reductions,
            notes=self.notes,
            value_ranges=self.value_ranges,
        )

    def default_sizes(self) -> None:
        used = set()
        for t in self.tensors.values():
            used.update(d for d in t.dims if not d.isdigit())
        for b, _ in self.ranges.values():
            if not b.isdigit():
                used.add(b)
        missing = sorted(used - set(self.sizes))
        # about 2^20 elements in the largest tensor: 1 << 20, 1024 × 1024, 128³, 32⁴
        rank = max(len(t.dims) for t in self.tensors.values())
        default = 1 << -(-20 // rank)
        for name in missing:
            self.sizes[name] = Size(name, default, given=False)
        if missing:
            self.notes.append(
                f"size(s) {', '.join(missing)} not given: {default} each by default "
                f"(give one as `{missing[0]} = ...` in the formula)"
            )
        # a size given but unused (a typo of a dimension's name) is an error
        for s in self.f.settings:
            if s.name in self.sizes and s.name not in used:
                self.fail(f"size `{s.name}` is given a value but no tensor or range uses it", s.pos)
        self.sizes = {n: self.sizes[n] for n in sorted(self.sizes, key=_size_order(self.tensors))}


def _size_order(tensors: dict[str, Tensor]):
    order: list[str] = []
    for t in tensors.values():
        for d in t.dims:
            if d not in order:
                order.append(d)
    return lambda n: (order.index(n) if n in order else len(order), n)


def _node_pos(node: Node) -> Pos:
    return node.pos


def _accesses(node: Node):
    if isinstance(node, Access):
        yield node
        return
    for child in children(node):
        yield from _accesses(child)


def top_reductions(node: Node):
    """The reductions of `node` not inside another reduction, in order."""
    if isinstance(node, Reduce):
        yield node
        return
    for child in children(node):
        yield from top_reductions(child)


def _subscript_names(node: Node):
    """The names in the affine subscripts of every access in `node`."""
    for a in _accesses(node):
        for ix in a.indices:
            if ix.affine:
                yield from (f for _, fs in ix.terms for f in fs)
                if ix.div:
                    yield ix.div


def _names(node: Node):
    if isinstance(node, Name):
        yield node
        return
    for child in children(node):
        yield from _names(child)


def _nonnegative(node: Node, definition) -> bool:
    """A body whose every value is ≥ 0 (a sum of it cannot cancel): exp, abs, sqrt, a square, a
    temporary defined as one, products and quotients of such."""
    if isinstance(node, Call):
        return node.func in ("exp", "abs", "sqrt", "sigmoid")
    if isinstance(node, Access):
        rhs = definition(node.tensor)
        return rhs is not None and _nonnegative(rhs, definition)
    if isinstance(node, Binary):
        if node.op == "**":
            return isinstance(node.right, Num) and node.right.value % 2 == 0
        if node.op in ("*", "/"):
            return (node.op == "*" and _same(node.left, node.right)) or (
                _nonnegative(node.left, definition) and _nonnegative(node.right, definition)
            )
    return False


def _same(a: Node, b: Node) -> bool:
    """The same expression, positions aside."""
    return _shape_of(a) == _shape_of(b)


def _shape_of(node) -> object:
    if isinstance(node, list):
        return [_shape_of(x) for x in node]
    if hasattr(node, "__dataclass_fields__"):
        return tuple(
            (f, _shape_of(getattr(node, f))) for f in node.__dataclass_fields__ if f != "pos"
        )
    return node


def check(formula: Formula, source: FormulaSource) -> Checked:
    c = _Checker(formula, source)
    c.declarations()
    c.statements()
    return c.finish()
