"""The small expression language of specs: integer and float arithmetic over size variables,
scalar arguments and integer template parameters, with C's integer division.

Parsed with Python's `ast` and evaluated by walking an allow-listed subset of it, so a spec can
never run code.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

Number = int | float

# C literal suffixes (2.5f, 1u, 10ull) are blanked rather than cut so columns stay true.
_SUFFIX = re.compile(r"(?<=[0-9.])([fF]|[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")


class ExprError(ValueError):
    """A bad expression; `column` is the 0-based offset of the problem within the expression."""

    def __init__(self, message: str, column: int = 0):
        super().__init__(message)
        self.column = column


def _cdiv(a: Number, b: Number) -> Number:
    return -(-a // b)


FUNCTIONS = {"cdiv": _cdiv, "min": min, "max": max}


def _div(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)  # C truncates toward zero
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _mod(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int):
        return a - _div(a, b) * b
    return a % b


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.FloorDiv: _div,
    ast.Mod: _mod,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.Pow: operator.pow,
}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}


@dataclass(frozen=True)
class Expr:
    text: str
    tree: ast.expr

    @classmethod
    def parse(cls, text: str) -> Expr:
        cleaned = _SUFFIX.sub(lambda m: " " * len(m.group(0)), text)
        if not cleaned.strip():
            raise ExprError("expected an expression", 0)
        try:
            tree = ast.parse(cleaned.strip(), mode="eval").body
        except SyntaxError as e:
            lead = len(cleaned) - len(cleaned.lstrip())
            col = max(0, (e.offset or 1) - 1) + lead
            raise ExprError(f"cannot read `{text.strip()}` as an expression", col) from None
        lead = len(cleaned) - len(cleaned.lstrip())
        expr = cls(text, tree)
        expr._check(tree, lead)
        return expr

    def _check(self, node: ast.AST, lead: int) -> None:
        col = getattr(node, "col_offset", 0) + lead
        match node:
            case ast.Constant(value=v) if isinstance(v, (int, float)) and not isinstance(v, bool):
                pass
            case ast.Name():
                pass
            case ast.BinOp(op=op, left=left, right=right) if type(op) in _BINOPS:
                self._check(left, lead)
                self._check(right, lead)
            case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNOPS:
                self._check(operand, lead)
            case ast.Call(func=ast.Name(id=fname), args=args, keywords=[]) if fname in FUNCTIONS:
                for a in args:
                    self._check(a, lead)
            case ast.Call(func=ast.Name(id=fname)):
                known = ", ".join(FUNCTIONS)
                raise ExprError(f"unknown function `{fname}`; known: {known}", col)
            case ast.Tuple(elts=elts) if 1 <= len(elts) <= 3:
                for e in elts:
                    self._check(e, lead)
            case _:
                snippet = ast.get_source_segment(self.text.strip(), node) or self.text.strip()
                raise ExprError(f"`{snippet}` is not allowed in a spec expression", col)

    @property
    def is_tuple(self) -> bool:
        return isinstance(self.tree, ast.Tuple)

    def names(self) -> set[str]:
        return {
            n.id
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Name) and not _is_callee(self.tree, n)
        }

    def evaluate(self, env: dict[str, Number]) -> Number | tuple[Number, ...]:
        return _eval(self.tree, env)

    def __str__(self) -> str:
        return self.text.strip()


def _is_callee(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _eval(node: ast.AST, env: dict[str, Number]):
    match node:
        case ast.Constant(value=v):
            return v
        case ast.Name(id=name):
            if name not in env:
                raise ExprError(
                    f"`{name}` is not a size variable, scalar argument or template value"
                )
            return env[name]
        case ast.BinOp(op=op, left=left, right=right):
            a, b = _eval(left, env), _eval(right, env)
            try:
                return _BINOPS[type(op)](a, b)
            except ZeroDivisionError:
                raise ExprError("division by zero") from None
            except TypeError:
                raise ExprError("bit operations need integers") from None
        case ast.UnaryOp(op=op, operand=operand):
            return _UNOPS[type(op)](_eval(operand, env))
        case ast.Call(func=ast.Name(id=fname), args=args):
            try:
                return FUNCTIONS[fname](*(_eval(a, env) for a in args))
            except TypeError:
                raise ExprError(
                    f"`{fname}` takes {'two' if fname == 'cdiv' else 'two or more'} arguments"
                ) from None
            except ZeroDivisionError:
                raise ExprError("division by zero") from None
        case ast.Tuple(elts=elts):
            return tuple(_eval(e, env) for e in elts)
    raise ExprError("unsupported expression")
