"""The runner's input generator, reproduced bit for bit in NumPy, so that a NumPy reference sees
exactly the inputs the kernels see (see `uniform01`, `spike_at` and `fill_value` in values.h and
runner.cpp)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from optiml.cuda.types import DTYPES

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BUFFER = np.uint64(0xD1B54A32D192ED03)
_SECOND_STREAM = 0x632BE59BD9B4E019
_MASK = (1 << 64) - 1


class Mode(IntEnum):
    """How an input's values are drawn (values.h's DistMode)."""

    UNIFORM = 0  # lo + u (hi - lo); integers the floor of it
    CONSTANT = 1  # every element lo
    SPIKES = 2  # uniform, but the first 4, the last 40 and ~1 in 1021 elements: floats +-extra,
    # integers lo or hi - 1
    SKEWED = 3  # about half the elements `extra` (a hot key), the others uniform
    # structured inputs (values.h says how each element is made)
    OFFSETS = 4  # non-decreasing from 0 (the first) to `extra` (the last): CSR row offsets
    SORTED = 5  # non-decreasing in [lo, hi)
    PERMUTATION = 6  # each of 0..n-1 once
    SPARSE = 7  # uniform with probability `extra`, else zero


STRUCTURED = {
    "offsets": Mode.OFFSETS,
    "sorted": Mode.SORTED,
    "permutation": Mode.PERMUTATION,
    "sparse": Mode.SPARSE,
}


@dataclass(frozen=True)
class Dist:
    """One buffer's input values: a mode over [lo, hi)."""

    lo: float
    hi: float
    mode: Mode = Mode.UNIFORM
    extra: float = 0.0


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _counters(seed: int, buffer: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        base = np.uint64(seed & _MASK) * _GOLDEN + np.uint64(buffer + 1) * _BUFFER
        return _splitmix64(base + np.arange(n, dtype=np.uint64))


def uniform01(seed: int, buffer: int, n: int) -> np.ndarray:
    z = _counters(seed, buffer, n)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def spikes(seed: int, buffer: int, n: int) -> np.ndarray:
    """Where SPIKES puts its extreme values: the first 4, the last 40 and ~1 in 1021 elements."""
    at = _counters(seed + _SECOND_STREAM, buffer, n) % np.uint64(1021) == 0
    i = np.arange(n)
    return at | (i < 4) | (i + 40 >= n)


def _second(seed: int, buffer: int, n: int) -> np.ndarray:
    return uniform01(seed + _SECOND_STREAM, buffer, n)


def offsets(seed: int, buffer: int, n: int, total: float) -> np.ndarray:
    """OFFSETS: element 0 is 0, the last `total`, those between at a random place of their slot,
    skewed by a per-seed a (values.h's `offset_at`)."""
    i = np.arange(n, dtype=np.float64)
    u = uniform01(seed, buffer, n)
    a = float(uniform01(seed + _SECOND_STREAM, buffer, n + 1)[n])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (i - 1.0 + u) / float(n - 2)
        v = np.floor(total * (t * ((1.0 + -a) + a * t)))
    out = np.minimum(v, total).astype(np.int64) if n > 2 else np.zeros(n, dtype=np.int64)
    out[0] = 0
    out[-1] = int(total)
    return out


def permutation(seed: int, buffer: int, n: int) -> np.ndarray:
    """PERMUTATION: (a i + b) mod n with a coprime with n (values.h's `permutation_of`)."""
    base = (((seed + _SECOND_STREAM) & _MASK) * int(_GOLDEN) + (buffer + 1) * int(_BUFFER)) & _MASK
    z = int(_splitmix64(np.array([base], dtype=np.uint64))[0])
    a = 1 + z % (n - 1) if n > 1 else 1
    while math.gcd(a, n) != 1:
        a = a + 1 if a + 1 < n else 1
    b = int(_splitmix64(np.array([z], dtype=np.uint64))[0]) % n
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return ((np.uint64(a) * i % np.uint64(n) + np.uint64(b)) % np.uint64(n)).astype(np.int64)


def _float_to_bf16_bits(f: np.ndarray) -> np.ndarray:
    x = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((x >> 16) | 0x40).astype(np.uint16), rounded)


def generate(
    code: str,
    buffer: int,
    n: int,
    seed: int,
    low: float,
    high: float,
    mode: Mode = Mode.UNIFORM,
    extra: float = 0.0,
) -> np.ndarray:
    """Buffer `buffer`'s n input values for `seed`, as the runner makes them."""
    d = DTYPES[code]
    if mode == Mode.OFFSETS:
        return offsets(seed, buffer, n, extra).astype(d.np_dtype())
    if mode == Mode.PERMUTATION:
        return permutation(seed, buffer, n).astype(d.np_dtype())
    u = uniform01(seed, buffer, n)
    if mode == Mode.SORTED:
        u = (np.arange(n, dtype=np.float64) + u) / float(n)
    zero = _second(seed, buffer, n) >= extra if mode == Mode.SPARSE else None
    if d.is_float:
        v = low + u * (high - low)
        if mode == Mode.CONSTANT:
            v = np.full(n, float(low))
        elif mode == Mode.SPIKES:
            v = np.where(spikes(seed, buffer, n), np.where(u < 0.5, -extra, extra), v)
        elif mode == Mode.SKEWED:
            v = np.where(uniform01(seed + _SECOND_STREAM, buffer, n) < 0.5, float(extra), v)
        if zero is not None:
            v = np.where(zero, 0.0, v)
        return _as_float_code(code, v)
    k = np.int64(int(low)) + np.floor(u * (high - low)).astype(np.int64)
    if mode == Mode.CONSTANT:
        k = np.full(n, int(low), dtype=np.int64)
    elif mode == Mode.SPIKES:
        k = np.where(spikes(seed, buffer, n), np.where(u < 0.5, int(low), int(high) - 1), k)
    elif mode == Mode.SKEWED:
        k = np.where(uniform01(seed + _SECOND_STREAM, buffer, n) < 0.5, int(extra), k)
    if zero is not None:
        k = np.where(zero, 0, k)
    return k.astype(d.np_dtype())


def _as_float_code(code: str, v: np.ndarray) -> np.ndarray:
    if code == "f64":
        return v
    f = v.astype(np.float32)
    if code == "f32":
        return f
    if code == "f16":
        return f.astype(np.float16)
    return _float_to_bf16_bits(f)  # bfloat16 as its bits
