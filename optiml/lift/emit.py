"""Lifted expressions written back as CUDA C, for schedules emitted from the model.

`CEmitter.expr(e)` gives the C text of a model expression: loads as subscripts (16-bit types
converted to float), math by its spelling for the type (`expf` for float, `exp` for double),
casts (`__float2bfloat16` for bf16), loop variables and loop results by the names a schedule
gives them, and the thread's row (or any index a schedule replaces) by a name. An expression the
emitter cannot write (a built-in the schedule did not replace) raises `NotEmittable`.
"""

from __future__ import annotations

import math

from optiml.lift.families import affine, global_indices
from optiml.lift.model import (
    BF16,
    BOOL,
    DOUBLE,
    FLOAT,
    HALF,
    INT,
    LONG,
    Binary,
    Builtin,
    Call,
    Cast,
    Const,
    Expr,
    Load,
    LoopOut,
    Param,
    Select,
    Unary,
    Var,
    walk_expr,
)

C_TYPES = {
    BOOL: "bool",
    INT: "int",
    LONG: "long long",
    FLOAT: "float",
    DOUBLE: "double",
    HALF: "__half",
    BF16: "__nv_bfloat16",
}
_FLOAT_NAMES = {
    "exp": "expf",
    "exp2": "exp2f",
    "log": "logf",
    "log2": "log2f",
    "log1p": "log1pf",
    "expm1": "expm1f",
    "sqrt": "sqrtf",
    "rsqrt": "rsqrtf",
    "tanh": "tanhf",
    "erf": "erff",
    "sin": "sinf",
    "cos": "cosf",
    "sinpi": "sinpif",
    "cospi": "cospif",
    "abs": "fabsf",
    "pow": "powf",
    "max": "fmaxf",
    "min": "fminf",
    "floor": "floorf",
    "ceil": "ceilf",
    "fma": "fmaf",
    "saturate": "__saturatef",
}
_DOUBLE_NAMES = {
    k: v[:-1] if v.endswith("f") and k != "saturate" else v for k, v in _FLOAT_NAMES.items()
}
_DOUBLE_NAMES.update({"abs": "fabs", "max": "fmax", "min": "fmin", "fma": "fma", "sinpi": "sinpi"})


class NotEmittable(Exception):
    pass


class CEmitter:
    """`names`: the C names of loop variables and loop results (by Var uid); `gx`: the name that
    stands for the thread's global index along x (`blockIdx.x * blockDim.x + threadIdx.x`);
    `atoms`: C names for the atoms of affine forms (`g.x`, `g.y`, `blockIdx.y`, ...): an integer
    expression over the thread's indices whose form is affine is then written from its form
    (`(long long)C * optiml_row + optiml_col`), however the kernel spelled it."""

    def __init__(
        self, names: dict[int, str], gx: str | None = None, atoms: dict[str, str] | None = None
    ):
        self.names = names
        self.gx = gx
        self.atoms = atoms or {}

    def expr(self, e: Expr) -> str:
        if self.gx is not None and e.type in (INT, LONG) and not isinstance(e, Const | Param):
            f = affine(e)
            if f is not None and global_indices(f) == {("g.x",): 1}:
                return self.gx
        if self.atoms and e.type in (INT, LONG) and not isinstance(e, Const | Param | Var):
            text = self.affine_text(e)
            if text is not None:
                return text
        match e:
            case Const(value=v, type=t):
                return _literal(v, t)
            case Param(name=n):
                return n
            case Var(uid=uid) | LoopOut(var=Var(uid=uid)):
                if uid not in self.names:
                    raise NotEmittable(f"no name for {e}")
                return self.names[uid]
            case Builtin(name=n):
                raise NotEmittable(f"`{n}` where the schedule maps threads otherwise")
            case Load(tensor=t, index=i, type=ty):
                return self.from_memory(f"{t}[{self.expr(i)}]", ty)
            case Unary(op=op, a=a):
                return f"({op}{self.expr(a)})"
            case Binary(op=op, a=a, b=b):
                return f"({self.expr(a)} {op} {self.expr(b)})"
            case Call(fn=fn, args=args, type=t):
                if t in (INT, LONG) and fn in ("max", "min", "abs"):
                    name = fn
                else:
                    table = _DOUBLE_NAMES if t == DOUBLE else _FLOAT_NAMES
                    if fn not in table:
                        raise NotEmittable(f"no C spelling of `{fn}`")
                    name = table[fn]
                return f"{name}({', '.join(self.expr(a) for a in args)})"
            case Select(cond=c, a=a, b=b):
                return f"({self.expr(c)} ? {self.expr(a)} : {self.expr(b)})"
            case Cast(a=a, type=t):
                return self.cast(self.expr(a), a.type, t)
        raise NotEmittable(f"cannot write {type(e).__name__}")

    def affine_text(self, e: Expr) -> str | None:
        """`e` written from its affine form over `atoms`, loop variables and scalar parameters;
        None where it reads no thread index, is not affine, or has an atom with no name."""
        if not any(isinstance(x, Builtin) for x in walk_expr(e, into_loops=False)):
            return None
        f = affine(e)
        if f is None:
            return None
        terms = []
        for monomial, coefficient in sorted(global_indices(f).items()):
            factors = [f"{coefficient}LL"]
            for atom in monomial:
                if atom in self.atoms:
                    factors.append(self.atoms[atom])
                elif "#" in atom and int(atom.split("#")[1]) in self.names:
                    factors.append(self.names[int(atom.split("#")[1])])
                elif "." in atom or "#" in atom:
                    return None
                else:
                    factors.append(atom)
            terms.append(" * ".join(factors))
        return "(" + (" + ".join(terms) or "0LL") + ")"

    def from_memory(self, text: str, dtype: str) -> str:
        """An element of type `dtype` read as `text`, as the value computed with (16-bit types in
        float)."""
        if dtype == HALF:
            return f"__half2float({text})"
        if dtype == BF16:
            return f"__bfloat162float({text})"
        return text

    def cast(self, text: str, source: str, target: str) -> str:
        if target == HALF:
            return f"__float2half((float)({text}))"
        if target == BF16:
            return f"__float2bfloat16((float)({text}))"
        return f"(({C_TYPES[target]})({text}))"


def _literal(v, t: str) -> str:
    if t == BOOL:
        return "true" if v else "false"
    if t in (INT, LONG):
        return f"{int(v)}" + ("LL" if t == LONG else "")
    f = float(v)
    if math.isinf(f):
        return ("-" if f < 0 else "") + ("INFINITY" if t != DOUBLE else "(double)INFINITY")
    if math.isnan(f):
        return "NAN"
    text = repr(f)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + ("f" if t in (FLOAT, HALF, BF16) else "")
