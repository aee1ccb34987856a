"""The formula notation's grammar (lark, Earley) and the transformer to the plain data of
`optiml.generate.model`. docs/generate.md describes the notation."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lark import (
    Lark,
    Token,
    Transformer,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    v_args,
)
from lark.tree import Meta

from optiml.errors import FormulaError, Position, quote
from optiml.generate.model import (
    Access,
    Binary,
    Call,
    Formula,
    Index,
    Name,
    Num,
    Pos,
    Range,
    Reduce,
    Setting,
    Statement,
    TensorDecl,
    Unary,
)

MAX_FORMULA = 10_000  # characters

GRAMMAR = r"""
start: _SEP? (_item (_SEP _item)* _SEP?)?

_item: decls | statement | setting | ranges

decls: NAME _decl ("," _decl)*
_decl: tensor_decl | scalar_decl
tensor_decl: NAME "[" dim ("," dim)* "]"
scalar_decl: NAME "=" value
setting: NAME "=" value
ranges: "for" range ("," range)*
statement: (_FOR range ("," range)* ":")? access "=" expr trailer*
trailer: "for" range ("," range)*                  -> trailing_ranges
       | "with" setting ("," setting)*           -> trailing_settings
_FOR: "for"
range: NAME "<" dim
dim: NAME | NUMBER

access: NAME "[" sub ("," sub)* "]"
index: NAME
sub: _affine
   | "(" _affine ")" "/" sfactor -> divided
   | access -> gathered
_affine: sterm (ADDOP sterm)* | MINUS sterm (ADDOP sterm)*
sterm: sfactor ("*" sfactor)*
sfactor: NAME | NUMBER
MINUS: "-"

?value: sum | value SHIFT sum -> shift

?expr: sum | sum CMP sum -> compare
?sum: product | sum ADDOP product -> binary
?product: factors | factors_red
?factors: unary | factors MULOP unary -> binary
?factors_red: reduction | factors MULOP reduction -> binary
?unary: power | "-" unary -> neg | "+" unary
?power: atom | atom "**" unary -> pow
?atom: NUMBER -> number
     | NAME -> name
     | access
     | call
     | "(" expr ")"
call: NAME "(" expr ("," expr)* ")"
reduction: NAME "(" index ("," index)* ")" _rbody
_rbody: rfactors | rfactors_red
?rfactors: power | rfactors MULOP unary -> binary
?rfactors_red: reduction | rfactors MULOP reduction -> binary

CMP: "<=" | ">=" | "==" | "!=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
SHIFT: "<<" | ">>"
NAME: /(?!(?:for|with)\b)[A-Za-z_][A-Za-z0-9_]*/
NUMBER: /(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?/
_SEP: /(?:[;\n][ \t\r\f]*(?:\/\/[^\n]*)?)+/
COMMENT: /\/\/[^\n]*/
%ignore /[ \t\r\f]+/
%ignore /\\\n/
%ignore COMMENT
"""

READABLE = {
    "NAME": "a name",
    "NUMBER": "a number",
    "_SEP": "`;` or a new line",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "LPAR": "`(`",
    "RPAR": "`)`",
    "COMMA": "`,`",
    "EQUAL": "`=`",
    "LESSTHAN": "`<`",
    "COLON": "`:`",
    "CMP": "a comparison",
    "ADDOP": "`+` or `-`",
    "MULOP": "`*` or `/`",
    "MINUS": "`-`",
    "PLUS": "`+`",
    "SHIFT": "`<<`",
    "FOR": "`for`",
    "_FOR": "`for`",
    "WITH": "`with`",
    "__ANON_0": "`**`",
}


@dataclass(frozen=True)
class FormulaSource:
    """The formula's text and where it came from: a path (`<formula>` for the command line) and
    the line of the file its first line is, so that positions are the file's."""

    text: str
    path: str = "<formula>"
    first_line: int = 1

    def position(self, pos: Pos | None) -> Position:
        if pos is None:
            return Position(self.path, self.first_line, 1)
        return Position(self.path, pos.line + self.first_line - 1, pos.column)

    def error(self, message: str, pos: Pos | None) -> FormulaError:
        return FormulaError(message, self.position(pos))


@functools.cache
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="earley", propagate_positions=True, maybe_placeholders=False)


def _pos(x: Token | Meta) -> Pos:
    return Pos(x.line, x.column)


class _Build(Transformer):
    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.lines = text.split("\n")

    def _slice(self, meta: Meta) -> str:
        return self.text[meta.start_pos : meta.end_pos]

    # -- declarations and settings --

    def start(self, items):
        f = Formula(self.text)
        for item in items:
            kind, value = item
            if kind == "decls":
                for d in value:
                    (f.tensors if isinstance(d, TensorDecl) else f.settings).append(d)
            elif kind == "statement":
                stmt, ranges, settings = value
                f.statements.append(stmt)
                f.ranges += ranges
                f.settings += settings
            elif kind == "setting":
                f.settings.append(value)
            elif kind == "ranges":
                f.ranges += value
        return f

    def decls(self, items):
        dtype, *decls = items
        for d in decls:
            d.dtype = str(dtype)
            d.dtype_pos = _pos(dtype)
        return ("decls", decls)

    def tensor_decl(self, items):
        name, *dims = items
        return TensorDecl(str(name), "", dims, _pos(name), _pos(name))

    def dim(self, items):
        (tok,) = items
        return (str(tok), _pos(tok))

    def scalar_decl(self, items):
        name, value = items
        return Setting(str(name), value[0], _pos(name), value[1])

    def setting(self, items):
        name, value = items
        return ("setting", Setting(str(name), value[0], _pos(name), value[1]))

    def scalar_statement(self, items):  # `loss = mean(i) ...`: a result of one number
        name, rhs = items
        target = Access(str(name), [], _pos(name))
        return ("statement", (Statement(target, rhs, target.pos), [], []))

    def ranges(self, items):
        return ("ranges", items)

    def range(self, items):
        name, (bound, _) = items
        return Range(str(name), bound, _pos(name))

    def trailing_ranges(self, items):
        return ("ranges", items)

    def trailing_settings(self, items):
        return ("settings", [s for _, s in items])

    def statement(self, items):
        ranges: list[Range] = []
        settings: list[Setting] = []
        rest = []
        for it in items:
            if isinstance(it, Range):
                ranges.append(it)
            elif isinstance(it, tuple) and it[0] == "ranges":
                ranges += it[1]
            elif isinstance(it, tuple) and it[0] == "settings":
                settings += it[1]
            else:
                rest.append(it)
        target, rhs = rest
        return ("statement", (Statement(target, rhs, target.pos), ranges, settings))

    # -- values: their text, for optiml.expr --

    def __default__(self, data, children, meta):  # `value` rules are inlined; see _value
        raise AssertionError(f"unhandled rule {data}")

    # -- expressions --

    def access(self, items):
        name, *indices = items
        return Access(str(name), indices, _pos(name))

    def index(self, items):
        (tok,) = items
        return Index(str(tok), _pos(tok))

    @v_args(meta=True)
    def sub(self, meta, items):
        terms, sign = [], 1
        for it in items:
            if isinstance(it, Token) and it.type in ("ADDOP", "MINUS"):
                sign = -1 if str(it) == "-" else 1
            else:
                terms.append((sign, it))
                sign = 1
        if len(terms) == 1 and terms[0][0] == 1 and len(terms[0][1]) == 1:
            only = terms[0][1][0]
            if not only[0].isdigit() and only != "inf":
                return Index(only, Pos(meta.line, meta.column))
        return Index(self._slice(meta).strip(), Pos(meta.line, meta.column), terms)

    @v_args(meta=True)
    def divided(self, meta, items):
        *affine, divisor = items
        inner = self.sub(meta, affine)
        terms = inner.terms if inner.terms is not None else [(1, [inner.name])]
        return Index(self._slice(meta).strip(), Pos(meta.line, meta.column), terms, divisor)

    @v_args(meta=True)
    def gathered(self, meta, items):
        (inner,) = items
        return Index(self._slice(meta).strip(), Pos(meta.line, meta.column), gather=inner)

    def sterm(self, items):
        return list(items)

    def sfactor(self, items):
        (tok,) = items
        return str(tok)

    def number(self, items):
        (tok,) = items
        text = str(tok)
        return Num(float(text.rstrip("fF")), text, _pos(tok))

    def name(self, items):
        (tok,) = items
        if str(tok) == "inf":  # infinity, e.g. the padding of a max pooling, pad(x[...], -inf)
            return Num(float("inf"), "inf", _pos(tok))
        return Name(str(tok), _pos(tok))

    def binary(self, items):
        left, op, right = items
        return Binary(str(op), left, right, _pos(op))

    def compare(self, items):
        left, op, right = items
        return Binary(str(op), left, right, _pos(op))

    def shift(self, items):
        left, op, right = items
        return Binary(str(op), left, right, _pos(op))

    def neg(self, items):
        (operand,) = items
        return Unary("-", operand, _node_pos(operand))

    def unary(self, items):  # unary plus
        return items[0]

    def pow(self, items):
        left, right = items
        return Binary("**", left, right, _node_pos(left))

    def call(self, items):
        name, *args = items
        return Call(str(name), args, _pos(name))

    def reduction(self, items):
        name, *rest = items
        body = rest[-1]
        indices = rest[:-1]
        return Reduce(str(name), indices, body, _pos(name))


def _node_pos(node) -> Pos:
    return node.pos


def _with_values(tree, text: str):
    """Replace each setting's value subtree by (its text, its position) before transforming."""
    from lark import Tree

    for t in tree.children:  # a top-level `name = EXPR` that reads a tensor: a 0-d result
        if (
            isinstance(t, Tree)
            and t.data == "setting"
            and isinstance(t.children[1], Tree)
            and any(s.data in ("access", "reduction") for s in t.children[1].iter_subtrees())
        ):
            t.data = "scalar_statement"
    for t in tree.iter_subtrees():
        if t.data in ("setting", "scalar_decl"):
            name, value = t.children
            if isinstance(value, Tree):
                meta = value.meta
                t.children[1] = (text[meta.start_pos : meta.end_pos], Pos(meta.line, meta.column))
            else:  # a single token
                t.children[1] = (str(value), _pos(value))
    return tree


def parse(source: FormulaSource) -> Formula:
    """The formula as plain data; `FormulaError` at the first thing that cannot be read."""
    text = source.text
    if len(text) > MAX_FORMULA:
        raise source.error(f"the formula has {len(text)} characters; at most {MAX_FORMULA}", None)
    for i, c in enumerate(text):
        if ord(c) > 126 or (ord(c) < 32 and c not in "\t\n\r\f"):
            line = text.count("\n", 0, i) + 1
            col = i - (text.rfind("\n", 0, i) + 1) + 1
            raise source.error(
                f"`{quote(c)}` (U+{ord(c):04X}) cannot be part of a formula; write it in ASCII "
                "(names, numbers, + - * / ** ( ) [ ] , ; = <)",
                Pos(line, col),
            )
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        at = Pos(e.line, e.column) if getattr(e, "line", -1) > 0 else _end(text)
        raise source.error(_syntax_message(e, text), at) from None
    tree = _with_values(tree, text)
    formula = _Build(text).transform(tree)
    if not formula.statements:
        raise source.error(
            "the formula has no statement; write one like `y[i] = max(x[i], 0)`", None
        )
    return formula


def _end(text: str) -> Pos:
    body = text.rstrip()
    lines = body.split("\n")
    return Pos(len(lines), len(lines[-1]) + 1)


def _syntax_message(e: UnexpectedInput, text: str) -> str:
    if isinstance(e, UnexpectedEOF) or (e.line == -1):
        expected = getattr(e, "expected", None) or []
        return "the formula ends too early" + _expected(expected)
    if isinstance(e, UnexpectedCharacters):
        got = text[e.pos_in_stream : e.pos_in_stream + 1]
        got = "the end of the line" if got == "\n" else f"`{quote(got)}`"
        return f"cannot read the formula here: unexpected {got}" + _expected(e.allowed or [])
    return "cannot read the formula here"


def _expected(names) -> str:
    words = sorted({READABLE.get(n, f"`{n}`") for n in names})
    if not words:
        return ""
    if len(words) > 6:
        words = words[:6] + ["…"]
    return "; expected " + ", ".join(words)
