"""Faster floating-point code generation, only as far as the spec's tolerance allows: approximate
division and square root with flush-to-zero (errors of a few ulp, ~1e-7 relative) when the relative
tolerance is at least 1e-5, and `-use_fast_math` (hardware `__expf`, `__sinf`, ... with errors up to
~1e-6 relative on reduced ranges) when it is at least 1e-4. The checks decide in the end."""

from __future__ import annotations

from optiml.cuda.kernel_ast import operator_of, walk
from optiml.search.catalog.base import Context, Rewrite, Transformation

MATH_CALLS = frozenset(
    {
        "expf",
        "exp",
        "logf",
        "log",
        "sinf",
        "cosf",
        "tanf",
        "powf",
        "sqrtf",
        "rsqrtf",
        "tanhf",
        "exp2f",
        "log2f",
        "sincosf",
        "__fdividef",
        "erff",
    }
)


class FastMath(Transformation):
    name = "fast_math"
    addresses = frozenset({"compute", "latency"})
    gain = 0.5
    keeps_accesses = True
    description = "approximate division/sqrt, or -use_fast_math, within the spec's tolerance"

    def propose(self, ctx: Context) -> list[Rewrite]:
        floats = [b for b in ctx.spec.buffers if b.dtype in ("f32", "f64") and b.role != "in"]
        if not floats:
            return []
        ast = ctx.ast
        calls = {name for name, _ in ast.calls(ast.body)} & MATH_CALLS
        divides = any(
            n.type == "binary_expression" and operator_of(n) == "/" for n in walk(ast.body)
        ) or bool(calls & {"sqrtf", "rsqrtf"})
        rtol = ctx.float_tolerance()
        flags = tuple(f for f in ctx.variant.flags if f not in _ALL)
        out = []
        if rtol >= 1e-5 and divides:
            out.append(
                Rewrite(
                    params={"flags": "approx-div-sqrt"},
                    summary="approximate division and sqrt, flush denormals to zero",
                    variant=ctx.rewrite(flags=(*flags, *_APPROX)),
                    weight=0.8,
                )
            )
        if rtol >= 1e-4 and calls:
            out.append(
                Rewrite(
                    params={"flags": "use_fast_math"},
                    summary=f"-use_fast_math (hardware {', '.join(sorted(calls))})",
                    variant=ctx.rewrite(flags=(*flags, "-use_fast_math")),
                    weight=0.6,
                )
            )
        return out


_APPROX = ("-prec-div=false", "-prec-sqrt=false", "-ftz=true")
_ALL = frozenset({*_APPROX, "-use_fast_math"})
