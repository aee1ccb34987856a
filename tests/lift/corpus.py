"""Every kernel with a spec among the fixtures (the wild ones and the naive originals of the
tricks corpus included), for the lifting's tests."""

from __future__ import annotations

from pathlib import Path

from optiml.cuda.source import SourceFile
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
