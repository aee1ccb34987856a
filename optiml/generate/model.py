"""The parsed formula as plain data: what the parser builds and the checker annotates.

Every node keeps the line and column (1-based) of its text in the formula, so that every error
can point at it. The checker fills in `kind` of names and the roles, types and shapes of tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pos:
    line: int
    column: int


@dataclass
class Num:
    value: float
    text: str
    pos: Pos


@dataclass
class Name:
    """A name used as a value: a scalar, a size or an index (`kind`, set by the checker)."""

    name: str
    pos: Pos
    kind: str = ""  # "scalar" | "size" | "index"


@dataclass
class Index:
    """A subscript: an index name, or (with `terms`) an affine expression of index names, sizes,
    int scalars and whole numbers, `h * 2 + kh - 1`, optionally divided exactly, `(o + 1 - k) / 2`.

    `terms` is a list of (sign, factors): each factor a name or a whole number, at most one of
    them an index; `div` the divisor (a name or a whole number). `name` is the text (an affine
    subscript has no index name of its own). A subscript may instead be an element of an `int`
    input read at index names (`gather`): a gather, `wte[idx[t], c]`."""

    name: str
    pos: Pos
    terms: list[tuple[int, list[str]]] | None = None
    div: str | None = None
    gather: Access | None = None  # `idx[t]` in `wte[idx[t], c]`: an element of an int tensor

    @property
    def affine(self) -> bool:
        return self.terms is not None


@dataclass
class Access:
    tensor: str
    indices: list[Index]
    pos: Pos


@dataclass
class Unary:
    op: str  # "-"
    operand: Node
    pos: Pos


@dataclass
class Binary:
    op: str  # + - * / ** < <= > >= == !=
    left: Node
    right: Node
    pos: Pos


@dataclass
class Call:
    func: str
    args: list[Node]
    pos: Pos


@dataclass
class Reduce:
    op: str  # sum | prod | max | min | mean | argmax | argmin
    indices: list[Index]
    body: Node
    pos: Pos


Node = Num | Name | Access | Unary | Binary | Call | Reduce


def children(node: Node) -> list[Node]:
    """The expressions right below `node` (a reduction's body, a call's arguments, ...); an
    access's subscripts are not expressions of this kind."""
    if isinstance(node, Unary):
        return [node.operand]
    if isinstance(node, Binary):
        return [node.left, node.right]
    if isinstance(node, Call):
        return list(node.args)
    if isinstance(node, Reduce):
        return [node.body]
    return []


@dataclass
class Range:
    index: str
    bound: str  # a size name or an integer
    pos: Pos


@dataclass
class TensorDecl:
    name: str
    dtype: str
    dims: list[tuple[str, Pos]]
    pos: Pos
    dtype_pos: Pos


@dataclass
class Setting:
    """`N = 1 << 20` (a size, where N is one) or `a = 2.5` / `float a = 2.5` (a scalar)."""

    name: str
    value: str  # the expression's text, evaluated with optiml.expr
    pos: Pos
    value_pos: Pos
    dtype: str | None = None
    dtype_pos: Pos | None = None


@dataclass
class Statement:
    target: Access
    rhs: Node
    pos: Pos


@dataclass
class Formula:
    text: str
    tensors: list[TensorDecl] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    statements: list[Statement] = field(default_factory=list)


# ---- the checked model -------------------------------------------------------------------------


@dataclass
class Tensor:
    name: str
    dtype: str  # "float" | "double" | "half" | "bf16" | "int"
    dims: list[str]  # size names or integers, outermost first
    role: str  # "in" | "out" | "inout" | "temp"
    declared: bool
    statement: int | None = None  # the statement that defines it


@dataclass
class Scalar:
    name: str
    dtype: str  # "float" | "double" | "int"
    value: float | int


@dataclass
class Size:
    name: str
    value: int
    given: bool  # False: a default OptiML picked


@dataclass
class Reduction:
    """A reduction's length in sizes (for tolerances): the product of its indices' ranges."""

    op: str
    dims: list[str]
    nonnegative: bool


@dataclass
class Checked:
    formula: Formula
    tensors: dict[str, Tensor]
    scalars: dict[str, Scalar]
    sizes: dict[str, Size]
    ranges: dict[str, str]  # index -> size name or integer
    outputs: list[str]  # tensors written by the kernel, in statement order
    domain: list[str]  # the output domain's extents
    compute: str  # "float" | "double"
    reductions: list[Reduction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # an int input read as a subscript -> the extent its values index (`idx: in int[T] in [0, V)`)
    value_ranges: dict[str, str] = field(default_factory=dict)

    def statement_of(self, tensor: str) -> Statement:
        t = self.tensors[tensor]
        assert t.statement is not None
        return self.formula.statements[t.statement]
