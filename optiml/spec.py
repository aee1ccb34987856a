"""The kernel contract: the `@optiml` comment above a kernel, parsed into pydantic models and checked
against the kernel's signature. The syntax is documented in docs/spec.md.

Every error carries the file position of the text it is about and says what would be right.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from optiml.arch import ARCH, arch_problem
from optiml.cuda.source import Kernel, SourceFile, comment_body_lines
from optiml.cuda.types import DTYPES, SPEC_TYPE_NAMES, DType, lookup, vector_type
from optiml.errors import Position, SpecError, one_line, quote
from optiml.expr import DEVICE_ONLY, INT_MAX, Expr, ExprError, Number

KEYS = ("args", "launch", "sizes", "tol", "seeds", "reference", "template", "arch", "state")
MIN_SEEDS = 2
MAX_SEEDS = 64  # every seed runs every size; more would only make a check slower
MAX_SIZES = 64
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_Z = 64  # and x, y at most 1024 (CUDA Programming Guide, compute capabilities, Table 30)
MAX_GRID = ((1 << 31) - 1, 65535, 65535)  # x, y, z (the same table)
MAX_VALUE_LENGTH = 10_000  # characters of one key's value, continuation lines included
MAX_NAME_LENGTH = 255  # a kernel, function or file name of a `reference:`
MAX_CONSTANT_DEPTH = 32  # macros and constants defined through one another, followed this deep


# Structured inputs: `= offsets(TOTAL)`, `= sorted(LO, HI)`, `= permutation()`, `= sparse(DENSITY)`
# (and `= uniform(LO, HI)`, another spelling of `in [LO, HI)`): name -> (arguments, how written).
STRUCTURES: dict[str, tuple[int, str]] = {
    "offsets": (1, "offsets(TOTAL)"),
    "sorted": (2, "sorted(LO, HI)"),
    "permutation": (0, "permutation()"),
    "sparse": (1, "sparse(DENSITY)"),
    "uniform": (2, "uniform(LO, HI)"),
}


class Structure(BaseModel):
    """How a structured input's values are made (docs/spec.md, "Structured inputs")."""

    kind: Literal["offsets", "sorted", "permutation", "sparse"]
    args: list[str] = Field(default_factory=list)  # expressions


class BufferArg(BaseModel):
    name: str
    role: Literal["in", "out", "inout"]
    dtype: str  # type code, see optiml.cuda.types; a vector type's component type
    length: str  # expression, in elements (of a vector type: in vectors)
    value_range: tuple[str, str] | None = None  # [low, high) expressions
    lanes: int = 1  # components of a vector type (`float4`: 4)
    ctype: str | None = None  # the vector type's name, e.g. "float4"
    structure: Structure | None = None


class FieldValue(BaseModel):
    name: str
    dtype: str
    value: str  # expression


class StructArg(BaseModel):
    """A struct passed by value: every field's value, in declaration order."""

    name: str
    ctype: str
    fields: list[FieldValue]


class Device(BaseModel):
    """Values of the GPU a launch is computed for, usable in `launch:` expressions. Where no GPU is
    at hand (`optiml check`, compiling), an H200's."""

    sm_count: int = 132
    max_threads_per_sm: int = 2048

    def values(self) -> dict[str, int]:
        return {"sm_count": self.sm_count, "max_threads_per_sm": self.max_threads_per_sm}


FALLBACK_DEVICE = Device()


class ScalarArg(BaseModel):
    name: str
    dtype: str
    value: str  # expression


class Launch(BaseModel):
    grid: list[str]
    block: list[str]
    smem: str = "0"


class Reference(BaseModel):
    kind: Literal["self", "kernel", "numpy"] = "self"
    kernel: str | None = None
    path: str | None = None  # NumPy file, absolute
    function: str | None = None


class Case(BaseModel):
    """One problem size with every expression of the spec evaluated."""

    sizes: dict[str, int]
    scalars: dict[str, Number]
    lengths: dict[str, int]
    ranges: dict[str, tuple[Number, Number]]
    # structured inputs: buffer -> (kind, its number: offsets' total, sparse's density)
    structures: dict[str, tuple[str, float]] = Field(default_factory=dict)
    structs: dict[str, dict[str, Number]] = Field(default_factory=dict)  # struct -> field values
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes.items())


class Spec(BaseModel):
    kernel: str
    params: list[str]  # every parameter, in signature order
    buffers: list[BufferArg]
    scalars: list[ScalarArg]
    structs: list[StructArg] = Field(default_factory=list)
    launch: Launch
    size_vars: list[str]
    sizes: list[dict[str, int]]
    rtol: float | None = None
    atol: float | None = None
    seeds: int = MIN_SEEDS
    reference: Reference = Field(default_factory=Reference)
    template: dict[str, str] = Field(default_factory=dict)
    template_values: dict[str, int] = Field(default_factory=dict)
    arch: str | None = None  # e.g. "sm_90": the target when no --arch is given
    # `state: kept`: the kernel keeps `__device__` state from one launch to the next on purpose
    # (counters it resets itself, a workspace); otherwise such state is a judge's finding
    state_kept: bool = False
    # the file's object-like macros and file-scope constants that the spec's expressions use
    constants: dict[str, Number] = Field(default_factory=dict)

    @property
    def uses_device(self) -> bool:
        """Whether the launch depends on the GPU (`sm_count`, ...)."""
        texts = [*self.launch.grid, *self.launch.block, self.launch.smem]
        return any(Expr.parse(t).names() & set(DEVICE_ONLY) for t in texts)

    def buffer(self, name: str) -> BufferArg | None:
        return next((b for b in self.buffers if b.name == name), None)

    def tolerance(self, dtype: DType) -> tuple[float, float]:
        if not dtype.is_float:
            return (0.0, 0.0)
        return (
            dtype.rtol if self.rtol is None else self.rtol,
            dtype.atol if self.atol is None else self.atol,
        )

    @property
    def instantiation(self) -> str:
        """`<float, 256>` for a templated kernel, "" otherwise."""
        return f"<{', '.join(self.template.values())}>" if self.template else ""

    def cases(self, device: Device | None = None) -> list[Case]:
        return [self.case(s, device) for s in self.sizes]

    def case(self, sizes: dict[str, int], device: Device | None = None) -> Case:
        """Every expression of the spec evaluated at one problem size, the launch for `device`
        (else `FALLBACK_DEVICE`); `ExprError` (and nothing else) where one cannot be: a missing
        name, a division by zero, a value out of range."""
        env: dict[str, Number] = {**self.constants, **self.template_values, **sizes}
        scalars: dict[str, Number] = {}
        for s in self.scalars:
            value = _scalar(s.name, s.dtype, _number(s.value, env, f"the value of `{s.name}`"))
            scalars[s.name] = value
            env[s.name] = value
        structs = {
            st.name: {
                f.name: _scalar(
                    f"{st.name}.{f.name}",
                    f.dtype,
                    _number(f.value, env, f"the value of `{st.name}.{f.name}`"),
                )
                for f in st.fields
            }
            for st in self.structs
        }
        lengths = {b.name: _length(b, env) for b in self.buffers}
        ranges = {b.name: _range(b, env) for b in self.buffers if b.value_range}
        structures = {}
        for b in self.buffers:
            if b.structure is not None:
                kind, extra, value_range = _structure(b, lengths[b.name], env)
                structures[b.name] = (kind, extra)
                if value_range is not None:
                    ranges[b.name] = value_range
        launch_env = {**env, **(device or FALLBACK_DEVICE).values()}
        grid = _dims(self.launch.grid, launch_env, "grid")
        block = _dims(self.launch.block, launch_env, "block")
        smem = _number(self.launch.smem, launch_env, "smem")
        if not isinstance(smem, int) or smem < 0:
            raise ExprError(f"smem must be a non-negative integer number of bytes, got {smem}")
        return Case(
            sizes=sizes,
            scalars=scalars,
            lengths=lengths,
            ranges=ranges,
            structures=structures,
            structs=structs,
            grid=grid,
            block=block,
            smem=smem,
        )


def _number(text: str, env: dict[str, Number], what: str) -> Number:
    value = Expr.parse(text).evaluate(env)
    if isinstance(value, tuple):
        raise ExprError(f"{what} is one number, not a tuple `{quote(text, 40)}`")
    return value


def _positive_int(text: str, env: dict[str, Number], what: str) -> int:
    value = _number(text, env, what)
    if not isinstance(value, int) or value <= 0:
        raise ExprError(f"{what} must be a positive integer, got {value}")
    return value


def _length(b: BufferArg, env: dict[str, Number]) -> int:
    """A buffer's length in scalar elements (a vector type's components), whose size in bytes
    must also fit in 64 bits."""
    n = _positive_int(b.length, env, f"the length of `{b.name}`") * b.lanes
    size = DTYPES[b.dtype].size if b.dtype in DTYPES else 1
    if n * size > INT_MAX:
        raise ExprError(
            f"`{b.name}` would have {n} elements of {size} bytes: too large, its size in bytes "
            "must fit in 64 bits"
        )
    return n


def _range(b: BufferArg, env: dict[str, Number]) -> tuple[Number, Number]:
    """A buffer's `in [LO, HI)`: two numbers, LO below HI, so that inputs are not all alike."""
    assert b.value_range is not None
    lo = _number(b.value_range[0], env, f"the range start of `{b.name}`")
    hi = _number(b.value_range[1], env, f"the range end of `{b.name}`")
    if not lo < hi:
        raise ExprError(f"the range of `{b.name}`, [{lo}, {hi}), is empty; write LO < HI")
    return lo, hi


def _structure(
    b: BufferArg, n: int, env: dict[str, Number]
) -> tuple[str, float, tuple[Number, Number] | None]:
    """A structured input at one size: its kind, its number (offsets' total, sparse's density)
    and the range its values lie in (None: the declared or default range)."""
    assert b.structure is not None
    kind, args = b.structure.kind, b.structure.args
    d = DTYPES[b.dtype]
    top = (1 << (8 * d.size - (d.kind == "int"))) - 1  # the largest value of the type
    if kind == "offsets":
        total = _number(args[0], env, f"the total of `{b.name}`'s offsets")
        if not isinstance(total, int) or total < 0:
            raise ExprError(f"the total of `{b.name}`'s offsets must be a whole number >= 0")
        if n < 2 or total > top:
            raise ExprError(
                f"`{b.name}` = offsets({total}) needs at least 2 elements and a total its type "
                f"holds; it has {n} of `{d.name}`"
            )
        return kind, float(total), (0, total + 1)
    if kind == "permutation":
        if n - 1 > top:
            raise ExprError(f"a permutation of {n} values does not fit in `{d.name}`")
        return kind, 0.0, (0, n)
    if kind == "sorted":
        lo = _number(args[0], env, f"the lowest value of `{b.name}`")
        hi = _number(args[1], env, f"the highest value of `{b.name}`")
        if not lo < hi:
            raise ExprError(f"sorted({lo}, {hi}) of `{b.name}` is empty; write LO < HI")
        return kind, 0.0, (lo, hi)
    density = _number(args[0], env, f"the density of `{b.name}`")
    if not 0 < density <= 1:
        raise ExprError(f"the density of `{b.name}` is a share of its elements, 0 < d <= 1")
    return kind, float(density), None


def _scalar(name: str, code: str, value: Number) -> Number:
    """An integer scalar's value must be a whole number its C type can hold: the runner would
    otherwise truncate or wrap it silently."""
    d = DTYPES.get(code)
    if d is None or d.is_float:
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ExprError(f"`{name}` is an integer (`{d.name}`); its value {value} is not whole")
        value = int(value)
    bits = 8 * d.size
    lo, hi = (0, (1 << bits) - 1) if d.kind == "uint" else (-(1 << bits - 1), (1 << bits - 1) - 1)
    if not lo <= value <= hi:
        raise ExprError(f"`{name}` = {value} does not fit in its type `{d.name}` ({lo} to {hi})")
    return value


def _dims(texts: list[str], env: dict[str, Number], what: str) -> tuple[int, int, int]:
    values = [_positive_int(t, env, f"{what} dimension `{t}`") for t in texts]
    values += [1] * (3 - len(values))
    return (values[0], values[1], values[2])


# ---- parsing ---------------------------------------------------------------------------------


class _Text:
    """A value of the spec gathered from one or more comment lines, with the file offset of every
    character, so that any part of it can be reported at its true position."""

    def __init__(self, chars: str, offsets: list[int]):
        self.chars = chars
        self.offsets = offsets

    def __str__(self) -> str:
        return self.chars

    def slice(self, start: int, end: int) -> _Text:
        return _Text(self.chars[start:end], self.offsets[start:end])

    def strip(self) -> _Text:
        lead = len(self.chars) - len(self.chars.lstrip())
        end = len(self.chars.rstrip())
        return self.slice(lead, max(lead, end))

    def at(self, column: int) -> _Text:
        """The character at `column` (an expression error's), or all of it if there is none."""
        return self.slice(column, column + 1) if 0 <= column < len(self.chars) else self

    def offset(self, index: int = 0) -> int:
        if not self.offsets:
            return 0
        return self.offsets[min(max(index, 0), len(self.offsets) - 1)]

    def split_top(self, sep: str) -> list[_Text]:
        """Split at `sep` outside brackets; `[0, n)` counts as one bracket pair."""
        parts, depth, start = [], 0, 0
        for i, c in enumerate(self.chars):
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif c == sep and depth == 0:
                parts.append(self.slice(start, i))
                start = i + 1
        parts.append(self.slice(start, len(self.chars)))
        return parts

    def partition(self, sep: str) -> tuple[_Text, _Text] | None:
        i = self.chars.find(sep)
        if i < 0:
            return None
        return self.slice(0, i), self.slice(i + len(sep), len(self.chars))


class _Parser:
    def __init__(self, source: SourceFile, kernel: Kernel):
        self.source = source
        self.kernel = kernel
        self.issues: list[tuple[str, Position]] = []

    def error(self, message: str, at: _Text | int | None = None, end: int | None = None) -> None:
        if isinstance(at, _Text):
            start = at.offset(0)
            stop = at.offset(len(at.chars) - 1) + 1 if at.chars else start + 1
        elif isinstance(at, int):
            start, stop = at, end if end is not None else at + 1
        else:
            start = (
                self.kernel.spec_comment.span.start
                if self.kernel.spec_comment
                else self.kernel.name_span.start
            )
            stop = start + 1
        self.issues.append((one_line(message), self.source.position(start, stop)))

    def expr(self, text: _Text, what: str, tuple_max: int | None = 3) -> Expr | None:
        t = text.strip()
        try:
            return Expr.parse(t.chars, tuple_max=tuple_max)
        except ExprError as e:
            self.error(f"{what}: {e}", t.at(e.column) if t.chars else text)
            return None

    # -- entry point --

    def parse(self) -> Spec:
        comment = self.kernel.spec_comment
        assert comment is not None
        values = self._key_values(comment)
        k = self.kernel
        signature = f"{k.name}({', '.join(p.declared + ' ' + p.name for p in k.params)})"
        template, template_values = self._template(values.get("template"))
        sizes_vars, sizes = self._sizes(values.get("sizes"))
        words = set(re.findall(r"[A-Za-z_]\w*", " ".join(v.chars for v in values.values())))
        self.constants = self._file_constants(words - set(sizes_vars) - set(template))
        buffers, scalars, structs = self._args(values.get("args"), template, sizes_vars, signature)
        launch = self._launch(values.get("launch"))
        rtol, atol = self._tol(values.get("tol"))
        seeds = self._seeds(values.get("seeds"))
        reference = self._reference(values.get("reference"))
        arch = self._arch(values.get("arch"))
        state_kept = self._state(values.get("state"))
        if self.issues:
            raise SpecError(self.issues)
        spec = Spec(
            kernel=k.name,
            params=[p.name for p in k.params],
            buffers=buffers,
            scalars=scalars,
            structs=structs,
            launch=launch,
            size_vars=sizes_vars,
            sizes=sizes,
            rtol=rtol,
            atol=atol,
            seeds=seeds,
            reference=reference,
            template=template,
            template_values=template_values,
            arch=arch,
            state_kept=state_kept,
            constants=self.constants,
        )
        self._check_cases(spec, values)
        if self.issues:
            raise SpecError(self.issues)
        return spec

    def _key_values(self, comment) -> dict[str, _Text]:
        # Each key's text is gathered in pieces and joined once: joining line by line would take
        # time quadratic in the comment's length.
        pieces: dict[str, tuple[list[str], list[int]]] = {}
        key_at: dict[str, int] = {}
        current: str | None = None
        seen_marker = False
        for offset, line in comment_body_lines(comment):
            text = line.split("#", 1)[0]
            if not seen_marker:
                i = text.find("@optiml")
                if i < 0:
                    continue
                seen_marker = True
                text = " " * (i + len("@optiml")) + text[i + len("@optiml") :]
            m = re.match(r"^(\s*)([A-Za-z_]\w*)\s*:(?!:)", text)
            # `y: out float[n]` on its own line continues `args:`; it is not a key.
            if m and m.group(2) not in KEYS and current == "args" and self.kernel.param(m.group(2)):
                m = None
            if m:
                key = m.group(2)
                key_offset = offset + len(m.group(1))
                if key not in KEYS:
                    close = difflib.get_close_matches(key, KEYS, n=1)
                    hint = (
                        f"did you mean `{close[0]}`?" if close else f"known keys: {', '.join(KEYS)}"
                    )
                    self.error(
                        f"unknown spec key `{quote(key, 30)}`; {hint}",
                        key_offset,
                        key_offset + len(key),
                    )
                    current = None
                    continue
                if key in pieces:
                    self.error(
                        f"`{key}` is given twice; give it once", key_offset, key_offset + len(key)
                    )
                    current = None
                    continue
                current = key
                key_at[key] = key_offset
                start = m.end()
                pieces[key] = (
                    [text[start:]],
                    [offset + start + j for j in range(len(text) - start)],
                )
            elif text.strip():
                if current is None:
                    stripped = text.lstrip()
                    at = offset + len(text) - len(stripped)
                    self.error(
                        f"`{quote(stripped, 30)}` is outside any key; start the line with one of: {', '.join(KEYS)}",
                        at,
                        at + len(stripped.rstrip()),
                    )
                    continue
                chars, offsets = pieces[current]
                chars += [" ", text]
                offsets.append(offsets[-1] if offsets else key_at[current])
                offsets += [offset + j for j in range(len(text))]
        values = {key: _Text("".join(chars), offsets) for key, (chars, offsets) in pieces.items()}
        for key, value in values.items():
            if len(value.chars) > MAX_VALUE_LENGTH:
                self.error(
                    f"`{key}` is {len(value.chars)} characters long; at most {MAX_VALUE_LENGTH}",
                    key_at[key],
                    key_at[key] + len(key),
                )
                raise SpecError(self.issues)
        for key in ("launch", "sizes"):
            if key not in values:
                example = {
                    "launch": "launch: grid = cdiv(n, 256), block = 256",
                    "sizes": "sizes: n = 1 << 24, 1000003",
                }[key]
                self.error(f"the spec has no `{key}:`; add a line like `{example}`")
        self._key_at = key_at
        return values

    # -- keys --

    def _template(self, text: _Text | None) -> tuple[dict[str, str], dict[str, int]]:
        tparams = self.kernel.template_params
        given: dict[str, str] = {}
        where: dict[str, _Text] = {}
        if text is not None:
            if not tparams:
                self.error(
                    f"`{self.kernel.name}` is not a template; remove `template:`", text.strip()
                )
                return {}, {}
            for item in text.split_top(","):
                parts = item.partition("=")
                if parts is None or not parts[0].strip().chars or not parts[1].strip().chars:
                    self.error("expected `NAME = VALUE`, e.g. `T = float`", item.strip())
                    continue
                name, value = parts[0].strip().chars, parts[1].strip()
                if name not in {p.name for p in tparams}:
                    names = ", ".join(p.name for p in tparams)
                    self.error(
                        f"`{quote(name, 30)}` is not a template parameter of `{self.kernel.name}` ({names})",
                        parts[0].strip(),
                    )
                    continue
                given[name] = value.chars
                where[name] = value
        out: dict[str, str] = {}
        values: dict[str, int] = {}
        missing = []
        for p in tparams:
            v = given.get(p.name, p.default)
            if v is None:
                missing.append(p)
                continue
            out[p.name] = v
            if p.kind == "value":
                expr = (
                    self.expr(where[p.name], f"template value `{p.name}`")
                    if p.name in where
                    else None
                )
                if p.name in where and expr is None:
                    continue  # reported, at its column
                try:
                    value = (expr or Expr.parse(v)).evaluate(values)
                except ExprError as e:
                    self.error(f"template value `{p.name}`: {e}", where.get(p.name))
                    continue
                if isinstance(value, int):
                    values[p.name] = value
        if missing:
            example = ", ".join(
                f"{p.name} = {'float' if p.kind == 'type' else '256'}" for p in missing
            )
            self.error(
                f"`{self.kernel.name}` is a template: give its instantiation, e.g. `template: {example}`",
                text,
            )
        return out, values

    def _sizes(self, text: _Text | None) -> tuple[list[str], list[dict[str, int]]]:
        if text is None:
            return [], []
        parts = text.partition("=")
        if parts is None:
            self.error("expected `NAME = VALUE, VALUE` (e.g. `n = 1 << 24, 1000003`)", text.strip())
            return [], []
        lhs, rhs = parts
        names = [n.strip() for n in lhs.split_top(",")]
        for i, n in enumerate(names):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n.chars):
                self.error(
                    f"`{quote(n.chars, 30)}` is not a name; size variables are names like `n` or `rows`",
                    n,
                )
                return [], []
            if n.chars in (m.chars for m in names[:i]):
                self.error(f"size variable `{n.chars}` is named twice", n)
                return [], []
        items = rhs.split_top(",")
        if len(items) > MAX_SIZES:
            self.error(
                f"{len(items)} sizes; at most {MAX_SIZES} (each one runs with every seed)",
                rhs.strip(),
            )
            return [n.chars for n in names], []
        out: list[dict[str, int]] = []
        for item in items:
            expr = self.expr(item, "size", tuple_max=None)
            if expr is None:
                continue
            try:
                value = expr.evaluate({})
            except ExprError as e:
                self.error(f"sizes are numbers: {e}", item.strip().at(e.column))
                continue
            values = value if isinstance(value, tuple) else (value,)
            if len(values) != len(names):
                want = (
                    f"a tuple of {len(names)} like ({', '.join('...' for _ in names)})"
                    if len(names) > 1
                    else "one number"
                )
                self.error(
                    f"this size has {len(values)} value(s) for {len(names)} variable(s); write {want}",
                    item.strip(),
                )
                continue
            if not all(isinstance(v, int) and v > 0 for v in values):
                self.error("sizes must be positive integers", item.strip())
                continue
            out.append(dict(zip((n.chars for n in names), values, strict=True)))
        if not out and not self.issues:
            self.error(
                "no sizes given; list at least one, e.g. `n = 1 << 24, 1000003`", text.strip()
            )
        return [n.chars for n in names], out

    def _file_constants(self, names: set[str]) -> dict[str, Number]:
        """The values of the file's object-like macros and file-scope constants among `names`
        (and those they use), where their text is a spec expression; the others stay unknown."""
        out: dict[str, Number] = {}
        pending: set[str] = set()

        def value(name: str) -> Number | None:
            if name in out or name in pending or len(pending) > MAX_CONSTANT_DEPTH:
                return out.get(name)
            macro = self.source.macros.get(name)
            text = macro[1] if macro is not None and macro[0] is None else None
            text = text if text is not None else self.source.constants.get(name)
            if text is None:
                return None
            pending.add(name)
            try:
                expr = Expr.parse(text)
                env = {n: v for n in expr.names() if (v := value(n)) is not None}
                result = expr.evaluate(env)
            except ExprError:
                result = None
            pending.discard(name)
            if isinstance(result, int | float):
                out[name] = result
                return result
            return None

        for name in sorted(names):
            value(name)
        return out

    def _args(
        self, text: _Text | None, template: dict[str, str], size_vars: list[str], signature: str
    ) -> tuple[list[BufferArg], list[ScalarArg], list[StructArg]]:
        k = self.kernel
        buffers: list[BufferArg] = []
        scalars: list[ScalarArg] = []
        structs: list[StructArg] = []
        seen: set[str] = set()
        items = [i for i in text.split_top(",") if i.strip().chars] if text is not None else []
        for item in items:
            item = item.strip()
            m_buf = re.fullmatch(r"([A-Za-z_]\w*)\s*:\s*(.*)", item.chars, re.S)
            m_sc = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(.*)", item.chars, re.S)
            if not m_buf and not m_sc:
                self.error(
                    f"cannot read `{quote(item.chars)}`: write `x: in float[n]` for a pointer or `a = 2.5` for a scalar",
                    item,
                )
                continue
            name = (m_buf or m_sc).group(1)
            name_text = item.slice(0, len(name))
            param = k.param(name)
            if param is None:
                self.error(f"`{quote(name, 30)}` is not a parameter of `{signature}`", name_text)
                continue
            if name in seen:
                self.error(f"`{name}` is declared twice", name_text)
                continue
            seen.add(name)
            if m_buf:
                if not param.is_pointer:
                    self.error(
                        f"`{name}` is a scalar (`{param.declared}`) in the signature; give it a value: `{name} = ...`",
                        name_text,
                    )
                    continue
                buf = self._buffer(item, m_buf.start(2), param, template)
                if buf is not None:
                    buffers.append(buf)
            else:
                if param.is_pointer:
                    self.error(
                        f"`{name}` is a pointer (`{param.declared}`); declare it as `{name}: in {param.type_text}[n]`",
                        name_text,
                    )
                    continue
                value = item.slice(m_sc.start(2), len(item.chars))
                struct_name = self.source.resolve_type(
                    template.get(param.type_text, param.type_text)
                )
                if struct_name in self.source.structs:
                    st = self._struct(param, struct_name, value, template)
                    if st is not None:
                        structs.append(st)
                    continue
                dtype = self._dtype(param.type_text, template)
                if dtype is None:
                    self.error(
                        f"OptiML cannot pass a `{param.type_text}` scalar; supported: "
                        f"{', '.join(SPEC_TYPE_NAMES)} and structs of them",
                        name_text,
                    )
                    continue
                if self.expr(value, f"value of `{name}`") is not None:
                    scalars.append(
                        ScalarArg(name=name, dtype=dtype.code, value=value.strip().chars)
                    )
        for p in k.params:
            if p.name in seen:
                continue
            if not p.is_pointer and p.name in size_vars:
                dtype = self._dtype(p.type_text, template)
                if dtype is not None:
                    scalars.append(ScalarArg(name=p.name, dtype=dtype.code, value=p.name))
                    continue
            at = text.strip() if text is not None else None
            struct_name = self.source.resolve_type(template.get(p.type_text, p.type_text))
            if not p.is_pointer and struct_name in self.source.structs:
                fields = ", ".join(f".{f.name} = ..." for f in self.source.structs[struct_name])
                self.error(
                    f"struct `{p.name}` (`{p.declared}`) has no value; add `{p.name} = {{{fields}}}` to args",
                    at,
                )
            elif p.is_pointer:
                self.error(
                    f"pointer `{p.name}` (`{p.declared}`) is not declared; add `{p.name}: in {p.type_text}[n]` to args",
                    at,
                )
            else:
                self.error(
                    f"scalar `{p.name}` (`{p.declared}`) has no value; add `{p.name} = ...` to args or make it a size",
                    at,
                )
        # scalar values may refer to sizes, template values, the file's constants and scalars
        # declared before them; a struct's fields to every scalar
        known = set(size_vars) | set(template) | set(self.constants)
        for s in scalars:
            if s.value != s.name:
                unknown = Expr.parse(s.value).names() - known
                if unknown:
                    self.error(
                        f"value of `{s.name}` uses `{sorted(unknown)[0]}`, which is not a size, template value, constant of the file or earlier scalar",
                        text,
                    )
            known.add(s.name)
        order = {p.name: i for i, p in enumerate(k.params)}
        scalars.sort(key=lambda s: order[s.name])
        return buffers, scalars, structs

    def _struct(
        self, param, struct_name: str, value: _Text, template: dict[str, str]
    ) -> StructArg | None:
        """`p = {.n = rows, .scale = 0.5}`: a value for every field of a struct of numbers."""
        fields = self.source.structs[struct_name]
        body = value.strip()
        example = ", ".join(f".{f.name} = ..." for f in fields)
        if not (body.chars.startswith("{") and body.chars.endswith("}")):
            self.error(
                f"`{param.name}` is a struct (`{param.declared}`); give its fields: `{param.name} = {{{example}}}`",
                body,
            )
            return None
        for f in fields:
            if not f.plain or self._dtype(f.type_text, template) is None:
                self.error(
                    f"OptiML can pass a struct of numbers only; field `{f.name}` of "
                    f"`{struct_name}` is `{f.type_text}`{'' if f.plain else ' (a pointer, array or bit-field)'}",
                    body,
                )
                return None
        given: dict[str, str] = {}
        for item in body.slice(1, len(body.chars) - 1).split_top(","):
            item = item.strip()
            if not item.chars:
                continue
            parts = item.partition("=")
            name = parts[0].strip().chars.removeprefix(".").strip() if parts else ""
            if parts is None or name not in {f.name for f in fields}:
                self.error(
                    f"expected `.FIELD = VALUE` with a field of `{struct_name}` ({', '.join(f.name for f in fields)})",
                    item,
                )
                return None
            if name in given:
                self.error(f"field `{name}` is given twice", item)
                return None
            if self.expr(parts[1], f"value of `{param.name}.{name}`") is None:
                return None
            given[name] = parts[1].strip().chars
        missing = [f.name for f in fields if f.name not in given]
        if missing:
            self.error(
                f"`{param.name}` gives no value to field(s) {', '.join(missing)} of `{struct_name}`",
                body,
            )
            return None
        return StructArg(
            name=param.name,
            ctype=struct_name,
            fields=[
                FieldValue(
                    name=f.name, dtype=self._dtype(f.type_text, template).code, value=given[f.name]
                )
                for f in fields
            ],
        )

    def _buffer(
        self, item: _Text, rest_at: int, param, template: dict[str, str]
    ) -> BufferArg | None:
        rest = item.slice(rest_at, len(item.chars))
        structure_text = None
        cut = _top_level_equals(rest.chars)
        if cut is not None:
            structure_text = rest.slice(cut + 1, len(rest.chars))
            rest = rest.slice(0, cut)
        m = _BUFFER.fullmatch(rest.chars)
        if not m:
            self.error(
                f"cannot read `{quote(rest.chars)}`: write `{param.name}: in {param.type_text}[n]` (role, type, [length])",
                rest.strip(),
            )
            return None
        role, type_name = m.group(1), m.group(2)
        if role not in ("in", "out", "inout"):
            self.error(
                f"unknown role `{quote(role, 30)}`; use in, out or inout",
                rest.slice(m.start(1), m.end(1)),
            )
            return None
        if role != "in" and param.const_pointee:
            self.error(
                f"`{param.name}` is `{param.declared}`: a const pointer can only be `in`",
                rest.slice(m.start(1), m.end(1)),
            )
            return None
        type_at = rest.slice(m.start(2), m.end(2))
        if type_name in {t.name for t in self.kernel.template_params} - set(template):
            return None  # the missing instantiation is reported once, at `template:`
        vector = vector_type(
            self.source.resolve_type(template.get(param.type_text, param.type_text))
        )
        if vector is not None:
            return self._vector_buffer(
                param, role, type_name, type_at, rest, m, vector, template, structure_text
            )
        dtype = self._dtype(type_name, template)
        if dtype is None:
            self.error(
                f"unknown element type `{quote(type_name, 30)}`; use one of: {', '.join(SPEC_TYPE_NAMES)}",
                type_at,
            )
            return None
        param_dtype = self._dtype(param.type_text, template)
        if param_dtype is None:
            self.error(
                f"OptiML cannot generate data for `{param.declared}` (`{param.name}`); supported element types: {', '.join(SPEC_TYPE_NAMES)}",
                type_at,
            )
            return None
        if param_dtype.code != dtype.code:
            self.error(
                f"`{param.name}` is `{param.declared}` in the signature; write `{param.type_text}` here",
                type_at,
            )
            return None
        return self._buffer_rest(param, role, dtype, rest, m, structure_text)

    def _vector_buffer(
        self, param, role, type_name, type_at, rest, m, vector, template, structure_text
    ) -> BufferArg | None:
        """`v: in float4[n]`: n vectors, their components made and compared as scalars."""
        component, lanes = vector
        written = self.source.resolve_type(template.get(type_name, type_name))
        declared = self.source.resolve_type(template.get(param.type_text, param.type_text))
        if vector_type(written) != vector:
            self.error(
                f"`{param.name}` is `{param.declared}` in the signature; write `{param.type_text}` here (its length counts vectors)",
                type_at,
            )
            return None
        buf = self._buffer_rest(param, role, component, rest, m, structure_text)
        return buf.model_copy(update={"lanes": lanes, "ctype": declared}) if buf else None

    def _buffer_rest(
        self, param, role, dtype: DType, rest: _Text, m, structure_text: _Text | None
    ) -> BufferArg | None:
        length = rest.slice(m.start(3), m.end(3))
        if self.expr(length, f"length of `{param.name}`") is None:
            return None
        value_range = None
        if m.group(4) is not None:
            value_range = self._value_range(rest.slice(m.start(4), m.end(4)))
            if value_range is None:
                return None
        structure = None
        if structure_text is not None:
            parsed = self._structure(param, role, dtype, structure_text, value_range)
            if parsed is None:
                return None
            structure, value_range = parsed
        return BufferArg(
            name=param.name,
            role=role,
            dtype=dtype.code,
            length=length.strip().chars,
            value_range=value_range,
            structure=structure,
        )

    def _structure(
        self, param, role: str, dtype: DType, text: _Text, value_range: tuple[str, str] | None
    ) -> tuple[Structure | None, tuple[str, str] | None] | None:
        """`= offsets(nnz)` and the other structured inputs after a pointer's declaration."""
        t = text.strip()
        m = re.fullmatch(r"([A-Za-z_]\w*)\s*\((.*)\)", t.chars, re.S)
        known = ", ".join(usage for _, usage in STRUCTURES.values())
        if m is None or m.group(1) not in STRUCTURES:
            self.error(f"a structured input is one of: {known}", t if t.chars else text)
            return None
        kind = m.group(1)
        count, usage = STRUCTURES[kind]
        inner = t.slice(m.start(2), m.end(2))
        args = [a for a in inner.split_top(",")] if inner.strip().chars else []
        if len(args) != count:
            self.error(f"`{kind}` takes {count} argument(s): {usage}", t)
            return None
        for a in args:
            expr = self.expr(a, f"argument of `{kind}`")
            if expr is None:
                return None
            if expr.is_tuple:
                self.error(f"an argument of `{kind}` is one number", a.strip())
                return None
        if role == "out":
            self.error(f"`{param.name}` is `out`: only inputs have structured values", t)
            return None
        if kind in ("offsets", "permutation") and dtype.is_float:
            self.error(f"`{kind}` makes integers; `{param.name}` holds `{dtype.name}`", t)
            return None
        if kind != "sparse" and value_range is not None:
            self.error(f"`{param.name}` has a range and `{kind}`: give one of them", t)
            return None
        texts = [a.strip().chars for a in args]
        if kind == "uniform":
            return None, (texts[0], texts[1])
        return Structure(kind=kind, args=texts), value_range

    def _value_range(self, inside: _Text) -> tuple[str, str] | None:
        """`LO, HI` of `in [LO, HI)`: two expressions of one number each."""
        parts = inside.split_top(",")
        if len(parts) != 2:
            self.error(
                "a range of input values is `in [LO, HI)`, two numbers, e.g. `in [0, nbins)`",
                inside.strip() if inside.strip().chars else inside,
            )
            return None
        for part, what in zip(parts, ("range start", "range end"), strict=True):
            expr = self.expr(part, what)
            if expr is None:
                return None
            if expr.is_tuple:
                self.error(f"{what} is one number, not a tuple", part.strip())
                return None
        return parts[0].strip().chars, parts[1].strip().chars

    def _dtype(self, name: str, template: dict[str, str]) -> DType | None:
        return lookup(self.source.resolve_type(template.get(name, name)))

    def _launch(self, text: _Text | None) -> Launch:
        if text is None:
            return Launch(grid=["1"], block=["1"])
        found: dict[str, list[str]] = {}
        for item in text.split_top(","):
            item = item.strip()
            parts = item.partition("=")
            key = parts[0].strip().chars if parts else ""
            if key not in ("grid", "block", "smem"):
                self.error(
                    "launch takes `grid = ...`, `block = ...` and optionally `smem = ...`", item
                )
                continue
            expr = self.expr(parts[1], key)
            if expr is None:
                continue
            if expr.is_tuple and key == "smem":
                self.error("smem is one number of bytes", parts[1].strip())
                continue
            texts = [ast.unparse(e) for e in expr.tree.elts] if expr.is_tuple else [str(expr)]
            found[key] = texts
        for key in ("grid", "block"):
            if key not in found:
                self.error(f"launch has no `{key} = ...`", text.strip())
        return Launch(
            grid=found.get("grid", ["1"]),
            block=found.get("block", ["1"]),
            smem=(found.get("smem") or ["0"])[0],
        )

    def _tol(self, text: _Text | None) -> tuple[float | None, float | None]:
        out: dict[str, float] = {}
        if text is None:
            return None, None
        for item in text.split_top(","):
            parts = item.partition("=")
            key = parts[0].strip().chars if parts else ""
            if parts is None or key not in ("rtol", "atol"):
                self.error("tol takes `rtol = ...` and/or `atol = ...`", item.strip())
                continue
            value = self._tolerance(key, parts[1])
            if value is not None:
                out[key] = value
        return out.get("rtol"), out.get("atol")

    def _tolerance(self, key: str, text: _Text) -> float | None:
        """One tolerance: a number (an expression of numbers), finite and not negative."""
        expr = self.expr(text, key)
        if expr is None:
            return None
        try:
            value = expr.evaluate({})
        except ExprError as e:
            self.error(f"{key}: {e}", text.strip().at(e.column))
            return None
        if isinstance(value, tuple):
            self.error(f"{key} must be a number like 1e-5, not a tuple", text.strip())
            return None
        if value < 0:
            self.error(f"{key} must not be negative", text.strip())
            return None
        return float(value)

    def _seeds(self, text: _Text | None) -> int:
        if text is None:
            return MIN_SEEDS
        t = text.strip()
        # ASCII digits only: `'²'.isdigit()` is true, and int() cannot read it
        if not re.fullmatch(r"[0-9]{1,6}", t.chars) or not (MIN_SEEDS <= int(t.chars) <= MAX_SEEDS):
            self.error(
                f"seeds must be a whole number from {MIN_SEEDS} to {MAX_SEEDS}, got `{quote(t.chars, 30)}`",
                t,
            )
            return MIN_SEEDS
        return int(t.chars)

    def _state(self, text: _Text | None) -> bool:
        if text is None:
            return False
        t = text.strip()
        if t.chars not in ("kept", "none"):
            self.error(f"state is `kept` or `none`, got `{quote(t.chars, 30)}`", t)
            return False
        return t.chars == "kept"

    def _arch(self, text: _Text | None) -> str | None:
        if text is None:
            return None
        t = text.strip()
        if not ARCH.fullmatch(t.chars):
            self.error(
                f"arch is a target like `sm_90` (sm_XY, sm_XYa or sm_XYf), got `{quote(t.chars, 30)}`",
                t,
            )
            return None
        problem = arch_problem(t.chars)
        if problem is not None:
            self.error(f"arch: {problem}", t)
            return None
        return t.chars

    def _reference(self, text: _Text | None) -> Reference:
        if text is None:
            return Reference()
        t = text.strip()
        value = t.chars
        if value == "self":
            return Reference()
        if len(value) > 4 * MAX_NAME_LENGTH or "\x00" in value:
            self.error(
                f"reference is `self`, a kernel name, or `file.py:function` (at most "
                f"{4 * MAX_NAME_LENGTH} characters, no NUL), got `{quote(value, 30)}`",
                t,
            )
            return Reference()
        if ".py:" in value:
            return self._numpy_reference(t)
        if not re.fullmatch(r"[A-Za-z_][\w:]*", value) or len(value) > MAX_NAME_LENGTH:
            self.error("reference is `self`, a kernel name, or `file.py:function`", t)
            return Reference()
        others = [k for k in self.source.kernels if value in (k.name, k.short_name)]
        if not others:
            names = ", ".join(k.name for k in self.source.kernels if k is not self.kernel)
            self.error(
                f"no kernel `{value}` in this file to use as the reference; kernels: {names or 'none'}",
                t,
            )
            return Reference()
        other = others[0]
        if [p.declared for p in other.params] != [p.declared for p in self.kernel.params]:
            self.error(
                f"reference `{value}` must take the same parameters as `{self.kernel.name}`", t
            )
        return Reference(kind="kernel", kernel=other.name)

    def _numpy_reference(self, t: _Text) -> Reference:
        """`path/to/ref.py:function`, the path relative to the `.cu` file. A path the system
        cannot look up (too long, a loop of links) is an error of the spec, not a crash."""
        path_text, function = t.chars.rsplit(":", 1)
        try:
            path = (Path(self.source.path).parent / path_text).resolve()
            found = path.is_file()
        except (OSError, ValueError, RuntimeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.error(f"cannot look up NumPy reference file `{quote(path_text, 40)}`: {reason}", t)
            return Reference()
        if not found:
            self.error(
                f"NumPy reference file `{quote(path_text, 40)}` not found next to {self.source.path}",
                t,
            )
        if not function.isidentifier() or len(function) > MAX_NAME_LENGTH:
            self.error(f"`{quote(function, 40)}` is not a Python function name", t)
        return Reference(kind="numpy", path=str(path), function=function)

    def _check_cases(self, spec: Spec, values: dict[str, _Text]) -> None:
        sizes_text = values.get("sizes")
        cases = []
        for s in spec.sizes:
            try:
                cases.append(spec.case(s))
            except ExprError as e:
                label = ", ".join(f"{k}={v}" for k, v in s.items())
                self.error(f"at size {label}: {e}", sizes_text.strip() if sizes_text else None)
        launch_text = values.get("launch")
        for c in cases:
            threads = c.block[0] * c.block[1] * c.block[2]
            if threads > MAX_THREADS_PER_BLOCK:
                self.error(
                    f"block {c.block} has {threads} threads; at most {MAX_THREADS_PER_BLOCK}",
                    launch_text.strip() if launch_text else None,
                )
                return
            if c.block[2] > MAX_BLOCK_Z:
                self.error(
                    f"block {c.block}: z is at most {MAX_BLOCK_Z}",
                    launch_text.strip() if launch_text else None,
                )
                return
            if any(g > most for g, most in zip(c.grid, MAX_GRID, strict=True)):
                self.error(
                    f"grid {c.grid}: x is at most {MAX_GRID[0]}, y and z at most {MAX_GRID[1]} "
                    f"(at {c.label})",
                    launch_text.strip() if launch_text else None,
                )
                return
        blocks = {d for c in cases for d in (c.block[0], c.block[1]) if d > 1}
        if (
            cases
            and blocks
            and all(v % d == 0 for c in cases for v in c.sizes.values() for d in blocks)
        ):
            b = min(blocks)
            self.error(
                f"every size is a multiple of the block size ({b}); add one that is not (e.g. {_odd_size(cases[0])}) so bounds checks are tested",
                sizes_text.strip() if sizes_text else None,
            )


# `ROLE TYPE[LENGTH]` and an optional `in [LO, HI)`. Linear in the length of the text: a lazy
# length and a range split at its last comma made a long, unclosed item take seconds.
_BUFFER = re.compile(
    r"(\w+)\s+([A-Za-z_]\w*(?:\s+\w+)*)\s*\[([^\[\]]*)\]\s*(?:in\s*\[(.*)\)\s*)?", re.S
)


def _top_level_equals(text: str) -> int | None:
    """The offset of the first `=` outside brackets (`x: in int[n] = offsets(m)`), or None."""
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "=" and depth == 0:
            return i
    return None


def _odd_size(case: Case) -> str:
    values = list(case.sizes.values())
    if len(values) == 1:
        return str(values[0] // 16 + 3)
    return "(" + ", ".join(str(v // 4 + 3) for v in values) + ")"


def parse_spec(source: SourceFile, kernel: Kernel) -> Spec:
    """The spec above `kernel`; `SpecError` with every problem found, each at its position."""
    if kernel.spec_comment is None:
        at = source.position(kernel.name_span.start, kernel.name_span.end)
        raise SpecError(
            [
                (
                    f"kernel `{kernel.name}` has no `@optiml` spec above it; `optiml spec {source.path} --kernel {kernel.name}` drafts one",
                    at,
                )
            ]
        )
    return _Parser(source, kernel).parse()


@contextmanager
def evaluated_at_run_time(source: SourceFile, kernel: Kernel) -> Iterator[None]:
    """Around work that evaluates a parsed spec at sizes of its own choosing (a size the spec does
    not list, a candidate's launch at the original's sizes): an `ExprError` there is the spec's,
    so it becomes a `SpecError` at the spec's comment, one line, instead of a traceback."""
    try:
        yield
    except ExprError as e:
        anchor = kernel.spec_comment.span if kernel.spec_comment else kernel.name_span
        message = one_line(f"a value of the spec of `{kernel.name}` cannot be evaluated: {e}")
        raise SpecError([(message, source.position(anchor.start, anchor.end))]) from None


def load(path: str | Path, kernel_name: str) -> tuple[SourceFile, Kernel, Spec]:
    """Read a file, find a kernel and parse its spec: the first step of every command."""
    source = SourceFile.read(path)
    kernel = source.kernel(kernel_name)
    return source, kernel, parse_spec(source, kernel)
