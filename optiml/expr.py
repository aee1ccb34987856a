"""The small expression language of specs: integer and float arithmetic over size variables,
scalar arguments and integer template parameters, with C's integer division.

Parsed with Python's `ast` and evaluated by walking an allow-listed subset of it, so a spec can
never run code. It is also bounded, so that no text can make it fail with anything but an
`ExprError` or make it run long: an expression has at most `MAX_LENGTH` characters of ASCII and
`MAX_DEPTH` levels of nesting, and every value it computes is a C value — an integer that fits in
64 bits (signed) or a finite double. `**` and shifts are checked before they are computed, so
`10**10**10` fails at once instead of computing a number of ten billion digits.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import threading
import warnings
from dataclasses import dataclass

from optiml.errors import quote

Number = int | float

MAX_LENGTH = 2000  # characters of one expression
MAX_DEPTH = 64  # operations, calls and parentheses inside one another
MAX_DIGITS = 100  # a run of digits; an int64 has at most 19, and a double's exponent does the rest
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
SHIFT_BITS = 64  # a shift count must be below this

ALLOWED = (
    "numbers, size variables, scalar arguments, template values, the file's constants and "
    "macros, device values in a launch, + - * / % ** << >> & | ^ ~, parentheses, cdiv(a, b), "
    "min(a, b, ...), max(a, b, ...)"
)
TOO_LARGE = "too large: the value must fit in 64 bits"

# C literal suffixes (2.5f, 1u, 10ull, 0x1fu) are blanked rather than cut so columns stay true.
# A number is matched whole, so that a hex digit (`0x1f`) or a name (`n2f`) keeps its last letter.
_SUFFIX = re.compile(
    r"(?<![\w.])(?:0[xX][0-9a-fA-F]+(?P<int>[uU][lL]{0,2}|[lL]{1,2}[uU]?)"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?P<any>[fF]|[uU][lL]{0,2}|[lL]{1,2}[uU]?))\b"
)
_DIGITS = re.compile(r"[0-9]+")
# Values of the GPU a kernel runs on, for launch expressions only (optiml.harness.device resolves
# them); said where one is used elsewhere.
DEVICE_ONLY = {
    name: f" (`{name}` is a device value: only `launch:` may use it)"
    for name in ("sm_count", "max_threads_per_sm")
}
_QUIET = threading.Lock()


class ExprError(ValueError):
    """A bad expression; `column` is the 0-based offset of the problem within the expression."""

    def __init__(self, message: str, column: int = 0):
        super().__init__(message)
        self.column = column


# name -> (the fewest arguments, the most or None, how it is written)
FUNCTIONS: dict[str, tuple[int, int | None, str]] = {
    "cdiv": (2, 2, "cdiv(a, b)"),
    "min": (2, None, "min(a, b, ...)"),
    "max": (2, None, "max(a, b, ...)"),
}

_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.Pow: "**",
}
_UNOPS = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
_BIT_OPS = {
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}


def _quote(text: str) -> str:
    """`text` for a message: a long expression is cut, so that an error stays one short line."""
    return quote(text, 40)


def _check_text(text: str) -> None:
    """What must be refused before Python's parser sees the text: it is too long, it has
    characters a C expression cannot have (Python would read some Unicode digits and letters as
    others), a number too long to be a C value, or brackets nested too deeply."""
    if len(text) > MAX_LENGTH:
        raise ExprError(
            f"the expression is {len(text)} characters long; at most {MAX_LENGTH}", MAX_LENGTH
        )
    for i, c in enumerate(text):
        if ord(c) > 126:
            raise ExprError(
                f"`{quote(c)}` (U+{ord(c):04X}) is not allowed in an expression; "
                "use ASCII digits, names and operators",
                i,
            )
        if ord(c) < 32 and c not in "\t\n\r":
            raise ExprError(f"control character U+{ord(c):04X} is not allowed in an expression", i)
    for m in _DIGITS.finditer(text):
        if len(m.group()) > MAX_DIGITS:
            raise ExprError(f"a number of {len(m.group())} digits is {TOO_LARGE}", m.start())
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ExprError(
                    f"brackets are nested more than {MAX_DEPTH} deep; simplify the expression", i
                )
        elif c in ")]}":
            depth -= 1


@dataclass(frozen=True)
class Expr:
    text: str
    tree: ast.expr
    lead: int = 0  # the leading blanks of `text`, which the tree's columns do not count

    @classmethod
    def parse(cls, text: str, *, tuple_max: int | None = 3) -> Expr:
        """The expression in `text`; `ExprError` at the column of the first thing wrong. A whole
        value may be a tuple of up to `tuple_max` values (None: any number, as the values of a
        size of several variables)."""
        _check_text(text)
        cleaned = _SUFFIX.sub(lambda m: _blank_suffix(m), text)
        if not cleaned.strip():
            raise ExprError("expected an expression", 0)
        lead = len(cleaned) - len(cleaned.lstrip())
        body = cleaned.strip()
        try:
            # `5(3)` or `1if` make Python's parser warn on stderr; the allow-list refuses them
            # anyway. The warning filters are global, so two threads must not swap them at once.
            with _QUIET, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(body, mode="eval").body
        except SyntaxError as e:
            col = _offset_in(body, e.lineno or 1, max(0, (e.offset or 1) - 1)) + lead
            raise ExprError(f"cannot read `{_quote(text)}` as an expression", col) from None
        except (ValueError, RecursionError, MemoryError, OverflowError):
            raise ExprError(f"cannot read `{_quote(text)}` as an expression", lead) from None
        expr = cls(text, tree, lead)
        expr._check_depth()
        expr._check(tree, top=True, tuple_max=tuple_max)
        return expr

    # -- checks of the tree --

    def at(self, node: ast.AST) -> int:
        """The 0-based column of `node` in `self.text`."""
        body = self.text.strip()
        col = _offset_in(body, getattr(node, "lineno", 1), getattr(node, "col_offset", 0))
        return min(col + self.lead, max(len(self.text) - 1, 0))

    def snippet(self, node: ast.AST) -> str:
        return _quote(ast.get_source_segment(self.text.strip(), node) or self.text)

    def _check_depth(self) -> None:
        """Nesting is bounded before anything walks the tree recursively: `a + b + ...` nests one
        level per operator, and Python's own recursion limit is not an error a user should see."""
        stack: list[tuple[ast.AST, int]] = [(self.tree, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise ExprError(
                    f"the expression nests more than {MAX_DEPTH} operations, calls or parentheses "
                    "inside one another (a chain like `a + b + c` counts one per operator); "
                    "simplify it",
                    self.at(node),
                )
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))

    def _check(self, node: ast.AST, top: bool = False, tuple_max: int | None = 3) -> None:
        col = self.at(node)
        match node:
            case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int(v))) if type(v) is int:
                # -9223372036854775808 is the smallest int64 although its digits alone are not
                _checked(-v, lambda: f"`{self.snippet(node)}` is", col)
            case ast.Constant(value=v) if type(v) in (int, float):
                _checked(v, lambda: f"`{self.snippet(node)}` is", col)
            case ast.Name():
                pass
            case ast.BinOp(op=op, left=left, right=right) if type(op) in _BINOPS:
                self._check(left)
                self._check(right)
            case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNOPS:
                self._check(operand)
            case ast.Call(func=ast.Name(id=fname), args=args, keywords=keywords) if (
                fname in FUNCTIONS
            ):
                fewest, most, usage = FUNCTIONS[fname]
                if keywords or len(args) < fewest or (most is not None and len(args) > most):
                    count = "two arguments" if most == 2 else "two or more arguments"
                    raise ExprError(f"`{fname}` takes {count}: {usage}", col)
                for a in args:
                    self._check(a)
            case ast.Call(func=ast.Name(id=fname)):
                known = ", ".join(usage for _, _, usage in FUNCTIONS.values())
                raise ExprError(f"unknown function `{_quote(fname)}`; known: {known}", col)
            case ast.Tuple(elts=elts) if top and 1 <= len(elts) <= (tuple_max or len(elts)):
                for e in elts:
                    self._check(e)
            case ast.Tuple(elts=elts) if top:
                raise ExprError(
                    f"a tuple here has one to {tuple_max} values, like (x, y, z); this one has "
                    f"{len(elts)}",
                    col,
                )
            case ast.Tuple():
                raise ExprError(
                    f"a tuple (`{self.snippet(node)}`) can only be the whole value (grid and "
                    "block dimensions, a size of several variables), not part of an operation "
                    "or a call",
                    col,
                )
            case _:
                raise ExprError(
                    f"`{self.snippet(node)}` is not allowed in a spec expression; "
                    f"allowed: {ALLOWED}",
                    col,
                )

    # -- queries --

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.tree, ast.Tuple)

    def names(self) -> set[str]:
        callees = {id(n.func) for n in ast.walk(self.tree) if isinstance(n, ast.Call)}
        return {
            n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and id(n) not in callees
        }

    def evaluate(self, env: dict[str, Number]) -> Number | tuple[Number, ...]:
        """The value for `env` (size variables, scalars, template values); `ExprError` where a
        value is missing, divides by zero or leaves what a C integer or double can hold."""
        return _Evaluation(self, env).value(self.tree)

    def __str__(self) -> str:
        return self.text.strip()


def _blank_suffix(m: re.Match) -> str:
    group = "int" if m.group("int") is not None else "any"
    start, end = m.start(group) - m.start(), m.end(group) - m.start()
    whole = m.group(0)
    return whole[:start] + " " * (end - start) + whole[end:]


def _offset_in(text: str, lineno: int, col: int) -> int:
    """The character offset of (1-based line, 0-based column) in `text`."""
    lines = text.split("\n")
    line = min(max(lineno, 1), len(lines)) - 1
    return sum(len(x) + 1 for x in lines[:line]) + min(max(col, 0), len(lines[line]))


def _checked(value: object, what, col: int) -> Number:
    """`value` if it is a C value (an integer in 64 bits, a finite double); `what()` names the
    expression in the message otherwise."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return value
        raise ExprError(f"{what()} {TOO_LARGE}", col)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if math.isnan(value):
            raise ExprError(f"{what()} not a number (NaN)", col)
        raise ExprError(f"{what()} too large for a double (it overflows to infinity)", col)
    raise ExprError(f"{what()} not a real number", col)


class _Evaluation:
    """One evaluation of an expression in an environment; every step's value is checked."""

    def __init__(self, expr: Expr, env: dict[str, Number]):
        self.expr = expr
        self.env = env

    def fail(self, message: str, node: ast.AST) -> ExprError:
        return ExprError(message, self.expr.at(node))

    def value(self, node: ast.AST):
        match node:
            case ast.Tuple(elts=elts):
                return tuple(self.value(e) for e in elts)
            case ast.Constant(value=v):
                return v
            case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int(v))) if type(v) is int:
                return -v
            case ast.Name(id=name):
                if name not in self.env:
                    raise self.fail(
                        f"`{name}` is not a size variable, scalar argument, template value or "
                        "constant of the file" + DEVICE_ONLY.get(name, ""),
                        node,
                    )
                result = self.env[name]
            case ast.BinOp(op=op, left=left, right=right):
                a, b = self.value(left), self.value(right)
                try:
                    result = self.binop(op, a, b, node)
                except OverflowError:
                    raise self.fail(f"`{self.expr.snippet(node)}` is too large", node) from None
            case ast.UnaryOp(op=op, operand=operand):
                result = self.unop(op, self.value(operand), node)
            case ast.Call(func=ast.Name(id=fname), args=args):
                result = self.call(fname, [self.value(a) for a in args], node)
            case _:
                raise self.fail(f"`{self.expr.snippet(node)}` cannot be evaluated", node)
        return _checked(result, lambda: f"`{self.expr.snippet(node)}` is", self.expr.at(node))

    def binop(self, op: ast.operator, a, b, node: ast.AST):
        symbol = _BINOPS.get(type(op), "?")
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            raise self.fail(f"`{symbol}` needs numbers", node)
        match op:
            case ast.Add():
                return a + b
            case ast.Sub():
                return a - b
            case ast.Mult():
                return a * b
            case ast.Div() | ast.FloorDiv():
                return _div(a, self.nonzero(b, node))
            case ast.Mod():
                return _mod(a, self.nonzero(b, node))
            case ast.Pow():
                return self.power(a, b, node)
            case ast.LShift() | ast.RShift():
                self.integers(symbol, a, b, node)
                if b < 0:
                    raise self.fail(f"`{self.expr.snippet(node)}` shifts by a negative count", node)
                if b >= SHIFT_BITS:
                    raise self.fail(
                        f"`{self.expr.snippet(node)}` shifts by {b}: the count must be below "
                        f"{SHIFT_BITS}, as the value must fit in 64 bits",
                        node,
                    )
                return a << b if isinstance(op, ast.LShift) else a >> b
            case _ if type(op) in _BIT_OPS:
                self.integers(symbol, a, b, node)
                return _BIT_OPS[type(op)](a, b)
        raise self.fail(f"`{symbol}` is not allowed; allowed: {ALLOWED}", node)

    def unop(self, op: ast.unaryop, a, node: ast.AST):
        if not isinstance(a, int | float):
            raise self.fail(f"`{_UNOPS.get(type(op), '?')}` needs a number", node)
        match op:
            case ast.USub():
                return -a
            case ast.UAdd():
                return a
            case ast.Invert():
                if not isinstance(a, int):
                    raise self.fail(f"`~` needs an integer, got {a!r}", node)
                return ~a
        raise self.fail(f"this operator is not allowed; allowed: {ALLOWED}", node)

    def call(self, fname: str, args: list, node: ast.AST):
        if fname not in FUNCTIONS:
            raise self.fail(f"unknown function `{_quote(fname)}`", node)
        fewest, most, usage = FUNCTIONS[fname]
        if len(args) < fewest or (most is not None and len(args) > most):
            raise self.fail(f"`{fname}` is written {usage}", node)
        if not all(isinstance(a, int | float) for a in args):
            raise self.fail(f"`{fname}` takes numbers: {usage}", node)
        if fname == "cdiv":
            a, b = args
            return -_floor_div(-a, self.nonzero(b, node))
        return min(args) if fname == "min" else max(args)

    def nonzero(self, b: Number, node: ast.AST) -> Number:
        if b == 0:
            raise self.fail(f"`{self.expr.snippet(node)}` divides by zero", node)
        return b

    def integers(self, symbol: str, a: Number, b: Number, node: ast.AST) -> None:
        if not isinstance(a, int) or not isinstance(b, int):
            raise self.fail(
                f"`{symbol}` needs integers: `{self.expr.snippet(node)}` has a float operand",
                node,
            )

    def power(self, a: Number, b: Number, node: ast.AST) -> Number:
        """`a ** b`, refused before it is computed where the result cannot fit in 64 bits: an
        integer of at least 2 ** k to a power of p is at least 2 ** (k * p)."""
        if isinstance(a, int) and isinstance(b, int) and b >= 0:
            if abs(a) >= 2 and (abs(a).bit_length() - 1) * b >= 64:
                raise self.fail(f"`{self.expr.snippet(node)}` is {TOO_LARGE}", node)
            return a**b
        try:
            return a**b
        except ZeroDivisionError:
            raise self.fail(
                f"`{self.expr.snippet(node)}` raises zero to a negative power", node
            ) from None
        except OverflowError:
            raise self.fail(
                f"`{self.expr.snippet(node)}` is too large for a double", node
            ) from None


def _floor_div(a: Number, b: Number) -> Number:
    return a // b


def _div(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)  # C truncates toward zero
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _mod(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        return a - _div(a, b) * b
    return a % b
