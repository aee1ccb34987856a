"""Inputs for fuzzing the spec language, shared by tests/test_fuzz_spec.py (hypothesis, in CI) and
benchmarks/fuzz_spec.py (thousands of seeded inputs): expression strings from a grammar of tokens,
and mutations of the `@optiml` comments of every fixture kernel. Everything is drawn from a
`random.Random`, so that a seed reproduces an input and hypothesis can shrink one (`st.randoms`).

`run_spec` and `run_expression` do what a user's input makes OptiML do and return the kind of
outcome; any exception other than the documented ones propagates, and `time_limit` turns a hang
into one.
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from optiml.cuda.source import SourceFile
from optiml.errors import SpecError
from optiml.expr import Expr, ExprError
from optiml.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

HUGE = "9" * 4300  # Python's int() refuses more digits than 4,300 with a ValueError

# -- expressions --------------------------------------------------------------------------------

NUMBERS = [
    "0", "1", "2", "3", "7", "32", "256", "1024", "1000003", "65535", "2147483647",
    "9223372036854775807", "9223372036854775808", "18446744073709551616", "1" + "0" * 30,
    "2.5", "1e-5", "1e308", "1e999", "2.5f", ".5f", "1.f", "10u", "10ull", "7L", "0x1f", "0xFFu",
    "0b101", "0o17", "017", "1_000", "1j", "nan", "inf", HUGE,
]  # fmt: skip
NAMES = ["n", "m", "rows", "cols", "BLOCK", "a", "x", "n2f", "_", "undefined", "N" * 300]
UNICODE = ["²", "١٢", "ｎ", "é", "\u2028", "\x00", "\x7f", "🙂", "\ufeff", "ℕ"]
BINARY = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "<", "==", "and", "@"]
UNARY = ["-", "+", "~", "not "]
FUNCS = ["cdiv", "min", "max", "foo", "__import__", "abs", "pow"]
JUNK = [
    "(", ")", "[", "]", "{", "}", ",", ":", ";", "'a'", '"s"', "\\", "`", "?", "#", "$", "...",
    "lambda: 0", "x.y", "x[0]", "*x", "**x", "a=1", "if", "else", "None", "True", "\t", "\n", " ",
]  # fmt: skip

ENV = {"n": 1000003, "m": 7, "rows": 4096, "cols": 777, "BLOCK": 256, "a": 2.5, "x": 0}


def random_expression(rng: random.Random, depth: int = 0) -> str:
    """A string from a grammar of spec-expression tokens: mostly well formed, with huge numbers,
    deep nesting, tuples, calls, Unicode and junk mixed in."""
    roll = rng.random()
    if depth > 6 or roll < 0.25:
        return _atom(rng)
    if roll < 0.45:
        return f"{random_expression(rng, depth + 1)} {rng.choice(BINARY)} {random_expression(rng, depth + 1)}"
    if roll < 0.52:
        return rng.choice(UNARY) * rng.choice([1, 1, 2, 70]) + random_expression(rng, depth + 1)
    if roll < 0.62:
        k = rng.choice([1, 1, 2, 65, 100, 250])
        return "(" * k + random_expression(rng, depth + 1) + ")" * k
    if roll < 0.74:
        args = [random_expression(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 2, 3]))]
        return f"{rng.choice(FUNCS)}({', '.join(args)})"
    if roll < 0.82:
        items = [random_expression(rng, depth + 1) for _ in range(rng.choice([1, 2, 3, 4]))]
        return "(" + ", ".join(items) + ")"
    if roll < 0.88:  # a long chain: each operator is one level of nesting
        op = rng.choice(["+", "*", "**", "<<"])
        return f" {op} ".join(_atom(rng) for _ in range(rng.choice([3, 10, 70, 700])))
    if roll < 0.94:
        return "".join(rng.choice(NUMBERS + NAMES + BINARY + JUNK + UNICODE) for _ in range(8))
    text = random_expression(rng, depth + 1)
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice(UNICODE + JUNK) + text[i:]


def _atom(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(NUMBERS)
    if roll < 0.9:
        return rng.choice(NAMES)
    return rng.choice(UNICODE + JUNK)


def run_expression(text: str) -> str:
    """Parse and evaluate `text` as a spec does: "ok" or "ExprError"; anything else raises."""
    try:
        Expr.parse(text).evaluate(dict(ENV))
    except ExprError as e:
        assert isinstance(e.column, int) and 0 <= e.column <= max(len(text), 1), (e, e.column)
        return "ExprError"
    return "ok"


# -- specs --------------------------------------------------------------------------------------

FRAGMENTS = [
    "**", "<<", ">>", "~", "(", ")", "[", "]", ",", ":", "=", "#", "*/", "/*", "//", "@optiml",
    "[0, n)", "in [0, n)", "in [(1, 2), 3)", "in [5, 2)", "in [a, b, c)", "²", "٣", "ｎ", "é", "🙂",
    HUGE, "9" * 25, "x" * 5000, "\x00", "\t", "\r", "\u2028", "\x0b", "10**10**10", "1 << 64",
    "1 << -1", "1 << 62", "-1", "0", "1e999", "nan", "inf", "2.5", "(1, 2)", "(1, 2, 3, 4)",
    "(" * 100, ")" * 100, "cdiv(n, 256)", "min(n)", "max(", "self", "ref.py:ref", "missing.py:f",
    "/" * 5000 + ".py:f", "a" * 300 + ".py:f", "\x00.py:f", "sm_100", "sm_121", "sm_999", "sm_90a",
    "sm_100f", "sm_80a", "banana", "native", "in", "out", "inout", "float", "double", "half", "T",
    "int", "unsigned", "grid = ", "block = 1024", "block = (32, 32, 2)", "block = (1, 1, 128)",
    "smem = 1 << 40", "smem = 2.5", "n = ", "rtol = -1", "rtol = 1e999", "atol = (1, 2)",
    "9223372036854775807", "2**62", "n * n * n", "\n *   seeds: 3", "\n *   seeds: ²",
    "\n *   seeds: 99999", "\n *   arch: sm_120", "\n *   arch: sm_75", "\n *   tol: rtol = 1e-3",
    "\n *   reference: self", "\n *   template: T = float", "\n *   sizes: n = 5", "\n", "\n *   ",
    "args:", "launch:", "sizes:", "tol:", "seeds:", "reference:", "template:", "arch:", "argz:",
    "= offsets(n)", "= offsets()", "= offsets(-1)", "= sorted(0, 10)", "= sorted(5, 2)",
    "= permutation()", "= permutation(n)", "= sparse(0.1)", "= sparse(0)", "= sparse(2)",
    "= uniform(0, n)", "= shuffle()", "= (", "float4", "half2", "int2", "double3", "floatX",
    "= {.n = n}", "{.a = 1, .a = 2}", "{", "}", "{.x = (1, 2)}", ".n =", "sm_count",
    "max_threads_per_sm", "grid = sm_count * 4", "(1, 2, 3, 4, 5, 6, 7)", "a, b, c, d, e = ",
    "SECTION_SIZE", "UNROLL", "BLOCK_SIZE",
]  # fmt: skip


@dataclass(frozen=True)
class SpecSite:
    """A fixture file and the character range of one kernel's spec comment in it."""

    path: Path
    text: str
    start: int
    end: int


def spec_sites() -> list[SpecSite]:
    """Every spec comment of every fixture file (fixtures/ and its folders, wild/ included)."""
    sites = []
    for path in sorted(FIXTURES.rglob("*.cu")):
        text = path.read_text(encoding="utf-8")
        source = SourceFile(text, str(path))
        for k in source.kernels:
            if k.spec_comment is not None:
                span = k.spec_comment.span
                sites.append(SpecSite(path, text, span.start, span.end))
    return sites


def mutate(site: SpecSite, rng: random.Random, count: int | None = None) -> str:
    """The site's file with its spec comment mutated `count` times: characters deleted,
    duplicated or swapped, fragments of spec syntax (and of trouble) inserted or put in place
    of a span."""
    text, start, end = site.text, site.start, site.end
    for _ in range(count if count is not None else rng.choice([1, 1, 2, 3, 5, 8])):
        i = rng.randrange(start, end + 1)
        j = min(end, i + rng.choice([1, 1, 2, 5, 20]))
        op = rng.random()
        if op < 0.2:
            new = ""  # delete
        elif op < 0.35:
            new = text[i:j] * rng.choice([2, 2, 3, 50])  # duplicate
        elif op < 0.45:
            new = text[i:j][::-1]  # swap
        elif op < 0.8:
            new, j = rng.choice(FRAGMENTS), i  # insert
        else:
            new = rng.choice(FRAGMENTS)  # replace
        text = text[:i] + new + text[j:]
        end += len(new) - (j - i)
    return text


def run_spec(text: str, path: Path) -> list[str]:
    """Parse every spec of the file `text` (as if at `path`) and evaluate every size of each that
    parses, as `optiml check` does: the outcome per spec ("ok", "SpecError" or "ExprError").
    Anything else raises."""
    source = SourceFile(text, str(path))
    outcomes = []
    for kernel in source.kernels:
        if kernel.spec_comment is None:
            continue
        try:
            spec = parse_spec(source, kernel)
        except SpecError as e:
            assert e.issues and all(_one_line(m) for m, _ in e.issues), e.issues
            outcomes.append("SpecError")
            continue
        try:
            for sizes in spec.sizes:
                spec.case(sizes)
        except ExprError:
            outcomes.append("ExprError")
            continue
        outcomes.append("ok")
    return outcomes


def _one_line(message: str) -> bool:
    return bool(message) and not re.search(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", message)


# -- hangs --------------------------------------------------------------------------------------


class Hang(Exception):
    """An input that did not finish within its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `Hang` in the block if it runs longer than `seconds` (main thread, Unix only)."""

    def expired(signum, frame):
        raise Hang(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
