"""Run a lifted model on the host with NumPy: every thread of the launch at once, a few thousand
blocks at a time.

Two precisions: "float64" computes every floating value in double (an oracle: what the kernel
means, rounded once at the end), "native" in the kernel's own types (float32, float16, bf16
rounded as the GPU rounds it), which is what the kernel itself should produce up to the order of
its sums. Loads read the inputs as they were before the launch (a race-free kernel reads only
what no other thread writes, or what it wrote itself, which the model forwards); stores land in
program order, atomics accumulate. A loop runs until its condition fails for every thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

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
    Lifted,
    Load,
    Loop,
    LoopOut,
    Param,
    Select,
    Stmt,
    Store,
    Unary,
    Var,
    children,
    stmt_exprs,
)

MAX_THREADS_PER_CHUNK = 1 << 18
MAX_ITERATIONS = 1 << 22


class ModelError(Exception):
    """The model cannot be run at this size: a loop that does not end, a store out of bounds."""


def _np_type(t: str, precision: str) -> np.dtype:
    if t == BOOL:
        return np.dtype(bool)
    if t in (INT, LONG):
        return np.dtype(np.int64)
    if precision == "float64":
        return np.dtype(np.float64)
    return np.dtype({FLOAT: np.float32, DOUBLE: np.float64, HALF: np.float16, BF16: np.float32}[t])


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), kept as float32."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(f), f, out)


_erf = np.frompyfunc(math.erf, 1, 1)


def _call(fn: str, args: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    a = args[0]
    with np.errstate(all="ignore"):
        if fn == "exp":
            r = np.exp(a)
        elif fn == "exp2":
            r = np.exp2(a)
        elif fn == "log":
            r = np.log(a)
        elif fn == "log2":
            r = np.log2(a)
        elif fn == "log1p":
            r = np.log1p(a)
        elif fn == "expm1":
            r = np.expm1(a)
        elif fn == "sqrt":
            r = np.sqrt(a)
        elif fn == "rsqrt":
            r = 1 / np.sqrt(a)
        elif fn == "tanh":
            r = np.tanh(a)
        elif fn == "erf":
            r = _erf(a).astype(np.float64)
        elif fn == "sin":
            r = np.sin(a)
        elif fn == "cos":
            r = np.cos(a)
        elif fn == "sinpi":
            r = np.sin(np.pi * a)
        elif fn == "cospi":
            r = np.cos(np.pi * a)
        elif fn == "abs":
            r = np.abs(a)
        elif fn == "pow":
            r = np.power(a, args[1])
        elif fn == "max":
            r = np.fmax(a, args[1]) if dtype.kind == "f" else np.maximum(a, args[1])
        elif fn == "min":
            r = np.fmin(a, args[1]) if dtype.kind == "f" else np.minimum(a, args[1])
        elif fn == "floor":
            r = np.floor(a)
        elif fn == "ceil":
            r = np.ceil(a)
        elif fn == "fma":
            r = a * args[1] + args[2]
        elif fn == "saturate":
            r = np.clip(a, 0, 1)
        else:
            raise ModelError(f"no NumPy for `{fn}`")
    return np.asarray(r).astype(dtype, copy=False)


class _Scope:
    def __init__(self, uids: frozenset[int]):
        self.uids = uids
        self.memo: dict[int, np.ndarray] = {}
        self.loops: dict[int, dict[int, np.ndarray]] = {}


class Runner:
    def __init__(
        self,
        lifted: Lifted,
        inputs: dict[str, np.ndarray],
        scalars: dict[str, float | int],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        precision: str = "float64",
        blocks: int | None = None,
    ):
        if precision not in ("float64", "native"):
            raise ValueError("precision is float64 or native")
        self.m = lifted
        self.precision = precision
        self.grid, self.block = grid, block
        self.blocks = blocks  # run only the first blocks of the grid (a sample: for tests)
        self.scalars = scalars
        self.snapshot: dict[str, np.ndarray] = {}
        self.out: dict[str, np.ndarray] = {}
        for name, t in lifted.tensors.items():
            arr = np.asarray(inputs[name]).reshape(-1)
            dt = _np_type(t.dtype, precision)
            snap = arr.astype(dt)
            if t.dtype == BF16 and precision == "native":
                snap = round_bf16(snap)
            self.snapshot[name] = snap
            self.out[name] = snap.copy()
        self._deps: dict[int, frozenset[int]] = {}
        self._loop_deps: dict[int, frozenset[int]] = {}

    # -- dependencies on loop variables (for what may be computed once per loop, not per iteration)

    def deps(self, e: Expr) -> frozenset[int]:
        key = id(e)
        found = self._deps.get(key)
        if found is not None:
            return found
        if isinstance(e, Var):
            d = frozenset((e.uid,))
        elif isinstance(e, LoopOut):
            d = self.loop_deps(e.loop)
        else:
            d = frozenset()
            for c in children(e):
                d |= self.deps(c)
        self._deps[key] = d
        return d

    def loop_deps(self, loop: Loop) -> frozenset[int]:
        found = self._loop_deps.get(loop.uid)
        if found is not None:
            return found
        d: frozenset[int] = frozenset()
        for c in loop.carried:
            d |= self.deps(c.init) | self.deps(c.update)
        d |= self.deps(loop.cond) | self.deps(loop.guard)
        for s in loop.body:
            for e in stmt_exprs(s):
                d |= self.deps(e)
        d -= {c.var.uid for c in loop.carried}
        self._loop_deps[loop.uid] = d
        return d

    # -- running

    def run(self) -> dict[str, np.ndarray]:
        for _ in self._chunks():
            self.exec_body(self.m.body, np.ones(self.n, dtype=bool))
        return {k: v for k, v in self.out.items() if self.m.tensors[k].role != "in"}

    def _chunks(self):
        """Set up the built-ins of a few thousand blocks at a time; yields once per chunk."""
        gx, gy, gz = self.grid
        bx, by, bz = self.block
        per_block = bx * by * bz
        blocks = gx * gy * gz if self.blocks is None else min(self.blocks, gx * gy * gz)
        step = max(1, MAX_THREADS_PER_CHUNK // per_block)
        for first in range(0, blocks, step):
            b = np.arange(first, min(blocks, first + step), dtype=np.int64)
            t = np.arange(per_block, dtype=np.int64)
            bi = np.repeat(b, per_block)
            ti = np.tile(t, len(b))
            self.builtins = {
                "blockIdx.x": bi % gx,
                "blockIdx.y": (bi // gx) % gy,
                "blockIdx.z": bi // (gx * gy),
                "threadIdx.x": ti % bx,
                "threadIdx.y": (ti // bx) % by,
                "threadIdx.z": ti // (bx * by),
            }
            self.n = len(bi)
            self.scopes = [_Scope(frozenset())]
            self.values: dict[int, np.ndarray] = {}
            yield first

    def indices(self, stores: list[Store]) -> list[tuple[np.ndarray, np.ndarray]]:
        """For stores of a straight-line body (no loop around them) that each copy one loaded
        element: the element indices each thread that reaches it writes and reads, over the
        whole launch."""
        out: list[tuple[list, list]] = [([], []) for _ in stores]
        for _ in self._chunks():
            for (written, read), s in zip(out, stores, strict=True):
                mask = np.broadcast_to(self.ev(s.guard), (self.n,)).astype(bool)
                v = s.value
                while isinstance(v, Cast):
                    v = v.a
                written.append(np.broadcast_to(self.ev(s.index), (self.n,))[mask])
                read.append(np.broadcast_to(self.ev(v.index), (self.n,))[mask])
        return [(np.concatenate(w), np.concatenate(r)) for w, r in out]

    def exec_body(self, body: tuple[Stmt, ...], active: np.ndarray) -> None:
        for s in body:
            if isinstance(s, Store):
                self.store(s, active)
            else:
                self.loop(s, active, stores=True)

    def store(self, s: Store, active: np.ndarray) -> None:
        mask = active & self.ev(s.guard).astype(bool)
        if not mask.any():
            return
        idx = np.broadcast_to(self.ev(s.index), mask.shape)[mask]
        out = self.out[s.tensor]
        if idx.min() < 0 or idx.max() >= out.size:
            bad = int(idx[(idx < 0) | (idx >= out.size)][0])
            raise ModelError(
                f"line {s.line}: a thread writes {s.tensor}[{bad}], outside its {out.size} elements"
            )
        val = self.ev(s.value)
        val = np.broadcast_to(val, mask.shape)[mask].astype(out.dtype)
        if self.m.tensors[s.tensor].dtype == BF16 and self.precision == "native":
            val = round_bf16(val)
        if s.op == "=" or s.op == "exch":
            out[idx] = val
        elif s.op == "add":
            np.add.at(out, idx, val)
        elif s.op == "sub":
            np.subtract.at(out, idx, val)
        elif s.op == "max":
            np.maximum.at(out, idx, val)
        elif s.op == "min":
            np.minimum.at(out, idx, val)
        elif s.op == "and":
            np.bitwise_and.at(out, idx, val)
        elif s.op == "or":
            np.bitwise_or.at(out, idx, val)
        elif s.op == "xor":
            np.bitwise_xor.at(out, idx, val)
        else:
            raise ModelError(f"line {s.line}: no NumPy for the atomic `{s.op}`")

    def _scope_of(self, d: frozenset[int]) -> _Scope:
        for scope in reversed(self.scopes):
            if scope.uids & d:
                return scope
        return self.scopes[0]

    def loop(self, loop: Loop, active: np.ndarray, stores: bool) -> dict[int, np.ndarray]:
        scope = self._scope_of(self.loop_deps(loop))
        done = scope.loops.get(loop.uid)
        if done is not None:
            return done
        act = active & np.broadcast_to(self.ev(loop.guard), (self.n,)).astype(bool)
        vals = {
            c.var.uid: np.broadcast_to(self.ev(c.init), (self.n,)).astype(
                _np_type(c.var.type, self.precision)
            )
            for c in loop.carried
        }
        inner = _Scope(frozenset(vals))
        self.scopes.append(inner)
        try:
            for _ in range(MAX_ITERATIONS):
                inner.memo.clear()
                inner.loops.clear()
                self.values.update(vals)
                act = act & np.broadcast_to(self.ev(loop.cond), (self.n,)).astype(bool)
                if not act.any():
                    break
                if stores:
                    self.exec_body(loop.body, act)
                new = {c.var.uid: self.ev(c.update) for c in loop.carried}
                for c in loop.carried:
                    v = np.broadcast_to(new[c.var.uid], (self.n,))
                    if c.var.type == BF16 and self.precision == "native":
                        v = round_bf16(v)
                    vals[c.var.uid] = np.where(act, v, vals[c.var.uid]).astype(
                        vals[c.var.uid].dtype
                    )
            else:
                raise ModelError(f"line {loop.line}: the loop runs over {MAX_ITERATIONS} times")
        finally:
            self.scopes.pop()
        scope.loops[loop.uid] = vals
        return vals

    def ev(self, e: Expr) -> np.ndarray:
        scope = self._scope_of(self.deps(e))
        key = id(e)
        found = scope.memo.get(key)
        if found is not None:
            return found
        r = self._ev(e)
        scope.memo[key] = r
        return r

    def _ev(self, e: Expr) -> np.ndarray:
        p = self.precision
        match e:
            case Const(value=v, type=t):
                return np.asarray(v, dtype=_np_type(t, p))
            case Builtin(name=name):
                if name in self.builtins:
                    return self.builtins[name]
                which, dim = name.split(".")
                src = self.block if which == "blockDim" else self.grid
                return np.asarray(src["xyz".index(dim)], dtype=np.int64)
            case Param(name=name, type=t):
                return np.asarray(self.scalars[name], dtype=_np_type(t, p))
            case Var(uid=uid):
                return self.values[uid]
            case LoopOut(loop=loop, var=var):
                vals = self.loop(loop, np.ones(self.n, dtype=bool), stores=False)
                return vals[var.uid]
            case Load(tensor=name, index=index):
                src = self.snapshot[name]
                i = np.clip(self.ev(index), 0, src.size - 1)  # a thread off its guard reads a dummy
                return src[i]
            case Unary(op=op, a=a):
                x = self.ev(a)
                if op == "-":
                    return -x
                if op == "!":
                    return ~x.astype(bool)
                return ~x
            case Binary(op=op, a=a, b=b, type=t):
                return self._binary(op, self.ev(a), self.ev(b), _np_type(t, p))
            case Call(fn=fn, args=args, type=t):
                return _call(fn, [self.ev(a) for a in args], _np_type(t, p))
            case Select(cond=c, a=a, b=b, type=t):
                dt = _np_type(t, p)
                return np.where(self.ev(c).astype(bool), self.ev(a), self.ev(b)).astype(dt)
            case Cast(a=a, type=t):
                return self._cast(self.ev(a), t)
        raise ModelError(f"cannot run {type(e).__name__}")

    def _cast(self, x: np.ndarray, t: str) -> np.ndarray:
        dt = _np_type(t, self.precision)
        if t == BOOL:
            return x != 0
        if dt.kind == "i" and x.dtype.kind == "f":
            with np.errstate(all="ignore"):
                return np.nan_to_num(np.trunc(x), nan=0, posinf=0, neginf=0).astype(dt)
        r = x.astype(dt)
        if t == BF16 and self.precision == "native":
            r = round_bf16(r)
        return r

    @staticmethod
    def _binary(op: str, a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
        if op in ("<", "<=", ">", ">=", "==", "!="):
            fn: Callable = {
                "<": np.less,
                "<=": np.less_equal,
                ">": np.greater,
                ">=": np.greater_equal,
                "==": np.equal,
                "!=": np.not_equal,
            }[op]
            return fn(a, b)
        if op == "&&":
            return a.astype(bool) & b.astype(bool)
        if op == "||":
            return a.astype(bool) | b.astype(bool)
        a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        with np.errstate(all="ignore"):
            if op == "+":
                return a + b
            if op == "-":
                return a - b
            if op == "*":
                return a * b
            if dt.kind == "f":
                if op == "/":
                    return a / b
                if op == "%":
                    return np.fmod(a, b)
                raise ModelError(f"`{op}` on floating values")
            safe = np.where(b == 0, 1, b)
            if op == "/":  # C truncates toward zero
                q = np.abs(a) // np.abs(safe)
                return np.where((a < 0) ^ (safe < 0), -q, q)
            if op == "%":
                q = np.abs(a) // np.abs(safe)
                q = np.where((a < 0) ^ (safe < 0), -q, q)
                return a - safe * q
            if op == "<<":
                return np.left_shift(a, np.clip(b, 0, 63))
            if op == ">>":
                return np.right_shift(a, np.clip(b, 0, 63))
            if op == "&":
                return a & b
            if op == "|":
                return a | b
            if op == "^":
                return a ^ b
        raise ModelError(f"no NumPy for `{op}`")


def run(
    lifted: Lifted,
    args: dict[str, np.ndarray | float | int],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    precision: str = "float64",
    blocks: int | None = None,
) -> dict[str, np.ndarray]:
    """The model's outputs for one launch: `args` by parameter name (flat arrays for pointers,
    numbers for scalars); the written tensors, flat, in the precision's types. `blocks`: run
    only the first that many blocks of the grid (the rest of the outputs keep their values)."""
    arrays = {k: v for k, v in args.items() if k in lifted.tensors}
    scalars = {k: v for k, v in args.items() if k in lifted.scalars}
    return Runner(lifted, arrays, scalars, grid, block, precision, blocks).run()
