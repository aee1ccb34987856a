"""`optiml generate --from-torch TASK.py`: a PyTorch module in KernelBench's format becomes a
formula of the notation (docs/generate.md), without an LLM and without importing or running the
file: it is read with `ast` only.

What is read: module-level constants (numbers, tuples, arithmetic of them), the shapes that
`get_inputs()` builds (`torch.rand(batch_size, dim)`, `torch.randint(0, 2, (n,))`, ...), the
values `get_init_inputs()` returns, bound by position to `Model.__init__`'s parameters (their
defaults for the rest), the `self.x = ...` attributes `__init__` sets (numbers, tuples, `nn`
modules with their arguments), and `forward`'s statements, evaluated symbolically: every tensor is
a *value* over named dimensions that can give the notation's expression of its element at given
indices. Reductions that are needed more than once, and the local variables of `forward` that
hold one, become temporaries; the result becomes the output statement.

    translate(text, path)  ->  Translation(formula, name, notes, ...)

Slices, `narrow`, `select`, `flip` and `cat` become shifted reads of inputs (`x[b, c - 1]`); a
scan with its identity concatenated before it is an exclusive scan, a flipped scan a suffix scan
(`rcumsum`); `gather`, `cross_entropy` and `nll_loss` with int indices are gathers (`x[n, t[n]]`);
group normalization sees the channels as (groups, channels per group). Whatever the notation
cannot express is a `FormulaError` (exit 24) at the line and column of the task that uses it,
saying what is missing. Nothing here knows CUDA: the formula goes through `generate`.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from optiml.errors import FormulaError, Position, quote
from optiml.generate.check import DTYPES, FUNCTIONS, REDUCERS
from optiml.generate.cuda import RESERVED_C

__all__ = ["Translation", "default_name", "translate"]

_NEEDS_LLM = "a kernel for it has to be written by hand or by an LLM, and --from-torch uses none"

# names a tensor, size, scalar or index of the formula must not have: C and CUDA words, the
# notation's own words, and names the generated NumPy reference uses
_C_WORDS = set(
    [
        "alignas",
        "alignof",
        "asm",
        "auto",
        "bool",
        "break",
        "case",
        "catch",
        "char",
        "class",
        "const",
        "constexpr",
        "const_cast",
        "continue",
        "decltype",
        "default",
        "delete",
        "do",
        "double",
        "dynamic_cast",
        "else",
        "enum",
        "explicit",
        "export",
        "extern",
        "false",
        "float",
        "for",
        "friend",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "mutable",
        "namespace",
        "new",
        "noexcept",
        "nullptr",
        "operator",
        "private",
        "protected",
        "public",
        "register",
        "reinterpret_cast",
        "restrict",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "static_assert",
        "static_cast",
        "struct",
        "switch",
        "template",
        "this",
        "thread_local",
        "throw",
        "true",
        "try",
        "typedef",
        "typeid",
        "typename",
        "union",
        "unsigned",
        "using",
        "virtual",
        "void",
        "volatile",
        "wchar_t",
        "while",
        "with",
        "blockIdx",
        "blockDim",
        "threadIdx",
        "gridDim",
        "warpSize",
        "INFINITY",
        "NAN",
        "half",
        "bf16",
        "np",
        "math",
        "__global__",
        "__device__",
        "__host__",
        "__shared__",
    ]
)
RESERVED = _C_WORDS | RESERVED_C | set(FUNCTIONS) | set(REDUCERS) | set(DTYPES)
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass
class Translation:
    """A task translated: the formula, a kernel name from the task's file name, and what the
    translation had to decide (notes for stderr)."""

    formula: str
    name: str
    path: str
    inputs: list[str]  # the kernel's input tensors, in forward's order
    output: str
    sizes: dict[str, int]
    scalars: dict[str, float]
    position: Position  # forward's return: where the formula comes from
    notes: list[str] = field(default_factory=list)


# ---- sizes ---------------------------------------------------------------------------------------


class Sym:
    """A size: a name of the formula with its value; sizes that must be equal are merged."""

    def __init__(self, name: str, value: int, anonymous: bool = False):
        self.name = name
        self.value = value
        self.anonymous = anonymous
        self.parent: Sym | None = None
        self.base: Sym | None = None  # a part of this size (a slice of it)

    def root(self) -> Sym:
        s = self
        while s.parent is not None:
            s = s.parent
        return s

    def __repr__(self) -> str:
        return f"Sym({self.root().name}={self.value})"


Dim = Sym | None  # None: a dimension of size 1


class SizeInt(int):
    """`x.shape[1]`: an int that remembers its size, so that arithmetic keeps it a size."""

    sym: Sym

    def __new__(cls, sym: Sym):
        obj = super().__new__(cls, sym.value)
        obj.sym = sym
        return obj


class NamedInt(int):
    """A number read from `self.x` or a module constant: a scalar of the formula where it is
    used as a value."""

    label: str

    def __new__(cls, value: int, label: str):
        obj = super().__new__(cls, value)
        obj.label = label
        return obj


class NamedFloat(float):
    label: str

    def __new__(cls, value: float, label: str):
        obj = super().__new__(cls, value)
        obj.label = label
        return obj


def _named(value, label: str):
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return NamedInt(value, label)
    if isinstance(value, float):
        return NamedFloat(value, label)
    return value


@dataclass(eq=False)
class Scalar:
    label: str
    value: float
    name: str = ""


# ---- expressions of the notation -----------------------------------------------------------------


@dataclass(eq=False)
class ENum:
    value: float


@dataclass(eq=False)
class ERef:  # a size, a scalar or an index used as a value
    ref: object  # Sym | Scalar | str (an index name)


@dataclass(eq=False)
class EAcc:
    tensor: object  # Leaf | Temp
    idx: list[str]


@dataclass(eq=False)
class ENeg:
    x: object


@dataclass(eq=False)
class EBin:
    op: str
    left: object
    right: object


@dataclass(eq=False)
class ECall:
    func: str
    args: list


@dataclass(eq=False)
class ECmp:
    op: str
    left: object
    right: object


@dataclass(eq=False)
class ERed:
    op: str
    idx: list[str]
    body: object


def _num(v: float) -> ENum:
    return ENum(float(v))


def _bin(op: str, a, b):
    return EBin(op, a, b)


def _neg(a):
    if isinstance(a, ENeg):
        return a.x
    if isinstance(a, ENum):
        return ENum(-a.value)
    return ENeg(a)


def _call(f: str, *args):
    return ECall(f, list(args))


def _where(c, a, b):
    return ECall("where", [c, a, b])


# ---- tensor values -------------------------------------------------------------------------------


class Val:
    """A tensor of forward: its dimensions (a size, or None for 1) and how to write its element
    at given indices (an index name per sized dimension, None for the others)."""

    dims: list[Dim]
    dtype: str = "float"
    node: ast.AST | None = None
    hint: str | None = None  # a name for a temporary: a local variable of forward
    force: bool = False  # a temporary wherever it has a sized dimension (a norm's mean)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def children(self) -> list[Val]:
        return []


class Leaf(Val):
    def __init__(self, name: str, dims: list[Dim], dtype: str, node):
        self.name = name
        self.dims = dims
        self.dtype = dtype
        self.node = node
        self.gathers = False  # its elements index another input


class Const(Val):
    def __init__(self, expr, dtype: str = "float"):
        self.expr = expr
        self.dims = []
        self.dtype = dtype


class Map(Val):
    """An elementwise function of its arguments; `places[a][p]` is the position in this value
    of argument a's dimension p (views: transposes, broadcasts, diagonals are maps too)."""

    def __init__(
        self,
        fn: Callable[[list, list], object],
        args: list[Val],
        places: list[list[int]],
        dims: list[Dim],
        node,
        dtype: str = "float",
        view: bool = False,
    ):
        self.fn = fn
        self.args = args
        self.places = places
        self.dims = dims
        self.node = node
        self.dtype = dtype
        self.view = view

    def children(self) -> list[Val]:
        return list(self.args)


class Reduce(Val):
    def __init__(self, op: str, body: Val, axes: tuple[int, ...], keepdim: bool, node):
        self.op = op
        self.body = body
        self.axes = axes
        self.keepdim = keepdim
        self.node = node
        self.dtype = "int" if op in ("argmax", "argmin") else "float"
        if keepdim:
            self.dims = [None if p in axes else d for p, d in enumerate(body.dims)]
        else:
            self.dims = [d for p, d in enumerate(body.dims) if p not in axes]

    def children(self) -> list[Val]:
        return [self.body]


class Scan(Val):
    """`torch.cumsum(x, dim)` and the like: the notation's scan, the whole of a result."""

    def __init__(self, op: str, body: Val, axis: int, node, reverse: bool = False):
        self.op = op
        self.body = body
        self.axis = axis
        self.node = node
        self.reverse = reverse  # from the end: a suffix scan (`rcumsum`)
        self.dims = list(body.dims)

    def children(self) -> list[Val]:
        return [self.body]


class Shift(Val):
    """A view of `x` along `axis`: element i is x's element `sign * i + offset` (a slice,
    `narrow`, `select`, `flip`; an exclusive scan's body read one back), or `fill` where that
    position is outside x. `offset` is a whole number plus sizes (`flip`: L - 1)."""

    def __init__(self, x: Val, axis: int, offset: int, dim: Dim, node, sign: int = 1,
                 sizes: tuple[Sym, ...] = (), fill: float = 0.0):  # fmt: skip
        self.x = x
        self.axis = axis
        self.offset = offset
        self.sizes = sizes  # added to the offset
        self.sign = sign
        self.fill = fill
        self.node = node
        self.dtype = x.dtype
        self.dims = [*x.dims[:axis], dim, *x.dims[axis + 1 :]]

    def children(self) -> list[Val]:
        return [self.x]

    def span(self) -> tuple[int, int]:
        """The positions i of this value whose element is inside x: [lo, hi)."""
        n = _extent(self.dims[self.axis])
        size = _extent(self.x.dims[self.axis])
        off = self.offset + sum(s.value for s in self.sizes)
        if self.sign > 0:  # 0 <= i + off < size
            lo, hi = -off, size - off
        else:  # 0 <= off - i < size
            lo, hi = off - size + 1, off + 1
        return max(lo, 0), min(hi, n)


class Gather(Val):
    """`x` with its dimension `axis` read at an element of the int input `index`: element
    (..) is x at `index[..]` along `axis` and, along x's other dimension p, at the index of this
    value's dimension `xmap[p]` (cross entropy's `x[n, t[n]]`, `torch.gather`)."""

    def __init__(self, x: Val, axis: int, index: Leaf, xmap: dict[int, int], node):
        self.x = x
        self.axis = axis
        self.index = index
        self.xmap = xmap
        self.node = node
        self.dtype = x.dtype
        self.dims = list(index.dims)

    def children(self) -> list[Val]:
        return [self.x, self.index]


class Split(Val):
    """`x` with its dimension `axis` seen as (groups, per group): the same memory, read at
    `g * per + c` (group normalization's channels)."""

    def __init__(self, x: Val, axis: int, groups: Dim, per: Dim, node):
        self.x = x
        self.axis = axis
        self.node = node
        self.dtype = x.dtype
        self.per = per
        self.dims = [*x.dims[:axis], groups, per, *x.dims[axis + 1 :]]

    def children(self) -> list[Val]:
        return [self.x]


class Cat(Val):
    """`torch.cat(parts, dim)`: element i along `axis` is the part's that holds position i."""

    def __init__(self, parts: list[Val], axis: int, dims: list[Dim], node):
        self.parts = parts
        self.axis = axis
        self.dims = dims
        self.node = node
        self.dtype = "float"

    def children(self) -> list[Val]:
        return list(self.parts)


def _extent(d: Dim) -> int:
    return 1 if d is None else d.value


class _Sub(str):
    """A subscript that is not an index name: `c - 1`, `L - 1 - c`, `0` (a Shift's), with its
    parts so that shifts of shifts compose: sign * index + const + sizes."""

    index: str | None
    sign: int
    const: int
    sizes: tuple[Sym, ...]
    neg: tuple[Sym, ...]


def _sub(index: str | None, sign: int = 1, const: int = 0, sizes=(), neg=()) -> str:
    """The subscript sign * index + const + Σ sizes − Σ neg, as the notation writes it."""
    sizes, neg = list(sizes), list(neg)
    for s in list(sizes):  # L - L cancels
        for t in neg:
            if t.root() is s.root():
                sizes.remove(s)
                neg.remove(t)
                break
    if index is not None and sign == 1 and const == 0 and not sizes and not neg:
        return index
    parts: list[tuple[int, str]] = [(1, s.root().name) for s in sizes]
    if index is not None:
        parts.append((sign, index))
    parts += [(-1, s.root().name) for s in neg]
    if const or not parts:
        parts.append((1 if const >= 0 else -1, str(abs(const))))
    text = ("-" if parts[0][0] < 0 else "") + parts[0][1]
    for sg, t in parts[1:]:
        text += f" {'+' if sg > 0 else '-'} {t}"
    out = _Sub(text)
    out.index, out.sign, out.const = index, sign, const
    out.sizes, out.neg = tuple(sizes), tuple(neg)
    return out


def _shifted(s: str | None, sign: int, const: int, sizes: tuple[Sym, ...]) -> str:
    """Subscript `sign * s + const + sizes` of a subscript s (None: position 0)."""
    if s is None:
        return _sub(None, 1, const, sizes)
    if isinstance(s, _Sub):
        if sign > 0:
            return _sub(s.index, s.sign, s.const + const, s.sizes + sizes, s.neg)
        return _sub(s.index, -s.sign, const - s.const, s.neg + sizes, s.sizes)
    if _IDENT.fullmatch(s):
        return _sub(s, sign, const, sizes)
    raise _NotAffine(s)


class _NotAffine(Exception):
    pass


class _SplitSub(str):
    """`g * per + c`: a dimension read as (groups, per group)."""

    parts: tuple[str, str]
    dims: tuple[Sym, Sym]


class _GatherSub(str):
    """A subscript that is an element of an int input, `t[n]`."""

    leaf: Leaf


@dataclass
class Axis:
    """A spatial axis of a convolution or pooling window: kernel extent, stride, padding,
    dilation; the output's size."""

    k: int
    stride: int
    pad: int
    dilation: int
    out: Dim
    kdim: Dim


class Window(Val):
    """A convolution (`conv`, `conv_t`, transposed) or a pooling window (`max`, `avg`) over the
    last len(axes) dimensions of `x` (batch, channel, spatial...): each output element reads
    `x` at affine subscripts, a read outside `x` being its padding (0, or -inf for max)."""

    def __init__(self, kind, x, axes, node, weight=None, bias=None, groups=1, cin=None, cout=None):
        self.kind = kind
        self.x = x
        self.axes = axes
        self.node = node
        self.weight = weight
        self.bias = bias
        self.groups = groups
        self.cin = cin  # channels per group, in and out (conv)
        self.cout = cout
        self.cout_total: Dim = None
        self.gsym: Dim = None
        lead = x.dims[: x.rank - len(axes)]
        if kind in ("conv", "conv_t"):
            lead = lead[:1] + self.channel_dims()
        self.dims = list(lead) + [a.out for a in axes]

    def channel_dims(self) -> list[Dim]:
        """The output's channel dimensions: (out channels) or, with groups that are neither 1
        nor depthwise, (groups, out channels per group) — the same memory."""
        if self.groups == 1 or self.depthwise:
            return [self.cout_total]
        return [self.gsym, self.cout]

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.cin is None and self.cout is None

    def children(self) -> list[Val]:
        return [self.x]


class Pair(tuple):
    """What `torch.max(x, dim)` returns: (values, indices), also as `.values` and `.indices`."""

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        return self[1]


@dataclass
class InputSpec:
    """A tensor get_inputs() makes: its shape and type, and whether it is a plain random
    tensor (a note says where get_inputs shapes its values)."""

    dims: list[Dim]
    dtype: str
    node: ast.AST
    plain: bool = True


@dataclass
class ModuleSpec:
    """`self.x = nn.Something(...)` in __init__: the class and its arguments."""

    cls: str
    args: list
    kwargs: dict
    node: ast.AST
    attr: str = ""


@dataclass
class Unknown:
    """A value --from-torch cannot tell: an error where forward uses it."""

    why: str
    node: ast.AST | None = None


@dataclass
class ModPath:
    path: str  # "torch.nn.functional.relu"


class SelfRef:
    pass


@dataclass
class Method:
    receiver: object
    name: str


# ---- what is not covered ------------------------------------------------------------------------

_CONV = (
    "a convolution",
    "--from-torch translates the modules nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d (their "
    "weight and bias become inputs of the kernel), not the functional form; use the module",
)
_POOL = (
    "pooling",
    "--from-torch translates the modules nn.MaxPool1d/2d/3d and nn.AvgPool1d/2d/3d (without "
    "ceil_mode or indices), not this form; " + _NEEDS_LLM,
)
_SCAN = (
    "a scan",
    "the notation's scans are cumsum, cumprod, cummax and cummin of a value (torch.cumsum and "
    "torch.cumprod translate; cummax/cummin return indices too); " + _NEEDS_LLM,
)
_SLICE = (
    "a slice, an offset or a concatenation",
    "--from-torch reads slices of step 1, `narrow`, `select`, `flip` and `cat` (shifted reads "
    "of inputs: `x[i + 1]`, `x[N - 1 - i]`), not this one (a step, a roll, a stack, a split, "
    "padding); " + _NEEDS_LLM,
)
_RESHAPE = (
    "a reshape that merges or splits dimensions",
    "the notation has no index arithmetic in subscripts (`x[i / C, i % C]`); only size-1 "
    "dimensions can be added or removed",
)
_GATHER = (
    "a gather or scatter",
    "--from-torch reads `torch.gather`, `cross_entropy` and `nll_loss` (class indices) as the "
    "notation's gathers (an input read at an element of an int input); not this one (a "
    "scatter, a selection by a computed index or mask); " + _NEEDS_LLM,
)
_SORT = ("sorting or selection", "the notation has no sort, top-k or median; " + _NEEDS_LLM)
_RANDOM = (
    "random numbers",
    "the notation has none, and a kernel with them could not be compared with its reference",
)
_LEARNED = (
    "a layer with a learned weight",
    "its weight is made at random in __init__; pass the weight to forward as an input and write "
    "the operation with it (e.g. `F.linear(x, w, b)`)",
)
_ROUNDING = ("rounding", "the notation has no floor, ceil, round or integer division")
_UNSUPPORTED: dict[str, tuple[str, str]] = {}
for _n in (
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
):
    _UNSUPPORTED[f"torch.nn.functional.{_n}"] = _CONV
    _UNSUPPORTED[f"torch.{_n}"] = _CONV
for _n in ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"):
    _UNSUPPORTED[f"torch.nn.{_n}"] = _CONV
for _d in ("1d", "2d", "3d"):
    for _n in (f"max_pool{_d}", f"avg_pool{_d}", f"lp_pool{_d}", f"max_unpool{_d}"):
        _UNSUPPORTED[f"torch.nn.functional.{_n}"] = _POOL
        _UNSUPPORTED[f"torch.{_n}"] = _POOL
    for _n in (
        f"MaxPool{_d}",
        f"AvgPool{_d}",
        f"LPPool{_d}",
        f"MaxUnpool{_d}",
        f"FractionalMaxPool{_d}",
    ):
        _UNSUPPORTED[f"torch.nn.{_n}"] = _POOL
for _n in ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"):
    _UNSUPPORTED[f"torch.{_n}"] = _SCAN
for _n in (
    "stack",
    "hstack",
    "vstack",
    "split",
    "chunk",
    "fliplr",
    "flipud",
    "roll",
    "diff",
    "unbind",
    "tensor_split",
    "repeat_interleave",
    "tile",
    "repeat",
):
    _UNSUPPORTED[f"torch.{_n}"] = _SLICE
_UNSUPPORTED["torch.nn.functional.pad"] = _SLICE
_UNSUPPORTED["torch.nn.functional.unfold"] = _POOL
_UNSUPPORTED["torch.nn.functional.fold"] = _POOL
_UNSUPPORTED["torch.nn.functional.interpolate"] = _POOL
for _n in ("flatten", "unflatten", "view_as"):
    _UNSUPPORTED[f"torch.{_n}"] = _RESHAPE
_UNSUPPORTED["torch.nn.Flatten"] = _RESHAPE
_UNSUPPORTED["torch.nn.Unflatten"] = _RESHAPE
_UNSUPPORTED["torch.nn.functional.pixel_shuffle"] = _RESHAPE
for _n in (
    "scatter",
    "scatter_add",
    "index_select",
    "take",
    "take_along_dim",
    "masked_select",
    "nonzero",
    "bincount",
    "histc",
    "index_add",
    "index_put",
    "embedding",
):
    _UNSUPPORTED[f"torch.{_n}"] = _GATHER
for _n in ("embedding", "one_hot", "multi_margin_loss"):
    _UNSUPPORTED[f"torch.nn.functional.{_n}"] = _GATHER
for _n in ("Embedding", "EmbeddingBag", "MultiMarginLoss"):
    _UNSUPPORTED[f"torch.nn.{_n}"] = _GATHER
for _n in (
    "sort",
    "argsort",
    "topk",
    "kthvalue",
    "median",
    "nanmedian",
    "mode",
    "quantile",
    "unique",
):
    _UNSUPPORTED[f"torch.{_n}"] = _SORT
for _n in (
    "rand",
    "randn",
    "rand_like",
    "randn_like",
    "randint",
    "bernoulli",
    "multinomial",
    "normal",
):
    _UNSUPPORTED[f"torch.{_n}"] = _RANDOM
for _n in ("Linear", "Bilinear", "LazyLinear", "Embedding", "PReLU"):
    _UNSUPPORTED[f"torch.nn.{_n}"] = _LEARNED
_UNSUPPORTED["torch.nn.Parameter"] = _LEARNED
for _n in ("floor", "ceil", "round", "trunc", "floor_divide", "remainder", "fmod", "frac"):
    _UNSUPPORTED[f"torch.{_n}"] = _ROUNDING
_UNSUPPORTED["torch.nn.LocalResponseNorm"] = _POOL

# ---- the task ------------------------------------------------------------------------------------

_FACTORIES = {"torch.rand", "torch.randn", "torch.zeros", "torch.ones", "torch.empty"}
_LIKE = {
    "torch.rand_like",
    "torch.randn_like",
    "torch.zeros_like",
    "torch.ones_like",
    "torch.empty_like",
}
_TORCH_DTYPES = {
    "float": "float",
    "float32": "float",
    "float64": "double",
    "double": "double",
    "float16": "half",
    "half": "half",
    "bfloat16": "bf16",
    "int32": "int",
    "int64": "int",
    "int": "int",
    "long": "int",
    "bool": "bool",
}
_SHAPE_KEEPING = {
    "torch.triu",
    "torch.tril",
    "torch.abs",
    "torch.exp",
    "torch.sigmoid",
    "torch.tanh",
    "torch.softmax",
    "torch.log_softmax",
    "torch.relu",
    "torch.sign",
    "torch.clamp",
    "torch.sqrt",
    "torch.nn.functional.softmax",
    "torch.nn.functional.log_softmax",
    "torch.nn.functional.normalize",
    "torch.nn.functional.relu",
    "torch.nn.functional.sigmoid",
}
_METHOD_KEEPING = {
    "cuda",
    "cpu",
    "contiguous",
    "clone",
    "detach",
    "requires_grad_",
    "softmax",
    "log_softmax",
    "abs",
    "exp",
    "sigmoid",
    "tanh",
    "relu",
    "triu",
    "tril",
    "clamp",
    "sqrt",
    "sign",
    "normal_",
    "uniform_",
}
_METHOD_DTYPES = {
    "float": "float",
    "double": "double",
    "half": "half",
    "bfloat16": "bf16",
    "int": "int",
    "long": "int",
    "bool": "bool",
}


def default_name(path: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """A kernel name from the task's file name: `20_LeakyReLU.py` -> `LeakyReLU`."""
    stem = re.sub(r"\W", "_", Path(path).stem)
    name = re.sub(r"^\d+_", "", stem).strip("_")[:90] or "task"
    if not name[0].isalpha():
        name = f"k_{name}"
    while name in taken or name in RESERVED:
        name = f"{name}_kernel"
    return name


def translate(
    text: str, path: str = "<task>", overrides: Mapping[str, object] | None = None
) -> Translation:
    """The formula of a KernelBench task's `forward`; `FormulaError` (one line, at the task's line
    and column) for what the notation cannot express. `overrides` replaces module-level
    constants (`{"batch_size": 8}`): the same task at other sizes."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        line = e.lineno or 1
        col = e.offset or 1
        raise FormulaError(
            f"cannot read the task: {e.msg} (Python syntax); --from-torch reads a Python file "
            "with `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`",
            Position(path, line, col),
        ) from None
    except (ValueError, RecursionError) as e:  # a NUL byte, a pathological nesting
        raise FormulaError(f"cannot read the task: {e}", Position(path, 1, 1)) from None
    return _Task(text, path, dict(overrides or {})).run(tree)


# ---- reading the file ----------------------------------------------------------------------------


class _Task:
    def __init__(self, text: str, path: str, overrides: dict[str, object]):
        self.text = text
        self.path = path
        self.overrides = overrides
        self.aliases: dict[str, str] = {}
        self.consts: dict[str, object] = {}
        self.syms: dict[str, Sym] = {}
        self.anon = 0
        self.scalars: dict[tuple[str, float], Scalar] = {}
        self.notes: list[str] = []
        self.attrs: dict[str, object] = {}
        self.node: ast.AST | None = None  # the call being evaluated, for errors

    # -- errors --

    def pos(self, node: ast.AST | None) -> Position:
        if node is None or not hasattr(node, "lineno"):
            return Position(self.path, 1, 1)
        return Position(self.path, node.lineno, node.col_offset + 1)

    def fail(self, message: str, node: ast.AST | None = None):
        raise FormulaError(message, self.pos(node if node is not None else self.node))

    def src(self, node: ast.AST, limit: int = 50) -> str:
        return quote(ast.get_source_segment(self.text, node) or ast.dump(node)[:limit], limit)

    def not_covered(self, what: str, kind: tuple[str, str], node) -> None:
        self.fail(f"`{what}` ({kind[0]}) is not covered: {kind[1]}", node)

    # -- the whole task --

    def run(self, tree: ast.Module) -> Translation:
        self.imports(tree)
        self.constants(tree)
        model = next(
            (s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Model"), None
        )
        if model is None:
            self.fail(
                "no `class Model` in the task; --from-torch reads KernelBench's format: "
                "`class Model(nn.Module)` with `__init__` and `forward`, `get_inputs()` and "
                "`get_init_inputs()`",
                None,
            )
        methods = {s.name: s for s in model.body if isinstance(s, ast.FunctionDef)}
        forward = methods.get("forward")
        if forward is None:
            self.fail(
                "`class Model` has no `forward`; its operations are what is translated", model
            )
        funcs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
        if "get_inputs" not in funcs:
            self.fail(
                "no `get_inputs()` in the task; it gives the shapes of forward's inputs "
                "(`return [torch.rand(batch_size, dim)]`)",
                None,
            )
        init_values = self.init_inputs(funcs.get("get_init_inputs"))
        if "__init__" in methods:
            self.init(methods["__init__"], init_values)
        elif init_values:
            self.fail("get_init_inputs() returns values but Model has no __init__", model)
        inputs = self.inputs(funcs["get_inputs"])
        return _Forward(self, forward, inputs).translate()

    def imports(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for name, full in (
            ("torch", "torch"),
            ("nn", "torch.nn"),
            ("F", "torch.nn.functional"),
            ("math", "math"),
        ):
            self.aliases.setdefault(name, full)

    def canonical(self, path: str) -> str:
        for short, full in (
            ("torch.nn.modules.", "torch.nn."),
            ("torch.special.", "torch."),
            ("torch.linalg.", "torch.linalg."),
        ):
            if path.startswith(short) and short != full:
                return full + path[len(short) :]
        return path

    def dotted(self, node: ast.AST) -> str | None:
        """`torch.nn.functional.relu` for `F.relu` and the like, by the file's imports."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        parts.append(self.aliases[node.id])
        return self.canonical(".".join(reversed(parts)))

    # -- module constants --

    def constants(self, tree: ast.Module) -> None:
        seen: set[str] = set()
        for st in tree.body:
            targets, value = _assignment(st)
            if value is None:
                continue
            for t in targets:
                if isinstance(t, ast.Name):
                    seen.add(t.id)
                    if t.id in self.overrides:
                        self.consts[t.id] = self.overrides[t.id]
                        continue
                    self.consts[t.id] = self.const(value, self.consts)
                elif isinstance(t, ast.Tuple | ast.List):
                    v = self.const(value, self.consts)
                    names = [e.id for e in t.elts if isinstance(e, ast.Name)]
                    if isinstance(v, tuple) and len(v) == len(t.elts) == len(names):
                        for n, x in zip(names, v, strict=True):
                            seen.add(n)
                            self.consts[n] = self.overrides.get(n, x)
        unknown = sorted(set(self.overrides) - seen)
        if unknown:
            self.fail(
                f"no module-level constant `{unknown[0]}` to give another value; the task's "
                f"constants are: {', '.join(sorted(seen)) or 'none'}",
                None,
            )

    def const(self, node: ast.AST, env: Mapping[str, object]):
        """The value of a constant expression (numbers, strings, tuples, arithmetic, `math`), or
        an `Unknown`."""
        try:
            return self._const(node, env)
        except _NotConst as e:
            return Unknown(e.why, e.node or node)
        except (ArithmeticError, ValueError, TypeError, OverflowError) as e:
            return Unknown(f"`{self.src(node)}` cannot be evaluated: {e}", node)

    def _const(self, node: ast.AST, env: Mapping[str, object]):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, int | float | str | bool) or node.value is None:
                return node.value
            raise _NotConst(f"`{self.src(node)}` is not a number", node)
        if isinstance(node, ast.Name):
            if node.id in env:
                v = env[node.id]
                if isinstance(v, Unknown):
                    raise _NotConst(v.why, v.node)
                return v
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            raise _NotConst(f"`{node.id}` has no value --from-torch can read", node)
        if isinstance(node, ast.Tuple | ast.List):
            out = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    out.extend(self._const(e.value, env))
                else:
                    out.append(self._const(e, env))
            return tuple(out)
        if isinstance(node, ast.UnaryOp):
            v = self._const(node.operand, env)
            if isinstance(node.op, ast.USub):
                return -v
            if isinstance(node.op, ast.UAdd):
                return +v
            if isinstance(node.op, ast.Not):
                return not v
        if isinstance(node, ast.BinOp):
            a = self._const(node.left, env)
            b = self._const(node.right, env)
            op = _PY_OPS.get(type(node.op))
            if op is not None and not isinstance(a, str | tuple) and not isinstance(b, str | tuple):
                return op(a, b)
            if isinstance(node.op, ast.Add) and isinstance(a, tuple) and isinstance(b, tuple):
                return a + b
            if isinstance(node.op, ast.Mult) and isinstance(a, tuple) and isinstance(b, int):
                return a * b
        if isinstance(node, ast.Subscript):
            v = self._const(node.value, env)
            i = self._const(node.slice, env)
            if isinstance(v, tuple) and isinstance(i, int):
                return v[i]
        if isinstance(node, ast.Attribute):
            path = self.dotted(node)
            if path in ("math.pi", "math.e", "math.inf", "math.tau"):
                return getattr(math, path.split(".")[1])
        if isinstance(node, ast.Call):
            path = self.dotted(node.func) if not isinstance(node.func, ast.Name) else None
            fname = node.func.id if isinstance(node.func, ast.Name) else None
            args = [self._const(a, env) for a in node.args]
            if path and path.startswith("math.") and not node.keywords:
                f = getattr(math, path[5:], None)
                if callable(f) and path[5:] in _MATH_FUNCS:
                    return f(*args)
            if fname in ("int", "float", "abs", "min", "max", "round", "len", "tuple", "list"):
                if fname in ("tuple", "list"):
                    return tuple(args[0])
                return {"int": int, "float": float, "abs": abs, "min": min, "max": max,
                        "round": round, "len": len}[fname](*args)  # fmt: skip
        raise _NotConst(f"`{self.src(node)}` is not a constant --from-torch can evaluate", node)

    # -- __init__ and get_init_inputs --

    def init_inputs(self, fn: ast.FunctionDef | None) -> list:
        if fn is None:
            return []
        value = self.run_function(fn, self.const)
        if isinstance(value, Unknown):
            self.fail(f"get_init_inputs(): {value.why}", value.node or fn)
        if not isinstance(value, tuple):
            self.fail("get_init_inputs() must return a list of constructor arguments", fn)
        return list(value)

    def run_function(self, fn: ast.FunctionDef, evaluate):
        """The value a small function returns: assignments to local names, then `return`."""
        env = dict(self.consts)
        for st in fn.body:
            if _docstring(st):
                continue
            targets, value = _assignment(st)
            if value is not None and all(isinstance(t, ast.Name) for t in targets):
                v = evaluate(value, env)
                for t in targets:
                    env[t.id] = v
                continue
            if isinstance(st, ast.Return):
                if st.value is None:
                    return Unknown("it returns nothing", st)
                return evaluate(st.value, env)
            return Unknown(f"`{self.src(st)}` is not a statement --from-torch follows", st)
        return Unknown("it has no `return`", fn)

    def init(self, fn: ast.FunctionDef, values: list) -> None:
        a = fn.args
        params = [p.arg for p in a.posonlyargs + a.args][1:]
        defaults = dict(zip(params[len(params) - len(a.defaults) :], a.defaults, strict=True))
        if len(values) > len(params) and a.vararg is None:
            self.fail(
                f"get_init_inputs() returns {len(values)} values but __init__ takes "
                f"{len(params)} ({', '.join(params) or 'none'})",
                fn,
            )
        env: dict[str, object] = dict(self.consts)
        for i, p in enumerate(params):
            if i < len(values):
                env[p] = values[i]
            elif p in defaults:
                env[p] = self.const(defaults[p], self.consts)
            else:
                env[p] = Unknown(f"__init__'s `{p}` has no value: get_init_inputs() gives none")
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            env[p.arg] = (
                self.const(d, self.consts) if d is not None else Unknown(f"`{p.arg}` has no value")
            )
        self.init_body(fn.body, env)

    def init_body(self, body: list[ast.stmt], env: dict[str, object]) -> None:
        for st in body:
            if _docstring(st):
                continue
            if isinstance(st, ast.Expr) and _is_super_init(st.value):
                continue
            if isinstance(st, ast.Pass):
                continue
            targets, value = _assignment(st)
            if value is not None:
                v = self.init_value(value, env)
                for t in targets:
                    self.bind_init(t, v, env, st)
                continue
            if isinstance(st, ast.If):
                test = self.const(st.test, env)
                if not isinstance(test, Unknown):
                    self.init_body(st.body if test else st.orelse, env)
                    continue
            # a statement not followed: whatever it changes on self is unknown
            for node in ast.walk(st):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    self.attrs[node.attr] = Unknown(
                        f"`self.{node.attr}` is changed at line {st.lineno} by a statement "
                        "--from-torch does not follow",
                        st,
                    )

    def bind_init(self, target: ast.AST, value, env: dict[str, object], st: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            if isinstance(value, ModuleSpec):
                value.attr = target.attr
            self.attrs[target.attr] = value
        elif (
            isinstance(target, ast.Tuple | ast.List)
            and isinstance(value, tuple)
            and len(value) == len(target.elts)
        ):
            for t, v in zip(target.elts, value, strict=True):
                self.bind_init(t, v, env, st)

    def init_value(self, node: ast.AST, env: Mapping[str, object]):
        if isinstance(node, ast.Call):
            path = self.dotted(node.func)
            parts = (path or "").split(".")
            if len(parts) == 3 and parts[1] == "nn" and parts[2][:1].isupper():
                cls = parts[2]
                if cls in ("Parameter", "Buffer"):
                    return Unknown(
                        f"`{self.src(node)}` is a learned parameter made at random in __init__; "
                        + _LEARNED[1],
                        node,
                    )
                args = [self.init_value(a, env) for a in node.args]
                kwargs = {k.arg: self.init_value(k.value, env) for k in node.keywords if k.arg}
                return ModuleSpec(cls, args, kwargs, node)
            if path and path.startswith("torch."):
                return Unknown(
                    f"`{self.src(node)}` (line {node.lineno}) makes a tensor in __init__; the "
                    "kernel would read it as an input: pass it to forward (made in get_inputs)",
                    node,
                )
        return self.const(node, env)

    # -- get_inputs --

    def inputs(self, fn: ast.FunctionDef) -> list[InputSpec]:
        value = self.run_function(fn, self.shape)
        if isinstance(value, Unknown):
            self.fail(f"cannot tell the shapes of forward's inputs: {value.why}", value.node or fn)
        if not isinstance(value, tuple):
            self.fail("get_inputs() must return a list of tensors", fn)
        for i, v in enumerate(value):
            if not isinstance(v, InputSpec):
                why = v.why if isinstance(v, Unknown) else f"it is {v!r}, not a tensor"
                self.fail(
                    f"cannot tell the shape of input {i + 1} of get_inputs(): {why}; --from-torch "
                    "reads torch.rand/randn/zeros/ones/randint(...) and arithmetic on them",
                    getattr(v, "node", None) or fn,
                )
        return list(value)

    def sym(self, name: str, value: int) -> Dim:
        if value == 1:
            return None
        s = self.syms.get(name)
        if s is not None and s.value == value:
            return s
        if s is not None:  # the same name, another value (a local of get_inputs)
            return self.sym(f"{name}_2", value)
        s = Sym(name, value)
        self.syms[name] = s
        return s

    def anonymous(self, value: int) -> Dim:
        if value == 1:
            return None
        while f"D{self.anon}" in self.consts or f"D{self.anon}" in self.syms:
            self.anon += 1
        name = f"D{self.anon}"
        self.anon += 1
        s = Sym(name, value, anonymous=True)
        self.syms[name] = s
        return s

    def dims_of(self, node: ast.AST, env: Mapping[str, object]) -> list[Dim]:
        """The sizes a shape argument gives, each named after the constant it comes from."""
        if isinstance(node, ast.Starred):
            return self.dims_of(node.value, env)
        if isinstance(node, ast.Tuple | ast.List):
            return [d for e in node.elts for d in self.dims_of(e, env)]
        # another input's shape: `torch.randint(0, 2, x.shape)`, `x.size()`
        of = node.func if isinstance(node, ast.Call) and not node.args else node
        if isinstance(of, ast.Attribute) and of.attr in ("shape", "size"):
            base = self.shape(of.value, env)
            if isinstance(base, InputSpec):
                return list(base.dims)
        v = self.const(node, env)
        if isinstance(v, Unknown):
            self.fail(f"cannot tell a size of an input: {v.why}", v.node or node)
        if isinstance(v, tuple):
            if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
                self.fail(f"`{self.src(node)}` is not a shape (positive whole numbers)", node)
            if any(x > (1 << 31) - 1 for x in v):
                self.fail(f"`{self.src(node)}` has a size past 2^31 - 1 (an `int`)", node)
            if isinstance(node, ast.Name):
                if len(v) == 1:
                    return [self.sym(node.id, v[0])]
                return [self.sym(f"{node.id}_{i}", x) for i, x in enumerate(v)]
            return [self.anonymous(x) for x in v]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            self.fail(f"`{self.src(node)}` is {v!r}; a size is a positive whole number", node)
        if v > (1 << 31) - 1:
            self.fail(
                f"`{self.src(node)}` is {v}; the kernel's sizes are `int`s, at most 2^31 - 1", node
            )
        if isinstance(node, ast.Name):
            return [self.sym(node.id, v)]
        return [self.anonymous(v)]

    def shape(self, node: ast.AST, env: Mapping[str, object]):
        """An input's shape from the expression that makes it, or a constant, or `Unknown`."""
        if isinstance(node, ast.Name) and isinstance(env.get(node.id), InputSpec):
            return env[node.id]
        if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
            base = self.shape(node.value, env)
            if isinstance(base, InputSpec) and len(base.dims) == 2:
                return InputSpec(base.dims[::-1], base.dtype, node, False)
        if isinstance(node, ast.Tuple | ast.List):
            return tuple(self.shape(e, env) for e in node.elts)
        if isinstance(node, ast.Call):
            path = self.dotted(node.func)
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            dtype = self.torch_dtype(kw.get("dtype"), "float")
            if path in _FACTORIES:
                dims = [d for a in node.args for d in self.dims_of(a, env)]
                if "size" in kw:
                    dims += self.dims_of(kw["size"], env)
                return InputSpec(dims, dtype, node)
            if path == "torch.randint":
                args = list(node.args)
                size = kw.get("size") or (args[-1] if args else None)
                if size is None:
                    return Unknown("torch.randint without a size", node)
                return InputSpec(
                    self.dims_of(size, env), self.torch_dtype(kw.get("dtype"), "int"), node
                )
            if path == "torch.full" and node.args:
                return InputSpec(self.dims_of(node.args[0], env), dtype, node, plain=False)
            if path in _LIKE or path in _SHAPE_KEEPING:
                base = self.shape(node.args[0], env) if node.args else None
                if isinstance(base, InputSpec):
                    return InputSpec(
                        base.dims, base.dtype, node, plain=path in _LIKE and "rand" in path
                    )
                return base if isinstance(base, Unknown) else Unknown(f"`{self.src(node)}`", node)
            if isinstance(node.func, ast.Attribute) and path is None:
                base = self.shape(node.func.value, env)
                m = node.func.attr
                if isinstance(base, InputSpec):
                    if m in _METHOD_DTYPES:
                        return InputSpec(base.dims, _METHOD_DTYPES[m], node, base.plain)
                    if m == "to":
                        arg = node.args[0] if node.args else kw.get("dtype")
                        return InputSpec(
                            base.dims, self.torch_dtype(arg, base.dtype), node, base.plain
                        )
                    if m in _METHOD_KEEPING:
                        return InputSpec(
                            base.dims,
                            base.dtype,
                            node,
                            base.plain and m in ("cuda", "cpu", "contiguous"),
                        )
                    if m == "t" and len(base.dims) == 2:
                        return InputSpec(base.dims[::-1], base.dtype, node, False)
                if isinstance(base, Unknown):
                    return base
            return Unknown(
                f"`{self.src(node)}` is not a tensor --from-torch can tell the shape of", node
            )
        if isinstance(node, ast.BinOp):
            a = self.shape(node.left, env)
            b = self.shape(node.right, env)
            for x in (a, b):
                if isinstance(x, Unknown):
                    return x
            shapes = [x for x in (a, b) if isinstance(x, InputSpec)]
            if not shapes:
                return self.const(node, env)
            dims = _broadcast_shapes([s.dims for s in shapes])
            if dims is None:
                return Unknown(f"`{self.src(node)}`: shapes that do not broadcast", node)
            dtype = (
                "float"
                if any(s.dtype != "int" for s in shapes) or isinstance(node.op, ast.Div)
                else "int"
            )
            if any(isinstance(x, float) for x in (a, b)):
                dtype = "float"
            return InputSpec(dims, dtype, node, plain=False)
        if isinstance(node, ast.UnaryOp):
            a = self.shape(node.operand, env)
            if isinstance(a, InputSpec):
                return InputSpec(a.dims, a.dtype, node, plain=False)
            return a
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a = self.shape(node.left, env)
            b = self.shape(node.comparators[0], env)
            for x in (a, b):
                if isinstance(x, Unknown):
                    return x
            shapes = [x for x in (a, b) if isinstance(x, InputSpec)]
            if shapes:  # `torch.rand(n) > 0.5`: a mask
                dims = _broadcast_shapes([x.dims for x in shapes])
                if dims is None:
                    return Unknown(f"`{self.src(node)}`: shapes that do not broadcast", node)
                return InputSpec(dims, "bool", node, plain=False)
        return self.const(node, env)

    def torch_dtype(self, node: ast.AST | None, default: str) -> str:
        if node is None:
            return default
        path = self.dotted(node) or ""
        name = path.removeprefix("torch.")
        return _TORCH_DTYPES.get(name, default)

    def scalar(self, label: str, value: float) -> Scalar:
        key = (label, float(value))
        if key not in self.scalars:
            self.scalars[key] = Scalar(label, float(value))
        return self.scalars[key]


class _NotConst(Exception):
    def __init__(self, why: str, node: ast.AST | None = None):
        super().__init__(why)
        self.why = why
        self.node = node


_MATH_FUNCS = {
    "sqrt", "exp", "log", "log2", "log10", "tanh", "sin", "cos", "tan", "erf", "pow", "floor",
    "ceil", "fabs", "prod", "isqrt", "atan", "asin", "acos",
}  # fmt: skip
_PY_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}


def _assignment(st: ast.stmt) -> tuple[list[ast.AST], ast.AST | None]:
    if isinstance(st, ast.Assign):
        return list(st.targets), st.value
    if isinstance(st, ast.AnnAssign) and st.value is not None:
        return [st.target], st.value
    return [], None


def _docstring(st: ast.stmt) -> bool:
    return isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)


def _is_super_init(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "__init__"
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "super"
    )


def _broadcast_shapes(shapes: list[list[Dim]]) -> list[Dim] | None:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for p in range(rank):
        d: Dim = None
        for s in shapes:
            q = p - (rank - len(s))
            if q < 0 or s[q] is None:
                continue
            if d is None:
                d = s[q]
            elif d.root() is not s[q].root() and d.value != s[q].value:
                return None
        out.append(d)
    return out


# ---- forward -------------------------------------------------------------------------------------


class _Forward:
    """forward's statements evaluated into values; then the formula."""

    def __init__(self, task: _Task, fn: ast.FunctionDef, inputs: list[InputSpec]):
        self.t = task
        self.fn = fn
        self.inputs = inputs
        self.leaves: list[Leaf] = []
        self.notes = task.notes
        self.return_node: ast.AST = fn

    @property
    def node(self):
        return self.t.node

    def fail(self, message: str, node=None):
        self.t.fail(message, node)

    def extra_input(self, name: str, dims: list[Dim]) -> Leaf:
        """A tensor the module makes in __init__ (a convolution's weight): an input of the
        kernel, after forward's own."""
        leaf = Leaf(name, dims, "float", self.node)
        self.leaves.append(leaf)
        return leaf

    # -- the whole of forward --

    def translate(self) -> Translation:
        a = self.fn.args
        if a.vararg or a.kwarg or a.kwonlyargs:
            self.fail("forward's inputs must be plain parameters (no *args, **kwargs)", self.fn)
        params = [p.arg for p in a.posonlyargs + a.args][1:]
        defaults = dict(zip(params[len(params) - len(a.defaults) :], a.defaults, strict=True))
        if len(self.inputs) > len(params) or any(
            p not in defaults for p in params[len(self.inputs) :]
        ):
            self.fail(
                f"get_inputs() returns {len(self.inputs)} tensor(s) but forward takes "
                f"{len(params)} ({', '.join(params) or 'none'})",
                self.fn,
            )
        env: dict[str, object] = {}
        for i, p in enumerate(params):
            if i < len(self.inputs):
                spec = self.inputs[i]
                if not any(d is not None for d in spec.dims):
                    self.fail(
                        f"forward's input `{p}` has one element; the notation reads tensors with "
                        "at least one dimension of more than one element (a number is a scalar "
                        "with a fixed value)",
                        spec.node,
                    )
                leaf = Leaf(p, list(spec.dims), spec.dtype, spec.node)
                self.leaves.append(leaf)
                env[p] = leaf
                if not spec.plain:
                    self.notes.append(
                        f"get_inputs() makes `{p}` as `{self.t.src(spec.node, 60)}`; the kernel "
                        "computes forward for any values of it"
                    )
            else:
                env[p] = self.t.const(defaults[p], self.t.consts)
        result = self.body(self.fn.body, env)
        if result is None:
            self.fail("forward returns nothing; it must return one tensor", self.fn)
        value, node = result
        self.return_node = node
        if isinstance(value, tuple):
            self.fail(
                "forward returns several results; one kernel per formula writes one result "
                "(translate each in a module of its own)",
                node,
            )
        if not isinstance(value, Val):
            self.fail(f"forward returns `{self.t.src(node)}`, not a tensor", node)
        return _Emitter(self, value, node).formula()

    def body(self, stmts: list[ast.stmt], env: dict[str, object]):
        for st in stmts:
            if _docstring(st) or isinstance(st, ast.Pass):
                continue
            self.t.node = st
            if isinstance(st, ast.Return):
                if st.value is None:
                    return None
                return self.ev(st.value, env), st.value
            targets, value = _assignment(st)
            if value is not None:
                v = self.ev(value, env)
                for target in targets:
                    self.assign(target, v, env, st)
                continue
            if isinstance(st, ast.AugAssign):
                if not isinstance(st.target, ast.Name) or st.target.id not in env:
                    self.fail(f"`{self.t.src(st)}` updates something that is not a local name", st)
                v = self.binop(st.op, env[st.target.id], self.ev(st.value, env), st)
                self.assign(st.target, v, env, st)
                continue
            if isinstance(st, ast.Expr):
                call = st.value
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr.endswith("_")
                    and not call.func.attr.endswith("__")
                    and isinstance(call.func.value, ast.Name)
                ):  # x.relu_(): x changes
                    env[call.func.value.id] = self.ev(call, env)
                    continue
                self.ev(st.value, env)
                continue
            if isinstance(st, ast.If):
                test = self.ev(st.test, env)
                if isinstance(test, Val):
                    self.fail(
                        "a branch on a tensor's values is not covered: write it with "
                        "`torch.where(cond, a, b)`",
                        st,
                    )
                result = self.body(st.body if test else st.orelse, env)
                if result is not None:
                    return result
                continue
            what = type(st).__name__.lower()
            self.fail(
                f"`{what}` in forward is not covered: the notation has no loops or other "
                "statements; forward is read as assignments and a `return`",
                st,
            )
        return None

    def assign(self, target: ast.AST, v, env: dict[str, object], st: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = v
            if isinstance(v, Val) and not isinstance(v, Leaf | Const) and v.hint is None:
                v.hint = target.id
        elif isinstance(target, ast.Tuple | ast.List):
            if not isinstance(v, tuple) or len(v) != len(target.elts):
                self.fail(
                    f"cannot unpack `{self.t.src(st.value)}` into {len(target.elts)} names", st
                )
            for t, x in zip(target.elts, v, strict=True):
                self.assign(t, x, env, st)
        else:
            self.fail(
                f"assigning to `{self.t.src(target)}` is not covered: forward is read as "
                "assignments to local names",
                st,
            )

    # -- expressions --

    def ev(self, node: ast.AST, env: Mapping[str, object]):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id == "self":
                return SelfRef()
            if node.id in self.t.consts:
                v = self.t.consts[node.id]
                if isinstance(v, Unknown):
                    self.fail(v.why, node)
                s = self.t.syms.get(node.id)
                if s is not None and isinstance(v, int) and s.value == v:
                    return SizeInt(s)
                return _named(v, node.id)
            if node.id in self.t.aliases:
                return ModPath(self.t.aliases[node.id])
            if node.id in _BUILTINS:
                return ModPath(f"builtins.{node.id}")
            self.fail(f"`{node.id}` has no value here", node)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, env)
        if isinstance(node, ast.Tuple | ast.List):
            return tuple(self.ev(e, env) for e in node.elts)
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.ev(node.left, env), self.ev(node.right, env), node)
        if isinstance(node, ast.UnaryOp):
            v = self.ev(node.operand, env)
            if isinstance(node.op, ast.USub):
                if isinstance(v, Val | SizeInt):
                    return self.ew(lambda a: _neg(a[0]), v, node=node)
                return -v
            if isinstance(node.op, ast.UAdd):
                return v
            if isinstance(node.op, ast.Invert) and isinstance(v, Val) and v.dtype == "bool":
                return self.ew(lambda a: ECmp("==", a[0], _num(0)), v, dtype="bool", node=node)
            if isinstance(node.op, ast.Not) and not isinstance(v, Val):
                return not v
            self.fail(f"`{self.t.src(node)}` is not covered", node)
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                self.fail("a chained comparison is not covered; write `(a < b) & (b < c)`", node)
            a = self.ev(node.left, env)
            b = self.ev(node.comparators[0], env)
            return self.compare(node.ops[0], a, b, node)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        if isinstance(node, ast.Subscript):
            return self.subscript(node, env)
        if isinstance(node, ast.IfExp):
            test = self.ev(node.test, env)
            if isinstance(test, Val):
                self.fail("a conditional on a tensor's values: write `torch.where(c, a, b)`", node)
            return self.ev(node.body if test else node.orelse, env)
        if isinstance(node, ast.BoolOp):
            vals = [self.ev(v, env) for v in node.values]
            if any(isinstance(v, Val) for v in vals):
                self.fail("`and`/`or` on tensors is not covered; use `&`, `|`", node)
            out = vals[0]
            for v in vals[1:]:
                out = (out and v) if isinstance(node.op, ast.And) else (out or v)
            return out
        self.fail(f"`{self.t.src(node)}` ({type(node).__name__}) is not covered in forward", node)

    def attribute(self, node: ast.Attribute, env):
        base = self.ev(node.value, env)
        name = node.attr
        if isinstance(base, ModPath):
            path = self.t.canonical(f"{base.path}.{name}")
            if path in ("math.pi", "math.e", "math.tau"):
                return getattr(math, name)
            return ModPath(path)
        if isinstance(base, SelfRef):
            if name not in self.t.attrs:
                self.fail(f"`self.{name}` is not set in __init__", node)
            v = self.t.attrs[name]
            if isinstance(v, Unknown):
                self.fail(v.why, node)
            return _named(v, name)
        if isinstance(base, Pair) and name in ("values", "indices"):
            return getattr(base, name)
        if isinstance(base, Val):
            if name == "T":
                return self.permute(base, list(range(base.rank))[::-1], node)
            if name == "mT":
                return self.transpose(base, -2, -1, node)
            if name == "shape":
                return tuple(SizeInt(d) if d is not None else 1 for d in base.dims)
            if name in ("data", "real"):
                return base
            if name == "ndim":
                return base.rank
            return Method(base, name)
        if isinstance(base, ModuleSpec | Method):
            self.fail(f"`{self.t.src(node)}` is not covered", node)
        if isinstance(base, tuple | int | float):
            return Method(base, name)
        self.fail(f"`{self.t.src(node)}` is not covered", node)

    def subscript(self, node: ast.Subscript, env):
        base = self.ev(node.value, env)
        if isinstance(base, tuple) and not isinstance(base, Val):
            i = self.ev(node.slice, env)
            if isinstance(i, int):
                return base[i]
            if isinstance(i, slice):
                return base[i]
            self.fail(f"`{self.t.src(node)}`: a tuple is indexed with a number", node)
        if not isinstance(base, Val):
            self.fail(f"`{self.t.src(node)}` is not covered", node)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        # only `:`, `None` and `...`: views that add size-1 dimensions
        out = base
        pos = 0
        ellipsis = False
        for k, it in enumerate(items):
            if (
                isinstance(it, ast.Slice)
                and it.lower is None
                and it.upper is None
                and it.step is None
            ):
                pos += 1
            elif isinstance(it, ast.Constant) and it.value is None:
                out = self.unsqueeze(out, pos, node)
                pos += 1
            elif isinstance(it, ast.Constant) and it.value is Ellipsis and not ellipsis:
                ellipsis = True
                rest = sum(
                    1
                    for x in items[k + 1 :]
                    if not (isinstance(x, ast.Constant) and x.value is None)
                )
                pos = out.rank - rest
            elif isinstance(it, ast.Slice) and pos < out.rank:
                # x[:, a:b]: a part of the dimension (steps other than 1 are not covered)
                step = self.ev(it.step, env) if it.step is not None else 1
                if step != 1:
                    self.t.not_covered(self.t.src(node), _SLICE, node)
                n = _extent(out.dims[pos])
                lo = _whole(self, self.ev(it.lower, env), "a slice's start") if it.lower else 0
                hi = _whole(self, self.ev(it.upper, env), "a slice's end") if it.upper else n
                lo, hi = (min(max(v + n if v < 0 else v, 0), n) for v in (lo, hi))
                if hi <= lo:
                    self.fail(f"`{self.t.src(node)}` is empty", node)
                out = _slice(self, out, pos, lo, hi - lo)
                pos += 1
            elif pos < out.rank and not isinstance(it, ast.Slice | ast.Tuple | ast.List):
                i = self.ev(it, env)
                if isinstance(i, Val) and not isinstance(i, Const):
                    self.t.not_covered(self.t.src(node), _GATHER, node)
                out = _f_select(self, out, pos, i)
            else:
                self.t.not_covered(self.t.src(node), _SLICE, node)
        return out

    # -- values --

    def val(self, x, node=None) -> Val:
        """A tensor value of a Python value: a number, a size, a scalar attribute."""
        if isinstance(x, Val):
            return x
        if isinstance(x, bool):
            return Const(_num(1.0 if x else 0.0))
        if isinstance(x, SizeInt):
            return Const(ERef(x.sym))
        if isinstance(x, NamedInt | NamedFloat):
            if not math.isfinite(x):
                self.fail(f"`{x.label}` is {float(x)}; the notation has no infinity", node)
            return Const(ERef(self.t.scalar(x.label, float(x))))
        if isinstance(x, int | float):
            if not math.isfinite(x):
                self.fail(
                    f"{float(x)} is not covered: the notation's numbers are finite (masks are "
                    "`where(cond, a, b)`)",
                    node,
                )
            return Const(_num(x))
        if isinstance(x, tuple | list):
            self.fail("a list of numbers as a tensor is not covered", node)
        if isinstance(x, Unknown):
            self.fail(x.why, x.node or node)
        self.fail(f"`{self.t.src(node) if node else x}` is not a tensor", node)

    def num(self, v: Val) -> Val:
        """A boolean value as 1 and 0."""
        if v.dtype == "bool":
            return self.ew(lambda a: _where(a[0], _num(1), _num(0)), v, raw=True)
        return v

    def ew(
        self,
        fn: Callable[[list], object],
        *args,
        dtype: str | None = None,
        node=None,
        raw: bool = False,
    ) -> Val:
        """An elementwise function of broadcast arguments (booleans as 1 and 0 unless `raw`)."""
        node = node or self.node
        vals = [self.val(a, node) for a in args]
        if not raw:
            vals = [self.num(v) for v in vals]
        rank = max([v.rank for v in vals] + [0])
        dims: list[Dim] = []
        for p in range(rank):
            d: Dim = None
            for v in vals:
                q = p - (rank - v.rank)
                if q < 0 or v.dims[q] is None:
                    continue
                if d is None:
                    d = v.dims[q]
                else:
                    self.unify(d, v.dims[q], node, "the shapes do not broadcast")
            dims.append(d)
        places = [[p + rank - v.rank for p in range(v.rank)] for v in vals]
        if dtype is None:
            dtype = "float"
        return Map(lambda a, idx: fn(a), vals, places, dims, node, dtype)

    def unify(self, a: Sym, b: Sym, node, why: str) -> None:
        ra, rb = a.root(), b.root()
        if ra is rb:
            return
        if ra.value != rb.value:
            self.fail(
                f"{why}: a dimension of {ra.value} (`{ra.name}`) meets one of {rb.value} "
                f"(`{rb.name}`)",
                node,
            )
        if ra.anonymous and not rb.anonymous:
            ra, rb = rb, ra
        rb.parent = ra

    def view(self, x: Val, places: list[int], dims: list[Dim], node) -> Val:
        return Map(lambda a, idx: a[0], [x], [places], dims, node, x.dtype, view=True)

    def axis(self, d, rank: int, node) -> int:
        if isinstance(d, bool) or not isinstance(d, int):
            self.fail(f"a dimension is a whole number, not {d!r}", node)
        if not -max(rank, 1) <= d < max(rank, 1):
            self.fail(f"dimension {d} is out of range for a tensor of {rank} dimension(s)", node)
        return d % max(rank, 1)

    def axes(self, dim, rank: int, node) -> tuple[int, ...]:
        if dim is None or rank == 0:
            return tuple(range(rank))
        if isinstance(dim, tuple | list):
            out = tuple(sorted({self.axis(d, rank, node) for d in dim}))
            return out if out else tuple(range(rank))
        return (self.axis(dim, rank, node),)

    def permute(self, x: Val, order: list[int], node) -> Val:
        order = [self.axis(o, x.rank, node) for o in order]
        if sorted(order) != list(range(x.rank)):
            self.fail(f"{order} is not a permutation of the {x.rank} dimensions", node)
        places = [order.index(p) for p in range(x.rank)]
        return self.view(x, places, [x.dims[o] for o in order], node)

    def transpose(self, x: Val, a: int, b: int, node) -> Val:
        if x.rank < 2:
            return x
        a, b = self.axis(a, x.rank, node), self.axis(b, x.rank, node)
        order = list(range(x.rank))
        order[a], order[b] = order[b], order[a]
        return self.permute(x, order, node)

    def unsqueeze(self, x: Val, d: int, node) -> Val:
        if isinstance(d, bool) or not isinstance(d, int):
            self.fail(f"unsqueeze takes a dimension, a whole number, not {d!r}", node)
        if not -(x.rank + 1) <= d <= x.rank:
            self.fail(f"unsqueeze({d}) is out of range for {x.rank} dimension(s)", node)
        d = d % (x.rank + 1)
        places = [p if p < d else p + 1 for p in range(x.rank)]
        return self.view(x, places, x.dims[:d] + [None] + x.dims[d:], node)

    def squeeze(self, x: Val, dim, node) -> Val:
        drop = self.axes(dim, x.rank, node) if dim is not None else tuple(range(x.rank))
        drop = tuple(p for p in drop if x.dims[p] is None)
        keep = [p for p in range(x.rank) if p not in drop]
        places = [keep.index(p) if p in keep else 0 for p in range(x.rank)]
        return self.view(x, places, [x.dims[p] for p in keep], node)

    def reshape(self, x: Val, shape, node) -> Val:
        """Only size-1 dimensions added or removed: the others stay, in order."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        self.check_shape(shape, node)
        sized = [d for d in x.dims if d is not None]
        total = math.prod(d.value for d in sized)
        known = math.prod(int(s) for s in shape if s != -1)
        target = [int(s) if s != -1 else (total // known if known else 0) for s in shape]
        nonunit = [(k, s) for k, s in enumerate(target) if s != 1]
        if (
            math.prod(target) != total
            or len(nonunit) != len(sized)
            or any(s != d.value for (_, s), d in zip(nonunit, sized, strict=True))
        ):
            self.t.not_covered(self.t.src(node), _RESHAPE, node)
        dims: list[Dim] = [None] * len(target)
        src = [p for p, d in enumerate(x.dims) if d is not None]
        places = [0] * x.rank
        for (k, _), p, d in zip(nonunit, src, sized, strict=True):
            dims[k] = d
            places[p] = k
            given = shape[k]
            if isinstance(given, SizeInt):
                self.unify(given.sym, d, node, "the reshape does not match")
        return self.view(x, places, dims, node)

    def check_shape(self, shape, node) -> None:
        if not shape or not all(
            isinstance(s, int) and not isinstance(s, bool) and (s > 0 or s == -1) for s in shape
        ):
            self.fail(f"a shape is whole numbers (or -1), not {shape!r}", node)

    def expand(self, x: Val, shape, node) -> Val:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        self.check_shape(shape, node)
        if len(shape) < x.rank:
            self.fail("expand() to fewer dimensions", node)
        lead = len(shape) - x.rank
        dims: list[Dim] = []
        for k, s in enumerate(shape):
            own = x.dims[k - lead] if k >= lead else None
            if s == -1 or (own is not None):
                if own is not None and s not in (-1,) and int(s) != own.value:
                    self.fail(f"expand(): dimension {k} is {own.value}, not {s}", node)
                dims.append(own)
            elif isinstance(s, SizeInt):
                dims.append(s.sym if s.value != 1 else None)
            elif int(s) == 1:
                dims.append(None)
            else:
                self.fail(
                    f"expand() to a size `{s}` that no input has: the notation's sizes come from "
                    "the inputs' shapes",
                    node,
                )
        return self.view(x, [p + lead for p in range(x.rank)], dims, node)

    # -- operators --

    def binop(self, op: ast.operator, a, b, node):
        if not isinstance(a, Val) and not isinstance(b, Val):
            if (isinstance(a, SizeInt) or isinstance(b, SizeInt)) and type(op) in _ARITH:
                return self.binop(op, self.val(a, node), self.val(b, node), node)
            if isinstance(a, int | float) and isinstance(b, int | float):
                f = _PY_OPS.get(type(op))
                if f is not None:
                    try:
                        return f(a, b)
                    except ArithmeticError as e:
                        self.fail(f"`{self.t.src(node)}`: {e}", node)
            if isinstance(a, tuple) and isinstance(b, tuple) and isinstance(op, ast.Add):
                return a + b
            self.fail(f"`{self.t.src(node)}` is not covered", node)
        if isinstance(op, ast.MatMult):
            return self.matmul(self.val(a, node), self.val(b, node), node)
        if type(op) in _ARITH:
            sym = _ARITH[type(op)]
            if sym == "**":
                return self.power(a, b, node)
            return self.ew(lambda x: _bin(sym, x[0], x[1]), a, b, node=node)
        if isinstance(op, ast.BitAnd | ast.BitOr) and all(
            isinstance(x, Val) and x.dtype == "bool" for x in (a, b)
        ):  # conditions as 1 and 0: both is a product, either a sum
            both = "*" if isinstance(op, ast.BitAnd) else "+"
            return self.ew(
                lambda x: ECmp(">", _bin(both, x[0], x[1]), _num(0)), a, b, dtype="bool", node=node
            )
        if isinstance(op, ast.FloorDiv | ast.Mod):
            self.t.not_covered(self.t.src(node), _ROUNDING, node)
        self.fail(f"`{self.t.src(node)}` is not covered: the operator has no counterpart", node)

    def power(self, a, b, node):
        return self.ew(lambda x: _bin("**", x[0], x[1]), a, b, node=node)

    def compare(self, op: ast.cmpop, a, b, node):
        if not isinstance(a, Val) and not isinstance(b, Val):
            return {
                ast.Eq: lambda: a == b,
                ast.NotEq: lambda: a != b,
                ast.Lt: lambda: a < b,
                ast.LtE: lambda: a <= b,
                ast.Gt: lambda: a > b,
                ast.GtE: lambda: a >= b,
                ast.Is: lambda: a is b,
                ast.IsNot: lambda: a is not b,
            }[type(op)]()
        sym = _CMP.get(type(op))
        if sym is None:
            self.fail(f"`{self.t.src(node)}` is not covered", node)
        return self.ew(lambda x: ECmp(sym, x[0], x[1]), a, b, dtype="bool", node=node)

    # -- calls --

    def call(self, node: ast.Call, env):
        func = node.func
        # what is not covered, before its arguments are read
        path = self.t.dotted(func)
        if path in _UNSUPPORTED:
            self.t.not_covered(self.t.src(func), _UNSUPPORTED[path], node)
        on_self = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        on_self = on_self and func.value.id == "self"
        if isinstance(func, ast.Attribute) and path is None and not on_self:
            probe = f"torch.{func.attr}"
            if probe in _UNSUPPORTED:
                self.t.not_covered(f".{func.attr}()", _UNSUPPORTED[probe], node)
        f = self.ev(func, env)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                v = self.ev(a.value, env)
                if not isinstance(v, tuple):
                    self.fail(f"`{self.t.src(a)}` is not a tuple", a)
                args.extend(v)
            else:
                args.append(self.ev(a, env))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                self.fail("`**kwargs` in a call is not covered", node)
            kwargs[k.arg] = self.ev(k.value, env)
        self.t.node = node
        if isinstance(f, ModPath):
            return self.function(f.path, args, kwargs, node)
        if isinstance(f, Method):
            return self.method(f, args, kwargs, node)
        if isinstance(f, ModuleSpec):
            return self.module(f, args, kwargs, node)
        self.fail(f"`{self.t.src(func)}` is not a function --from-torch knows", node)

    def function(self, path: str, args, kwargs, node):
        numbers = all(isinstance(a, int | float) for a in [*args, *kwargs.values()])
        if path.startswith("math.") and path[5:] in _MATH_FUNCS and numbers and not kwargs:
            return getattr(math, path[5:])(*args)
        if path == "builtins.float" and len(args) == 1 and isinstance(args[0], str):
            try:
                return float(args[0])
            except ValueError:
                self.fail(f"float({args[0]!r}) is not a number", node)
        if path.startswith("builtins.") and numbers and not kwargs:
            f = {"abs": abs, "float": float, "int": int, "min": min, "max": max, "round": round,
                 "pow": pow}.get(path[9:])  # fmt: skip
            if f is not None:
                return f(*args)
        parts = path.split(".")
        if len(parts) == 3 and parts[1] == "nn" and parts[2][:1].isupper():
            return ModuleSpec(parts[2], list(args), dict(kwargs), node)
        handler = _FUNCTIONS.get(path)
        if handler is None:
            short = path.replace("torch.nn.functional.", "F.")
            self.fail(
                f"`{short}` is not covered: --from-torch knows the operations in "
                f"docs/generate.md (From a PyTorch module); write the formula yourself, "
                f'`optiml generate "..."`',
                node,
            )
        return self.apply(handler, path, args, kwargs, node)

    def apply(self, handler, label: str, args, kwargs, node):
        short = label.replace("torch.nn.functional.", "F.")
        try:
            bound = inspect.signature(handler).bind(self, *args, **kwargs)
        except TypeError as e:
            self.fail(f"`{short}`: {e}", node)
        try:
            return handler(*bound.args, **bound.kwargs)
        except (TypeError, ValueError, IndexError, ArithmeticError) as e:
            # an argument of a kind the operation does not take (a tensor for a dimension, ...)
            self.fail(f"`{short}`: arguments --from-torch cannot read ({e})", node)

    def method(self, m: Method, args, kwargs, node):
        r, name = m.receiver, m.name
        if not isinstance(r, Val):
            if isinstance(r, tuple) and name in ("index", "count"):
                return getattr(r, name)(*args)
            self.fail(f"`.{name}()` of a number is not covered", node)
        if name.endswith("_") and not name.endswith("__"):
            name = name[:-1]  # in place: the same value
        handler = _METHODS.get(name)
        if handler is not None:
            return self.apply(handler, f"Tensor.{name}", [r, *args], kwargs, node)
        path = f"torch.{name}"
        if path in _UNSUPPORTED:
            self.t.not_covered(f".{name}()", _UNSUPPORTED[path], node)
        handler = _FUNCTIONS.get(path)
        if handler is None:
            self.fail(
                f"`.{name}()` is not covered: --from-torch knows the operations in "
                "docs/generate.md (From a PyTorch module)",
                node,
            )
        return self.apply(handler, path, [r, *args], kwargs, node)

    def module(self, spec: ModuleSpec, args, kwargs, node):
        label = f"nn.{spec.cls}"
        where = f"`self.{spec.attr}`, {label}" if spec.attr else label
        kind = _UNSUPPORTED.get(f"torch.nn.{spec.cls}")
        if kind is not None:
            self.fail(f"{where} ({kind[0]}) is not covered: {kind[1]}", node)
        ctor = _MODULES.get(spec.cls)
        if ctor is None:
            self.fail(
                f"{where} is not covered: --from-torch knows the modules in docs/generate.md "
                "(From a PyTorch module)",
                node,
            )
        for v in [*spec.args, *spec.kwargs.values()]:
            if isinstance(v, Unknown):
                self.fail(f"{where}: {v.why}", v.node or spec.node)
        try:
            params = inspect.signature(ctor).bind(self, *spec.args, **spec.kwargs)
        except TypeError as e:
            self.fail(f"{where}: {e}", spec.node)
        params.apply_defaults()
        apply = ctor(*params.args, **params.kwargs)
        return self.apply(apply, label, args, kwargs, node)

    # -- reductions --

    def reduce(self, op: str, x, dim, keepdim: bool, node) -> Val:
        x = self.num(self.val(x, node))
        axes = self.axes(dim, x.rank, node)
        if op in ("argmax", "argmin") and len([a for a in axes if x.dims[a] is not None]) > 1:
            self.fail(
                f"`{op}` over several dimensions (of the flattened tensor) is not covered: the "
                f"notation's `{op}` binds one index; give `dim`",
                node,
            )
        return Reduce(op, x, axes, bool(keepdim), node)

    def count(self, x: Val, axes: tuple[int, ...]) -> Val:
        """The number of elements of x's dimensions `axes`, as a value (a product of sizes)."""
        out: Val | None = None
        for a in axes:
            if x.dims[a] is not None:
                size = Const(ERef(x.dims[a]))
                out = size if out is None else self.ew(lambda v: _bin("*", v[0], v[1]), out, size)
        return out if out is not None else Const(_num(1))

    def softmax(self, x, dim, log: bool, node, negate: bool = False) -> Val:
        x = self.val(x, node)
        if dim is None:
            self.fail("softmax without `dim` is not covered (its implicit dim is deprecated)", node)
        if negate:
            x = self.ew(lambda a: _neg(a[0]), x)
        m = Reduce("max", x, self.axes(dim, x.rank, node), True, node)
        m.hint = "mx"
        shifted = self.ew(lambda a: _bin("-", a[0], a[1]), x, m)
        e = self.ew(lambda a: _call("exp", a[0]), shifted)
        s = Reduce("sum", e, self.axes(dim, x.rank, node), True, node)
        if log:
            return self.ew(lambda a: _bin("-", a[0], _call("log", a[1])), shifted, s)
        return self.ew(lambda a: _bin("/", a[0], a[1]), e, s)

    def normalize(self, x: Val, axes: tuple[int, ...], eps, node, unbiased=False) -> Val:
        """(x - mean) / sqrt(var + eps) over `axes`, with the biased variance."""
        mu = Reduce("mean", x, axes, True, node)
        mu.hint, mu.force = "mu", True
        centered = self.ew(lambda a: _bin("-", a[0], a[1]), x, mu)
        sq = self.ew(lambda a: _bin("**", a[0], _num(2)), centered)
        var = Reduce("mean", sq, axes, True, node)
        var.hint, var.force = "var", True
        eps = _named_default(eps, "eps")
        return self.ew(
            lambda a: _bin("*", a[0], _call("rsqrt", _bin("+", a[1], a[2]))), centered, var, eps
        )

    def loss(self, pointwise: Val, reduction: str, node, batchmean_ok: bool = False) -> Val:
        if reduction == "none":
            return pointwise
        if reduction == "mean":
            return self.reduce("mean", pointwise, None, False, node)
        if reduction == "sum":
            return self.reduce("sum", pointwise, None, False, node)
        if reduction == "batchmean" and batchmean_ok:
            total = self.reduce("sum", pointwise, None, False, node)
            if pointwise.rank == 0 or pointwise.dims[0] is None:
                return total
            return self.ew(lambda a: _bin("/", a[0], a[1]), total, Const(ERef(pointwise.dims[0])))
        self.fail(f"reduction={reduction!r} is not covered (none, mean, sum)", node)

    # -- products --

    def matmul(self, a: Val, b: Val, node) -> Val:
        if a.rank == 0 or b.rank == 0:
            self.fail("matmul of a 0-d tensor", node)
        av, bv = a.rank == 1, b.rank == 1
        A = self.unsqueeze(a, 0, node) if av else a
        B = self.unsqueeze(b, -1, node) if bv else b
        ka, kb = A.dims[-1], B.dims[-2]
        if (ka is None) != (kb is None):
            self.fail(
                "matmul: the inner dimensions differ "
                f"({ka.value if ka else 1} and {kb.value if kb else 1})",
                node,
            )
        if ka is not None:
            self.unify(ka, kb, node, "matmul: the inner dimensions differ")
        batch_a, batch_b = A.dims[:-2], B.dims[:-2]
        nb = max(len(batch_a), len(batch_b))
        batch: list[Dim] = []
        for p in range(nb):
            d: Dim = None
            for bd in (batch_a, batch_b):
                q = p - (nb - len(bd))
                if q >= 0 and bd[q] is not None:
                    if d is None:
                        d = bd[q]
                    else:
                        self.unify(d, bd[q], node, "matmul: the batch dimensions do not broadcast")
            batch.append(d)
        body_dims = [*batch, A.dims[-2], B.dims[-1], ka]
        pa = [p + nb - len(batch_a) for p in range(len(batch_a))] + [nb, nb + 2]
        pb = [p + nb - len(batch_b) for p in range(len(batch_b))] + [nb + 2, nb + 1]
        body = Map(lambda x, idx: _bin("*", x[0], x[1]), [A, B], [pa, pb], body_dims, node, "float")
        out: Val = Reduce("sum", body, (nb + 2,), False, node)
        if bv:
            out = self.squeeze(out, out.rank - 1, node)
        if av:
            out = self.squeeze(out, out.rank - (1 if bv else 2), node)
        return out

    def einsum(self, equation: str, operands: list[Val], node) -> Val:
        eq = equation.replace(" ", "")
        if "." in eq:
            self.fail("einsum with `...` is not covered; name every dimension", node)
        lhs, _, rhs = eq.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(operands):
            self.fail(f"einsum: {len(terms)} terms for {len(operands)} operands", node)
        if "->" not in eq:
            counts: dict[str, int] = {}
            for t in terms:
                for c in t:
                    counts[c] = counts.get(c, 0) + 1
            rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
        letters = list(dict.fromkeys(rhs + "".join(terms)))
        dims: dict[str, Dim] = {}
        for t, v in zip(terms, operands, strict=True):
            if len(t) != v.rank:
                self.fail(f"einsum: `{t}` has {len(t)} letters for a tensor of {v.rank}", node)
            for c, d in zip(t, v.dims, strict=True):
                if d is None:
                    continue
                if dims.get(c) is None:
                    dims[c] = d
                else:
                    self.unify(dims[c], d, node, f"einsum: dimension `{c}` differs")
        body_dims = [dims.get(c) for c in letters]
        places = [[letters.index(c) for c in t] for t in terms]

        def product(x, idx):
            out = x[0]
            for y in x[1:]:
                out = _bin("*", out, y)
            return out

        body = Map(product, [self.num(v) for v in operands], places, body_dims, node)
        summed = tuple(k for k, c in enumerate(letters) if c not in rhs)
        out: Val = Reduce("sum", body, summed, False, node) if summed else body
        return out


_ARITH = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Pow: "**",
}
_CMP = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}
_BUILTINS = {"abs", "float", "int", "min", "max", "len", "round", "pow", "range"}


def _named_default(v, label: str):
    if isinstance(v, NamedInt | NamedFloat | Val):
        return v
    if isinstance(v, bool) or not isinstance(v, int | float):
        return v
    return NamedFloat(float(v), label)


# ---- the operations ------------------------------------------------------------------------------
# Each takes the forward evaluator first, then torch's own parameters (bound by
# inspect.signature, so that torch's keywords work), and returns a value.

_FUNCTIONS: dict[str, Callable] = {}
_METHODS: dict[str, Callable] = {}
_MODULES: dict[str, Callable] = {}


def _fn(*names: str, method: str | tuple[str, ...] | None = None):
    def register(f):
        for n in names:
            _FUNCTIONS[n] = f
        for m in (method,) if isinstance(method, str) else (method or ()):
            _METHODS[m] = f
        return f

    return register


def _unary(names, method, build):
    def handler(fw: _Forward, input):
        return fw.ew(lambda a: build(a[0]), input)

    _fn(*names, method=method)(handler)


_GELU_TANH_C = math.sqrt(2.0 / math.pi)
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _gelu(a, approximate: str):
    if approximate == "tanh":
        inner = _bin(
            "*", _num(_GELU_TANH_C), _bin("+", a, _bin("*", _num(0.044715), _bin("**", a, _num(3))))
        )
        return _bin("*", _bin("*", _num(0.5), a), _bin("+", _num(1), _call("tanh", inner)))
    return _bin(
        "*",
        _bin("*", _num(0.5), a),
        _bin("+", _num(1), _call("erf", _bin("*", a, _num(1 / math.sqrt(2))))),
    )


def _softplus(a, beta, threshold, unit_beta: bool):
    """torch's softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""
    bx = a if unit_beta else _bin("*", beta, a)
    soft = _call("log", _bin("+", _num(1), _call("exp", bx)))
    if not unit_beta:
        soft = _bin("/", soft, beta)
    return _where(ECmp(">", bx, threshold), a, soft)


for _names, _method, _build in [
    (("torch.relu", "torch.nn.functional.relu"), "relu", lambda a: _call("max", a, _num(0))),
    (("torch.nn.functional.relu6",), None, lambda a: _call("min", _call("max", a, _num(0)), _num(6))),
    (("torch.sigmoid", "torch.nn.functional.sigmoid", "torch.expit"), "sigmoid", lambda a: _call("sigmoid", a)),
    (("torch.tanh", "torch.nn.functional.tanh"), "tanh", lambda a: _call("tanh", a)),
    (("torch.exp",), "exp", lambda a: _call("exp", a)),
    (("torch.exp2",), "exp2", lambda a: _bin("**", _num(2), a)),
    (("torch.expm1",), "expm1", lambda a: _bin("-", _call("exp", a), _num(1))),
    (("torch.log",), "log", lambda a: _call("log", a)),
    (("torch.log2",), "log2", lambda a: _bin("/", _call("log", a), _num(math.log(2)))),
    (("torch.log10",), "log10", lambda a: _bin("/", _call("log", a), _num(math.log(10)))),
    (("torch.log1p",), "log1p", lambda a: _call("log", _bin("+", _num(1), a))),
    (("torch.sqrt",), "sqrt", lambda a: _call("sqrt", a)),
    (("torch.rsqrt",), "rsqrt", lambda a: _call("rsqrt", a)),
    (("torch.abs", "torch.absolute", "builtins.abs"), ("abs", "absolute", "__abs__"), lambda a: _call("abs", a)),
    (("torch.neg", "torch.negative"), ("neg", "negative"), _neg),
    (("torch.reciprocal",), "reciprocal", lambda a: _bin("/", _num(1), a)),
    (("torch.square",), "square", lambda a: _bin("**", a, _num(2))),
    (("torch.sin",), "sin", lambda a: _call("sin", a)),
    (("torch.cos",), "cos", lambda a: _call("cos", a)),
    (("torch.tan",), "tan", lambda a: _bin("/", _call("sin", a), _call("cos", a))),
    (("torch.erf",), "erf", lambda a: _call("erf", a)),
    (("torch.erfc",), "erfc", lambda a: _bin("-", _num(1), _call("erf", a))),
    (("torch.sign", "torch.sgn"), ("sign", "sgn"), lambda a: _where(ECmp(">", a, _num(0)), _num(1), _where(ECmp("<", a, _num(0)), _num(-1), _num(0)))),
    (("torch.nn.functional.softsign",), None, lambda a: _bin("/", a, _bin("+", _num(1), _call("abs", a)))),
    (("torch.nn.functional.selu", "torch.selu"), None, lambda a: _bin("*", _num(_SELU_SCALE), _where(ECmp(">", a, _num(0)), a, _bin("*", _num(_SELU_ALPHA), _bin("-", _call("exp", a), _num(1)))))),
    (("torch.nn.functional.silu",), None, lambda a: _bin("*", a, _call("sigmoid", a))),
    (("torch.nn.functional.mish",), None, lambda a: _bin("*", a, _call("tanh", _call("log", _bin("+", _num(1), _call("exp", a)))))),
    (("torch.nn.functional.hardsigmoid",), None, lambda a: _call("min", _call("max", _bin("+", _bin("/", a, _num(6)), _num(0.5)), _num(0)), _num(1))),
    (("torch.nn.functional.hardswish",), None, lambda a: _bin("/", _bin("*", a, _call("min", _call("max", _bin("+", a, _num(3)), _num(0)), _num(6))), _num(6))),
    (("torch.nn.functional.logsigmoid",), None, lambda a: _neg(_call("log", _bin("+", _num(1), _call("exp", _neg(a)))))),
    (("torch.nn.functional.tanhshrink",), None, lambda a: _bin("-", a, _call("tanh", a))),
]:  # fmt: skip
    _unary(_names, _method, _build)


@_fn("torch.nn.functional.gelu")
def _f_gelu(fw, input, approximate="none"):
    if approximate not in ("none", "tanh"):
        fw.fail(f"gelu(approximate={approximate!r}): torch has `none` and `tanh`")
    return fw.ew(lambda a: _gelu(a[0], approximate), input)


@_fn("torch.nn.functional.leaky_relu")
def _f_leaky_relu(fw, input, negative_slope=0.01, inplace=False):
    return fw.ew(
        lambda a: _where(ECmp(">=", a[0], _num(0)), a[0], _bin("*", a[1], a[0])),
        input,
        negative_slope,
    )


@_fn("torch.nn.functional.elu")
def _f_elu(fw, input, alpha=1.0, inplace=False):
    return fw.ew(
        lambda a: _where(
            ECmp(">", a[0], _num(0)), a[0], _bin("*", a[1], _bin("-", _call("exp", a[0]), _num(1)))
        ),
        input,
        alpha,
    )


@_fn("torch.nn.functional.celu", "torch.celu")
def _f_celu(fw, input, alpha=1.0, inplace=False):
    return fw.ew(
        lambda a: _where(
            ECmp(">", a[0], _num(0)),
            a[0],
            _bin("*", a[1], _bin("-", _call("exp", _bin("/", a[0], a[1])), _num(1))),
        ),
        input,
        alpha,
    )


@_fn("torch.nn.functional.softplus")
def _f_softplus(fw, input, beta=1.0, threshold=20.0):
    unit = isinstance(beta, int | float) and not isinstance(beta, NamedInt | NamedFloat)
    unit = unit and float(beta) == 1
    return fw.ew(lambda a: _softplus(a[0], a[1], a[2], unit), input, beta, threshold)


@_fn("torch.nn.functional.hardtanh", "torch.nn.functional.hardtanh_")
def _f_hardtanh(fw, input, min_val=-1.0, max_val=1.0, inplace=False):
    return fw.ew(lambda a: _call("min", _call("max", a[0], a[1]), a[2]), input, min_val, max_val)


@_fn("torch.nn.functional.softshrink")
def _f_softshrink(fw, input, lambd=0.5):
    return fw.ew(
        lambda a: _where(
            ECmp(">", a[0], a[1]),
            _bin("-", a[0], a[1]),
            _where(ECmp("<", a[0], _neg(a[1])), _bin("+", a[0], a[1]), _num(0)),
        ),
        input,
        lambd,
    )


@_fn("torch.nn.functional.hardshrink")
def _f_hardshrink(fw, input, lambd=0.5):
    return fw.ew(lambda a: _where(ECmp(">", _call("abs", a[0]), a[1]), a[0], _num(0)), input, lambd)


@_fn("torch.nn.functional.threshold")
def _f_threshold(fw, input, threshold, value, inplace=False):
    return fw.ew(lambda a: _where(ECmp(">", a[0], a[1]), a[0], a[2]), input, threshold, value)


@_fn("torch.clamp", "torch.clip", method=("clamp", "clip"))
def _f_clamp(fw, input, min=None, max=None):
    if min is None and max is None:
        fw.fail("clamp() without min or max")
    out = input
    if min is not None:
        out = fw.ew(lambda a: _call("max", a[0], a[1]), out, min)
    if max is not None:
        out = fw.ew(lambda a: _call("min", a[0], a[1]), out, max)
    return out


@_fn("torch.clamp_min", method="clamp_min")
def _f_clamp_min(fw, input, min):
    return fw.ew(lambda a: _call("max", a[0], a[1]), input, min)


@_fn("torch.clamp_max", method="clamp_max")
def _f_clamp_max(fw, input, max):
    return fw.ew(lambda a: _call("min", a[0], a[1]), input, max)


@_fn("torch.pow", "torch.float_power", "builtins.pow", method=("pow", "float_power"))
def _f_pow(fw, input, exponent):
    return fw.power(input, exponent, fw.node)


@_fn("torch.maximum", "torch.fmax", method=("maximum", "fmax"))
def _f_maximum(fw, input, other):
    return fw.ew(lambda a: _call("max", a[0], a[1]), input, other)


@_fn("torch.minimum", "torch.fmin", method=("minimum", "fmin"))
def _f_minimum(fw, input, other):
    return fw.ew(lambda a: _call("min", a[0], a[1]), input, other)


def _arith(sym: str):
    def handler(fw, input, other, alpha=1):
        if alpha != 1:
            other = fw.ew(lambda a: _bin("*", a[0], a[1]), other, alpha)
        return fw.ew(lambda a: _bin(sym, a[0], a[1]), input, other)

    return handler


_fn("torch.add", method="add")(_arith("+"))
_fn("torch.sub", "torch.subtract", method=("sub", "subtract"))(_arith("-"))


@_fn("torch.mul", "torch.multiply", method=("mul", "multiply"))
def _f_mul(fw, input, other):
    return fw.ew(lambda a: _bin("*", a[0], a[1]), input, other)


@_fn("torch.div", "torch.divide", "torch.true_divide", method=("div", "divide", "true_divide"))
def _f_div(fw, input, other, rounding_mode=None):
    if rounding_mode is not None:
        fw.t.not_covered(f"div(rounding_mode={rounding_mode!r})", _ROUNDING, fw.node)
    return fw.ew(lambda a: _bin("/", a[0], a[1]), input, other)


@_fn("torch.where")
def _f_where(fw, condition, input=None, other=None):
    if input is None or other is None:
        fw.t.not_covered("torch.where(cond)", _GATHER, fw.node)
    c = fw.val(condition)
    if c.dtype != "bool":
        c = fw.ew(lambda a: ECmp("!=", a[0], _num(0)), c, dtype="bool")
    a, b = fw.num(fw.val(input)), fw.num(fw.val(other))
    return fw.ew(lambda x: _where(x[0], x[1], x[2]), c, a, b, raw=True)


@_fn("torch.lerp", method="lerp")
def _f_lerp(fw, input, end, weight):
    return fw.ew(
        lambda a: _bin("+", a[0], _bin("*", a[2], _bin("-", a[1], a[0]))), input, end, weight
    )


def _identity(fw, input, *args, **kwargs):
    return fw.num(fw.val(input))


for _m in ("float", "double", "contiguous", "clone", "detach", "to", "cuda", "cpu", "type_as",
           "half", "bfloat16", "requires_grad"):  # fmt: skip
    _METHODS[_m] = _identity
_FUNCTIONS["torch.clone"] = _identity


def _m_bool(fw, input):
    x = fw.val(input)
    if x.dtype == "bool":
        return x
    return fw.ew(lambda a: ECmp("!=", a[0], _num(0)), x, dtype="bool")


def _m_int(fw, input, memory_format=None):
    x = fw.val(input)
    if x.dtype not in ("int", "bool"):  # a float truncated toward zero
        fw.t.not_covered(fw.t.src(fw.node), _ROUNDING, fw.node)
    return fw.num(x)


_METHODS.update(bool=_m_bool, int=_m_int, long=_m_int)


def _m_size(fw, input, dim=None):
    shape = tuple(SizeInt(d) if d is not None else 1 for d in input.dims)
    return shape if dim is None else shape[fw.axis(dim, input.rank, fw.node)]


def _m_dim(fw, input):
    return input.rank


def _m_numel(fw, input):
    return fw.count(input, tuple(range(input.rank)))


_METHODS.update(size=_m_size, dim=_m_dim, ndimension=_m_dim, numel=_m_numel)


@_fn("torch.zeros_like")
def _f_zeros_like(fw, input, dtype=None):
    return fw.ew(lambda a: _num(0), input)


@_fn("torch.ones_like")
def _f_ones_like(fw, input, dtype=None):
    return fw.ew(lambda a: _num(1), input)


@_fn("torch.full_like")
def _f_full_like(fw, input, fill_value, dtype=None):
    return fw.ew(lambda a: a[1], input, fill_value)


# -- structure --


@_fn(
    "torch.matmul",
    "torch.mm",
    "torch.bmm",
    "torch.mv",
    method=("matmul", "mm", "bmm", "mv", "__matmul__"),
)
def _f_matmul(fw, input, mat2=None, other=None, vec=None):
    b = next((x for x in (mat2, other, vec) if x is not None), None)
    if b is None:
        fw.fail("matmul() needs two tensors")
    return fw.matmul(fw.val(input), fw.val(b), fw.node)


@_fn("torch.dot", "torch.inner", "torch.vdot", method=("dot", "inner"))
def _f_dot(fw, input, other=None, tensor=None):
    b = other if other is not None else tensor
    return fw.matmul(fw.val(input), fw.val(b), fw.node)


@_fn("torch.outer", "torch.ger", method=("outer", "ger"))
def _f_outer(fw, input, vec2):
    a = fw.unsqueeze(fw.val(input), 1, fw.node)
    return fw.ew(lambda x: _bin("*", x[0], x[1]), a, vec2)


@_fn("torch.einsum")
def _f_einsum(fw, equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], tuple | list):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        fw.fail("einsum's first argument is its equation, a string")
    return fw.einsum(equation, [fw.val(o) for o in operands], fw.node)


@_fn("torch.nn.functional.linear")
def _f_linear(fw, input, weight, bias=None):
    w = fw.val(weight)
    out = fw.matmul(fw.val(input), fw.transpose(w, -2, -1, fw.node) if w.rank == 2 else w, fw.node)
    if bias is not None:
        out = fw.ew(lambda a: _bin("+", a[0], a[1]), out, bias)
    return out


@_fn(
    "torch.transpose",
    "torch.swapaxes",
    "torch.swapdims",
    method=("transpose", "swapaxes", "swapdims"),
)
def _f_transpose(fw, input, dim0, dim1):
    return fw.transpose(fw.val(input), dim0, dim1, fw.node)


@_fn("torch.t", method="t")
def _f_t(fw, input):
    x = fw.val(input)
    if x.rank > 2:
        fw.fail(".t() of a tensor of more than 2 dimensions")
    return fw.transpose(x, 0, 1, fw.node)


@_fn("torch.permute", method="permute")
def _f_permute(fw, input, *dims):
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        dims = tuple(dims[0])
    return fw.permute(fw.val(input), list(dims), fw.node)


@_fn("torch.unsqueeze", method="unsqueeze")
def _f_unsqueeze(fw, input, dim):
    return fw.unsqueeze(fw.val(input), dim, fw.node)


@_fn("torch.squeeze", method="squeeze")
def _f_squeeze(fw, input, dim=None):
    return fw.squeeze(fw.val(input), dim, fw.node)


@_fn("torch.reshape", method=("reshape", "view"))
def _f_reshape(fw, input, *shape):
    return fw.reshape(fw.val(input), shape, fw.node)


@_fn("torch.broadcast_to", method=("expand", "broadcast_to"))
def _f_expand(fw, input, *size):
    return fw.expand(fw.val(input), size, fw.node)


@_fn("torch.expand_as", method="expand_as")
def _f_expand_as(fw, input, other):
    o = fw.val(other)
    return fw.ew(lambda a: a[0], input, fw.ew(lambda a: _num(0), o))


@_fn("torch.flatten", method="flatten")
def _f_flatten(fw, input, start_dim=0, end_dim=-1):
    x = fw.val(input)
    if x.rank == 0:
        return fw.unsqueeze(x, 0, fw.node)
    s, e = fw.axis(start_dim, x.rank, fw.node), fw.axis(end_dim, x.rank, fw.node)
    merged = x.dims[s : e + 1]
    if len([d for d in merged if d is not None]) > 1:
        fw.t.not_covered(fw.t.src(fw.node), _RESHAPE, fw.node)
    d = next((d for d in merged if d is not None), None)
    shape = [*(SizeInt(y) if y else 1 for y in x.dims[:s]), SizeInt(d) if d else 1]
    shape += [SizeInt(y) if y else 1 for y in x.dims[e + 1 :]]
    return fw.reshape(x, tuple(shape), fw.node)


@_fn("torch.triu", method="triu")
def _f_triu(fw, input, diagonal=0):
    return _triangle(fw, input, diagonal, ">=")


@_fn("torch.tril", method="tril")
def _f_tril(fw, input, diagonal=0):
    return _triangle(fw, input, diagonal, "<=")


def _triangle(fw, input, diagonal, cmp: str):
    x = fw.val(input)
    if x.rank < 2:
        fw.fail("triu/tril of a tensor of fewer than 2 dimensions")
    k = int(diagonal)

    def fn(a, idx):
        i = ERef(idx[-2]) if idx[-2] else _num(0)
        j = ERef(idx[-1]) if idx[-1] else _num(0)
        left = j if k == 0 else _bin("-", j, i)
        right = i if k == 0 else _num(k)
        return _where(ECmp(cmp, left, right), a[0], _num(0))

    return Map(fn, [x], [list(range(x.rank))], list(x.dims), fw.node, x.dtype)


@_fn("torch.diag", method="diag")
def _f_diag(fw, input, diagonal=0):
    x = fw.val(input)
    if diagonal != 0:
        fw.t.not_covered(f"diag(diagonal={diagonal})", _SLICE, fw.node)
    if x.rank == 1:
        d = x.dims[0]

        def fn(a, idx):
            if idx[0] is None:
                return a[0]
            return _where(ECmp("==", ERef(idx[0]), ERef(idx[1])), a[0], _num(0))

        return Map(fn, [x], [[0]], [d, d], fw.node, x.dtype)
    if x.rank == 2:
        return _diagonal(fw, x, 0, 0, 1)
    fw.fail("diag() of a tensor of more than 2 dimensions")


@_fn("torch.diagonal", method="diagonal")
def _f_diagonal(fw, input, offset=0, dim1=0, dim2=1):
    return _diagonal(fw, fw.val(input), offset, dim1, dim2)


def _diagonal(fw, x: Val, offset, dim1, dim2):
    if offset != 0:
        fw.t.not_covered(f"a diagonal at offset {offset}", _SLICE, fw.node)
    a, b = fw.axis(dim1, x.rank, fw.node), fw.axis(dim2, x.rank, fw.node)
    da, db = x.dims[a], x.dims[b]
    if (da is None) != (db is None):
        fw.t.not_covered("a diagonal of a non-square matrix", _SLICE, fw.node)
    if da is not None:
        fw.unify(da, db, fw.node, "a diagonal of a non-square matrix")
    rest = [p for p in range(x.rank) if p not in (a, b)]
    places = [0] * x.rank
    for k, p in enumerate(rest):
        places[p] = k
    places[a] = places[b] = len(rest)
    return fw.view(x, places, [x.dims[p] for p in rest] + [da], fw.node)


# -- reductions --


def _reduction(op: str):
    def handler(fw, input, dim=None, keepdim=False, dtype=None, axis=None):
        return fw.reduce(op, input, dim if dim is not None else axis, keepdim, fw.node)

    return handler


_fn("torch.sum", method="sum")(_reduction("sum"))
_fn("torch.mean", method="mean")(_reduction("mean"))
_fn("torch.amax", method="amax")(_reduction("max"))
_fn("torch.amin", method="amin")(_reduction("min"))


@_fn("torch.prod", method="prod")
def _f_prod(fw, input, dim=None, keepdim=False, dtype=None):
    return fw.reduce("prod", input, dim, keepdim, fw.node)


def _argreduction(op: str):
    def handler(fw, input, dim=None, keepdim=False):
        x = fw.val(input)
        if dim is None and keepdim:
            fw.fail(f"{op}(keepdim=True) without dim")
        return fw.reduce(op, x, dim, keepdim, fw.node)

    return handler


_fn("torch.argmax", method="argmax")(_argreduction("argmax"))
_fn("torch.argmin", method="argmin")(_argreduction("argmin"))


def _extreme(op: str):
    arg = "arg" + op

    def handler(fw, input, dim=None, keepdim=False, other=None):
        if isinstance(dim, Val) or other is not None:  # torch.max(a, b): elementwise
            b = other if other is not None else dim
            return fw.ew(lambda a: _call(op, a[0], a[1]), input, b)
        x = fw.val(input)
        if dim is None:
            return fw.reduce(op, x, None, False, fw.node)
        values = fw.reduce(op, x, dim, keepdim, fw.node)
        indices = fw.reduce(arg, x, dim, keepdim, fw.node)
        return Pair((values, indices))

    return handler


_fn("torch.max", method="max")(_extreme("max"))
_fn("torch.min", method="min")(_extreme("min"))


@_fn("torch.logsumexp", method="logsumexp")
def _f_logsumexp(fw, input, dim, keepdim=False):
    x = fw.val(input)
    axes = fw.axes(dim, x.rank, fw.node)
    m = Reduce("max", x, axes, True, fw.node)
    m.hint = "mx"
    e = fw.ew(lambda a: _call("exp", _bin("-", a[0], a[1])), x, m)
    s = Reduce("sum", e, axes, True, fw.node)
    out = fw.ew(lambda a: _bin("+", a[0], _call("log", a[1])), m, s)
    return out if keepdim else fw.squeeze(out, axes, fw.node)


def _moment(std: bool):
    def handler(fw, input, dim=None, unbiased=True, keepdim=False, correction=None):
        x = fw.val(input)
        axes = fw.axes(dim, x.rank, fw.node)
        corr = (1 if unbiased else 0) if correction is None else correction
        mu = Reduce("mean", x, axes, True, fw.node)
        mu.hint = "mu"
        sq = fw.ew(lambda a: _bin("**", _bin("-", a[0], a[1]), _num(2)), x, mu)
        total = Reduce("sum", sq, axes, keepdim, fw.node)
        n = fw.count(x, axes)
        if isinstance(corr, int | float) and float(corr) == 0:
            var = fw.ew(lambda a: _bin("/", a[0], a[1]), total, n)
        else:
            var = fw.ew(lambda a: _bin("/", a[0], _bin("-", a[1], a[2])), total, n, corr)
        return fw.ew(lambda a: _call("sqrt", a[0]), var) if std else var

    return handler


_fn("torch.var", method="var")(_moment(False))
_fn("torch.std", method="std")(_moment(True))


@_fn("torch.norm", "torch.linalg.norm", "torch.linalg.vector_norm", method="norm")
def _f_norm(fw, input, p="fro", dim=None, keepdim=False, dtype=None, ord=None):
    x = fw.val(input)
    p = ord if ord is not None else p
    if p in ("fro", 2, 2.0, None):
        s = fw.reduce("sum", fw.ew(lambda a: _bin("**", a[0], _num(2)), x), dim, keepdim, fw.node)
        return fw.ew(lambda a: _call("sqrt", a[0]), s)
    if p in (1, 1.0):
        return fw.reduce("sum", fw.ew(lambda a: _call("abs", a[0]), x), dim, keepdim, fw.node)
    if p in (math.inf, "inf"):
        return fw.reduce("max", fw.ew(lambda a: _call("abs", a[0]), x), dim, keepdim, fw.node)
    if isinstance(p, int | float):
        s = fw.reduce(
            "sum",
            fw.ew(lambda a: _bin("**", _call("abs", a[0]), _num(p)), x),
            dim,
            keepdim,
            fw.node,
        )
        return fw.ew(lambda a: _bin("**", a[0], _num(1 / p)), s)
    fw.fail(f"norm(p={p!r}) is not covered")


@_fn("torch.softmax", "torch.nn.functional.softmax", method="softmax")
def _f_softmax(fw, input, dim=None, dtype=None, _stacklevel=3):
    return fw.softmax(input, dim, False, fw.node)


@_fn("torch.log_softmax", "torch.nn.functional.log_softmax", method="log_softmax")
def _f_log_softmax(fw, input, dim=None, dtype=None, _stacklevel=3):
    return fw.softmax(input, dim, True, fw.node)


@_fn("torch.nn.functional.softmin")
def _f_softmin(fw, input, dim=None, dtype=None, _stacklevel=3):
    return fw.softmax(input, dim, False, fw.node, negate=True)


@_fn("torch.nn.functional.normalize")
def _f_normalize(fw, input, p=2.0, dim=1, eps=1e-12):
    x = fw.val(input)
    n = _f_norm(fw, x, p=p, dim=dim, keepdim=True)
    n.hint = "nrm"
    return fw.ew(lambda a: _bin("/", a[0], _call("max", a[1], a[2])), x, n, eps)


@_fn("torch.nn.functional.layer_norm")
def _f_layer_norm(fw, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(fw, fw.val(input), normalized_shape, weight, bias, eps)


def _last_axes(fw, x: Val, normalized_shape, what: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > x.rank:
        fw.fail(f"{what}: normalized_shape {shape} has more dimensions than the input")
    axes = tuple(range(x.rank - len(shape), x.rank))
    for a, s in zip(axes, shape, strict=True):
        have = x.dims[a].value if x.dims[a] is not None else 1
        if have != int(s):
            fw.fail(f"{what}: normalized_shape {shape} does not match the input's last dimensions")
        if isinstance(s, SizeInt) and x.dims[a] is not None:
            fw.unify(s.sym, x.dims[a], fw.node, what)
    return axes


def _layer_norm(fw, x: Val, normalized_shape, weight, bias, eps):
    out = fw.normalize(x, _last_axes(fw, x, normalized_shape, "layer_norm"), eps, fw.node)
    if weight is not None:
        out = fw.ew(lambda a: _bin("*", a[0], a[1]), out, weight)
    if bias is not None:
        out = fw.ew(lambda a: _bin("+", a[0], a[1]), out, bias)
    return out


@_fn("torch.nn.functional.rms_norm")
def _f_rms_norm(fw, input, normalized_shape, weight=None, eps=None):
    return _rms_norm(fw, fw.val(input), normalized_shape, weight, eps)


_FLOAT32_EPS = 1.1920928955078125e-07


def _rms_norm(fw, x: Val, normalized_shape, weight, eps):
    axes = _last_axes(fw, x, normalized_shape, "rms_norm")
    if eps is None:
        eps = NamedFloat(_FLOAT32_EPS, "eps")
        fw.notes.append("rms_norm's eps is None: torch.finfo(float32).eps, 1.1920928955078125e-07")
    ms = Reduce("mean", fw.ew(lambda a: _bin("**", a[0], _num(2)), x), axes, True, fw.node)
    ms.hint = "ms"
    out = fw.ew(
        lambda a: _bin("*", a[0], _call("rsqrt", _bin("+", a[1], a[2]))),
        x,
        ms,
        _named_default(eps, "eps"),
    )
    if weight is not None:
        out = fw.ew(lambda a: _bin("*", a[0], a[1]), out, weight)
    return out


@_fn("torch.nn.functional.instance_norm")
def _f_instance_norm(
    fw, input, running_mean=None, running_var=None, weight=None, bias=None,
    use_input_stats=True, momentum=0.1, eps=1e-5,
):  # fmt: skip
    x = fw.val(input)
    if not use_input_stats:
        fw.fail("instance_norm(use_input_stats=False) reads running statistics; not covered")
    if x.rank < 3:
        fw.fail("instance_norm of a tensor of fewer than 3 dimensions")
    out = fw.normalize(x, tuple(range(2, x.rank)), eps, fw.node)
    return _affine(fw, out, weight, bias)


def _affine(fw, out: Val, weight, bias) -> Val:
    """y * weight[c] + bias[c] over the channel dimension (1)."""
    for v, op in ((weight, "*"), (bias, "+")):
        if v is None:
            continue
        w = fw.val(v)
        for _ in range(out.rank - 2):
            w = fw.unsqueeze(w, -1, fw.node)
        out = fw.ew(lambda a, op=op: _bin(op, a[0], a[1]), out, w)
    return out


# -- losses --


def _reduction_arg(fw, size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        fw.fail("size_average/reduce are deprecated; use reduction=")
    return reduction


def _diff(fw, input, target):
    return fw.ew(lambda a: _bin("-", a[0], a[1]), input, target)


@_fn("torch.nn.functional.mse_loss")
def _f_mse(fw, input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    r = _reduction_arg(fw, size_average, reduce, reduction)
    return fw.loss(
        fw.ew(lambda a: _bin("**", _bin("-", a[0], a[1]), _num(2)), input, target), r, fw.node
    )


@_fn("torch.nn.functional.l1_loss")
def _f_l1(fw, input, target, size_average=None, reduce=None, reduction="mean"):
    r = _reduction_arg(fw, size_average, reduce, reduction)
    return fw.loss(fw.ew(lambda a: _call("abs", _bin("-", a[0], a[1])), input, target), r, fw.node)


@_fn("torch.nn.functional.smooth_l1_loss")
def _f_smooth_l1(fw, input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    r = _reduction_arg(fw, size_average, reduce, reduction)

    def fn(a):
        d = _call("abs", _bin("-", a[0], a[1]))
        if isinstance(beta, int | float) and float(beta) == 0:
            return d
        quad = _bin("/", _bin("*", _num(0.5), _bin("**", d, _num(2))), a[2])
        return _where(ECmp("<", d, a[2]), quad, _bin("-", d, _bin("*", _num(0.5), a[2])))

    return fw.loss(fw.ew(fn, input, target, beta), r, fw.node)


@_fn("torch.nn.functional.huber_loss")
def _f_huber(fw, input, target, reduction="mean", delta=1.0, weight=None):
    def fn(a):
        d = _call("abs", _bin("-", a[0], a[1]))
        quad = _bin("*", _num(0.5), _bin("**", d, _num(2)))
        lin = _bin("*", a[2], _bin("-", d, _bin("*", _num(0.5), a[2])))
        return _where(ECmp("<", d, a[2]), quad, lin)

    return fw.loss(fw.ew(fn, input, target, delta), reduction, fw.node)


@_fn("torch.nn.functional.kl_div")
def _f_kl_div(
    fw, input, target, size_average=None, reduce=None, reduction="mean", log_target=False
):
    r = _reduction_arg(fw, size_average, reduce, reduction)
    if log_target:

        def fn(a):
            return _bin("*", _call("exp", a[1]), _bin("-", a[1], a[0]))
    else:

        def fn(a):  # xlogy(t, t) - t * input: 0 where t is 0
            tlogt = _where(ECmp("==", a[1], _num(0)), _num(0), _bin("*", a[1], _call("log", a[1])))
            return _bin("-", tlogt, _bin("*", a[1], a[0]))

    return fw.loss(fw.ew(fn, input, target), r, fw.node, batchmean_ok=True)


@_fn("torch.nn.functional.cosine_similarity", "torch.cosine_similarity")
def _f_cosine_similarity(fw, x1, x2, dim=1, eps=1e-8):
    """x1 · x2 / (max(‖x1‖, eps) · max(‖x2‖, eps)) along `dim` (each norm clamped, as torch's)."""
    a, b = fw.val(x1), fw.val(x2)
    dot = fw.reduce("sum", fw.ew(lambda v: _bin("*", v[0], v[1]), a, b), dim, False, fw.node)
    na, nb = _f_norm(fw, a, 2, dim, False), _f_norm(fw, b, 2, dim, False)
    eps = _named_default(eps, "eps")
    return fw.ew(
        lambda v: _bin("/", v[0], _bin("*", _call("max", v[1], v[3]), _call("max", v[2], v[3]))),
        dot,
        na,
        nb,
        eps,
    )


@_fn("torch.nn.functional.pairwise_distance", "torch.pairwise_distance")
def _f_pairwise_distance(fw, x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """‖x1 − x2 + eps‖_p along the last dimension."""
    eps = _named_default(eps, "eps")
    diff = fw.ew(lambda v: _bin("+", _bin("-", v[0], v[1]), v[2]), x1, x2, eps)
    return _f_norm(fw, diff, p, -1, keepdim)


@_fn("torch.nn.functional.triplet_margin_loss")
def _f_triplet_margin(
    fw,
    anchor,
    positive,
    negative,
    margin=1.0,
    p=2,
    eps=1e-6,
    swap=False,
    size_average=None,
    reduce=None,
    reduction="mean",
):
    r = _reduction_arg(fw, size_average, reduce, reduction)
    if swap:
        fw.fail("triplet_margin_loss with swap=True is not covered")
    near = _f_pairwise_distance(fw, anchor, positive, p, eps)
    far = _f_pairwise_distance(fw, anchor, negative, p, eps)
    margin = _named_default(margin, "margin")
    out = fw.ew(
        lambda v: _call("max", _bin("+", _bin("-", v[0], v[1]), v[2]), _num(0)), near, far, margin
    )
    return fw.loss(out, r, fw.node)


@_fn("torch.nn.functional.binary_cross_entropy")
def _f_bce(fw, input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    r = _reduction_arg(fw, size_average, reduce, reduction)

    def fn(a):  # torch clamps each log at -100
        lp = _call("max", _call("log", a[0]), _num(-100))
        l1p = _call("max", _call("log", _bin("-", _num(1), a[0])), _num(-100))
        return _neg(_bin("+", _bin("*", a[1], lp), _bin("*", _bin("-", _num(1), a[1]), l1p)))

    out = fw.ew(fn, input, target)
    if weight is not None:
        out = fw.ew(lambda a: _bin("*", a[0], a[1]), out, weight)
    return fw.loss(out, r, fw.node)


@_fn("torch.nn.functional.soft_margin_loss")
def _f_soft_margin(fw, input, target, size_average=None, reduce=None, reduction="mean"):
    r = _reduction_arg(fw, size_average, reduce, reduction)
    out = fw.ew(
        lambda a: _call("log", _bin("+", _num(1), _call("exp", _neg(_bin("*", a[1], a[0]))))),
        input,
        target,
    )
    return fw.loss(out, r, fw.node)


@_fn("torch.nn.functional.dropout")
def _f_dropout(fw, input, p=0.5, training=True, inplace=False):
    if float(p) == 0 or not training:
        return fw.val(input)
    fw.t.not_covered("dropout", _RANDOM, fw.node)


# ---- nn modules: the constructor's parameters, then what calling the module does -----------------


def _module(*names: str):
    def register(f):
        for n in names:
            _MODULES[n] = f
        return f

    return register


def _activation(name: str, path: str, **fixed):
    def ctor(fw, *args, inplace=False, **kwargs):
        def apply(fw, input):
            return fw.apply(_FUNCTIONS[path], path, [input, *args], {**fixed, **kwargs}, fw.node)

        return apply

    _MODULES[name] = ctor


for _name, _path in [
    ("ReLU", "torch.nn.functional.relu"),
    ("ReLU6", "torch.nn.functional.relu6"),
    ("Sigmoid", "torch.sigmoid"),
    ("Tanh", "torch.tanh"),
    ("GELU", "torch.nn.functional.gelu"),
    ("SiLU", "torch.nn.functional.silu"),
    ("Mish", "torch.nn.functional.mish"),
    ("Softplus", "torch.nn.functional.softplus"),
    ("Softsign", "torch.nn.functional.softsign"),
    ("ELU", "torch.nn.functional.elu"),
    ("CELU", "torch.nn.functional.celu"),
    ("SELU", "torch.nn.functional.selu"),
    ("LeakyReLU", "torch.nn.functional.leaky_relu"),
    ("Hardtanh", "torch.nn.functional.hardtanh"),
    ("Hardsigmoid", "torch.nn.functional.hardsigmoid"),
    ("Hardswish", "torch.nn.functional.hardswish"),
    ("LogSigmoid", "torch.nn.functional.logsigmoid"),
    ("Tanhshrink", "torch.nn.functional.tanhshrink"),
    ("Softshrink", "torch.nn.functional.softshrink"),
    ("Hardshrink", "torch.nn.functional.hardshrink"),
    ("Threshold", "torch.nn.functional.threshold"),
]:
    _activation(_name, _path)


def _loss_ctor(path: str):
    """Loss modules take their options as keywords of the constructor, then (input, target)."""

    def ctor(fw, *args, **kwargs):
        if args:
            fw.fail(f"{path.split('.')[-1]}: give the loss's options as keywords")

        def apply(fw, input, target):
            return fw.apply(_FUNCTIONS[path], path, [input, target], kwargs, fw.node)

        return apply

    return ctor


for _name, _path in [
    ("MSELoss", "torch.nn.functional.mse_loss"),
    ("L1Loss", "torch.nn.functional.l1_loss"),
    ("SmoothL1Loss", "torch.nn.functional.smooth_l1_loss"),
    ("HuberLoss", "torch.nn.functional.huber_loss"),
    ("KLDivLoss", "torch.nn.functional.kl_div"),
    ("BCELoss", "torch.nn.functional.binary_cross_entropy"),
    ("SoftMarginLoss", "torch.nn.functional.soft_margin_loss"),
]:
    _MODULES[_name] = _loss_ctor(_path)


def _softmax_ctor(log: bool, negate: bool = False):
    def ctor(fw, dim=None):
        def apply(fw, input):
            return fw.softmax(input, dim, log, fw.node, negate=negate)

        return apply

    return ctor


@_module("CosineSimilarity")
def _m_cosine_similarity(fw, dim=1, eps=1e-8):
    def apply(fw, x1, x2):
        return _f_cosine_similarity(fw, x1, x2, dim, eps)

    return apply


@_module("PairwiseDistance")
def _m_pairwise_distance(fw, p=2.0, eps=1e-6, keepdim=False):
    def apply(fw, x1, x2):
        return _f_pairwise_distance(fw, x1, x2, p, eps, keepdim)

    return apply


@_module("TripletMarginLoss")
def _m_triplet_margin(
    fw, margin=1.0, p=2.0, eps=1e-6, swap=False, size_average=None, reduce=None, reduction="mean"
):
    def apply(fw, anchor, positive, negative):
        return _f_triplet_margin(
            fw, anchor, positive, negative, margin, p, eps, swap, size_average, reduce, reduction
        )

    return apply


_MODULES["Softmax"] = _softmax_ctor(False)
_MODULES["LogSoftmax"] = _softmax_ctor(True)
_MODULES["Softmin"] = _softmax_ctor(False, negate=True)


@_module("Identity")
def _m_identity(fw, *args, **kwargs):
    def apply(fw, input):
        return fw.val(input)

    return apply


@_module("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout")
def _m_dropout(fw, p=0.5, inplace=False):
    def apply(fw, input):
        if float(p) == 0:
            return fw.val(input)
        fw.t.not_covered(f"Dropout(p={p})", _RANDOM, fw.node)

    return apply


def _affine_note(fw, what: str, weight: str) -> None:
    fw.notes.append(
        f"{what}'s {weight} are their initial values (1 and 0), so they are left out; a trained "
        "one needs them as inputs"
    )


@_module("LayerNorm")
def _m_layernorm(
    fw, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None
):
    def apply(fw, input):
        if elementwise_affine:
            _affine_note(fw, "LayerNorm", "weight and bias" if bias else "weight")
        return _layer_norm(fw, fw.val(input), normalized_shape, None, None, eps)

    return apply


@_module("RMSNorm")
def _m_rmsnorm(fw, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
    def apply(fw, input):
        if elementwise_affine:
            fw.notes.append(
                "RMSNorm's weight is its initial value (1), so it is left out; a trained one "
                "needs it as an input"
            )
        return _rms_norm(fw, fw.val(input), normalized_shape, None, eps)

    return apply


def _instance_norm(rank: int):
    def ctor(
        fw, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False,
        device=None, dtype=None,
    ):  # fmt: skip
        def apply(fw, input):
            x = fw.val(input)
            if x.rank not in (rank + 1, rank + 2):
                fw.fail(f"InstanceNorm{rank}d of a tensor of {x.rank} dimensions")
            channel = x.rank - rank - 1
            if x.dims[channel] is not None and x.dims[channel].value != num_features:
                fw.fail(
                    f"InstanceNorm{rank}d({num_features}) of an input with "
                    f"{x.dims[channel].value} channels"
                )
            if affine:
                _affine_note(fw, f"InstanceNorm{rank}d", "weight and bias")
            return fw.normalize(x, tuple(range(x.rank - rank, x.rank)), eps, fw.node)

        return apply

    return ctor


def _batch_norm(rank: int):
    def ctor(
        fw, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
        device=None, dtype=None,
    ):  # fmt: skip
        def apply(fw, input):
            x = fw.val(input)
            if x.rank < 2:
                fw.fail(f"BatchNorm of a tensor of {x.rank} dimensions")
            fw.notes.append(
                "BatchNorm as a new module is in training mode: it normalizes with the batch's "
                "statistics (the running statistics it updates are not part of the kernel)"
            )
            if affine:
                _affine_note(fw, "BatchNorm", "weight and bias")
            axes = (0, *range(2, x.rank))
            return fw.normalize(x, axes, eps, fw.node)

        return apply

    return ctor


def _group_norm(fw, x: Val, num_groups, weight, bias, eps) -> Val:
    """(x - mean) / sqrt(var + eps) over each group's channels and the spatial dimensions, then
    weight and bias per channel; the channels seen as (groups, channels per group), the same
    memory, where a group has more than one channel and there is more than one group."""
    if x.rank < 2:
        fw.fail(f"group_norm of a tensor of {x.rank} dimension(s): (batch, channels, ...)")
    channels = _extent(x.dims[1])
    g = _whole(fw, fw.val(num_groups) if isinstance(num_groups, Val) else num_groups, "num_groups")
    if g < 1 or channels % g:
        fw.fail(f"group_norm: {channels} channels are not a multiple of {g} groups")
    per = channels // g
    if g == 1 or per == 1:  # one group: a layer norm over all; a channel each: an instance norm
        out = fw.normalize(x, tuple(range(1 if g == 1 else 2, x.rank)), eps, fw.node)
        return _affine(fw, out, weight, bias)
    gs, ps = fw.t.sym("groups", g), fw.t.sym("channels_per_group", per)
    xs = Split(x, 1, gs, ps, fw.node)
    out = fw.normalize(xs, tuple(range(2, xs.rank)), eps, fw.node)
    fw.notes.append(
        "group_norm's result is viewed as (batch, groups, channels per group, ...): the same "
        "memory as (batch, channels, ...)"
    )
    for v, op in ((weight, "*"), (bias, "+")):
        if v is None:
            continue
        w = fw.val(v)
        if w.rank != 1 or _extent(w.dims[0]) != channels:
            fw.fail(f"group_norm's weight and bias have one element per channel ({channels})")
        w = Split(w, 0, gs, ps, fw.node)
        for _ in range(out.rank - 3):
            w = fw.unsqueeze(w, -1, fw.node)
        out = fw.ew(lambda a, op=op: _bin(op, a[0], a[1]), out, w)
    return out


@_fn("torch.nn.functional.group_norm")
def _f_group_norm(fw, input, num_groups, weight=None, bias=None, eps=1e-5):
    return _group_norm(fw, fw.val(input), num_groups, weight, bias, eps)


@_module("GroupNorm")
def _m_groupnorm(fw, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
    def apply(fw, input):
        x = fw.val(input)
        if x.rank < 2 or _extent(x.dims[1]) != num_channels:
            fw.fail(f"GroupNorm(num_channels={num_channels}) of an input of another shape")
        if affine:
            _affine_note(fw, "GroupNorm", "weight and bias")
        return _group_norm(fw, x, num_groups, None, None, eps)

    return apply


for _r in (1, 2, 3):
    _MODULES[f"InstanceNorm{_r}d"] = _instance_norm(_r)
    _MODULES[f"BatchNorm{_r}d"] = _batch_norm(_r)


def _adaptive_pool(op: str, rank: int):
    def ctor(fw, output_size, return_indices=False):
        def apply(fw, input):
            sizes = output_size if isinstance(output_size, tuple | list) else (output_size,) * rank
            x = fw.val(input)
            if return_indices or any(s != 1 for s in sizes):
                fw.t.not_covered(f"AdaptivePool to {output_size}", _POOL, fw.node)
            return fw.reduce(op, x, tuple(range(x.rank - rank, x.rank)), True, fw.node)

        return apply

    return ctor


for _r in (1, 2, 3):
    _MODULES[f"AdaptiveAvgPool{_r}d"] = _adaptive_pool("mean", _r)
    _MODULES[f"AdaptiveMaxPool{_r}d"] = _adaptive_pool("max", _r)


# ---- windows: convolutions and pooling; scans -----------------------------------------------


def _per_axis(fw, value, rank: int, what: str) -> list[int]:
    values = list(value) if isinstance(value, tuple | list) else [value] * rank
    if len(values) != rank or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        fw.fail(f"`{what}` = {value!r}: --from-torch reads one whole number or {rank} of them")
    return [int(v) for v in values]


_AXIS_NAMES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _window_axes(fw, x: Val, rank: int, kernel, stride, padding, dilation, out_pad, transposed):
    if isinstance(padding, str):
        if padding != "valid":
            fw.fail(f"padding={padding!r} is not covered (a number, a tuple or 'valid')")
        padding = 0
    if x.rank < rank + 1:
        fw.fail(f"the input has {x.rank} dimension(s); a {rank}-d window needs at least {rank + 1}")
    ks = _per_axis(fw, kernel, rank, "kernel_size")
    ss = _per_axis(fw, kernel if stride is None else stride, rank, "stride")
    ps = _per_axis(fw, padding, rank, "padding")
    ds = _per_axis(fw, dilation, rank, "dilation")
    os_ = _per_axis(fw, out_pad, rank, "output_padding")
    axes = []
    for a, (k, st, p, d, op) in enumerate(zip(ks, ss, ps, ds, os_, strict=True)):
        dim = x.dims[x.rank - rank + a]
        n = 1 if dim is None else dim.value
        if min(k, st, d) < 1 or p < 0:
            fw.fail("a window's kernel size, stride and dilation are ≥ 1 and its padding ≥ 0")
        if transposed:
            out = (n - 1) * st - 2 * p + d * (k - 1) + op + 1
        else:
            out = (n + 2 * p - d * (k - 1) - 1) // st + 1
        if out < 1:
            fw.fail(f"the window leaves no output along dimension {x.rank - rank + a}")
        name = _AXIS_NAMES[rank][a]
        if k == 1 and st == 1 and p == 0 and op == 0 and dim is not None:
            # the window is the input's own element: the output axis is the input's
            axes.append(Axis(k, st, p, d, dim, fw.t.sym(f"K{name}", k)))
            continue
        axes.append(Axis(k, st, p, d, fw.t.sym(f"O{name}", out), fw.t.sym(f"K{name}", k)))
    return axes


def _window_subscript(kind: str, o: str | None, k: str | None, a: Axis) -> str:
    """The input's subscript along a window axis at output index `o`, kernel index `k`:
    o·stride + k·dilation − pad, or for a transposed convolution (o + pad − k·dilation) / stride
    (a position the stride does not divide reads nothing)."""

    def term(i: str | None, c: int) -> str:
        return "" if i is None else i if c == 1 else f"{i} * {c}"

    if kind == "conv_t":
        parts = [term(o, 1), str(a.pad) if a.pad else "", term(k, a.dilation)]
        text = parts[0] or "0"
        text += f" + {parts[1]}" if parts[1] else ""
        text += f" - {parts[2]}" if parts[2] else ""
        return f"({text}) / {a.stride}" if a.stride != 1 else text
    text = term(o, a.stride) or "0"
    if k is not None:
        text += f" + {term(k, a.dilation)}"
    return text + (f" - {a.pad}" if a.pad else "")


def _grouped_channel(g: str, per: Dim, i: str | None) -> str:
    return g if per is None else f"{g} * {per.root().name} + {i}"


def _conv(rank: int, transposed: bool):
    def ctor(
        fw,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        *rest,
        dilation=1,
        groups=1,
        bias=True,
        output_padding=0,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        names = (
            ("output_padding", "groups", "bias", "dilation")
            if transposed
            else (
                "dilation",
                "groups",
                "bias",
            )
        )
        given = dict(zip(names, rest, strict=False))
        dilation = given.get("dilation", dilation)
        groups = given.get("groups", groups)
        bias = given.get("bias", bias)
        output_padding = given.get("output_padding", output_padding)
        if padding_mode != "zeros":
            fw.fail(f"padding_mode={padding_mode!r} is not covered (zeros)")
        cls = f"nn.Conv{'Transpose' if transposed else ''}{rank}d"

        def apply(fw, input):
            x = fw.val(input)
            if x.rank != rank + 2:
                fw.fail(f"{cls} of a {x.rank}-d input: --from-torch reads (batch, channels, ...)")
            cin = 1 if x.dims[1] is None else x.dims[1].value
            if cin != in_channels or in_channels % groups or out_channels % groups:
                fw.fail(
                    f"{cls}: the input has {cin} channels, in_channels is {in_channels}, "
                    f"groups {groups}; channels are a multiple of groups"
                )
            axes = _window_axes(
                fw, x, rank, kernel_size, stride, padding, dilation, output_padding, transposed
            )
            kdims = [a.kdim for a in axes]
            g, cig, cog = groups, in_channels // groups, out_channels // groups
            kind = "conv_t" if transposed else "conv"
            w = Window(kind, x, axes, fw.node, groups=g)
            if g == 1:
                w.cin, w.cout_total = x.dims[1], fw.t.sym("out_channels", out_channels)
                wdims = [w.cout_total, w.cin] if not transposed else [w.cin, w.cout_total]
                bdims = [w.cout_total]
            elif cig == 1 and cog == 1:  # depthwise: output channel c reads input channel c
                w.cout_total = x.dims[1]
                wdims = [x.dims[1], None]
                bdims = [x.dims[1]]
            else:
                w.gsym = fw.t.sym("groups", g)
                w.cin, w.cout = fw.t.sym("in_per_group", cig), fw.t.sym("out_per_group", cog)
                wdims = [w.gsym, w.cout, w.cin] if not transposed else [w.gsym, w.cin, w.cout]
                bdims = [w.gsym, w.cout]
            w.dims = [x.dims[0], *w.channel_dims(), *(a.out for a in axes)]
            w.weight = fw.extra_input("weight", [*wdims, *kdims])
            if bias:
                w.bias = fw.extra_input("bias", bdims)
            fw.notes.append(
                f"{cls}'s weight{' and bias' if bias else ''} (made at random in __init__) "
                "are inputs of the kernel"
                + (
                    ", the output viewed as (batch, groups, channels per group, ...)"
                    if w.cout
                    else ""
                )
            )
            return w

        return apply

    return ctor


def _pool(rank: int, op: str):
    def max_ctor(
        fw, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False
    ):
        return ctor(fw, kernel_size, stride, padding, dilation, return_indices, ceil_mode)

    def avg_ctor(
        fw,
        kernel_size,
        stride=None,
        padding=0,
        ceil_mode=False,
        count_include_pad=True,
        divisor_override=None,
    ):
        return ctor(
            fw,
            kernel_size,
            stride,
            padding,
            1,
            False,
            ceil_mode,
            count_include_pad,
            divisor_override,
        )

    def ctor(
        fw,
        kernel_size,
        stride,
        padding,
        dilation,
        return_indices,
        ceil_mode,
        count_include_pad=True,
        divisor_override=None,
    ):
        if return_indices or ceil_mode or not count_include_pad or divisor_override:
            fw.fail(
                "pooling with return_indices, ceil_mode, count_include_pad=False or "
                "divisor_override is not covered"
            )

        def apply(fw, input):
            x = fw.val(input)
            axes = _window_axes(fw, x, rank, kernel_size, stride, padding, dilation, 0, False)
            return Window(op, x, axes, fw.node)

        return apply

    return max_ctor if op == "max" else avg_ctor


for _r in (1, 2, 3):
    _MODULES[f"Conv{_r}d"] = _conv(_r, False)
    _MODULES[f"ConvTranspose{_r}d"] = _conv(_r, True)
    _MODULES[f"MaxPool{_r}d"] = _pool(_r, "max")
    _MODULES[f"AvgPool{_r}d"] = _pool(_r, "avg")
    for _n in (f"Conv{_r}d", f"ConvTranspose{_r}d", f"MaxPool{_r}d", f"AvgPool{_r}d"):
        _UNSUPPORTED.pop(f"torch.nn.{_n}", None)


def _scan(op: str):
    def handler(fw, input, dim, dtype=None):
        x = fw.num(fw.val(input))
        return Scan(op, x, fw.axis(dim, x.rank, fw.node), fw.node)

    return handler


_fn("torch.cumsum", method="cumsum")(_scan("cumsum"))
_fn("torch.cumprod", method="cumprod")(_scan("cumprod"))
for _n in ("cumsum", "cumprod"):
    _UNSUPPORTED.pop(f"torch.{_n}", None)


# -- slices, concatenations, gathers --


def _evaluate(e) -> float | None:
    """The value of an expression of numbers and sizes (`x.size(1) - 1`), or None."""
    if isinstance(e, ENum):
        return e.value
    if isinstance(e, ERef) and isinstance(e.ref, Sym):
        return float(e.ref.root().value)
    if isinstance(e, ENeg):
        v = _evaluate(e.x)
        return None if v is None else -v
    if isinstance(e, EBin) and e.op in ("+", "-", "*"):
        a, b = _evaluate(e.left), _evaluate(e.right)
        if a is None or b is None:
            return None
        return a + b if e.op == "+" else a - b if e.op == "-" else a * b
    return None


def _whole(fw, v, what: str) -> int:
    """A whole number given as a number or as arithmetic of sizes."""
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v)
    e = _number_expr(v) if isinstance(v, Val) else None
    x = _evaluate(e) if e is not None else None
    if x is not None and float(x).is_integer():
        return int(x)
    fw.fail(f"{what} is a whole number --from-torch can tell (of numbers and sizes)")


def _number_expr(v: Val):
    """The expression of a value without sized dimensions made of numbers and sizes."""
    if any(d is not None for d in v.dims):
        return None
    if isinstance(v, Const):
        return v.expr
    if isinstance(v, Map):
        args = [_number_expr(a) for a in v.args]
        if any(a is None for a in args):
            return None
        return v.fn(args, [None] * v.rank)
    return None


def _constant(v: Val) -> float | None:
    """The value of every element of v, where it is one number (`zeros_like(...)`)."""
    if isinstance(v, Const):
        return v.expr.value if isinstance(v.expr, ENum) else None
    if isinstance(v, Map):
        if v.view:
            return _constant(v.args[0])
        try:
            e = v.fn([ERef(f"a{k}") for k in range(len(v.args))], ["i"] * v.rank)
        except Exception:  # a function that needs its arguments' values: not a constant
            return None
        return e.value if isinstance(e, ENum) else None
    return None


def _part(fw, d: Dim, length: int) -> Dim:
    """The size of a part of dimension d: d itself, or a new size."""
    if d is not None and d.value == length:
        return d
    if length == 1:
        return None
    part = fw.t.anonymous(length)
    part.base = d.root() if d is not None else None
    return part


def _slice(fw, x: Val, a: int, start: int, length: int) -> Val:
    n = _extent(x.dims[a])
    if start == 0 and length == n:
        return x
    return Shift(x, a, start, _part(fw, x.dims[a], length), fw.node)


@_fn("torch.narrow", method="narrow")
def _f_narrow(fw, input, dim, start, length):
    x = fw.val(input)
    a = fw.axis(dim, x.rank, fw.node)
    n = _extent(x.dims[a])
    st = _whole(fw, start, "narrow's start")
    ln = _whole(fw, length, "narrow's length")
    st = st + n if st < 0 else st
    if st < 0 or ln < 1 or st + ln > n:
        fw.fail(f"narrow({dim}, {st}, {ln}) of a dimension of {n} elements is out of range")
    return _slice(fw, x, a, st, ln)


@_fn("torch.select", method="select")
def _f_select(fw, input, dim, index):
    x = fw.val(input)
    a = fw.axis(dim, x.rank, fw.node)
    n = _extent(x.dims[a])
    i = _whole(fw, index, "select's index")
    i = i + n if i < 0 else i
    if not 0 <= i < n:
        fw.fail(f"select({dim}, {index}) of a dimension of {n} elements is out of range")
    return fw.squeeze(_slice(fw, x, a, i, 1), a, fw.node)


@_fn("torch.flip", method="flip")
def _f_flip(fw, input, *dims, **kwargs):
    x = fw.val(input)
    if set(kwargs) - {"dims"}:
        fw.fail(f"flip takes `dims`, not {', '.join(sorted(set(kwargs) - {'dims'}))}")
    if "dims" in kwargs:
        dims = (*dims, kwargs["dims"])
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        dims = tuple(dims[0])
    out = x
    for a in sorted({fw.axis(d, x.rank, fw.node) for d in dims}):
        if out.dims[a] is None:
            continue
        if isinstance(out, Scan) and out.axis == a:
            # flip(scan(B)) is the scan from the end of flip(B): a suffix scan
            flipped = Shift(out.body, a, -1, out.dims[a], fw.node, -1, (out.dims[a],))
            out = Scan(out.op, flipped, a, out.node, reverse=not out.reverse)
            continue
        out = Shift(out, a, -1, out.dims[a], fw.node, -1, (out.dims[a],))
    return out


_IDENTITY = {"cumsum": 0.0, "cumprod": 1.0}


@_fn("torch.cat", "torch.concat", "torch.concatenate")
def _f_cat(fw, tensors, dim=0, axis=None):
    if not isinstance(tensors, tuple | list) or not tensors:
        fw.fail("torch.cat takes a list of tensors")
    parts = [fw.val(t) for t in tensors]
    if len(parts) == 1:
        return parts[0]
    rank = parts[0].rank
    if any(p.rank != rank for p in parts):
        fw.fail("torch.cat of tensors of different ranks")
    a = fw.axis(axis if axis is not None else dim, rank, fw.node)
    for p in range(rank):
        if p == a:
            continue
        sized = [q.dims[p] for q in parts if q.dims[p] is not None]
        if len(sized) != len(parts) and sized:
            fw.fail(f"torch.cat: dimension {p} differs between the tensors")
        for d in sized[1:]:
            fw.unify(sized[0], d, fw.node, "torch.cat: the other dimensions differ")
    total = sum(_extent(q.dims[a]) for q in parts)
    scans = [k for k, q in enumerate(parts) if isinstance(q, Scan) and q.axis == a]
    if len(scans) == 1:
        # a scan with its identity before it (after it, from the end): a scan of its body read
        # one back, an exclusive scan; the scan is the whole result
        k = scans[0]
        sc = parts[k]
        rest = parts[:k] + parts[k + 1 :]
        ident = _IDENTITY.get(sc.op)
        before = sum(_extent(q.dims[a]) for q in parts[:k])
        if (
            ident is not None
            and all(_constant(q) == ident for q in rest)
            and ((k == len(parts) - 1) if not sc.reverse else k == 0)
        ):
            d = _total(fw, [q.dims[a] for q in parts], total)
            body = Shift(sc.body, a, -before, d, fw.node, fill=ident)
            dims = [d if p == a else next((q.dims[p] for q in parts if q.dims[p]), None)
                    for p in range(rank)]  # fmt: skip
            body.dims = dims
            return Scan(sc.op, body, a, sc.node, reverse=sc.reverse)
        fw.fail(
            "a concatenation with a scan is covered where the scan's identity (0 for cumsum, "
            "1 for cumprod) comes before it along its dimension (an exclusive scan); this one is "
            "not: a scan is the whole of a result"
        )
    dims = [next((q.dims[p] for q in parts if q.dims[p] is not None), None) for p in range(rank)]
    dims[a] = _total(fw, [q.dims[a] for q in parts], total)
    return Cat([fw.num(q) for q in parts], a, dims, fw.node)


def _total(fw, parts: list[Dim], total: int) -> Dim:
    """The size of a concatenation: the size a part was sliced from where it has that value
    (x's n − 1 and 1 make n again), else a new size."""
    for d in parts:
        for s in (d, d.root().base if d is not None else None):
            if s is not None and s.root().value == total:
                return s.root()
    return fw.t.anonymous(total)


def _index_leaf(fw, v, what: str) -> Leaf:
    """The int input of forward a gather reads its indices from."""
    while isinstance(v, Map) and v.view and len(v.args) == 1:
        if [d for d in v.dims if d] != [d for d in v.args[0].dims if d]:
            break
        v = v.args[0]
    if not isinstance(v, Leaf) or v.dtype != "int":
        fw.fail(
            f"{what}: the indices are covered as an int input of forward (torch.randint in "
            "get_inputs), read whole; the notation gathers at an element of an int input"
        )
    v.gathers = True
    return v


def _take(fw, x: Val, a: int, index) -> Val:
    """x along dimension a at the indices `index` (x's shape without a): `x[n, t[n]]`."""
    t = _index_leaf(fw, fw.val(index), "a gather")
    others = [p for p in range(x.rank) if p != a]
    if t.rank != len(others):
        fw.fail(
            f"the indices have {t.rank} dimension(s); a tensor of {x.rank} indexed along one "
            f"needs {len(others)}"
        )
    for q, p in enumerate(others):
        if (t.dims[q] is None) != (x.dims[p] is None):
            fw.fail("the indices' shape is not the input's without the gathered dimension")
        if t.dims[q] is not None:
            fw.unify(t.dims[q], x.dims[p], fw.node, "the indices' shape differs from the input's")
    return Gather(x, a, t, {p: q for q, p in enumerate(others)}, fw.node)


@_fn("torch.gather", method="gather")
def _f_gather(fw, input, dim, index, sparse_grad=False):
    x = fw.val(input)
    a = fw.axis(dim, x.rank, fw.node)
    t = _index_leaf(fw, fw.val(index), "torch.gather")
    if t.rank != x.rank:
        fw.fail("torch.gather: the index has another number of dimensions than the input")
    for p in range(x.rank):
        if p != a and (t.dims[p] is None) != (x.dims[p] is None):
            fw.fail(f"torch.gather: the index's dimension {p} is not the input's (not covered)")
        if p != a and t.dims[p] is not None:
            fw.unify(t.dims[p], x.dims[p], fw.node, "torch.gather: the shapes differ")
    return Gather(x, a, t, {p: p for p in range(x.rank)}, fw.node)


def _class_loss(fw, input, target, weight, ignore_index, label_smoothing, log_probs: bool):
    """The per-element loss of nll_loss (log_probs) or cross_entropy over the class dimension
    (1): with class indices, -logp[n, t[n]]; with class probabilities, -Σ t logp."""
    x = fw.val(input)
    if weight is not None:
        fw.fail("a class weight is not covered (weight=None): the mean would be weighted")
    if x.rank < 2:
        fw.fail("an unbatched input (one dimension) is not covered: the classes are dimension 1")
    t = fw.val(target)
    classes = _extent(x.dims[1])
    if t.dtype == "int":
        if 0 <= ignore_index < classes:
            fw.fail(
                f"ignore_index={ignore_index}, a class, is not covered: the mean would leave "
                "its elements out"
            )
        picked = _take(fw, x, 1, t)
        if log_probs:
            return fw.ew(lambda a: _neg(a[0]), picked)
        lse = _f_logsumexp(fw, x, 1)
        nll = fw.ew(lambda a: _bin("-", a[0], a[1]), lse, picked)
        if not label_smoothing:
            return nll
        mean = fw.reduce("mean", x, 1, False, fw.node)
        eps = _named_default(label_smoothing, "label_smoothing")
        # (1 - e) (lse - x[t]) + e (lse - mean_c x)
        return fw.ew(
            lambda a: _bin(
                "-",
                a[0],
                _bin("+", _bin("*", _bin("-", _num(1), a[3]), a[1]), _bin("*", a[3], a[2])),
            ),  # fmt: skip
            lse,
            picked,
            mean,
            eps,
        )
    if log_probs:
        fw.fail("nll_loss takes class indices (an int tensor) as its target")
    logp = fw.softmax(x, 1, True, fw.node)
    if label_smoothing:
        eps = _named_default(label_smoothing, "label_smoothing")
        t = fw.ew(
            lambda a: _bin("+", _bin("*", a[0], _bin("-", _num(1), a[1])), _bin("/", a[1], a[2])),
            t,
            eps,
            Const(ERef(x.dims[1])) if x.dims[1] is not None else 1,
        )
    prod = fw.ew(lambda a: _bin("*", a[0], a[1]), t, logp)
    return fw.ew(lambda a: _neg(a[0]), fw.reduce("sum", prod, 1, False, fw.node))


@_fn("torch.nn.functional.cross_entropy")
def _f_cross_entropy(
    fw, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
    reduction="mean", label_smoothing=0.0,
):  # fmt: skip
    r = _reduction_arg(fw, size_average, reduce, reduction)
    loss = _class_loss(fw, input, target, weight, ignore_index, label_smoothing, False)
    return fw.loss(loss, r, fw.node)


@_fn("torch.nn.functional.nll_loss")
def _f_nll_loss(
    fw, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
    reduction="mean",
):  # fmt: skip
    r = _reduction_arg(fw, size_average, reduce, reduction)
    return fw.loss(_class_loss(fw, input, target, weight, ignore_index, 0.0, True), r, fw.node)


for _name, _path in [
    ("CrossEntropyLoss", "torch.nn.functional.cross_entropy"),
    ("NLLLoss", "torch.nn.functional.nll_loss"),
]:
    _MODULES[_name] = _loss_ctor(_path)


@_module("Sequential")
def _m_sequential(fw, *modules):
    for m in modules:
        if not isinstance(m, ModuleSpec):
            fw.fail("nn.Sequential of something that is not a module")

    def apply(fw, input):
        out = input
        for m in modules:
            out = fw.module(m, [out], {}, fw.node)
        return out

    return apply


# ---- the formula ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Temp:
    name: str
    positions: list[int]  # the value's sized dimensions


class _Emitter:
    """The values of forward as statements of the notation: temporaries first, then `out`."""

    def __init__(self, fw: _Forward, root: Val, node: ast.AST):
        self.fw = fw
        self.t = fw.t
        self.root = root
        self.node = node
        self.taken: set[str] = set(RESERVED)
        self.prefer: set[str] = set()
        self.ranges: dict[str, Sym] = {}
        self.temps: dict[int, Temp] = {}
        self.materialize: set[int] = set()
        self.statements: list[tuple[str, list[str], object]] = []
        self.leaf_names: dict[int, str] = {}

    def fail(self, message: str, node=None):
        self.t.fail(message, node or self.node)

    # -- names --

    def claim(self, want: str, fallback: str = "t") -> str:
        base = want if _IDENT.fullmatch(want or "") else fallback
        name = base
        k = 2
        while name in self.taken or name in self.prefer:
            name = f"{base}_{k}" if base[-1].isdigit() else f"{base}{k}"
            k += 1
        self.taken.add(name)
        return name

    def index_base(self, s: Sym) -> str:
        name = s.root().name
        letters = [c for c in name if c.isalpha()]
        digits = re.search(r"\d+$", name)
        base = (letters[0].lower() if letters else "i") + (digits.group() if digits else "")
        return base

    def index(self, s: Sym, used: set[str]) -> str:
        root = s.root()
        base = self.index_base(root)
        k = 1
        while True:
            name = base if k == 1 else (f"{base}_{k}" if base[-1].isdigit() else f"{base}{k}")
            k += 1
            if name in used:
                continue
            have = self.ranges.get(name)
            if have is not None and have.root() is root:
                return name
            if have is None and name not in self.taken:
                self.taken.add(name)
                self.ranges[name] = root
                return name

    # -- the plan: which values are temporaries --

    def plan(self) -> None:
        order: list[Val] = []
        seen: set[int] = set()

        def visit(v: Val):
            if id(v) in seen:
                return
            seen.add(id(v))
            for c in v.children():
                visit(c)
            order.append(v)

        visit(self.root)
        order.reverse()  # parents before children
        has_reduce: dict[int, bool] = {}
        for v in reversed(order):
            has_reduce[id(v)] = isinstance(v, Reduce) or any(
                has_reduce[id(c)] for c in v.children()
            )
        expansions: dict[int, int] = {id(self.root): 1}
        for v in order:
            n = expansions.get(id(v), 0)
            sized = any(d is not None for d in v.dims)
            temporary = (
                v.force
                or (isinstance(v, Reduce) and n > 1)
                or (v.hint is not None and has_reduce[id(v)])
            )
            if temporary and v is not self.root and sized and not isinstance(v, Leaf | Const):
                self.materialize.add(id(v))
            contribution = 1 if (id(v) in self.materialize or v is self.root) else n
            for c in v.children():
                expansions[id(c)] = expansions.get(id(c), 0) + contribution

    # -- expressions --

    def emit(self, v: Val, idx: list[str | None], used: set[str], top: bool = False):
        if id(v) in self.materialize and not top:
            self.plain_only(v, idx, "a value computed once (a temporary)")
            temp = self.temps.get(id(v))
            if temp is None:
                temp = self.statement(v, v.hint or _TEMP_NAMES.get(getattr(v, "op", ""), "t"))
            return EAcc(temp, [idx[p] for p in temp.positions])
        if isinstance(v, Leaf):
            subs = [idx[p] for p, d in enumerate(v.dims) if d is not None]
            if any(isinstance(x, _GatherSub) for x in subs) and any(
                not isinstance(x, _GatherSub) and not _IDENT.fullmatch(x) for x in subs
            ):
                self.fail(
                    "a read both gathered and shifted (or sliced) is not covered: the notation "
                    "reads an input either at an element of an int input or at shifted indices",
                    v.node if v.node is not self.fw.fn else None,
                )
            subs = [
                self.own_range(x, d) for x, d in zip(subs, [d for d in v.dims if d], strict=True)
            ]
            acc = EAcc(v, subs)
            return ECmp("!=", acc, _num(0)) if v.dtype == "bool" else acc
        if isinstance(v, Const):
            return v.expr
        if isinstance(v, Shift):
            return self.shift(v, idx, used)
        if isinstance(v, Cat):
            return self.cat(v, idx, used)
        if isinstance(v, Gather):
            return self.gather(v, idx, used)
        if isinstance(v, Split):
            g, c = idx[v.axis], idx[v.axis + 1]
            for x in (g, c):
                if x is not None and not _IDENT.fullmatch(x):
                    self.fail(
                        "a group of channels read at a shifted or gathered position is not "
                        "covered: the notation's subscripts have at most one index per term",
                        v.node,
                    )
            if g is None:
                at = c
            elif c is None:
                at = g
            else:
                at = _SplitSub(f"{g} * {v.per.root().name} + {c}")
                at.parts, at.dims = (g, c), (v.dims[v.axis], v.per)
            return self.emit(v.x, [*idx[: v.axis], at, *idx[v.axis + 2 :]], used)
        if isinstance(v, Map):
            exprs = []
            for a, places in zip(v.args, v.places, strict=True):
                aidx = [idx[places[q]] if a.dims[q] is not None else None for q in range(a.rank)]
                exprs.append(self.emit(a, aidx, used))
            return v.fn(exprs, idx)
        if isinstance(v, Scan):
            self.plain_only(v, idx, "a scan")
            if v is not self.root:
                self.fail(
                    f"`{v.op}` is a scan, covered as the whole result of forward (the notation's "
                    "scan is the whole right-hand side of the only result)",
                    v.node,
                )
            if idx[v.axis] is None:
                return self.emit(v.body, idx, used)
            op = f"r{v.op}" if v.reverse else v.op
            return ERed(op, [idx[v.axis]], self.emit(v.body, idx, used))
        if isinstance(v, Window):
            return self.window(v, idx, used)
        if isinstance(v, Reduce):
            body = v.body
            bidx: list[str | None] = []
            bound: list[str] = []
            inner = set(used)
            k = 0
            for p, d in enumerate(body.dims):
                if p in v.axes:
                    if d is None:
                        bidx.append(None)
                    else:
                        name = self.index(d, inner)
                        inner.add(name)
                        bound.append(name)
                        bidx.append(name)
                    if v.keepdim:
                        k += 1
                else:
                    bidx.append(idx[k])
                    k += 1
            e = self.emit(body, bidx, inner)
            if not bound:
                return _num(0) if v.op in ("argmax", "argmin") else e
            return ERed(v.op, bound, e)
        raise AssertionError(v)

    def own_range(self, sub: str, d: Sym) -> str:
        """An index name read where the input's dimension is another size (a slice of it, a
        part of a concatenation) is a shifted read, `c + 0`: guarded, and no shape mismatch."""
        r = self.ranges.get(sub)
        if r is not None and r.root() is not d.root():
            return _Sub(f"{sub} + 0")
        return sub

    def cat(self, v: Cat, idx: list[str | None], used: set[str]):
        """Each part read at the position less its start, the part chosen by the index."""
        a = v.axis
        i = idx[a]
        exprs, start = [], 0
        for part in v.parts:
            sub = self.compose(Shift(part, a, -start, v.dims[a], v.node), i, v)
            if part.dims[a] is None:
                sub = None
            exprs.append((start, self.emit(part, [*idx[:a], sub, *idx[a + 1 :]], used)))
            start += _extent(part.dims[a])
        e = exprs[-1][1]
        for (_, x), (nxt, _) in zip(reversed(exprs[:-1]), reversed(exprs[1:]), strict=True):
            e = _where(ECmp("<", ERef(i), _num(nxt)), x, e)
        return e

    def plain_only(self, v: Val, idx: list[str | None], what: str) -> None:
        """Shifted and gathered subscripts reach inputs only (the notation's rule)."""
        bad = next((x for x in idx if x is not None and not _IDENT.fullmatch(x)), None)
        if bad is not None:
            self.fail(
                f"{what} read at `{bad}` (a slice, shift or gather of a computed value) is not "
                "covered: the notation reads shifted and gathered elements of inputs only; "
                "generate the inner operation on its own",
                v.node,
            )

    def shift(self, v: Shift, idx: list[str | None], used: set[str]):
        """A view along an axis: x read at `sign * i + offset`; where a position can fall
        outside x, its `fill`: an input's own shifted read gives 0 there (or `pad(.., fill)`),
        a computed value's is guarded by `where` on the index."""
        a = v.axis
        n = _extent(v.dims[a])
        i = idx[a]
        lo, hi = v.span()
        if lo >= hi:  # nothing of x is seen
            return _num(v.fill)
        # a chain of views along this axis down to an input: one shifted read
        chain, x = [], v
        while isinstance(x, Shift) and x.axis == a:
            chain.append(x)
            x = x.x
        if isinstance(x, Leaf):
            sub = i
            for level in chain:
                sub = self.compose(level, sub, v)
            # the input's own bounds, seen from this value's positions
            inside = self.inside(chain, n)
            natural = inside[-1]
            fills = {lv.fill for lv, span in zip(chain, inside, strict=True) if span != (0, n)}
            if (
                all(natural[0] >= sp[0] and natural[1] <= sp[1] for sp in inside[:-1])
                and len(fills) <= 1
            ):
                fill = fills.pop() if fills else 0.0
                if x.dims[a] is None:
                    sub = None
                e = self.emit(x, [*idx[:a], sub, *idx[a + 1 :]], used)
                if fill != 0.0 and natural != (0, n):
                    if x.dtype == "bool":
                        self.fail("a shifted boolean input with a fill is not covered", v.node)
                    e = _call("pad", e, _num(fill))
                return e
        sub = self.compose(v, i, v)
        if v.x.dims[a] is None:
            sub = None
        e = self.emit(v.x, [*idx[:a], sub, *idx[a + 1 :]], used)
        if (lo, hi) == (0, n):
            return e
        if i is None:
            return e if lo == 0 else _num(v.fill)
        at = ERef(i)
        if lo > 0:
            e = _where(ECmp(">=", at, _num(lo)), e, _num(v.fill))
        if hi < n:
            e = _where(ECmp("<", at, _num(hi)), e, _num(v.fill))
        return e

    def compose(self, level: Shift, sub: str | None, top: Shift) -> str | None:
        try:
            return _shifted(sub, level.sign, level.offset, level.sizes)
        except _NotAffine:
            self.fail(
                f"a slice or shift of a value read at `{sub}` is not covered: the notation's "
                "subscripts are affine in one index",
                top.node,
            )

    @staticmethod
    def inside(chain: list[Shift], n: int) -> list[tuple[int, int]]:
        """For each level of a chain of views along one axis, the positions (of the outermost
        value, [0, n)) at which that level reads inside its own source."""
        out = []
        sign, off = 1, 0  # the outer position i is at sign * i + off in this level's value
        for level in chain:
            size = _extent(level.x.dims[level.axis])
            loff = level.offset + sum(s.value for s in level.sizes)
            sign, off = sign * level.sign, level.sign * off + loff  # source position
            # 0 <= sign * i + off < size
            if sign > 0:
                lo, hi = -off, size - off
            else:
                lo, hi = off - size + 1, off + 1
            out.append((max(lo, 0), min(hi, n)))
        return out

    def gather(self, v: Gather, idx: list[str | None], used: set[str]):
        isubs = [idx[p] for p, d in enumerate(v.index.dims) if d is not None]
        bad = next((x for x in isubs if not _IDENT.fullmatch(x)), None)
        if bad is not None:
            self.fail(
                f"a gather read at `{bad}` is not covered: the indices of a gather are read at "
                "index names",
                v.node,
            )
        name = self.leaf_names[id(v.index)]
        sub = _GatherSub(f"{name}[{', '.join(isubs)}]")
        sub.leaf = v.index
        xidx = [
            (sub if v.x.dims[p] is not None else None) if p == v.axis else idx[v.xmap[p]]
            for p in range(v.x.rank)
        ]
        return self.emit(v.x, xidx, used)

    def window(self, v: Window, idx: list[str | None], used: set[str]):
        """A window's element: the reduction over the kernel's indices (and, for a convolution,
        the input channels of its group) of the input read at affine subscripts."""
        inner = set(used)
        bound: list[str] = []

        def new(d: Dim) -> str | None:
            if d is None:
                return None
            name = self.index(d, inner)
            inner.add(name)
            bound.append(name)
            return name

        n = len(v.axes)
        spatial = idx[len(idx) - n :]
        kidx = [new(a.kdim) for a in v.axes]
        subs: list[str | None] = []
        for o, k, a in zip(spatial, kidx, v.axes, strict=True):
            subs.append(_window_subscript(v.kind, o, k, a))
        lead = idx[: len(idx) - n]
        if v.kind in ("max", "avg"):
            xsubs = [*lead, *subs]
            read = self.read(v.x, xsubs, used, v.kind == "max")
            if not bound:
                return read
            return ERed("max" if v.kind == "max" else "mean", bound, read)
        b = lead[0]
        if v.groups == 1:
            co, ci = lead[1], new(v.cin)
            xc, wi = ci, [co, ci] if v.kind == "conv" else [ci, co]
            bias_at = co
        elif v.depthwise:
            co = lead[1]
            xc, wi, bias_at = co, [co, None] if v.kind == "conv" else [co, None], co
        else:  # the weight viewed as (groups, out, in, ...) or (groups, in, out, ...)
            g, co = lead[1], lead[2]
            ci = new(v.cin)
            xc = _grouped_channel(g, v.cin, ci)
            wi = [g, co, ci] if v.kind == "conv" else [g, ci, co]
            bias_at = [g, co]
        if not isinstance(bias_at, list):
            bias_at = [bias_at]
        read = self.read(v.x, [b, xc, *subs], used, False)
        w = EAcc(v.weight, [i for i, d in zip([*wi, *kidx], v.weight.dims, strict=True) if d])
        e = ERed("sum", bound, _bin("*", read, w)) if bound else _bin("*", read, w)
        if v.bias is not None:
            e = _bin(
                "+", e, EAcc(v.bias, [i for i, d in zip(bias_at, v.bias.dims, strict=True) if d])
            )
        return e

    def read(self, x: Val, subs: list[str | None], used: set[str], neg_inf: bool):
        """`x` at subscripts: plain ones through its own value; shifted ones only of an input of
        forward (a leaf), with the padding of the window."""
        plain = all(s is None or _IDENT.fullmatch(s) for s in subs)
        if plain:
            return self.emit(x, subs, used)
        if not isinstance(x, Leaf):
            self.fail(
                "a window (convolution or pooling) over a computed value is not covered: the "
                "notation reads shifted elements of inputs only; generate the inner operation on "
                "its own",
                getattr(x, "node", None),
            )
        access = EAcc(x, [s for s, d in zip(subs, x.dims, strict=True) if d is not None])
        return _call("pad", access, _neg(ERef("inf"))) if neg_inf else access

    def statement(self, v: Val, want: str, name: str | None = None) -> Temp:
        positions = [p for p, d in enumerate(v.dims) if d is not None]
        if name is None:
            name = self.claim(want, "t")
        temp = Temp(name, positions)
        used: set[str] = set()
        idx: list[str | None] = [None] * v.rank
        lhs = []
        for p in positions:
            i = self.index(v.dims[p], used)
            used.add(i)
            idx[p] = i
            lhs.append(i)
        rhs = self.emit(v, idx, used, top=True)
        self.temps[id(v)] = temp
        self.statements.append((name, lhs, rhs))
        return temp

    # -- the text --

    def formula(self) -> Translation:
        root = self.root
        if root.dtype == "bool":
            self.fail(
                "forward returns a boolean tensor; the notation's results are numbers (write "
                "`torch.where(cond, 1.0, 0.0)`)"
            )
        # names: sizes, inputs, scalars, then the output; indices and temporaries as they come
        sizes: list[Sym] = []
        for leaf in self.fw.leaves:
            for d in leaf.dims:
                if d is not None and d.root() not in sizes:
                    sizes.append(d.root())
        for s in sizes:
            if s.name in RESERVED or not _IDENT.fullmatch(s.name) or s.name in self.taken:
                s.name = self.claim(s.name, "S")
            self.taken.add(s.name)
        for leaf in self.fw.leaves:
            self.leaf_names[id(leaf)] = self.claim(leaf.name, "x")
        for sc in self.t.scalars.values():
            sc.name = ""
        for s in sizes:
            self.prefer.add(self.index_base(s))
        out_name = self.claim("out", "out")
        for alt in ("y", "result"):
            if out_name != "out" and alt not in self.taken and alt not in self.prefer:
                self.taken.discard(out_name)
                out_name = alt
                self.taken.add(alt)
                break
        self.plan()
        self.statement(root, "out", out_name)
        # what the statements use
        used_leaves: set[int] = set()
        used_scalars: list[Scalar] = []
        used_sizes: set[int] = set()
        for _, _, e in self.statements:
            for x in _walk(e):
                if isinstance(x, EAcc) and isinstance(x.tensor, Leaf):
                    used_leaves.add(id(x.tensor))
                if isinstance(x, EAcc):
                    used_leaves.update(id(i.leaf) for i in x.idx if isinstance(i, _GatherSub))
                elif (
                    isinstance(x, ERef) and isinstance(x.ref, Scalar) and x.ref not in used_scalars
                ):
                    used_scalars.append(x.ref)
                elif isinstance(x, ERef) and isinstance(x.ref, Sym):
                    used_sizes.add(id(x.ref.root()))
        for sc in used_scalars:
            sc.name = self.claim(sc.label, "a")
        leaves = [leaf for leaf in self.fw.leaves if id(leaf) in used_leaves]
        declared = self.split_inputs(leaves)
        for leaf in self.fw.leaves:
            if id(leaf) not in used_leaves:
                self.t.notes.append(
                    f"forward's input `{leaf.name}` is not used by its result; the kernel does "
                    "not read it"
                )
        if not leaves:
            self.fail("forward's result reads none of its inputs; there is nothing to compute")
        kept: list[Sym] = []
        for leaf in leaves:
            for d in declared[id(leaf)]:
                if d is not None and d.root() not in kept:
                    kept.append(d.root())
        for r in self.ranges.values():
            if r.root() not in kept:
                kept.append(r.root())
        for s in sizes:
            if id(s) in used_sizes and s not in kept:
                kept.append(s)
        p = _Printer(self.leaf_names)
        lines = []
        by_type: dict[str, list[str]] = {}
        for leaf in leaves:
            dims = ", ".join(d.root().name for d in declared[id(leaf)] if d is not None)
            dtype = "int" if leaf.dtype == "bool" else leaf.dtype  # a mask: nonzero is true
            by_type.setdefault(dtype, []).append(f"{self.leaf_names[id(leaf)]}[{dims}]")
        for dtype, decls in by_type.items():
            lines.append(f"{dtype} {', '.join(decls)}")
        lines.append("; ".join(f"{s.name} = {s.value}" for s in kept))
        if used_scalars:
            lines.append("; ".join(f"{sc.name} = {_fmt(sc.value)}" for sc in used_scalars))
        if self.ranges:
            lines.append(
                "for " + ", ".join(f"{i} < {s.root().name}" for i, s in self.ranges.items())
            )
        for name, lhs, rhs in self.statements:
            target = f"{name}[{', '.join(lhs)}]" if lhs else name  # `loss = ...`: one number
            lines.append(f"{target} = {p.top(rhs)}")
        self.notes(root, leaves)
        return Translation(
            formula="\n".join(lines),
            name=default_name(self.t.path, self.taken | {s.name for s in kept}),
            path=self.t.path,
            inputs=[self.leaf_names[id(leaf)] for leaf in leaves],
            output=out_name,
            sizes={s.name: s.value for s in kept},
            scalars={sc.name: sc.value for sc in used_scalars},
            position=self.t.pos(self.node),
            notes=list(dict.fromkeys(self.t.notes)),
        )

    def split_inputs(self, leaves: list[Leaf]) -> dict[int, list[Dim]]:
        """The inputs' declared shapes: an input every read of which sees a dimension as
        (groups, per group), `x[b, g * per + c]`, is declared so, `x[b, groups, per]` (the
        same memory), and read at `x[b, g, c]`: no shifted read, sizes that always agree."""
        reads: dict[int, list[EAcc]] = {}
        for _, _, e in self.statements:
            for x in _walk(e):
                if isinstance(x, EAcc) and isinstance(x.tensor, Leaf):
                    reads.setdefault(id(x.tensor), []).append(x)
        out: dict[int, list[Dim]] = {}
        for leaf in leaves:
            dims = list(leaf.dims)
            out[id(leaf)] = dims
            accs = reads.get(id(leaf), [])
            sized = [p for p, d in enumerate(dims) if d is not None]
            for q in reversed(range(len(sized))):
                subs = [a.idx[q] for a in accs]
                if not subs or not all(isinstance(x, _SplitSub) for x in subs):
                    continue
                first = subs[0].dims
                if any(
                    x.dims[0].root() is not first[0].root()
                    or x.dims[1].root() is not first[1].root()
                    for x in subs
                ):
                    continue
                p = sized[q]
                dims[p : p + 1] = list(first)
                for a in accs:
                    a.idx[q : q + 1] = list(a.idx[q].parts)
                self.t.notes.append(
                    f"`{self.leaf_names[id(leaf)]}` is declared with its dimension {p} as "
                    f"({first[0].root().name}, {first[1].root().name}): the same memory"
                )
        return out

    def notes(self, root: Val, leaves: list[Leaf]) -> None:
        dropped = [leaf for leaf in leaves if any(d is None for d in leaf.dims)]
        if any(d is None for d in root.dims) or dropped:
            what = [f"`{self.leaf_names[id(leaf)]}` {_shape(leaf.dims)}" for leaf in dropped]
            if any(d is None for d in root.dims):
                what.append(f"the result {_shape(root.dims)}")
            self.t.notes.append(
                f"size-1 dimensions are left out of {', '.join(what)} (the same memory)"
            )
        if root.dtype == "int":
            self.t.notes.append("torch's indices are int64; the kernel writes int (int32)")
        for leaf in leaves:
            name = self.leaf_names[id(leaf)]
            if leaf.dtype == "bool":
                self.t.notes.append(
                    f"`{name}` is a boolean mask; the kernel reads it as int (nonzero is true): "
                    f"pass `{name}.int()`"
                )
            elif leaf.dtype == "int" and leaf.gathers:
                self.t.notes.append(
                    f"`{name}` holds indices (int64 in torch); the kernel reads int (int32): "
                    f"pass `{name}.int()`, with values in range as the spec says"
                )


_TEMP_NAMES = {"sum": "s", "mean": "avg", "max": "mx", "min": "mn", "prod": "pr"}


def _shape(dims: list[Dim]) -> str:
    return "(" + ", ".join(str(d.value) if d is not None else "1" for d in dims) + ")"


def _walk(e):
    yield e
    if isinstance(e, ENeg):
        yield from _walk(e.x)
    elif isinstance(e, EBin | ECmp):
        yield from _walk(e.left)
        yield from _walk(e.right)
    elif isinstance(e, ECall):
        for a in e.args:
            yield from _walk(a)
    elif isinstance(e, ERed):
        yield from _walk(e.body)


def _fmt(v: float) -> str:
    v = float(v)
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


class _Printer:
    """Expressions as the notation's text, with the parentheses its grammar needs: a reduction is
    parenthesized unless it is a whole right-hand side, and its body is a product of factors."""

    def __init__(self, leaf_names: dict[int, str]):
        self.leaf_names = leaf_names

    def top(self, e) -> str:
        return self.text(e)[0]

    def at(self, e, need: int) -> str:
        text, prec = self.text(e)
        return text if prec >= need else f"({text})"

    def text(self, e) -> tuple[str, int]:
        if isinstance(e, ENum):
            if e.value < 0:
                return "-" + _fmt(-e.value), 3
            return _fmt(e.value), 5
        if isinstance(e, ERef):
            r = e.ref
            if isinstance(r, Sym):
                return r.root().name, 5
            if isinstance(r, Scalar):
                return r.name, 5
            if _IDENT.fullmatch(str(r)) or str(r).isdigit():
                return str(r), 5
            return f"({r})", 5  # a shifted index as a value
        if isinstance(e, EAcc):
            t = e.tensor
            name = self.leaf_names[id(t)] if isinstance(t, Leaf) else t.name
            return f"{name}[{', '.join(e.idx)}]", 5
        if isinstance(e, ENeg):
            return "-" + self.at(e.x, 3), 3
        if isinstance(e, EBin):
            if e.op in "+-":
                return f"{self.at(e.left, 1)} {e.op} {self.at(e.right, 2)}", 1
            if e.op in ("*", "/"):
                return f"{self.at(e.left, 2)} {e.op} {self.at(e.right, 3)}", 2
            return f"{self.at(e.left, 5)} ** {self.at(e.right, 3)}", 4
        if isinstance(e, ECmp):
            return f"{self.at(e.left, 1)} {e.op} {self.at(e.right, 1)}", 0
        if isinstance(e, ECall):
            return f"{e.func}({', '.join(self.at(a, -1) for a in e.args)})", 5
        if isinstance(e, ERed):
            return f"{e.op}({', '.join(e.idx)}) {self.body(e.body)}", -1
        raise AssertionError(e)

    def body(self, e) -> str:
        if isinstance(e, EBin) and e.op in ("*", "/"):
            return f"{self.body(e.left)} {e.op} {self.at(e.right, 3)}"
        text, prec = self.text(e)
        return text if prec >= 4 and not text.startswith("-") else f"({text})"
