"""The runner's input generator, reproduced bit for bit in NumPy, so that a NumPy reference sees
exactly the inputs the kernels see (see `uniform01` and `fill_inputs` in runner.cpp)."""

from __future__ import annotations

import numpy as np

from optiml.cuda.types import DTYPES

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BUFFER = np.uint64(0xD1B54A32D192ED03)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform01(seed: int, buffer: int, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        base = np.uint64(seed) * _GOLDEN + np.uint64(buffer + 1) * _BUFFER
        z = _splitmix64(base + np.arange(n, dtype=np.uint64))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def _float_to_bf16_bits(f: np.ndarray) -> np.ndarray:
    x = f.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((x >> 16) | 0x40).astype(np.uint16), rounded)


def generate(code: str, buffer: int, n: int, seed: int, low: float, high: float) -> np.ndarray:
    """Buffer `buffer`'s n input values for `seed`, as the runner makes them."""
    d = DTYPES[code]
    u = uniform01(seed, buffer, n)
    if d.is_float:
        v = low + u * (high - low)
        if code == "f64":
            return v
        f = v.astype(np.float32)
        if code == "f32":
            return f
        if code == "f16":
            return f.astype(np.float16)
        return _float_to_bf16_bits(f)  # bfloat16 as its bits
    k = np.floor(u * (high - low)).astype(np.int64)
    return (np.int64(low) + k).astype(d.np_dtype())
