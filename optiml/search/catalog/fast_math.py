"""Faster single-precision math written into the kernel's text, only as far as the spec's tolerance
allows: every float division becomes `__fdividef` (a reciprocal and a multiply, ~2 ulp, where IEEE
division is a sequence with a slow path) when the relative tolerance is at least 1e-5; and, when it
is at least 1e-4, the float math calls become the hardware's approximations (`expf` -> `__expf`,
`logf` -> `__logf`, ...; errors up to ~1e-6 relative on reduced ranges) as well. The checks decide
in the end.

The change is in the source, not in nvcc flags (`-prec-div=false`, `-use_fast_math`): what is
delivered is the file, and a speed that came from flags the user's build does not pass would not
reach the user (measured: KernelBench's LayerNorm ran 0.36 ms with the flags and 0.63 ms as the
delivered file was built). A division is rewritten only where both operands are known to be float,
or one float and one integer, read off literals, declarations, casts and float pointers; anything
else (double, half, a type the kernel's text does not say) is left as written."""

from __future__ import annotations

import math

from tree_sitter import Node

from optiml.cuda.kernel_ast import KernelAST, operator_of, unparen, walk
from optiml.search.catalog.base import Context, Rewrite, Transformation

# float math -> the hardware approximation (CUDA's intrinsic functions)
INTRINSICS = {
    "expf": "__expf",
    "exp10f": "__exp10f",
    "logf": "__logf",
    "log2f": "__log2f",
    "log10f": "__log10f",
    "sinf": "__sinf",
    "cosf": "__cosf",
    "tanf": "__tanf",
    "powf": "__powf",
}
# calls whose result is a float whatever their arguments
FLOAT_CALLS = frozenset(
    {
        *INTRINSICS,
        *INTRINSICS.values(),
        "sqrtf",
        "rsqrtf",
        "fabsf",
        "fminf",
        "fmaxf",
        "fmaf",
        "tanhf",
        "erff",
        "erfcf",
        "floorf",
        "ceilf",
        "truncf",
        "roundf",
        "rintf",
        "copysignf",
        "fmodf",
        "__fdividef",
        "__saturatef",
        "__int2float_rn",
        "__uint2float_rn",
    }
)
_INTS = frozenset(
    {
        "int",
        "unsigned",
        "unsigned int",
        "long",
        "long long",
        "unsigned long",
        "unsigned long long",
        "short",
        "unsigned short",
        "char",
        "unsigned char",
        "signed char",
        "size_t",
        "ptrdiff_t",
        "int8_t",
        "int16_t",
        "int32_t",
        "int64_t",
        "uint8_t",
        "uint16_t",
        "uint32_t",
        "uint64_t",
        "bool",
    }
)
_ARITH = frozenset({"+", "-", "*", "/"})


def type_class(spelling: str) -> str | None:
    """'float', 'double' or 'int' for a C type as written (qualifiers dropped); None otherwise."""
    words = [w for w in spelling.replace("*", " ").split() if w not in ("const", "volatile")]
    name = " ".join(w for w in words if w not in ("__restrict__", "register", "static"))
    if name == "float":
        return "float"
    if name in ("double", "long double"):
        return "double"
    if name in _INTS or name.replace("signed ", "") in _INTS:
        return "int"
    return None


class _Types:
    """The arithmetic type class of expressions in one kernel, from what its text declares."""

    def __init__(self, ast: KernelAST):
        self.ast = ast
        self.names: dict[str, str | None] = {}  # plain variables and parameters
        self.elements: dict[str, str | None] = {}  # pointers and arrays: their element's
        for p in ast.kernel.params:
            self._declare(p.name, type_class(p.type_text), pointer=p.is_pointer)
        for n in walk(ast.body):
            if n.type not in ("declaration", "for_statement"):
                continue
            decl = n
            if n.type == "for_statement":  # `for (int i = 0; ...)`: its own fields or a declaration
                init = n.child_by_field_name("initializer")
                decl = init if init is not None and init.type == "declaration" else n
            kind = decl.child_by_field_name("type")
            cls = type_class(ast.text(kind)) if kind is not None else None
            for d in decl.children_by_field_name("declarator"):
                name, pointer = _name_of(ast, d)
                if name is not None:
                    self._declare(name, cls, pointer)

    def _declare(self, name: str, cls: str | None, pointer: bool) -> None:
        """A name declared twice with other types, or as a value and as a pointer, is unknown."""
        table = self.elements if pointer else self.names
        other = self.names if pointer else self.elements
        if name in other or (name in table and table[name] != cls):
            self.names[name] = self.elements[name] = None
        else:
            table[name] = cls

    def of(self, node: Node) -> str | None:
        node = unparen(node)
        t = node.type
        text = self.ast.text(node)
        if t == "number_literal":
            lower = text.lower()
            if lower.startswith("0x"):
                return "int"
            if any(c in lower for c in ".e"):
                return "float" if lower.endswith("f") else "double"
            return "int"
        if t == "identifier":
            return self.names.get(text)
        if t == "subscript_expression":
            base = unparen(node.child_by_field_name("argument"))
            return self.elements.get(self.ast.text(base)) if base.type == "identifier" else None
        if t == "call_expression":
            f = node.child_by_field_name("function")
            return "float" if f is not None and self.ast.text(f) in FLOAT_CALLS else None
        if t == "cast_expression":
            kind = node.child_by_field_name("type")
            return type_class(self.ast.text(kind)) if kind is not None else None
        if t == "unary_expression" and operator_of(node) in ("-", "+"):
            return self.of(node.child_by_field_name("argument"))
        if t == "binary_expression" and operator_of(node) in _ARITH:
            return _usual(
                self.of(node.child_by_field_name("left")),
                self.of(node.child_by_field_name("right")),
            )
        if t == "conditional_expression":
            return _usual(
                self.of(node.child_by_field_name("consequence")),
                self.of(node.child_by_field_name("alternative")),
            )
        return None


def _usual(a: str | None, b: str | None) -> str | None:
    """C's usual arithmetic conversions over the classes; None where either is unknown."""
    if a is None or b is None:
        return None
    for cls in ("double", "float"):
        if cls in (a, b):
            return cls
    return "int"


def _name_of(ast: KernelAST, declarator: Node) -> tuple[str | None, bool]:
    """A declarator's name and whether it declares a pointer or an array."""
    d, pointer = declarator, False
    while d is not None and d.type != "identifier":
        if d.type in ("pointer_declarator", "array_declarator"):
            pointer = True
        elif d.type not in ("init_declarator", "reference_declarator"):
            return None, False
        d = d.child_by_field_name("declarator")
    return (ast.text(d) if d is not None else None), pointer


def float_divisions(ast: KernelAST, types: _Types) -> list[Node]:
    """The kernel's divisions (`a / b`, `a /= b`) whose arithmetic is in float; not those by a
    power of two (nvcc multiplies there, exactly), nor `/=` on a target with side effects."""
    out = []
    for n in walk(ast.body):
        if n.type not in ("binary_expression", "assignment_expression"):
            continue
        left, right = n.child_by_field_name("left"), n.child_by_field_name("right")
        if left is None or right is None or _power_of_two(ast.text(unparen(right))):
            continue
        op = operator_of(n)
        if n.type == "binary_expression" and op == "/":
            float_div = types.of(n) == "float" and "float" in (types.of(left), types.of(right))
        elif op == "/=":
            pure = not any(w in ast.text(left) for w in ("++", "--", "(", "="))
            float_div = pure and types.of(left) == "float" and types.of(right) in ("float", "int")
        else:
            float_div = False
        if float_div:
            out.append(n)
    return out


def _power_of_two(text: str) -> bool:
    """Whether `text` is a literal whose value is a power of two (`INFINITY`, which Python's
    float() reads too, is not)."""
    try:
        value = float(text.lower().rstrip("fl").rstrip("u"))
    except ValueError:
        return False
    if not math.isfinite(value) or value == 0.0:
        return False
    return math.frexp(abs(value))[0] == 0.5


def math_calls(ast: KernelAST) -> list[Node]:
    """The function names of the kernel's calls that have a hardware approximation."""
    out = []
    for name, call in ast.calls(ast.body):
        if name in INTRINSICS:
            out.append(call.child_by_field_name("function"))
    return out


def rewritten(ast: KernelAST, divisions: list[Node], calls: list[Node]) -> str:
    """The kernel's definition with `divisions` as `__fdividef` and `calls` renamed, nested ones
    included."""
    targets = {(n.start_byte, n.end_byte, n.type): n for n in [*divisions, *calls]}
    spans = [(s, e) for s, e, _ in targets]

    def holds(node: Node) -> bool:
        return any(node.start_byte <= s and e <= node.end_byte for s, e in spans)

    def render(node: Node) -> str:
        key = (node.start_byte, node.end_byte, node.type)
        if key in targets and node.type == "identifier":
            return INTRINSICS[ast.text(node)]
        if key in targets and node.type == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            return f"__fdividef({render(left)}, {render(right)})"
        if key in targets:  # a /= b
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            return f"{render(left)} = __fdividef({render(left)}, {render(right)})"
        inner = {
            (c.start_byte, c.end_byte): render(c)
            for c in node.children
            if holds(c) and (c.start_byte, c.end_byte) != (node.start_byte, node.end_byte)
        }
        return ast.render(node, inner)

    replace = {(ast.body.start_byte, ast.body.end_byte): render(ast.body)}
    return ast.definition(replace)


class FastMath(Transformation):
    name = "fast_math"
    addresses = frozenset({"compute", "latency"})
    gain = 0.5
    keeps_accesses = True
    description = (
        "approximate float division and math functions in the source, within the tolerance"
    )

    def propose(self, ctx: Context) -> list[Rewrite]:
        floats = [b for b in ctx.spec.buffers if b.dtype in ("f32", "f64") and b.role != "in"]
        if not floats:
            return []
        ast = ctx.ast
        divisions = float_divisions(ast, _Types(ast))
        calls = math_calls(ast)
        rtol = ctx.float_tolerance()
        out = []
        if rtol >= 1e-5 and divisions:
            out.append(
                Rewrite(
                    params={"math": "approx-div"},
                    summary=f"__fdividef for {len(divisions)} float division(s)",
                    variant=ctx.rewrite(rewritten(ast, divisions, [])),
                    weight=0.8,
                )
            )
        if rtol >= 1e-4 and calls:
            names = sorted({ast.text(c) for c in calls})
            out.append(
                Rewrite(
                    params={"math": "intrinsics"},
                    summary=f"hardware {', '.join(INTRINSICS[n] for n in names)}"
                    + (" and __fdividef" if divisions else ""),
                    variant=ctx.rewrite(rewritten(ast, divisions, calls)),
                    weight=0.6,
                )
            )
        return out
