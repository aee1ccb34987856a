"""Element and scalar types that kernels take, with their C spellings, sizes and value defaults.

One table serves the spec parser (spec names), the source model (C spellings in signatures), the
harness (type codes the runner understands) and NumPy references (NumPy dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # the spec's name, e.g. "float"
    code: str  # the runner's type code, e.g. "f32"
    size: int
    kind: str  # "float" | "int" | "uint"
    numpy: str  # NumPy dtype name ("bfloat16" is stored as uint16 bits)
    rtol: float
    atol: float
    low: float  # default input range [low, high)
    high: float

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    def np_dtype(self) -> np.dtype:
        return np.dtype(self.numpy)


_FLOAT_RANGE = (-1.0, 1.0)
_INT_RANGE = (-100, 100)
_UINT_RANGE = (0, 200)

DTYPES: dict[str, DType] = {
    d.code: d
    for d in [
        DType("double", "f64", 8, "float", "float64", 1e-12, 1e-12, *_FLOAT_RANGE),
        DType("float", "f32", 4, "float", "float32", 1e-5, 1e-5, *_FLOAT_RANGE),
        DType("half", "f16", 2, "float", "float16", 1e-2, 1e-3, *_FLOAT_RANGE),
        DType("bfloat16", "bf16", 2, "float", "uint16", 2e-2, 1e-3, *_FLOAT_RANGE),
        DType("int8", "i8", 1, "int", "int8", 0, 0, *_INT_RANGE),
        DType("int16", "i16", 2, "int", "int16", 0, 0, *_INT_RANGE),
        DType("int32", "i32", 4, "int", "int32", 0, 0, *_INT_RANGE),
        DType("int64", "i64", 8, "int", "int64", 0, 0, *_INT_RANGE),
        DType("uint8", "u8", 1, "uint", "uint8", 0, 0, *_UINT_RANGE),
        DType("uint16", "u16", 2, "uint", "uint16", 0, 0, *_UINT_RANGE),
        DType("uint32", "u32", 4, "uint", "uint32", 0, 0, *_UINT_RANGE),
        DType("uint64", "u64", 8, "uint", "uint64", 0, 0, *_UINT_RANGE),
    ]
}

# Every spelling a user may write, in a spec or in C, mapped to a type code. C spellings are
# normalized first (whitespace collapsed, `signed` dropped where it changes nothing).
_SPELLINGS: dict[str, str] = {
    "double": "f64",
    "float": "f32",
    "half": "f16",
    "__half": "f16",
    "bfloat16": "bf16",
    "__nv_bfloat16": "bf16",
    "nv_bfloat16": "bf16",
    "char": "i8",
    "signed char": "i8",
    "int8": "i8",
    "int8_t": "i8",
    "unsigned char": "u8",
    "uint8": "u8",
    "uint8_t": "u8",
    "short": "i16",
    "short int": "i16",
    "int16": "i16",
    "int16_t": "i16",
    "unsigned short": "u16",
    "uint16": "u16",
    "uint16_t": "u16",
    "int": "i32",
    "int32": "i32",
    "int32_t": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "uint32": "u32",
    "uint32_t": "u32",
    "long": "i64",
    "long int": "i64",
    "long long": "i64",
    "long long int": "i64",
    "int64": "i64",
    "int64_t": "i64",
    "ptrdiff_t": "i64",
    "unsigned long": "u64",
    "unsigned long long": "u64",
    "unsigned long long int": "u64",
    "uint64": "u64",
    "uint64_t": "u64",
    "size_t": "u64",
}

SPEC_TYPE_NAMES = sorted(
    {"double", "float", "half", "bfloat16", "int", "unsigned", "char", "short", "long"}
    | {f"int{b}" for b in (8, 16, 32, 64)}
    | {f"uint{b}" for b in (8, 16, 32, 64)}
)


# CUDA's vector types (vector_types.h, cuda_fp16.h, cuda_bf16.h): name -> (component type code,
# components). A buffer of them is its components one after another: `float4 v[n]` is 4n floats.
_VECTOR_BASES = {
    "char": "i8",
    "uchar": "u8",
    "short": "i16",
    "ushort": "u16",
    "int": "i32",
    "uint": "u32",
    "long": "i64",
    "ulong": "u64",
    "longlong": "i64",
    "ulonglong": "u64",
    "float": "f32",
    "double": "f64",
}
VECTOR_TYPES: dict[str, tuple[str, int]] = {
    f"{base}{n}": (code, n) for base, code in _VECTOR_BASES.items() for n in (1, 2, 3, 4)
} | {
    "half2": ("f16", 2),
    "__half2": ("f16", 2),
    "__nv_bfloat162": ("bf16", 2),
    "nv_bfloat162": ("bf16", 2),
    "bfloat162": ("bf16", 2),
}


def vector_type(spelling: str) -> tuple[DType, int] | None:
    """A vector type's component type and count (`float4` -> float, 4), or None."""
    found = VECTOR_TYPES.get(normalize_c_type(spelling))
    return (DTYPES[found[0]], found[1]) if found else None


def normalize_c_type(text: str) -> str:
    words = text.replace("std::", "").split()
    if words[:1] == ["signed"] and len(words) > 1 and words[1] != "char":
        words = words[1:]
    return " ".join(words)


def lookup(spelling: str) -> DType | None:
    """The type a spec or C spelling names, or None if OptiML cannot generate data for it."""
    code = _SPELLINGS.get(normalize_c_type(spelling))
    return DTYPES[code] if code else None


def struct_layout(fields: list[tuple[str, str]]) -> np.dtype:
    """A struct of numbers (field name, type code) as C lays it out: each field at a multiple of
    its alignment, the whole padded to the largest (NumPy's aligned structured dtype)."""
    return np.dtype([(name, DTYPES[code].np_dtype()) for name, code in fields], align=True)
