"""Every kernel with a spec among the fixtures (the wild ones and the naive originals of the
tricks corpus included), for the lifting's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from optiml.cuda.source import SourceFile
from optiml.cuda.types import DTYPES
from optiml.lift.run import round_bf16
from optiml.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
FILES = sorted(
    [p for p in ROOT.glob("*.cu")]
    + sorted((ROOT / "wild").glob("*.cu"))
    + sorted((ROOT / "tricks" / "originals").glob("*.cu"))
)


def kernels() -> list[tuple[Path, str]]:
    out = []
    for path in FILES:
        src = SourceFile.read(path)
        for k in src.kernels:
            if k.spec_comment is not None:
                out.append((path, k.name))
    return out


def load(path: Path, name: str):
    src = SourceFile.read(path)
    k = src.kernel(name)
    return src, k, parse_spec(src, k)


def label(item) -> str:
    path, name = item
    return f"{path.relative_to(ROOT)}::{name}"


def smallest_args(spec, seed: int = 0):
    """The spec's smallest declared size, evaluated, and random arguments for it: inputs in
    their declared ranges, holding only values of the buffer's type, as the harness generates
    them; scalars and sizes by parameter name."""
    sizes = min(spec.sizes, key=lambda s: int(np.prod(list(s.values()))))
    case = spec.case(sizes)
    rng = np.random.default_rng(seed)
    args: dict = {}
    for b in spec.buffers:
        d = DTYPES[b.dtype]
        lo, hi = case.ranges.get(b.name, (d.low, d.high))
        n = case.lengths[b.name]
        if not d.is_float:
            args[b.name] = rng.integers(lo, hi, n)
            continue
        a = rng.uniform(lo, hi, n)
        # the values the kernel's type can hold, as the harness generates them
        if b.dtype == "f16":
            a = a.astype(np.float16)
        elif b.dtype == "bf16":
            a = round_bf16(a)
        elif b.dtype == "f32":
            a = a.astype(np.float32)
        args[b.name] = a.astype(np.float64)
    args.update(case.scalars)
    for p in spec.params:
        if p not in args and p in case.sizes:
            args[p] = case.sizes[p]
    return case, args
